/*
 * mem.c - libgmb's allocations and tags: malloc, free, mode, drops, and the
 * mapping helpers that cycle.c (pause/resume) shares.
 *
 * An allocation is one VA range reserved at malloc and kept until free, so
 * its address never changes; its last lend (cache.c) is mapped back to back
 * from the base, and one set_access covers the whole range. Every function
 * here runs under the operation lock, except the connection's callbacks
 * (mem_import(), mem_drop(): the reader's);
 * the memory tables the reader also touches (handle cache, alloc tables,
 * last lends' ids) change under the state lock as well.
 *
 * Invariants (between operations):
 *   - an allocation is in by_id and by_va, in its tag's list, and its last
 *     lend is non-empty from the moment gmb_malloc() returns it to its free;
 *   - a pack (pack.c) is such an allocation with at least one piece, and
 *     each piece is in pieces; the application's pointer is a piece's,
 *     never the pack's (gmb_free() and gmb_owns() look at pieces first);
 *   - a PRESERVE allocation's host copy (backup.c) is made at its first
 *     pause (a retained pinned one from malloc on, off this thread) and
 *     kept only as the retain setting says; saved says it holds the bytes
 *     of the pause in progress or the last one;
 *   - a failed malloc leaves nothing behind, gmbd's side included.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/list.h"
#include "client/lib/mem/mem.h"

static int mem_check_name(const char *name, char *err)
{
	size_t n = strlen(name);

	if (n == 0)
		return err_fmt(err, -EINVAL, "empty tag name");
	if (n > WIRE_MAX_NAME)
		return err_fmt(err, -ENAMETOOLONG, "tag name of %zu bytes (at most %d)", n,
			       WIRE_MAX_NAME);
	return 0;
}

/**
 * gmb__mem_backend() - open the backend that maps gmbd's chunks, once.
 * Tools that never allocate never pay for it (cuda: a driver init).
 */
int gmb__mem_backend(struct gmb__mem *m, char *err)
{
	struct backend_host_opts o = BACKEND_HOST_OPTS_INIT;
	struct backend *be = NULL;
	int rc;

	if (m->be)
		return 0;
	o.ndevices = m->devs->ndevices;
	o.granularity = m->devs->granularity[0];
	o.memory = m->devs->device_bytes > o.granularity ? m->devs->device_bytes : o.granularity;
	if (strcmp(m->devs->backend_kind, "host") == 0)
		rc = backend_host_open(&o, &be);
	else if (strcmp(m->devs->backend_kind, "cuda") == 0)
		/* Our device indexes become gmbd's, whatever CUDA_VISIBLE_DEVICES says. */
		rc = backend_cuda_open_order((const uint8_t(*)[16])m->devs->uuid, m->devs->ndevices,
					     &be);
	else
		rc = backend_open(m->devs->backend_kind, &o, &be);
	if (rc < 0)
		return backend_fail_msg(err, rc, "opening libgmb's backend");
	/* The reader imports with it: publish it under the state lock. */
	pthread_mutex_lock(&m->conn->lock);
	m->be = be;
	pthread_mutex_unlock(&m->conn->lock);
	return 0;
}

int gmb__mem_dev_index(struct gmb__mem *m, int ordinal, char *err)
{
	int rc = gmb__mem_backend(m, err);

	if (rc < 0)
		return rc;
	for (int i = 0; i < m->be->ndevices && i < m->devs->ndevices; i++)
		if (m->be->devices[i].ordinal == ordinal && ordinal >= 0)
			return i;
	return err_fmt(err, -ENODEV, "device %d of this process is none of gmbd's %d devices",
		       ordinal, m->devs->ndevices);
}

/* Tags. */

struct gmb__tag *gmb__mem_tag_find(struct gmb__mem *m, const char *name)
{
	for (struct gmb__tag *t = m->tags; t; t = t->next)
		if (strcmp(t->name, name) == 0)
			return t;
	return NULL;
}

/* The tag named @name, created (DISCARD, active) if new; *@created says which. */
static int mem_tag_get(struct gmb__mem *m, const char *name, struct gmb__tag **out, bool *created,
		       char *err)
{
	struct gmb__tag *t = gmb__mem_tag_find(m, name);

	*created = false;
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return err_fmt(err, -ENOMEM, "out of memory for tag \"%s\"", name);
		snprintf(t->name, sizeof(t->name), "%s", name);
		t->next = m->tags;
		m->tags = t;
		*created = true;
	}
	*out = t;
	return 0;
}

