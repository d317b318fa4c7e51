/*
 * ipc.c - the preload shim's calls of memory shared between processes and
 * its entry point lookups: the runtime's cudaIpcGetMemHandle,
 * cudaIpcOpenMemHandle and cudaIpcCloseMemHandle for gmbd memory and gmbd's
 * handles (libgmb's gmb_ipc_*), every other pointer and handle going to the
 * runtime unchanged; a handle without gmbd's magic never loads libgmb. The
 * driver's cuIpcGetMemHandle, cuIpcOpenMemHandle (both ABIs: the
 * unversioned symbol and _v2, which cuda.h's name means) and
 * cuIpcCloseMemHandle the same way, for code that calls the driver, with
 * the current context's device given access (cuCtxGetDevice: the driver's
 * CUdevice is the device's ordinal, what the runtime path passes). So that
 * code obtaining entry points at run time gets them too, cuGetProcAddress,
 * cuGetProcAddress_v2, cudaGetDriverEntryPoint and
 * cudaGetDriverEntryPointByVersion answer "cuIpcGetMemHandle",
 * "cuIpcOpenMemHandle" (the _v2 ABI, whatever version is asked: both ABIs
 * have the same C types) and "cuIpcCloseMemHandle" with the shim's
 * functions and success, and every other name with the real lookup's
 * answer. The event IPC calls are not touched; what else is not covered
 * (the _ptsz lookups, a cuGetProcAddress found through a lookup) is in
 * preload.c's header.
 *
 * Invariants:
 *   - No link-time tie to libcudart, libcuda or libgmb: the real functions
 *     come from shim_real_sym() (shim.h's SHIM_CALL), libgmb's from
 *     shim_gmb().
 *   - libgmb is asked about a pointer only when it is already bound or has
 *     announced itself (shim_gmb(false)); its -ENXIO means "not gmbd's",
 *     and the runtime or the driver answers.
 *   - Nothing here exits, aborts or prints: a failure is a cudaError_t, or
 *     a CUresult in the driver's calls (libgmb's sentence in
 *     gmb_region_last_error(), the shim's in gmb_preload_error()).
 * Thread-safety: no state of its own; everything is per call.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "client/preload/shim.h"

/* libgmb's -errno of an IPC call as the runtime's: a handle that names
 * nothing is an invalid resource handle, as the runtime says of its own. */
static cudaError_t shim_ipc_status(int rc)
{
	switch (rc) {
	case -ENOENT:
	case -EINVAL:
	case -EPROTO:
		return cudaErrorInvalidResourceHandle;
	case -EPERM:
		return cudaErrorNotPermitted;
	default:
		return shim_status(rc);
	}
}

/*
 * gmbd's handles start with its magic (common/ipc_handle.h), the runtime's
 * and the driver's never do; @h is CUDA_IPC_HANDLE_SIZE bytes.
 */
static bool shim_ipc_is_gmb(const char *h)
{
	return memcmp(h, "GMBIPC", 6) == 0;
}

SHIM_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr)
{
	const struct shim_gmb *g = ptr ? shim_gmb(false) : NULL;
	int rc;

	if (!handle)
		return cudaErrorInvalidValue;
	if (g) {
		rc = g->ipc_get_handle(NULL, ptr, handle->reserved);
		if (rc != -ENXIO)
			return shim_ipc_status(rc);
	}
	return SHIM_CALL(SHIM_IPC_GET, shim_ipc_get_fn, handle, ptr);
}

SHIM_API cudaError_t cudaIpcOpenMemHandle(void **ptr, cudaIpcMemHandle_t handle, unsigned int flags)
{
	const struct shim_gmb *g;
	cudaError_t r;
	int dev = 0;

	if (!ptr || !shim_ipc_is_gmb(handle.reserved))
		return SHIM_CALL(SHIM_IPC_OPEN, shim_ipc_open_fn, ptr, handle, flags);
	g = shim_gmb(true);
	if (!g)
		return cudaErrorInitializationError;
	/* The current device gets access (cudaIpcMemLazyEnablePeerAccess when another). */
	r = SHIM_CALL(SHIM_GET_DEVICE, shim_get_device_fn, &dev);
	if (r != cudaSuccess)
		return r;
	return shim_ipc_status(g->ipc_open(NULL, handle.reserved, dev, ptr));
}

