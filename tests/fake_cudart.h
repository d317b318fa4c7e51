/*
 * fake_cudart.h - the test hooks of libfake_cudart.so (tests/fake_cudart.c),
 * the stand-in CUDA runtime of the preload shim's tests.
 */
#ifndef GMB_TEST_FAKE_CUDART_H
#define GMB_TEST_FAKE_CUDART_H

#include <stddef.h>

#define FAKE_API __attribute__((visibility("default")))

/* Calls served by the stand-in since the process started. */
struct fake_stats {
	int mallocs, frees, bad_frees, syncs, amallocs, afrees;
	int ipc_gets, ipc_opens, ipc_closes; /* the cudaIpc*MemHandle calls it served */
	int entry_lookups;		     /* cudaGetDriverEntryPoint */
	int entry_lookups_by_version;	     /* cudaGetDriverEntryPointByVersion */
};

FAKE_API void fake_cudart_stats(struct fake_stats *out);
/* What cudaGetDevice() answers (default 0). */
FAKE_API void fake_cudart_set_device(int dev);
/* Whether cudaStreamIsCapturing() says every stream is capturing. */
FAKE_API void fake_cudart_set_capturing(int on);
/* Allocations above @bytes fail with cudaErrorMemoryAllocation (default 1 GiB). */
FAKE_API void fake_cudart_set_limit(size_t bytes);
/*
 * What cudaRuntimeGetVersion() answers (default 13000), which is also the
 * version cudaGetDriverEntryPoint() looks names up at; below 12000 it
 * writes no status, as CUDA 11's had no such argument.
 */
FAKE_API void fake_cudart_set_version(int version);
/* 0: cudaGetDriverEntryPointByVersion() fails, as a runtime before 12.5 lacks it. */
FAKE_API void fake_cudart_set_by_version(int on);

#endif
