/*
 * broker.h - gmbd's core: clients, tags, allocations and budgets over the
 * per-device pools. No socket, no loop and no protobuf type in here: the
 * handlers (daemon/handlers/) decode requests, call these functions and
 * encode what comes back, and keep their own map from client to
 * connection. The rest of the core's API has a header for each file:
 * lend.h (allocations, pause, resume), arb.h (groups, priorities,
 * switches, preemption), wait.h (the queue of requests waiting for
 * memory), rejoin.h (restart without loss) and walk.h (the only way over
 * the lists below from outside daemon/core/). Internals shared by the
 * core's files: broker_internal.h.
 *
 * State: devices -> pool (chunks) <- allocations <- tags <- clients.
 * An allocation's chunks[] is its last lend: while it is active these chunks
 * are lent to it; while paused they may sit in the pool (and be lent to
 * another client of the same uid), and the client still holds their handles
 * until a new lend replaces the list or a drop clears entries (NULL).
 *
 * Drops the core decides on (trim, keep limit, another uid needing memory)
 * are queued per client; the handlers send them as DropRequests after
 * each operation (broker_flush_drops) and reports acks (broker_dropped).
 */
#ifndef GMB_BROKER_H
#define GMB_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/backend/backend.h"
#include "common/idmap.h"
#include "common/wire.h"
#include "daemon/core/pool.h"

#define BROKER_MAX_TAGS	  256	/* per client */
#define BROKER_MAX_ALLOCS 65536 /* per client */

/*
 * gmbd's open files (opts.fd_limit, its RLIMIT_NOFILE). It counts its chunk
 * fds (the backend's chunk_fds a chunk), fds_base (what it held once it
 * served: its own, the listening socket) and fds_conns (one a connection),
 * and keeps BROKER_FD_SPARE free at all times: for the one batch of chunk
 * fds being sent (at most WIRE_MAX_FDS exist at once) and for what it opens
 * for a moment (the fd store's export, the state record, metrics
 * connections, /proc and NSS reads). A connection past that is refused at
 * accept (daemon/handlers/limits.c; an operator's may take
 * HANDLERS_OPERATOR_CONNS of the margin). New chunks leave room for
 * BROKER_FD_CONN_ROOM connections besides (or for those open, if more), so
 * that other clients can still connect once chunks took all they may, and
 * the last opts.root_chunks of them are root's; a lend that needs new chunk
 * fds past that first sends idle warm chunks back (pool_release_idle():
 * each closes its fds) and fails with -EMFILE only when they are not enough.
 */
#define BROKER_FD_SPARE	    (WIRE_MAX_FDS + 48)
#define BROKER_FD_CONN_ROOM 64

struct btag;
struct bclient;
struct bhandover;
struct bwaiter;
struct import_table;
struct object_table;
struct object_hooks;

struct balloc {
	uint64_t id;
	int dev;
	uint64_t size; /* granularity multiple */
	struct btag *tag;
	struct chunk **chunks; /* last lend, mapping order; NULL = dropped */
	uint32_t nchunks;
	bool active;		    /* chunks are lent to it now */
	struct balloc *prev, *next; /* in tag */
};

struct btag {
	char name[WIRE_MAX_NAME + 1];
	int mode; /* GMB_MODE_* */
	bool paused;
	/* The resume of its client (bclient.resumes) that made it active last:
	 * lend_undo() pauses again every tag that resume named. */
	uint64_t resumed_by;
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
	const gid_t *groups; /* supplementary groups (SO_PEERGROUPS) */
	int ngroups;
	uint64_t start_time; /* /proc/PID/stat starttime; 0: unknown */
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
	uint64_t start_time; /* tells a reused pid from the client's own */
	/* Restored from a previous gmbd and not back yet (daemon/core/rejoin.c),
	 * or a live client whose connection gmbd ended (rejoin_orphan()): its
	 * memory stays counted and lent until it rejoins or is reclaimed. */
	bool orphan;
	uint64_t orphan_deadline; /* the handlers' clock (ms): reclaimed past it */
	struct btag *tags;
	uint32_t ntags;
	struct idmap allocs; /* id -> balloc */
	uint64_t *drops;     /* chunk ids to ask the client to drop */
	size_t ndrops, cap_drops;
	/* Arbitration (daemon/core/arb.c). */
	char group[WIRE_MAX_NAME + 1]; /* "": none */
	int priority;		       /* higher is served first */
	bool preemptible;	       /* gmbd may pause it for a higher priority */
	uint64_t preempt_for;	       /* asked to pause for that client; 0: not */
	struct bhandover *handover;    /* the switch it is part of; NULL: none */
	bool handover_from;	       /* ... on the FROM side */
	uint64_t lent_chunks;	       /* chunks of its active allocations */
	uint64_t resumes;	       /* resumes that made tags active, numbered */
	struct bclient *prev, *next;
};

