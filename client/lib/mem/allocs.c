/*
 * allocs.c - libgmb's allocations, made and undone: malloc (a whole
 * allocation, or a piece carved out of a pack, pack.c), free, gmb_owns(),
 * and the give of a publish (a named object's version, client/lib/api/).
 *
 * Apart from mem.c, whose tags and mapping helpers it uses, because this
 * is one record's life from end to end: reserve the VA range, ask gmbd
 * (AllocRequest), adopt the lend in the tables, map it; then unmap,
 * FreeRequest, forget, release. Each step's undoing sits next to it, so
 * that a failed malloc leaves nothing behind, gmbd's side included, and
 * the invariants atop mem.c hold again whenever one of these returns.
 * Everything here runs under the operation lock; the tables the reader
 * also touches change under the state lock as well.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "client/lib/mem/mem.h"

/*
 * FreeRequest for @id. Sent again after a lost connection, -ENOENT means
 * the first copy freed it, or the re-announcement left it out (a free on
 * its way is not claimed): either way it is gone, as asked.
 */
static int allocs_send_free(struct gmb__mem *m, uint64_t id, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__FreeRequest req = GMB__FREE_REQUEST__INIT;
	struct gmb__reply rep;
	int rc;

	req.alloc_id = id;
	env.body_case = GMB__ENVELOPE__BODY_FREE;
	env.free = &req;
	rc = gmb__request(m->conn, &env, &rep, err);
	if (rc == -ENOENT && rep.resent)
		rc = 0;
	gmb__reply_deinit(&rep);
	return rc;
}

/* Allocations: the record, its tables, its undoing. */

/*
 * The backup kind an allocation made as @how says gets: its own, resolved;
 * a tag's allocations do not fail for a TMS_ variable they do not use
 * (PINNED then). Negative: @how's own default is malformed (@err says).
 */
static int allocs_how_backup(const struct gmb__mem_how *how, char *err)
{
	int backup = how && how->own ? how->backup : GMB_BACKUP_DEFAULT;

	if (backup == GMB_BACKUP_DEFAULT)
		backup = gmb__backup_default(how && how->own ? err : NULL);
	if (backup < 0 && !(how && how->own))
		backup = GMB_BACKUP_PINNED;
	return backup;
}

/* A record with its VA range reserved, not yet lent. */
static int allocs_new(struct gmb__mem *m, struct gmb__tag *t, int dev, uint64_t peers,
		      uint64_t size, const struct gmb__mem_how *how, struct gmb__alloc **out,
		      char *err)
{
	int backup = allocs_how_backup(how, err);
	struct gmb__alloc *a;
	int rc;

	if (backup < 0)
		return backup;
	a = calloc(1, sizeof(*a));
	if (!a)
		return err_fmt(err, -ENOMEM, "out of memory for an allocation record");
	*a = (struct gmb__alloc){ .dev = dev, .peers = peers, .size = size, .tag = t };
	a->own_mode = how && how->own;
	a->mode = a->own_mode ? how->mode : GMB_MODE_DISCARD;
	a->backup = backup;
	gmb__backup_init(a);
	rc = m->be->ops->va_reserve(m->be, size, m->devs->granularity[dev], &a->va);
	if (rc < 0) {
		rc = backend_fail_msg(err, rc, "reserving the address range");
		free(a);
		return rc;
	}
	*out = a;
	return 0;
}

/* Frees what allocs_new() made; @a is out of every table but its pieces'. */
static void allocs_destroy(struct gmb__mem *m, struct gmb__alloc *a)
{
	pthread_mutex_lock(&m->conn->lock);
	for (struct gmb__piece *p = a->pieces; p; p = p->next)
		idmap_del(&m->pieces, p->va);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__pack_clear(a);
	/* Only gmb_close() gets here mapped: the VA cannot be freed under a mapping. */
	if (a->mapped)
		m->be->ops->unmap(m->be, a->va, a->size);
	gmb__backup_free(m->be, &m->bufs, a);
	m->be->ops->va_free(m->be, a->va, a->size);
	free(a->chunk_ids);
	free(a->chunk_sizes);
	free(a);
}

/*
 * Frees every allocation of every tag, the tags left empty for
 * gmb__mem_deinit(): at gmb_close(), or a connect that failed, where gmbd
 * takes the memory back with the session.
 */
