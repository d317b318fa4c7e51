/*
 * lend.c - gmbd's core, part two: allocations and their lends (alloc, free,
 * pause, resume). Clients, tags and drops live in daemon/core/broker.c.
 *
 * A lend of an allocation is pool_take() + pool_lend() of each chunk +
 * pool_hold() by the client, with the chunks it held no handle to added to
 * the result's send list (their fds go out before the reply). It replaces
 * the allocation's last lend only once every step of the request succeeded:
 * until then the old list and its holds stay, so that any failure rolls
 * back to exactly the state before the call (only idle chunks that nobody
 * could see may have gone back to the backend, and -EAGAIN's marks stay).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/size.h"
#include "daemon/core/broker_internal.h"
#include "daemon/core/import.h"

/* One allocation's progress through a request, for commit or rollback. */
struct lend_step {
	struct balloc *a;
	struct pool_take t;    /* the new chunks (none when exact) */
	uint32_t nheld;	       /* of t.chunks, how many pool_hold()s were made */
	bool exact;	       /* its last lend, taken back as it is */
	bool done;	       /* t holds an acquired lend */
	uint64_t handed_bytes; /* of t.chunks, those a switch reserved for it */
	uint32_t handed_chunks;
};

/* ---- messages ---- */

/* "lent: trainer (pid 41, uid 1000) 6.0 GiB, ...; free in pool 0.5 GiB" */
static void lend_msg_holders(const struct broker *br, int dev, char *err)
{
	const struct pool *p = &br->pools[dev];
	const char *sep = "; lent: ";
	char b[SIZE_STR_MAX];

	for (const struct bclient *c = br->clients; c; c = c->next) {
		uint64_t n = broker__active_bytes(c, dev);

		if (n == 0)
			continue;
		err_append(err, "%s%s (pid %d, uid %u) %s", sep, c->name, (int)c->pid,
			   (unsigned)c->uid, size_str(n, b));
		sep = ", ";
	}
	err_append(err, "; free in pool %s", size_str(p->free_bytes, b));
	if (p->pending_bytes)
		err_append(err, "; %s waiting for clients to drop handles",
			   size_str(p->pending_bytes, b));
}

/* Bytes of @dev's free and releasing chunks that @c holds handles to. */
static uint64_t lend_held_bytes(const struct pool *p, const struct bclient *c)
{
	const struct chunk *lists[2] = { p->free_head, p->pending_head };
	uint64_t n = 0;

	for (int l = 0; l < 2; l++)
		for (const struct chunk *ch = lists[l]; ch; ch = ch->next)
			for (uint32_t i = 0; i < ch->nholders; i++)
				if (ch->holders[i].client == c)
					n += ch->size;
	return n;
}

/* Memory that waits on clients without a session: not worth a wait, but worth a name. */
static void lend_msg_away(const struct broker *br, int dev, char *err)
{
	const char *sep = "; held by clients not connected (theirs until they rejoin or are"
			  " gone): ";
	char b[SIZE_STR_MAX];

	for (const struct bclient *c = br->clients; c; c = c->next) {
		uint64_t n = c->orphan ? lend_held_bytes(&br->pools[dev], c) : 0;

		if (n == 0)
			continue;
		err_append(err, "%s%s (pid %d, uid %u) %s", sep, c->name, (int)c->pid,
			   (unsigned)c->uid, size_str(n, b));
		sep = ", ";
	}
}

static void lend_take_error(const struct broker *br, int dev, int rc, const struct pool_take *t,
			    char *err)
{
	const struct pool *p = &br->pools[dev];
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];

	if (rc == -ENOMEM && t->shortfall) {
		err_append(err, "device %d: budget %s exhausted: need %s more", dev,
			   size_str(p->budget, b1), size_str(t->shortfall, b2));
		lend_msg_holders(br, dev, err);
		lend_msg_away(br, dev, err);
	} else if (rc == -ENOMEM) {
		/* The driver (or malloc) said no before the budget did. */
		err_append(err, "device %d: out of memory creating chunks", dev);
		lend_msg_holders(br, dev, err);
	} else if (rc == -EAGAIN) {
		err_append(err, "device %d: waiting for clients to drop handles to %s", dev,
			   size_str(p->pending_bytes, b1));
	} else {
		err_append(err, "device %d: creating a chunk failed: %s", dev,
			   backend_last_error());
	}
}

