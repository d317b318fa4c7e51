/*
 * hook.c - what allocation hooks need from libgmb: the process's default
 * client, allocation in the current region's tag, ownership and host-copy
 * queries, the memory margin, and PyTorch's pluggable allocator entry points
 * (gmb_torch_malloc / gmb_torch_free).
 *
 * The default client is made once, on the first call that needs it, under
 * hook_lock, and published through an atomic pointer so that the hot path
 * (gmb_owns() on every cudaFree) takes no process-wide lock. It is never
 * closed: gmbd takes the memory back when the process exits. A forked child
 * forgets it (the connection and its threads belong to the parent).
 *
 * These functions run inside other allocators (the preload shim's cudaMalloc,
 * PyTorch's caching allocator with its own lock held); they never call back
 * into CUDA's runtime except gmb_torch_* outside a region, which hands the
 * call to the process's cudaMalloc/cudaFree. Failures leave a sentence in
 * gmb_region_last_error() of the calling thread. Thread-safe.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/hook.h"
#include "client/internal.h"

/* cudaMalloc's status for "out of memory" (driver_types.h, a stable ABI). */
#define HOOK_CUDA_OOM 2

typedef int (*hook_cuda_malloc_fn)(void **ptr, size_t size);
typedef int (*hook_cuda_free_fn)(void *ptr);

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct gmb_client *) hook_client;
static pthread_once_t hook_fork_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t hook_margin;

/* The default client. */

static void hook_fork_prepare(void)
{
	pthread_mutex_lock(&hook_lock);
}

static void hook_fork_parent(void)
{
	pthread_mutex_unlock(&hook_lock);
}

/* The child has the parent's socket but none of its threads: drop (leak) it. */
static void hook_fork_child(void)
{
	struct gmb_client *c = atomic_exchange(&hook_client, NULL);

	if (c && c->sock >= 0)
		close(c->sock);
	pthread_mutex_unlock(&hook_lock);
}

static void hook_fork_install(void)
{
	pthread_atfork(hook_fork_prepare, hook_fork_parent, hook_fork_child);
}

static int hook_accept(void *arg, int op, const char *tag)
{
	return 0;
}

/* Connects with the environment's settings where @path / @name are NULL. */
static int hook_connect(const char *path, const char *name, struct gmb_client **out)
{
	const char *ctl = getenv("GMB_CONTROL");
	char dflt[WIRE_MAX_NAME + 1];
	int rc;

	if (ctl && *ctl && strcmp(ctl, "accept") != 0)
		return gmb__hook_fail(-EINVAL, "GMB_CONTROL=\"%.64s\": the only value is accept",
				      ctl);
	if (!name)
		name = getenv("GMB_CLIENT_NAME");
	if (!name || !*name) {
		snprintf(dflt, sizeof(dflt), "%.100s-%d", program_invocation_short_name,
			 (int)getpid());
		name = dflt;
	}
	rc = gmb_connect(path, name, out);
	if (rc < 0)
		return gmb__hook_fail_client(rc, NULL, "connecting the default client");
	if (ctl && *ctl)
		gmb_set_control_handler(*out, hook_accept, NULL);
	return 0;
}

GMB_API int gmb_default_client(const char *socket_path, const char *client_name,
			       gmb_client **out)
{
	struct gmb_client *c = atomic_load_explicit(&hook_client, memory_order_acquire);
	int rc = 1;

	if (!out)
		return gmb__hook_fail(-EINVAL, "no place for the client");
	if (!c) {
		pthread_once(&hook_fork_once, hook_fork_install);
		pthread_mutex_lock(&hook_lock);
		c = atomic_load_explicit(&hook_client, memory_order_relaxed);
		if (!c) {
			rc = hook_connect(socket_path, client_name, &c);
			if (rc == 0)
				atomic_store_explicit(&hook_client, c, memory_order_release);
		}
		pthread_mutex_unlock(&hook_lock);
	}
	*out = rc < 0 ? NULL : c;
	return rc;
}

/* The default client if it exists; never connects. */
static struct gmb_client *hook_client_peek(void)
{
	return atomic_load_explicit(&hook_client, memory_order_acquire);
}

/* Allocation in the current region. */

GMB_API void gmb_set_memory_margin(uint64_t bytes)
{
	atomic_store(&hook_margin, bytes);
}