/* Undoes mem_tag_get() of a tag that is still empty. */
static void mem_tag_drop(struct gmb__mem *m, struct gmb__tag *t)
{
	for (struct gmb__tag **pp = &m->tags; *pp; pp = &(*pp)->next) {
		if (*pp == t) {
			*pp = t->next;
			free(t);
			return;
		}
	}
}

/* Sends Pause{@name} ("" = every tag) and waits for the answer. */
int gmb__mem_send_pause(struct gmb__mem *m, const char *name, uint64_t copied, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PauseRequest req = GMB__PAUSE_REQUEST__INIT;

	req.tag = (char *)name;
	/* cycle.c lets go of the paused allocations' chunks once gmbd answers. */
	req.handles_released = m->devs->release_on_pause;
	req.host_copied_bytes = copied;
	/* While other processes map the tag, gmbd waits as long for them to close. */
	req.wait_ms = m->wait_ms;
	/* Or asks them to unmap first (gmb_set_ipc_follow()). */
	req.importers_follow = m->ipc_follow;
	env.body_case = GMB__ENVELOPE__BODY_PAUSE;
	env.pause = &req;
	return gmb__request_status(m->conn, &env, err);
}

/*
 * FreeRequest for @id. Sent again after a lost connection, -ENOENT means
 * the first copy freed it, or the re-announcement left it out (a free on
 * its way is not claimed): either way it is gone, as asked.
 */
static int mem_send_free(struct gmb__mem *m, uint64_t id, char *err)
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

/* Mapping. */

static void mem_set_in_use(struct gmb__mem *m, struct gmb__alloc *a, bool in_use)
{
	pthread_mutex_lock(&m->conn->lock);
	a->in_use = in_use;
	pthread_mutex_unlock(&m->conn->lock);
}

/* Maps @a's last lend at its base, back to back, then one set_access. */
int gmb__mem_map(struct gmb__mem *m, struct gmb__alloc *a, char *err)
{
	struct backend *be = m->be;
	uint64_t *h = calloc(a->nchunks ? a->nchunks : 1, sizeof(*h)), off = 0;
	int rc;

	if (!h)
		return err_fmt(err, -ENOMEM, "out of memory mapping allocation %" PRIu64, a->id);
	/* In use from here: a drop of its chunks now would unmap them under the application. */
	pthread_mutex_lock(&m->conn->lock);
	rc = gmb__cache_lend_handles(&m->tab, a, h, err);
	a->in_use = rc == 0;
	pthread_mutex_unlock(&m->conn->lock);
	if (rc < 0)
		goto out_h;
	for (uint32_t i = 0; i < a->nchunks; i++) {
		rc = be->ops->map(be, a->va + off, a->chunk_sizes[i], h[i]);
		if (rc < 0) {
			rc = backend_fail_msg(err, rc, "mapping a chunk");
			goto out_unmap;
		}
		off += a->chunk_sizes[i];
	}
	/* One call for the range: the driver charges per call, not per mapping. */
	rc = be->ops->set_access_peers(be, a->dev, a->peers, a->va, a->size);
	if (rc < 0) {
		rc = backend_fail_msg(err, rc, "setting access");
		goto out_unmap;
	}
	a->mapped = true;
	free(h);
	return 0;

out_unmap:
	if (off)
		be->ops->unmap(be, a->va, off);
	mem_set_in_use(m, a, false);
out_h:
	free(h);
	return rc;
}

int gmb__mem_unmap(struct gmb__mem *m, struct gmb__alloc *a, char *err)
{
	int rc = m->be->ops->unmap(m->be, a->va, a->size);

	if (rc < 0)
		return backend_fail_msg(err, rc, "unmapping an allocation");
	a->mapped = false;
	mem_set_in_use(m, a, false);
	return 0;
}

/* Drains every device in @mask: unmap and copies do not wait for queued work. */
int gmb__mem_sync(struct gmb__mem *m, uint64_t mask, char *err)
{
	for (int d = 0; d < m->devs->ndevices; d++) {
		int rc;

		if (!(mask & GMB__DEV_BIT(d)))
			continue;
		rc = m->be->ops->sync(m->be, d);
		if (rc < 0)
			return backend_fail_msg(err, rc, "draining the device");
	}
	return 0;
}

/* Allocations: the record, its tables, its undoing. */

