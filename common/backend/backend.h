/*
 * backend.h - the memory backend interface shared by gmbd and libgmb.
 *
 * One interface, two implementations chosen at start: "host" (memfd chunks,
 * mmap'd VA ranges; runs anywhere) and "cuda" (the driver's virtual memory
 * API). The host backend enforces the driver's rules so that code that
 * passes on it does not break on CUDA:
 *   - chunk sizes, VA ranges and map/unmap ranges are multiples of the
 *     device's granularity;
 *   - map takes a whole chunk at offset 0 inside a reserved VA range, never
 *     over an existing mapping;
 *   - a fresh mapping has no access until set_access;
 *   - unmap covers whole mappings only; the VA stays reserved;
 *   - va_free needs the range unmapped.
 *
 * Handles: a chunk handle (uint64_t) is the backend's name for physical
 * memory in this process (host: a memfd; cuda: CUmemGenericAllocationHandle).
 * The memory lives while any handle, mapping or exported fd refers to it.
 *
 * Every operation returns 0 or a negative errno; on failure the backend
 * writes why (with the driver's error name) to backend_last_error() of the
 * calling thread.
 */
#ifndef GMB_BACKEND_H
#define GMB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#define BACKEND_MAX_DEVICES 64

struct backend_device {
	char name[96];
	/*
	 * Names the device across processes: device indexes are per process
	 * (CUDA_VISIBLE_DEVICES), so a client maps its own indexes to gmbd's
	 * by uuid. The host backend makes one up from the index.
	 */
	uint8_t uuid[16];
	/* This process's own index for it (the CUDA ordinal); -1: not visible here. */
	int ordinal;
	uint64_t total_bytes;
	uint64_t granularity;
};

struct backend;

enum backend_contents {
	BACKEND_TO_HOST,   /* device @va -> @host */
	BACKEND_FROM_HOST, /* @host -> device @va */
	BACKEND_ZERO,	   /* device @va = 0; @host unused */
};

struct backend_ops {
	const char *name; /* "host" or "cuda" */
	/* fds this process keeps open for each live chunk it created or
	 * adopted (host: its memfd; cuda: its one export, of which each
	 * chunk_export is a dup): gmbd's open-file budget. */
	unsigned chunk_fds;
	void (*close)(struct backend *b);

	/* Physical memory. create: a new zeroed, exportable chunk of @size. */
	int (*chunk_create)(struct backend *b, int dev, uint64_t size, uint64_t *handle);
	/* export: a new fd for the chunk, owned by the caller. */
	int (*chunk_export)(struct backend *b, uint64_t handle, int *fd);
	/* import: a handle from @fd; @fd stays owned (and open) by the caller. */
	int (*chunk_import)(struct backend *b, int fd, uint64_t size, uint64_t *handle);
	/*
	 * adopt: import a chunk this process will export again (gmbd's chunks
	 * back from its fd store); @fd stays the caller's. cuda: an imported
	 * handle cannot be exported, so the fd is kept; host: chunk_import.
	 */
	int (*chunk_adopt)(struct backend *b, int fd, uint64_t size, uint64_t *handle);
	int (*chunk_release)(struct backend *b, uint64_t handle);

	/* Virtual address ranges of this process. */
	int (*va_reserve)(struct backend *b, uint64_t size, uint64_t align, uintptr_t *va);
	int (*va_free)(struct backend *b, uintptr_t va, uint64_t size);
	int (*map)(struct backend *b, uintptr_t va, uint64_t size, uint64_t handle);
	int (*set_access)(struct backend *b, int dev, uintptr_t va, uint64_t size);
	/*
	 * set_access for @dev and for each device whose bit is set in @peers
	 * (device indexes of this backend; @dev's own bit may be set): all of
	 * them read and write the range. A peer must exist and be visible.
	 */
	int (*set_access_peers)(struct backend *b, int dev, uint64_t peers, uintptr_t va,
				uint64_t size);
	/*
	 * set_access, read-only for @dev: a write to the range faults (host:
	 * SIGSEGV; cuda: CU_MEM_ACCESS_FLAGS_PROT_READ). Named objects' versions.
	 */
	int (*set_access_ro)(struct backend *b, int dev, uintptr_t va, uint64_t size);
	int (*unmap)(struct backend *b, uintptr_t va, uint64_t size);

