/*
 * broker.h - gmbd's core: clients, tags, allocations and budgets over the
 * per-device pools. No socket and no protobuf type in here: the handlers
 * (daemon/handlers.c) decode requests, call these functions and encode what
 * comes back.
 *
 * State: devices -> pool (chunks) <- allocations <- tags <- clients.
 * An allocation's chunks[] is its last lend: while it is active these chunks
 * are lent to it; while paused they may sit in the pool (and be lent to
 * another client of the same uid), and the client still holds their handles
 * until a new lend replaces the list or a drop clears entries (NULL).
 *
 * Drops the core decides on (trim, keep limit, another uid needing memory)
 * are queued per client; the transport sends them as DropRequests after
 * each operation (broker_flush_drops) and reports acks (broker_dropped).
 */
#ifndef GMB_BROKER_H
#define GMB_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/backend.h"
#include "common/idmap.h"
#include "common/wire.h"
#include "daemon/pool.h"

#define BROKER_MAX_TAGS 256         /* per client */
#define BROKER_MAX_ALLOCS 65536     /* per client */

struct btag;
struct bclient;

struct balloc {
	uint64_t id;
	int dev;
	uint64_t size;             /* granularity multiple */
	struct btag *tag;
	struct chunk **chunks;     /* last lend, mapping order; NULL = dropped */
	uint32_t nchunks;
	bool active;               /* chunks are lent to it now */
	struct balloc *prev, *next; /* in tag */
};

struct btag {
	char name[WIRE_MAX_NAME + 1];
	int mode;                  /* GMB_MODE_* */
	bool paused;
	struct bclient *client;
	struct balloc *allocs;
	uint32_t nallocs;
	uint64_t bytes;
	struct btag *next;
};

struct broker_peer {
	pid_t pid;
	uid_t uid;
	gid_t gid;
	const gid_t *groups;       /* supplementary groups (SO_PEERGROUPS) */
	int ngroups;
};

struct bclient {
	uint64_t id;
	char name[WIRE_MAX_NAME + 1];
	pid_t pid;
	uid_t uid;
	gid_t gid;
	gid_t *groups;
	int ngroups;
	bool control, tool;
	struct btag *tags;
	uint32_t ntags;
	struct idmap allocs;       /* id -> balloc */
	uint64_t *drops;           /* chunk ids to ask the client to drop */
	size_t ndrops, cap_drops;
	void *transport;           /* the session, owned by the transport */
	struct bclient *prev, *next;
};

struct broker_opts {
	uint64_t max_chunk;        /* default 1 GiB */
	uint64_t pool_keep;        /* UINT64_MAX: keep every free chunk */
	uint64_t budget;           /* per device; 0: device total - reserve */
	uint64_t reserve;          /* kept out of the default budget */
	gid_t admin_gid;
	bool have_admin_gid;
	uid_t daemon_uid;
};

struct broker {
	struct backend *backend;   /* not owned */
	struct broker_opts opts;
	struct pool pools[BACKEND_MAX_DEVICES];
	int ndevices;
	struct idmap chunks;       /* id -> chunk */
	uint64_t next_chunk_id, next_client_id, next_alloc_id;
	struct bclient *clients;
	uint32_t nclients;
};

/* What alloc/resume lend: send fds of send[] first, then the lends. */
struct broker_result {
	struct balloc **allocs;    /* malloc'd array owned by the result */
	size_t nallocs;
	struct chunk **send;       /* chunks the client holds no handle to yet */
	size_t nsend;
};

#define BROKER_RESULT_INIT { 0 }

int broker_new(struct backend *b, const struct broker_opts *o, struct broker **out);
void broker_free(struct broker *br);

/* @name is copied (truncated to WIRE_MAX_NAME); @out stays owned by @br. */
int broker_client_add(struct broker *br, const struct broker_peer *peer, const char *name,
		      bool control, bool tool, struct bclient **out);
/* Everything the client had goes back to the pools; @c is freed. */
void broker_client_remove(struct broker *br, struct bclient *c);
/* By id ("#12" or "12"), then pid, then name; NULL if none or ambiguous. */
struct bclient *broker_client_find(struct broker *br, const char *selector);

/* The operations. @err (ERR_MSG_MAX bytes) gets a sentence on failure. */
int broker_alloc(struct broker *br, struct bclient *c, int dev, uint64_t size, const char *tag,
		 struct broker_result *res, char *err);
int broker_free_alloc(struct broker *br, struct bclient *c, uint64_t alloc_id, char *err);
int broker_set_mode(struct broker *br, struct bclient *c, const char *tag, int mode, char *err);
int broker_pause(struct broker *br, struct bclient *c, const char *tag, char *err);
int broker_resume(struct broker *br, struct bclient *c, const char *tag,
		  struct broker_result *res, char *err);
int broker_trim(struct broker *br, int dev, uint64_t *released, uint64_t *pending, char *err);
/* The client dropped these handles (ack of a DropRequest). */
void broker_dropped(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n);
/* May @actor pause/resume @target (or trim when @target is NULL)? */
int broker_may_control(const struct broker *br, const struct bclient *actor,
		       const struct bclient *target, char *err);

typedef void (*broker_drop_cb)(void *arg, struct bclient *c, const uint64_t *ids, size_t n);
/* Hands each client's queued drops to @cb and clears the queues. */
void broker_flush_drops(struct broker *br, broker_drop_cb cb, void *arg);

void broker_result_deinit(struct broker_result *r);

#endif