/* ---- bounds: chunks per uid, gmbd's open files ---- */

/*
 * What a take of @c may use: its uid's room under --max-chunks-per-uid
 * (@uid_lent: chunks the uid has lent, with those of this request's earlier
 * lends) and the new chunks gmbd's open files leave room for.
 */
static void lend_bounds(const struct broker *br, uid_t uid, uint64_t uid_lent, struct pool_take *t)
{
	uint64_t max = broker_uid_bound(br, uid), room = broker_fds_chunk_room(br);

	t->max_chunks = max ? (uid_lent < max ? max - uid_lent : 0) : UINT64_MAX;
	/* The last root_chunks are root's: two uids at their bound must not
	 * leave root's own workers nothing. */
	if (uid != 0 && room != UINT64_MAX)
		room = room > br->opts.root_chunks ? room - br->opts.root_chunks : 0;
	t->max_new = room;
	t->bounded = t->max_chunks != UINT64_MAX || t->max_new != UINT64_MAX;
}

/*
 * A take on @dev short of fds after releasing that device's idle chunks
 * (@t->fd_short more): idle chunks of the other devices hold gmbd's fds as
 * well and are only a cache. When they cover the shortage, that many go
 * back (chunks a switch reserved stay) and the caller takes again.
 */
static bool lend_release_elsewhere(struct broker *br, int dev, const struct pool_take *t)
{
	uint64_t idle = 0, need = t->fd_short;

	for (int d = 0; d < br->ndevices; d++)
		if (d != dev)
			idle += pool_idle_chunks(&br->pools[d], 0);
	if (need == 0 || idle < need)
		return false;
	for (int d = 0; d < br->ndevices && need > 0; d++)
		if (d != dev)
			need -= pool_release_idle(&br->pools[d], need, 0);
	return true;
}

/* The sentence of a take past a bound: which one, what the uid holds, what to change. */
static void lend_bound_error(const struct broker *br, const struct bclient *c, int rc,
			     uint64_t uid_lent, uint64_t need, char *err)
{
	if (rc == -ENOSPC) {
		err_append(err,
			   "uid %u has %" PRIu64 " chunks lent and this needs %" PRIu64
			   " more, past its bound of %" PRIu64
			   " (--max-chunks-per-uid%s): free or pause memory, use larger chunks"
			   " (--max-chunk), or raise the bound (0: none)",
			   (unsigned)c->uid, uid_lent, need, broker_uid_bound(br, c->uid),
			   br->opts.max_chunks_per_uid ? "" : " auto, a share of the uids present");
		return;
	}
	err_append(err,
		   "gmbd is short of open files: %" PRIu64 " chunk fds, %" PRIu64
		   " connections and %" PRIu64
		   " others open and %d kept free, of its limit of %" PRIu64
		   " (RLIMIT_NOFILE), and this needs %" PRIu64 " new chunk%s; uid %u has %" PRIu64
		   " chunks lent: raise gmbd's LimitNOFILE, use larger chunks (--max-chunk),"
		   " or free memory",
		   broker_chunk_fds(br), br->fds_conns, br->fds_base,
		   BROKER_FD_SPARE + BROKER_FD_CONN_ROOM, br->opts.fd_limit, need,
		   need == 1 ? "" : "s", (unsigned)c->uid, uid_lent);
}

/*
 * A uid may hold more chunks than the bound allows when gmbd restored them
 * under a lower --max-chunks-per-uid: they stay (its clients map them) and
 * count, so its new requests get ENOSPC until it is under. Said once a uid.
 */
void lend_warn_uid_bounds(const struct broker *br)
{
	uint64_t max, n;
	bool seen;

	for (const struct bclient *c = br->clients; c; c = c->next) {
		max = broker_uid_bound(br, c->uid);
		if (!max)
			continue;
		seen = false;
		for (const struct bclient *o = br->clients; o != c && !seen; o = o->next)
			seen = o->uid == c->uid;
		n = seen ? 0 : broker_uid_chunks(br, c->uid);
		if (n > max)
			log_warn("a uid holds more chunks than its bound: all are kept, its"
				 " requests for more are refused until it is under"
				 " uid=%u chunks=%" PRIu64 " max_chunks_per_uid=%" PRIu64,
				 (unsigned)c->uid, n, max);
	}
}

/* ---- one lend ---- */

