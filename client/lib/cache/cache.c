/*
 * cache.c - the client's imported chunk handles and each allocation's last
 * lend, kept to the rule of proto/gmb.proto that gmbd mirrors exactly:
 *
 *   a client holds the handle of a chunk exactly while some allocation of
 *   it has that chunk in its last lend (active or paused).
 *
 * Invariants (under the client's state lock):
 *   - refs of a cached chunk = the number of allocations whose last lend
 *     names it; a lend that replaces a list references the new ids before it
 *     drops the old ones, so a chunk kept across lends is never released.
 *   - every non-zero id in a last lend is in the cache; a DropRequest removes
 *     chunks regardless of refs and turns their ids in last lends into 0.
 *   - freshly imported chunks sit at refs 0 until the lend that brought them
 *     is applied; gmb__cache_sweep() releases whatever a failed request left.
 *
 * Nothing here calls the backend or takes a lock: handles leaving the cache
 * go onto a release list (linked through the entries, so that dropping one
 * can never fail for lack of memory) that the caller hands to
 * gmb__cache_release_run() once it dropped the lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/cache/cache.h"

static void cache_push(struct gmb__handle **rel, struct gmb__handle *e)
{
	e->next = *rel;
	*rel = e;
}

/*
 * gmb__cache_put() - add an imported handle at refs 0.
 * On success the cache owns @handle; a chunk already cached (gmbd resent it)
 * keeps its refs and its old handle moves to @rel. On -ENOMEM the caller
 * still owns @handle.
 */
int gmb__cache_put(struct gmb__cache *m, uint64_t id, uint64_t handle, uint64_t size,
		   struct gmb__handle **rel)
{
	struct gmb__handle *old = idmap_get(&m->cache, id);
	struct gmb__handle *e = calloc(1, sizeof(*e));
	int rc;

	if (!e)
		return -ENOMEM;
	*e = (struct gmb__handle){ .id = id, .handle = handle, .size = size };
	if (old)
		e->refs = old->refs;
	rc = idmap_put(&m->cache, id, e);
	if (rc < 0) {
		free(e);
		return rc;
	}
	if (old)
		cache_push(rel, old);
	return 0;
}

/* Drops one reference of chunk @id; the last one moves the handle to @rel. */
static void cache_unref(struct gmb__cache *m, uint64_t id, struct gmb__handle **rel)
{
	struct gmb__handle *e = id ? idmap_get(&m->cache, id) : NULL;

	if (!e)
		return;
	if (e->refs > 0)
		e->refs--;
	if (e->refs == 0)
		cache_push(rel, idmap_del(&m->cache, id));
}

static int cache_lend_check_chunks(const struct gmb__cache *m, const uint64_t *ids,
				   const uint64_t *sizes, size_t n, uint64_t want, char *err)
{
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++) {
		const struct gmb__handle *e = ids[i] ? idmap_get(&m->cache, ids[i]) : NULL;

		if (!e)
			return err_fmt(err, -EPROTO,
				       "gmbd lent chunk %" PRIu64 " without sending it", ids[i]);
		if (e->size != sizes[i] || sizes[i] > UINT64_MAX - total)
			return err_fmt(err, -EPROTO,
				       "gmbd lent chunk %" PRIu64 " as 0x%" PRIx64
				       " bytes, it holds 0x%" PRIx64,
				       ids[i], sizes[i], e->size);
		total += sizes[i];
	}
	if (total != want)
		return err_fmt(err, -EPROTO,
			       "gmbd lent chunks of 0x%" PRIx64 " bytes in all for an"
			       " allocation of 0x%" PRIx64,
			       total, want);
	return 0;
}

/* Appends piece @l to @j (a copy of the lend's first piece, arrays owned). */
static int lends_append(Gmb__Lend *j, const Gmb__Lend *l, char *err)
{
	size_t n = j->n_chunk_ids + l->n_chunk_ids;
	uint64_t *ids, *sizes;

	if (l->alloc_id != j->alloc_id || l->first_chunk != j->n_chunk_ids ||
	    l->n_chunk_ids != l->n_chunk_sizes || n > UINT32_MAX)
		return err_fmt(err, -EPROTO,
			       "gmbd sent a piece of the lend of allocation %" PRIu64
			       " from chunk %u out of order",
			       l->alloc_id, l->first_chunk);
	ids = realloc(j->chunk_ids, n * sizeof(*ids));
	if (ids)
		j->chunk_ids = ids;
	sizes = ids ? realloc(j->chunk_sizes, n * sizeof(*sizes)) : NULL;
	if (sizes)
		j->chunk_sizes = sizes;
	if (!ids || !sizes)
		return err_fmt(err, -ENOMEM, "out of memory joining gmbd's lends");
	memcpy(ids + j->n_chunk_ids, l->chunk_ids, l->n_chunk_ids * sizeof(*ids));
	memcpy(sizes + j->n_chunk_ids, l->chunk_sizes, l->n_chunk_ids * sizeof(*sizes));
	j->n_chunk_ids = j->n_chunk_sizes = n;
	return 0;
}

