/*
 * backend_cuda.c - the "cuda" memory backend: the CUDA driver's virtual
 * memory management API (cuMemCreate, cuMemMap, ...), loaded at run time.
 *
 *   chunk        cuMemCreate, pinned device memory, exportable as a POSIX fd
 *   export       cuMemExportToShareableHandle: a new fd, CLOEXEC
 *   import       cuMemImportFromShareableHandle: the fd stays the caller's
 *   reservation  cuMemAddressReserve / cuMemAddressFree
 *   map          cuMemMap of a whole chunk at offset 0; no access until
 *   set_access   cuMemSetAccess (read-write for one device, one call)
 *   unmap        cuMemUnmap: the VA stays reserved
 *   contents     copies and memset on this backend's stream, then a wait
 *
 * Invariants:
 *   - No link-time tie to libcuda: it is dlopen'ed, and each entry point is
 *     fetched by cuGetProcAddress at the ABI version of the PFN_ typedef
 *     (cudaTypedefs.h) it is stored in, so the compiler checks every call
 *     and a newer driver cannot hand over a newer ABI (cuCtxSynchronize at
 *     13000 takes a context; at 2000 it does not).
 *   - Opening runs cuInit and device queries only: no context, so gmbd stays
 *     at cuInit's ~4 MiB of GPU memory; the VMM calls need none (GPU-FACTS).
 *   - Contents operations (sync, zero, copies, host memory) run in a
 *     device's primary context, retained on first use and released at
 *     close, pushed on the calling thread for the call and popped after.
 *   - The host backend's stateless checks are repeated (device index,
 *     granularity multiples), each refusal -EINVAL with a reason; the driver
 *     checks overlaps and whole mappings. What needs a record of handles and
 *     mappings (whole-chunk maps, unknown handles: cuMemRelease of one is
 *     undefined) is the host backend's to catch, in the tests: callers here
 *     are trusted to pass handles they hold.
 *   - One mutex guards the lazily made contexts and streams; the driver
 *     serializes a process's VMM calls anyway.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend.h"
#include "common/backend_cuda.h"
#include "common/err.h"

/*
 * Copies go in pieces queued back to back before one wait: each driver call
 * stays bounded (the driver stages a pageable buffer synchronously) while
 * the stream keeps the copy engine busy.
 */
#define CUDA_COPY_PIECE (256ULL << 20)
#define CUDA_COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define CUDA_ATTR_VMM CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
#define CUDA_ATTR_FD CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
#define CUDA_FD_HANDLE CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

/*
 * Driver entry points: field, ABI version (the PFN_ typedef's suffix, given
 * to cuGetProcAddress), and the versioned symbol for dlsym when the driver
 * has no cuGetProcAddress_v2. The boot ones are loaded before cuInit.
 */
#define CUDA_BOOT_SYMS(X)                                                                \
	X(Init, 2000, "cuInit")                                                          \
	X(GetErrorName, 6000, "cuGetErrorName")                                          \
	X(GetErrorString, 6000, "cuGetErrorString")

