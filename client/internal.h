/*
 * internal.h - libgmb's private state, shared by the client modules:
 *   conn.c   the connection: hello, the reader and worker threads, requests
 *   cache.c  the handle cache and each allocation's last lend (pure state)
 *   mem.c    allocations and tags: malloc, free, modes; mapping helpers
 *   cycle.c  pause and resume of tags, and the unmapping at close
 *   reconnect.c  after gmbd restarts: reconnect with backoff, re-announce
 *   api.c    the exported gmb_* functions, locking and last-error
 *
 * Threads: the application's threads call gmb_*; the reader thread owns
 * every read of the socket (replies, imports of chunk fds, DropRequests);
 * the worker thread runs ControlCommands, which may call the application's
 * handler and so must never run on the reader. DropRequests stay on the
 * reader: they need only the state lock, and gmbd may hold an operation of
 * this very client (a parked alloc or resume) until the drop is answered.
 *
 * Reconnecting (reconnect.c): when the connection is lost, the reader
 * thread reconnects with backoff (50 ms doubling to 2 s, until gmb_close()
 * or until gmbd says it has nothing to rejoin) and re-announces what this
 * client holds. Mappings are never touched for it. While it is away,
 * requests wait (gmb__request(): at most reconnect_wait_ms, then
 * -ENOTCONN), and a request whose answer was lost is sent again once the
 * client is back. The re-announcement reads the memory tables without
 * op_lock, so it first waits until no operation runs, or the one running
 * is parked in gmb__request() waiting for the connection (op_parked), and
 * no operation starts while it runs (rejoining).
 *
 * Locks: op_lock before lock; send_lock is never taken with lock held.
 *   op_lock    serializes the operations that change memory (malloc, free,
 *              pause, resume, set_mode, close) between application threads
 *              and the worker. Held across round trips to gmbd.
 *   lock       the state lock: pending requests, the job queue, flags, the
 *              control handler, last_error, and the memory tables that the
 *              reader also touches (the handle cache, the alloc tables and
 *              every allocation's last lend). Never held across a socket
 *              wait, a copy or a callback into the application.
 *   send_lock  one packet at a time on the socket.
 *
 * Nothing here prints, exits or aborts: failures are -errno plus a sentence
 * in a caller's ERR_MSG_MAX buffer, which api.c copies to last_error.
 */
#ifndef GMB_CLIENT_INTERNAL_H
#define GMB_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/idmap.h"
#include "common/wire.h"
#include "gmb.h"

/* One imported chunk. refs = allocations of this client whose last lend has it. */
struct gmb__handle {
	uint64_t id;                 /* the daemon's chunk id */
	uint64_t handle;             /* backend handle, owned by the cache */
	uint64_t size;
	uint32_t refs;
	struct gmb__handle *next;    /* on a release list once out of the cache */
};

struct gmb__tag;

struct gmb__alloc {
	uint64_t id;                 /* the daemon's allocation id */
	int dev;
	uint64_t size;               /* granularity multiple */
	uintptr_t va;                /* reserved for the allocation's whole life */
	struct gmb__tag *tag;
	/* Last lend, mapping order; id 0 = dropped. Guarded by the state lock. */
	uint64_t *chunk_ids;
	uint64_t *chunk_sizes;
	uint32_t nchunks;
	bool mapped;
	bool freeing;                /* a FreeRequest is on its way: not re-announced */
	bool saved;                  /* staging holds the bytes of the last pause */
	bool marked;                 /* scratch: got its lend in the resume at hand */
	void *staging;               /* PRESERVE tags: host copy, size bytes */
	struct gmb__alloc *prev, *next; /* in the tag */
};

struct gmb__tag {
	char name[WIRE_MAX_NAME + 1];
	int mode;                    /* GMB_MODE_* */
	bool paused;
	struct gmb__alloc *allocs;
	uint32_t nallocs;
	struct gmb__tag *next;
};

struct gmb__mem {
	struct idmap cache;          /* chunk id -> struct gmb__handle */
	struct idmap by_id;          /* alloc id -> struct gmb__alloc */
	struct idmap by_va;          /* base address -> struct gmb__alloc */
	struct gmb__tag *tags;       /* touched under op_lock only */
};