void gmb__allocs_drop_all(struct gmb__mem *m)
{
	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		struct gmb__alloc *a;

		while ((a = t->allocs)) {
			gmb__mem_tag_unlink(t, a);
			allocs_destroy(m, a);
		}
	}
}

/* Enters @a (id set) in the tables with @l as its last lend. */
static int allocs_adopt(struct gmb__mem *m, struct gmb__alloc *a, const Gmb__Lend *l, char *err)
{
	struct gmb__handle *rel = NULL;
	int rc;

	pthread_mutex_lock(&m->conn->lock);
	rc = gmb__cache_adopt(&m->tab, a, l, &rel, err);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
	if (rc == -ENOMEM)
		return err_fmt(err, rc, "out of memory recording allocation %" PRIu64, a->id);
	return rc;
}

/* Takes @a out of the tables and drops its last lend's references. */
static void allocs_forget(struct gmb__mem *m, struct gmb__alloc *a)
{
	struct gmb__handle *rel = NULL;

	pthread_mutex_lock(&m->conn->lock);
	gmb__cache_forget(&m->tab, a, &rel);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
}

/* The lend of an AllocReply, its pieces (one a part) joined in @ls. */
static const Gmb__Lend *allocs_lend(const struct gmb__reply *rep, struct gmb__lends *ls, char *err)
{
	const Gmb__Lend **in = calloc(rep->nparts + 1, sizeof(*in));
	size_t n = 0;
	int rc;

	*ls = (struct gmb__lends){ 0 };
	if (!in) {
		err_fmt(err, -ENOMEM, "out of memory reading gmbd's allocation reply");
		return NULL;
	}
	for (size_t i = 0; i < rep->nparts; i++) {
		const Gmb__Envelope *e = rep->parts[i];

		if (e->body_case == GMB__ENVELOPE__BODY_ALLOC_REPLY && e->alloc_reply &&
		    e->alloc_reply->lend)
			in[n++] = e->alloc_reply->lend;
	}
	rc = gmb__cache_lends_join(in, n, ls, err);
	free(in);
	if (rc == 0 && ls->n != 1)
		err_fmt(err, -EPROTO, "gmbd's allocation reply has %zu lends, not one", ls->n);
	return rc == 0 && ls->n == 1 ? ls->v[0] : NULL;
}

/* The allocation id of an AllocReply whose lend cannot be read (to free it). */
static uint64_t allocs_lend_id(const struct gmb__reply *rep)
{
	for (size_t i = 0; i < rep->nparts; i++) {
		const Gmb__Envelope *e = rep->parts[i];

		if (e->body_case == GMB__ENVELOPE__BODY_ALLOC_REPLY && e->alloc_reply &&
		    e->alloc_reply->lend && e->alloc_reply->lend->alloc_id)
			return e->alloc_reply->lend->alloc_id;
	}
	return 0;
}

/*
 * AllocRequest for @a (gmbd waits up to @wait_ms for the memory), then adopt
 * and map the lend; on failure gmbd gets it back.
 */
static int allocs_lend_map(struct gmb__mem *m, struct gmb__alloc *a, uint32_t wait_ms, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__AllocRequest req = GMB__ALLOC_REQUEST__INIT;
	struct gmb__reply rep;
	struct gmb__lends ls;
	const Gmb__Lend *l;
	char why[ERR_MSG_MAX] = "";
	int rc;

	req.device = (uint32_t)a->dev;
	req.size = a->size;
	req.tag = a->tag->name;
	req.wait_ms = wait_ms;
	env.body_case = GMB__ENVELOPE__BODY_ALLOC;
	env.alloc = &req;
	rc = gmb__request(m->conn, &env, &rep, err);
	if (rep.status < 0)
		goto out_rep; /* nothing was lent */
	l = allocs_lend(&rep, &ls, why);
	a->id = l ? l->alloc_id : allocs_lend_id(&rep);
	if (rc == 0 && !l)
		rc = err_fmt(err, -EPROTO, "%s",
			     why[0] ? why : "gmbd's allocation reply lacks a lend");
	if (rc == 0 && !a->id)
		rc = err_fmt(err, -EPROTO, "gmbd's allocation reply lacks an allocation id");
	if (rc == 0)
		rc = allocs_adopt(m, a, l, err);
	if (rc == 0) {
		rc = gmb__mem_map(m, a, err);
		if (rc < 0)
			allocs_forget(m, a);
	}
	/* gmbd lent (status 0) but this side failed: give it back, keep our reason. */
	if (rc < 0 && a->id)
		allocs_send_free(m, a->id, NULL);
	gmb__cache_lends_free(&ls);
out_rep:
	gmb__mem_sweep(m);
	gmb__reply_deinit(&rep);
	return rc;
}