#define CUDA_SYMS(X)                                                                     \
	X(DeviceGetCount, 2000, "cuDeviceGetCount")                                      \
	X(DeviceGet, 2000, "cuDeviceGet")                                                \
	X(DeviceGetName, 2000, "cuDeviceGetName")                                        \
	X(DeviceTotalMem, 3020, "cuDeviceTotalMem_v2")                                   \
	X(DeviceGetAttribute, 2000, "cuDeviceGetAttribute")                              \
	X(MemGetAllocationGranularity, 10020, "cuMemGetAllocationGranularity")           \
	X(MemCreate, 10020, "cuMemCreate")                                               \
	X(MemRelease, 10020, "cuMemRelease")                                             \
	X(MemExportToShareableHandle, 10020, "cuMemExportToShareableHandle")             \
	X(MemImportFromShareableHandle, 10020, "cuMemImportFromShareableHandle")         \
	X(MemAddressReserve, 10020, "cuMemAddressReserve")                               \
	X(MemAddressFree, 10020, "cuMemAddressFree")                                     \
	X(MemMap, 10020, "cuMemMap")                                                     \
	X(MemUnmap, 10020, "cuMemUnmap")                                                 \
	X(MemSetAccess, 10020, "cuMemSetAccess")                                         \
	X(CtxGetCurrent, 4000, "cuCtxGetCurrent")                                        \
	X(CtxPushCurrent, 4000, "cuCtxPushCurrent_v2")                                   \
	X(CtxPopCurrent, 4000, "cuCtxPopCurrent_v2")                                     \
	X(CtxSynchronize, 2000, "cuCtxSynchronize")                                      \
	X(DevicePrimaryCtxRetain, 7000, "cuDevicePrimaryCtxRetain")                      \
	X(DevicePrimaryCtxRelease, 11000, "cuDevicePrimaryCtxRelease_v2")                \
	X(DevicePrimaryCtxGetState, 7000, "cuDevicePrimaryCtxGetState")                  \
	X(StreamCreate, 2000, "cuStreamCreate")                                          \
	X(StreamDestroy, 4000, "cuStreamDestroy_v2")                                     \
	X(StreamSynchronize, 2000, "cuStreamSynchronize")                                \
	X(MemcpyDtoHAsync, 3020, "cuMemcpyDtoHAsync_v2")                                 \
	X(MemcpyHtoDAsync, 3020, "cuMemcpyHtoDAsync_v2")                                 \
	X(MemsetD8Async, 3020, "cuMemsetD8Async")                                        \
	X(MemHostAlloc, 2020, "cuMemHostAlloc")                                          \
	X(MemFreeHost, 2000, "cuMemFreeHost")                                            \
	X(MemGetInfo, 3020, "cuMemGetInfo_v2")

struct cuda_api {
#define CUDA_FIELD(fn, ver, dl) PFN_cu##fn##_v##ver fn;
	CUDA_BOOT_SYMS(CUDA_FIELD)
	CUDA_SYMS(CUDA_FIELD)
#undef CUDA_FIELD
};

struct cuda_sym {
	const char *name; /* base name for cuGetProcAddress */
	int version;
	size_t off;       /* of the pointer in struct cuda_api */
	const char *dl_name;
};

struct cuda_dev {
	CUdevice cu;
	CUcontext ctx;   /* retained primary context; NULL until first needed */
	CUstream stream; /* copy stream in ctx; NULL until the first copy */
};

struct cuda_priv {
	struct backend b; /* b.priv points back here */
	void *lib;
	struct cuda_api api;
	uint64_t gran; /* largest device granularity: VA ranges must suit every device */
	pthread_mutex_t lock; /* guards devs[].ctx and devs[].stream */
	struct cuda_dev devs[BACKEND_MAX_DEVICES];
};


#define CUDA_ROW(fn, ver, dl) { "cu" #fn, ver, offsetof(struct cuda_api, fn), dl },
static const struct cuda_sym cuda_boot_syms[] = { CUDA_BOOT_SYMS(CUDA_ROW) };
static const struct cuda_sym cuda_syms[] = { CUDA_SYMS(CUDA_ROW) };
#undef CUDA_ROW

static const struct backend_ops cuda_ops;

/* Errors. */

static int cuda_errno(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
		return -EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_INVALID_DEVICE:
		return -ENODEV;
	case CUDA_ERROR_OPERATING_SYSTEM:
		/* What the driver reports at the open-file limit (GPU-FACTS.md). */
		return -EMFILE;
	case CUDA_ERROR_ALREADY_MAPPED:
		return -EBUSY;
	default:
		return -EIO;
	}
}

/* The driver's name and sentence for @r (its number in @num if it has none); never NULL. */
static void cuda_err_text(struct cuda_priv *c, CUresult r, const char **name, const char **text,
			  char num[static 24])
{
	if (!c->api.GetErrorName || c->api.GetErrorName(r, name) != CUDA_SUCCESS || !*name) {
		snprintf(num, 24, "CUresult %d", (int)r);
		*name = num;
	}
	if (!c->api.GetErrorString || c->api.GetErrorString(r, text) != CUDA_SUCCESS || !*text)
		*text = "no description";
}