SHIM_API cudaError_t cudaIpcCloseMemHandle(void *ptr)
{
	const struct shim_gmb *g = ptr ? shim_gmb(false) : NULL;
	int rc;

	if (g) {
		rc = g->ipc_close(NULL, ptr);
		if (rc != -ENXIO)
			return shim_ipc_status(rc);
	}
	return SHIM_CALL(SHIM_IPC_CLOSE, shim_ipc_close_fn, ptr);
}

/*
 * The driver's calls of memory shared between processes, as the runtime's
 * above: its CUresult of libgmb's -errno (the numbers are the runtime's
 * status numbers of the same names there): a handle that names nothing is
 * an invalid handle, another uid's allocation or a paused one is not
 * permitted, no gmbd is a device unavailable.
 */
static CUresult shim_cu_status(int rc)
{
	switch (rc) {
	case 0:
		return CUDA_SUCCESS;
	case -ENOENT:
	case -EINVAL:
	case -EPROTO:
		return CUDA_ERROR_INVALID_HANDLE;
	case -EPERM:
	case -EBUSY:
		return CUDA_ERROR_NOT_PERMITTED;
	case -ENOMEM:
		return CUDA_ERROR_OUT_OF_MEMORY;
	case -ENAMETOOLONG:
		return CUDA_ERROR_INVALID_VALUE;
	case -ENODEV:
		return CUDA_ERROR_INVALID_DEVICE;
	case -ECONNREFUSED:
	case -ENOTCONN:
	case -ECONNRESET:
	case -EPIPE:
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	case -ENOSYS:
		return CUDA_ERROR_NOT_INITIALIZED;
	default:
		return CUDA_ERROR_UNKNOWN;
	}
}

SHIM_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	const struct shim_gmb *g = dptr ? shim_gmb(false) : NULL;
	int rc;

	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	if (g) {
		rc = g->ipc_get_handle(NULL, (const void *)(uintptr_t)dptr, handle->reserved);
		if (rc != -ENXIO)
			return shim_cu_status(rc);
	}
	return SHIM_CU_CALL(SHIM_CU_IPC_GET, shim_cu_ipc_get_fn, handle, dptr);
}

/* Both ABIs of the open; @real is the one the caller called. */
static CUresult shim_cu_ipc_open(enum shim_real_fn real, CUdeviceptr *pdptr, CUipcMemHandle handle,
				 unsigned int flags)
{
	const struct shim_gmb *g;
	CUdevice dev = 0;
	void *p = NULL;
	CUresult r;
	int rc;

	if (!pdptr || !shim_ipc_is_gmb(handle.reserved))
		return SHIM_CU_CALL(real, shim_cu_ipc_open_fn, pdptr, handle, flags);
	g = shim_gmb(true);
	if (!g)
		return CUDA_ERROR_NOT_INITIALIZED;
	/* The current context's device gets access (the flags are about other devices). */
	r = SHIM_CU_CALL(SHIM_CU_CTX_GET_DEVICE, shim_cu_ctx_get_device_fn, &dev);
	if (r != CUDA_SUCCESS)
		return r;
	rc = g->ipc_open(NULL, handle.reserved, (int)dev, &p);
	if (rc == 0)
		*pdptr = (CUdeviceptr)(uintptr_t)p;
	return shim_cu_status(rc);
}

SHIM_API CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
						unsigned int flags)
{
	return shim_cu_ipc_open(SHIM_CU_IPC_OPEN, pdptr, handle, flags);
}

/*
 * The unversioned symbols are older ABIs that cuda.h renames its names
 * away from (cuIpcOpenMemHandle is cuIpcOpenMemHandle_v2 there, and
 * cuGetProcAddress cuGetProcAddress_v2); binaries built before still call them.
 */
