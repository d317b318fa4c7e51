/*
 * event.h - what happened at gmbd, as facts: a client came or went, memory
 * was lent, returned, paused, resumed or refused. The handlers make one
 * struct event per happening and hand it to whoever listens (watch
 * subscribers, the metrics); nothing here knows a socket or the protobuf.
 *
 * New kinds go at the end of enum event_kind with their name in
 * event_kind_names[] (event.c); listeners treat a kind they do not know by
 * its name, so adding one breaks none of them.
 */
#ifndef GMB_EVENT_H
#define GMB_EVENT_H

#include <stdint.h>
#include <sys/types.h>

enum event_kind {
	EVENT_SUBSCRIBED, /* a watcher's first event: gmbd's version and pid */
	EVENT_CONNECTED,  /* a client (not a tool) said hello */
	EVENT_GONE,	  /* it disconnected; bytes: what returned */
	EVENT_ALLOC,
	EVENT_FREE,
	EVENT_PAUSE,	      /* bytes unlent; duration: request to reply */
	EVENT_RESUME,	      /* bytes lent again */
	EVENT_REFUSED,	      /* a request failed; reason, status, detail */
	EVENT_DROP,	      /* gmbd asked a client to drop cached handles */
	EVENT_TRIM,	      /* free chunks went back to the driver */
	EVENT_CONTROL,	      /* an operator's pause/resume of another client, answered */
	EVENT_DROPPED,	      /* this watcher fell behind and is disconnected */
	EVENT_MISSED,	      /* count: events this watcher was not sent while replies were held */
	EVENT_IMPORT,	      /* a client mapped another's allocation (CUDA IPC); detail: whose */
	EVENT_IMPORT_CLOSE,   /* it closed one open of such an import */
	EVENT_IMPORT_UNMAP,   /* it unmapped one to follow its owner's pause */
	EVENT_IMPORT_MAP,     /* it mapped such an import again, after the resume */
	EVENT_OBJECT_PUBLISH, /* a named object's new version; detail: "NAME vN" */
	EVENT_OBJECT_DROP,    /* a version, or an object, no longer held; detail as above */
	EVENT_OBJECT_PAUSE,   /* a named object paused (its readers unmapped); detail: its name */
	EVENT_OBJECT_RESUME,  /* ... resumed, its bytes back */
	EVENT_NKINDS
};

/* Refusal reasons, for logs and the metrics' labels. */
enum event_reason {
	EVENT_REASON_BUDGET,	 /* -ENOMEM, -ENOSPC, -EMFILE: a budget or bound */
	EVENT_REASON_PERMISSION, /* -EPERM, -EACCES */
	EVENT_REASON_NO_CONTROL, /* -EOPNOTSUPP: the target has no control handler */
	EVENT_REASON_NOT_FOUND,	 /* -ENOENT, -ENODEV: no such client, device, allocation */
	EVENT_REASON_BUSY,	 /* -EBUSY, -EAGAIN */
	EVENT_REASON_TIMEOUT,	 /* -ETIMEDOUT */
	EVENT_REASON_INVALID,	 /* -EINVAL and other malformed requests */
	EVENT_REASON_OTHER,
	EVENT_NREASONS
};

struct event {
	enum event_kind kind;
	uint64_t time_ns;   /* CLOCK_REALTIME; 0: filled in when emitted */
	uint64_t client_id; /* 0: no client */
	const char *client; /* name; NULL: none */
	pid_t pid;
	uid_t uid;
	const char *tag; /* NULL: none; "" with pause/resume: every tag */
	int device;	 /* -1: none */
	uint64_t bytes;
	uint64_t duration_ns;
	uint64_t to_host_bytes;	  /* pause: copied device -> host by the client */
	uint64_t from_host_bytes; /* resume: PRESERVE bytes the client copies back */
	enum event_reason reason; /* EVENT_REFUSED */
	int status;		  /* EVENT_REFUSED, EVENT_CONTROL: 0 or -errno */
	const char *request;	  /* EVENT_REFUSED, EVENT_CONTROL: "alloc", "pause", ... */
	const char *detail;	  /* a sentence; NULL: none */
	const char *actor;	  /* EVENT_CONTROL, EVENT_TRIM: who asked */
	uint64_t count;		  /* EVENT_MISSED */
};

#define EVENT_INIT(k)                     \
	{                                 \
		.kind = (k), .device = -1 \
	}

/* "connected", "pause", ...; "unknown" past the table. */
const char *event_kind_name(enum event_kind k);
/* The reason a request failing with @status (a negative errno) was refused. */
enum event_reason event_reason_of(int status);
/* "budget", "permission", ... */
const char *event_reason_name(enum event_reason r);

#endif