	/* Contents (client side). sync drains the device's queued work. */
	int (*sync)(struct backend *b, int dev);
	int (*zero)(struct backend *b, int dev, uintptr_t va, uint64_t size);
	int (*copy_to_host)(struct backend *b, int dev, void *dst, uintptr_t src, uint64_t size);
	int (*copy_from_host)(struct backend *b, int dev, uintptr_t dst, const void *src,
			      uint64_t size);
	/*
	 * The same three, queued: they return once queued in order on the
	 * device's own stream, and wait(dev) returns when all are done. Many
	 * small copies then run back to back instead of one wait each (20 MiB
	 * pieces waited for one by one reach under 90% of the copy bandwidth).
	 * @host must stay valid until wait(). On an error the operation waits
	 * for what it queued before returning. The host backend runs them at
	 * once.
	 */
	int (*contents_queue)(struct backend *b, int dev, enum backend_contents op, void *host,
			      uintptr_t va, uint64_t size);
	int (*wait)(struct backend *b, int dev);
	/*
	 * What the contents operations keep for @dev goes (cuda: the stream and
	 * the retained primary context, ~500 MiB of GPU memory in a process that
	 * has no context of its own; host: nothing); the next one takes them
	 * again. gmbd calls it after copying a named object's bytes, so that it
	 * holds no context between pauses. No contents operation may be running.
	 */
	void (*contents_release)(struct backend *b, int dev);
	/* Host staging memory for preserved tags (pinned on cuda). */
	int (*host_alloc)(struct backend *b, uint64_t size, void **p);
	void (*host_free)(struct backend *b, void *p, uint64_t size);
	/*
	 * Pinning of memory the caller made (page-aligned, whole pages), so that
	 * it is the driver's host memory until unregister (cuda: a pointer
	 * cudaHostGetFlags accepts); the host backend only checks the range.
	 */
	int (*host_register)(struct backend *b, void *p, uint64_t size);
	void (*host_unregister)(struct backend *b, void *p, uint64_t size);
	/*
	 * The device's memory as its driver sees it, every process's use
	 * included, without a context (cuda: NVML, loaded on first use; host:
	 * the simulated device, with --host-used-outside). -ENOTSUP when the
	 * driver cannot say (no NVML). @source: "nvml" or "host".
	 */
	int (*driver_mem)(struct backend *b, int dev, uint64_t *total, uint64_t *used);
	const char *driver_source;
};

struct backend {
	const struct backend_ops *ops;
	void *priv; /* owned by the implementation, freed by ops->close */
	int ndevices;
	struct backend_device devices[BACKEND_MAX_DEVICES];
};

struct backend_host_opts {
	int ndevices;	      /* default 1 */
	uint64_t memory;      /* bytes per device, default 8 GiB */
	uint64_t granularity; /* default 2 MiB */
	uint64_t outside;     /* bytes per device the driver view counts as used by
				  other processes (default 0) */
};

#define BACKEND_HOST_OPTS_INIT                                                 \
	{                                                                      \
		.ndevices = 1, .memory = 8ULL << 30, .granularity = 2ULL << 20 \
	}

/**
 * backend_open() - open a backend by kind: "host", "cuda" or "auto".
 * @kind: "auto" picks cuda when a driver and a GPU answer, else host.
 * @host: host backend settings (also used when auto falls back).
 * @out:  receives the backend, owned by the caller (backend_close()).
 *
 * Return: 0, or a negative errno with backend_last_error() saying why
 * (-ENODEV: no CUDA driver or GPU; -EINVAL: unknown kind).
 */
int backend_open(const char *kind, const struct backend_host_opts *host, struct backend **out);
void backend_close(struct backend *b);

int backend_host_open(const struct backend_host_opts *opts, struct backend **out);
/* How many times host backends of this process drained a device (sync), for tests. */
uint64_t backend_host_sync_count(void);
int backend_cuda_open(struct backend **out);
/*
 * backend_cuda_open_order() - the cuda backend with its devices in the order
 * of @uuids (gmbd's), so that a client's device indexes are gmbd's whatever
 * CUDA_VISIBLE_DEVICES says. A device this process cannot see keeps its
 * place with ordinal -1 and refuses every operation (-ENODEV).
 */
int backend_cuda_open_order(const uint8_t (*uuids)[16], int n, struct backend **out);

/* Why the calling thread's last backend operation failed ("" if unknown). */
const char *backend_last_error(void);
/*
 * backend_fail_msg() - "@what: <the backend's reason>" into @err (the
 * driver's error name when the backend said one, else strerror(-@rc)).
 * Return: @rc.
 */
int backend_fail_msg(char *err, int rc, const char *what);
/* Implementations record their reason with this; returns @err. */
int backend_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static inline uint64_t backend_round_up(uint64_t n, uint64_t gran)
{
	return (n + gran - 1) / gran * gran;
}

#endif
