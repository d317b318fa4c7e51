/*
 * fake_cudart.c - libfake_cudart.so, a stand-in for the CUDA runtime that
 * tests/prog_preload links against, so that the preload shim's routing can
 * be tested without a GPU: device memory is malloc'd host memory, and every
 * call is counted so the test can tell which side served it.
 *
 * cudaFree of a pointer it did not hand out counts as a bad free and fails
 * with cudaErrorInvalidValue, as the real runtime does with a VMM address:
 * that is how a gmbd pointer leaking to the runtime shows. Thread-safe (one
 * mutex); not for production, obviously.
 *
 * The driver's entry points (cudaGetDriverEntryPoint*) come from the
 * stand-in driver next to this file (libfake_cuda.so, tests/fake_cuda.c),
 * loaded RTLD_LOCAL at the first lookup as libcudart loads libcuda: out of
 * the process's global symbols unless the program loads it globally too.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fake_cudart.h"

#define FAKE_MAX_PTRS 4096

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stats fake_st;
static void *fake_ptrs[FAKE_MAX_PTRS];
static int fake_device, fake_capturing;
static size_t fake_limit = (size_t)1 << 30;
static int fake_version = 13000, fake_by_version = 1;
static void *fake_driver; /* libfake_cuda.so, never closed */

static cudaError_t fake_alloc(void **p, size_t size, int *counter)
{
	cudaError_t r = cudaErrorMemoryAllocation;

	if (!p)
		return cudaErrorInvalidValue;
	pthread_mutex_lock(&fake_lock);
	(*counter)++;
	for (int i = 0; i < FAKE_MAX_PTRS && size <= fake_limit; i++) {
		if (fake_ptrs[i])
			continue;
		fake_ptrs[i] = *p = malloc(size ? size : 1);
		r = *p ? cudaSuccess : cudaErrorMemoryAllocation;
		break;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

static cudaError_t fake_release(void *p, int *counter)
{
	cudaError_t r = cudaErrorInvalidValue;

	if (!p)
		return cudaSuccess;
	pthread_mutex_lock(&fake_lock);
	(*counter)++;
	for (int i = 0; i < FAKE_MAX_PTRS; i++) {
		if (fake_ptrs[i] == p) {
			free(p);
			fake_ptrs[i] = NULL;
			r = cudaSuccess;
			break;
		}
	}
	if (r != cudaSuccess)
		fake_st.bad_frees++;
	pthread_mutex_unlock(&fake_lock);
	return r;
}

FAKE_API cudaError_t cudaMalloc(void **p, size_t size)
{
	return fake_alloc(p, size, &fake_st.mallocs);
}

FAKE_API cudaError_t cudaFree(void *p)
{
	return fake_release(p, &fake_st.frees);
}

FAKE_API cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
	return fake_alloc(p, size, &fake_st.amallocs);
}

FAKE_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
	return fake_release(p, &fake_st.afrees);
}

FAKE_API cudaError_t cudaGetDevice(int *dev)
{
	pthread_mutex_lock(&fake_lock);
	*dev = fake_device;
	pthread_mutex_unlock(&fake_lock);
	return cudaSuccess;
}

FAKE_API cudaError_t cudaDeviceSynchronize(void)
{
	pthread_mutex_lock(&fake_lock);
	fake_st.syncs++;
	pthread_mutex_unlock(&fake_lock);
	return cudaSuccess;
}

FAKE_API cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
	pthread_mutex_lock(&fake_lock);
	*st = fake_capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
	pthread_mutex_unlock(&fake_lock);
	return cudaSuccess;
}