static int lend_send_push(struct broker_result *res, struct chunk *ch)
{
	size_t n = res->nsend;

	/* Capacity is implied: 8, then each power of two. */
	if (n == 0 || (n >= 8 && (n & (n - 1)) == 0)) {
		struct chunk **v = realloc(res->send, (n ? n * 2 : 8) * sizeof(*v));

		if (!v)
			return -ENOMEM;
		res->send = v;
	}
	res->send[res->nsend++] = ch;
	return 0;
}

/* Undoes lend_acquire(): holds removed, chunks back to the pool. */
/* A failed take's shortage, kept through broker_result_deinit(). */
static void lend_result_fail(struct broker_result *res)
{
	int dev = res->short_dev;
	uint64_t bytes = res->short_bytes;

	broker_result_deinit(res);
	res->short_dev = dev;
	res->short_bytes = bytes;
}

static void lend_unacquire(struct broker *br, struct bclient *c, struct lend_step *s)
{
	struct pool *p = &br->pools[s->a->dev];

	for (uint32_t i = 0; i < s->nheld; i++)
		pool_unhold(p, s->t.chunks[i], c, false);
	s->nheld = 0;
	pool_untake(p, &s->t);
	s->done = false;
}

/* New chunks for @s->a, lent and held; a->chunks is left alone. @uid_lent:
 * chunks @c's uid has lent, this request's earlier lends included. */
static int lend_acquire(struct broker *br, struct bclient *c, struct lend_step *s,
			uint64_t uid_lent, struct broker_result *res, char *err)
{
	struct pool *p = &br->pools[s->a->dev];
	int rc;

	s->t = (struct pool_take){
		.size = s->a->size, .uid = c->uid, .prefer = c, .handover = arb__handover_id(c)
	};
	lend_bounds(br, c->uid, uid_lent, &s->t);
	rc = pool_take(p, &s->t);
	if (rc == -EMFILE && s->t.over_bound && lend_release_elsewhere(br, s->a->dev, &s->t)) {
		lend_bounds(br, c->uid, uid_lent, &s->t);
		rc = pool_take(p, &s->t);
	}
	if ((rc == -ENOSPC || rc == -EMFILE) && s->t.over_bound) {
		lend_bound_error(br, c, rc, uid_lent,
				 rc == -ENOSPC ? s->t.need_chunks : s->t.need_new, err);
		return rc;
	}
	if (rc < 0) {
		lend_take_error(br, s->a->dev, rc, &s->t, err);
		if (rc == -EAGAIN || (rc == -ENOMEM && s->t.shortfall)) {
			res->short_dev = s->a->dev;
			res->short_bytes = s->t.shortfall;
		}
		return rc;
	}
	s->done = true;
	s->handed_bytes = s->handed_chunks = 0;
	for (uint32_t i = 0; i < s->t.nchunks; i++) {
		if (s->t.handover && s->t.chunks[i]->handover == s->t.handover) {
			s->handed_bytes += s->t.chunks[i]->size;
			s->handed_chunks++;
		}
		pool_lend(p, s->t.chunks[i], s->a);
	}
	for (uint32_t i = 0; i < s->t.nchunks; i++) {
		struct chunk *ch = s->t.chunks[i];

		if (!pool_is_held_by(ch, c) && (rc = lend_send_push(res, ch)) < 0)
			goto err_unacquire;
		if ((rc = pool_hold(p, ch, c)) < 0)
			goto err_unacquire;
		s->nheld++;
	}
	return 0;

err_unacquire:
	lend_unacquire(br, c, s);
	err_append(err, "out of memory recording chunk holders");
	return rc;
}

/* ---- alloc and free ---- */

static int lend_check_alloc(const struct broker *br, const struct bclient *c, int dev,
			    uint64_t size, char *err)
{
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];

	if (dev < 0 || dev >= br->ndevices)
		return err_fmt(err, -ENODEV, "device %d does not exist (%d device%s)", dev,
			       br->ndevices, br->ndevices == 1 ? "" : "s");
	if (size == 0)
		return err_fmt(err, -EINVAL, "allocation size must be positive");
	if (size > br->pools[dev].budget)
		return err_fmt(err, -ENOMEM, "allocation of %s exceeds device %d's budget of %s",
			       size_str(size, b1), dev, size_str(br->pools[dev].budget, b2));
	if (c->allocs.count >= BROKER_MAX_ALLOCS)
		return err_fmt(err, -ENOSPC, "client '%s' already has %d allocations, the limit",
			       c->name, BROKER_MAX_ALLOCS);
	return 0;
}