static int allocs_malloc_check(struct gmb__mem *m, void **ptr, size_t size, int dev,
			       const char *tag, char *err)
{
	if (!ptr)
		return err_fmt(err, -EINVAL, "no place for the pointer");
	if (size == 0)
		return err_fmt(err, -EINVAL, "allocation of 0 bytes");
	if (dev < 0 || dev >= m->devs->ndevices)
		return err_fmt(err, -ENODEV, "no device %d: gmbd manages %d", dev,
			       m->devs->ndevices);
	if ((uint64_t)size > UINT64_MAX - m->devs->granularity[dev])
		return err_fmt(err, -ENOMEM, "allocation of %zu bytes is too large", size);
	return gmb__mem_check_name(tag, err);
}

/*
 * gmbd's indexes of the peers named by this process's ordinals in @peers
 * (the owner @dev's own bit dropped: it has access anyway).
 */
static int allocs_peer_indexes(struct gmb__mem *m, uint64_t peers, int dev, uint64_t *out,
			       char *err)
{
	*out = 0;
	for (int o = 0; o < BACKEND_MAX_DEVICES; o++) {
		int i = peers & GMB__DEV_BIT(o) ? gmb__mem_dev_index(m, o, err) : dev;

		if (i < 0)
			return err_fmt(err, i, "peer device %d of this process is none of gmbd's",
				       o);
		if (i != dev)
			*out |= GMB__DEV_BIT(i);
	}
	return 0;
}

/*
 * Whether an allocation of @size is packed (pack.c). A disk-backed one is
 * not: its copy is a file of its own (torch_memory_saver's users count one
 * per allocation), where a pack's would hold every piece.
 */
static bool allocs_packs(const struct gmb__mem *m, int dev, uint64_t size, enum gmb__pack_class pc,
			 const struct gmb__mem_how *how)
{
	uint64_t max_chunk = m->devs->max_chunk[dev];

	if (size > GMB__PACK_PIECE_MAX || pc == GMB__PACK_NEVER || m->pack == GMB_PACK_OFF)
		return false;
	if (allocs_how_backup(how, NULL) == GMB_BACKUP_DISK)
		return false;
	/* A pack is one chunk: where two pieces do not fit in one, nothing is saved. */
	if (max_chunk && max_chunk / size < 2)
		return false;
	return m->pack == GMB_PACK_ALL || pc == GMB__PACK_HOOK;
}

/* What a piece shares with its pack (a malformed default: allocs_new() refuses it). */
static struct gmb__pack_key allocs_pack_key(int dev, uint64_t peers, const struct gmb__mem_how *how)
{
	struct gmb__pack_key k = { .dev = dev, .peers = peers, .own_mode = how && how->own };

	if (k.own_mode) {
		k.mode = how->mode;
		k.backup = allocs_how_backup(how, NULL);
	}
	return k;
}

/* A new pack of @t for a piece of @size, lent, mapped and in @t's list. */
static int allocs_pack_new(struct gmb__mem *m, struct gmb__tag *t, const struct gmb__pack_key *k,
			   uint64_t size, const struct gmb__mem_how *how, struct gmb__alloc **out,
			   char *err)
{
	uint64_t gran = m->devs->granularity[k->dev];
	uint64_t want =
		backend_round_up(gmb__pack_size(t, k, size, m->devs->max_chunk[k->dev]), gran);
	struct gmb__alloc *a;
	int rc;

	/*
	 * The room is a bet on allocations to come: it is not worth a wait, nor
	 * a refusal. Past the budget, a pack of the piece's size is asked for,
	 * with the wait an allocation of its own would have had.
	 */
	for (;;) {
		rc = allocs_new(m, t, k->dev, k->peers, want, how, &a, err);
		if (rc == 0) {
			rc = allocs_lend_map(m, a, want > size ? 0 : m->wait_ms, err);
			if (rc == 0)
				break;
			allocs_destroy(m, a);
		}
		if (rc != -ENOMEM || want == size)
			return rc;
		want = size;
	}
	a->packed = true;
	gmb__mem_tag_link(t, a);
	gmb__backup_prep(m->be, &m->bufs, a);
	*out = a;
	return 0;
}

