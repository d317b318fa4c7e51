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
 *
 * Invariants:
 *   - The driver's rules (backend.h) are enforced, each refusal with -EINVAL
 *     (-EBUSY for va_free of a range still mapped) and a reason in
 *     backend_last_error(): granularity multiples; whole chunks at offset 0,
 *     inside one reservation, over no existing mapping; no access until
 *     set_access; unmap and set_access cover whole mappings exactly.
 *   - resv and maps are sorted by address and never overlap within a table;
 *     every mapping lies inside one reservation.
 *   - chunks holds every handle this backend made or imported and has not
 *     released; a handle that is not in it is refused.
 *   - used[dev] counts the bytes of chunks created (not imported) on dev and
 *     not yet released; creation past the device's total is -ENOMEM, like
 *     cuMemCreate on a full GPU.
 *   - One mutex guards all of it: client libraries call from several
 *     threads. Contents operations check under it, then copy without it, as
 *     the driver does not order a copy against a concurrent unmap either.
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

#include "common/backend/backend.h"
#include "common/idmap.h"
#include "common/size.h"

struct host_range {
	uintptr_t va;
	uint64_t size;
	bool access; /* mappings only: set_access was called */
	bool ro;     /* ... set_access_ro: the device's writes fault */
};

struct host_table {
	struct host_range *v;
	size_t n, cap;
};

struct host_chunk {
	int dev; /* -1 for an imported chunk */
	uint64_t size;
};

struct host_priv {
	pthread_mutex_t lock;
	uint64_t gran;
	uint64_t used[BACKEND_MAX_DEVICES];
	uint64_t outside;    /* the simulated use of other processes, per device */
	struct idmap chunks; /* handle + 1 -> struct host_chunk */
	struct host_table resv;
	struct host_table maps;
};

#define HOST_NONE SIZE_MAX

static const struct backend_ops host_ops;

/* Handles are fds, and idmap reserves key 0. */
static uint64_t host_chunk_key(uint64_t handle)
{
	return handle + 1;
}

static struct host_chunk *host_chunk_get(struct host_priv *p, uint64_t handle)
{
	if (handle > INT32_MAX)
		return NULL;
	return idmap_get(&p->chunks, host_chunk_key(handle));
}

static int host_table_reserve(struct host_table *t, size_t extra)
{
	size_t cap = t->cap ? t->cap : 16;
	struct host_range *v;

	if (t->n + extra <= t->cap)
		return 0;
	while (cap < t->n + extra)
		cap *= 2;
	v = realloc(t->v, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	t->v = v;
	t->cap = cap;
	return 0;
}

/* Index of the last range starting at or before @va, or HOST_NONE. */
static size_t host_table_floor(const struct host_table *t, uintptr_t va)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (t->v[mid].va <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo == 0 ? HOST_NONE : lo - 1;
}

/* Capacity must have been reserved: inserting never fails. */
static void host_table_insert(struct host_table *t, struct host_range r)
{
	size_t i = host_table_floor(t, r.va);

	i = i == HOST_NONE ? 0 : i + 1;
	memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(t->v[0]));
	t->v[i] = r;
	t->n++;
}

static void host_table_remove(struct host_table *t, size_t i, size_t count)
{
	memmove(&t->v[i], &t->v[i + count], (t->n - i - count) * sizeof(t->v[0]));
	t->n -= count;
}

static void host_table_free(struct host_table *t)
{
	free(t->v);
	*t = (struct host_table){ 0 };
}

static int host_check_dev(struct backend *b, const char *op, int dev)
{
	if (dev < 0 || dev >= b->ndevices)
		return backend_fail(-EINVAL, "host backend: %s: no device %d (have %d)", op, dev,
				    b->ndevices);
	return 0;
}

static int host_check_gran(struct host_priv *p, const char *op, const char *what, uint64_t v)
{
	if (v % p->gran)
		return backend_fail(-EINVAL,
				    "host backend: %s: %s 0x%" PRIx64
				    " is not a multiple of the granularity 0x%" PRIx64,
				    op, what, v, p->gran);
	return 0;
}

static int host_check_size(struct host_priv *p, const char *op, uint64_t size)
{
	if (size == 0)
		return backend_fail(-EINVAL, "host backend: %s: size 0", op);
	return host_check_gran(p, op, "size", size);
}