/*
 * The backup kind an allocation made as @how says gets: its own, resolved;
 * a tag's allocations do not fail for a TMS_ variable they do not use
 * (PINNED then). Negative: @how's own default is malformed (@err says).
 */
static int mem_how_backup(const struct gmb__mem_how *how, char *err)
{
	int backup = how && how->own ? how->backup : GMB_BACKUP_DEFAULT;

	if (backup == GMB_BACKUP_DEFAULT)
		backup = gmb__backup_default(how && how->own ? err : NULL);
	if (backup < 0 && !(how && how->own))
		backup = GMB_BACKUP_PINNED;
	return backup;
}

/* A record with its VA range reserved, not yet lent. */
static int mem_alloc_new(struct gmb__mem *m, struct gmb__tag *t, int dev, uint64_t peers,
			 uint64_t size, const struct gmb__mem_how *how, struct gmb__alloc **out,
			 char *err)
{
	int backup = mem_how_backup(how, err);
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

/* Frees what mem_alloc_new() made; @a is out of every table but its pieces'. */
static void mem_alloc_destroy(struct gmb__mem *m, struct gmb__alloc *a)
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

static void mem_tag_link(struct gmb__tag *t, struct gmb__alloc *a)
{
	DLIST_PUSH(t->allocs, a);
	t->nallocs++;
}

static void mem_tag_unlink(struct gmb__tag *t, struct gmb__alloc *a)
{
	DLIST_UNLINK(t->allocs, a);
	t->nallocs--;
}

/* Enters @a (id set) in the tables with @l as its last lend. */
static int mem_adopt(struct gmb__mem *m, struct gmb__alloc *a, const Gmb__Lend *l, char *err)
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
static void mem_forget(struct gmb__mem *m, struct gmb__alloc *a)
{
	struct gmb__handle *rel = NULL;

	pthread_mutex_lock(&m->conn->lock);
	gmb__cache_forget(&m->tab, a, &rel);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
}

/* Releases the handles a failed request imported but no lend names. */
void gmb__mem_sweep(struct gmb__mem *m)
{
	struct gmb__handle *rel = NULL;

	pthread_mutex_lock(&m->conn->lock);
	gmb__cache_sweep(&m->tab, &rel);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
}

/* The lend of an AllocReply, its pieces (one a part) joined in @ls. */
static const Gmb__Lend *mem_alloc_lend(const struct gmb__reply *rep, struct gmb__lends *ls,
				       char *err)
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
static uint64_t mem_alloc_lend_id(const struct gmb__reply *rep)
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
static int mem_alloc_lend_map(struct gmb__mem *m, struct gmb__alloc *a, uint32_t wait_ms, char *err)
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
	l = mem_alloc_lend(&rep, &ls, why);
	a->id = l ? l->alloc_id : mem_alloc_lend_id(&rep);
	if (rc == 0 && !l)
		rc = err_fmt(err, -EPROTO, "%s",
			     why[0] ? why : "gmbd's allocation reply lacks a lend");
	if (rc == 0 && !a->id)
		rc = err_fmt(err, -EPROTO, "gmbd's allocation reply lacks an allocation id");
	if (rc == 0)
		rc = mem_adopt(m, a, l, err);
	if (rc == 0) {
		rc = gmb__mem_map(m, a, err);
		if (rc < 0)
			mem_forget(m, a);
	}
	/* gmbd lent (status 0) but this side failed: give it back, keep our reason. */
	if (rc < 0 && a->id)
		mem_send_free(m, a->id, NULL);
	gmb__cache_lends_free(&ls);
out_rep:
	gmb__mem_sweep(m);
	gmb__reply_deinit(&rep);
	return rc;
}

static int mem_malloc_check(struct gmb__mem *m, void **ptr, size_t size, int dev, const char *tag,
			    char *err)
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
	return mem_check_name(tag, err);
}

/*
 * gmbd's indexes of the peers named by this process's ordinals in @peers
 * (the owner @dev's own bit dropped: it has access anyway).
 */
static int mem_peer_indexes(struct gmb__mem *m, uint64_t peers, int dev, uint64_t *out, char *err)
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
static bool mem_packs(const struct gmb__mem *m, int dev, uint64_t size, enum gmb__pack_class pc,
		      const struct gmb__mem_how *how)
{
	uint64_t max_chunk = m->devs->max_chunk[dev];

	if (size > GMB__PACK_PIECE_MAX || pc == GMB__PACK_NEVER || m->pack == GMB_PACK_OFF)
		return false;
	if (mem_how_backup(how, NULL) == GMB_BACKUP_DISK)
		return false;
	/* A pack is one chunk: where two pieces do not fit in one, nothing is saved. */
	if (max_chunk && max_chunk / size < 2)
		return false;
	return m->pack == GMB_PACK_ALL || pc == GMB__PACK_HOOK;
}