/* Device @dev's budget and lent bytes, from the status document. */
static int hook_device_use(struct gmb_client *c, int dev, int64_t *budget, int64_t *used)
{
	char key[48], *json = NULL;
	const char *d;
	int rc = gmb_status_json(c, &json);

	if (rc < 0)
		return gmb__hook_fail_client(rc, c, "memory margin: reading gmbd's status");
	/* Quotes inside names are escaped, so the key can only match the object. */
	snprintf(key, sizeof(key), "{\"index\":%d,", dev);
	d = strstr(json, key);
	*budget = *used = -1;
	if (d) {
		const char *b = strstr(d, "\"budget_bytes\":"), *u = strstr(d, "\"used_bytes\":");

		*budget = b ? strtoll(b + strlen("\"budget_bytes\":"), NULL, 10) : -1;
		*used = u ? strtoll(u + strlen("\"used_bytes\":"), NULL, 10) : -1;
	}
	free(json);
	if (*budget < 0 || *used < 0)
		return gmb__hook_fail(-EPROTO, "memory margin: gmbd's status lacks device %d", dev);
	return 0;
}

/* -ENOMEM when lending @size on @dev would leave less than the margin unlent. */
static int hook_margin_check(struct gmb_client *c, size_t size, int dev)
{
	uint64_t margin = atomic_load(&hook_margin), need;
	int64_t budget = -1, used = -1;
	int rc;

	if (margin == 0)
		return 0;
	dev = gmb__mem_dev_index(c, dev, NULL);
	if (dev < 0)
		return 0; /* a bad device is gmb_malloc's to refuse */
	rc = hook_device_use(c, dev, &budget, &used);
	if (rc < 0)
		return rc;
	need = backend_round_up(size, c->granularity[dev]);
	if (used <= budget && (uint64_t)(budget - used) >= need &&
	    (uint64_t)(budget - used) - need >= margin)
		return 0;
	return gmb__hook_fail(-ENOMEM, "memory margin: device %d has %" PRId64 " bytes of its "
			      "budget unlent; %" PRIu64 " requested plus a margin of %" PRIu64
			      " do not fit", dev, budget > used ? budget - used : 0, need, margin);
}

/* Makes @tag's mode at least @want (DISCARD < ZERO, PRESERVE); ZERO vs PRESERVE: -EINVAL. */
static int hook_tag_mode(struct gmb_client *c, const char *tag, int want)
{
	struct gmb__tag *t;
	bool paused;
	int have, rc;

	pthread_mutex_lock(&c->op_lock);
	t = gmb__mem_tag_find(c, tag);
	have = t ? t->mode : GMB_MODE_DISCARD;
	paused = t && t->paused;
	pthread_mutex_unlock(&c->op_lock);
	/* A paused tag refuses the allocation anyway: leave its mode alone. */
	if (paused || want == have || want == GMB_MODE_DISCARD)
		return 0;
	if (have != GMB_MODE_DISCARD)
		return gmb__hook_fail(-EINVAL, "tag \"%s\" is in mode %s; a region asks for %s",
				      tag, gmb__mode_name(have), gmb__mode_name(want));
	rc = gmb_tag_set_mode(c, tag, want);
	if (rc < 0)
		return gmb__hook_fail_client(rc, c, "setting the region's mode");
	return 0;
}

GMB_API int gmb_region_malloc(gmb_client *c, void **ptr, size_t size, int device)
{
	char tag[WIRE_MAX_NAME + 1];
	int mode = GMB_MODE_DISCARD, rc;

	if (!ptr)
		return gmb__hook_fail(-EINVAL, "no place for the pointer");
	rc = gmb_region_current(tag, sizeof(tag), &mode);
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
	if (rc == 0)
		rc = hook_tag_mode(c, tag, mode);
	if (rc < 0)
		return rc;
	rc = gmb_malloc(c, ptr, size, device, tag);
	if (rc < 0)
		return gmb__hook_fail_client(rc, c, "allocating from gmbd");
	return 0;
}

/* Queries. */