static int cuda_fail(struct cuda_priv *c, CUresult r, const char *call, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Records "cuda backend: CALL: NAME (sentence) FACTS"; returns the errno for @r. */
static int cuda_fail(struct cuda_priv *c, CUresult r, const char *call, const char *fmt, ...)
{
	const char *name, *text;
	char facts[ERR_MSG_MAX / 2], num[24];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(facts, sizeof(facts), fmt, ap);
	va_end(ap);
	cuda_err_text(c, r, &name, &text, num);
	return backend_fail(cuda_errno(r), "cuda backend: %s: %s (%s) %s", call, name, text, facts);
}

/* Loading the driver. */

static int cuda_dlopen(struct cuda_priv *c)
{
	/*
	 * NODELETE: cuInit starts driver threads that outlive our use of it;
	 * unmapping the library's code under them at dlclose would crash.
	 */
	c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!c->lib)
		return backend_fail(-ENODEV, "cuda backend: libcuda.so.1 not found: %s", dlerror());
	return 0;
}

static int cuda_load_syms(struct cuda_priv *c, PFN_cuGetProcAddress_v12000 gpa,
			  const struct cuda_sym *syms, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct cuda_sym *s = &syms[i];
		CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		void *p = NULL;

		/* LEGACY_STREAM: our streams are explicit; never the _ptsz variants. */
		if (gpa && gpa(s->name, &p, s->version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q))
			q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		if (q != CU_GET_PROC_ADDRESS_SUCCESS || !p)
			p = dlsym(c->lib, s->dl_name);
		if (!p)
			return backend_fail(-ENODEV, "cuda backend: the driver lacks %s (ABI %d): "
					    "driver too old?", s->dl_name, s->version);
		/* POSIX guarantees a void * holds a function pointer (dlsym). */
		memcpy((char *)&c->api + s->off, &p, sizeof(p));
	}
	return 0;
}

static int cuda_load(struct cuda_priv *c)
{
	PFN_cuGetProcAddress_v12000 gpa = NULL;
	void *p = dlsym(c->lib, "cuGetProcAddress_v2");
	CUresult r;
	int rc;

	_Static_assert(sizeof(p) == sizeof(gpa), "function pointers fit a void *");
	memcpy(&gpa, &p, sizeof(p));
	/* "cuInit must be called before any other function": only these before it. */
	rc = cuda_load_syms(c, gpa, cuda_boot_syms, CUDA_COUNT(cuda_boot_syms));
	if (rc < 0)
		return rc;
	r = c->api.Init(0);
	if (r != CUDA_SUCCESS) {
		const char *name, *text;
		char num[24];

		/* Whatever cuInit says (no GPU, driver mismatch), CUDA is unusable here. */
		cuda_err_text(c, r, &name, &text, num);
		return backend_fail(-ENODEV, "cuda backend: cuInit failed: %s (%s)", name, text);
	}
	return cuda_load_syms(c, gpa, cuda_syms, CUDA_COUNT(cuda_syms));
}

/* Devices. */

static void cuda_prop_init(CUmemAllocationProp *prop, int dev)
{
	*prop = (CUmemAllocationProp){
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CUDA_FD_HANDLE,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
	};
}

static int cuda_dev_probe(struct cuda_priv *c, int i)
{
	struct backend_device *bd = &c->b.devices[i];
	CUdevice *d = &c->devs[i].cu;
	int vmm = 0, fd = 0;
	CUmemAllocationProp prop;
	size_t total = 0, gran = 0;
	CUresult r;

	r = c->api.DeviceGet(d, i);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceGetName(bd->name, (int)sizeof(bd->name), *d);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceTotalMem(&total, *d);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceGetAttribute(&vmm, CUDA_ATTR_VMM, *d);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceGetAttribute(&fd, CUDA_ATTR_FD, *d);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuDeviceGet/GetName/TotalMem/GetAttribute", "dev=%d", i);
	if (!vmm || !fd)
		return backend_fail(-EOPNOTSUPP, "cuda backend: device %d (%s) lacks virtual "
				    "memory management with POSIX fd handles", i, bd->name);
	cuda_prop_init(&prop, i);
	r = c->api.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemGetAllocationGranularity", "dev=%d", i);
	bd->total_bytes = total;
	bd->granularity = gran;
	if (gran > c->gran)
		c->gran = gran;
	return 0;
}

