/*
 * host_va.c - the host backend's virtual address ranges: reservations,
 * mappings of whole chunks, access (read-write, read-only, peers) and
 * unmapping, kept in two sorted tables, with the checks of the driver's
 * rules on them (device index, granularity multiples, whole mappings).
 * They form one model of this process's address space, apart from the
 * chunks: host.c's ops table points at the operations here and its contents
 * operations look the tables up, while this file calls nothing in host.c
 * (a chunk's record is read through host_state.h).
 *
 * Invariants:
 *   - resv and maps are sorted by address and never overlap within a table;
 *     every mapping lies inside one reservation.
 *   - Each refusal is -EINVAL (-EBUSY for va_free of a range still mapped,
 *     -EACCES for a write check on a read-only mapping) with a reason in
 *     backend_last_error(): whole chunks at offset 0, inside one
 *     reservation, over no existing mapping; no access until set_access;
 *     unmap and set_access cover whole mappings exactly.
 *   - The tables are read and changed under the backend's one mutex
 *     (host_state.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/backend/host_state.h"

#define HOST_NONE SIZE_MAX

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

void host__table_free(struct host_table *t)
{
	free(t->v);
	*t = (struct host_table){ 0 };
}

int host__check_dev(struct backend *b, const char *op, int dev)
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

int host__check_size(struct host_priv *p, const char *op, uint64_t size)
{
	if (size == 0)
		return backend_fail(-EINVAL, "host backend: %s: size 0", op);
	return host_check_gran(p, op, "size", size);
}

static int host_check_range(struct host_priv *p, const char *op, uintptr_t va, uint64_t size)
{
	int rc = host_check_gran(p, op, "address", va);

	if (rc == 0)
		rc = host__check_size(p, op, size);
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
int host__check_access(struct host_priv *p, const char *op, uintptr_t va, uint64_t size, bool write)
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

int host__va_reserve(struct backend *b, uint64_t size, uint64_t align, uintptr_t *va)
{
	struct host_priv *p = b->priv;
	int rc;

	rc = host__check_size(p, "va_reserve", size);
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

int host__va_free(struct backend *b, uintptr_t va, uint64_t size)
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

int host__map(struct backend *b, uintptr_t va, uint64_t size, uint64_t handle)
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

int host__set_access_peers(struct backend *b, int dev, uint64_t peers, uintptr_t va, uint64_t size)
{
	struct host_priv *p = b->priv;
	int rc;

	rc = host__check_dev(b, "set_access", dev);
	/* One mprotect serves every device, but a peer must be one, as on cuda. */
	for (int d = 0; d < BACKEND_MAX_DEVICES && rc == 0; d++)
		if (peers & (1ULL << d))
			rc = host__check_dev(b, "set_access (peer)", d);
	if (rc < 0)
		return rc;
	return host_range_locked(p, host_set_access_locked, va, size);
}

int host__set_access(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	return host__set_access_peers(b, dev, 0, va, size);
}

int host__set_access_ro(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	int rc = host__check_dev(b, "set_access_ro", dev);

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

int host__unmap(struct backend *b, uintptr_t va, uint64_t size)
{
	return host_range_locked(b->priv, host_unmap_locked, va, size);
}