struct broker_opts {
	uint64_t max_chunk; /* default 1 GiB */
	uint64_t pool_keep; /* UINT64_MAX: keep every free chunk */
	uint64_t budget;    /* per device; 0: device total - reserve */
	uint64_t reserve;   /* kept out of the default budget */
	gid_t admin_gid;
	bool have_admin_gid;
	uid_t daemon_uid;
	const struct pool_hooks *hooks;		 /* handed to every pool; may be NULL */
	const struct object_hooks *object_hooks; /* named objects' copies; may be NULL */
	/* Chunks one uid's clients may have lent at once (ENOSPC past it); 0: no bound. */
	uint64_t max_chunks_per_uid; /* a uid's bound; 0: none, or chunk_share's */
	/* --max-chunks-per-uid auto: the chunks the uids share, a uid's bound
	 * being chunk_share / (the other uids holding chunks + 2), so that
	 * whoever took first a newcomer finds room; 0: no share */
	uint64_t chunk_share;
	/* New chunks only root's lends may take: what gmbd's fds leave when
	 * every other uid is at its bound (broker_fds_chunk_room()) */
	uint64_t root_chunks;
	uint64_t fd_limit; /* gmbd's RLIMIT_NOFILE (EMFILE past it); 0: not checked */
};

struct broker {
	struct backend *backend; /* not owned */
	struct broker_opts opts;
	struct pool pools[BACKEND_MAX_DEVICES];
	int ndevices;
	struct idmap chunks; /* id -> chunk */
	uint64_t next_chunk_id, next_client_id, next_alloc_id;
	struct bclient *clients;
	uint32_t nclients;
	struct bwaiter *waiters; /* serving order: priority, then arrival */
	uint64_t next_wait_seq, next_handover_id;
	/* Open fds of gmbd but chunk fds: those it held once it served (set
	 * then), and one a connection (the handlers count them). */
	uint64_t fds_base, fds_conns;
	/* Exports and imports of memory shared between processes
	 * (daemon/core/import.h); NULL until the first export. */
	struct import_table *imports;
	/* Named objects (daemon/core/object.h); NULL until the first publish. */
	struct object_table *objects;
};

/* What alloc/resume lend: send fds of send[] first, then the lends. The
 * pointers are the broker's and stay valid until its next call. */
struct broker_result {
	struct balloc **allocs; /* malloc'd array owned by the result */
	size_t nallocs;
	struct chunk **send; /* chunks the client holds no handle to yet */
	size_t nsend;
	/* On -ENOMEM/-EAGAIN: the device that was short (-1: not a shortage,
	 * e.g. a size past the budget) and by how many bytes. */
	int short_dev;
	uint64_t short_bytes;
};

#define BROKER_RESULT_INIT      \
	{                       \
		.short_dev = -1 \
	}

int broker_new(struct backend *b, const struct broker_opts *o, struct broker **out);
void broker_free(struct broker *br);

/* @name is copied (truncated to WIRE_MAX_NAME); @out stays owned by @br. */
int broker_client_add(struct broker *br, const struct broker_peer *peer, const char *name,
		      bool control, bool tool, struct bclient **out);
/* Everything the client had goes back to the pools; @c is freed. */
void broker_client_remove(struct broker *br, struct bclient *c);
/* The client (not a tool) of id @id; NULL if none. */
struct bclient *broker_client_get(struct broker *br, uint64_t id);

/* The candidates a lookup keeps to name when several clients match. */
#define BROKER_FOUND_MAX 8

/* What a selector matched: none (n == 0), one, or several. */
struct broker_found {
	size_t n;			     /* how many clients match */
	struct bclient *c[BROKER_FOUND_MAX]; /* the first min(n, BROKER_FOUND_MAX), the broker's */
	bool by_pid;			     /* they matched by pid, not by name */
};

/**
 * broker_client_find() - the client @selector names, for an operator who
 * chooses one: "#N" is an id; digits are an id, else a pid; anything else
 * (digits matching neither too) a name. Tools are never chosen; orphans
 * are, like any client (the caller says when one cannot be acted on).
 * @out, when not NULL, says how many matched and which: a pid or a name
 * that several clients share is an answer of its own, not "none".
 * Return: the client when exactly one matches (the broker's), else NULL.
 */
struct bclient *broker_client_find(struct broker *br, const char *selector,
				   struct broker_found *out);