/* Frees @a whole: unmap (if active), tell gmbd, release. */
static int allocs_free_whole(struct gmb__mem *m, struct gmb__alloc *a, char *err);

/* gmb__allocs_malloc() of a piece: in a pack of @t with room, else in a new one. */
static int allocs_pack_malloc(struct gmb__mem *m, struct gmb__tag *t, int dev, uint64_t peers,
			      uint64_t size, const struct gmb__mem_how *how, void **ptr, char *err)
{
	struct gmb__pack_key k = allocs_pack_key(dev, peers, how);
	uintptr_t va = 0;
	struct gmb__alloc *a = gmb__pack_find(t, &k, size, &va);
	struct gmb__piece *p;
	bool fresh = !a;
	int rc;

	if (!a) {
		rc = allocs_pack_new(m, t, &k, size, how, &a, err);
		if (rc < 0)
			return rc;
		va = a->va;
	}
	rc = gmb__pack_carve(a, va, size, &p);
	if (rc == 0) {
		pthread_mutex_lock(&m->conn->lock);
		rc = idmap_put(&m->pieces, va, p);
		pthread_mutex_unlock(&m->conn->lock);
		if (rc < 0)
			gmb__pack_uncarve(p);
	}
	if (rc < 0) {
		if (fresh)
			allocs_free_whole(m, a, NULL);
		return err_fmt(err, -ENOMEM, "out of memory recording a packed allocation");
	}
	*ptr = (void *)va;
	return 0;
}

/**
 * gmb__allocs_malloc() - reserve, lend, map (or carve out of a pack). *@ptr
 * is set only on success; on failure everything is undone, including
 * gmbd's side.
 */
int gmb__allocs_malloc(struct gmb__mem *m, void **ptr, size_t size, int dev, const char *tag,
		       const struct gmb__mem_how *how, uint64_t peers, enum gmb__pack_class pc,
		       char *err)
{
	struct gmb__alloc *a = NULL;
	struct gmb__tag *t;
	uint64_t rounded;
	bool created;
	int rc;

	if (!tag)
		tag = "default";
	rc = gmb__mem_backend(m, err);
	if (rc == 0)
		rc = dev = gmb__mem_dev_index(m, dev, err);
	if (rc >= 0)
		rc = allocs_malloc_check(m, ptr, size, dev, tag, err);
	if (rc >= 0)
		rc = allocs_peer_indexes(m, peers, dev, &peers, err);
	if (rc < 0)
		return rc;
	t = gmb__mem_tag_find(m, tag);
	if (t && t->paused)
		return err_fmt(err, -EBUSY, "tag \"%s\" is paused: resume it to allocate", tag);
	rc = gmb__mem_tag_get(m, tag, &t, &created, err);
	if (rc < 0)
		return rc;
	rounded = backend_round_up(size, m->devs->granularity[dev]);
	gmb__backup_busy(&m->bufs);
	if (allocs_packs(m, dev, rounded, pc, how)) {
		rc = allocs_pack_malloc(m, t, dev, peers, rounded, how, ptr, err);
		if (rc < 0)
			goto out_tag;
		return 0;
	}
	rc = allocs_new(m, t, dev, peers, rounded, how, &a, err);
	if (rc < 0)
		goto out_tag;
	rc = allocs_lend_map(m, a, m->wait_ms, err);
	if (rc < 0)
		goto out_alloc;
	gmb__mem_tag_link(t, a);
	gmb__backup_prep(m->be, &m->bufs, a);
	*ptr = (void *)a->va;
	return 0;

out_alloc:
	allocs_destroy(m, a);
out_tag:
	if (created && !t->allocs)
		gmb__mem_tag_drop(m, t);
	return rc;
}

