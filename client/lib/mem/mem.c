/*
 * mem.c - libgmb's memory around its allocations: the backend and gmbd's
 * devices, tags and their mode, the mapping helpers that allocs.c
 * (malloc, free) and cycle.c (pause/resume) share, the connection's
 * callbacks (chunk imports, staged IPC handles, drops), init and close.
 * The allocations themselves, made and undone, are allocs.c's: this file
 * holds what both they and a pause or resume stand on.
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

int gmb__mem_check_name(const char *name, char *err)
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
int gmb__mem_tag_get(struct gmb__mem *m, const char *name, struct gmb__tag **out, bool *created,
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

/* Undoes gmb__mem_tag_get() of a tag that is still empty. */
void gmb__mem_tag_drop(struct gmb__mem *m, struct gmb__tag *t)
{
	for (struct gmb__tag **pp = &m->tags; *pp; pp = &(*pp)->next) {
		if (*pp == t) {
			*pp = t->next;
			free(t);
			return;
		}
	}
}

void gmb__mem_tag_link(struct gmb__tag *t, struct gmb__alloc *a)
{
	DLIST_PUSH(t->allocs, a);
	t->nallocs++;
}

void gmb__mem_tag_unlink(struct gmb__tag *t, struct gmb__alloc *a)
{
	DLIST_UNLINK(t->allocs, a);
	t->nallocs--;
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

/* Releases the handles a failed request imported but no lend names. */
void gmb__mem_sweep(struct gmb__mem *m)
{
	struct gmb__handle *rel = NULL;

	pthread_mutex_lock(&m->conn->lock);
	gmb__cache_sweep(&m->tab, &rel);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
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
	rc = gmb__mem_check_name(name, err);
	if (rc == 0)
		rc = gmb__mem_tag_get(m, name, &t, &created, err);
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
		gmb__mem_tag_drop(m, t);
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
