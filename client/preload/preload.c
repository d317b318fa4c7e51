/*
 * preload.c - libgmb_preload.so, the LD_PRELOAD shim: routes the CUDA
 * runtime's device allocations made inside a region (client/lib/hook/) to
 * gmbd, and everything else to the real runtime. This file is the shim's
 * core: the real functions and how they are found, libgmb's binding, the
 * allocation overrides, gmb_preload_version/error and torch_memory_saver's
 * forwarders. ipc.c answers the calls of memory shared between processes
 * and the entry point lookups; shim.h is what the two share. client/preload/
 * includes include/gmb.h (for the types of what it looks up), common/env.h
 * and common/err.h, whose env.c and err.c are linked into it.
 *
 * Covered here: cudaMalloc and cudaFree (PyTorch's caching allocator,
 * including the private pools of CUDA graphs, which it fills with
 * cudaMalloc under a relaxed capture mode), cudaMallocAsync and
 * cudaFreeAsync (PyTorch's cudaMallocAsync backend) outside stream capture;
 * in ipc.c, the runtime's cudaIpc*MemHandle and the driver's
 * cuIpc*MemHandle for gmbd memory and gmbd's handles, and the entry point
 * lookups of those names. Not covered: memory the driver API makes directly
 * (PyTorch's expandable segments, NCCL's cuMem buffers), cudaMallocManaged,
 * cudaMallocPitch/3D, the _ptsz variants (of the lookups too); whatever
 * does not reach the process's global symbols: a library that dlopen()s
 * libcuda and dlsym()s on that handle (or calls the cuGetProcAddress it
 * found there), a statically linked cudart, and the functions of a
 * cuGetProcAddress looked up through a lookup (the driver's own).
 *
 * Invariants:
 *   - No link-time tie to libcudart, libcuda or libgmb: a preloaded library
 *     whose NEEDED entry cannot be resolved kills every process it is
 *     preloaded into. The real runtime functions come from dlsym(RTLD_NEXT),
 *     and so do the driver's when the process links libcuda; when it does
 *     not (libcudart loads libcuda RTLD_LOCAL, out of dlsym's sight), the
 *     runtime's entry point lookup gives them, at the ABI version the shim
 *     calls them with (shim_real_sym(), for every file of the shim);
 *     libgmb is the copy already loaded in the process (by Python's gmb
 *     module or the application: dlopen of its soname with RTLD_NOLOAD), or,
 *     when $GMB_DEFAULT_TAG asks for broker memory from the first
 *     allocation (or $TMS_INIT_ENABLE, torch_memory_saver's equivalent),
 *     $GMB_LIB or the libgmb.so next to this file. torch_memory_saver's C
 *     entry points (tms_pause, ...) are forwarders to that libgmb. So the shim,
 *     Python and PyTorch's pluggable allocator share one libgmb, one
 *     default client and one region stack per thread.
 *   - The connection to gmbd is made on the first allocation in a region.
 *   - Nothing in the shim exits, aborts or prints: a failure is a
 *     cudaError_t (gmbd's ENOMEM is cudaErrorMemoryAllocation, so PyTorch
 *     frees its cache and retries), or a CUresult in the driver's calls,
 *     and a sentence in gmb_region_last_error() (libgmb) or
 *     gmb_preload_error() (this file: libgmb, the runtime or the driver not
 *     found).
 *   - A pointer is gmbd's if the default client owns it, whichever thread
 *     and region frees it; its free drains the device first (gmb_free
 *     does, once), as the runtime's cudaFree does.
 *   - Outside regions the added cost is atomic loads: libgmb announces
 *     itself from its constructor (gmb_preload_attach), so the shim never
 *     probes for it; dlopen is only called with no lock of ours held.
 * Thread-safety: the resolved functions are published once with atomics;
 * the rest is per call or per thread.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/preload/shim.h"
#include "common/env.h"
#include "common/err.h"
#include "include/gmb.h"

/*
 * A real function: its symbol; for the driver's, the name its entry point
 * lookups take, the ABI version the shim calls (the PFN_ typedef's suffix
 * in cudaTypedefs.h) and that of the next ABI of the name (0: none), past
 * which a lookup by the runtime's own version gives the other one.
 */