/* A reply: every part in order, owned by the holder (gmb__reply_deinit). */
struct gmb__reply {
	Gmb__Envelope **parts;
	size_t nparts, cap;
	int status;                  /* the last part's status, or a transport error */
	char error[ERR_MSG_MAX];     /* the daemon's message or the transport's */
	int import_err;              /* first failure importing this reply's fds */
	char import_msg[ERR_MSG_MAX];
	bool resent;                 /* sent again after a lost connection: the first
					copy may have been carried out (or undone) */
};

#define GMB__REPLY_INIT { 0 }

struct gmb__pending {
	uint64_t id;
	bool done;
	bool lost;                   /* done because the connection was lost */
	struct gmb__reply reply;
	struct gmb__pending *next;
};

/* A daemon request waiting for the worker. */
struct gmb__job {
	Gmb__Envelope *env;          /* owned by the job */
	uint64_t gen;                /* the connection it came on; answered only there */
	struct gmb__job *next;
};

struct gmb_client {
	int sock;                    /* replaced under lock and send_lock on reconnect */
	unsigned flags;              /* GMB_CONNECT_* */
	uint64_t id;                 /* from HelloReply; kept across reconnects */
	char *path;                  /* gmbd's socket, for reconnecting (owned) */
	char name[WIRE_MAX_NAME + 1];
	char backend_kind[16];
	int ndevices;
	uint64_t granularity[BACKEND_MAX_DEVICES];
	uint8_t uuid[BACKEND_MAX_DEVICES][16]; /* gmbd's devices, by which the backend orders ours */
	uint64_t device_bytes;       /* device 0's total, for the host backend */

	pthread_mutex_t op_lock;
	pthread_mutex_t lock;
	pthread_mutex_t send_lock;
	pthread_cond_t reply_cond;   /* a pending request completed */
	pthread_cond_t work_cond;    /* a job was queued, or the connection ended */
	pthread_cond_t poll_cond;    /* a daemon request was handled (CLOCK_MONOTONIC) */
	pthread_cond_t conn_cond;    /* connection, rejoin or op state changed (MONOTONIC) */
	pthread_t reader, worker;
	bool reader_started, worker_started;

	/* Under lock (be: written under both locks, so op_lock holders read it freely). */
	struct backend *be;          /* NULL until needed (tools never map) */
	bool connected;
	bool closing;                /* gmb_close() began: no reconnecting */
	bool gone;                   /* for good: closing, a tool, gmbd's Bye or refusal */
	bool bye;                    /* gmbd said it keeps nothing: do not come back */
	bool rejoining;              /* the reader re-announces: no operation starts */
	bool op_running;             /* an operation holds op_lock ... */
	bool op_parked;              /* ... and waits in gmb__request() for the connection */
	pthread_t op_owner;
	uint64_t gen;                /* connection generation, 1 for the first */
	int sock_next;               /* a reconnect's socket before it is c->sock; -1 */
	bool reconnect;              /* reconnect after a loss (not tools, not GMB_RECONNECT=0) */
	unsigned reconnect_wait_ms;  /* how long a call waits for the connection */
	char lost_msg[ERR_MSG_MAX];  /* why the connection is gone */
	uint64_t next_id;
	struct gmb__pending *pending;
	struct gmb__job *jobs, **jobs_tail;
	unsigned handled;            /* daemon requests handled since the last poll */
	gmb_control_fn control_fn;
	void *control_arg;
	char last_error[ERR_MSG_MAX];
	struct gmb__mem mem;
};

