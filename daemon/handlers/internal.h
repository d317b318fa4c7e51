/*
 * internal.h - what the files of daemon/handlers/ share; nothing outside
 * the folder includes it (but tests/test_handlers.c, to look at a
 * connection's counters).
 *
 * The files call one way, top to bottom:
 *   handlers.c   the dispatch table, replies to daemon requests, and the
 *                callbacks the transport calls (struct sess_ops)
 *   orphans.c    orphans of a restart: reclaimed when gone or too late
 *   hello.c      hello, the rejoin hello and its claim, Bye
 *   memory.c     alloc, free, tag mode, pause, resume, trim, lend replies
 *   control.c    an operator's pause/resume forwarded to its target
 *   switch.c     switches (pause FROM, resume TO, roll back), priorities
 *   status.c     the status reply
 *   park.c       requests waiting for memory; settling after a change
 *   ipc.c        memory shared between processes: export, open, close, grant;
 *                the imports' status part
 *   object_status.c  the named objects' status part
 *   ipc_pause.c  a pause of an imported tag: waiting for the importers, or
 *                having them follow it (and the resume after it)
 *   drops.c      DropRequests and preemption: gmbd's own requests
 *   dreq.c       the daemon -> client request: kinds, deadlines, completion
 *   watch.c      events: to the watchers (WatchRequest) and on_event; refusals
 *   reply.c      sentences, status replies, names, devices, client -> session
 *   limits.c     connections per uid and gmbd's fds, the operators' reserve,
 *                idle connections, the hello deadline; refusals said once
 * A file calls only files below it. The ways up are function pointers
 * kept for later: the handler a parked request keeps (park.c calls it
 * back), the one a pause waiting for importers keeps (ipc_pause.c), the done
 * handler of each kind of daemon request (dreq.c's table of kinds names
 * them; dreq.c calls them once a request ends), and handlers->settle
 * (park.c's, for ipc_pause.c's pauses that complete outside a request).
 */
#ifndef GMB_HANDLERS_INTERNAL_H
#define GMB_HANDLERS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/err.h"
#include "common/idmap.h"
#include "common/wire.h"
#include "daemon/core/event.h"
#include "daemon/handlers/handlers.h"
#include "daemon/transport/sess.h"
#include "proto/gmb.pb-c.h"

struct hdreq;
struct hfwd;
struct hrejoin;

/* The handlers' state of one connection (sess->data, made by sess_ops.open,
 * freed with the session's last reference). */
struct hconn {
	struct bclient *client; /* NULL until hello; owned by the broker */
	uint64_t next_req_id;	/* ids of daemon -> client requests */
	struct idmap dreqs;	/* id -> struct hdreq: daemon requests unanswered */
	uint32_t inflight;	/* parked + forwarded requests of this client */
	struct hfwd *ctl_in;	/* the control request this client carries out */
	struct hfwd *fwds;	/* the control requests this operator is waiting on */
	struct hrejoin *rejoin; /* between a rejoin hello and the end of its claim */
	bool watching;		/* in handlers->watchers */
	/* watch.c: events not queued to this watcher while replies were held,
	 * and the uv_now() ms by which it must have room for the "missed"
	 * event once the hold is over (0: still held). */
	uint64_t watch_missed, watch_missed_by;
	/* limits.c: on handlers->hconns from open to free. */
	struct handlers *h;
	struct sess *sess; /* not a reference: the session owns this */
	uid_t uid;
	/* uv_now() at accept, or the last tick it was not read for a hold:
	 * --hello-timeout counts from here. */
	uint64_t hello_from_ms;
	bool fd_counted;  /* its socket counts in the broker's fds_conns */
	bool uid_counted; /* it counts in handlers->uid_conns */
	bool evicted;	  /* closed to make room: in handlers->evicting until its fd is */
	bool op;	  /* root, gmbd's uid or the admin group (limits.c's reserve) */
	struct hconn *prev, *next;
};

