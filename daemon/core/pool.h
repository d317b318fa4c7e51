/*
 * pool.h - one device's chunks: those lent out and the free ones.
 *
 * Invariants:
 *   held_bytes = sum of every chunk alive (free, lent or releasing)
 *              = lent_bytes + free_bytes + pending_bytes
 *   held_bytes <= budget, except transiently after the budget shrinks.
 *   A chunk is on the free list (free == true, sorted largest first) iff
 *   lent_to == NULL && !releasing && it is not taken; a releasing chunk is
 *   on the pending list and counts in pending_bytes until its last holder
 *   drops it. A taken chunk (between pool_take() and pool_put()) counts in
 *   lent_bytes, lent or not yet.
 *   A chunk's uid is set when it is first taken for a lend; it is then lent
 *   only to clients of that uid. Memory goes back to the backend (which
 *   zeroes it) only once no client holds a handle to it.
 *   A holder entry has refs > 0, or drop_sent (then it stays until the
 *   client acknowledges the drop). drop_sent implies releasing.
 *   Every live chunk is in the registry (when one is given) under its id.
 *   A free chunk with handover != 0 is reserved for a switch in progress
 *   (daemon/core/arb.c): it is never released nor marked releasing, and
 *   only takes of that switch (pool_take.handover) may use it; a lend
 *   clears the mark.
 *   A pinned chunk (pins > 0: another process maps it, daemon/core/import.c)
 *   is never on the free list, never releasing and never released: put
 *   back by its allocation it stays out of the pool, counted in lent_bytes
 *   with lent_to NULL, until its last pin goes.
 * The pool owns its chunks and their backend handles.
 *
 * Drops: the pool only marks chunks releasing (pending list); the broker
 * walks the pending lists to queue DropRequests for holders whose
 * drop_sent is still false (broker_flush_drops()).
 */
#ifndef GMB_POOL_H
#define GMB_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/backend/backend.h"
#include "common/idmap.h"

struct bclient;
struct balloc;

struct chunk_holder {
	struct bclient *client;
	uint32_t refs;	/* allocations of that client whose last lend has it */
	bool drop_sent; /* a DropRequest is on its way */
};

struct chunk {
	uint64_t id;
	int dev;
	uint64_t size;
	uint64_t handle; /* backend handle, owned by the pool */
	uid_t uid;
	bool uid_set;
	struct balloc *lent_to; /* NULL: not lent */
	bool releasing;		/* release once the last holder drops */
	struct chunk_holder *holders;
	uint32_t nholders, cap_holders;
	struct chunk *prev, *next; /* free list, or pending list if releasing */
	bool free;		   /* on the free list */
	bool acked;		   /* scratch flag of broker_dropped() */
	uint64_t handover;	   /* free and reserved for this switch; 0: not */
	uint32_t pins;		   /* imports mapping it (import.c); > 0: kept out */
	/* A client of another uid than its own imported it (a grant): once back
	 * in the pool it goes to the backend, never to another allocation. */
	bool shared_out;
};

/*
 * What the pool tells its owner as chunks come and go (gmbd: the service
 * manager's fd store, daemon/persist/persist.c). created() may refuse a new chunk
 * with a negative errno (its reason in backend_fail()); the chunk then goes
 * back to the backend at once. destroyed() runs before the backend release.
 */
struct pool_hooks {
	int (*created)(void *arg, const struct chunk *c);
	void (*destroyed)(void *arg, const struct chunk *c);
	void *arg;
};

struct pool_cfg {
	uint64_t budget;		/* 0: the device's total */
	uint64_t max_chunk;		/* rounded down to the granularity */
	uint64_t keep;			/* free bytes kept warm; UINT64_MAX: all */
	struct idmap *registry;		/* optional id -> chunk map, owned by the caller */
	const struct pool_hooks *hooks; /* optional, not owned */
};

struct pool {
	struct backend *backend;
	int dev;
	uint64_t granularity, total, budget, max_chunk, keep;
	uint64_t held_bytes, lent_bytes, free_bytes;
	uint64_t *next_id;	 /* shared id counter, owned by the broker */
	struct chunk *free_head; /* largest first */
	uint32_t nchunks;
	struct chunk *pending_head; /* releasing, waiting for drops */
	uint64_t pending_bytes;
	struct idmap *registry;		/* not owned; NULL: none */
	const struct pool_hooks *hooks; /* not owned; NULL: none */
	/* A holder that cannot be asked to drop now (no live session); NULL: none. */
	bool (*holder_away)(const struct bclient *c);
	/* Since start, for status: what went to and came from the backend, and
	 * what switches lent straight from one client to the next. */
	uint64_t chunks_created, chunks_released, chunks_handed_over;
};

/* What pool_take() needs to decide and what it hands back. */
struct pool_take {
	uint64_t size; /* granularity multiple */
	uid_t uid;
	struct bclient *prefer; /* prefer chunks this client holds */
	uint64_t handover;	/* a switch's take: may use chunks it reserved */
	/* When @bounded: at most max_chunks chunks in all and max_new new ones
	 * (the broker's per-uid chunk bound and fd headroom). */
	bool bounded;
	uint64_t max_chunks, max_new;
	struct chunk **chunks; /* out: malloc'd, owned by the caller */
	uint32_t nchunks;
	uint32_t ncreated;  /* how many of them are new */
	uint64_t shortfall; /* on -ENOMEM/-EAGAIN: bytes missing */
	/* On -ENOSPC/-EMFILE: the chunks, and the new ones, it would have needed,
	 * and whether a bound said no (not the backend or a hook, which may
	 * return those errors too). */
	uint64_t need_chunks, need_new;
	bool over_bound;
	/* On -EMFILE past max_new: new chunks it lacks after the idle chunks of
	 * this pool it could release (idle chunks elsewhere may cover them). */
	uint64_t fd_short;
};

