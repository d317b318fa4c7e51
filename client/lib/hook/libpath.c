/*
 * libpath.c - where this library lives (gmb_library_path()), for
 * CUDAPluggableAllocator and the preload shim, and telling a preloaded shim
 * that it is loaded.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/gmb.h"

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

/*
 * Tells a preloaded shim (libgmb_preload.so) that this library is loaded,
 * so that its cudaMalloc never has to look for it. Runs under the loader's
 * lock: the shim only stores the address.
 */
__attribute__((constructor)) static void hook_preload_announce(void)
{
	void *sym = dlsym(RTLD_DEFAULT, "gmb_preload_attach");
	void (*attach)(const void *anchor);

	if (!sym)
		return;
	/* POSIX guarantees a void * holds a function pointer (dlsym). */
	memcpy(&attach, &sym, sizeof(attach));
	attach(&hook_anchor);
}