/* The lend that starts at @in[@i] and the pieces after it; *@next past them. */
static int cache_lends_join_one(const Gmb__Lend *const *in, size_t n, size_t i,
				struct gmb__lends *out, size_t *next, char *err)
{
	Gmb__Lend *j;
	size_t k = i + 1;
	int rc = 0;

	if (in[i]->first_chunk != 0)
		return err_fmt(err, -EPROTO,
			       "gmbd sent a piece of the lend of allocation %" PRIu64
			       " without its start",
			       in[i]->alloc_id);
	while (k < n && in[k]->first_chunk != 0)
		k++;
	*next = k;
	if (k == i + 1) {
		out->v[out->n++] = in[i];
		return 0;
	}
	j = &out->joined[out->njoined++];
	*j = *in[i];
	j->chunk_ids = j->chunk_sizes = NULL;
	j->n_chunk_ids = j->n_chunk_sizes = 0;
	for (size_t p = i; p < k && rc == 0; p++)
		rc = lends_append(j, in[p], err);
	out->v[out->n++] = j;
	return rc;
}

int gmb__cache_lends_join(const Gmb__Lend *const *in, size_t n, struct gmb__lends *out, char *err)
{
	size_t i = 0;
	int rc = 0;

	*out = (struct gmb__lends){ 0 };
	out->v = calloc(n + 1, sizeof(*out->v));
	out->joined = calloc(n + 1, sizeof(*out->joined));
	if (!out->v || !out->joined)
		return err_fmt(err, -ENOMEM, "out of memory reading gmbd's lends");
	while (i < n && rc == 0) {
		if (!in[i])
			return err_fmt(err, -EPROTO, "gmbd's reply lacks the lend");
		rc = cache_lends_join_one(in, n, i, out, &i, err);
	}
	return rc;
}

void gmb__cache_lends_free(struct gmb__lends *ls)
{
	for (size_t i = 0; i < ls->njoined; i++) {
		free(ls->joined[i].chunk_ids);
		free(ls->joined[i].chunk_sizes);
	}
	free(ls->joined);
	free(ls->v);
	*ls = (struct gmb__lends){ 0 };
}

/*
 * gmb__cache_lend_check() - is @l a lend this client can map for @a?
 * Return: 0, or -EPROTO with a sentence in @err.
 */
int gmb__cache_lend_check(const struct gmb__cache *m, const struct gmb__alloc *a,
			  const Gmb__Lend *l, char *err)
{
	if (!l)
		return err_fmt(err, -EPROTO, "gmbd's reply lacks the lend");
	if (l->alloc_id != a->id || l->device != (uint32_t)a->dev || l->size != a->size)
		return err_fmt(err, -EPROTO,
			       "gmbd lent allocation %" PRIu64 " (device %u, 0x%" PRIx64
			       " bytes) for allocation %" PRIu64 " (device %d, 0x%" PRIx64
			       " bytes)",
			       l->alloc_id, l->device, l->size, a->id, a->dev, a->size);
	if (l->n_chunk_ids == 0 || l->n_chunk_ids != l->n_chunk_sizes ||
	    l->n_chunk_ids > UINT32_MAX)
		return err_fmt(err, -EPROTO, "gmbd lent %zu chunk ids with %zu sizes",
			       l->n_chunk_ids, l->n_chunk_sizes);
	return cache_lend_check_chunks(m, l->chunk_ids, l->chunk_sizes, l->n_chunk_ids, a->size,
				       err);
}

/*
 * gmb__cache_lend_set() - make @ids/@sizes the last lend of @a.
 * Every id must be cached (-EPROTO otherwise, nothing changed); -ENOMEM
 * changes nothing either. Handles of the old list that no allocation names
 * any more move to @rel.
 */