static int allocs_free_whole(struct gmb__mem *m, struct gmb__alloc *a, char *err)
{
	int rc;

	if (a->mapped) {
		rc = gmb__mem_sync(m, GMB__DEV_BIT(a->dev), err);
		if (rc == 0)
			rc = gmb__mem_unmap(m, a, err);
		if (rc < 0)
			return rc;
	}
	/* Under the state lock: the reader's re-announcement reads it. */
	pthread_mutex_lock(&m->conn->lock);
	a->freeing = true;
	pthread_mutex_unlock(&m->conn->lock);
	rc = allocs_send_free(m, a->id, err);
	if (rc == -ENOTCONN)
		rc = 0;
	allocs_forget(m, a);
	gmb__mem_tag_unlink(a->tag, a);
	allocs_destroy(m, a);
	return rc;
}

bool gmb__allocs_owns(const struct gmb__mem *m, uintptr_t ptr)
{
	const struct gmb__alloc *a = idmap_get(&m->tab.by_va, ptr);

	return idmap_get(&m->pieces, ptr) || (a && !a->packed);
}

/**
 * gmb__allocs_free() - unmap (if active), tell gmbd, release. The allocation
 * is gone locally even when gmbd answers an error (that error is returned);
 * a connection lost for good is no error: gmbd took everything back then
 * (or will, when it reclaims this client). A piece of a pack frees the pack
 * once it is the last.
 */
int gmb__allocs_free(struct gmb__mem *m, void *ptr, char *err)
{
	struct gmb__piece *p = NULL;
	struct gmb__alloc *a;

	pthread_mutex_lock(&m->conn->lock);
	if (ptr)
		p = idmap_del(&m->pieces, (uintptr_t)ptr);
	a = p ? p->pack : ptr ? idmap_get(&m->tab.by_va, (uintptr_t)ptr) : NULL;
	pthread_mutex_unlock(&m->conn->lock);
	if (!a || (!p && a->packed))
		return err_fmt(err, -EINVAL, "pointer %p was not allocated by gmb_malloc", ptr);
	if (p && !gmb__pack_uncarve(p))
		return 0; /* the pack's other pieces keep it */
	gmb__backup_busy(&m->bufs);
	return allocs_free_whole(m, a, err);
}

/**
 * gmb__allocs_give_check() - the allocation whose base is @ptr, active and
 * drained, for a publish to give to gmbd (a named object's version).
 * Return: 0; -EINVAL (no allocation's base); -EBUSY (its tag is paused);
 * the backend's error.
 */
int gmb__allocs_give_check(struct gmb__mem *m, void *ptr, struct gmb__alloc **out, char *err)
{
	struct gmb__alloc *a;
	int rc = 0;

	pthread_mutex_lock(&m->conn->lock);
	a = ptr ? idmap_get(&m->tab.by_va, (uintptr_t)ptr) : NULL;
	if (ptr && idmap_get(&m->pieces, (uintptr_t)ptr))
		rc = err_fmt(err, -EINVAL,
			     "pointer %p shares a mapping with other allocations (gmb_set_pack()):"
			     " publish an allocation of its own",
			     ptr);
	else if (!a || a->packed)
		rc = err_fmt(err, -EINVAL, "pointer %p is no allocation's base (gmb_malloc's)",
			     ptr);
	pthread_mutex_unlock(&m->conn->lock);
	if (rc < 0)
		return rc;
	if (!a->mapped)
		return err_fmt(err, -EBUSY, "pointer %p is in paused tag \"%s\": resume it first",
			       ptr, a->tag->name);
	*out = a;
	/* What the readers see is what the device wrote before now. */
	return gmb__mem_sync(m, GMB__DEV_BIT(a->dev), err);
}

/**
 * gmb__allocs_give_away() - gmbd took @a (a publish): forget it as a free
 * does, without a FreeRequest, and hand its address range, unmapped but
 * reserved still, to the caller (*@va, *@size), who frees it.
 */
void gmb__allocs_give_away(struct gmb__mem *m, struct gmb__alloc *a, uintptr_t *va, uint64_t *size)
{
	/* An unmap that fails leaves the range to the process: it cannot be reused. */
	if (a->mapped && gmb__mem_unmap(m, a, NULL) < 0) {
		*va = 0;
		*size = 0;
	} else {
		*va = a->va;
		*size = a->size;
	}
	allocs_forget(m, a);
	gmb__mem_tag_unlink(a->tag, a);
	gmb__backup_free(m->be, &m->bufs, a);
	free(a->chunk_ids);
	free(a->chunk_sizes);
	free(a);
}
