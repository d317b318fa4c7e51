/*
 * conn.h - libgmb's connection to gmbd as a transport: the socket, hello,
 * the reader and worker threads, request/reply matching, and the gate that
 * serializes the operations changing memory.
 *
 * Layer: the bottom of libgmb. conn.c (the socket, hello, the threads)
 * and request.c (requests, replies, the operation gate) know the
 * envelope's framing and which packets are replies, requests or a Bye,
 * never what a lend or a control command means: they hand those to the
 * callbacks (struct gmb__conn_cbs) that the layers above register before
 * the threads start. They include only common/ and the wire types.
 * reconnect.c sits on top of them (client/lib/conn/reconnect.h) and is
 * reached through cbs.reconnect.
 *
 * Threads: the application's threads make requests; the reader thread owns
 * every read of the socket (replies, imports of chunk fds, DropRequests);
 * the worker thread runs ControlCommands, which may call the application's
 * handler and so must never run on the reader. DropRequests stay on the
 * reader: they need only the state lock, and gmbd may hold an operation of
 * this very client (a parked alloc or resume) until the drop is answered.
 *
 * Locks: op_lock before lock; send_lock is never taken with lock held.
 *   op_lock    serializes the operations that change memory (malloc, free,
 *              pause, resume, set_mode, close) between application threads
 *              and the worker. Held across round trips to gmbd.
 *   lock       the state lock: pending requests, the job queue, the flags
 *              below, and whatever the layers above keep under it (the
 *              memory tables the reader touches through the callbacks, the
 *              control handler, last_error). Never held across a socket
 *              wait, a copy or a callback into the application.
 *   send_lock  one packet at a time on the socket.
 *
 * Nothing here prints, exits or aborts: failures are -errno plus a sentence
 * in a caller's ERR_MSG_MAX buffer.
 */
#ifndef GMB_CLIENT_CONN_H
#define GMB_CLIENT_CONN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/wire.h"
#include "include/gmb.h"

/* A reply: every part in order, owned by the holder (gmb__reply_deinit). */
struct gmb__reply {
	Gmb__Envelope **parts;
	size_t nparts, cap;
	int status;		 /* the last part's status, or a transport error */
	char error[ERR_MSG_MAX]; /* the daemon's message or the transport's */
	int import_err;		 /* first failure importing this reply's fds */
	char import_msg[ERR_MSG_MAX];
	bool resent; /* sent on a later connection than the first
					try, after a re-announcement: it may have been
					carried out (or undone) already */
};

#define GMB__REPLY_INIT \
	{               \
		0       \
	}

struct gmb__pending {
	uint64_t id;
	bool done;
	bool lost; /* done because the connection was lost */
	struct gmb__reply reply;
	struct gmb__pending *next;
};

/* A daemon request waiting for the worker. */
struct gmb__job {
	Gmb__Envelope *env; /* owned by the job */
	uint64_t gen;	    /* the connection it came on; answered only there */
	struct gmb__job *next;
};

/* What gmbd said at hello: written before the threads start, then read-only. */
struct gmb__devices {
	char backend_kind[16];
	int ndevices;
	uint64_t granularity[BACKEND_MAX_DEVICES];
	uint64_t max_chunk[BACKEND_MAX_DEVICES]; /* gmbd's --max-chunk; 0: not said */
	uint8_t uuid[BACKEND_MAX_DEVICES][16]; /* gmbd's devices, by which the backend orders ours */
	uint64_t device_bytes;		       /* device 0's total, for the host backend */
	bool release_on_pause; /* gmbd gives paused memory back: let go of its handles */
	bool gives_back;       /* gmbd takes single allocations back (PauseRequest.alloc_ids) */
};

struct gmb__conn;
struct gmb__claim;
struct gmb__claim_answer;

/*
 * What the layers above do for the connection. Set before gmb__conn_start(),
 * then read-only; every callback runs on a library thread, with no lock held.
 */
struct gmb__conn_cbs {
	/* The memory layer's (mem_arg): */
	void *mem_arg;
	/* Imports @nfds chunk fds of reply part @env (the fds stay the caller's);
	 * failures go to @rep with gmb__reply_import_fail(). Reader thread. */
	void (*import)(void *arg, const Gmb__Envelope *env, const int *fds, int nfds,
		       struct gmb__reply *rep);
	/* gmbd's DropRequest: these chunks are gone; < 0 (@err says why): refused,
	 * none dropped. Reader thread. */
	int (*drop)(void *arg, const uint64_t *ids, size_t n, char *err);
	/* The re-announcement (reconnect.h): build the claim, apply gmbd's answer. */
	int (*claim_build)(void *arg, struct gmb__claim *cl);
	void (*claim_apply)(void *arg, const struct gmb__claim_answer *ans);
	/* The API's (ctl_arg): carry out and answer a ControlCommand or an
	 * IpcFollow. Worker thread. */
	void *ctl_arg;
	void (*control)(void *arg, const struct gmb__job *job);
	/* After a loss: 0 once back, <0 gone for good (reconnect.c). Reader thread. */
	int (*reconnect)(struct gmb__conn *conn);
};