static inline struct hconn *hconn_of(const struct sess *s)
{
	return s->data;
}

/* One request on its way through a handler. */
struct hreq {
	struct handlers *h;
	struct sess *s;
	Gmb__Envelope *env;    /* the caller's (dispatch or a parked request) */
	uint64_t start_ns;     /* uv_hrtime() when the request arrived */
	char err[ERR_MSG_MAX]; /* the sentence of a negative return */
	/* Set by a handler that returns HANDLERS_PARK (park.c reads them). */
	bool retry;    /* set by park.c: a parked request tried again */
	int short_dev; /* the device it is short of; -1: unknown */
	uint64_t short_bytes;
	uint32_t wait_ms;     /* the caller's wait; 0: only for drops */
	bool drops;	      /* short until clients drop handles (-EAGAIN) */
	int wait_kind;	      /* BROKER_WAIT_* */
	const char *wait_tag; /* in env */
	/* Set by a round's end before its pause runs again: who did not follow, and why. */
	const char *not_followed;
};

/* A handler's return besides 0 (replied or will reply) and -errno (the
 * dispatcher replies with that status and rq->err): park the request; or
 * the handler kept (or already freed) the envelope. */
#define HANDLERS_PARK 1
#define HANDLERS_KEPT 2

typedef int (*handlers_fn)(struct hreq *rq);

/*
 * A request gmbd sends to a client (dreq.c says its lifetime once): a
 * kind, a target, a deadline, and the kind's done handler that runs
 * exactly once, however it ends.
 */
enum hdreq_kind {
	HDREQ_DROP,    /* DropRequest: the core wants handles back */
	HDREQ_CONTROL, /* ControlCommand of an operator's pause/resume (control.c) */
	HDREQ_SWITCH,  /* ControlCommand of one step of a switch (switch.c) */
	HDREQ_PREEMPT, /* ControlCommand: pause every tag for a higher priority */
	HDREQ_FOLLOW,  /* IpcFollow: an importer unmaps, or maps again (ipc_pause.c) */
	HDREQ_NKINDS
};

/* How a daemon request ended. */
enum hdreq_end {
	HDREQ_ANSWERED,	 /* the client's last reply part, status 0 */
	HDREQ_REFUSED,	 /* the same, with a negative status */
	HDREQ_TIMED_OUT, /* its deadline passed first */
	HDREQ_GONE,	 /* the target's session went first */
	HDREQ_CANCELLED, /* its initiator gave up on it (handlers__dreq_cancel) */
};

/* What a done handler is told. */
struct hdreq_result {
	enum hdreq_end end;
	/* 0, the client's -errno (a positive status, the client's bug, is
	 * -EIO), -ETIMEDOUT, -ECONNRESET or -ECANCELED. */
	int status;
	const char *error; /* REFUSED: the client's sentence, "" when none; else "" */
};

struct hdreq {
	enum hdreq_kind kind;
	struct handlers *h;
	struct sess *target;	   /* no reference: the request is freed before it goes */
	uint64_t id;		   /* in target's dreqs */
	void *arg;		   /* the initiator's; NULL once done */
	bool done;		   /* its done handler ran: a late reply is ignored */
	uint64_t deadline;	   /* uv_now() ms while due; 0: none, or done */
	struct hdreq *prev, *next; /* handlers->dreqs_due while it has a deadline, not done */
	/* ControlCommand kinds: what the client was told (status.c reads them). */
	int op;
	char *tag;	       /* owned; "": every tag */
	bool importers_follow; /* a pause's PauseRequest.importers_follow */
	/* HDREQ_DROP: the chunks asked for, owned. */
	uint64_t *ids;
	size_t nids;
	/* HDREQ_PREEMPT: the client it pauses for. */
	uint64_t for_client;
	/* HDREQ_FOLLOW: the export, and whether to map it again or unmap it,
	 * or (drop) to close an idle one for good. */
	uint64_t export_id;
	bool map, drop;
};