int gmb__cache_lend_set(struct gmb__cache *m, struct gmb__alloc *a, const uint64_t *ids,
			const uint64_t *sizes, uint32_t n, struct gmb__handle **rel)
{
	uint64_t *nids, *nsizes;

	for (uint32_t i = 0; i < n; i++)
		if (!ids[i] || !idmap_get(&m->cache, ids[i]))
			return -EPROTO;
	nids = malloc((n ? n : 1) * sizeof(*nids));
	nsizes = malloc((n ? n : 1) * sizeof(*nsizes));
	if (!nids || !nsizes) {
		free(nids);
		free(nsizes);
		return -ENOMEM;
	}
	memcpy(nids, ids, n * sizeof(*nids));
	memcpy(nsizes, sizes, n * sizeof(*nsizes));
	/* New references first: a chunk in both lists must not touch 0 between. */
	for (uint32_t i = 0; i < n; i++)
		((struct gmb__handle *)idmap_get(&m->cache, ids[i]))->refs++;
	gmb__cache_lend_clear(m, a, rel);
	a->chunk_ids = nids;
	a->chunk_sizes = nsizes;
	a->nchunks = n;
	return 0;
}

/* gmb__cache_lend_clear() - forget @a's last lend (a free); unnamed handles to @rel. */
void gmb__cache_lend_clear(struct gmb__cache *m, struct gmb__alloc *a, struct gmb__handle **rel)
{
	for (uint32_t i = 0; i < a->nchunks; i++)
		cache_unref(m, a->chunk_ids[i], rel);
	free(a->chunk_ids);
	free(a->chunk_sizes);
	a->chunk_ids = NULL;
	a->chunk_sizes = NULL;
	a->nchunks = 0;
}

/*
 * gmb__cache_let_go() - @a's last lend stops holding its chunks (a pause
 * whose memory goes back to the driver): each is unreferenced, unnamed
 * handles move to @rel, and the ids become 0 as dropped ones do, so the
 * lend keeps its shape for the re-announcement and the next resume.
 */
void gmb__cache_let_go(struct gmb__cache *m, struct gmb__alloc *a, struct gmb__handle **rel)
{
	for (uint32_t i = 0; i < a->nchunks; i++) {
		cache_unref(m, a->chunk_ids[i], rel);
		a->chunk_ids[i] = 0;
	}
}

/*
 * gmb__cache_adopt() - enter @a (its id set) in by_id and by_va with @l as
 * its last lend. Return: 0; -EPROTO (a lend this client cannot map, or an
 * allocation lent twice) with a sentence in @err; or -ENOMEM. On failure
 * nothing changed.
 */
int gmb__cache_adopt(struct gmb__cache *m, struct gmb__alloc *a, const Gmb__Lend *l,
		     struct gmb__handle **rel, char *err)
{
	int rc = gmb__cache_lend_check(m, a, l, err);

	if (rc == 0 && idmap_get(&m->by_id, a->id))
		rc = err_fmt(err, -EPROTO, "gmbd lent allocation %" PRIu64 " twice", a->id);
	if (rc == 0)
		rc = idmap_put(&m->by_id, a->id, a);
	if (rc == 0) {
		rc = idmap_put(&m->by_va, a->va, a);
		if (rc == 0)
			rc = gmb__cache_lend_set(m, a, l->chunk_ids, l->chunk_sizes,
						 (uint32_t)l->n_chunk_ids, rel);
		if (rc < 0) {
			idmap_del(&m->by_va, a->va);
			idmap_del(&m->by_id, a->id);
		}
	}
	return rc;
}

/* gmb__cache_forget() - @a leaves by_id and by_va; its last lend's unnamed handles to @rel. */
void gmb__cache_forget(struct gmb__cache *m, struct gmb__alloc *a, struct gmb__handle **rel)
{
	if (idmap_get(&m->by_id, a->id) == a)
		idmap_del(&m->by_id, a->id);
	if (idmap_get(&m->by_va, a->va) == a)
		idmap_del(&m->by_va, a->va);
	gmb__cache_lend_clear(m, a, rel);
}

