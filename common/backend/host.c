/*
 * host.c - the "host" memory backend: the CUDA virtual memory model
 * with host memory, so that everything but the driver calls runs anywhere.
 *
 *   chunk        a sealed memfd (its size cannot change); handle = the fd
 *   export       a CLOEXEC dup of the memfd
 *   reservation  an mmap(PROT_NONE, MAP_NORESERVE) range of this process
 *   map          mmap(MAP_SHARED|MAP_FIXED) of the whole memfd, PROT_NONE
 *   set_access   mprotect(PROT_READ|PROT_WRITE); set_access_ro: PROT_READ
 *   unmap        a fresh PROT_NONE anonymous mapping over the range, so the
 *                VA stays reserved and the memfd reference is dropped
 *                (reservation to unmap: host_va.c)
 *
 * This file holds the simulated devices, physical memory (chunks made,
 * exported, imported, released), contents (sync, zero, copies, host
 * memory), setup and teardown, and the ops table. The address space
 * (reservations, mappings, access, their checks) is host_va.c's: contents
 * operations only look it up, and it calls nothing here.
 *
 * Invariants:
 *   - The driver's rules (backend.h) are enforced, each refusal with -EINVAL
 *     (-EBUSY for va_free of a range still mapped) and a reason in
 *     backend_last_error(): granularity multiples; whole chunks at offset 0,
 *     inside one reservation, over no existing mapping; no access until
 *     set_access; unmap and set_access cover whole mappings exactly.
 *   - chunks holds every handle this backend made or imported and has not
 *     released; a handle that is not in it is refused.
 *   - used[dev] counts the bytes of chunks created (not imported) on dev and
 *     not yet released; creation past the device's total is -ENOMEM, like
 *     cuMemCreate on a full GPU.
 *   - One mutex guards all of it, host_va.c's tables too: client libraries
 *     call from several threads. Contents operations check under it, then
 *     copy without it, as the driver does not order a copy against a
 *     concurrent unmap either.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/backend/host_state.h"
#include "common/idmap.h"
#include "common/size.h"

static const struct backend_ops host_ops;

/* Physical memory. */

static int host_account(struct backend *b, int dev, uint64_t size)
{
	struct host_priv *p = b->priv;
	uint64_t total = b->devices[dev].total_bytes;
	int rc = 0;

	pthread_mutex_lock(&p->lock);
	if (size > total - p->used[dev])
		rc = backend_fail(-ENOMEM,
				  "host backend: chunk_create: out of memory on %s: "
				  "0x%" PRIx64 " of 0x%" PRIx64 " in use, 0x%" PRIx64 " asked",
				  b->devices[dev].name, p->used[dev], total, size);
	else
		p->used[dev] += size;
	pthread_mutex_unlock(&p->lock);
	return rc;
}

