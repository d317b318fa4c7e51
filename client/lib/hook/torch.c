/*
 * torch.c - PyTorch's pluggable allocator entry points (gmb_torch_malloc,
 * gmb_torch_free): in a region, gmbd's memory; outside one, the process's
 * own cudaMalloc/cudaFree, found at run time (libgmb needs no CUDA
 * runtime). Failures leave a sentence in gmb_region_last_error().
 */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/types.h>

#include "client/lib/hook/hook.h"

/* cudaMalloc's status for "out of memory" (driver_types.h, a stable ABI). */
#define HOOK_CUDA_OOM 2

typedef int (*hook_cuda_malloc_fn)(void **ptr, size_t size);
typedef int (*hook_cuda_free_fn)(void *ptr);

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
		return err_fmt(gmb__hook_err(), -ENOSYS,
			       "outside a region, but no cudaMalloc in the process");
	/* POSIX guarantees a void * holds a function pointer (dlsym). */
	memcpy(&fn, &sym, sizeof(fn));
	r = fn(p, size);
	if (r == 0)
		return 0;
	return err_fmt(gmb__hook_err(), r == HOOK_CUDA_OOM ? -ENOMEM : -EIO,
		       "cudaMalloc of %zu bytes returned %d", size, r);
}

GMB_API void *gmb_torch_malloc(ssize_t size, int device, void *stream)
{
	void *p = NULL;
	int rc;

	if (size <= 0) {
		err_fmt(gmb__hook_err(), -EINVAL, "allocation of %zd bytes", size);
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
	struct gmb_client *c = gmb__hook_client_peek();
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
		err_fmt(gmb__hook_err(), -ENOSYS, "freeing %p: no cudaFree in the process", ptr);
		return;
	}
	memcpy(&fn, &sym, sizeof(fn));
	rc = fn(ptr);
	if (rc != 0)
		err_fmt(gmb__hook_err(), -EIO, "cudaFree(%p) returned %d", ptr, rc);
}
