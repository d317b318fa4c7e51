/*
 * handlers.h - gmbd's request handlers: decode a client's envelope, check
 * the caller and the arguments, call the core (daemon/core/broker.h), encode the
 * reply. Dispatch comes from one table keyed by the envelope's body case.
 *
 * Besides plain request/reply, the handlers keep pending work, all owned
 * here and ended when a session goes (the handlers' state of one
 * connection is a struct hconn, daemon/handlers/internal.h):
 *   - parked requests: an alloc/resume the core answered with -EAGAIN
 *     (memory returns once clients drop handles), or with -ENOMEM when
 *     the request may wait (wait_ms). Retried in the core's serving order
 *     (priority, then arrival, per device) after every drop ack and every
 *     operation that frees memory; answered -ENOMEM at their deadline.
 *   - daemon requests to a client (daemon/handlers/dreq.c): one type for
 *     DropRequests and the ControlCommands of forwarded controls, switch
 *     steps and preemption, keyed by the session's own request ids (a
 *     client reply must match one), with one timer for every deadline and
 *     a done handler that runs exactly once per request.
 *   - forwarded control requests (gmbctl pause/resume of another client):
 *     at most one in flight per target; cancelled when the operator goes.
 *   - switches (gmbctl switch): a sequence of control commands to the
 *     clients of both sides, with their rollback.
 * Parked and forwarded requests count against WIRE_MAX_INFLIGHT.
 */
#ifndef GMB_HANDLERS_H
#define GMB_HANDLERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/idmap.h"
#include "common/ratelog.h"
#include "proto/gmb.pb-c.h"
#include "daemon/transport/sess.h"

#define HANDLERS_PARK_TIMEOUT_MS    5000
/* A client that leaves this many daemon requests unanswered is dropped. */
#define HANDLERS_MAX_DREQS	    4096
/* Watch subscribers at once, and what one may have queued before it is
 * dropped (well under the session's own SESS_OUT_MAX_*). */
#define HANDLERS_MAX_WATCHERS	    64
#define HANDLERS_WATCH_MAX_PACKETS  1024
#define HANDLERS_WATCH_MAX_BYTES    (256u << 10)
/* A watcher that missed events while replies were held is told so once its
 * queue is down to this (and dropped if it is not HANDLERS_WATCH_DRAIN_MS
 * after the hold): room for what comes next, so that catching up with the
 * backlog of the hold does not meet the bound again at once. */
#define HANDLERS_WATCH_ROOM_PACKETS (HANDLERS_WATCH_MAX_PACKETS / 2)
#define HANDLERS_WATCH_ROOM_BYTES   (HANDLERS_WATCH_MAX_BYTES / 2)
#define HANDLERS_WATCH_DRAIN_MS	    10000
#define HANDLERS_WATCH_TICK_MS	    50
/* Connections an operator (root, gmbd's uid, the admin group) may open past
 * --max-connections-per-uid, and fds of BROKER_FD_SPARE's margin its
 * connections may take past what others may: room to look and act. */
#define HANDLERS_OPERATOR_CONNS	    16
/* Chunk ids per DropRequest; keeps the packet well under WIRE_MAX_MSG. */
#define HANDLERS_DROP_BATCH	    2048

struct bclient;
struct broker;
struct event;
struct server;
struct hdreq;
struct hpark;
struct hswitch;

struct hipc_wait;
struct hipc_round;

struct handlers {
	uv_loop_t *loop;
	struct broker *broker; /* not owned */
	uint64_t control_timeout_ms;
	uint64_t park_timeout_ms;
	uint32_t nparked;	  /* in the broker's waiting queue */
	uv_timer_t park_timer;	  /* the earliest parked request's deadline */
	struct hswitch *switches; /* switches in progress (switch.c) */
	/* dreq.c: daemon requests with a deadline, earliest first, and the
	 * one timer for all of them (armed for the first). */
	struct hdreq *dreqs_due;
	uv_timer_t dreq_timer;
	/* Called after anything that changes the broker's record (gmbd: the
	 * fd store's state and STATUS=); NULL: nobody cares. */
	void (*changed)(void *arg);
	void *changed_arg;
	struct idmap conns; /* client id -> struct sess: connected or rejoining */
	/* Who hears of every event besides the watchers (gmbd: the metrics);
	 * NULL: nobody. Called on the loop, @ev valid during the call. */
	void (*on_event)(void *arg, const struct event *ev);
	void *event_arg;
	struct sess **watchers; /* subscribed sessions, a reference each */
	size_t nwatchers, cap_watchers;
	uv_timer_t watch_timer; /* runs while a watcher has missed events */
	uv_timer_t orphan_timer;
	uint64_t orphan_grace_ms;
	/* limits.c: 0 turns either off; set after handlers_init(). */
	uint64_t hello_timeout_ms;
	uint32_t max_conns_per_uid;
	struct idmap uid_conns; /* uid + 1 -> connections open */
	struct hconn *hconns;	/* every connection, newest first */
	uv_timer_t hello_timer; /* the hello deadline and the refusals' counts */
	/* Refusals (of connections, of requests) said once, then counted. */
	struct ratelog refusals;
	uint32_t evicting; /* idle connections closed whose fds are not yet */
	bool retrying;	   /* guards against nested retries */
	/* ipc_pause.c: pauses waiting for the importers of their tags to
	 * close; pauses and resumes whose importers are asked to follow. */
	struct hipc_wait *ipc_waits;
	struct hipc_round *ipc_rounds;
	/* park.c's handlers__settle(), for the files below it (a way up). */
	void (*settle)(struct handlers *h);
	bool closed;
	bool handover; /* stopping, the clients' state kept for the next
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
void handlers_goodbye(struct handlers *h, struct server *srv, const char *reason);

/*
 * What the transport calls (server_start(..., &handlers_sess_ops, h, ...)):
 * open makes a connection's struct hconn, recv dispatches one envelope
 * (taking it: freed here or kept by a parked request; a protocol error
 * dooms the session), gone drops the session's parked requests, ends its
 * daemon requests (the operators whose control it was carrying out are
 * answered -ECONNRESET), cancels the controls it was waiting on as an
 * operator, and removes its client from the broker (the memory goes back
 * to the pools and parked requests are retried), export_fds makes the fds
 * of chunks at send time.
 */
extern const struct sess_ops handlers_sess_ops;

/* The session connected (or rejoining) as @c; NULL: none. */
struct sess *handlers_sess_of(const struct handlers *h, const struct bclient *c);

#endif
