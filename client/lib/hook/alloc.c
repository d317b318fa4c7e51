/*
 * alloc.c - allocation hooks in the current region: gmb_region_malloc()
 * with the memory margin and the region's mode, and the ownership and
 * host-copy queries (gmb_owns(), gmb_host_copy()).
 *
 * These functions run inside other allocators (the preload shim's
 * cudaMalloc, PyTorch's caching allocator with its own lock held); they
 * never call back into CUDA's runtime. Failures leave a sentence in
 * gmb_region_last_error() of the calling thread. Thread-safe.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/api/client.h"
#include "client/lib/hook/hook.h"

static _Atomic uint64_t hook_margin;

/* Allocation in the current region. */

GMB_API void gmb_set_memory_margin(uint64_t bytes)
{
	atomic_store(&hook_margin, bytes);
}

/* -ENOMEM when lending @size on @dev would leave less than the margin unlent. */
static int hook_margin_check(struct gmb_client *c, size_t size, int dev)
{
	uint64_t margin = atomic_load(&hook_margin), need, budget, used;
	int rc;

	if (margin == 0)
		return 0;
	dev = gmb__mem_dev_index(&c->mem, dev, NULL);
	if (dev < 0)
		return 0; /* a bad device is gmb_malloc's to refuse */
	rc = gmb__status_device(c, (uint32_t)dev, &budget, &used);
	if (rc == -ENODEV)
		return err_fmt(gmb__hook_err(), -EPROTO,
			       "memory margin: gmbd's status lacks device %d", dev);
	if (rc < 0)
		return gmb__hook_fail_client(rc, c, "memory margin: reading gmbd's status");
	need = backend_round_up(size, c->conn.devs.granularity[dev]);
	if (used <= budget && (uint64_t)(budget - used) >= need &&
	    (uint64_t)(budget - used) - need >= margin)
		return 0;
	return err_fmt(gmb__hook_err(), -ENOMEM,
		       "memory margin: device %d has %" PRIu64 " bytes of"
		       " its budget unlent; %" PRIu64 " requested plus a margin of %" PRIu64
		       " do not fit",
		       dev, budget > used ? budget - used : 0, need, margin);
}

/* Makes @tag's mode at least @want (DISCARD < ZERO, PRESERVE); ZERO vs PRESERVE: -EINVAL. */
static int hook_tag_mode(struct gmb_client *c, const char *tag, int want)
{
	struct gmb__tag *t;
	bool paused;
	int have, rc;

	pthread_mutex_lock(&c->conn.op_lock);
	t = gmb__mem_tag_find(&c->mem, tag);
	have = t ? t->mode : GMB_MODE_DISCARD;
	paused = t && t->paused;
	pthread_mutex_unlock(&c->conn.op_lock);
	/* A paused tag refuses the allocation anyway: leave its mode alone. */
	if (paused || want == have || want == GMB_MODE_DISCARD)
		return 0;
	if (have != GMB_MODE_DISCARD)
		return err_fmt(gmb__hook_err(), -EINVAL,
			       "tag \"%s\" is in mode %s; a region asks for %s", tag,
			       gmb__mode_name(have), gmb__mode_name(want));
	rc = gmb_tag_set_mode(c, tag, want);
	if (rc < 0)
		return gmb__hook_fail_client(rc, c, "setting the region's mode");
	return 0;
}

GMB_API int gmb_region_malloc(gmb_client *c, void **ptr, size_t size, int device)
{
	struct gmb__mem_how how = { .mode = GMB_MODE_DISCARD, .backup = GMB_BACKUP_DEFAULT };
	char tag[WIRE_MAX_NAME + 1];
	int rc;

	if (!ptr)
		return err_fmt(gmb__hook_err(), -EINVAL, "no place for the pointer");
	rc = gmb__region_how(tag, sizeof(tag), &how);
	if (rc < 0)
		return rc;
	if (rc == 0)
		snprintf(tag, sizeof(tag), "default");
	if (!c) {
		rc = gmb_default_client(NULL, NULL, &c);
		if (rc < 0)
			return rc;
	}
	rc = hook_margin_check(c, size, device);
	/* A region of its own leaves the tag's mode alone: the allocation keeps its own. */
	if (rc == 0 && !how.own)
		rc = hook_tag_mode(c, tag, how.mode);
	if (rc < 0)
		return rc;
	rc = gmb__malloc_how(c, ptr, size, device, tag, how.own ? &how : NULL, 0, GMB__PACK_HOOK);
	if (rc < 0)
		return gmb__hook_fail_client(rc, c, "allocating from gmbd");
	return 0;
}

/* Queries. */

GMB_API int gmb_owns(gmb_client *c, const void *ptr)
{
	bool owns;

	if (!c)
		c = gmb__hook_client_peek();
	if (!c || !ptr)
		return 0;
	pthread_mutex_lock(&c->conn.lock);
	owns = gmb__allocs_owns(&c->mem, (uintptr_t)ptr);
	pthread_mutex_unlock(&c->conn.lock);
	return owns;
}

/* The allocation holding [p, p+size); the caller holds op_lock. */
static struct gmb__alloc *hook_alloc_holding(struct gmb_client *c, uintptr_t p, size_t size)
{
	for (struct gmb__tag *t = c->mem.tags; t; t = t->next)
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			if (p >= a->va && p - a->va <= a->size && size <= a->size - (p - a->va))
				return a;
	return NULL;
}

/* The copy of @a at @ptr, as gmb_host_copy() answers; the caller holds op_lock. */
static int hook_copy_of(struct gmb_client *c, struct gmb__alloc *a, const void *ptr, void **host)
{
	char err[ERR_MSG_MAX] = "";
	void *p;
	int rc;

	if (a->tag->paused && (gmb__alloc_mode(a) != GMB_MODE_PRESERVE || !a->saved))
		return err_fmt(gmb__hook_err(), -ENODATA,
			       "allocation %p of tag \"%s\" is paused in mode %s: no host copy",
			       (void *)a->va, a->tag->name, gmb__mode_name(gmb__alloc_mode(a)));
	/* Active: only a retained copy exists (the same one as while paused). */
	rc = gmb__backup_pointer(c->mem.be, &c->mem.bufs, a, &p, err);
	if (rc < 0)
		return err_fmt(gmb__hook_err(), rc, "%s", err);
	if (p)
		*host = (char *)p + ((uintptr_t)ptr - a->va);
	return 0;
}

GMB_API int gmb_host_copy(gmb_client *c, const void *ptr, size_t size, void **host)
{
	struct gmb__alloc *a;
	int rc;

	if (!host)
		return err_fmt(gmb__hook_err(), -EINVAL, "no place for the host pointer");
	*host = NULL;
	if (!c)
		c = gmb__hook_client_peek();
	if (!c)
		return err_fmt(gmb__hook_err(), -ENOENT,
			       "no default client: nothing was allocated");
	pthread_mutex_lock(&c->conn.op_lock);
	a = hook_alloc_holding(c, (uintptr_t)ptr, size);
	if (!a)
		rc = err_fmt(gmb__hook_err(), -ENOENT, "no allocation holds %p + %zu", ptr, size);
	else
		rc = hook_copy_of(c, a, ptr, host);
	pthread_mutex_unlock(&c->conn.op_lock);
	return rc;
}