int lend_alloc(struct broker *br, struct bclient *c, int dev, uint64_t size, const char *tag,
	       struct broker_result *res, char *err)
{
	struct lend_step s = { 0 };
	struct btag *t;
	bool created;
	char b[SIZE_STR_MAX];
	int rc;

	*res = (struct broker_result)BROKER_RESULT_INIT;
	rc = lend_check_alloc(br, c, dev, size, err);
	if (rc < 0)
		return rc;
	rc = broker__tag_get(c, tag, &t, &created, err);
	if (rc < 0)
		return rc;
	if (t->paused) {
		rc = err_fmt(err, -EBUSY, "tag '%s' is paused: resume it before allocating in it",
			     t->name);
		goto err_tag;
	}
	s.a = calloc(1, sizeof(*s.a));
	res->allocs = malloc(sizeof(*res->allocs));
	if (!s.a || !res->allocs) {
		rc = err_fmt(err, -ENOMEM, "out of memory recording an allocation");
		goto err_mem;
	}
	*s.a = (struct balloc){ .id = br->next_alloc_id++,
				.dev = dev,
				.tag = t,
				.size = backend_round_up(size, br->pools[dev].granularity) };
	err_fmt(err, 0, "cannot allocate %s in tag '%s': ", size_str(s.a->size, b), t->name);
	rc = lend_acquire(br, c, &s, broker_uid_chunks(br, c->uid), res, err);
	if (rc < 0)
		goto err_mem;
	rc = idmap_put(&c->allocs, s.a->id, s.a);
	if (rc < 0) {
		err_append(err, "out of memory recording it");
		goto err_acquire;
	}
	s.a->chunks = s.t.chunks;
	s.a->nchunks = s.t.nchunks;
	broker__tag_link(t, s.a);
	broker__alloc_activate(s.a, true);
	arb__handover_took(&br->pools[dev], c, &s.t, s.handed_bytes, s.handed_chunks);
	res->allocs[0] = s.a;
	res->nallocs = 1;
	if (err)
		err[0] = '\0';
	log_debug("alloc client=%s id=%llu tag=%s dev=%d size=%llu chunks=%u new=%u send=%zu",
		  c->name, (unsigned long long)s.a->id, t->name, dev, (unsigned long long)s.a->size,
		  s.t.nchunks, s.t.ncreated, res->nsend);
	return 0;

err_acquire:
	lend_unacquire(br, c, &s);
err_mem:
	free(s.a);
	lend_result_fail(res);
err_tag:
	if (created)
		broker__tag_remove(c, t);
	return rc;
}

int lend_free(struct broker *br, struct bclient *c, uint64_t alloc_id, char *err)
{
	struct balloc *a = idmap_get(&c->allocs, alloc_id);
	int dev;

	if (!a)
		return err_fmt(err, -ENOENT, "allocation %llu does not exist",
			       (unsigned long long)alloc_id);
	dev = a->dev;
	log_debug("free client=%s id=%llu dev=%d size=%llu", c->name, (unsigned long long)alloc_id,
		  dev, (unsigned long long)a->size);
	broker__alloc_destroy(br, c, a);
	pool_shrink(&br->pools[dev], br->opts.pool_keep, NULL);
	return 0;
}

/* ---- pause ---- */

/*
 * Bit d of @touched: device d got chunks back, so its keep limit is checked.
 * @released: the client lets go of the handles of the last lends, so it no
 * longer holds them; the entries become NULL (as dropped ones), which both
 * sides' re-announcement and resume already know. In a switch that hands
 * over (@handover), the chunks wait for TO instead of going back.
 */
static void lend_pause_alloc(struct broker *br, struct balloc *a, bool released, uint64_t handover,
			     uint64_t *touched)
{
	if (!a->active)
		return;
	/* Unless released, the holds stay: the client keeps the handles for a cheap resume. */
	for (uint32_t i = 0; i < a->nchunks; i++) {
		struct chunk *ch = a->chunks[i];

		if (!ch)
			continue;
		pool_put(&br->pools[a->dev], ch);
		if (handover && ch->free)
			ch->handover = handover;
		if (released) {
			pool_unhold(&br->pools[a->dev], ch, a->tag->client, false);
			a->chunks[i] = NULL;
		}
	}
	broker__alloc_activate(a, false);
	*touched |= 1ULL << a->dev;
}