/* The first chunk marked dropping in the last lend of an allocation in use, or 0. */
static uint64_t cache_drop_in_use(struct gmb__cache *m)
{
	struct gmb__alloc *a;
	size_t it = 0;

	while (idmap_next(&m->by_id, &it, NULL, (void **)&a)) {
		if (!a->in_use)
			continue;
		for (uint32_t i = 0; i < a->nchunks; i++) {
			struct gmb__handle *e =
				a->chunk_ids[i] ? idmap_get(&m->cache, a->chunk_ids[i]) : NULL;

			if (e && e->dropping)
				return e->id;
		}
	}
	return 0;
}

/*
 * gmb__cache_drop() - a DropRequest: the named chunks leave the cache
 * whatever their refs (unknown ids were dropped already), and last lends
 * stop naming them, so that neither side counts them any more. A chunk an
 * allocation has mapped (or is mapping) is the application's memory: then
 * nothing is dropped and -EBUSY says which, since obeying would leave an
 * allocation that cannot be mapped again, whatever gmbd believes.
 */
int gmb__cache_drop(struct gmb__cache *m, const uint64_t *ids, size_t n, struct gmb__handle **rel,
		    char *err)
{
	bool named = false;
	struct gmb__alloc *a;
	uint64_t busy = 0;
	size_t it = 0;

	for (size_t i = 0; i < n; i++) {
		struct gmb__handle *e = ids[i] ? idmap_get(&m->cache, ids[i]) : NULL;

		if (e && e->refs > 0) {
			e->dropping = true;
			named = true;
		}
	}
	if (named)
		busy = cache_drop_in_use(m);
	for (size_t i = 0; i < n && named; i++) {
		struct gmb__handle *e = ids[i] ? idmap_get(&m->cache, ids[i]) : NULL;

		if (e)
			e->dropping = false;
	}
	if (busy)
		return err_fmt(err, -EBUSY,
			       "chunk %" PRIu64 " is mapped by this client: not dropped", busy);
	for (size_t i = 0; i < n; i++) {
		struct gmb__handle *e = ids[i] ? idmap_del(&m->cache, ids[i]) : NULL;

		if (e)
			cache_push(rel, e);
	}
	if (!named)
		return 0;
	/* Every non-zero id of a last lend is cached, so a missing one was just dropped. */
	while (idmap_next(&m->by_id, &it, NULL, (void **)&a))
		for (uint32_t i = 0; i < a->nchunks; i++)
			if (a->chunk_ids[i] && !idmap_get(&m->cache, a->chunk_ids[i]))
				a->chunk_ids[i] = 0;
	return 0;
}

/* gmb__cache_sweep() - release chunks no last lend names (left by a failed request). */
void gmb__cache_sweep(struct gmb__cache *m, struct gmb__handle **rel)
{
	struct gmb__handle *e;
	uint64_t id;
	size_t it = 0;

	while (idmap_next(&m->cache, &it, &id, (void **)&e))
		if (e->refs == 0)
			cache_push(rel, idmap_del(&m->cache, id));
}

/* gmb__cache_clear() - every handle to @rel (gmb_close). */
void gmb__cache_clear(struct gmb__cache *m, struct gmb__handle **rel)
{
	struct gmb__handle *e;
	uint64_t id;
	size_t it = 0;

	while (idmap_next(&m->cache, &it, &id, (void **)&e))
		cache_push(rel, idmap_del(&m->cache, id));
	idmap_deinit(&m->cache);
}

/*
 * gmb__cache_lend_handles() - the backend handles of @a's last lend, in mapping
 * order, into @handles (a->nchunks entries). -EPROTO when a chunk of it was
 * dropped: the lend can no longer be mapped.
 */
int gmb__cache_lend_handles(const struct gmb__cache *m, const struct gmb__alloc *a,
			    uint64_t *handles, char *err)
{
	for (uint32_t i = 0; i < a->nchunks; i++) {
		const struct gmb__handle *e = idmap_get(&m->cache, a->chunk_ids[i]);

		if (!e)
			return err_fmt(err, -EPROTO,
				       "chunk %u of allocation %" PRIu64 " was dropped while lent",
				       i, a->id);
		handles[i] = e->handle;
	}
	return 0;
}

/* gmb__cache_release_run() - release and free every entry of @rel; @be NULL only frees. */
void gmb__cache_release_run(struct backend *be, struct gmb__handle *rel)
{
	while (rel) {
		struct gmb__handle *next = rel->next;

		/* A failed release leaves nothing to retry: the handle is gone either way. */
		if (be)
			be->ops->chunk_release(be, rel->handle);
		free(rel);
		rel = next;
	}
}