int pool_init(struct pool *p, struct backend *b, int dev, const struct pool_cfg *cfg,
	      uint64_t *next_id);
/* Releases every chunk; callers make sure no client holds any. */
void pool_deinit(struct pool *p);

/**
 * pool_adopt() - a chunk a previous gmbd made, handed over through the fd
 * store: @handle (imported by the caller, owned by the pool from now on on
 * success) becomes a free chunk with its old @id. The created() hook is not
 * called: the chunk is stored already. It may take the pool over budget
 * (a smaller --budget after a restart); nothing is created until it is
 * back under.
 * Return: 0; -EINVAL (size not a granularity multiple, id 0 or taken);
 * -ENOMEM.
 */
int pool_adopt(struct pool *p, uint64_t id, uint64_t size, uint64_t handle, struct chunk **out);

/**
 * pool_take() - pick chunks for @t->size bytes, all or nothing.
 * Free chunks of a compatible uid first (largest that fits, those held by
 * @t->prefer before idle ones before others at equal size; one that would
 * make the lend use more chunks than fresh ones is skipped unless the
 * budget cannot cover fresh ones), then new chunks of min(rest, max_chunk) while
 * the budget allows, releasing idle free chunks (no holder) that cannot
 * serve this request to make room. The chunks come back off the free list
 * but not yet lent (the caller sets lent_to via pool_lend()); the reused
 * ones come first, the ncreated new ones last. On failure nothing changed
 * but what -EAGAIN marks releasing. The bounds are checked before the
 * budget, so a take past one of them touches no chunk. @t->max_new counts
 * new chunks the caller has room for (gmbd's fds: the same number each
 * chunk), so every chunk released makes room for one: past it, idle free
 * chunks this take does not use go back first (smallest first, no more
 * than it lacks, after what the budget released), and warm ones that fit
 * are used even when they make the lend use more chunks.
 * Return: 0; -ENOSPC when it would take more than @t->max_chunks chunks,
 * -EMFILE more than @t->max_new new ones even so (t->need_chunks and
 * t->need_new say how many, t->fd_short how many idle chunks elsewhere
 * would do); -ENOMEM when the budget cannot cover it even after releasing
 * (t->shortfall says how much), or when the backend or malloc is out of
 * memory (t->shortfall == 0); -EAGAIN when it could once holders drop the
 * handles of free chunks now marked releasing (t->shortfall: bytes missing
 * now); another backend error.
 */
int pool_take(struct pool *p, struct pool_take *t);
/**
 * pool_untake() - undo a successful pool_take(), lent or not: reused chunks
 * back to the free list, new ones back to the backend. The caller has
 * removed the holds it added. Frees t->chunks.
 */
void pool_untake(struct pool *p, struct pool_take *t);
/* Lend a taken chunk, or a free one (taken off the free list here). */
void pool_lend(struct pool *p, struct chunk *c, struct balloc *a);
/* A lent or taken chunk back to the free list (or released if marked). */
void pool_put(struct pool *p, struct chunk *c);

/* Pins: another process maps the chunk. pool_pin() takes a lent chunk;
 * the last pool_unpin() of one its allocation put back (lent_to NULL)
 * puts it back now: to the free list, the keep limit applying later. */
void pool_pin(struct pool *p, struct chunk *c);
void pool_unpin(struct pool *p, struct chunk *c);

/* Holders: add/remove one reference of @client. Removing the last one of a
 * releasing chunk releases it; then the chunk is freed and 1 is returned. */
int pool_hold(struct pool *p, struct chunk *c, struct bclient *client);
int pool_unhold(struct pool *p, struct chunk *c, struct bclient *client, bool all_refs);
bool pool_is_held_by(const struct chunk *c, const struct bclient *client);
/* @client's entry of @c, NULL if none. */
struct chunk_holder *pool_holder(const struct chunk *c, const struct bclient *client);
/* Removes @client as holder of every free or releasing chunk (it is gone);
 * releasing chunks left without holders go back to the backend. */
void pool_forget(struct pool *p, struct bclient *client);

/**
 * pool_shrink() - release free chunks until free_bytes <= @keep.
 * Chunks nobody holds go back at once; held ones are marked releasing and
 * go back when their holders drop them; idle chunks go first, largest
 * first. Return: bytes released now; adds every byte of the device
 * waiting for drops (pending_bytes, older marks included) to *@pending
 * (may be NULL).
 */
uint64_t pool_shrink(struct pool *p, uint64_t keep, uint64_t *pending);

/* Free chunks nobody holds that @handover may release (each closes its fds at once). */
uint64_t pool_idle_chunks(const struct pool *p, uint64_t handover);
/* Releases up to @n of them, smallest first; how many went. */
uint64_t pool_release_idle(struct pool *p, uint64_t n, uint64_t handover);

/* Bytes a take for @uid could count on: usable free + budget headroom. */
uint64_t pool_available(const struct pool *p, uid_t uid);

#endif