/* What a piece shares with its pack (a malformed default: mem_alloc_new() refuses it). */
static struct gmb__pack_key mem_pack_key(int dev, uint64_t peers, const struct gmb__mem_how *how)
{
	struct gmb__pack_key k = { .dev = dev, .peers = peers, .own_mode = how && how->own };

	if (k.own_mode) {
		k.mode = how->mode;
		k.backup = mem_how_backup(how, NULL);
	}
	return k;
}

/* A new pack of @t for a piece of @size, lent, mapped and in @t's list. */
static int mem_pack_new(struct gmb__mem *m, struct gmb__tag *t, const struct gmb__pack_key *k,
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
		rc = mem_alloc_new(m, t, k->dev, k->peers, want, how, &a, err);
		if (rc == 0) {
			rc = mem_alloc_lend_map(m, a, want > size ? 0 : m->wait_ms, err);
			if (rc == 0)
				break;
			mem_alloc_destroy(m, a);
		}
		if (rc != -ENOMEM || want == size)
			return rc;
		want = size;
	}
	a->packed = true;
	mem_tag_link(t, a);
	gmb__backup_prep(m->be, &m->bufs, a);
	*out = a;
	return 0;
}

/* Frees @a whole: unmap (if active), tell gmbd, release. */
static int mem_free_whole(struct gmb__mem *m, struct gmb__alloc *a, char *err);

/* gmb__mem_malloc() of a piece: in a pack of @t with room, else in a new one. */
static int mem_pack_malloc(struct gmb__mem *m, struct gmb__tag *t, int dev, uint64_t peers,
			   uint64_t size, const struct gmb__mem_how *how, void **ptr, char *err)
{
	struct gmb__pack_key k = mem_pack_key(dev, peers, how);
	uintptr_t va = 0;
	struct gmb__alloc *a = gmb__pack_find(t, &k, size, &va);
	struct gmb__piece *p;
	bool fresh = !a;
	int rc;

	if (!a) {
		rc = mem_pack_new(m, t, &k, size, how, &a, err);
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
			mem_free_whole(m, a, NULL);
		return err_fmt(err, -ENOMEM, "out of memory recording a packed allocation");
	}
	*ptr = (void *)va;
	return 0;
}

/**
 * gmb__mem_malloc() - reserve, lend, map (or carve out of a pack). *@ptr
 * is set only on success; on failure everything is undone, including
 * gmbd's side.
 */
int gmb__mem_malloc(struct gmb__mem *m, void **ptr, size_t size, int dev, const char *tag,
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
		rc = mem_malloc_check(m, ptr, size, dev, tag, err);
	if (rc >= 0)
		rc = mem_peer_indexes(m, peers, dev, &peers, err);
	if (rc < 0)
		return rc;
	t = gmb__mem_tag_find(m, tag);
	if (t && t->paused)
		return err_fmt(err, -EBUSY, "tag \"%s\" is paused: resume it to allocate", tag);
	rc = mem_tag_get(m, tag, &t, &created, err);
	if (rc < 0)
		return rc;
	rounded = backend_round_up(size, m->devs->granularity[dev]);
	gmb__backup_busy(&m->bufs);
	if (mem_packs(m, dev, rounded, pc, how)) {
		rc = mem_pack_malloc(m, t, dev, peers, rounded, how, ptr, err);
		if (rc < 0)
			goto out_tag;
		return 0;
	}
	rc = mem_alloc_new(m, t, dev, peers, rounded, how, &a, err);
	if (rc < 0)
		goto out_tag;
	rc = mem_alloc_lend_map(m, a, m->wait_ms, err);
	if (rc < 0)
		goto out_alloc;
	mem_tag_link(t, a);
	gmb__backup_prep(m->be, &m->bufs, a);
	*ptr = (void *)a->va;
	return 0;

out_alloc:
	mem_alloc_destroy(m, a);
out_tag:
	if (created && !t->allocs)
		mem_tag_drop(m, t);
	return rc;
}

static int mem_free_whole(struct gmb__mem *m, struct gmb__alloc *a, char *err)
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
	rc = mem_send_free(m, a->id, err);
	if (rc == -ENOTCONN)
		rc = 0;
	mem_forget(m, a);
	mem_tag_unlink(a->tag, a);
	mem_alloc_destroy(m, a);
	return rc;
}