/* A sealed memfd of @size: a client cannot shrink a chunk under another mapper. */
static int host_memfd_new(uint64_t size, int *fd)
{
	int s = memfd_create("gmb-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int rc;

	if (s < 0)
		return backend_fail(-errno, "host backend: chunk_create: memfd_create: %s",
				    strerror(errno));
	if (ftruncate(s, (off_t)size) < 0) {
		rc = backend_fail(-errno, "host backend: chunk_create: ftruncate 0x%" PRIx64 ": %s",
				  size, strerror(errno));
		goto out_fd;
	}
	if (fcntl(s, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		rc = backend_fail(-errno, "host backend: chunk_create: seal: %s", strerror(errno));
		goto out_fd;
	}
	*fd = s;
	return 0;

out_fd:
	close(s);
	return rc;
}

static int host_chunk_add(struct host_priv *p, int fd, int dev, uint64_t size)
{
	struct host_chunk *c = malloc(sizeof(*c));
	int rc;

	if (!c)
		return backend_fail(-ENOMEM, "host backend: out of memory for a chunk record");
	*c = (struct host_chunk){ .dev = dev, .size = size };
	pthread_mutex_lock(&p->lock);
	rc = idmap_put(&p->chunks, host_chunk_key((uint64_t)fd), c);
	pthread_mutex_unlock(&p->lock);
	if (rc < 0) {
		free(c);
		return backend_fail(rc, "host backend: out of memory for the chunk table");
	}
	return 0;
}

static int host_chunk_create(struct backend *b, int dev, uint64_t size, uint64_t *handle)
{
	struct host_priv *p = b->priv;
	int rc, fd = -1;

	rc = host__check_dev(b, "chunk_create", dev);
	if (rc == 0)
		rc = host__check_size(p, "chunk_create", size);
	if (rc < 0)
		return rc;
	rc = host_account(b, dev, size);
	if (rc < 0)
		return rc;
	rc = host_memfd_new(size, &fd);
	if (rc < 0)
		goto out_account;
	rc = host_chunk_add(p, fd, dev, size);
	if (rc < 0)
		goto out_fd;
	*handle = (uint64_t)fd;
	return 0;

out_fd:
	close(fd);
out_account:
	pthread_mutex_lock(&p->lock);
	p->used[dev] -= size;
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static int host_chunk_export(struct backend *b, uint64_t handle, int *fd)
{
	struct host_priv *p = b->priv;
	int rc = 0, d = -1;

	pthread_mutex_lock(&p->lock);
	/* Under the lock: a concurrent release must not close the fd we dup. */
	if (!host_chunk_get(p, handle))
		rc = backend_fail(-EINVAL, "host backend: chunk_export: unknown handle %" PRIu64,
				  handle);
	else if ((d = fcntl((int)handle, F_DUPFD_CLOEXEC, 0)) < 0)
		rc = backend_fail(-errno, "host backend: chunk_export: dup: %s", strerror(errno));
	pthread_mutex_unlock(&p->lock);
	if (rc == 0)
		*fd = d;
	return rc;
}

static int host_chunk_import(struct backend *b, int fd, uint64_t size, uint64_t *handle)
{
	struct host_priv *p = b->priv;
	struct stat st;
	int rc, d;

	rc = host__check_size(p, "chunk_import", size);
	if (rc < 0)
		return rc;
	if (fd < 0 || fstat(fd, &st) < 0)
		return backend_fail(-EBADF, "host backend: chunk_import: bad fd %d", fd);
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size)
		return backend_fail(-EINVAL,
				    "host backend: chunk_import: fd %d holds 0x%" PRIx64
				    " bytes, not the chunk's 0x%" PRIx64,
				    fd, (uint64_t)st.st_size, size);
	d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (d < 0)
		return backend_fail(-errno, "host backend: chunk_import: dup: %s", strerror(errno));
	rc = host_chunk_add(p, d, -1, size);
	if (rc < 0) {
		close(d);
		return rc;
	}
	*handle = (uint64_t)d;
	return 0;
}

static int host_chunk_release(struct backend *b, uint64_t handle)
{
	struct host_priv *p = b->priv;
	struct host_chunk *c = NULL;

	pthread_mutex_lock(&p->lock);
	if (handle <= INT32_MAX)
		c = idmap_del(&p->chunks, host_chunk_key(handle));
	if (c && c->dev >= 0)
		p->used[c->dev] -= c->size;
	/* Mappings of the chunk keep their own reference, as in the driver. */
	if (c)
		close((int)handle);
	pthread_mutex_unlock(&p->lock);
	if (!c)
		return backend_fail(-EINVAL, "host backend: chunk_release: unknown handle %" PRIu64,
				    handle);
	free(c);
	return 0;
}

/* Contents. */

/* Drains served in this process: tests count them (a drain costs on a GPU). */
static atomic_uint_fast64_t host_syncs;

uint64_t backend_host_sync_count(void)
{
	return atomic_load(&host_syncs);
}

static int host_sync(struct backend *b, int dev)
{
	atomic_fetch_add(&host_syncs, 1);
	return host__check_dev(b, "sync", dev);
}

/* Checks that a contents operation on device memory [va, va+size) is allowed. */
static int host_check_contents(struct backend *b, const char *op, int dev, uintptr_t va,
			       uint64_t size, bool write)
{
	struct host_priv *p = b->priv;
	int rc;

	rc = host__check_dev(b, op, dev);
	if (rc < 0 || size == 0)
		return rc;
	pthread_mutex_lock(&p->lock);
	rc = host__check_access(p, op, va, size, write);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static int host_zero(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	int rc = host_check_contents(b, "zero", dev, va, size, true);

	if (rc == 0 && size)
		memset((void *)va, 0, size);
	return rc;
}

static int host_copy_to_host(struct backend *b, int dev, void *dst, uintptr_t src, uint64_t size)
{
	int rc;

	if (!dst && size)
		return backend_fail(-EINVAL, "host backend: copy_to_host: no destination");
	rc = host_check_contents(b, "copy_to_host", dev, src, size, false);
	if (rc == 0 && size)
		memcpy(dst, (const void *)src, size);
	return rc;
}

static int host_copy_from_host(struct backend *b, int dev, uintptr_t dst, const void *src,
			       uint64_t size)
{
	int rc;

	if (!src && size)
		return backend_fail(-EINVAL, "host backend: copy_from_host: no source");
	rc = host_check_contents(b, "copy_from_host", dev, dst, size, true);
	if (rc == 0 && size)
		memcpy((void *)dst, src, size);
	return rc;
}

static int host_host_alloc(struct backend *b, uint64_t size, void **p)
{
	void *m;

	(void)b;
	if (size == 0 || !p)
		return backend_fail(-EINVAL, "host backend: host_alloc: size 0");
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return backend_fail(-ENOMEM, "host backend: host_alloc: 0x%" PRIx64 " bytes: %s",
				    size, strerror(errno));
	*p = m;
	return 0;
}

static void host_host_free(struct backend *b, void *p, uint64_t size)
{
	(void)b;
	if (p && size)
		munmap(p, size);
}

/*
 * 1 when every byte of [@p, @p + @size) is mapped writable, from
 * /proc/self/maps; 0 when not; a negative errno when the table cannot be read.
 */
static int host_range_writable(const void *p, uint64_t size)
{
	uintptr_t at = (uintptr_t)p, end = (uintptr_t)p + size;
	char line[512], perms[8];
	unsigned long lo, hi;
	FILE *f = fopen("/proc/self/maps", "re");

	if (!f)
		return -errno;
	while (at < end && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || hi <= at)
			continue;
		if (lo > at || perms[1] != 'w')
			break;
		at = hi;
	}
	fclose(f);
	return at >= end;
}

/*
 * Nothing to pin here; the driver's rules are checked: whole pages, mapped,
 * and writable (cuMemHostRegister without CU_MEMHOSTREGISTER_READ_ONLY
 * refuses a read-only mapping with CUDA_ERROR_INVALID_VALUE).
 */
static int host_host_register(struct backend *b, void *p, uint64_t size)
{
	long page = sysconf(_SC_PAGESIZE);
	unsigned char vec;

	(void)b;
	if (!p || size == 0 || (uintptr_t)p % (uintptr_t)page || size % (uint64_t)page)
		return backend_fail(-EINVAL,
				    "host backend: host_register: %p + 0x%" PRIx64
				    " is not whole pages",
				    p, size);
	if (mincore(p, (size_t)page, &vec) < 0)
		return backend_fail(-EFAULT, "host backend: host_register: %p is not mapped: %s", p,
				    strerror(errno));
	if (host_range_writable(p, size) == 0)
		return backend_fail(-EINVAL,
				    "host backend: host_register: %p + 0x%" PRIx64
				    " is not all mapped writable",
				    p, size);
	return 0;
}

static void host_host_unregister(struct backend *b, void *p, uint64_t size)
{
	(void)b;
	(void)p;
	(void)size;
}

/* Setup and teardown. */

static void host_close(struct backend *b)
{
	struct host_priv *p;
	uint64_t key;
	void *val;

	if (!b)
		return;
	p = b->priv;
	/* Reservations contain every mapping, so this drops those too. */
	for (size_t i = 0; i < p->resv.n; i++)
		munmap((void *)p->resv.v[i].va, p->resv.v[i].size);
	for (size_t it = 0; idmap_next(&p->chunks, &it, &key, &val);) {
		close((int)(key - 1));
		free(val);
	}
	idmap_deinit(&p->chunks);
	host__table_free(&p->resv);
	host__table_free(&p->maps);
	pthread_mutex_destroy(&p->lock);
	free(p);
	free(b);
}

static int host_check_opts(const struct backend_host_opts *o)
{
	long page = sysconf(_SC_PAGESIZE);
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];

	if (o->ndevices < 1 || o->ndevices > BACKEND_MAX_DEVICES)
		return backend_fail(-EINVAL, "host backend: %d devices (want 1..%d)", o->ndevices,
				    BACKEND_MAX_DEVICES);
	if (o->granularity < 4096 || (o->granularity & (o->granularity - 1)) ||
	    (page > 0 && o->granularity % (uint64_t)page))
		return backend_fail(-EINVAL,
				    "host backend: granularity %" PRIu64
				    " bytes (%s) is not a power"
				    " of two of at least 4 KiB and the page size (%ld bytes)",
				    o->granularity, size_str(o->granularity, b1), page);
	if (o->memory < o->granularity)
		return backend_fail(-EINVAL,
				    "host backend: memory %" PRIu64 " bytes (%s) is less than one"
				    " granule (%s)",
				    o->memory, size_str(o->memory, b1),
				    size_str(o->granularity, b2));
	return 0;
}

int backend_host_open(const struct backend_host_opts *opts, struct backend **out)
{
	static const struct backend_host_opts defaults = BACKEND_HOST_OPTS_INIT;
	struct host_priv *p;
	struct backend *b;
	int rc;

	if (!out)
		return backend_fail(-EINVAL, "host backend: no place for the result");
	*out = NULL;
	if (!opts)
		opts = &defaults;
	rc = host_check_opts(opts);
	if (rc < 0)
		return rc;
	b = calloc(1, sizeof(*b));
	p = calloc(1, sizeof(*p));
	if (!b || !p) {
		rc = backend_fail(-ENOMEM, "host backend: out of memory");
		goto out_alloc;
	}
	rc = -pthread_mutex_init(&p->lock, NULL);
	if (rc < 0) {
		backend_fail(rc, "host backend: mutex: %s", strerror(-rc));
		goto out_alloc;
	}
	p->gran = opts->granularity;
	p->outside = opts->outside;
	b->ops = &host_ops;
	b->priv = p;
	b->ndevices = opts->ndevices;
	for (int i = 0; i < b->ndevices; i++) {
		snprintf(b->devices[i].name, sizeof(b->devices[i].name), "host%d", i);
		/* Every process that opens the host backend sees the same uuids. */
		memcpy(b->devices[i].uuid, "gmb-host-device", 15);
		b->devices[i].uuid[15] = (uint8_t)i;
		b->devices[i].ordinal = i;
		b->devices[i].total_bytes = opts->memory;
		b->devices[i].granularity = opts->granularity;
	}
	*out = b;
	return 0;

out_alloc:
	free(p);
	free(b);
	return rc;
}

/* Host memory needs no queue: the queued operations run at once. */
static int host_contents_queue(struct backend *b, int dev, enum backend_contents op, void *host,
			       uintptr_t va, uint64_t size)
{
	switch (op) {
	case BACKEND_TO_HOST:
		return host_copy_to_host(b, dev, host, va, size);
	case BACKEND_FROM_HOST:
		return host_copy_from_host(b, dev, va, host, size);
	case BACKEND_ZERO:
		return host_zero(b, dev, va, size);
	}
	return backend_fail(-EINVAL, "host backend: contents: unknown operation %d", (int)op);
}

static int host_wait(struct backend *b, int dev)
{
	return host__check_dev(b, "wait", dev);
}

/* The simulated driver: this process's chunks plus the others' use. */
static int host_driver_mem(struct backend *b, int dev, uint64_t *total, uint64_t *used)
{
	struct host_priv *p = b->priv;
	int rc = host__check_dev(b, "driver_mem", dev);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&p->lock);
	*total = b->devices[dev].total_bytes;
	*used = p->used[dev] + p->outside;
	if (*used > *total)
		*used = *total;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

/* The host backend keeps nothing for its copies. */
static void host_contents_release(struct backend *b, int dev)
{
	(void)b;
	(void)dev;
}

static const struct backend_ops host_ops = {
	.name = "host",
	.chunk_fds = 1,
	.close = host_close,
	.chunk_create = host_chunk_create,
	.chunk_export = host_chunk_export,
	.chunk_import = host_chunk_import,
	.chunk_adopt = host_chunk_import, /* the handle is the memfd: export dups it */
	.chunk_release = host_chunk_release,
	.va_reserve = host__va_reserve,
	.va_free = host__va_free,
	.map = host__map,
	.set_access = host__set_access,
	.set_access_peers = host__set_access_peers,
	.set_access_ro = host__set_access_ro,
	.unmap = host__unmap,
	.sync = host_sync,
	.zero = host_zero,
	.copy_to_host = host_copy_to_host,
	.copy_from_host = host_copy_from_host,
	.contents_queue = host_contents_queue,
	.wait = host_wait,
	.contents_release = host_contents_release,
	.host_alloc = host_host_alloc,
	.host_free = host_host_free,
	.host_register = host_host_register,
	.host_unregister = host_host_unregister,
	.driver_mem = host_driver_mem,
	.driver_source = "host",
};