/* A kind's done handler: @d ended as @res says. @d is valid during the
 * call and stays the target connection's; d->arg is cleared after it. */
typedef void (*hdreq_done_fn)(struct hdreq *d, const struct hdreq_result *res);

/* What the caller of handlers__dreq_reply() does after an answer. */
#define HDREQ_SETTLE 0x1 /* the answer may give memory back: settle */
#define HDREQ_STATE  0x2 /* it changed the broker's record */

/* reply.c */
/* Writes rq->err (through err_vfmt) and returns @rc. */
int handlers__fail(struct hreq *rq, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The one place a status becomes a reply: status 0 or -errno, with @err
 * (strerror when empty) as the message of a failure. */
void handlers__reply_status(struct sess *s, uint64_t reply_to, int status, const char *err);
/* Client names, tags, targets: <= WIRE_MAX_NAME bytes of UTF-8, no control
 * characters. -EINVAL with rq->err naming @what otherwise. */
int handlers__check_name(struct hreq *rq, const char *what, const char *name);
/* @di[0..ndevices) from the pools; strings point into the backend. */
void handlers__devices(const struct broker *br, Gmb__DeviceInfo *di, Gmb__DeviceInfo **pdi);
/* Tells the owner the record changed. */
void handlers__changed(struct handlers *h);
/* @s speaks for @c from now on (a rejoin: @c's entry exists already).
 * Return: 0 or -ENOMEM. */
int handlers__conn_bind(struct handlers *h, struct sess *s, struct bclient *c);
/* Forgets @c's session (it goes, or its claim ended without it). */
void handlers__conn_unbind(struct handlers *h, const struct bclient *c);
/* -ENOENT with the one sentence for a client gmbd knows that has no open
 * session now (an orphan, or one between losing its connection and
 * rejoining). */
int handlers__not_connected(struct hreq *rq, const struct bclient *c);
/* Parts like @part (its reply_to and body) that carry the fds of
 * @chunks[0..@n), WIRE_MAX_FDS a part, each marked more (the caller sends
 * the last part; the transport exports the fds as each part leaves).
 * Return: 0 or the send's -errno. */
struct chunk;
int handlers__send_chunk_fds(struct sess *s, const Gmb__Envelope *part, struct chunk *const *chunks,
			     size_t n);
/* The session that is @c's client (not one still rejoining as it). */
struct sess *handlers__conn_client(const struct handlers *h, const struct bclient *c);

/* The tag for a log line: "*" for every tag, else log_quote()d into @buf
 * (LOG_QUOTE_MAX bytes). */
const char *handlers__tag_log(const char *tag, char *buf);

/* watch.c */
struct event;
/* The WatchRequest: subscribe @rq->s. */
int handlers__watch(struct hreq *rq);
/* @s goes: no more events to it. */
void handlers__watch_gone(struct handlers *h, struct sess *s);
/* Tells the watchers and on_event (time_ns filled in when 0). */
void handlers__emit(struct handlers *h, struct event *ev);
/* Tells watcher @s only. */
void handlers__emit_to(struct handlers *h, struct sess *s, struct event *ev);
/* Client facts of @ev from @s (its session) and @c (NULL: from @s only). */
void handlers__event_client(struct event *ev, const struct sess *s, const struct bclient *c);
/* Request @request of @s failed with @status (@err: why): one log line at
 * info, naming the client and the reason, and an EVENT_REFUSED. */
void handlers__refused(struct handlers *h, struct sess *s, const char *request, int status,
		       const char *err);

/* drops.c */
/* broker_drop_cb: DropRequests to @c, HANDLERS_DROP_BATCH ids a packet. */
void handlers__send_drops(void *arg, struct bclient *c, const uint64_t *ids, size_t n);
/* HDREQ_DROP's done handler: an ack gives the memory back to the core. */
void handlers__drop_done(struct hdreq *d, const struct hdreq_result *res);
/* Asks @victim to pause every tag so that @for_c may be served (logged). */
void handlers__send_preempt(struct handlers *h, struct bclient *victim, const struct bclient *for_c,
			    int dev, uint64_t need);
/* HDREQ_PREEMPT's done handler: logged, the victim's mark cleared. */
void handlers__preempt_done(struct hdreq *d, const struct hdreq_result *res);

/* dreq.c */
/* A request of @kind for the initiator's @arg, not sent yet, zeroed
 * payload (the caller fills it in). Return: it, or NULL (out of memory). */
struct hdreq *handlers__dreq_new(enum hdreq_kind kind, void *arg);
/* Frees a request never sent, or one whose send failed; NULL is fine. */
void handlers__dreq_free(struct hdreq *d);
/**
 * handlers__dreq_send() - send @env (its body that of @d's kind; its id
 * set here) to @s as request @d, due in @timeout_ms (0: no deadline).
 * Return: 0, and @d is @s's connection's until it is answered or @s goes:
 * its done handler runs exactly once, never inside this call (a send that
 * fails dooms @s, and @s going completes @d); or -EPIPE (@s is not open),
 * -EBUSY (@s leaves HANDLERS_MAX_DREQS unanswered) or -ENOMEM: nothing was
 * sent and @d stays the caller's.
 */
int handlers__dreq_send(struct sess *s, struct hdreq *d, Gmb__Envelope *env, uint64_t timeout_ms);
/* handlers__dreq_send() of a ControlCommand @op of @tag ("": every tag),
 * with @wait_ms for a resume and d->importers_follow for a pause; d->op
 * and d->tag say it (a copy of @tag). */
int handlers__dreq_command(struct sess *s, struct hdreq *d, int op, const char *tag,
			   uint32_t wait_ms, uint64_t timeout_ms);
/* The initiator gives up on @d: its done handler runs now (CANCELLED)
 * unless it ran already; @d stays for the client's late reply. */
void handlers__dreq_cancel(struct hdreq *d);
/**
 * handlers__dreq_reply() - @env, from @s, replies to a request of gmbd:
 * its last part completes it (unless it was done already: a late reply)
 * and frees it; a reply to an id gmbd did not send is a protocol error.
 * Return: HDREQ_SETTLE/HDREQ_STATE of the answered request's kind (status
 * 0) for the caller to apply; 0 otherwise.
 */
unsigned handlers__dreq_reply(struct sess *s, const Gmb__Envelope *env);
/* @s goes: its requests not done yet end GONE; all of them are freed. */
void handlers__dreqs_gone(struct sess *s);

/* park.c */
/* Park @rq (it keeps rq->env and @fn, retried by handlers__settle()). */
int handlers__park(struct hreq *rq, handlers_fn fn);
/* Drops @s's parked requests. */
void handlers__park_cancel(struct handlers *h, struct sess *s);
/* Flush queued drops to their clients, then retry parked requests. */
void handlers__settle(struct handlers *h);

/* status.c */
int handlers__status(struct hreq *rq);

/* switch.c */
int handlers__switch(struct hreq *rq);
int handlers__priority(struct hreq *rq);
/* HDREQ_SWITCH's done handler: one step of a lane ended. */
void handlers__switch_step_done(struct hdreq *d, const struct hdreq_result *res);
/* gmbd stops: switches still running end unanswered, their handover too. */
void handlers__switch_close_all(struct handlers *h);

/* control.c */
int handlers__control(struct hreq *rq);
/* HDREQ_CONTROL's done handler: the operator is answered (if still there). */
void handlers__fwd_done(struct hdreq *d, const struct hdreq_result *res);
/* Operator @s goes: the controls it waits on are cancelled. */
void handlers__control_gone(struct sess *s);

/* memory.c */
int handlers__alloc(struct hreq *rq);
int handlers__free(struct hreq *rq);
int handlers__tag_mode(struct hreq *rq);
int handlers__pause(struct hreq *rq);
int handlers__resume(struct hreq *rq);
/* Its part for an IPC open's reply (ipc.c): the open given back. */
int handlers__ipc_undeliverable(struct handlers *h, struct sess *s, Gmb__Envelope *const *envs,
				size_t n, int err);
/* sess_ops.undeliverable: a lend whose chunk fds could not go out is taken back. */
int handlers__undeliverable(void *arg, struct sess *s, Gmb__Envelope *const *envs, size_t n,
			    int err);
int handlers__trim(struct hreq *rq);

/* ipc.c: memory shared between processes (export, open, close, grant). */
int handlers__ipc_export(struct hreq *rq);
int handlers__ipc_open(struct hreq *rq);
int handlers__ipc_close(struct hreq *rq);
int handlers__ipc_grant(struct hreq *rq);
/* objects.c: named objects. */
int handlers__object_publish(struct hreq *rq);
int handlers__object_open(struct hreq *rq);
int handlers__object_drop(struct hreq *rq);
int handlers__object_grant(struct hreq *rq);
/* object_pause.c: ObjectPauseRequest (readers follow, bytes copied off the
 * loop); the copies still running when gmbd stops end there. */
int handlers__object_pause(struct hreq *rq);
/*
 * ipc_pause.c, for object_pause.c: a round asking every reader of @obj
 * that maps a version to unmap (@map false) or that unmapped one to map it
 * again; @fn (a pause's handler) runs again once each answered, or the
 * request is answered (a resume's, @fn NULL). Return: HANDLERS_KEPT (the
 * round has rq->env); 0 when nobody could be asked (rq->err says who and
 * why); -ENOMEM. remap_all: lone requests to map again, to every reader
 * that unmapped (a pause that failed).
 */
struct bobject;
int handlers__object_follow(struct hreq *rq, handlers_fn fn, struct bobject *obj, bool map);
void handlers__object_remap_all(struct handlers *h, const struct bobject *obj);
/*
 * A refused pause of @obj's readers (non-NULL) or of the importers of
 * @rq's client's tag @tag, answered with @status and @msg once those that
 * followed it mapped again: a process touching the memory right after the
 * refusal must find it mapped. Return: HANDLERS_KEPT (the round has
 * rq->env), or 0 when none could be asked (the caller answers).
 */
int handlers__refuse_remapped(struct hreq *rq, const char *tag, struct bobject *obj, int status,
			      const char *msg);

/* ipc_pause.c: a pause of a tag other processes map. */
/* @rq (a pause of an imported tag) waits @wait_ms for the importers to
 * close, then @fn runs it again. Return: HANDLERS_KEPT, or -EBUSY. */
int handlers__ipc_wait(struct hreq *rq, handlers_fn fn, uint32_t wait_ms);
/* Waiting pauses tried again (handlers__settle()); on a retry their handler
 * returns HANDLERS_PARK to keep waiting. */
void handlers__ipc_retry(struct handlers *h);
/* The waiting pauses of @s (NULL: all) end unanswered. */
void handlers__ipc_cancel(struct handlers *h, struct sess *s);
/**
 * handlers__ipc_follow() - ask the importers of @rq's tag @tag that keep it
 * mapped idle to close it for good and, with @follow, the others to unmap;
 * then run @fn (the pause) again with rq->retry set.
 * Return: HANDLERS_KEPT (the round has rq->env); 0 when none could be
 * asked, rq->err then naming who and why.
 */
int handlers__ipc_follow(struct hreq *rq, handlers_fn fn, const char *tag, bool follow);
/* Import records of @c's tag @tag that followed a pause (ResumeReply.followers). */
uint32_t handlers__ipc_followers(struct handlers *h, const struct bclient *c, const char *tag);
/* IpcResumed: the followers map the tag again; answered once they did. */
int handlers__ipc_resumed(struct hreq *rq);
/* HDREQ_FOLLOW's done handler, and its late handler: an importer that
 * unmapped after the pause gave up on it is asked to map again. */
void handlers__follow_done(struct hdreq *d, const struct hdreq_result *res);
void handlers__follow_late(struct hdreq *d);
/* An import event (EVENT_IMPORT...) of client @c on session @s about @ex. */
struct import_export;
void handlers__ipc_event(struct handlers *h, struct sess *s, const struct bclient *c,
			 enum event_kind kind, const struct import_export *ex,
			 uint64_t duration_ns);
/* The rounds of owner @s (NULL: all) end unanswered. */
void handlers__ipc_rounds_gone(struct handlers *h, struct sess *s);
/* Status: the imports, the first HIPC_STATUS_MAX of them (strings point
 * into the broker: valid until it changes). */
#define HIPC_STATUS_MAX 64
struct hipc_rows {
	Gmb__ImportInfo *v, **pv;
	size_t n, cap;
	uint32_t total; /* listed or not */
};
/* Return: 0 or -ENOMEM (@rows then empty). */
int handlers__ipc_rows(const struct broker *br, struct hipc_rows *rows);
/* The status reply's imports part (more = false when @last). */
int handlers__ipc_status_part(struct hreq *rq, const struct hipc_rows *rows, bool last);
void handlers__ipc_rows_free(struct hipc_rows *rows);

/* object_status.c */
/* Status: the named objects, the first HOBJ_STATUS_MAX of them with their
 * HOBJ_STATUS_VERSIONS newest versions each, as many as one part holds
 * (strings point into the broker: valid until it changes). */
#define HOBJ_STATUS_MAX	     64
#define HOBJ_STATUS_VERSIONS 16
struct hobj_rows {
	Gmb__ObjectInfo *v, **pv;
	Gmb__ObjectVersionInfo *vv, **pvv; /* the listed objects' versions */
	size_t n, nv;
	size_t bytes;	/* packed so far */
	bool full;	/* the part's room is used up: the rest only counted */
	uint32_t total; /* listed or not */
};
/* Return: 0 or -ENOMEM (@rows then empty). */
int handlers__object_rows(const struct broker *br, struct hobj_rows *rows);
/* The status reply's last part: the objects (more = false). */
int handlers__object_status_part(struct hreq *rq, const struct hobj_rows *rows);
void handlers__object_rows_free(struct hobj_rows *rows);

/* orphans.c */
/* Orphan @c is reclaimed when its process goes or at now + the grace period. */
void handlers__orphan_watch(struct handlers *h, struct bclient *c);

/* hello.c */
int handlers__hello(struct hreq *rq);
/* ControlState: the client installed or removed its control handler. */
int handlers__control_state(struct hreq *rq);
int handlers__rejoin(struct hreq *rq);
/* @s goes (or finished its claim): forget the claim, free the orphan. */
void handlers__rejoin_gone(struct handlers *h, struct sess *s);

/* limits.c */
int handlers__limits_open(struct handlers *h, struct sess *s, struct hconn *hc);
void handlers__limits_free(struct hconn *hc);
/* Says the counts still waiting (handlers_close()). */
void handlers__limits_close(struct handlers *h);
/*
 * handlers__limits_log_level() - the level to log a refusal of kind @what
 * from @source (@who: its facts) at: @level the first time in an interval,
 * LOG_LVL_DEBUG while it is counted (common/ratelog.h says the count).
 */
int handlers__limits_log_level(struct handlers *h, const char *what, uint64_t source,
			       const char *who, int level);
/* @hc's socket is closed (or about to be): it no longer counts in fds_conns. */
void handlers__limits_fd_closed(struct hconn *hc);

#endif