static int cuda_devices(struct cuda_priv *c)
{
	int n = 0, rc;
	CUresult r;

	r = c->api.DeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuDeviceGetCount", "after cuInit");
	if (n <= 0)
		return backend_fail(-ENODEV, "cuda backend: no CUDA device");
	if (n > BACKEND_MAX_DEVICES)
		n = BACKEND_MAX_DEVICES;
	for (int i = 0; i < n; i++) {
		rc = cuda_dev_probe(c, i);
		if (rc < 0)
			return rc;
	}
	c->b.ndevices = n;
	return 0;
}

/* Argument checks, as the host backend makes them. */

static int cuda_check_dev(struct cuda_priv *c, const char *op, int dev)
{
	if (dev < 0 || dev >= c->b.ndevices)
		return backend_fail(-EINVAL, "cuda backend: %s: no device %d (have %d)", op, dev,
				    c->b.ndevices);
	return 0;
}

/* @size non-zero, @size and @va multiples of the granularity (pass va 0 if none). */
static int cuda_check_range(struct cuda_priv *c, const char *op, uintptr_t va, uint64_t size)
{
	if (size == 0)
		return backend_fail(-EINVAL, "cuda backend: %s: size 0", op);
	if (size % c->gran || va % c->gran)
		return backend_fail(-EINVAL, "cuda backend: %s: 0x%" PRIxPTR "+0x%" PRIx64
				    " is not aligned to the granularity 0x%" PRIx64, op, va, size,
				    c->gran);
	return 0;
}

/* Physical memory: no context needed (GPU-FACTS.md). */

static int cuda_chunk_create(struct backend *b, int dev, uint64_t size, uint64_t *handle)
{
	struct cuda_priv *c = b->priv;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	CUresult r;
	int rc;

	rc = cuda_check_dev(c, "chunk_create", dev);
	if (rc == 0)
		rc = cuda_check_range(c, "chunk_create", 0, size);
	if (rc < 0)
		return rc;
	cuda_prop_init(&prop, dev);
	r = c->api.MemCreate(&h, size, &prop, 0);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemCreate", "dev=%d size=0x%" PRIx64, dev, size);
	*handle = h;
	return 0;
}

static int cuda_chunk_export(struct backend *b, uint64_t handle, int *fd)
{
	struct cuda_priv *c = b->priv;
	int rc, out = -1;
	CUresult r;

	r = c->api.MemExportToShareableHandle(&out, handle, CUDA_FD_HANDLE, 0);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemExportToShareableHandle", "handle=0x%" PRIx64, handle);
	/*
	 * An inherited chunk fd keeps GPU memory alive in whatever the process
	 * execs. Driver 580 returns it CLOEXEC, but no document promises it.
	 */
	if (fcntl(out, F_SETFD, FD_CLOEXEC) < 0) {
		rc = backend_fail(-errno, "cuda backend: chunk_export: FD_CLOEXEC on fd %d: %s",
				  out, strerror(errno));
		close(out);
		return rc;
	}
	*fd = out;
	return 0;
}

static int cuda_chunk_import(struct backend *b, int fd, uint64_t size, uint64_t *handle)
{
	struct cuda_priv *c = b->priv;
	CUmemGenericAllocationHandle h;
	CUresult r;
	int rc;

	if (fd < 0)
		return backend_fail(-EBADF, "cuda backend: chunk_import: bad fd %d", fd);
	rc = cuda_check_range(c, "chunk_import", 0, size);
	if (rc < 0)
		return rc;
	/* The POSIX fd travels as the pointer value; the driver does not close it. */
	r = c->api.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CUDA_FD_HANDLE);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemImportFromShareableHandle", "fd=%d size=0x%" PRIx64,
				 fd, size);
	/* The driver cannot tell a chunk's size: @size is only checked for alignment. */
	*handle = h;
	return 0;
}