/**
 * broker_found_err() - the one sentence, into @err, for a lookup of
 * @selector that did not find exactly one client: "no client matches"
 * (with @groups, "no client or group", for callers that take a group
 * name too), or the clients that match, with how to name one of them.
 * Return: -ENOENT (none) or -ENOTUNIQ (several).
 */
int broker_found_err(const struct broker_found *f, const char *selector, bool groups, char *err);

/**
 * broker_tag_check() - whether @tag names one of @c's tags ("" names every
 * tag, and is always fine, also for a client without tags). A tag exists
 * from its first allocation or mode on, with or without allocations.
 * Return: 0, or -ENOENT with @err naming the client, the tag and the tags
 * it has.
 */
int broker_tag_check(const struct bclient *c, const char *tag, char *err);

/* @c's tag @name; NULL if none. It stays @c's. */
struct btag *broker_tag_find(const struct bclient *c, const char *name);
/* How many allocations @c has (active or paused). */
size_t broker_client_nallocs(const struct bclient *c);
/* @c's allocation @id; NULL if none. It stays @c's. */
struct balloc *broker_alloc_get(const struct bclient *c, uint64_t id);
/* The chunk alive of id @id on any device; NULL if none. It stays the pool's. */
struct chunk *broker_chunk_get(const struct broker *br, uint64_t id);

/**
 * broker_export_fds() - new fds for @n chunk ids, owned by the caller
 * (close them after sending). On failure none are left open.
 * Return: 0, -ENOENT for an unknown chunk, or the backend's error.
 */
int broker_export_fds(struct broker *br, const uint64_t *ids, size_t n, int *fds);

/* Chunks lent to the active allocations of every client of @uid. */
uint64_t broker_uid_chunks(const struct broker *br, uid_t uid);
/* @uid's bound of lent chunks (--max-chunks-per-uid, or its share of
 * chunk_share now); 0: none. */
uint64_t broker_uid_bound(const struct broker *br, uid_t uid);
/* fds gmbd holds for its chunks (the backend's chunk_fds each). */
uint64_t broker_chunk_fds(const struct broker *br);
/* How many new chunks gmbd's open files leave room for; UINT64_MAX: no bound. */
uint64_t broker_fds_chunk_room(const struct broker *br);

/* Bytes and chunks lent to @c's active allocations in @tag ("": all). */
void broker_client_usage(const struct bclient *c, const char *tag, uint64_t *bytes,
			 uint64_t *chunks);
/* What a pause of @c's @tag ("": all) pauses: every allocation of its
 * active tags, those given back ahead of it (lend_give_back()) included. */
void broker_client_pausing(const struct bclient *c, const char *tag, uint64_t *bytes,
			   uint64_t *chunks);

/* @tag's mode (GMB_MODE_*), the tag made if @c has none. -EINVAL (a mode
 * or name out of range), -ENOSPC (the tag limit), -ENOMEM; @err says why. */
int broker_set_mode(struct broker *br, struct bclient *c, const char *tag, int mode, char *err);
/* Every free chunk of @dev (-1: all) back: *@released now, *@pending (every
 * byte still waiting for drops on those devices) once holders ack. */
int broker_trim(struct broker *br, int dev, uint64_t *released, uint64_t *pending, char *err);
/* The client dropped these handles (ack of a DropRequest). */
void broker_dropped(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n);
/* May @actor pause/resume @target (or trim when @target is NULL)? */
int broker_may_control(const struct broker *br, const struct bclient *actor,
		       const struct bclient *target, char *err);

typedef void (*broker_drop_cb)(void *arg, struct bclient *c, const uint64_t *ids, size_t n);
/* Queues a drop for every holder of a releasing chunk not yet asked (and
 * marks it drop_sent), then hands each client's ids to @cb once. @ids is
 * the broker's, valid during the call; @cb may remove @c, no other client. */
void broker_flush_drops(struct broker *br, broker_drop_cb cb, void *arg);

void broker_result_deinit(struct broker_result *r);

/*
 * Restart without loss: the restored clients' side of daemon/core/rejoin.c
 * (rejoin.h) that lives here, with the clients.
 */
/* A client with its old @id, as an orphan; @name copied. */
int broker_restore_client(struct broker *br, const struct broker_peer *peer, uint64_t id,
			  const char *name, bool control, struct bclient **out);
/* @c's gid and supplementary groups become @peer's (a rejoin's new session). -ENOMEM. */
int broker_client_set_creds(struct bclient *c, const struct broker_peer *peer);
/* Clients restored and not back yet. */
uint32_t broker_orphans(const struct broker *br);

#endif