#undef cuIpcOpenMemHandle
#undef cuGetProcAddress
SHIM_API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
					     unsigned int flags);
SHIM_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version,
					   cuuint64_t flags);

SHIM_API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
					     unsigned int flags)
{
	return shim_cu_ipc_open(SHIM_CU_IPC_OPEN_V1, pdptr, handle, flags);
}

SHIM_API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	const struct shim_gmb *g = dptr ? shim_gmb(false) : NULL;
	int rc;

	if (g) {
		rc = g->ipc_close(NULL, (void *)(uintptr_t)dptr);
		if (rc != -ENXIO)
			return shim_cu_status(rc);
	}
	return SHIM_CU_CALL(SHIM_CU_IPC_CLOSE, shim_cu_ipc_close_fn, dptr);
}

/* Entry points looked up at run time. */

/* POSIX guarantees a void * holds a function pointer (dlsym). */
#define SHIM_ADDR(fn)                                \
	__extension__({                              \
		__typeof__(&fn) fn_ = &fn;           \
		void *addr_;                         \
		memcpy(&addr_, &fn_, sizeof(addr_)); \
		addr_;                               \
	})

/*
 * The shim's answer to a lookup of @symbol, or NULL for the real lookup's.
 * The open's is the _v2 ABI whatever version is asked (the same C types);
 * the real lookup is not asked, so a driver that lacks a name or refuses
 * the version changes nothing: the shim's function serves gmbd's memory,
 * and passes the rest on as its symbol's does.
 */
static void *shim_lookup_own(const char *symbol, void **pfn)
{
	if (!symbol || !pfn)
		return NULL;
	if (strcmp(symbol, "cuIpcGetMemHandle") == 0)
		return SHIM_ADDR(cuIpcGetMemHandle);
	if (strcmp(symbol, "cuIpcOpenMemHandle") == 0)
		return SHIM_ADDR(cuIpcOpenMemHandle_v2);
	if (strcmp(symbol, "cuIpcCloseMemHandle") == 0)
		return SHIM_ADDR(cuIpcCloseMemHandle);
	return NULL;
}

SHIM_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
					      cuuint64_t flags,
					      CUdriverProcAddressQueryResult *status)
{
	void *own = shim_lookup_own(symbol, pfn);

	if (!own)
		return SHIM_CU_CALL(SHIM_CU_GPA, shim_cu_gpa_fn, symbol, pfn, version, flags,
				    status);
	*pfn = own;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
	return CUDA_SUCCESS;
}

SHIM_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version,
					   cuuint64_t flags)
{
	void *own = shim_lookup_own(symbol, pfn);

	if (!own)
		return SHIM_CU_CALL(SHIM_CU_GPA_V1, shim_cu_gpa_v1_fn, symbol, pfn, version, flags);
	*pfn = own;
	return CUDA_SUCCESS;
}

SHIM_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
						      unsigned int version,
						      unsigned long long flags,
						      enum cudaDriverEntryPointQueryResult *status)
{
	void *own = shim_lookup_own(symbol, fn);

	if (!own)
		return SHIM_CALL(SHIM_ENTRY_BY_VERSION, shim_entry_by_version_fn, symbol, fn,
				 version, flags, status);
	*fn = own;
	if (status)
		*status = cudaDriverEntryPointSuccess;
	return cudaSuccess;
}

SHIM_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn,
					     unsigned long long flags,
					     enum cudaDriverEntryPointQueryResult *status)
{
	void *own = shim_lookup_own(symbol, fn);

	/* A CUDA 11 runtime's has no status argument (an extra one is harmless). */
	if (!own)
		return SHIM_CALL(SHIM_ENTRY, shim_entry_fn, symbol, fn, flags, status);
	*fn = own;
	/* ... and for its callers what is there is no pointer to write through. */
	if (status && shim_runtime_version() >= 12000)
		*status = cudaDriverEntryPointSuccess;
	return cudaSuccess;
}
