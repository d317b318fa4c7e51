/*
 * libcuda.h - what the parts of the cuda backend share (the driver's
 * entry points loaded from libcuda, the backend's state): cuda.c (loading
 * the driver, devices, physical memory, VA ranges), cuda_contents.c
 * (contexts, streams, copies, host memory) and cuda_error.c (failure
 * sentences, device checks; called by both, calls neither).
 * Private to them; see cuda.c for the invariants.
 */
#ifndef GMB_BACKEND_LIBCUDA_H
#define GMB_BACKEND_LIBCUDA_H

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

#include "common/backend/backend.h"
#include "common/backend/cuda.h"
#include "common/err.h"
#include "common/idmap.h"

/*
 * Copies go in pieces queued back to back before one wait: each driver call
 * stays bounded (the driver stages a pageable buffer synchronously) while
 * the stream keeps the copy engine busy.
 */
#define CUDA_COPY_PIECE (256ULL << 20)
#define CUDA_COUNT(a)	(sizeof(a) / sizeof((a)[0]))
#define CUDA_ATTR_VMM	CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
#define CUDA_ATTR_FD	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
#define CUDA_FD_HANDLE	CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

/*
 * Driver entry points: field, ABI version (the PFN_ typedef's suffix, given
 * to cuGetProcAddress), and the versioned symbol for dlsym when the driver
 * has no cuGetProcAddress_v2. The boot ones are loaded before cuInit.
 */
#define CUDA_BOOT_SYMS(X)                       \
	X(Init, 2000, "cuInit")                 \
	X(GetErrorName, 6000, "cuGetErrorName") \
	X(GetErrorString, 6000, "cuGetErrorString")

#define CUDA_SYMS(X)                                                             \
	X(DeviceGetCount, 2000, "cuDeviceGetCount")                              \
	X(DeviceGet, 2000, "cuDeviceGet")                                        \
	X(DeviceGetName, 2000, "cuDeviceGetName")                                \
	X(DeviceGetUuid, 11040, "cuDeviceGetUuid_v2")                            \
	X(DeviceTotalMem, 3020, "cuDeviceTotalMem_v2")                           \
	X(DeviceGetAttribute, 2000, "cuDeviceGetAttribute")                      \
	X(MemGetAllocationGranularity, 10020, "cuMemGetAllocationGranularity")   \
	X(MemCreate, 10020, "cuMemCreate")                                       \
	X(MemRelease, 10020, "cuMemRelease")                                     \
	X(MemExportToShareableHandle, 10020, "cuMemExportToShareableHandle")     \
	X(MemImportFromShareableHandle, 10020, "cuMemImportFromShareableHandle") \
	X(MemAddressReserve, 10020, "cuMemAddressReserve")                       \
	X(MemAddressFree, 10020, "cuMemAddressFree")                             \
	X(MemMap, 10020, "cuMemMap")                                             \
	X(MemUnmap, 10020, "cuMemUnmap")                                         \
	X(MemSetAccess, 10020, "cuMemSetAccess")                                 \
	X(CtxGetCurrent, 4000, "cuCtxGetCurrent")                                \
	X(CtxPushCurrent, 4000, "cuCtxPushCurrent_v2")                           \
	X(CtxPopCurrent, 4000, "cuCtxPopCurrent_v2")                             \
	X(CtxSynchronize, 2000, "cuCtxSynchronize")                              \
	X(DevicePrimaryCtxRetain, 7000, "cuDevicePrimaryCtxRetain")              \
	X(DevicePrimaryCtxRelease, 11000, "cuDevicePrimaryCtxRelease_v2")        \
	X(DevicePrimaryCtxGetState, 7000, "cuDevicePrimaryCtxGetState")          \
	X(StreamCreate, 2000, "cuStreamCreate")                                  \
	X(StreamDestroy, 4000, "cuStreamDestroy_v2")                             \
	X(StreamSynchronize, 2000, "cuStreamSynchronize")                        \
	X(MemcpyDtoHAsync, 3020, "cuMemcpyDtoHAsync_v2")                         \
	X(MemcpyHtoDAsync, 3020, "cuMemcpyHtoDAsync_v2")                         \
	X(MemsetD8Async, 3020, "cuMemsetD8Async")                                \
	X(MemHostAlloc, 2020, "cuMemHostAlloc")                                  \
	X(MemFreeHost, 2000, "cuMemFreeHost")                                    \
	X(MemHostRegister, 6050, "cuMemHostRegister_v2")                         \
	X(MemHostUnregister, 4000, "cuMemHostUnregister")                        \
	X(MemGetInfo, 3020, "cuMemGetInfo_v2")                                   \
	X(ThreadExchangeStreamCaptureMode, 10010, "cuThreadExchangeStreamCaptureMode")

