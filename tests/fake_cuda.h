/*
 * fake_cuda.h - the test hooks of libfake_cuda.so (tests/fake_cuda.c), a
 * stand-in CUDA driver whose soname is libcuda.so.1: a test that dlopens it
 * first gets it from the cuda backend's own dlopen("libcuda.so.1"), so the
 * backend's logic (device slots, granularity, contexts, capture modes,
 * access descriptors) runs without a GPU; and the driver's CUDA IPC calls
 * and entry point lookups for the preload shim's tests (through the
 * stand-in runtime, tests/fake_cudart.c, which loads it as libcudart loads
 * libcuda). The test finds the hooks with dlsym; nothing links against the
 * stand-in.
 */
#ifndef GMB_TEST_FAKE_CUDA_H
#define GMB_TEST_FAKE_CUDA_H

#include <stdint.h>

#define FAKE_CUDA_MAX_DEVICES 8
#define FAKE_CUDA_TOTAL	      (80ULL << 30)

/* What the stand-in saw since fake_cuda_setup(); devices by ordinal. */
struct fake_cuda_stats {
	int retains[FAKE_CUDA_MAX_DEVICES]; /* cuDevicePrimaryCtxRetain */
	int ctx_syncs;			    /* cuCtxSynchronize */
	int stream_syncs;		    /* cuStreamSynchronize */
	int sync_dev;			    /* the current context's device at the last sync */
	int sync_mode;			    /* the thread's capture mode at the last sync */
	int copy_mode;			    /* ... at the last copy or memset */
	int host_alloc_dev;		    /* the current context's device at cuMemHostAlloc */
	int creates;			    /* cuMemCreate that succeeded */
	int exports;			    /* cuMemExportToShareableHandle (a memfd each) */
	int access_calls;		    /* cuMemSetAccess */
	int access_n;			    /* its last descriptor count */
	int access_ids[FAKE_CUDA_MAX_DEVICES];
	int access_mode; /* the thread's capture mode at the last one */
	/* CUDA IPC (tests/test_ipc_driver.c): the calls that reached the stand-in */
	int ipc_gets, ipc_opens, ipc_opens_v1, ipc_closes;
	unsigned int ipc_flags; /* of the last open */
	int ctx_devs;		/* cuCtxGetDevice (ABI 2000) */
	int ctx_devs_v2;	/* its ABI 13000, which lookups at 13000 on give */
	int lookups;		/* cuGetProcAddress and _v2 */
};

/*
 * fake_cuda_setup() - @n devices (ordinals 0..n-1), device i with
 * granularity @gran[i] and uuid fake_cuda_uuid(i); clears the stats.
 */
void fake_cuda_setup(int n, const uint64_t *gran);
void fake_cuda_uuid(int dev, uint8_t uuid[16]);
/* Marks device @dev's primary context active, as an application's would be. */
void fake_cuda_set_active(int dev);
/*
 * Makes device @dev's primary context the calling thread's only current
 * one (what the runtime leaves after cudaSetDevice); -1: none.
 */
void fake_cuda_set_current(int dev);
/* What the stand-in's own cuGetProcAddress_v2 answers for @symbol at @version. */
void *fake_cuda_lookup(const char *symbol, int version);
void fake_cuda_stats(struct fake_cuda_stats *out);

#endif