struct shim_real_def {
	const char *name;
	const char *base;
	int version, until;
};

static const struct shim_real_def shim_reals[SHIM_NREAL] = {
	[SHIM_MALLOC] = { .name = "cudaMalloc" },
	[SHIM_FREE] = { .name = "cudaFree" },
	[SHIM_GET_DEVICE] = { .name = "cudaGetDevice" },
	[SHIM_SYNC] = { .name = "cudaDeviceSynchronize" },
	[SHIM_MALLOC_ASYNC] = { .name = "cudaMallocAsync" },
	[SHIM_FREE_ASYNC] = { .name = "cudaFreeAsync" },
	[SHIM_IS_CAPTURING] = { .name = "cudaStreamIsCapturing" },
	[SHIM_IPC_GET] = { .name = "cudaIpcGetMemHandle" },
	[SHIM_IPC_OPEN] = { .name = "cudaIpcOpenMemHandle" },
	[SHIM_IPC_CLOSE] = { .name = "cudaIpcCloseMemHandle" },
	[SHIM_RT_VERSION] = { .name = "cudaRuntimeGetVersion" },
	[SHIM_ENTRY] = { .name = "cudaGetDriverEntryPoint" },
	[SHIM_ENTRY_BY_VERSION] = { .name = "cudaGetDriverEntryPointByVersion" },
	[SHIM_CU_IPC_GET] = { "cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010, 0 },
	[SHIM_CU_IPC_OPEN] = { "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", 11000, 0 },
	[SHIM_CU_IPC_OPEN_V1] = { "cuIpcOpenMemHandle", "cuIpcOpenMemHandle", 4010, 11000 },
	[SHIM_CU_IPC_CLOSE] = { "cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 4010, 0 },
	[SHIM_CU_CTX_GET_DEVICE] = { "cuCtxGetDevice", "cuCtxGetDevice", 2000, 13000 },
	[SHIM_CU_GPA] = { "cuGetProcAddress_v2", "cuGetProcAddress", 12000, 0 },
	[SHIM_CU_GPA_V1] = { "cuGetProcAddress", "cuGetProcAddress", 11030, 12000 },
};

static _Atomic(void *) shim_real[SHIM_NREAL];
/*
 * libgmb's functions, published once (malloc'd, never freed). Until then,
 * shim_gmb_anchor is an address inside a libgmb that announced itself from
 * its constructor (gmb_preload_attach), not yet looked up.
 */
static _Atomic(const struct shim_gmb *) shim_gmb_fns;
static _Atomic(const void *) shim_gmb_anchor;
/* $GMB_DEFAULT_TAG, read once as libgmb does: -1 not yet, else 0 or 1. */
static atomic_int shim_default_tag_set = -1;
static __thread char shim_error[ERR_MSG_MAX];
static const char shim_anchor;

/* Errors. */

/* gmbd's -errno as the runtime's nearest status. */
cudaError_t shim_status(int rc)
{
	switch (rc) {
	case 0:
		return cudaSuccess;
	case -ENOMEM:
		return cudaErrorMemoryAllocation;
	case -EBUSY:
		return cudaErrorNotPermitted; /* the tag is paused */
	case -EINVAL:
	case -ENAMETOOLONG:
		return cudaErrorInvalidValue;
	case -ENODEV:
		return cudaErrorInvalidDevice;
	case -ENOENT:
	case -ECONNREFUSED:
	case -ENOTCONN:
	case -ECONNRESET:
	case -EPIPE:
		return cudaErrorDevicesUnavailable; /* no gmbd, or it went away */
	case -ENOSYS:
		return cudaErrorInitializationError;
	default:
		return cudaErrorUnknown;
	}
}

/* The real runtime and driver. */

/* The runtime's version (cudaRuntimeGetVersion), 0 when unknown. */
int shim_runtime_version(void)
{
	int v = 0;

	return SHIM_CALL(SHIM_RT_VERSION, shim_rt_version_fn, &v) == cudaSuccess ? v : 0;
}

/*
 * The driver's function @d asked of the runtime, or NULL: at its ABI
 * version when the runtime looks up by version (CUDA 12.5 on), else by the
 * runtime's own version when that one picks @d's ABI. Before CUDA 12.0 the
 * versionless lookup had no status argument: its answer says.
 */
static void *shim_runtime_entry(const struct shim_real_def *d)
{
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	void *p = NULL;
	cudaError_t r;
	int rtv;

	r = SHIM_CALL(SHIM_ENTRY_BY_VERSION, shim_entry_by_version_fn, d->base, &p,
		      (unsigned int)d->version, cudaEnableDefault, &q);
	if (r == cudaSuccess && q == cudaDriverEntryPointSuccess && p)
		return p;
	rtv = shim_runtime_version();
	if (rtv < d->version || (d->until && rtv >= d->until))
		return NULL;
	p = NULL;
	r = SHIM_CALL(SHIM_ENTRY, shim_entry_fn, d->base, &p, cudaEnableDefault, &q);
	return r == cudaSuccess ? p : NULL;
}

/*
 * The next definition of @fn after this library or, for the driver's, the
 * runtime's entry point; NULL (retried next time) when neither is there.
 */
void *shim_real_sym(enum shim_real_fn fn)
{
	const struct shim_real_def *d = &shim_reals[fn];
	void *p = atomic_load_explicit(&shim_real[fn], memory_order_acquire);

	if (p)
		return p;
	p = dlsym(RTLD_NEXT, d->name);
	if (!p && d->base)
		p = shim_runtime_entry(d);
	if (!p) {
		err_fmt(shim_error, 0, "%s: no CUDA %s after libgmb_preload.so in the process",
			d->name, d->base ? "driver (nor a runtime that has it)" : "runtime");
		return NULL;
	}
	atomic_store_explicit(&shim_real[fn], p, memory_order_release);
	return p;
}

/* libgmb. */

/* Broker memory from the first allocation: load libgmb if nobody did. */
static bool shim_default_tag(void)
{
	int set = atomic_load_explicit(&shim_default_tag_set, memory_order_relaxed);
	const char *t;

	if (set >= 0)
		return set;
	t = getenv("GMB_DEFAULT_TAG");
	set = (t && *t) || env_true("TMS_INIT_ENABLE");
	atomic_store_explicit(&shim_default_tag_set, set, memory_order_relaxed);
	return set;
}

static int shim_gmb_bind(void *h, struct shim_gmb *fns)
{
	static const char *const names[] = { "gmb_region_current", "gmb_region_malloc",
					     "gmb_owns",	   "gmb_default_client",
					     "gmb_free",	   "gmb_ipc_get_handle",
					     "gmb_ipc_open",	   "gmb_ipc_close" };
	void *syms[sizeof(names) / sizeof(names[0])];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		syms[i] = dlsym(h, names[i]);
		if (!syms[i]) {
			err_fmt(shim_error, 0, "libgmb lacks %s: an older libgmb?", names[i]);
			return -ENOSYS;
		}
	}
	memcpy(&fns->region_current, &syms[0], sizeof(void *));
	memcpy(&fns->region_malloc, &syms[1], sizeof(void *));
	memcpy(&fns->owns, &syms[2], sizeof(void *));
	memcpy(&fns->default_client, &syms[3], sizeof(void *));
	memcpy(&fns->free, &syms[4], sizeof(void *));
	memcpy(&fns->ipc_get_handle, &syms[5], sizeof(void *));
	memcpy(&fns->ipc_open, &syms[6], sizeof(void *));
	memcpy(&fns->ipc_close, &syms[7], sizeof(void *));
	return 0;
}

/* libgmb.so from $GMB_LIB (only there when set), else next to this file. */
static void *shim_gmb_open(void)
{
	const char *env = getenv("GMB_LIB");
	char path[PATH_MAX];
	Dl_info info;
	void *h;

	if (env && *env) {
		h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
		if (!h)
			err_fmt(shim_error, 0, "GMB_LIB=%s: %s", env, dlerror());
		return h;
	}
	if (dladdr(&shim_anchor, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
		int n = (int)(strrchr(info.dli_fname, '/') - info.dli_fname);

		snprintf(path, sizeof(path), "%.*s/libgmb.so", n, info.dli_fname);
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (h)
			return h;
	}
	h = dlopen("libgmb.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		err_fmt(shim_error, 0,
			"libgmb not found next to libgmb_preload.so nor as libgmb.so.0 "
			"(set GMB_LIB): %s",
			dlerror());
	return h;
}

/*
 * Publishes the functions of libgmb's handle @h (owned by the caller) and
 * returns what is published: threads may race here, the first one wins and
 * the others use its table. No lock: dlopen and dlsym take the loader's.
 */
static const struct shim_gmb *shim_gmb_publish(void *h)
{
	struct shim_gmb *fns = malloc(sizeof(*fns));
	const struct shim_gmb *won = NULL;

	if (!fns) {
		err_fmt(shim_error, 0, "out of memory binding libgmb");
		return NULL;
	}
	if (shim_gmb_bind(h, fns) < 0) {
		free(fns);
		return NULL;
	}
	fns->handle = h;
	if (atomic_compare_exchange_strong_explicit(&shim_gmb_fns, &won, fns, memory_order_acq_rel,
						    memory_order_acquire))
		return fns;
	free(fns);
	return won;
}

/* Looks up the libgmb that announced itself, or loads one when @load. */
static const struct shim_gmb *shim_gmb_find(bool load)
{
	const void *anchor = atomic_load_explicit(&shim_gmb_anchor, memory_order_acquire);
	const struct shim_gmb *g = NULL;
	Dl_info info;
	void *h = NULL;

	/* The announced file, by the name it was loaded under (a reference, kept). */
	if (anchor && dladdr(anchor, &info) && info.dli_fname)
		h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
	if (!h && load)
		h = shim_gmb_open();
	if (h)
		g = shim_gmb_publish(h);
	/* An announcement that cannot be bound is not looked up on every call. */
	if (!g && anchor)
		atomic_compare_exchange_strong(&shim_gmb_anchor, &anchor, NULL);
	if (h && g != atomic_load_explicit(&shim_gmb_fns, memory_order_acquire))
		dlclose(h);
	return atomic_load_explicit(&shim_gmb_fns, memory_order_acquire);
}

/*
 * The process's libgmb, or NULL. Loaded here only when @load; otherwise
 * only found if it was loaded (a region needs libgmb's API to begin), and
 * then libgmb said so from its constructor. Outside regions in a process
 * that never loads libgmb this is two atomic loads: no lock, no dlopen.
 */
const struct shim_gmb *shim_gmb(bool load)
{
	const struct shim_gmb *g = atomic_load_explicit(&shim_gmb_fns, memory_order_acquire);

	if (g || (!load && !atomic_load_explicit(&shim_gmb_anchor, memory_order_acquire)))
		return g;
	return shim_gmb_find(load);
}

/*
 * Called by libgmb's constructor when it is loaded into a process with this
 * shim (while the loader's lock is held: only a store here). @anchor is an
 * address inside it.
 */
SHIM_API void gmb_preload_attach(const void *anchor);

SHIM_API void gmb_preload_attach(const void *anchor)
{
	if (anchor)
		atomic_store_explicit(&shim_gmb_anchor, anchor, memory_order_release);
}

/*
 * 1 when this thread's allocation belongs to gmbd, 0 when it goes to the
 * runtime, or a cudaError_t (negated) when it cannot be decided.
 */
static int shim_in_region(const struct shim_gmb **g)
{
	bool want = shim_default_tag();
	int rc;

	*g = shim_gmb(want);
	if (!*g)
		return want ? -(int)cudaErrorInitializationError : 0;
	rc = (*g)->region_current(NULL, 0, NULL);
	return rc < 0 ? -(int)shim_status(rc) : rc;
}

/* A region allocation on the current device. */
static cudaError_t shim_broker_malloc(const struct shim_gmb *g, void **ptr, size_t size)
{
	int dev = 0;
	cudaError_t r;

	/* cudaMalloc(p, 0) succeeds with NULL; gmbd has no empty allocations. */
	if (size == 0) {
		*ptr = NULL;
		return cudaSuccess;
	}
	r = SHIM_CALL(SHIM_GET_DEVICE, shim_get_device_fn, &dev);
	if (r != cudaSuccess)
		return r;
	return shim_status(g->region_malloc(NULL, ptr, size, dev));
}

/* 1 if @ptr is gmbd's (then *@g is set), else 0. */
static int shim_is_broker(void *ptr, const struct shim_gmb **g)
{
	*g = ptr ? shim_gmb(false) : NULL;
	return *g && (*g)->owns(NULL, ptr) == 1;
}

static cudaError_t shim_broker_free(const struct shim_gmb *g, void *ptr)
{
	gmb_client *c;
	int rc;

	/*
	 * The runtime's cudaFree waits for the device; gmb_free does the same
	 * (it drains the allocation's device before unmapping), so once.
	 */
	rc = g->default_client(NULL, NULL, &c);
	if (rc >= 0)
		rc = g->free(c, ptr);
	return shim_status(rc);
}

/* The overrides. */

SHIM_API cudaError_t cudaMalloc(void **ptr, size_t size)
{
	const struct shim_gmb *g;
	int in;

	if (!ptr)
		return cudaErrorInvalidValue;
	in = shim_in_region(&g);
	if (in < 0)
		return (cudaError_t)-in;
	if (in == 0)
		return SHIM_CALL(SHIM_MALLOC, shim_malloc_fn, ptr, size);
	return shim_broker_malloc(g, ptr, size);
}

SHIM_API cudaError_t cudaFree(void *ptr)
{
	const struct shim_gmb *g;

	if (shim_is_broker(ptr, &g))
		return shim_broker_free(g, ptr);
	return SHIM_CALL(SHIM_FREE, shim_free_fn, ptr);
}

/* Capturing streams record allocations as graph nodes: leave them to the runtime. */
static int shim_capturing(cudaStream_t stream)
{
	enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
	cudaError_t r = SHIM_CALL(SHIM_IS_CAPTURING, shim_is_capturing_fn, stream, &st);

	return r != cudaSuccess ? -(int)r : st != cudaStreamCaptureStatusNone;
}

SHIM_API cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
	const struct shim_gmb *g;
	int in, cap;

	if (!ptr)
		return cudaErrorInvalidValue;
	in = shim_in_region(&g);
	if (in < 0)
		return (cudaError_t)-in;
	cap = in ? shim_capturing(stream) : 0;
	if (cap < 0)
		return (cudaError_t)-cap;
	if (in == 0 || cap)
		return SHIM_CALL(SHIM_MALLOC_ASYNC, shim_malloc_async_fn, ptr, size, stream);
	return shim_broker_malloc(g, ptr, size);
}

SHIM_API cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
	const struct shim_gmb *g;
	int cap;

	if (!shim_is_broker(ptr, &g))
		return SHIM_CALL(SHIM_FREE_ASYNC, shim_free_async_fn, ptr, stream);
	/* gmbd's free waits for the device, which a capture cannot record. */
	cap = shim_capturing(stream);
	if (cap < 0)
		return (cudaError_t)-cap;
	if (cap) {
		err_fmt(shim_error, 0, "cudaFreeAsync of gmbd memory %p on a capturing stream",
			ptr);
		return cudaErrorStreamCaptureUnsupported;
	}
	return shim_broker_free(g, ptr);
}

