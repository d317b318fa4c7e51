/*
 * idmap.c - open-addressing hash map from a uint64 key to a pointer.
 *
 * Invariants:
 *   - cap is 0 or a power of two; slots are probed linearly from the key's
 *     hash, so a lookup stops at the first empty slot (key 0).
 *   - A deleted slot holds a tombstone (UINT64_MAX) so that probe chains
 *     through it stay intact; used = live keys + tombstones, and the table
 *     grows (or is rebuilt at the same size to drop tombstones) before used
 *     would pass 70% of cap. Hence an empty slot always exists and every
 *     probe ends.
 *   - Keys 0 and UINT64_MAX are the markers, so they are refused (-EINVAL).
 *   - Deleting during iteration is safe (slots never move on delete);
 *     inserting during iteration is not (it may rebuild the table).
 */
#include <errno.h>
#include <stdlib.h>

#include "common/idmap.h"

#define IDMAP_EMPTY   0
#define IDMAP_TOMB    UINT64_MAX
#define IDMAP_MIN_CAP 16

/* splitmix64's finalizer: ids and addresses are sequential or aligned. */
static size_t idmap_hash(uint64_t key, size_t cap)
{
	key ^= key >> 30;
	key *= 0xbf58476d1ce4e5b9ULL;
	key ^= key >> 27;
	key *= 0x94d049bb133111ebULL;
	key ^= key >> 31;
	return (size_t)key & (cap - 1);
}

static int idmap_key_valid(uint64_t key)
{
	return key != IDMAP_EMPTY && key != IDMAP_TOMB;
}

void idmap_deinit(struct idmap *m)
{
	if (!m)
		return;
	free(m->keys);
	free(m->vals);
	*m = (struct idmap)IDMAP_INIT;
}

/* Slot of @key, or SIZE_MAX when absent. */
static size_t idmap_find(const struct idmap *m, uint64_t key)
{
	if (m->cap == 0)
		return SIZE_MAX;
	for (size_t i = idmap_hash(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
		if (m->keys[i] == key)
			return i;
		if (m->keys[i] == IDMAP_EMPTY)
			return SIZE_MAX;
	}
}

/* Moves every live entry into fresh arrays of @cap slots; tombstones vanish. */
static int idmap_rebuild(struct idmap *m, size_t cap)
{
	uint64_t *keys = calloc(cap, sizeof(*keys));
	void **vals = calloc(cap, sizeof(*vals));

	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->cap; i++) {
		size_t j;

		if (!idmap_key_valid(m->keys[i]))
			continue;
		for (j = idmap_hash(m->keys[i], cap); keys[j]; j = (j + 1) & (cap - 1))
			;
		keys[j] = m->keys[i];
		vals[j] = m->vals[i];
	}
	free(m->keys);
	free(m->vals);
	m->keys = keys;
	m->vals = vals;
	m->cap = cap;
	m->used = m->count;
	return 0;
}

/* Makes room for one more used slot while staying under 70%. */
static int idmap_reserve_one(struct idmap *m)
{
	size_t cap = m->cap ? m->cap : IDMAP_MIN_CAP;

	if (m->cap && (m->used + 1) * 10 <= m->cap * 7)
		return 0;
	/* Size for live keys only, at most half full after the rebuild. */
	while ((m->count + 1) * 2 > cap) {
		if (cap > SIZE_MAX / 2 / sizeof(uint64_t))
			return -ENOMEM;
		cap *= 2;
	}
	return idmap_rebuild(m, cap);
}

int idmap_put(struct idmap *m, uint64_t key, void *val)
{
	size_t i, slot = SIZE_MAX;
	int rc;

	if (!m || !idmap_key_valid(key))
		return -EINVAL;
	i = idmap_find(m, key);
	if (i != SIZE_MAX) {
		m->vals[i] = val;
		return 0;
	}
	rc = idmap_reserve_one(m);
	if (rc < 0)
		return rc;
	/* Reuse the first tombstone on the key's chain, else the empty slot that ends it. */
	for (i = idmap_hash(key, m->cap); m->keys[i] != IDMAP_EMPTY; i = (i + 1) & (m->cap - 1))
		if (m->keys[i] == IDMAP_TOMB && slot == SIZE_MAX)
			slot = i;
	if (slot == SIZE_MAX) {
		slot = i;
		m->used++;
	}
	m->keys[slot] = key;
	m->vals[slot] = val;
	m->count++;
	return 0;
}

void *idmap_get(const struct idmap *m, uint64_t key)
{
	size_t i;

	if (!m || !idmap_key_valid(key))
		return NULL;
	i = idmap_find(m, key);
	return i == SIZE_MAX ? NULL : m->vals[i];
}

void *idmap_del(struct idmap *m, uint64_t key)
{
	size_t i;
	void *val;

	if (!m || !idmap_key_valid(key))
		return NULL;
	i = idmap_find(m, key);
	if (i == SIZE_MAX)
		return NULL;
	val = m->vals[i];
	m->vals[i] = NULL;
	m->count--;
	/* A chain that ends right after this slot does not need it kept. */
	if (m->keys[(i + 1) & (m->cap - 1)] == IDMAP_EMPTY) {
		m->keys[i] = IDMAP_EMPTY;
		m->used--;
	} else {
		m->keys[i] = IDMAP_TOMB;
	}
	return val;
}

int idmap_next(const struct idmap *m, size_t *iter, uint64_t *key, void **val)
{
	if (!m || !iter)
		return 0;
	for (size_t i = *iter; i < m->cap; i++) {
		if (!idmap_key_valid(m->keys[i]))
			continue;
		if (key)
			*key = m->keys[i];
		if (val)
			*val = m->vals[i];
		*iter = i + 1;
		return 1;
	}
	*iter = m->cap;
	return 0;
}