static int cuda_chunk_release(struct backend *b, uint64_t handle)
{
	struct cuda_priv *c = b->priv;
	CUresult r;

	/* Mappings keep the memory; the last reference zeroes it (GPU-FACTS.md). */
	r = c->api.MemRelease(handle);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemRelease", "handle=0x%" PRIx64, handle);
	return 0;
}

/* Virtual address ranges. */

static int cuda_va_reserve(struct backend *b, uint64_t size, uint64_t align, uintptr_t *va)
{
	struct cuda_priv *c = b->priv;
	CUdeviceptr p = 0;
	CUresult r;
	int rc;

	rc = cuda_check_range(c, "va_reserve", 0, size);
	if (rc < 0)
		return rc;
	if (align & (align - 1))
		return backend_fail(-EINVAL, "cuda backend: va_reserve: alignment 0x%" PRIx64
				    " is not a power of two", align);
	/* Every map address must be a granularity multiple: align the base so. */
	if (align < c->gran)
		align = c->gran;
	r = c->api.MemAddressReserve(&p, size, align, 0, 0);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemAddressReserve", "size=0x%" PRIx64 " align=0x%" PRIx64,
				 size, align);
	*va = (uintptr_t)p;
	return 0;
}

static int cuda_va_free(struct backend *b, uintptr_t va, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	CUresult r;
	int rc;

	rc = cuda_check_range(c, "va_free", va, size);
	if (rc < 0)
		return rc;
	r = c->api.MemAddressFree(va, size);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemAddressFree", "va=0x%" PRIxPTR " size=0x%" PRIx64, va,
				 size);
	return 0;
}

static int cuda_map(struct backend *b, uintptr_t va, uint64_t size, uint64_t handle)
{
	struct cuda_priv *c = b->priv;
	CUresult r;
	int rc;

	rc = cuda_check_range(c, "map", va, size);
	if (rc < 0)
		return rc;
	/* offset "currently must be zero" (cuMemMap); flags must be 0. */
	r = c->api.MemMap(va, size, 0, handle, 0);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemMap", "va=0x%" PRIxPTR " size=0x%" PRIx64
				 " handle=0x%" PRIx64, va, size, handle);
	return 0;
}

static int cuda_set_access(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	CUmemAccessDesc desc = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUresult r;
	int rc;

	rc = cuda_check_dev(c, "set_access", dev);
	if (rc == 0)
		rc = cuda_check_range(c, "set_access", va, size);
	if (rc < 0)
		return rc;
	/* One call over back-to-back mappings costs what one mapping does (GPU-FACTS.md). */
	r = c->api.MemSetAccess(va, size, &desc, 1);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemSetAccess", "dev=%d va=0x%" PRIxPTR " size=0x%" PRIx64,
				 dev, va, size);
	return 0;
}

static int cuda_unmap(struct backend *b, uintptr_t va, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	CUresult r;
	int rc;

	rc = cuda_check_range(c, "unmap", va, size);
	if (rc < 0)
		return rc;
	/* Does not wait for GPU work on the range: callers sync first. */
	r = c->api.MemUnmap(va, size);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemUnmap", "va=0x%" PRIxPTR " size=0x%" PRIx64, va, size);
	return 0;
}

/* Contexts and streams, for the contents operations. */

/* The device's primary context, retained once (~500 MiB unless the app has it). */
static int cuda_dev_ctx(struct cuda_priv *c, int dev, CUcontext *ctx)
{
	struct cuda_dev *d = &c->devs[dev];
	CUresult r = CUDA_SUCCESS;
	CUcontext got = NULL;

	pthread_mutex_lock(&c->lock);
	if (!d->ctx) {
		r = c->api.DevicePrimaryCtxRetain(&got, d->cu);
		if (r == CUDA_SUCCESS)
			d->ctx = got;
	}
	*ctx = d->ctx;
	pthread_mutex_unlock(&c->lock);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuDevicePrimaryCtxRetain", "dev=%d", dev);
	return 0;
}

