/*
 * fake_cuda.c - libfake_cuda.so (soname libcuda.so.1), a stand-in for the
 * CUDA driver that tests/test_backend_cuda_fake.c loads before the cuda
 * backend opens "libcuda.so.1", so that the backend's own logic can be
 * tested without a GPU (tests/fake_cuda.h says what it records).
 *
 * It has every entry point the backend loads, under the versioned names it
 * asks dlsym for (its cuGetProcAddress_v2 knows only the IPC calls below,
 * so the backend finds every one of its own by dlsym). Devices have a uuid,
 * a granularity and a primary context
 * each; contexts are a per-thread stack as in the driver; the stream
 * capture mode is per thread, GLOBAL by default, as in the driver. Memory
 * is not real: reservations hand out addresses nobody touches, copies only
 * count. One mutex; not for production, obviously.
 *
 * CUDA IPC for the preload shim's tests (tests/test_ipc_driver.c): a
 * handle names the pointer it was made of ("FAKECU" + the address), so a
 * test sees which calls, pointers, handles and flags reached the driver
 * unchanged. What its lookups hand out are its own functions, never the
 * exported symbols (which an LD_PRELOAD library interposes), as a real
 * driver's are.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tests/fake_cuda.h"

#define FAKE_MAX_STACK 16

struct fake_ctx {
	int dev;
};

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static int fake_n;
static uint64_t fake_gran[FAKE_CUDA_MAX_DEVICES];
static int fake_active[FAKE_CUDA_MAX_DEVICES];
static struct fake_ctx fake_ctxs[FAKE_CUDA_MAX_DEVICES];
static struct fake_cuda_stats fake_st;
static uint64_t fake_next_va = 1ULL << 40, fake_next_handle = 1;
static int fake_stream_token;
static __thread struct fake_ctx *fake_stack[FAKE_MAX_STACK];
static __thread int fake_depth;
static __thread CUstreamCaptureMode fake_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static int fake_cur_dev(void)
{
	return fake_depth ? fake_stack[fake_depth - 1]->dev : -1;
}

static int fake_bad_dev(CUdevice d)
{
	return d < 0 || d >= fake_n;
}

#pragma GCC visibility push(default)

void fake_cuda_setup(int n, const uint64_t *gran)
{
	pthread_mutex_lock(&fake_lock);
	fake_n = n < FAKE_CUDA_MAX_DEVICES ? n : FAKE_CUDA_MAX_DEVICES;
	for (int i = 0; i < fake_n; i++) {
		fake_gran[i] = gran[i];
		fake_active[i] = 0;
		fake_ctxs[i].dev = i;
	}
	memset(&fake_st, 0, sizeof(fake_st));
	fake_st.sync_dev = fake_st.host_alloc_dev = -1;
	fake_st.sync_mode = fake_st.copy_mode = fake_st.access_mode = -1;
	pthread_mutex_unlock(&fake_lock);
}

void fake_cuda_uuid(int dev, uint8_t uuid[16])
{
	memset(uuid, 0x5a, 16);
	uuid[0] = (uint8_t)(0xa0 + dev);
}

void fake_cuda_set_active(int dev)
{
	pthread_mutex_lock(&fake_lock);
	fake_active[dev] = 1;
	pthread_mutex_unlock(&fake_lock);
}

void fake_cuda_stats(struct fake_cuda_stats *out)
{
	pthread_mutex_lock(&fake_lock);
	*out = fake_st;
	pthread_mutex_unlock(&fake_lock);
}

void fake_cuda_set_current(int dev)
{
	fake_depth = 0;
	if (dev >= 0 && dev < fake_n)
		fake_stack[fake_depth++] = &fake_ctxs[dev];
}

/* Boot and errors. */

