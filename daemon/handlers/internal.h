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
 *   drops.c      daemon -> client requests (their table) and DropRequests
 *   watch.c      events: to the watchers (WatchRequest) and on_event; refusals
 *   reply.c      sentences, status replies, names, devices, client -> session
 *   limits.c     connections per uid and gmbd's fds, the operators' reserve,
 *                idle connections, the hello deadline; refusals said once
 * A file calls only files below it; the one way up is the handler function
 * a parked request keeps (park.c calls it back).
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
#include "daemon/handlers/handlers.h"
#include "daemon/transport/sess.h"
#include "proto/gmb.pb-c.h"

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
};

/* A handler's return besides 0 (replied or will reply) and -errno (the
 * dispatcher replies with that status and rq->err): park the request; or
 * the handler kept (or already freed) the envelope. */
#define HANDLERS_PARK 1
#define HANDLERS_KEPT 2

typedef int (*handlers_fn)(struct hreq *rq);

enum hdreq_kind {
	HDREQ_DROP,
	HDREQ_CONTROL,
	HDREQ_SWITCH,
	HDREQ_PREEMPT
};

struct hswitch_lane;

/* A daemon -> client request waiting for its reply, in hconn->dreqs. */
struct hdreq {
	enum hdreq_kind kind;
	uint64_t *ids; /* DROP: the chunks asked for, owned */
	size_t nids;
	struct hfwd *fwd;	   /* CONTROL: NULL once the operator was answered */
	struct hswitch_lane *lane; /* SWITCH: NULL once the switch gave up on it */
	uint64_t for_client;	   /* PREEMPT: the client it pauses for */
	int op;			   /* CONTROL: what the client was told to do */
	char *tag;		   /* CONTROL: of which tag ("": every), owned */
};

/* A control request forwarded from an operator (actor) to a target. */
struct hfwd {
	uv_timer_t timer; /* --control-timeout; frees the struct on close */
	struct handlers *h;
	struct sess *actor;  /* reference held until the timer is closed */
	uint64_t actor_req;  /* the ControlRequest's id */
	struct sess *target; /* no reference: done before the target goes */
	struct hdreq *dreq;  /* the target's ControlCommand entry */
	int op;		     /* GMB__OP__PAUSE or GMB__OP__RESUME */
	bool done;
	uint64_t start_ns; /* uv_hrtime() when the operator asked */
	char tag[WIRE_MAX_NAME + 1];
	char target_name[WIRE_MAX_NAME + 1];
};

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
/* Enters @d in @s's daemon requests under a new id (*@id). -ENOMEM. */
int handlers__dreq_add(struct sess *s, struct hdreq *d, uint64_t *id);
void handlers__dreq_free(struct hdreq *d);
/* ControlCommand @op of @tag to @s as a daemon request @d of @d->kind
 * (entered here). 0, or -errno (nothing entered; @d stays the caller's). */
int handlers__send_command(struct sess *s, struct hdreq *d, int op, const char *tag,
			   uint32_t wait_ms);
/* Asks @victim to pause every tag so that @for_c may be served (logged). */
void handlers__send_preempt(struct handlers *h, struct bclient *victim, const struct bclient *for_c,
			    int dev, uint64_t need);
/* @victim's answer to a preemption (logged; its mark cleared). */
void handlers__preempt_answered(struct handlers *h, struct sess *s, struct hdreq *d, int status,
				const char *error);
/* broker_drop_cb: DropRequests to @c, HANDLERS_DROP_BATCH ids a packet. */
void handlers__send_drops(void *arg, struct bclient *c, const uint64_t *ids, size_t n);
/* The client's answer to DropRequest @d. Return: true when the memory is
 * back (settle then). */
bool handlers__drop_acked(struct handlers *h, struct sess *s, struct hdreq *d, int status,
			  const char *error);

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
/* A lane's client answered its command (@env: the last part). */
void handlers__switch_answered(struct handlers *h, struct hdreq *d, const Gmb__Envelope *env);
/* The lane's client went before answering. */
void handlers__switch_lane_lost(struct handlers *h, struct hdreq *d, const char *name);
/* gmbd stops: switches still running end unanswered, their handover too. */
void handlers__switch_close_all(struct handlers *h);

/* control.c */
int handlers__control(struct hreq *rq);
/* The target's answer to ControlCommand @d. */
void handlers__fwd_answered(struct hdreq *d, const Gmb__Envelope *env, struct sess *s);
/* @s is going: answer forwarded controls (-ECONNRESET), free its dreqs. */
void handlers__dreqs_fail(struct handlers *h, struct sess *s);

/* memory.c */
int handlers__alloc(struct hreq *rq);
int handlers__free(struct hreq *rq);
int handlers__tag_mode(struct hreq *rq);
int handlers__pause(struct hreq *rq);
int handlers__resume(struct hreq *rq);
/* sess_ops.undeliverable: a lend whose chunk fds could not go out is taken back. */
int handlers__undeliverable(void *arg, struct sess *s, Gmb__Envelope *const *envs, size_t n,
			    int err);
int handlers__trim(struct hreq *rq);

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