/*
 * Makes @ctx current on this thread for one operation. Push/pop rather than
 * cuCtxSetCurrent: an application thread keeps its own current context
 * (and with it the runtime's current device), a worker thread goes back to
 * none. @pushed says whether cuda_ctx_pop must undo it.
 */
static int cuda_ctx_push(struct cuda_priv *c, CUcontext ctx, bool *pushed)
{
	CUcontext cur = NULL;
	CUresult r;

	*pushed = false;
	r = c->api.CtxGetCurrent(&cur);
	if (r == CUDA_SUCCESS && cur == ctx)
		return 0;
	if (r == CUDA_SUCCESS)
		r = c->api.CtxPushCurrent(ctx);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuCtxPushCurrent", "ctx=%p", (void *)ctx);
	*pushed = true;
	return 0;
}

static void cuda_ctx_pop(struct cuda_priv *c, bool pushed)
{
	CUcontext ctx;

	if (pushed)
		c->api.CtxPopCurrent(&ctx);
}

static int cuda_dev_enter(struct cuda_priv *c, int dev, bool *pushed)
{
	CUcontext ctx;
	int rc = cuda_dev_ctx(c, dev, &ctx);

	if (rc == 0)
		rc = cuda_ctx_push(c, ctx, pushed);
	return rc;
}

/* This backend's stream on @dev; its context must be current. */
static int cuda_dev_stream(struct cuda_priv *c, int dev, CUstream *s)
{
	struct cuda_dev *d = &c->devs[dev];
	CUresult r = CUDA_SUCCESS;
	CUstream got = NULL;

	pthread_mutex_lock(&c->lock);
	/* Non-blocking: no implicit ordering with the application's stream 0. */
	if (!d->stream) {
		r = c->api.StreamCreate(&got, CU_STREAM_NON_BLOCKING);
		if (r == CUDA_SUCCESS)
			d->stream = got;
	}
	*s = d->stream;
	pthread_mutex_unlock(&c->lock);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuStreamCreate", "dev=%d", dev);
	return 0;
}

/* Contents. */

static int cuda_sync(struct backend *b, int dev)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	CUresult r;
	int rc;

	rc = cuda_check_dev(c, "sync", dev);
	if (rc == 0)
		rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	/* Drains every stream of the primary context: the application's too. */
	r = c->api.CtxSynchronize();
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuCtxSynchronize", "dev=%d", dev);
	return 0;
}

static const char *const cuda_op_call[] = {
	[BACKEND_TO_HOST] = "cuMemcpyDtoHAsync",
	[BACKEND_FROM_HOST] = "cuMemcpyHtoDAsync",
	[BACKEND_ZERO] = "cuMemsetD8Async",
};

static CUresult cuda_enqueue(struct cuda_priv *c, enum backend_contents op, CUstream s, char *host,
			     CUdeviceptr va, size_t n)
{
	switch (op) {
	case BACKEND_TO_HOST:
		return c->api.MemcpyDtoHAsync(host, va, n, s);
	case BACKEND_FROM_HOST:
		return c->api.MemcpyHtoDAsync(va, host, n, s);
	case BACKEND_ZERO:
		return c->api.MemsetD8Async(va, 0, n, s);
	}
	return CUDA_ERROR_INVALID_VALUE;
}

/*
 * Enqueues @op over [va, va+size) in pieces on @dev's stream; waits once
 * when @wait is set, or when enqueueing failed.
 */
static int cuda_contents_run(struct cuda_priv *c, int dev, enum backend_contents op, char *host,
			     uintptr_t va, uint64_t size, bool wait)
{
	CUresult r = CUDA_SUCCESS, rs;
	uint64_t off = 0, n = 0;
	CUstream s;
	int rc;

	rc = cuda_dev_stream(c, dev, &s);
	if (rc < 0)
		return rc;
	for (; off < size && r == CUDA_SUCCESS; off += n) {
		n = size - off < CUDA_COPY_PIECE ? size - off : CUDA_COPY_PIECE;
		r = cuda_enqueue(c, op, s, host ? host + off : NULL, va + off, n);
	}
	/* On failure wait too: pieces already queued still read or write @host. */
	rs = wait || r != CUDA_SUCCESS ? c->api.StreamSynchronize(s) : CUDA_SUCCESS;
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, cuda_op_call[op], "dev=%d va=0x%" PRIxPTR " size=0x%" PRIx64
				 " at=0x%" PRIx64, dev, va, size, off - n);
	if (rs != CUDA_SUCCESS)
		return cuda_fail(c, rs, "cuStreamSynchronize", "after %s dev=%d va=0x%" PRIxPTR
				 " size=0x%" PRIx64, cuda_op_call[op], dev, va, size);
	return 0;
}