struct gmb__conn {
	/* Set by gmb__conn_open() before the threads start, then read-only. */
	unsigned flags; /* GMB_CONNECT_* */
	uint64_t id;	/* from HelloReply; kept across reconnects */
	char *path;	/* gmbd's socket, for reconnecting (owned) */
	char name[WIRE_MAX_NAME + 1];
	char group[WIRE_MAX_NAME + 1]; /* $GMB_GROUP; "" none */
	int priority;		       /* $GMB_PRIORITY */
	bool preemptible;	       /* $GMB_PREEMPTIBLE=1 */
	struct gmb__devices devs;
	bool reconnect; /* reconnect after a loss (not tools, not GMB_RECONNECT=0) */
	/* $GMB_SPIN_US in ns: how long a caller polls for its reply, and the
	 * reader for the next packet after a reply, before blocking
	 * (common/spin.h). 0: they block at once. */
	uint64_t spin_ns;
	unsigned reconnect_wait_ms; /* how long a call waits for the connection */
	/* Reader thread only (reconnect.c): when the last reconnect came back
	 * (CLOCK_MONOTONIC ns, 0: none yet) and the delay to start from if the
	 * connection is lost again soon after. */
	uint64_t reconnect_back_ns;
	unsigned reconnect_delay_ms;
	/* Reader thread only: it polls the socket until then (ns, CLOCK_MONOTONIC). */
	uint64_t reader_spin_until;
	struct gmb__conn_cbs cbs;

	pthread_mutex_t op_lock;
	pthread_mutex_t lock;
	pthread_mutex_t send_lock;
	pthread_cond_t reply_cond; /* a pending request completed */
	pthread_cond_t work_cond;  /* a job was queued, or the connection ended */
	pthread_cond_t poll_cond;  /* a daemon request was handled (CLOCK_MONOTONIC) */
	pthread_cond_t conn_cond;  /* connection, rejoin or op state changed (MONOTONIC) */
	/* Started by gmb__conn_start(), joined by gmb__conn_stop(). */
	pthread_t reader, worker;
	bool reader_started, worker_started;

	/* Written under lock and send_lock (on reconnect), read under either. */
	int sock;
	uint64_t gen; /* connection generation, 1 for the first */

	/* Under lock. */
	bool connected;
	bool closing;	 /* gmb_close() began: no reconnecting */
	bool gone;	 /* for good: closing, a tool, gmbd's Bye or refusal */
	bool bye;	 /* gmbd said it keeps nothing: do not come back */
	bool rejoining;	 /* the reader re-announces: no operation starts */
	bool op_running; /* an operation holds op_lock ... */
	bool op_parked;	 /* ... and waits in gmb__request() for the connection */
	pthread_t op_owner;
	int sock_next;		    /* a reconnect's socket before it is sock; -1 */
	char lost_msg[ERR_MSG_MAX]; /* why the connection is gone */
	uint64_t next_id;
	struct gmb__pending *pending;
	struct gmb__job *jobs, **jobs_tail;
	unsigned handled; /* daemon requests handled since the last poll */
	bool control;	  /* a control handler is installed (hello says so) */
	/* WatchEvents gmbd pushed, oldest first, read by gmb_watch_next(). */
	struct gmb__job *events, **events_tail;
	size_t nevents;
	uint64_t events_lost;	   /* dropped here: the application read too slowly */
	pthread_cond_t event_cond; /* an event arrived, or the connection ended (MONOTONIC) */
};

/* Events kept for an application that reads them late; more are counted lost. */
#define GMB__MAX_EVENTS 4096

/* conn.c: the connection's life, the reader and the worker. */

/* gmb__conn_init() - locks, conditions and queues of a connection not yet open. */
void gmb__conn_init(struct gmb__conn *c);
/* gmb__conn_deinit() - after gmb__conn_stop() and close of the socket. */
void gmb__conn_deinit(struct gmb__conn *c);
int gmb__conn_open(struct gmb__conn *c, const char *path, const char *name, unsigned flags,
		   char *err);
int gmb__conn_start(struct gmb__conn *c, char *err);
void gmb__conn_stop(struct gmb__conn *c);
void gmb__conn_closing(struct gmb__conn *c);

/* request.c: requests and their replies, and the operation gate. */

int gmb__request(struct gmb__conn *c, Gmb__Envelope *env, struct gmb__reply *rep, char *err);
/* gmb__request() of a request answered with a status only (the reply let go of). */
int gmb__request_status(struct gmb__conn *c, Gmb__Envelope *env, char *err);
void gmb__reply_deinit(struct gmb__reply *rep);
/* Records the first import failure of @rep (for cbs.import). */
void gmb__reply_import_fail(struct gmb__reply *rep, int rc, const char *what, uint64_t id);
/* The reader's: files reply part @env with its request; consumes @env and @fds. */
void gmb__request_on_reply(struct gmb__conn *c, Gmb__Envelope *env, int *fds, int nfds);
/* Answers gmbd's request @reply_to on connection @gen (dropped on another). */
int gmb__send_reply(struct gmb__conn *c, uint64_t gen, uint64_t reply_to, int status,
		    const char *error);
/* op_lock for an operation that changes memory (waits out a re-announcement). */
void gmb__op_begin(struct gmb__conn *c);
void gmb__op_end(struct gmb__conn *c);

#endif