/* conn.c */
int gmb__fail(char *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int gmb__conn_open(struct gmb_client *c, const char *path, const char *name, unsigned flags,
		   char *err);
int gmb__conn_start(struct gmb_client *c, char *err);
void gmb__conn_stop(struct gmb_client *c);
void gmb__conn_closing(struct gmb_client *c);
int gmb__request(struct gmb_client *c, Gmb__Envelope *env, struct gmb__reply *rep, char *err);
void gmb__reply_deinit(struct gmb__reply *rep);
/* Answers gmbd's request @reply_to on connection @gen (dropped on another). */
int gmb__send_reply(struct gmb_client *c, uint64_t gen, uint64_t reply_to, int status,
		    const char *error);
/* op_lock for an operation that changes memory (waits out a re-announcement). */
void gmb__op_begin(struct gmb_client *c);
void gmb__op_end(struct gmb_client *c);
/* conn.c for reconnect.c: a packet read on the current socket (0 or -errno). */
int gmb__conn_read_one(struct gmb_client *c);

/* reconnect.c: the reader after a loss; 0 once back, or <0: gone for good. */
int gmb__reconnect(struct gmb_client *c);
/* Reads GMB_RECONNECT and GMB_RECONNECT_TIMEOUT into @c (at connect). */
void gmb__reconnect_config(struct gmb_client *c);

/* cache.c: the caller holds the state lock (or owns @m alone). */
int gmb__cache_put(struct gmb__mem *m, uint64_t id, uint64_t handle, uint64_t size,
		   struct gmb__handle **rel);
int gmb__lend_check(const struct gmb__mem *m, const struct gmb__alloc *a, const Gmb__Lend *l,
		    char *err);
int gmb__lend_set(struct gmb__mem *m, struct gmb__alloc *a, const uint64_t *ids,
		  const uint64_t *sizes, uint32_t n, struct gmb__handle **rel);
void gmb__lend_clear(struct gmb__mem *m, struct gmb__alloc *a, struct gmb__handle **rel);
void gmb__cache_drop(struct gmb__mem *m, const uint64_t *ids, size_t n, struct gmb__handle **rel);
void gmb__cache_sweep(struct gmb__mem *m, struct gmb__handle **rel);
void gmb__cache_clear(struct gmb__mem *m, struct gmb__handle **rel);
int gmb__lend_handles(const struct gmb__mem *m, const struct gmb__alloc *a, uint64_t *handles,
		      char *err);
/* Outside the lock: release each handle with @be (may be NULL) and free the list. */
void gmb__release_run(struct backend *be, struct gmb__handle *rel);

/* mem.c: the caller holds op_lock; @err gets the reason on failure. */
int gmb__mem_backend(struct gmb_client *c, char *err);
/* gmbd's index of this process's device @ordinal (what the application calls it). */
int gmb__mem_dev_index(struct gmb_client *c, int ordinal, char *err);
int gmb__mem_malloc(struct gmb_client *c, void **ptr, size_t size, int dev, const char *tag,
		    char *err);
int gmb__mem_free(struct gmb_client *c, void *ptr, char *err);
int gmb__mem_set_mode(struct gmb_client *c, const char *tag, int mode, char *err);
/* Reader thread, no op_lock: a DropRequest's handles. */
void gmb__mem_drop(struct gmb_client *c, const uint64_t *ids, size_t n);
/* gmb_close(), once the threads are gone: free every tag, allocation, handle. */
void gmb__mem_deinit(struct gmb_client *c);
/* Helpers shared with cycle.c. */
int gmb__mem_be_fail(char *err, int rc, const char *what);
struct gmb__tag *gmb__mem_tag_find(struct gmb_client *c, const char *name);
int gmb__mem_map(struct gmb_client *c, struct gmb__alloc *a, char *err);
int gmb__mem_unmap(struct gmb_client *c, struct gmb__alloc *a, char *err);
int gmb__mem_sync(struct gmb_client *c, uint64_t dev_mask, char *err);
int gmb__mem_staging_new(struct gmb_client *c, struct gmb__alloc *a, char *err);
int gmb__mem_send_pause(struct gmb_client *c, const char *name, char *err);
void gmb__mem_sweep(struct gmb_client *c);

/* cycle.c: the caller holds op_lock. @tag NULL or "": every tag. */
int gmb__cycle_pause(struct gmb_client *c, const char *tag, char *err);
int gmb__cycle_resume(struct gmb_client *c, const char *tag, char *err);
/* gmb_close(), still connected: drain and unmap every active allocation. */
void gmb__cycle_close(struct gmb_client *c);

/* api.c */
void gmb__control_run(struct gmb_client *c, const struct gmb__job *job);

/* client/status_json.c: *@out is malloc'd (JSON / an aligned table), the caller's. */
int gmb__status_to_json(const Gmb__StatusReply *st, char **out);
int gmb__status_to_table(const Gmb__StatusReply *st, char **out);

#endif