static int cuda_contents(struct backend *b, int dev, enum backend_contents op, char *host, uintptr_t va,
			 uint64_t size, bool wait)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	int rc;

	rc = cuda_check_dev(c, cuda_op_call[op], dev);
	if (rc < 0 || size == 0)
		return rc;
	if (op != BACKEND_ZERO && !host)
		return backend_fail(-EINVAL, "cuda backend: %s: no host buffer", cuda_op_call[op]);
	rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	rc = cuda_contents_run(c, dev, op, host, va, size, wait);
	cuda_ctx_pop(c, pushed);
	return rc;
}

static int cuda_zero(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	return cuda_contents(b, dev, BACKEND_ZERO, NULL, va, size, true);
}

static int cuda_copy_to_host(struct backend *b, int dev, void *dst, uintptr_t src, uint64_t size)
{
	return cuda_contents(b, dev, BACKEND_TO_HOST, dst, src, size, true);
}

static int cuda_copy_from_host(struct backend *b, int dev, uintptr_t dst, const void *src,
			       uint64_t size)
{
	/* The driver only reads @src (cuMemcpyHtoDAsync takes a const pointer). */
	return cuda_contents(b, dev, BACKEND_FROM_HOST, (char *)(uintptr_t)src, dst, size, true);
}

static int cuda_contents_queue(struct backend *b, int dev, enum backend_contents op, void *host,
			       uintptr_t va, uint64_t size)
{
	return cuda_contents(b, dev, op, host, va, size, false);
}

/* Waits for what contents_queue put on @dev's stream. */
static int cuda_wait(struct backend *b, int dev)
{
	struct cuda_priv *c = b->priv;
	CUstream s;
	bool pushed;
	CUresult r;
	int rc;

	rc = cuda_check_dev(c, "wait", dev);
	if (rc < 0)
		return rc;
	rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	rc = cuda_dev_stream(c, dev, &s);
	if (rc == 0) {
		r = c->api.StreamSynchronize(s);
		if (r != CUDA_SUCCESS)
			rc = cuda_fail(c, r, "cuStreamSynchronize", "dev=%d", dev);
	}
	cuda_ctx_pop(c, pushed);
	return rc;
}

/*
 * Host memory needs some context: the thread's own if it has one; else a
 * primary context already active (the application's or ours), so that a
 * worker of GPU 3 does not pay a context on GPU 0; else device 0's.
 */
static int cuda_host_ctx(struct cuda_priv *c, CUcontext *ctx)
{
	CUcontext cur = NULL;
	unsigned flags;
	int active;

	if (c->api.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur) {
		*ctx = cur;
		return 0;
	}
	for (int i = 0; i < c->b.ndevices; i++)
		if (c->api.DevicePrimaryCtxGetState(c->devs[i].cu, &flags, &active) ==
			    CUDA_SUCCESS &&
		    active)
			return cuda_dev_ctx(c, i, ctx);
	return cuda_dev_ctx(c, 0, ctx);
}

static int cuda_host_alloc(struct backend *b, uint64_t size, void **p)
{
	struct cuda_priv *c = b->priv;
	CUcontext ctx;
	bool pushed;
	CUresult r;
	int rc;

	if (size == 0 || !p)
		return backend_fail(-EINVAL, "cuda backend: host_alloc: size 0 or no result");
	rc = cuda_host_ctx(c, &ctx);
	if (rc == 0)
		rc = cuda_ctx_push(c, ctx, &pushed);
	if (rc < 0)
		return rc;
	/* PORTABLE: pinned for every context, as copies run in each device's own. */
	r = c->api.MemHostAlloc(p, size, CU_MEMHOSTALLOC_PORTABLE);
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemHostAlloc", "size=0x%" PRIx64 " (pinned)", size);
	return 0;
}

