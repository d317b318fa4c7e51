/*
 * idmap.h - open-addressing hash map from a non-zero uint64 key to a pointer.
 * Used for chunk ids, allocation ids and addresses. The map owns only its
 * table; values belong to the caller.
 */
#ifndef GMB_IDMAP_H
#define GMB_IDMAP_H

#include <stddef.h>
#include <stdint.h>

struct idmap {
	uint64_t *keys; /* 0 = empty, UINT64_MAX = deleted */
	void **vals;
	size_t cap; /* power of two or 0 */
	size_t count;
	size_t used; /* count + tombstones */
};

#define IDMAP_INIT \
	{          \
		0  \
	}

void idmap_deinit(struct idmap *m);
/* Inserts or replaces; -ENOMEM on allocation failure, -EINVAL for key 0. */
int idmap_put(struct idmap *m, uint64_t key, void *val);
void *idmap_get(const struct idmap *m, uint64_t key);
/* Removes and returns the value (NULL if absent). */
void *idmap_del(struct idmap *m, uint64_t key);

/* Iteration: for (size_t i = 0; idmap_next(m, &i, &k, &v);) */
int idmap_next(const struct idmap *m, size_t *iter, uint64_t *key, void **val);
/* Ascending order of ids, for qsort() and bsearch() over a uint64_t array. */
static inline int idmap_cmp_key(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? -1 : a > b;
}

#endif
