/*
 * broker.h - gmbd's core: clients, tags, allocations and budgets over the
 * per-device pools. No socket, no loop and no protobuf type in here: the
 * handlers (daemon/handlers/) decode requests, call these functions and
 * encode what comes back, and keep their own map from client to
 * connection. Internals shared by the core's files: broker_internal.h.
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
	 * broker_unlend() pauses again every tag that resume named. */
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
	 * or a live client whose connection gmbd ended (broker_orphan()): its
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
	const struct pool_hooks *hooks; /* handed to every pool; may be NULL */
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
/* By id ("#12" or "12"), then pid, then name; NULL if none or ambiguous. */
struct bclient *broker_client_find(struct broker *br, const char *selector);

/**
 * broker_export_fds() - new fds for @n chunk ids, owned by the caller
 * (close them after sending). On failure none are left open.
 * Return: 0, -ENOENT for an unknown chunk, or the backend's error.
 */
int broker_export_fds(struct broker *br, const uint64_t *ids, size_t n, int *fds);

/* Chunks lent to the active allocations of every client of @uid. */
uint64_t broker_uid_chunks(const struct broker *br, uid_t uid);
/* Logs each uid whose clients hold more chunks than --max-chunks-per-uid
 * (restored under a lower bound: all kept, refused more until under). */
void broker_warn_uid_bounds(const struct broker *br);
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

/*
 * The operations. @err (ERR_MSG_MAX bytes, may be NULL) gets a sentence on
 * failure. alloc and resume are all or nothing and fill @res (always
 * initialized here; broker_result_deinit() it): -ENOMEM names who holds the
 * device's memory; -EAGAIN means chunks were marked releasing and the call
 * can succeed once their holders ack the drops (park it, flush the drops,
 * retry after broker_dropped()). A size over the device's budget is -ENOMEM
 * too. pause/resume take a tag or NULL/"" for every tag; pausing a paused
 * tag and resuming an active one succeed and do nothing. pause's @released:
 * the client lets go of the handles of the paused allocations' last lends
 * (HelloReply.release_on_pause), so it stops holding them and chunks nobody
 * holds go back to the backend within the call (with a keep limit of 0).
 */
int broker_alloc(struct broker *br, struct bclient *c, int dev, uint64_t size, const char *tag,
		 struct broker_result *res, char *err);
int broker_free_alloc(struct broker *br, struct bclient *c, uint64_t alloc_id, char *err);
int broker_set_mode(struct broker *br, struct bclient *c, const char *tag, int mode, char *err);
int broker_pause(struct broker *br, struct bclient *c, const char *tag, bool released, char *err);
int broker_resume(struct broker *br, struct bclient *c, const char *tag, struct broker_result *res,
		  char *err);
/**
 * broker_unlend() - the lends of @ids (allocations of @c a resume lent)
 * never reached the client: each is paused again with its last lend
 * cleared (the client clears its own: ResumeReply.lends_cleared), its
 * chunks back in the pool, and its tag paused, as is every other tag that
 * resume made active and that has no active allocation (a tag without
 * memory that a resume of every tag named): the client, which never got
 * the reply, has them all paused.
 */
void broker_unlend(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n);
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
 * Restart without loss (daemon/core/rejoin.c). A restored client is an orphan
 * until its process comes back and its claim of what it holds is checked
 * against the record; broker_rejoin() accepts all of the claim or none.
 */
struct broker_claim_tag {
	const char *name;
	int mode;
	bool paused;
};

struct broker_claim_alloc {
	uint64_t id;
	const char *tag;
	int dev;
	uint64_t size;
	bool mapped;		   /* the client maps it now */
	const uint64_t *chunk_ids; /* its last lend as the client holds it; 0 dropped */
	size_t nchunks;
};

struct broker_claim {
	const struct broker_claim_tag *tags;
	size_t ntags;
	const struct broker_claim_alloc *allocs;
	size_t nallocs;
	const uint64_t *held; /* handles the client holds */
	size_t nheld;
};

/* What both sides forget after a rejoin; malloc'd arrays owned by the caller. */
struct broker_rejoin_result {
	uint64_t *cleared; /* allocations whose last lend is cleared */
	size_t ncleared;
	uint64_t *drop; /* held chunks the client must drop */
	size_t ndrop;
};

/* A client with its old @id, as an orphan; @name copied. */
int broker_restore_client(struct broker *br, const struct broker_peer *peer, uint64_t id,
			  const char *name, bool control, struct bclient **out);
/* @c's gid and supplementary groups become @peer's (a rejoin's new session). -ENOMEM. */
int broker_client_set_creds(struct bclient *c, const struct broker_peer *peer);
/* Tag @name of restored @c, as it was; *@out stays @c's. -EINVAL, -ENOSPC,
 * -EEXIST (the record named it before). */
int broker_restore_tag(struct bclient *c, const char *name, int mode, bool paused,
		       struct btag **out);
/**
 * broker_restore_alloc() - an allocation of @t as it was: @chunks (NULL
 * entries: dropped) become its last lend, held by the client, and lent to
 * it when @active (each must then be free, named once, adding up to @size,
 * and @t not paused; else it is restored paused).
 * Return: 0, -EINVAL (id 0 or taken, bad device or size), -ENOMEM.
 */
