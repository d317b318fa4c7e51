/*
 * shim.h - what the files of libgmb_preload.so share: the index and the C
 * type of each real runtime and driver function and the call through them
 * (SHIM_CALL), the table of libgmb's functions, and the helpers of the
 * shim's core (preload.c) that the IPC and lookup overrides (ipc.c) call.
 *
 * Private to client/preload/. The library is built with -fvisibility=hidden,
 * so the non-static shim_ names here stay inside it; only what is marked
 * SHIM_API is exported.
 *
 * Invariants: a real function is reached only through shim_real_sym() (the
 * SHIM_CALL macros), never by name at link time, so the shim has no NEEDED
 * entry for libcudart or libcuda; libgmb only through shim_gmb()'s table,
 * published once and never freed, so a pointer to it stays valid for the
 * life of the process. A function that is not there is a status (the
 * runtime's cudaErrorInitializationError, the driver's
 * CUDA_ERROR_NOT_INITIALIZED), with the reason in gmb_preload_error():
 * nothing exits or prints.
 */
#ifndef GMB_CLIENT_PRELOAD_SHIM_H
#define GMB_CLIENT_PRELOAD_SHIM_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "include/gmb.h"

#define SHIM_API __attribute__((visibility("default")))

/* The real functions, by index into preload.c's shim_reals: the runtime's, then the driver's. */
enum shim_real_fn {
	SHIM_MALLOC,
	SHIM_FREE,
	SHIM_GET_DEVICE,
	SHIM_SYNC,
	SHIM_MALLOC_ASYNC,
	SHIM_FREE_ASYNC,
	SHIM_IS_CAPTURING,
	SHIM_IPC_GET,
	SHIM_IPC_OPEN,
	SHIM_IPC_CLOSE,
	SHIM_RT_VERSION,
	SHIM_ENTRY,
	SHIM_ENTRY_BY_VERSION,
	SHIM_CU_IPC_GET,
	SHIM_CU_IPC_OPEN,
	SHIM_CU_IPC_OPEN_V1,
	SHIM_CU_IPC_CLOSE,
	SHIM_CU_CTX_GET_DEVICE,
	SHIM_CU_GPA,
	SHIM_CU_GPA_V1,
	SHIM_NREAL
};

/*
 * The next definition of @fn after this library or, for the driver's, the
 * runtime's entry point; NULL when neither is there (the reason in
 * gmb_preload_error(), retried next time). preload.c.
 */
void *shim_real_sym(enum shim_real_fn fn);

/* POSIX guarantees a void * holds a function pointer (dlsym). */
#define SHIM_CALL_OR(fn, type, fail, ...)        \
	__extension__({                          \
		void *sym_ = shim_real_sym(fn);  \
		type f_;                         \
		memcpy(&f_, &sym_, sizeof(f_));  \
		sym_ ? f_(__VA_ARGS__) : (fail); \
	})
#define SHIM_CALL(fn, type, ...)    SHIM_CALL_OR(fn, type, cudaErrorInitializationError, __VA_ARGS__)
#define SHIM_CU_CALL(fn, type, ...) SHIM_CALL_OR(fn, type, CUDA_ERROR_NOT_INITIALIZED, __VA_ARGS__)

/* Their C types, as cuda_runtime_api.h and cuda.h declare them. */
typedef cudaError_t (*shim_malloc_fn)(void **, size_t);
typedef cudaError_t (*shim_free_fn)(void *);
typedef cudaError_t (*shim_get_device_fn)(int *);
typedef cudaError_t (*shim_sync_fn)(void);
typedef cudaError_t (*shim_malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*shim_free_async_fn)(void *, cudaStream_t);
typedef cudaError_t (*shim_is_capturing_fn)(cudaStream_t, enum cudaStreamCaptureStatus *);
typedef cudaError_t (*shim_ipc_get_fn)(cudaIpcMemHandle_t *, void *);
typedef cudaError_t (*shim_ipc_open_fn)(void **, cudaIpcMemHandle_t, unsigned int);
typedef cudaError_t (*shim_ipc_close_fn)(void *);
typedef cudaError_t (*shim_rt_version_fn)(int *);
typedef cudaError_t (*shim_entry_fn)(const char *, void **, unsigned long long,
				     enum cudaDriverEntryPointQueryResult *);
typedef cudaError_t (*shim_entry_by_version_fn)(const char *, void **, unsigned int,
						unsigned long long,
						enum cudaDriverEntryPointQueryResult *);
typedef CUresult (*shim_cu_ipc_get_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*shim_cu_ipc_open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*shim_cu_ipc_close_fn)(CUdeviceptr);
typedef CUresult (*shim_cu_ctx_get_device_fn)(CUdevice *);
typedef CUresult (*shim_cu_gpa_fn)(const char *, void **, int, cuuint64_t,
				   CUdriverProcAddressQueryResult *);
typedef CUresult (*shim_cu_gpa_v1_fn)(const char *, void **, int, cuuint64_t);

/* What the shim calls in libgmb (include/gmb.h). */
struct shim_gmb {
	int (*region_current)(char *tag, size_t cap, int *mode);
	int (*region_malloc)(gmb_client *c, void **ptr, size_t size, int device);
	int (*owns)(gmb_client *c, const void *ptr);
	int (*default_client)(const char *path, const char *name, gmb_client **out);
	int (*free)(gmb_client *c, void *ptr);
	int (*ipc_get_handle)(gmb_client *c, const void *ptr, void *handle);
	int (*ipc_open)(gmb_client *c, const void *handle, int device, void **ptr);
	int (*ipc_close)(gmb_client *c, void *ptr);
	void *handle; /* the libgmb the functions come from; a reference, never closed */
};

/*
 * The process's libgmb, or NULL (the reason in gmb_preload_error()).
 * Loaded only when @load; otherwise found only if it announced itself
 * (gmb_preload_attach). Two atomic loads when there is none. preload.c.
 */
const struct shim_gmb *shim_gmb(bool load);
/* gmbd's -errno as the runtime's nearest status. preload.c. */
cudaError_t shim_status(int rc);
/* The runtime's version (cudaRuntimeGetVersion), 0 when unknown. preload.c. */
int shim_runtime_version(void);

#endif