static void cuda_host_free(struct backend *b, void *p, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	CUcontext ctx;
	bool pushed;
	CUresult r;

	if (!p || cuda_host_ctx(c, &ctx) < 0 || cuda_ctx_push(c, ctx, &pushed) < 0)
		return;
	r = c->api.MemFreeHost(p);
	cuda_ctx_pop(c, pushed);
	/* No status to return: leave the reason for a caller who looks. */
	if (r != CUDA_SUCCESS)
		cuda_fail(c, r, "cuMemFreeHost", "p=%p size=0x%" PRIx64, p, size);
}

int backend_cuda_mem_info(struct backend *b, int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	struct cuda_priv *c;
	size_t fr = 0, tot = 0;
	bool pushed;
	CUresult r;
	int rc;

	if (!b || b->ops != &cuda_ops || !free_bytes || !total_bytes)
		return backend_fail(-EINVAL, "backend_cuda_mem_info: not a cuda backend");
	c = b->priv;
	rc = cuda_check_dev(c, "mem_info", dev);
	if (rc == 0)
		rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	r = c->api.MemGetInfo(&fr, &tot);
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, r, "cuMemGetInfo", "dev=%d", dev);
	*free_bytes = fr;
	*total_bytes = tot;
	return 0;
}

/* Setup and teardown. */

static void cuda_close_dev(struct cuda_priv *c, int dev)
{
	struct cuda_dev *d = &c->devs[dev];
	bool pushed;

	if (!d->ctx)
		return;
	if (d->stream && cuda_ctx_push(c, d->ctx, &pushed) == 0) {
		c->api.StreamDestroy(d->stream);
		cuda_ctx_pop(c, pushed);
	}
	c->api.DevicePrimaryCtxRelease(d->cu);
	*d = (struct cuda_dev){ 0 };
}

static void cuda_close(struct backend *b)
{
	struct cuda_priv *c;

	if (!b)
		return;
	c = b->priv;
	/* Chunks and reservations stay the caller's to release: none are tracked. */
	for (int i = 0; i < b->ndevices; i++)
		cuda_close_dev(c, i);
	dlclose(c->lib);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int backend_cuda_open(struct backend **out)
{
	struct cuda_priv *c;
	int rc;

	if (!out)
		return backend_fail(-EINVAL, "cuda backend: no place for the result");
	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return backend_fail(-ENOMEM, "cuda backend: out of memory");
	rc = -pthread_mutex_init(&c->lock, NULL);
	if (rc < 0) {
		backend_fail(rc, "cuda backend: mutex: %s", strerror(-rc));
		goto out_free;
	}
	rc = cuda_dlopen(c);
	if (rc < 0)
		goto out_lock;
	rc = cuda_load(c);
	if (rc == 0)
		rc = cuda_devices(c);
	if (rc < 0)
		goto out_lib;
	c->b.ops = &cuda_ops;
	c->b.priv = c;
	*out = &c->b;
	return 0;

out_lib:
	dlclose(c->lib);
out_lock:
	pthread_mutex_destroy(&c->lock);
out_free:
	free(c);
	return rc;
}

static const struct backend_ops cuda_ops = {
	.name = "cuda",
	.close = cuda_close,
	.chunk_create = cuda_chunk_create,
	.chunk_export = cuda_chunk_export,
	.chunk_import = cuda_chunk_import,
	.chunk_release = cuda_chunk_release,
	.va_reserve = cuda_va_reserve,
	.va_free = cuda_va_free,
	.map = cuda_map,
	.set_access = cuda_set_access,
	.unmap = cuda_unmap,
	.sync = cuda_sync,
	.zero = cuda_zero,
	.copy_to_host = cuda_copy_to_host,
	.copy_from_host = cuda_copy_from_host,
	.contents_queue = cuda_contents_queue,
	.wait = cuda_wait,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
};