FAKE_API void fake_cudart_stats(struct fake_stats *out)
{
	pthread_mutex_lock(&fake_lock);
	*out = fake_st;
	pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cudart_set_device(int dev)
{
	pthread_mutex_lock(&fake_lock);
	fake_device = dev;
	pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cudart_set_capturing(int on)
{
	pthread_mutex_lock(&fake_lock);
	fake_capturing = on;
	pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cudart_set_limit(size_t bytes)
{
	pthread_mutex_lock(&fake_lock);
	fake_limit = bytes;
	pthread_mutex_unlock(&fake_lock);
}

/*
 * IPC: the stand-in's handles name its own pointers by address ("FAKEIPC"
 * + the pointer), which is all a test needs to see that a call of memory
 * that is not gmbd's reached the runtime; a handle it did not make is an
 * invalid resource handle, as the runtime says.
 */
static const char fake_ipc_magic[8] = "FAKEIPC";

FAKE_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
	cudaError_t r = cudaErrorInvalidValue;

	pthread_mutex_lock(&fake_lock);
	fake_st.ipc_gets++;
	for (int i = 0; h && p && i < FAKE_MAX_PTRS; i++) {
		if (fake_ptrs[i] != p)
			continue;
		memset(h, 0, sizeof(*h));
		memcpy(h->reserved, fake_ipc_magic, sizeof(fake_ipc_magic));
		memcpy(h->reserved + 8, &p, sizeof(p));
		r = cudaSuccess;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

FAKE_API cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags)
{
	cudaError_t r = cudaErrorInvalidResourceHandle;

	(void)flags;
	pthread_mutex_lock(&fake_lock);
	fake_st.ipc_opens++;
	if (p && memcmp(h.reserved, fake_ipc_magic, sizeof(fake_ipc_magic)) == 0) {
		memcpy(p, h.reserved + 8, sizeof(*p));
		r = cudaSuccess;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

FAKE_API cudaError_t cudaIpcCloseMemHandle(void *p)
{
	pthread_mutex_lock(&fake_lock);
	fake_st.ipc_closes++;
	pthread_mutex_unlock(&fake_lock);
	return p ? cudaSuccess : cudaErrorInvalidValue;
}

FAKE_API void fake_cudart_set_version(int version)
{
	pthread_mutex_lock(&fake_lock);
	fake_version = version;
	pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cudart_set_by_version(int on)
{
	pthread_mutex_lock(&fake_lock);
	fake_by_version = on;
	pthread_mutex_unlock(&fake_lock);
}

FAKE_API cudaError_t cudaRuntimeGetVersion(int *v)
{
	if (!v)
		return cudaErrorInvalidValue;
	pthread_mutex_lock(&fake_lock);
	*v = fake_version;
	pthread_mutex_unlock(&fake_lock);
	return cudaSuccess;
}

typedef CUresult (*fake_gpa_fn)(const char *, void **, int, cuuint64_t,
				CUdriverProcAddressQueryResult *);

/* The stand-in driver's cuGetProcAddress_v2 (on its own handle: its own, never a preload's). */
static fake_gpa_fn fake_driver_gpa(void)
{
	static const char anchor;
	char path[PATH_MAX];
	fake_gpa_fn gpa = NULL;
	Dl_info info;
	void *sym;

	pthread_mutex_lock(&fake_lock);
	if (!fake_driver && dladdr(&anchor, &info) && info.dli_fname &&
	    strrchr(info.dli_fname, '/')) {
		snprintf(path, sizeof(path), "%.*s/libfake_cuda.so",
			 (int)(strrchr(info.dli_fname, '/') - info.dli_fname), info.dli_fname);
		fake_driver = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	}
	sym = fake_driver ? dlsym(fake_driver, "cuGetProcAddress_v2") : NULL;
	pthread_mutex_unlock(&fake_lock);
	memcpy(&gpa, &sym, sizeof(gpa));
	return gpa;
}

static cudaError_t fake_entry(const char *symbol, void **fn, int version, unsigned long long flags,
			      enum cudaDriverEntryPointQueryResult *status)
{
	CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	fake_gpa_fn gpa = fake_driver_gpa();
	CUresult r;

	if (!gpa)
		return cudaErrorInitializationError;
	/* cudaEnable* and CU_GET_PROC_ADDRESS_* are the same numbers. */
	r = gpa(symbol, fn, version, flags, &q);
	if (status)
		*status = q == CU_GET_PROC_ADDRESS_SUCCESS ?
				  cudaDriverEntryPointSuccess :
			  q == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ?
				  cudaDriverEntryPointVersionNotSufficent :
				  cudaDriverEntryPointSymbolNotFound;
	return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorSymbolNotFound;
}

FAKE_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
						      unsigned int version,
						      unsigned long long flags,
						      enum cudaDriverEntryPointQueryResult *status)
{
	int on;

	pthread_mutex_lock(&fake_lock);
	fake_st.entry_lookups_by_version++;
	on = fake_by_version;
	pthread_mutex_unlock(&fake_lock);
	if (!on)
		return cudaErrorNotSupported;
	return fake_entry(symbol, fn, (int)version, flags, status);
}

FAKE_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn,
					     unsigned long long flags,
					     enum cudaDriverEntryPointQueryResult *status)
{
	int version;

	pthread_mutex_lock(&fake_lock);
	fake_st.entry_lookups++;
	version = fake_version;
	pthread_mutex_unlock(&fake_lock);
	return fake_entry(symbol, fn, version, flags, version >= 12000 ? status : NULL);
}
