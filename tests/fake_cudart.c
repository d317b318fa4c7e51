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
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fake_cudart.h"

#define FAKE_MAX_PTRS 4096

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stats fake_st;
static void *fake_ptrs[FAKE_MAX_PTRS];
static int fake_device, fake_capturing;
static size_t fake_limit = (size_t)1 << 30;

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