int broker_restore_alloc(struct broker *br, struct bclient *c, struct btag *t, uint64_t id, int dev,
			 uint64_t size, bool active, struct chunk **chunks, uint32_t n);
/**
 * broker_rejoin() - orphan @c is back with @claim: check it (same
 * allocations, devices, sizes and tags; a mapped allocation over exactly its
 * recorded chunks, each lent to it or free; no chunk mapped twice) and make
 * the record agree with it: unclaimed allocations freed, mapped ones lent,
 * unmapped ones back in the pool, paused ones whose claimed last lend
 * differs cleared. Nothing changes on failure.
 * Return: 0 with @res filled; -EPERM (a claim gmbd did not grant) or
 * -EPROTO (a claim that contradicts itself) with @err saying which; -ENOMEM.
 */
int broker_rejoin(struct broker *br, struct bclient *c, const struct broker_claim *claim,
		  struct broker_rejoin_result *res, char *err);
void broker_rejoin_result_deinit(struct broker_rejoin_result *res);
/*
 * broker_orphan() - gmbd ended live @c's connection while its process may
 * still map what it was lent: @c becomes an orphan, as after a restart, so
 * that nothing it holds is lent again until it rejoins or is reclaimed.
 */
void broker_orphan(struct broker *br, struct bclient *c);
/* Clients restored and not back yet. */
uint32_t broker_orphans(const struct broker *br);
/* Orphan @c will not be back (@why, logged): its memory returns; @c is freed. */
void broker_reclaim(struct broker *br, struct bclient *c, const char *why);

/*
 * Arbitration (daemon/core/arb.c): groups, priorities, switches that hand
 * one client's chunks straight to the next, requests waiting for memory,
 * and the choice of whom to preempt for them.
 */

/* @group ("" or NULL: none) is copied, truncated to WIRE_MAX_NAME. */
void broker_client_set_arb(struct bclient *c, const char *group, int priority, bool preemptible);
/**
 * broker_select() - the clients @sel names: one client (id, pid or unique
 * name, as broker_client_find()), else every client of group @sel ("@NAME"
 * names a group only). At most @max go to @out (the broker's).
 * Return: how many (>= 1); -ENOENT, -ENOTUNIQ or -E2BIG with @err saying why.
 */
int broker_select(struct broker *br, const char *sel, struct bclient **out, size_t max, char *err);

/* What a switch lent TO: straight from FROM's chunks, and newly made. */
struct broker_handover_stats {
	uint64_t handed_bytes, handed_chunks;
	uint64_t created_bytes, created_chunks;
};

/**
 * broker_handover_begin() - a switch from @from to @to starts: the chunks
 * FROM's pauses give back are reserved for it (never released, whatever
 * the keep limit, and lent to nobody else) when some TO client has the same
 * uid; TO's and FROM's own lends may use them. Each client is in at most
 * one switch. *@out belongs to the broker until broker_handover_end().
 * Return: 0; -EBUSY (a client is in another switch) or -ENOMEM, with @err.
 */
int broker_handover_begin(struct broker *br, struct bclient *const *from, size_t nfrom,
			  struct bclient *const *to, size_t nto, struct bhandover **out, char *err);
/* The switch is over: reservations end (the keep limit applies again),
 * @st (may be NULL) gets its figures, @h is freed. */
void broker_handover_end(struct broker *br, struct bhandover *h, struct broker_handover_stats *st);

enum {
	BROKER_WAIT_ALLOC = 1,
	BROKER_WAIT_RESUME = 2
};

/* A request waiting for memory; owned by the caller, linked by the broker. */
struct bwaiter {
	struct bclient *client;
	int kind; /* BROKER_WAIT_* */
	int dev;  /* the device it is short of */
	char tag[WIRE_MAX_NAME + 1];
	uint64_t need;		  /* bytes missing at the last try */
	uint64_t since, deadline; /* the caller's millisecond clock */
	bool preempt_asked;	  /* its preemption was tried already */
	void *owner;		  /* the caller's */
	/* The broker's: */
	uint64_t seq;
	bool linked;
	struct bwaiter *prev, *next;
};

/* Enters @w (client, kind, dev, ... set) in serving order: higher priority
 * first, then first come first served. */
void broker_wait_add(struct broker *br, struct bwaiter *w);
/* Takes @w out (no-op when it is not in). */
void broker_wait_remove(struct broker *br, struct bwaiter *w);
/* Does a request of @c's priority or higher wait for @dev already? */
bool broker_wait_ahead(const struct broker *br, const struct bclient *c, int dev);
/* @c's priority; its waiting requests take their new place. */
void broker_set_priority(struct broker *br, struct bclient *c, int priority);
/**
 * broker_preempt_pick() - whom to pause so that @w can be served: clients
 * of lower priority that accept control and opted into preemption, not in
 * a switch, not asked already, holding memory on @w->dev; lowest priority,
 * then most memory, first, until their memory covers @w->need. None when
 * even all of them would not. At most @max go to @out, each marked
 * preempt_for = @w->client->id (clear it with broker_preempt_done()).
 * Return: how many.
 */
size_t broker_preempt_pick(struct broker *br, const struct bwaiter *w, struct bclient **out,
			   size_t max);
void broker_preempt_done(struct bclient *c);

#endif