GMB_API int gmb_owns(gmb_client *c, const void *ptr)
{
	void *a;

	if (!c)
		c = hook_client_peek();
	if (!c || !ptr)
		return 0;
	pthread_mutex_lock(&c->lock);
	a = idmap_get(&c->mem.by_va, (uintptr_t)ptr);
	pthread_mutex_unlock(&c->lock);
	return a != NULL;
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

GMB_API int gmb_host_copy(gmb_client *c, const void *ptr, size_t size, void **host)
{
	struct gmb__alloc *a;
	int rc = 0;

	if (!host)
		return gmb__hook_fail(-EINVAL, "no place for the host pointer");
	*host = NULL;
	if (!c)
		c = hook_client_peek();
	if (!c)
		return gmb__hook_fail(-ENOENT, "no default client: nothing was allocated");
	pthread_mutex_lock(&c->op_lock);
	a = hook_alloc_holding(c, (uintptr_t)ptr, size);
	if (!a)
		rc = gmb__hook_fail(-ENOENT, "no allocation holds %p + %zu", ptr, size);
	else if (a->tag->paused && (a->tag->mode != GMB_MODE_PRESERVE || !a->saved || !a->staging))
		rc = gmb__hook_fail(-ENODATA, "tag \"%s\" is paused in mode %s: no host copy",
				    a->tag->name, gmb__mode_name(a->tag->mode));
	else if (a->tag->paused)
		*host = (char *)a->staging + ((uintptr_t)ptr - a->va);
	pthread_mutex_unlock(&c->op_lock);
	return rc;
}

/* PyTorch's pluggable allocator. */

/* @name from the CUDA runtime the process has loaded, or NULL. */
static void *hook_runtime_sym(const char *name)
{
	return dlsym(RTLD_DEFAULT, name);
}

static int hook_runtime_malloc(void **p, size_t size)
{
	void *sym = hook_runtime_sym("cudaMalloc");
	hook_cuda_malloc_fn fn;
	int r;

	if (!sym)
		return gmb__hook_fail(-ENOSYS, "outside a region, but no cudaMalloc in the process");
	/* POSIX guarantees a void * holds a function pointer (dlsym). */
	memcpy(&fn, &sym, sizeof(fn));
	r = fn(p, size);
	if (r == 0)
		return 0;
	return gmb__hook_fail(r == HOOK_CUDA_OOM ? -ENOMEM : -EIO,
			      "cudaMalloc of %zu bytes returned %d", size, r);
}

GMB_API void *gmb_torch_malloc(ssize_t size, int device, void *stream)
{
	void *p = NULL;
	int rc;

	if (size <= 0) {
		gmb__hook_fail(-EINVAL, "allocation of %zd bytes", size);
		return NULL;
	}
	rc = gmb_region_current(NULL, 0, NULL);
	if (rc > 0)
		rc = gmb_region_malloc(NULL, &p, (size_t)size, device);
	else if (rc == 0)
		rc = hook_runtime_malloc(&p, (size_t)size);
	return rc == 0 ? p : NULL;
}

GMB_API void gmb_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
	struct gmb_client *c = hook_client_peek();
	hook_cuda_free_fn fn;
	void *sym;
	int rc;

	if (!ptr)
		return;
	/* Freed wherever PyTorch frees it: ownership, not the region, decides. */
	if (gmb_owns(c, ptr)) {
		rc = gmb_free(c, ptr);
		if (rc < 0)
			gmb__hook_fail_client(rc, c, "freeing a gmbd allocation");
		return;
	}
	sym = hook_runtime_sym("cudaFree");
	if (!sym) {
		gmb__hook_fail(-ENOSYS, "freeing %p: no cudaFree in the process", ptr);
		return;
	}
	memcpy(&fn, &sym, sizeof(fn));
	rc = fn(ptr);
	if (rc != 0)
		gmb__hook_fail(-EIO, "cudaFree(%p) returned %d", ptr, rc);
}

/* Where this library lives, for CUDAPluggableAllocator and the preload shim. */

static const char hook_anchor;
static char hook_path[PATH_MAX];
static pthread_once_t hook_path_once = PTHREAD_ONCE_INIT;

/* Absolute, so that a later chdir does not break dlopen of the same file. */
static void hook_path_find(void)
{
	Dl_info info;

	ssize_t n;

	if (!dladdr(&hook_anchor, &info) || !info.dli_fname)
		return;
	if (realpath(info.dli_fname, hook_path))
		return;
	/* Linked into the program itself: glibc names it by argv[0]. */
	n = readlink("/proc/self/exe", hook_path, sizeof(hook_path) - 1);
	hook_path[n > 0 ? n : 0] = 0;
}

GMB_API const char *gmb_library_path(void)
{
	pthread_once(&hook_path_once, hook_path_find);
	return hook_path;
}