/*
 * For Python's gmb module (found with dlsym(RTLD_DEFAULT)): the shim's
 * version, present only when it is preloaded, and why it last failed on the
 * calling thread.
 */
SHIM_API const char *gmb_preload_version(void);
SHIM_API const char *gmb_preload_error(void);

SHIM_API const char *gmb_preload_version(void)
{
	return GMB_VERSION;
}

SHIM_API const char *gmb_preload_error(void)
{
	return shim_error;
}

/*
 * torch_memory_saver's C entry points (its preload library's names and C
 * types), forwarded to the process's libgmb, loaded here if nobody did: a
 * C/C++ caller of the peer, or ctypes.CDLL(None), finds them in the shim.
 * Without libgmb the getters answer as outside any region and tms_pause /
 * tms_resume return cudaErrorInitializationError (why: gmb_preload_error()).
 */

/* @name in libgmb, or NULL. */
static void *shim_tms_sym(const char *name)
{
	const struct shim_gmb *g = shim_gmb(true);
	void *p;

	if (!g)
		return NULL;
	p = dlsym(g->handle, name);
	if (!p)
		err_fmt(shim_error, 0, "libgmb lacks %s: an older libgmb?", name);
	return p;
}

#define SHIM_TMS(ret, name, params, args, fail)   \
	SHIM_API ret name params;                 \
	SHIM_API ret name params                  \
	{                                         \
		void *sym_ = shim_tms_sym(#name); \
		ret(*f_) params;                  \
                                                  \
		if (!sym_)                        \
			return fail;              \
		memcpy(&f_, &sym_, sizeof(f_));   \
		return f_ args;                   \
	}

#define SHIM_TMS_VOID(name, params, args)         \
	SHIM_API void name params;                \
	SHIM_API void name params                 \
	{                                         \
		void *sym_ = shim_tms_sym(#name); \
		void(*f_) params;                 \
                                                  \
		if (!sym_)                        \
			return;                   \
		memcpy(&f_, &sym_, sizeof(f_));   \
		f_ args;                          \
	}

SHIM_TMS_VOID(tms_set_interesting_region, (bool on), (on))
SHIM_TMS(bool, tms_get_interesting_region, (void), (), false)
SHIM_TMS_VOID(tms_set_current_tag, (const char *tag), (tag))
SHIM_TMS(const char *, tms_get_current_tag, (void), (), "default")
SHIM_TMS_VOID(tms_set_enable_cpu_backup, (bool on), (on))
SHIM_TMS(bool, tms_get_enable_cpu_backup, (void), (), false)
SHIM_TMS_VOID(tms_set_cpu_backup_backend, (const char *name), (name))
SHIM_TMS(const char *, tms_get_cpu_backup_backend, (void), (), "pinned")
SHIM_TMS_VOID(tms_set_enable_disk_backup, (bool on), (on))
SHIM_TMS(bool, tms_get_enable_disk_backup, (void), (), false)
SHIM_TMS_VOID(tms_set_disk_backup_dir, (const char *dir), (dir))
SHIM_TMS_VOID(set_memory_margin_bytes, (uint64_t bytes), (bytes))
SHIM_TMS_VOID(tms_set_retain_cpu_backup, (bool on), (on))
SHIM_TMS(bool, tms_get_retain_cpu_backup, (void), (), false)
SHIM_TMS(int, tms_pause, (const char *tag), (tag), (int)cudaErrorInitializationError)
SHIM_TMS(int, tms_resume, (const char *tag), (tag), (int)cudaErrorInitializationError)
/* cudaStream_t is a pointer: gmb.h spells it void * so as not to need the runtime. */
SHIM_TMS(uint8_t *, tms_get_cpu_backup_pointer, (const uint8_t *gpu_ptr, uint64_t size),
	 (gpu_ptr, size), NULL)
SHIM_TMS(void *, tms_torch_malloc, (ssize_t size, int device, void *stream), (size, device, stream),
	 NULL)
SHIM_TMS_VOID(tms_torch_free, (void *ptr, ssize_t size, int device, void *stream),
	      (ptr, size, device, stream))
