/*
 * handlers.h - gmbd's request handlers: decode a client's envelope, check
 * the caller and the arguments, call the core (daemon/core/broker.h), encode the
 * reply. Dispatch comes from one table keyed by the envelope's body case.
 *
 * Besides plain request/reply, the handlers keep three kinds of pending
 * work, all owned here and cancelled when a session goes:
 *   - parked requests: an alloc/resume the core answered with -EAGAIN
 *     (memory returns once clients drop handles). Retried in arrival order
 *     after every drop ack and every operation that frees memory; answered
 *     -ENOMEM at their deadline.
 *   - daemon requests to a client (DropRequest, ControlCommand), keyed by
 *     the session's own request ids; a client reply must match one.
 *   - forwarded control requests (gmbctl pause/resume of another client),
 *     with a timer; at most one in flight per target.
 * Parked and forwarded requests count against WIRE_MAX_INFLIGHT.
 */
#ifndef GMB_HANDLERS_H
#define GMB_HANDLERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/err.h"
#include "common/wire.h"
#include "proto/gmb.pb-c.h"

#define HANDLERS_PARK_TIMEOUT_MS 5000
/* A client that leaves this many daemon requests unanswered is dropped. */
#define HANDLERS_MAX_DREQS 4096
/* Chunk ids per DropRequest; keeps the packet well under WIRE_MAX_MSG. */
#define HANDLERS_DROP_BATCH 2048

struct bclient;
struct broker;
struct sess;
struct hfwd;
struct hpark;

struct handlers {
	uv_loop_t *loop;
	struct broker *broker;          /* not owned */
	uint64_t control_timeout_ms;
	uint64_t park_timeout_ms;
	struct hpark *parked, *parked_tail; /* arrival order */
	uv_timer_t park_timer;          /* the first parked request's deadline */
	/* Called after anything that changes the broker's record (gmbd: the
	 * fd store's state and STATUS=); NULL: nobody cares. */
	void (*changed)(void *arg);
	void *changed_arg;
	uv_timer_t orphan_timer;        	uint64_t orphan_deadline;       /* uv_now() ms: orphans left are reclaimed */
	uint64_t orphan_grace_ms;
	bool retrying;                  /* guards against nested retries */
	bool closed;
	bool handover;                  /* stopping, the clients' state kept for the next
					   gmbd: disconnects return nothing */
};

/**
 * handlers_init() - ready @h for sessions on @loop over @br.
 * @h and @br stay the caller's; handlers_close() before the loop ends.
 * Return: 0 or libuv's error.
 */
int handlers_init(struct handlers *h, uv_loop_t *loop, struct broker *br,
		  uint64_t control_timeout_ms);

/* Closes the timers; every session must be disconnected already. */
void handlers_close(struct handlers *h);

/**
 * handlers_orphans_start() - clients restored from the previous gmbd are
 * waiting to rejoin: reclaim at once those whose process is gone, the
 * others as soon as it goes, and all left after @grace_ms.
 */
void handlers_orphans_start(struct handlers *h, uint64_t grace_ms);

/**
 * handlers_goodbye() - gmbd stops and keeps no state: tell every client
 * (Bye) not to come back. The packets leave with the sessions' disconnect.
 */
struct server;
void handlers_goodbye(struct handlers *h, struct server *srv, const char *reason);

/**
 * handlers_dispatch() - handle one envelope of @s.
 * Takes @env: it is freed here or kept by a parked request. A protocol
 * error dooms @s (see sess_doom()).
 */
void handlers_dispatch(struct handlers *h, struct sess *s, Gmb__Envelope *env);

/**
 * handlers_sess_gone() - @s is disconnecting: drop its parked requests,
 * answer the operators whose control it was carrying out (-ECONNRESET),
 * forget its daemon requests, and remove its client from the broker (the
 * memory goes back to the pools and parked requests are retried).
 */
void handlers_sess_gone(struct handlers *h, struct sess *s);

/**
 * handlers_export_fds() - new fds for @n chunk ids, owned by the caller
 * (close them after sending). On failure none are left open.
 * Return: 0, -ENOENT for an unknown chunk, or the backend's error.
 */
int handlers_export_fds(struct handlers *h, const uint64_t *ids, size_t n, int *fds);

/* "alloc", "hello_reply"... for logs; "unknown" outside the table. */
const char *handlers_body_name(int body_case);

/*
 * Internals shared by daemon/handlers/handlers.c (dispatch, memory requests, parking),
 * daemon/handlers/control.c (daemon requests: drops, forwarded control),
 * daemon/handlers/status.c (status) and daemon/handlers/hello.c (hello,
 * rejoin after a restart); nothing else uses them.
 */

/* One request on its way through a handler. */
struct hreq {
	struct handlers *h;
	struct sess *s;
	Gmb__Envelope *env;       /* the caller's (dispatch or a parked request) */
	char err[ERR_MSG_MAX];    /* the sentence of a negative return */
};

/* A handler's return besides 0 (replied or will reply) and -errno (the
 * dispatcher replies with that status and rq->err): park the request; or
 * the handler kept (or already freed) the envelope. */
#define HANDLERS_PARK 1
#define HANDLERS_KEPT 2

typedef int (*handlers_fn)(struct hreq *rq);

enum hdreq_kind { HDREQ_DROP, HDREQ_CONTROL };

/* A daemon -> client request waiting for its reply, in sess->dreqs. */
struct hdreq {
	enum hdreq_kind kind;
	uint64_t *ids;            /* DROP: the chunks asked for, owned */
	size_t nids;
	struct hfwd *fwd;         /* CONTROL: NULL once the operator was answered */
};

/* A control request forwarded from an operator (actor) to a target. */
struct hfwd {
	uv_timer_t timer;         /* --control-timeout; frees the struct on close */
	struct handlers *h;
	struct sess *actor;       /* reference held until the timer is closed */
	uint64_t actor_req;       /* the ControlRequest's id */
	struct sess *target;      /* no reference: done before the target goes */
	struct hdreq *dreq;       /* the target's ControlCommand entry */
	int op;                   /* GMB__OP__PAUSE or GMB__OP__RESUME */
	bool done;
	char tag[WIRE_MAX_NAME + 1];
	char target_name[WIRE_MAX_NAME + 1];
};

/* Writes rq->err and returns @rc. */
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
/* Flush queued drops to their clients, then retry parked requests. */
void handlers__settle(struct handlers *h);

/* handlers_hello.c */
int handlers__hello(struct hreq *rq);
/* HelloReply for @c; @rejoined: it is an orphan coming back. */
int handlers__send_hello_reply(struct hreq *rq, const struct bclient *c, bool rejoined);
/* Tells the owner the record changed. */
void handlers__changed(struct handlers *h);

int handlers__rejoin_hello(struct hreq *rq, bool control);
int handlers__rejoin(struct hreq *rq);
/* @s goes (or finished its claim): forget the claim, free the orphan. */
void handlers__rejoin_gone(struct handlers *h, struct sess *s);
/* /proc/PID/stat's start time, 0 if unknown (*@err, may be NULL, says why). */
uint64_t handlers__pid_start_time(pid_t pid, int *err);

/* handlers_ctl.c */
int handlers__control(struct hreq *rq);
void handlers__daemon_reply(struct hreq *rq);
void handlers__send_drops(void *arg, struct bclient *c, const uint64_t *ids, size_t n);
/* @s is going: answer forwarded controls (-ECONNRESET), free its dreqs. */
void handlers__dreqs_fail(struct handlers *h, struct sess *s);

/* handlers_status.c */
int handlers__status(struct hreq *rq);

#endif