struct cuda_api {
#define CUDA_FIELD(fn, ver, dl) PFN_cu##fn##_v##ver fn;
	CUDA_BOOT_SYMS(CUDA_FIELD)
	CUDA_SYMS(CUDA_FIELD)
#undef CUDA_FIELD
};

struct cuda_sym {
	const char *name; /* base name for cuGetProcAddress */
	int version;
	size_t off; /* of the pointer in struct cuda_api */
	const char *dl_name;
};

struct cuda_dev {
	/*
	 * false: a slot of gmbd's order this process cannot see. Its cu is
	 * meaningless (0 is a real device here), so nothing may use it.
	 */
	bool visible;
	CUdevice cu;
	CUcontext ctx;	 /* retained primary context; NULL until first needed */
	CUstream stream; /* copy stream in ctx; NULL until the first copy */
	/*
	 * An exported fd kept open while the backend lives, made at the
	 * process's first export (cuda_keep_exported() says why); -1 when
	 * making it failed, meaningless until keep_tried.
	 */
	int keep_fd;
	bool keep_tried;
};

struct cuda_priv {
	struct backend b; /* b.priv points back here */
	void *lib;
	struct cuda_api api;
	/*
	 * Smallest granularity of the visible devices: what a size or address
	 * not tied to one device (a reservation, an imported chunk, a mapping)
	 * must be a multiple of; the driver checks the rest. Chunks and access
	 * are checked against their own device's.
	 */
	uint64_t gran_min;
	pthread_mutex_t lock; /* guards devs[].ctx, .stream and .keep_* */
	struct cuda_dev devs[BACKEND_MAX_DEVICES];
	struct cuda_nvml *nvml; /* nvml.c's, made on first use; guarded by lock */
	/*
	 * Created and adopted chunks: handle -> its fd + 1, an export (or, for
	 * an adopted chunk, a dup of the fd it came from) this backend owns,
	 * dup'ed for each export and closed at the handle's release; guarded
	 * by lock.
	 */
	struct idmap kept;
};

/*
 * A CUDA graph captured in the default "global" mode makes the driver refuse
 * potentially unsafe calls, the VMM ones among them, from every thread, and
 * invalidates the capture. libgmb imports and maps lent memory on its own
 * threads while the application may be capturing, so each memory call runs
 * with the calling thread in relaxed mode, and the thread's mode comes back.
 */
#define CUDA_RELAXED(c, call)                                            \
	({                                                               \
		CUstreamCaptureMode m_ = CU_STREAM_CAPTURE_MODE_RELAXED; \
		(c)->api.ThreadExchangeStreamCaptureMode(&m_);           \
		CUresult r_ = (call);                                    \
		(c)->api.ThreadExchangeStreamCaptureMode(&m_);           \
		r_;                                                      \
	})

/* cuda_error.c. Records "cuda backend: CALL: NAME (sentence) FACTS"; returns the errno for @r. */
int cuda__fail(struct cuda_priv *c, CUresult r, const char *call, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
int cuda__check_dev(struct cuda_priv *c, const char *op, int dev);
/* The driver's name and sentence for @r (@num holds a number when it has none). */
void cuda__err_text(struct cuda_priv *c, CUresult r, const char **name, const char **text,
		    char num[static 24]);

/* cuda_contents.c: the backend_ops that need a context. */
int cuda__sync(struct backend *b, int dev);
int cuda__zero(struct backend *b, int dev, uintptr_t va, uint64_t size);
int cuda__copy_to_host(struct backend *b, int dev, void *dst, uintptr_t src, uint64_t size);
int cuda__copy_from_host(struct backend *b, int dev, uintptr_t dst, const void *src, uint64_t size);
int cuda__contents_queue(struct backend *b, int dev, enum backend_contents op, void *host,
			 uintptr_t va, uint64_t size);
int cuda__wait(struct backend *b, int dev);
void cuda__contents_release(struct backend *b, int dev);
int cuda__host_alloc(struct backend *b, uint64_t size, void **p);
void cuda__host_free(struct backend *b, void *p, uint64_t size);
int cuda__host_register(struct backend *b, void *p, uint64_t size);
void cuda__host_unregister(struct backend *b, void *p, uint64_t size);

/* nvml.c. The driver's view of device @dev's memory (struct backend_ops
 * driver_mem); NVML is loaded on the first call. */
struct cuda_nvml;
int cuda__driver_mem(struct backend *b, int dev, uint64_t *total, uint64_t *used);
/* Unloads NVML (backend close). */
void cuda__nvml_close(struct cuda_priv *c);
/* Destroys @dev's stream and releases its primary context, if made. */
void cuda__close_dev(struct cuda_priv *c, int dev);

#endif
