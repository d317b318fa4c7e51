/*
 * pool.c - one device's chunks: creation within the budget, the free list,
 * holders, and going back to the backend.
 *
 * Three places a chunk can be, each with its byte counter:
 *   - free list (free == true), sorted largest first: free_bytes;
 *   - taken or lent (off every list, lent_to set once lent): lent_bytes;
 *   - pending list (releasing): pending_bytes, until no client holds it.
 * held_bytes is their sum and every function below keeps it so; a chunk
 * moves between places only through pool_free_link/unlink and the pending
 * helpers. Chunks are few and large (GPU-FACTS.md: costs are per handle),
 * so linear walks of the free list are fine.
 */
#include "common/list.h"
#include "daemon/core/pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define POOL_DEFAULT_MAX_CHUNK (1ULL << 30)

/* A growable array of chunk pointers: what a take collects. */
struct pool_vec {
	struct chunk **v;
	uint32_t n, cap;
};

static int pool_vec_push(struct pool_vec *vec, struct chunk *c)
{
	if (vec->n == vec->cap) {
		uint32_t cap = vec->cap ? vec->cap * 2 : 8;
		struct chunk **v = realloc(vec->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		vec->v = v;
		vec->cap = cap;
	}
	vec->v[vec->n++] = c;
	return 0;
}

static uint64_t pool_round_down(uint64_t n, uint64_t gran)
{
	return n / gran * gran;
}

int pool_init(struct pool *p, struct backend *b, int dev, const struct pool_cfg *cfg,
	      uint64_t *next_id)
{
	const struct backend_device *d;
	uint64_t budget, max_chunk;

	if (!p || !b || !cfg || !next_id || dev < 0 || dev >= b->ndevices)
		return -EINVAL;
	d = &b->devices[dev];
	if (d->granularity == 0 || d->total_bytes < d->granularity)
		return -EINVAL;
	/* A budget past the device's memory would only turn into driver errors. */
	budget = cfg->budget && cfg->budget < d->total_bytes ? cfg->budget : d->total_bytes;
	budget = pool_round_down(budget, d->granularity);
	max_chunk = pool_round_down(cfg->max_chunk ? cfg->max_chunk : POOL_DEFAULT_MAX_CHUNK,
				    d->granularity);
	*p = (struct pool){
		.backend = b,
		.dev = dev,
		.granularity = d->granularity,
		.total = d->total_bytes,
		.budget = budget > d->granularity ? budget : d->granularity,
		.max_chunk = max_chunk > d->granularity ? max_chunk : d->granularity,
		.keep = cfg->keep,
		.next_id = next_id,
		.registry = cfg->registry,
		.hooks = cfg->hooks,
	};
	return 0;
}

/* Backend release, registry, counters, memory. The caller took @c off every list. */
static void pool_chunk_destroy(struct pool *p, struct chunk *c)
{
	int rc;

	if (p->hooks && p->hooks->destroyed)
		p->hooks->destroyed(p->hooks->arg, c);
	rc = p->backend->ops->chunk_release(p->backend, c->handle);

	/* The handle is gone for us either way; a failure can only be logged. */
	if (rc < 0)
		log_errno(LOG_LVL_ERR, rc, "chunk release failed dev=%d chunk=%llu reason=\"%s\"",
			  p->dev, (unsigned long long)c->id, backend_last_error());
	if (p->registry)
		idmap_del(p->registry, c->id);
	p->held_bytes -= c->size;
	p->nchunks--;
	p->chunks_released++;
	free(c->holders);
	free(c);
}

/* A new chunk of @size, counted as taken (lent_bytes). */
static int pool_chunk_new(struct pool *p, uint64_t size, struct chunk **out)
{
	struct chunk *c = calloc(1, sizeof(*c));
	int rc;

	if (!c)
		return -ENOMEM;
	rc = p->backend->ops->chunk_create(p->backend, p->dev, size, &c->handle);
	if (rc < 0)
		goto err_create;
	c->id = (*p->next_id)++;
	c->dev = p->dev;
	c->size = size;
	if (p->registry) {
		rc = idmap_put(p->registry, c->id, c);
		if (rc < 0)
			goto err_register;
	}
	if (p->hooks && p->hooks->created) {
		rc = p->hooks->created(p->hooks->arg, c);
		if (rc < 0)
			goto err_hook;
	}
	p->nchunks++;
	p->held_bytes += size;
	p->lent_bytes += size;
	p->chunks_created++;
	*out = c;
	return 0;

err_hook:
	if (p->registry)
		idmap_del(p->registry, c->id);
err_register:
	p->backend->ops->chunk_release(p->backend, c->handle);
err_create:
	free(c);
	return rc;
}

static void pool_free_link(struct pool *p, struct chunk *c)
{
	struct chunk **pos = &p->free_head, *prev = NULL;

	/* After equal sizes, so that the longest-free chunk of a size is used first. */
	while (*pos && (*pos)->size >= c->size) {
		prev = *pos;
		pos = &(*pos)->next;
	}
	c->prev = prev;
	c->next = *pos;
	if (*pos)
		(*pos)->prev = c;
	*pos = c;
	c->free = true;
	p->free_bytes += c->size;
}

static void pool_list_unlink(struct chunk **head, struct chunk *c)
{
	DLIST_UNLINK(*head, c);
}

static void pool_free_unlink(struct pool *p, struct chunk *c)
{
	pool_list_unlink(&p->free_head, c);
	c->free = false;
	p->free_bytes -= c->size;
}

static void pool_pending_unlink(struct pool *p, struct chunk *c)
{
	pool_list_unlink(&p->pending_head, c);
	p->pending_bytes -= c->size;
}

/* A free chunk off to the backend: now if nobody holds it, else once they drop it. */
static void pool_mark_releasing(struct pool *p, struct chunk *c)
{
	pool_free_unlink(p, c);
	c->releasing = true;
	if (c->nholders == 0) {
		pool_chunk_destroy(p, c);
		return;
	}
	c->prev = NULL;
	c->next = p->pending_head;
	if (c->next)
		c->next->prev = c;
	p->pending_head = c;
	p->pending_bytes += c->size;
}

static bool pool_uid_ok(const struct chunk *c, uid_t uid)
{
	return !c->uid_set || c->uid == uid;
}

/* A switch's reservation binds everyone but that switch's own takes. */
static bool pool_usable(const struct chunk *c, uint64_t handover)
{
	/* A chunk another uid imported is never lent again (a restored free one
	 * waits for the pool's shrink or a trim to go to the backend). */
	return !c->shared_out && (c->handover == 0 || c->handover == handover);
}

/* At equal size: a chunk the client holds (no fd to send), then an idle one
 * (nobody loses a warm handle), then one other clients hold. */
static int pool_pick_rank(const struct chunk *c, const struct bclient *prefer)
{
	if (prefer && pool_is_held_by(c, prefer))
		return 2;
	return c->nholders == 0 ? 1 : 0;
}

/* How many chunks fresh ones of at most max_chunk need for @n bytes. */
static uint64_t pool_pieces(const struct pool *p, uint64_t n)
{
	return (n + p->max_chunk - 1) / p->max_chunk;
}

/*
 * The largest compatible free chunk that fits in @rest, best ranked. When
 * @compact, a chunk that would make the lend use more chunks than fresh ones
 * is skipped: a small warm chunk saves a create but costs every later cycle
 * a mapping (GPU-FACTS.md), and small mappings slow the worker's kernels.
 */
static struct chunk *pool_pick_free(const struct pool *p, const struct pool_take *t, uint64_t rest,
				    bool compact)
{
	struct chunk *best = NULL;
	int best_rank = -1;

	for (struct chunk *c = p->free_head; c; c = c->next) {
		int rank;

		if (c->size > rest || !pool_uid_ok(c, t->uid) || !pool_usable(c, t->handover))
			continue;
		if (compact && 1 + pool_pieces(p, rest - c->size) > pool_pieces(p, rest))
			continue;
		if (best && c->size < best->size)
			break;
		rank = pool_pick_rank(c, t->prefer);
		if (rank > best_rank) {
			best = c;
			best_rank = rank;
		}
		if (rank == 2)
			break;
	}
	return best;
}

/* Step 1: free chunks into @vec; *@rest is what they do not cover. */
static int pool_take_free(struct pool *p, const struct pool_take *t, struct pool_vec *vec,
			  uint64_t *rest, bool compact)
{
	struct chunk *c;

	while (*rest > 0 && (c = pool_pick_free(p, t, *rest, compact))) {
		int rc = pool_vec_push(vec, c);

		if (rc < 0)
			return rc;
		pool_free_unlink(p, c);
		p->lent_bytes += c->size;
		*rest -= c->size;
	}
	return 0;
}

/*
 * Whether a holder of @c cannot be asked to drop it (an orphan, a client
 * still rejoining): waiting for that drop would wait for nothing, so such
 * a chunk counts as neither releasable nor pending.
 */
static bool pool_stuck(const struct pool *p, const struct chunk *c)
{
	for (uint32_t i = 0; p->holder_away && i < c->nholders; i++)
		if (p->holder_away(c->holders[i].client))
			return true;
	return false;
}

/* Free bytes @handover may release, with no holder (@idle) and with holders (@held). */
static void pool_free_split(const struct pool *p, uint64_t handover, uint64_t *idle, uint64_t *held)
{
	*idle = *held = 0;
	for (const struct chunk *c = p->free_head; c; c = c->next)
		if (pool_usable(c, handover) && !(c->nholders && pool_stuck(p, c)))
			*(c->nholders ? held : idle) += c->size;
}

/* Releasing bytes whose holders can all be asked to drop. */
static uint64_t pool_pending_live(const struct pool *p)
{
	uint64_t n = 0;

	for (const struct chunk *c = p->pending_head; c; c = c->next)
		if (!pool_stuck(p, c))
			n += c->size;
	return n;
}

/* Can @rest fresh bytes fit, releasing idle chunks if need be? */
static bool pool_room_ok(const struct pool *p, uint64_t rest, uint64_t handover)
{
	uint64_t room = p->budget > p->held_bytes ? p->budget - p->held_bytes : 0;
	uint64_t idle, held;

	if (rest <= room)
		return true;
	pool_free_split(p, handover, &idle, &held);
	return rest <= room + idle;
}

/* Releases (idle) or marks (held) free chunks, largest first, until @need
 * is met; chunks reserved for a switch other than @handover stay. */
static void pool_free_some(struct pool *p, uint64_t need, bool held, uint64_t handover)
{
	struct chunk *c, *next;
	uint64_t done = 0;

	for (c = p->free_head; c && done < need; c = next) {
		next = c->next;
		if ((c->nholders > 0) != held || !pool_usable(c, handover) ||
		    (held && pool_stuck(p, c)))
			continue;
		done += c->size;
		pool_mark_releasing(p, c);
	}
}

/*
 * Budget room for @rest new bytes: release idle free chunks if they suffice;
 * else mark held ones releasing if they (with chunks already pending) would
 * suffice and ask the caller to come back (-EAGAIN); else -ENOMEM, and
 * nothing is touched so that a refused request costs nobody a warm chunk.
 */
static int pool_make_room(struct pool *p, uint64_t rest, struct pool_take *t)
{
	uint64_t room = p->budget > p->held_bytes ? p->budget - p->held_bytes : 0;
	uint64_t shortage, idle, held, pending;

	if (rest <= room)
		return 0;
	shortage = rest - room;
	pool_free_split(p, t->handover, &idle, &held);
	if (idle >= shortage) {
		pool_free_some(p, shortage, false, t->handover);
		return 0;
	}
	pending = pool_pending_live(p);
	if (idle + pending + held >= shortage) {
		if (idle + pending < shortage)
			pool_free_some(p, shortage - idle - pending, true, t->handover);
		t->shortfall = shortage;
		return -EAGAIN;
	}
	t->shortfall = shortage - idle - pending - held;
	return -ENOMEM;
}

/* Step 2: @rest bytes of new chunks of at most max_chunk. On failure the new
 * ones are gone again and @vec is as it was. */
static int pool_take_new(struct pool *p, uint64_t rest, struct pool_vec *vec, uint32_t *ncreated)
{
	uint32_t base = vec->n;
	struct chunk *c;
	int rc;

	while (rest > 0) {
		uint64_t size = rest < p->max_chunk ? rest : p->max_chunk;

		rc = pool_chunk_new(p, size, &c);
		if (rc < 0)
			goto err_undo;
		rc = pool_vec_push(vec, c);
		if (rc < 0) {
			p->lent_bytes -= c->size;
			pool_chunk_destroy(p, c);
			goto err_undo;
		}
		rest -= size;
	}
	*ncreated = vec->n - base;
	return 0;

err_undo:
	while (vec->n > base) {
		c = vec->v[--vec->n];
		p->lent_bytes -= c->size;
		pool_chunk_destroy(p, c);
	}
	return rc;
}

uint64_t pool_idle_chunks(const struct pool *p, uint64_t handover)
{
	uint64_t n = 0;

	for (const struct chunk *c = p->free_head; c; c = c->next)
		n += c->nholders == 0 && pool_usable(c, handover);
	return n;
}

uint64_t pool_release_idle(struct pool *p, uint64_t n, uint64_t handover)
{
	struct chunk *c = p->free_head, *prev;
	uint64_t done = 0;

	while (c && c->next)
		c = c->next;
	/* Smallest first: each one frees as many fds, the large ones keep more memory warm. */
	for (; c && done < n; c = prev) {
		prev = c->prev;
		if (c->nholders || !pool_usable(c, handover))
			continue;
		pool_mark_releasing(p, c);
		done++;
	}
	return done;
}

/* Would @rest fresh bytes need more new chunks than @t->max_new, even with
 * every idle free chunk of the pool released? */
static bool pool_fds_short(const struct pool *p, const struct pool_take *t, uint64_t rest)
{
	uint64_t need = pool_pieces(p, rest);

	return t->bounded && need > t->max_new &&
	       need - t->max_new > pool_idle_chunks(p, t->handover);
}

/*
 * The bounds of @t for a take that has @n free chunks and needs @rest more
 * bytes. Past max_new, idle free chunks can make up the difference (their
 * fds close as they go back): *@release says how many must go, nothing is
 * released yet. Else -EMFILE, with t->fd_short the new chunks still missing.
 */
static int pool_check_bounds(const struct pool *p, struct pool_take *t, uint32_t n, uint64_t rest,
			     uint64_t *release)
{
	uint64_t idle, over;

	*release = 0;
	t->need_new = rest ? pool_pieces(p, rest) : 0;
	t->need_chunks = n + t->need_new;
	if (!t->bounded)
		return 0;
	if (t->need_chunks > t->max_chunks) {
		t->over_bound = true;
		return -ENOSPC;
	}
	if (t->need_new <= t->max_new)
		return 0;
	over = t->need_new - t->max_new;
	idle = pool_idle_chunks(p, t->handover);
	if (idle >= over) {
		*release = over;
		return 0;
	}
	t->over_bound = true;
	t->fd_short = over - idle;
	return -EMFILE;
}

/* Step 1 (both passes) and the bounds: what the take may reuse and create. */
static int pool_take_plan(struct pool *p, struct pool_take *t, struct pool_vec *vec, uint64_t *rest,
			  uint64_t *release)
{
	int rc = pool_take_free(p, t, vec, rest, true);

	/* Fresh chunks do not fit (budget or fds): every warm chunk that fits is worth it now. */
	if (rc == 0 && *rest > 0 &&
	    (!pool_room_ok(p, *rest, t->handover) || pool_fds_short(p, t, *rest)))
		rc = pool_take_free(p, t, vec, rest, false);
	if (rc == 0)
		rc = pool_check_bounds(p, t, vec->n, *rest, release);
	return rc;
}

int pool_take(struct pool *p, struct pool_take *t)
{
	struct pool_vec vec = { 0 };
	uint64_t rest, release = 0, released;
	int rc;

	t->chunks = NULL;
	t->nchunks = t->ncreated = 0;
	t->shortfall = t->need_chunks = t->need_new = t->fd_short = 0;
	t->over_bound = false;
	if (t->size == 0 || t->size % p->granularity)
		return -EINVAL;
	rest = t->size;
	rc = pool_take_plan(p, t, &vec, &rest, &release);
	if (rc < 0)
		goto err_put;
	if (rest > 0) {
		released = p->chunks_released;
		rc = pool_make_room(p, rest, t);
		if (rc < 0)
			goto err_put;
		/* What the budget sent back closed fds too; the rest only for fds. */
		released = p->chunks_released - released;
		if (release > released)
			pool_release_idle(p, release - released, t->handover);
		rc = pool_take_new(p, rest, &vec, &t->ncreated);
		if (rc < 0)
			goto err_put;
	}
	for (uint32_t i = 0; i < vec.n; i++) {
		vec.v[i]->uid = t->uid;
		vec.v[i]->uid_set = true;
	}
	t->chunks = vec.v;
	t->nchunks = vec.n;
	return 0;

err_put:
	for (uint32_t i = 0; i < vec.n; i++)
		pool_put(p, vec.v[i]);
	free(vec.v);
	return rc;
}

void pool_untake(struct pool *p, struct pool_take *t)
{
	uint32_t reused = t->nchunks - t->ncreated;

	for (uint32_t i = 0; i < t->nchunks; i++) {
		struct chunk *c = t->chunks[i];

		if (i < reused) {
			pool_put(p, c);
			continue;
		}
		/* Nobody saw it but the caller, who removed its holds. */
		p->lent_bytes -= c->size;
		pool_chunk_destroy(p, c);
	}
	free(t->chunks);
	t->chunks = NULL;
	t->nchunks = t->ncreated = 0;
}

void pool_lend(struct pool *p, struct chunk *c, struct balloc *a)
{
	if (c->free) {
		pool_free_unlink(p, c);
		p->lent_bytes += c->size;
	}
	c->lent_to = a;
	c->handover = 0;
}

void pool_put(struct pool *p, struct chunk *c)
{
	if (c->free)
		return;
	c->lent_to = NULL;
	/* Mapped by an importer: out of the pool until its last unpin. */
	if (c->pins)
		return;
	p->lent_bytes -= c->size;
	/* Another uid mapped it and may still hold a handle of it: zeroed by
	 * the driver before anyone else of its uid gets its bytes. */
	if (c->shared_out && !c->releasing) {
		pool_free_link(p, c);
		pool_mark_releasing(p, c);
		return;
	}
	if (!c->releasing) {
		pool_free_link(p, c);
		return;
	}
	/* Not reached today (releasing chunks are never lent); kept safe anyway. */
	c->releasing = false;
	pool_free_link(p, c);
	pool_mark_releasing(p, c);
}

void pool_pin(struct pool *p, struct chunk *c)
{
	(void)p;
	c->pins++;
}

void pool_unpin(struct pool *p, struct chunk *c)
{
	if (c->pins == 0 || --c->pins > 0 || c->lent_to)
		return;
	/* Its allocation put it back while it was pinned: pool_put() now. */
	pool_put(p, c);
}

struct chunk_holder *pool_holder(const struct chunk *c, const struct bclient *client)
{
	for (uint32_t i = 0; i < c->nholders; i++)
		if (c->holders[i].client == client)
			return &c->holders[i];
	return NULL;
}

bool pool_is_held_by(const struct chunk *c, const struct bclient *client)
{
	return pool_holder(c, client) != NULL;
}

int pool_hold(struct pool *p, struct chunk *c, struct bclient *client)
{
	struct chunk_holder *h = pool_holder(c, client);

	if (h) {
		h->refs++;
		return 0;
	}
	if (c->nholders == c->cap_holders) {
		uint32_t cap = c->cap_holders ? c->cap_holders * 2 : 2;
		struct chunk_holder *v = realloc(c->holders, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		c->holders = v;
		c->cap_holders = cap;
	}
	c->holders[c->nholders++] = (struct chunk_holder){ .client = client, .refs = 1 };
	return 0;
}

int pool_unhold(struct pool *p, struct chunk *c, struct bclient *client, bool all_refs)
{
	struct chunk_holder *h = pool_holder(c, client);

	if (!h)
		return 0;
	if (h->refs > 0)
		h->refs--;
	if (all_refs)
		h->refs = 0;
	/* A drop on its way keeps the entry: the client may still have the handle open. */
	if (h->refs > 0 || (h->drop_sent && !all_refs))
		return 0;
	*h = c->holders[--c->nholders];
	if (!c->releasing || c->nholders > 0)
		return 0;
	pool_pending_unlink(p, c);
	pool_chunk_destroy(p, c);
	return 1;
}

static void pool_forget_list(struct pool *p, struct chunk *head, struct bclient *client)
{
	struct chunk *c, *next;

	for (c = head; c; c = next) {
		next = c->next;
		pool_unhold(p, c, client, true);
	}
}

void pool_forget(struct pool *p, struct bclient *client)
{
	pool_forget_list(p, p->free_head, client);
	pool_forget_list(p, p->pending_head, client);
}

uint64_t pool_shrink(struct pool *p, uint64_t keep, uint64_t *pending)
{
	uint64_t before = p->held_bytes;

	if (p->free_bytes > keep)
		pool_free_some(p, p->free_bytes - keep, false, 0);
	if (p->free_bytes > keep)
		pool_free_some(p, p->free_bytes - keep, true, 0);
	if (pending)
		*pending += p->pending_bytes;
	return before - p->held_bytes;
}

uint64_t pool_available(const struct pool *p, uid_t uid)
{
	uint64_t n = p->budget > p->held_bytes ? p->budget - p->held_bytes : 0;

	/* Idle chunks of another uid count: they can go back to make room. */
	for (const struct chunk *c = p->free_head; c; c = c->next)
		if ((pool_uid_ok(c, uid) || c->nholders == 0) && c->handover == 0)
			n += c->size;
	return n;
}

int pool_adopt(struct pool *p, uint64_t id, uint64_t size, uint64_t handle, struct chunk **out)
{
	struct chunk *c;
	int rc;

	if (id == 0 || size == 0 || size % p->granularity ||
	    (p->registry && idmap_get(p->registry, id)))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	*c = (struct chunk){ .id = id, .dev = p->dev, .size = size, .handle = handle };
	if (p->registry) {
		rc = idmap_put(p->registry, id, c);
		if (rc < 0) {
			free(c);
			return rc;
		}
	}
	p->nchunks++;
	p->held_bytes += size;
	pool_free_link(p, c);
	*out = c;
	return 0;
}

void pool_deinit(struct pool *p)
{
	struct chunk *c;

	if (!p || !p->backend)
		return;
	while ((c = p->free_head)) {
		pool_free_unlink(p, c);
		pool_chunk_destroy(p, c);
	}
	while ((c = p->pending_head)) {
		pool_pending_unlink(p, c);
		pool_chunk_destroy(p, c);
	}
	if (p->nchunks)
		log_err("pool deinit with chunks still lent dev=%d chunks=%u bytes=%llu", p->dev,
			p->nchunks, (unsigned long long)p->lent_bytes);
	p->backend = NULL;
}