CUresult CUDAAPI cuInit(unsigned int flags)
{
	return fake_n > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult CUDAAPI cuGetErrorName(CUresult r, const char **s)
{
	*s = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorString(CUresult r, const char **s)
{
	*s = "the stand-in driver refused";
	return CUDA_SUCCESS;
}

/* Devices. */

CUresult CUDAAPI cuDeviceGetCount(int *n)
{
	*n = fake_n;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *d, int ordinal)
{
	if (fake_bad_dev(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice d)
{
	if (fake_bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "fake GPU %d", d);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice d)
{
	if (fake_bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	fake_cuda_uuid(d, (uint8_t *)uuid->bytes);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice d)
{
	*bytes = FAKE_CUDA_TOTAL;
	return fake_bad_dev(d) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d)
{
	*v = 1; /* VMM and POSIX fd handles */
	return fake_bad_dev(d) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					       CUmemAllocationGranularity_flags option)
{
	if (fake_bad_dev(prop->location.id))
		return CUDA_ERROR_INVALID_DEVICE;
	*g = fake_gran[prop->location.id];
	return CUDA_SUCCESS;
}

/* Physical memory and address ranges. */

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
			     const CUmemAllocationProp *prop, unsigned long long flags)
{
	CUresult r = CUDA_SUCCESS;

	pthread_mutex_lock(&fake_lock);
	if (fake_bad_dev(prop->location.id))
		r = CUDA_ERROR_INVALID_DEVICE;
	else if (size == 0 || size % fake_gran[prop->location.id])
		r = CUDA_ERROR_INVALID_VALUE; /* the driver's own rule, per device */
	if (r == CUDA_SUCCESS) {
		*h = fake_next_handle++;
		fake_st.creates++;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle h)
{
	return CUDA_SUCCESS;
}

/* A fresh memfd per export: a dup of an earlier one is told apart by its inode. */
CUresult CUDAAPI cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
					      CUmemAllocationHandleType type,
					      unsigned long long flags)
{
	int fd;

	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = memfd_create("fake-cuda-export", MFD_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	pthread_mutex_lock(&fake_lock);
	fake_st.exports++;
	pthread_mutex_unlock(&fake_lock);
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *osh,
						CUmemAllocationHandleType type)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
				     unsigned long long flags)
{
	pthread_mutex_lock(&fake_lock);
	if (align)
		fake_next_va = (fake_next_va + align - 1) / align * align;
	*p = fake_next_va;
	fake_next_va += size;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr p, size_t size)
{
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
			  unsigned long long flags)
{
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr p, size_t size)
{
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t n)
{
	CUresult r = CUDA_SUCCESS;

	pthread_mutex_lock(&fake_lock);
	fake_st.access_calls++;
	fake_st.access_n = (int)n;
	fake_st.access_mode = fake_mode;
	for (size_t i = 0; i < n && i < FAKE_CUDA_MAX_DEVICES; i++) {
		fake_st.access_ids[i] = desc[i].location.id;
		if (fake_bad_dev(desc[i].location.id))
			r = CUDA_ERROR_INVALID_DEVICE;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

/* Contexts: a per-thread stack over one primary context per device. */

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx)
{
	*ctx = fake_depth ? (CUcontext)fake_stack[fake_depth - 1] : NULL;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
	if (!ctx || fake_depth == FAKE_MAX_STACK)
		return CUDA_ERROR_INVALID_CONTEXT;
	fake_stack[fake_depth++] = (struct fake_ctx *)ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *ctx)
{
	if (!fake_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	*ctx = (CUcontext)fake_stack[--fake_depth];
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
	if (!fake_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&fake_lock);
	fake_st.ctx_syncs++;
	fake_st.sync_dev = fake_cur_dev();
	fake_st.sync_mode = fake_mode;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d)
{
	if (fake_bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake_lock);
	fake_st.retains[d]++;
	fake_active[d] = 1;
	pthread_mutex_unlock(&fake_lock);
	*ctx = (CUcontext)&fake_ctxs[d];
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d)
{
	return fake_bad_dev(d) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active)
{
	if (fake_bad_dev(d))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake_lock);
	*flags = 0;
	*active = fake_active[d];
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

/* Streams, copies, host memory. */

CUresult CUDAAPI cuStreamCreate(CUstream *s, unsigned int flags)
{
	if (!fake_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	*s = (CUstream)&fake_stream_token;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream s)
{
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream s)
{
	pthread_mutex_lock(&fake_lock);
	fake_st.stream_syncs++;
	fake_st.sync_dev = fake_cur_dev();
	fake_st.sync_mode = fake_mode;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

static CUresult fake_copy(void)
{
	pthread_mutex_lock(&fake_lock);
	fake_st.copy_mode = fake_mode;
	pthread_mutex_unlock(&fake_lock);
	return fake_depth ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	return fake_copy();
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	return fake_copy();
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
	return fake_copy();
}

CUresult CUDAAPI cuMemHostAlloc(void **p, size_t size, unsigned int flags)
{
	if (!fake_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&fake_lock);
	fake_st.host_alloc_dev = fake_cur_dev();
	pthread_mutex_unlock(&fake_lock);
	*p = malloc(size);
	return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
	free(p);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo(size_t *fr, size_t *tot)
{
	*fr = *tot = FAKE_CUDA_TOTAL;
	return fake_depth ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	CUstreamCaptureMode old = fake_mode;

	fake_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

/* Host registration: the pages are the caller's; nothing to remember. */
CUresult CUDAAPI cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
	return p && n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* CUDA IPC: a handle is "FAKECU" and the address it was made of. */

static const char fake_ipc_magic[8] = "FAKECU";

static CUresult fake_ipc_get(CUipcMemHandle *h, CUdeviceptr p)
{
	pthread_mutex_lock(&fake_lock);
	fake_st.ipc_gets++;
	pthread_mutex_unlock(&fake_lock);
	if (!h || !p)
		return CUDA_ERROR_INVALID_VALUE;
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, fake_ipc_magic, sizeof(fake_ipc_magic));
	memcpy(h->reserved + 8, &p, sizeof(p));
	return CUDA_SUCCESS;
}

static CUresult fake_ipc_open(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags, int *count)
{
	pthread_mutex_lock(&fake_lock);
	(*count)++;
	fake_st.ipc_flags = flags;
	pthread_mutex_unlock(&fake_lock);
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	if (memcmp(h.reserved, fake_ipc_magic, sizeof(fake_ipc_magic)) != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	memcpy(p, h.reserved + 8, sizeof(*p));
	return CUDA_SUCCESS;
}

static CUresult fake_ipc_open_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	return fake_ipc_open(p, h, flags, &fake_st.ipc_opens);
}

static CUresult fake_ipc_open_v1(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	return fake_ipc_open(p, h, flags, &fake_st.ipc_opens_v1);
}

static CUresult fake_ipc_close(CUdeviceptr p)
{
	pthread_mutex_lock(&fake_lock);
	fake_st.ipc_closes++;
	pthread_mutex_unlock(&fake_lock);
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_ctx_dev(CUdevice *d, int *count)
{
	int dev = fake_cur_dev();

	pthread_mutex_lock(&fake_lock);
	(*count)++;
	pthread_mutex_unlock(&fake_lock);
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = dev;
	return CUDA_SUCCESS;
}

static CUresult fake_ctx_get_device(CUdevice *d)
{
	return fake_ctx_dev(d, &fake_st.ctx_devs);
}

/* ABI 13000 (cuCtxGetDevice_v2): the device of @ctx, NULL for the current one. */
static CUresult fake_ctx_get_device_v2(CUdevice *d, CUcontext ctx)
{
	if (!ctx)
		return fake_ctx_dev(d, &fake_st.ctx_devs_v2);
	pthread_mutex_lock(&fake_lock);
	fake_st.ctx_devs_v2++;
	pthread_mutex_unlock(&fake_lock);
	*d = ((struct fake_ctx *)ctx)->dev;
	return CUDA_SUCCESS;
}

static CUresult fake_gpa_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
			    CUdriverProcAddressQueryResult *status);
static CUresult fake_gpa_v1(const char *symbol, void **pfn, int version, cuuint64_t flags);

/* POSIX guarantees a void * holds a function pointer (dlsym). */
#define FAKE_ADDR(fn)                                \
	__extension__({                              \
		__typeof__(&fn) fn_ = &fn;           \
		void *addr_;                         \
		memcpy(&addr_, &fn_, sizeof(addr_)); \
		addr_;                               \
	})

/* The name's newest ABI at @version, as the driver picks them (cudaTypedefs.h). */
static void *fake_find(const char *symbol, int version)
{
	if (!symbol)
		return NULL;
	if (!strcmp(symbol, "cuIpcGetMemHandle"))
		return FAKE_ADDR(fake_ipc_get);
	if (!strcmp(symbol, "cuIpcOpenMemHandle"))
		return version >= 11000 ? FAKE_ADDR(fake_ipc_open_v2) : FAKE_ADDR(fake_ipc_open_v1);
	if (!strcmp(symbol, "cuIpcCloseMemHandle"))
		return FAKE_ADDR(fake_ipc_close);
	if (!strcmp(symbol, "cuCtxGetDevice"))
		return version >= 13000 ? FAKE_ADDR(fake_ctx_get_device_v2) :
					  FAKE_ADDR(fake_ctx_get_device);
	if (!strcmp(symbol, "cuGetProcAddress"))
		return version >= 12000 ? FAKE_ADDR(fake_gpa_v2) : FAKE_ADDR(fake_gpa_v1);
	return NULL;
}

static CUresult fake_gpa_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
			    CUdriverProcAddressQueryResult *status)
{
	void *p = fake_find(symbol, version);

	pthread_mutex_lock(&fake_lock);
	fake_st.lookups++;
	pthread_mutex_unlock(&fake_lock);
	if (!pfn)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = p;
	if (status)
		*status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult fake_gpa_v1(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	return fake_gpa_v2(symbol, pfn, version, flags, NULL);
}

void *fake_cuda_lookup(const char *symbol, int version)
{
	return fake_find(symbol, version);
}

/* The exported symbols: what a program linked against the driver calls. */

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	return fake_ipc_get(h, p);
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	return fake_ipc_open_v2(p, h, flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr p)
{
	return fake_ipc_close(p);
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *d)
{
	return fake_ctx_get_device(d);
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				     CUdriverProcAddressQueryResult *status)
{
	return fake_gpa_v2(symbol, pfn, version, flags, status);
}

/* The older ABIs' unversioned symbols, which cuda.h renames away from. */
#undef cuIpcOpenMemHandle
#undef cuGetProcAddress
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags);
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	return fake_ipc_open_v1(p, h, flags);
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	return fake_gpa_v1(symbol, pfn, version, flags);
}

#pragma GCC visibility pop