static int host_check_range(struct host_priv *p, const char *op, uintptr_t va, uint64_t size)
{
	int rc = host_check_gran(p, op, "address", va);

	if (rc == 0)
		rc = host_check_size(p, op, size);
	if (rc == 0 && size > UINTPTR_MAX - va)
		rc = backend_fail(-EINVAL,
				  "host backend: %s: range 0x%" PRIxPTR "+0x%" PRIx64
				  " wraps around",
				  op, va, size);
	return rc;
}

/*
 * The mappings that tile [va, va+size) exactly, back to back, starting and
 * ending on mapping boundaries. Return: 0 with @first and @count set, or -EINVAL.
 */
static int host_maps_span(struct host_priv *p, const char *op, uintptr_t va, uint64_t size,
			  size_t *first, size_t *count)
{
	size_t i = host_table_floor(&p->maps, va), j;
	uintptr_t end = va + size, cur;

	if (size == 0 || end < va)
		return backend_fail(-EINVAL, "host backend: %s: empty or wrapping range", op);
	if (i == HOST_NONE || p->maps.v[i].va != va)
		return backend_fail(-EINVAL,
				    "host backend: %s: no mapping starts at 0x%" PRIxPTR
				    " (ranges must cover whole mappings)",
				    op, va);
	for (j = i, cur = va; j < p->maps.n && p->maps.v[j].va == cur && cur < end; j++)
		cur += p->maps.v[j].size;
	if (cur != end)
		return backend_fail(-EINVAL,
				    "host backend: %s: 0x%" PRIxPTR "+0x%" PRIx64
				    " does not end on a mapping boundary or has a hole"
				    " (mappings cover up to 0x%" PRIxPTR ")",
				    op, va, size, cur);
	*first = i;
	*count = j - i;
	return 0;
}

/* Every byte of [va, va+size) mapped and accessible (any sub-range will do);
 * @write: writable too (the driver refuses a copy into a read-only range). */
static int host_check_access(struct host_priv *p, const char *op, uintptr_t va, uint64_t size,
			     bool write)
{
	size_t i = host_table_floor(&p->maps, va);
	uintptr_t end = va + size, cur = va;

	if (end < va)
		return backend_fail(-EINVAL, "host backend: %s: range wraps around", op);
	for (; cur < end; i++) {
		const struct host_range *m = i < p->maps.n ? &p->maps.v[i] : NULL;

		if (!m || m->va > cur || m->va + m->size <= cur)
			return backend_fail(
				-EINVAL, "host backend: %s: 0x%" PRIxPTR " is not mapped", op, cur);
		if (!m->access)
			return backend_fail(-EINVAL,
					    "host backend: %s: mapping at 0x%" PRIxPTR
					    " has no access (set_access first)",
					    op, m->va);
		if (write && m->ro)
			return backend_fail(-EACCES,
					    "host backend: %s: mapping at 0x%" PRIxPTR
					    " is read-only",
					    op, m->va);
		cur = m->va + m->size;
	}
	return 0;
}

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

	rc = host_check_dev(b, "chunk_create", dev);
	if (rc == 0)
		rc = host_check_size(p, "chunk_create", size);
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

	rc = host_check_size(p, "chunk_import", size);
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

/* Virtual address ranges. */

static int host_va_reserve_locked(struct host_priv *p, uint64_t size, uint64_t align, uintptr_t *va)
{
	uintptr_t base, start, end;
	uint64_t total = size + align;
	void *m;

	if (host_table_reserve(&p->resv, 1) < 0)
		return backend_fail(-ENOMEM, "host backend: va_reserve: out of memory");
	/* Over-reserve by the alignment, then trim both ends. */
	m = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return backend_fail(-ENOMEM, "host backend: va_reserve: 0x%" PRIx64 " bytes: %s",
				    size, strerror(errno));
	base = (uintptr_t)m;
	start = (base + align - 1) & ~(uintptr_t)(align - 1);
	end = start + size;
	if (start > base)
		munmap(m, start - base);
	if (base + total > end)
		munmap((void *)end, base + total - end);
	host_table_insert(&p->resv, (struct host_range){ .va = start, .size = size });
	*va = start;
	return 0;
}