static void lend_pause_tag(struct broker *br, struct btag *t, bool released, uint64_t handover,
			   uint64_t *touched)
{
	if (t->paused)
		return;
	for (struct balloc *a = t->allocs; a; a = a->next)
		lend_pause_alloc(br, a, released, handover, touched);
	t->paused = true;
}

static void lend_shrink(struct broker *br, uint64_t touched)
{
	for (int d = 0; d < br->ndevices; d++)
		if (touched & (1ULL << d))
			pool_shrink(&br->pools[d], br->opts.pool_keep, NULL);
}

int lend_pause(struct broker *br, struct bclient *c, const char *tag, bool released, char *err)
{
	uint64_t touched = 0, handover = 0;
	struct btag *t;
	int rc;

	/* Another process maps memory of it: its chunks cannot go back. */
	rc = import_pause_check(br, c, tag, err);
	if (rc < 0)
		return rc;
	if (arb__handover_keeps(c))
		handover = arb__handover_id(c);
	if (tag && *tag) {
		t = broker_tag_find(c, tag);
		if (!t)
			return err_fmt(err, -ENOENT, "client '%s' has no tag '%s'", c->name, tag);
		lend_pause_tag(br, t, released, handover, &touched);
	} else {
		for (t = c->tags; t; t = t->next)
			lend_pause_tag(br, t, released, handover, &touched);
	}
	lend_shrink(br, touched);
	log_debug("pause client=%s tag=%s", c->name, tag && *tag ? tag : "*");
	return 0;
}

int lend_give_back(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n,
		   bool released, char *err)
{
	uint64_t touched = 0, handover = 0;
	const struct btag *checked = NULL;
	int rc;

	/* All checked first: a refusal gives nothing back. */
	for (size_t i = 0; i < n; i++) {
		struct balloc *a = idmap_get(&c->allocs, ids[i]);

		if (!a)
			return err_fmt(err, -ENOENT, "allocation %" PRIu64 " does not exist",
				       ids[i]);
		if (!a->active || a->tag == checked)
			continue;
		/* Another process maps memory of its tag: its chunks cannot go back. */
		rc = import_pause_check(br, c, a->tag->name, err);
		if (rc < 0)
			return rc;
		checked = a->tag;
	}
	if (arb__handover_keeps(c))
		handover = arb__handover_id(c);
	for (size_t i = 0; i < n; i++)
		lend_pause_alloc(br, idmap_get(&c->allocs, ids[i]), released, handover, &touched);
	lend_shrink(br, touched);
	log_debug("give back client=%s allocs=%zu", c->name, n);
	return 0;
}

/* Does @t have an allocation lent to now? */
static bool lend_tag_active(const struct btag *t)
{
	for (const struct balloc *a = t->allocs; a; a = a->next)
		if (a->active)
			return true;
	return false;
}

/* The tags resume @seq of @c made active that lend nothing now: paused again. */
static void lend_unresume_tags(struct bclient *c, uint64_t seq)
{
	for (struct btag *t = c->tags; seq && t; t = t->next)
		if (!t->paused && t->resumed_by == seq && !lend_tag_active(t))
			t->paused = true;
}

void lend_undo(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n, bool given)
{
	uint64_t touched = 0, seq = 0;

	for (size_t i = 0; i < n; i++) {
		struct balloc *a = idmap_get(&c->allocs, ids[i]);

		if (!a || !a->active)
			continue;
		if (!a->tag->paused)
			seq = a->tag->resumed_by;
		for (uint32_t j = 0; j < a->nchunks; j++) {
			if (!a->chunks[j])
				continue;
			pool_put(&br->pools[a->dev], a->chunks[j]);
			pool_unhold(&br->pools[a->dev], a->chunks[j], c, false);
			a->chunks[j] = NULL;
		}
		broker__alloc_activate(a, false);
		/* Given back again, its tag stays active (lend_resume_given()). */
		if (!given)
			a->tag->paused = true;
		touched |= 1ULL << a->dev;
	}
	if (!given)
		lend_unresume_tags(c, seq);
	lend_shrink(br, touched);
	log_debug("unlend client=%s allocs=%zu", c->name, n);
}

/* ---- resume ---- */