bool gmb__mem_owns(const struct gmb__mem *m, uintptr_t ptr)
{
	const struct gmb__alloc *a = idmap_get(&m->tab.by_va, ptr);

	return idmap_get(&m->pieces, ptr) || (a && !a->packed);
}

/**
 * gmb__mem_free() - unmap (if active), tell gmbd, release. The allocation
 * is gone locally even when gmbd answers an error (that error is returned);
 * a connection lost for good is no error: gmbd took everything back then
 * (or will, when it reclaims this client). A piece of a pack frees the pack
 * once it is the last.
 */
int gmb__mem_free(struct gmb__mem *m, void *ptr, char *err)
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
	return mem_free_whole(m, a, err);
}

/**
 * gmb__mem_give_check() - the allocation whose base is @ptr, active and
 * drained, for a publish to give to gmbd (a named object's version).
 * Return: 0; -EINVAL (no allocation's base); -EBUSY (its tag is paused);
 * the backend's error.
 */
int gmb__mem_give_check(struct gmb__mem *m, void *ptr, struct gmb__alloc **out, char *err)
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
 * gmb__mem_give_away() - gmbd took @a (a publish): forget it as a free
 * does, without a FreeRequest, and hand its address range, unmapped but
 * reserved still, to the caller (*@va, *@size), who frees it.
 */
void gmb__mem_give_away(struct gmb__mem *m, struct gmb__alloc *a, uintptr_t *va, uint64_t *size)
{
	/* An unmap that fails leaves the range to the process: it cannot be reused. */
	if (a->mapped && gmb__mem_unmap(m, a, NULL) < 0) {
		*va = 0;
		*size = 0;
	} else {
		*va = a->va;
		*size = a->size;
	}
	mem_forget(m, a);
	mem_tag_unlink(a->tag, a);
	gmb__backup_free(m->be, &m->bufs, a);
	free(a->chunk_ids);
	free(a->chunk_sizes);
	free(a);
}

/* Mode. */

/* The host copies of @t's allocations that follow its mode (not PRESERVE any more). */
static void mem_backup_free_tag(struct gmb__mem *m, struct gmb__tag *t)
{
	for (struct gmb__alloc *a = t->allocs; a; a = a->next)
		if (!a->own_mode)
			gmb__backup_free(m->be, &m->bufs, a);
}

static int mem_send_mode(struct gmb__mem *m, const char *name, int mode, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__TagModeRequest req = GMB__TAG_MODE_REQUEST__INIT;

	req.tag = (char *)name;
	req.mode = (Gmb__Mode)mode;
	env.body_case = GMB__ENVELOPE__BODY_TAG_MODE;
	env.tag_mode = &req;
	return gmb__request_status(m->conn, &env, err);
}

/**
 * gmb__mem_set_mode() - set @name's mode (creating the tag), for its
 * allocations that have no mode of their own. Host copies are made at the
 * next pause; a paused tag switched to PRESERVE has nothing saved yet and
 * resumes zero-filled; one switched away from it loses its copies.
 */
int gmb__mem_set_mode(struct gmb__mem *m, const char *name, int mode, char *err)
{
	struct gmb__tag *t;
	bool created;
	int rc;

	if (!name)
		name = "default";
	if (mode < GMB_MODE_DISCARD || mode > GMB_MODE_PRESERVE)
		return err_fmt(err, -EINVAL, "unknown mode %d (want 0 discard, 1 zero, 2 preserve)",
			       mode);
	rc = mem_check_name(name, err);
	if (rc == 0)
		rc = mem_tag_get(m, name, &t, &created, err);
	if (rc < 0)
		return rc;
	rc = mem_send_mode(m, name, mode, err);
	if (rc < 0)
		goto out_tag;
	if (mode != GMB_MODE_PRESERVE)
		mem_backup_free_tag(m, t);
	t->mode = mode;
	gmb__backup_prep_tag(m->be, &m->bufs, t);
	return 0;

out_tag:
	if (created)
		mem_tag_drop(m, t);
	return rc;
}

/* The connection's callbacks (reader thread, no op_lock), init, close. */