static int host_va_reserve(struct backend *b, uint64_t size, uint64_t align, uintptr_t *va)
{
	struct host_priv *p = b->priv;
	int rc;

	rc = host_check_size(p, "va_reserve", size);
	if (rc < 0)
		return rc;
	if (align & (align - 1))
		return backend_fail(-EINVAL,
				    "host backend: va_reserve: alignment 0x%" PRIx64
				    " is not a power of two",
				    align);
	if (align < p->gran)
		align = p->gran;
	if (size > UINT64_MAX - align || size + align > UINTPTR_MAX)
		return backend_fail(-ENOMEM, "host backend: va_reserve: 0x%" PRIx64 " is too large",
				    size);
	pthread_mutex_lock(&p->lock);
	rc = host_va_reserve_locked(p, size, align, va);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static int host_va_free_locked(struct host_priv *p, uintptr_t va, uint64_t size)
{
	size_t i = host_table_floor(&p->resv, va);
	size_t m = size ? host_table_floor(&p->maps, va + size - 1) : HOST_NONE;

	if (i == HOST_NONE || p->resv.v[i].va != va || p->resv.v[i].size != size)
		return backend_fail(-EINVAL,
				    "host backend: va_free: 0x%" PRIxPTR "+0x%" PRIx64
				    " is not a whole reservation",
				    va, size);
	if (m != HOST_NONE && p->maps.v[m].va + p->maps.v[m].size > va)
		return backend_fail(-EBUSY,
				    "host backend: va_free: 0x%" PRIxPTR
				    " is still mapped at 0x%" PRIxPTR " (unmap first)",
				    va, p->maps.v[m].va);
	if (munmap((void *)va, size) < 0)
		return backend_fail(-errno, "host backend: va_free: munmap: %s", strerror(errno));
	host_table_remove(&p->resv, i, 1);
	return 0;
}

/* @fn on [va, va+size) under the lock of the tables. */
static int host_range_locked(struct host_priv *p,
			     int (*fn)(struct host_priv *, uintptr_t, uint64_t), uintptr_t va,
			     uint64_t size)
{
	int rc;

	pthread_mutex_lock(&p->lock);
	rc = fn(p, va, size);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static int host_va_free(struct backend *b, uintptr_t va, uint64_t size)
{
	return host_range_locked(b->priv, host_va_free_locked, va, size);
}

/* Where a new mapping of [va, va+size) may go: inside one reservation, over no mapping. */
static int host_map_place(struct host_priv *p, uintptr_t va, uint64_t size)
{
	size_t r = host_table_floor(&p->resv, va);
	size_t m = host_table_floor(&p->maps, va + size - 1);

	if (r == HOST_NONE || va + size > p->resv.v[r].va + p->resv.v[r].size)
		return backend_fail(-EINVAL,
				    "host backend: map: 0x%" PRIxPTR "+0x%" PRIx64
				    " is not inside one reservation",
				    va, size);
	if (m != HOST_NONE && p->maps.v[m].va + p->maps.v[m].size > va)
		return backend_fail(-EINVAL,
				    "host backend: map: 0x%" PRIxPTR "+0x%" PRIx64
				    " overlaps the mapping at 0x%" PRIxPTR,
				    va, size, p->maps.v[m].va);
	return 0;
}

static int host_map_locked(struct host_priv *p, uintptr_t va, uint64_t size, uint64_t handle)
{
	struct host_chunk *c = host_chunk_get(p, handle);
	int rc;

	if (!c)
		return backend_fail(-EINVAL, "host backend: map: unknown handle %" PRIu64, handle);
	rc = host_check_range(p, "map", va, size);
	if (rc < 0)
		return rc;
	/* The driver maps a handle whole, at offset 0. */
	if (size != c->size)
		return backend_fail(-EINVAL,
				    "host backend: map: size 0x%" PRIx64
				    " is not the chunk's size 0x%" PRIx64,
				    size, c->size);
	rc = host_map_place(p, va, size);
	if (rc < 0)
		return rc;
	if (host_table_reserve(&p->maps, 1) < 0)
		return backend_fail(-ENOMEM, "host backend: map: out of memory");
	if (mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, (int)handle, 0) == MAP_FAILED)
		return backend_fail(-errno, "host backend: map: mmap: %s", strerror(errno));
	host_table_insert(&p->maps, (struct host_range){ .va = va, .size = size });
	return 0;
}

static int host_map(struct backend *b, uintptr_t va, uint64_t size, uint64_t handle)
{
	struct host_priv *p = b->priv;
	int rc;

	pthread_mutex_lock(&p->lock);
	rc = host_map_locked(p, va, size, handle);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static int host_protect_locked(struct host_priv *p, const char *op, uintptr_t va, uint64_t size,
			       int prot)
{
	size_t first, count;
	int rc;

	rc = host_maps_span(p, op, va, size, &first, &count);
	if (rc < 0)
		return rc;
	if (mprotect((void *)va, size, prot) < 0)
		return backend_fail(-errno, "host backend: %s: mprotect: %s", op, strerror(errno));
	for (size_t i = first; i < first + count; i++) {
		p->maps.v[i].access = true;
		p->maps.v[i].ro = !(prot & PROT_WRITE);
	}
	return 0;
}

static int host_set_access_locked(struct host_priv *p, uintptr_t va, uint64_t size)
{
	return host_protect_locked(p, "set_access", va, size, PROT_READ | PROT_WRITE);
}

/* PROT_READ only: a write faults (SIGSEGV), as a GPU's write to a read-only mapping does. */
static int host_set_access_ro_locked(struct host_priv *p, uintptr_t va, uint64_t size)
{
	return host_protect_locked(p, "set_access_ro", va, size, PROT_READ);
}

static int host_set_access_peers(struct backend *b, int dev, uint64_t peers, uintptr_t va,
				 uint64_t size)
{
	struct host_priv *p = b->priv;
	int rc;

	rc = host_check_dev(b, "set_access", dev);
	/* One mprotect serves every device, but a peer must be one, as on cuda. */
	for (int d = 0; d < BACKEND_MAX_DEVICES && rc == 0; d++)
		if (peers & (1ULL << d))
			rc = host_check_dev(b, "set_access (peer)", d);
	if (rc < 0)
		return rc;
	return host_range_locked(p, host_set_access_locked, va, size);
}

static int host_set_access(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	return host_set_access_peers(b, dev, 0, va, size);
}

static int host_set_access_ro(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	int rc = host_check_dev(b, "set_access_ro", dev);

	if (rc < 0)
		return rc;
	return host_range_locked(b->priv, host_set_access_ro_locked, va, size);
}

static int host_unmap_locked(struct host_priv *p, uintptr_t va, uint64_t size)
{
	size_t first, count;
	void *m;
	int rc;

	rc = host_maps_span(p, "unmap", va, size, &first, &count);
	if (rc < 0)
		return rc;
	/* Replacing, not munmap: the VA must stay reserved, as cuMemUnmap leaves it. */
	m = mmap((void *)va, size, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return backend_fail(-errno, "host backend: unmap: mmap: %s", strerror(errno));
	host_table_remove(&p->maps, first, count);
	return 0;
}

static int host_unmap(struct backend *b, uintptr_t va, uint64_t size)
{
	return host_range_locked(b->priv, host_unmap_locked, va, size);
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
	return host_check_dev(b, "sync", dev);
}

/* Checks that a contents operation on device memory [va, va+size) is allowed. */
static int host_check_contents(struct backend *b, const char *op, int dev, uintptr_t va,
			       uint64_t size, bool write)
{
	struct host_priv *p = b->priv;
	int rc;

	rc = host_check_dev(b, op, dev);
	if (rc < 0 || size == 0)
		return rc;
	pthread_mutex_lock(&p->lock);
	rc = host_check_access(p, op, va, size, write);
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
	host_table_free(&p->resv);
	host_table_free(&p->maps);
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
	return host_check_dev(b, "wait", dev);
}

/* The simulated driver: this process's chunks plus the others' use. */
static int host_driver_mem(struct backend *b, int dev, uint64_t *total, uint64_t *used)
{
	struct host_priv *p = b->priv;
	int rc = host_check_dev(b, "driver_mem", dev);

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
	.va_reserve = host_va_reserve,
	.va_free = host_va_free,
	.map = host_map,
	.set_access = host_set_access,
	.set_access_peers = host_set_access_peers,
	.set_access_ro = host_set_access_ro,
	.unmap = host_unmap,
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