/* Paused allocations of @only (or of every tag) into @steps; their count. */
static size_t lend_collect(struct bclient *c, struct btag *only, struct lend_step *steps)
{
	size_t n = 0;

	for (struct btag *t = only ? only : c->tags; t; t = only ? NULL : t->next) {
		if (!t->paused)
			continue;
		for (struct balloc *a = t->allocs; a; a = a->next) {
			if (steps)
				steps[n] = (struct lend_step){ .a = a };
			n++;
		}
	}
	return n;
}

/* Its last lend back as it is, when every chunk still sits free in the pool
 * (and no other switch reserved it). */
static bool lend_try_exact(struct broker *br, const struct bclient *c, struct lend_step *s)
{
	struct pool *p = &br->pools[s->a->dev];
	uint64_t handover = arb__handover_id(c);

	for (uint32_t i = 0; i < s->a->nchunks; i++) {
		const struct chunk *ch = s->a->chunks[i];

		if (!ch || !ch->free || (ch->handover && ch->handover != handover))
			return false;
	}
	for (uint32_t i = 0; i < s->a->nchunks; i++)
		pool_lend(p, s->a->chunks[i], s->a);
	s->exact = true;
	return true;
}

static void lend_rollback(struct broker *br, struct bclient *c, struct lend_step *steps, size_t n)
{
	for (size_t i = n; i-- > 0;) {
		struct lend_step *s = &steps[i];

		if (s->exact) {
			for (uint32_t j = 0; j < s->a->nchunks; j++)
				pool_put(&br->pools[s->a->dev], s->a->chunks[j]);
			s->exact = false;
		} else if (s->done) {
			lend_unacquire(br, c, s);
		}
	}
}

/* Cannot fail: new lists replace old ones, whose holds go. */
static void lend_commit(struct broker *br, struct bclient *c, struct lend_step *steps, size_t n,
			struct broker_result *res)
{
	for (size_t i = 0; i < n; i++) {
		struct balloc *a = steps[i].a;

		if (!steps[i].exact) {
			arb__handover_took(&br->pools[a->dev], c, &steps[i].t,
					   steps[i].handed_bytes, steps[i].handed_chunks);
			for (uint32_t j = 0; j < a->nchunks; j++)
				if (a->chunks[j])
					pool_unhold(&br->pools[a->dev], a->chunks[j], c, false);
			free(a->chunks);
			a->chunks = steps[i].t.chunks;
			a->nchunks = steps[i].t.nchunks;
		}
		broker__alloc_activate(a, true);
		res->allocs[res->nallocs++] = a;
	}
}

/* The lends of @steps made and committed, or none of them (@res failed). */
static int lend_resume_run(struct broker *br, struct bclient *c, struct lend_step *steps, size_t n,
			   struct broker_result *res, char *err);

static void lend_mark_resumed(struct bclient *c, struct btag *only)
{
	uint64_t seq = ++c->resumes;

	for (struct btag *t = only ? only : c->tags; t; t = only ? NULL : t->next) {
		if (t->paused)
			t->resumed_by = seq;
		t->paused = false;
	}
}

/*
 * Both passes: exact ones first, so that a take cannot grab their chunks.
 * Each lend counts against the uid's chunk bound, exact ones too (their
 * chunks were not lent while paused).
 */
static int lend_resume_steps(struct broker *br, struct bclient *c, struct lend_step *steps,
			     size_t n, struct broker_result *res, char *err)
{
	uint64_t lent = broker_uid_chunks(br, c->uid), base = lent;
	uint64_t max = broker_uid_bound(br, c->uid);
	int rc;

	for (size_t i = 0; i < n; i++)
		if (lend_try_exact(br, c, &steps[i]))
			lent += steps[i].a->nchunks;
	if (max && lent > max) {
		rc = -ENOSPC;
		lend_bound_error(br, c, rc, base, lent - base, err);
		goto err_rollback;
	}
	for (size_t i = 0; i < n; i++) {
		if (steps[i].exact)
			continue;
		rc = lend_acquire(br, c, &steps[i], lent, res, err);
		if (rc < 0)
			goto err_rollback;
		lent += steps[i].t.nchunks;
	}
	return 0;

err_rollback:
	lend_rollback(br, c, steps, n);
	return rc;
}