/* One handle more for the IPC open in progress; the state lock is held. */
static int mem_stage(struct gmb__mem *m, uint64_t id, uint64_t h, uint64_t size)
{
	if (m->nstaged == m->cap_staged) {
		size_t cap = m->cap_staged ? m->cap_staged * 2 : 16;
		struct gmb__staged *v = realloc(m->staged, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		m->staged = v;
		m->cap_staged = cap;
	}
	m->staged[m->nstaged++] = (struct gmb__staged){ .id = id, .handle = h, .size = size };
	return 0;
}

void gmb__mem_staged_take(struct gmb__mem *m, struct gmb__staged **out, size_t *n)
{
	pthread_mutex_lock(&m->conn->lock);
	*out = m->staged;
	*n = m->nstaged;
	m->staged = NULL;
	m->nstaged = m->cap_staged = 0;
	pthread_mutex_unlock(&m->conn->lock);
}

void gmb__mem_staged_clear(struct gmb__mem *m)
{
	struct gmb__staged *v;
	size_t n;

	gmb__mem_staged_take(m, &v, &n);
	for (size_t i = 0; i < n; i++)
		m->be->ops->chunk_release(m->be, v[i].handle);
	free(v);
}

/*
 * Imports the chunk fds of reply part @env into the handle cache, or those
 * of an IPC open's reply aside for that open; the fds stay the caller's.
 */
static void mem_import(void *arg, const Gmb__Envelope *env, const int *fds, int nfds,
		       struct gmb__reply *rep)
{
	struct gmb__mem *m = arg;
	struct gmb__handle *rel = NULL;
	struct backend *be;

	pthread_mutex_lock(&m->conn->lock);
	be = m->be;
	pthread_mutex_unlock(&m->conn->lock);
	for (int i = 0; i < nfds; i++) {
		uint64_t id = env->fd_chunks[i], h;
		int rc;

		if (!be) {
			gmb__reply_import_fail(rep, -EPROTO,
					       "gmbd sent a chunk before any allocation", id);
			continue;
		}
		rc = be->ops->chunk_import(be, fds[i], env->fd_sizes[i], &h);
		if (rc < 0) {
			gmb__reply_import_fail(rep, rc, backend_last_error(), id);
			continue;
		}
		pthread_mutex_lock(&m->conn->lock);
		if (env->body_case == GMB__ENVELOPE__BODY_IPC_OPEN_REPLY)
			rc = mem_stage(m, id, h, env->fd_sizes[i]);
		else
			rc = gmb__cache_put(&m->tab, id, h, env->fd_sizes[i], &rel);
		pthread_mutex_unlock(&m->conn->lock);
		if (rc < 0) {
			be->ops->chunk_release(be, h);
			gmb__reply_import_fail(rep, rc, strerror(-rc), id);
		}
	}
	gmb__cache_release_run(be, rel);
}

/* gmbd's DropRequest. */
static int mem_drop(void *arg, const uint64_t *ids, size_t n, char *err)
{
	struct gmb__mem *m = arg;
	struct gmb__handle *rel = NULL;
	struct backend *be;
	int rc;

	pthread_mutex_lock(&m->conn->lock);
	be = m->be;
	rc = gmb__cache_drop(&m->tab, ids, n, &rel, err);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(be, rel);
	return rc;
}

void gmb__mem_init(struct gmb__mem *m, struct gmb__conn *conn)
{
	*m = (struct gmb__mem){ .conn = conn, .devs = &conn->devs, .pack = GMB_PACK_HOOKS };
}

void gmb__mem_cbs(struct gmb__mem *m, struct gmb__conn_cbs *cbs)
{
	cbs->mem_arg = m;
	cbs->import = mem_import;
	cbs->drop = mem_drop;
}

/** gmb__mem_deinit() - free every tag, allocation and handle; close the backend. */
void gmb__mem_deinit(struct gmb__mem *m)
{
	struct gmb__handle *rel = NULL;
	struct gmb__tag *t;

	while ((t = m->tags)) {
		struct gmb__alloc *a;

		while ((a = t->allocs)) {
			mem_tag_unlink(t, a);
			mem_alloc_destroy(m, a);
		}
		m->tags = t->next;
		free(t);
	}
	if (m->be) {
		gmb__backup_bufs_free(m->be, &m->bufs);
		gmb__mem_staged_clear(m);
	}
	gmb__cache_clear(&m->tab, &rel);
	gmb__cache_release_run(m->be, rel);
	idmap_deinit(&m->tab.by_id);
	idmap_deinit(&m->tab.by_va);
	idmap_deinit(&m->pieces);
	backend_close(m->be);
	m->be = NULL;
}