int lend_resume(struct broker *br, struct bclient *c, const char *tag, struct broker_result *res,
		char *err)
{
	struct lend_step *steps = NULL;
	struct btag *only = NULL;
	size_t n;
	int rc;

	*res = (struct broker_result)BROKER_RESULT_INIT;
	if (tag && *tag) {
		only = broker_tag_find(c, tag);
		if (!only)
			return err_fmt(err, -ENOENT, "client '%s' has no tag '%s'", c->name, tag);
		if (!only->paused)
			return 0;
	}
	n = lend_collect(c, only, NULL);
	if (n > 0) {
		steps = calloc(n, sizeof(*steps));
		res->allocs = malloc(n * sizeof(*res->allocs));
		if (!steps || !res->allocs) {
			rc = err_fmt(err, -ENOMEM, "out of memory resuming %zu allocations", n);
			goto err_mem;
		}
		lend_collect(c, only, steps);
		if (only)
			err_fmt(err, 0, "cannot resume tag '%s' of '%s': ", only->name, c->name);
		else
			err_fmt(err, 0, "cannot resume the tags of '%s': ", c->name);
		rc = lend_resume_run(br, c, steps, n, res, err);
		if (rc < 0)
			goto err_steps;
	}
	lend_mark_resumed(c, only);
	log_debug("resume client=%s tag=%s allocs=%zu send=%zu", c->name, only ? only->name : "*",
		  n, res->nsend);
	free(steps);
	return 0;

err_mem:
	lend_result_fail(res);
err_steps:
	free(steps);
	return rc;
}

static int lend_resume_run(struct broker *br, struct bclient *c, struct lend_step *steps, size_t n,
			   struct broker_result *res, char *err)
{
	int rc = lend_resume_steps(br, c, steps, n, res, err);

	if (rc < 0) {
		lend_result_fail(res);
		return rc;
	}
	lend_commit(br, c, steps, n, res);
	if (err)
		err[0] = '\0';
	return 0;
}

/* @ids name allocations of @c's active tags, each once; how many lend nothing. */
static int lend_given_check(struct bclient *c, const uint64_t *ids, size_t n, size_t *given,
			    char *err)
{
	uint64_t *sorted = malloc((n ? n : 1) * sizeof(*sorted));
	int rc = 0;

	*given = 0;
	if (!sorted)
		return err_fmt(err, -ENOMEM, "out of memory checking %zu allocations", n);
	memcpy(sorted, ids, n * sizeof(*ids));
	qsort(sorted, n, sizeof(*sorted), idmap_cmp_key);
	for (size_t i = 0; i < n && rc == 0; i++) {
		const struct balloc *a = idmap_get(&c->allocs, sorted[i]);

		if (i > 0 && sorted[i] == sorted[i - 1])
			rc = err_fmt(err, -EINVAL, "allocation %" PRIu64 " is named twice",
				     sorted[i]);
		else if (!a)
			rc = err_fmt(err, -ENOENT, "allocation %" PRIu64 " does not exist",
				     sorted[i]);
		else if (a->tag->paused)
			rc = err_fmt(err, -EBUSY,
				     "allocation %" PRIu64 " is of paused tag '%s': resume the tag",
				     sorted[i], a->tag->name);
		else if (!a->active)
			(*given)++;
	}
	free(sorted);
	return rc;
}

int lend_resume_given(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n,
		      struct broker_result *res, char *err)
{
	struct lend_step *steps = NULL;
	size_t k = 0, given;
	int rc;

	*res = (struct broker_result)BROKER_RESULT_INIT;
	rc = lend_given_check(c, ids, n, &given, err);
	if (rc < 0 || given == 0)
		return rc;
	steps = calloc(given, sizeof(*steps));
	res->allocs = malloc(given * sizeof(*res->allocs));
	if (!steps || !res->allocs) {
		rc = err_fmt(err, -ENOMEM, "out of memory lending to %zu allocations", given);
		goto err_mem;
	}
	for (size_t i = 0; i < n; i++) {
		struct balloc *a = idmap_get(&c->allocs, ids[i]);

		if (!a->active)
			steps[k++] = (struct lend_step){ .a = a };
	}
	err_fmt(err, 0, "cannot lend again to %zu allocations of '%s': ", given, c->name);
	rc = lend_resume_run(br, c, steps, given, res, err);
	if (rc == 0)
		log_debug("lend again client=%s allocs=%zu send=%zu", c->name, given, res->nsend);
	free(steps);
	return rc;

err_mem:
	free(steps);
	lend_result_fail(res);
	return rc;
}
