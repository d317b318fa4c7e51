/*
 * test_idmap.c - common/idmap.c: values found under their keys after growth,
 * deletes and reinserts; tombstones do not make the table grow without
 * bound; iteration sees each live key once; the marker keys are refused.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/idmap.h"

static struct idmap m = IDMAP_INIT;

static void idmap_test_fini(void)
{
	idmap_deinit(&m);
}

TestSuite(idmap, .fini = idmap_test_fini, .timeout = 30);

/* Keys shaped like what gmbd stores: granularity-aligned addresses. */
static uint64_t addr_key(uint64_t i)
{
	return 0x7f0000000000ULL + i * (2ULL << 20);
}

static void *val_of(uint64_t i)
{
	return (void *)(uintptr_t)(i * 8 + 8);
}

static void check_load(const struct idmap *map)
{
	cr_assert(eq(sz, map->cap & (map->cap - 1), 0));
	cr_assert(le(sz, map->used * 10, map->cap * 7));
	cr_assert(le(sz, map->count, map->used));
}

Test(idmap, put_get_del_and_replace)
{
	int a, b;

	cr_assert(eq(ptr, idmap_get(&m, 5), NULL));
	cr_assert(eq(ptr, idmap_del(&m, 5), NULL));
	cr_assert(eq(i32, idmap_put(&m, 5, &a), 0));
	cr_assert(eq(i32, idmap_put(&m, 6, &b), 0));
	cr_assert(eq(ptr, idmap_get(&m, 5), &a));
	cr_assert(eq(ptr, idmap_get(&m, 6), &b));
	cr_assert(eq(sz, m.count, 2));
	cr_assert(eq(i32, idmap_put(&m, 5, &b), 0));
	cr_assert(eq(ptr, idmap_get(&m, 5), &b));
	cr_assert(eq(sz, m.count, 2));
	cr_assert(eq(ptr, idmap_del(&m, 5), &b));
	cr_assert(eq(ptr, idmap_get(&m, 5), NULL));
	cr_assert(eq(ptr, idmap_del(&m, 5), NULL));
	cr_assert(eq(ptr, idmap_get(&m, 6), &b));
	cr_assert(eq(sz, m.count, 1));
}

Test(idmap, grows_over_100k_keys_and_finds_every_one)
{
	const uint64_t n = 100000;

	for (uint64_t i = 0; i < n; i++) {
		cr_assert(eq(i32, idmap_put(&m, addr_key(i), val_of(i)), 0));
		cr_assert(eq(i32, idmap_put(&m, i + 1, val_of(i + n)), 0));
	}
	cr_assert(eq(sz, m.count, 2 * n));
	cr_assert(ge(sz, m.cap, 2 * n));
	check_load(&m);
	for (uint64_t i = 0; i < n; i++) {
		cr_assert(eq(ptr, idmap_get(&m, addr_key(i)), val_of(i)));
		cr_assert(eq(ptr, idmap_get(&m, i + 1), val_of(i + n)));
	}
	cr_assert(eq(ptr, idmap_get(&m, addr_key(n)), NULL));
	cr_assert(eq(ptr, idmap_get(&m, n + 1), NULL));
}

Test(idmap, deleted_slots_are_reused_so_churn_does_not_grow_the_table)
{
	size_t cap;

	for (uint64_t i = 1; i <= 64; i++)
		cr_assert(eq(i32, idmap_put(&m, i, val_of(i)), 0));
	cap = m.cap;
	/* A million put/del pairs of fresh keys, 64 live at any time. */
	for (uint64_t i = 65; i < 1000000; i++) {
		cr_assert(eq(ptr, idmap_del(&m, i - 64), val_of(i - 64)));
		cr_assert(eq(i32, idmap_put(&m, i, val_of(i)), 0));
	}
	cr_assert(eq(sz, m.count, 64));
	cr_assert(eq(sz, m.cap, cap));
	check_load(&m);
	for (uint64_t i = 1000000 - 64; i < 1000000; i++)
		cr_assert(eq(ptr, idmap_get(&m, i), val_of(i)));
	cr_assert(eq(ptr, idmap_get(&m, 1000000 - 65), NULL));
}

Test(idmap, reinserting_a_deleted_key_behind_a_tombstone_finds_one_copy)
{
	/* Delete from the middle of chains, then put the keys back: no duplicates. */
	for (uint64_t i = 1; i <= 1000; i++)
		cr_assert(eq(i32, idmap_put(&m, i, val_of(i)), 0));
	for (uint64_t i = 1; i <= 1000; i += 2)
		cr_assert(eq(ptr, idmap_del(&m, i), val_of(i)));
	for (uint64_t i = 1; i <= 1000; i++)
		cr_assert(eq(i32, idmap_put(&m, i, val_of(i + 1)), 0));
	cr_assert(eq(sz, m.count, 1000));
	for (uint64_t i = 1; i <= 1000; i++) {
		cr_assert(eq(ptr, idmap_del(&m, i), val_of(i + 1)));
		cr_assert(eq(ptr, idmap_get(&m, i), NULL));
	}
	cr_assert(eq(sz, m.count, 0));
	check_load(&m);
}

Test(idmap, iteration_visits_each_live_key_once)
{
	const uint64_t n = 5000;
	uint8_t *seen = calloc(n, 1);
	size_t visits = 0;
	uint64_t key;
	void *val;

	for (uint64_t i = 0; i < n; i++)
		cr_assert(eq(i32, idmap_put(&m, addr_key(i), val_of(i)), 0));
	for (uint64_t i = 0; i < n; i += 3)
		idmap_del(&m, addr_key(i));
	for (size_t it = 0; idmap_next(&m, &it, &key, &val);) {
		uint64_t i = (key - addr_key(0)) / (2ULL << 20);

		cr_assert(lt(u64, i, n));
		cr_assert(not(eq(u64, i % 3, 0)));
		cr_assert(eq(ptr, val, val_of(i)));
		cr_assert(eq(u8, seen[i], 0));
		seen[i] = 1;
		visits++;
	}
	cr_assert(eq(sz, visits, m.count));
	cr_assert(eq(sz, visits, n - (n + 2) / 3));
	free(seen);
}

Test(idmap, deleting_the_current_key_while_iterating_is_safe)
{
	size_t visits = 0;
	uint64_t key;

	for (uint64_t i = 1; i <= 500; i++)
		cr_assert(eq(i32, idmap_put(&m, i, val_of(i)), 0));
	for (size_t it = 0; idmap_next(&m, &it, &key, NULL);) {
		cr_assert(eq(ptr, idmap_del(&m, key), val_of(key)));
		visits++;
	}
	cr_assert(eq(sz, visits, 500));
	cr_assert(eq(sz, m.count, 0));
}

Test(idmap, marker_keys_are_refused)
{
	int a;

	cr_assert(eq(i32, idmap_put(&m, 0, &a), -EINVAL));
	cr_assert(eq(i32, idmap_put(&m, UINT64_MAX, &a), -EINVAL));
	cr_assert(eq(sz, m.count, 0));
	cr_assert(eq(i32, idmap_put(&m, 1, &a), 0));
	cr_assert(eq(ptr, idmap_get(&m, 0), NULL));
	cr_assert(eq(ptr, idmap_get(&m, UINT64_MAX), NULL));
	cr_assert(eq(ptr, idmap_del(&m, UINT64_MAX), NULL));
	cr_assert(eq(sz, m.count, 1));
	cr_assert(eq(ptr, idmap_get(&m, 1), &a));
}

Test(idmap, empty_and_deinited_maps_are_usable)
{
	size_t it = 0;
	int a;

	cr_assert(eq(i32, idmap_next(&m, &it, NULL, NULL), 0));
	cr_assert(eq(i32, idmap_put(&m, 9, &a), 0));
	idmap_deinit(&m);
	cr_assert(eq(sz, m.cap, 0));
	cr_assert(eq(ptr, idmap_get(&m, 9), NULL));
	cr_assert(eq(i32, idmap_put(&m, 9, &a), 0));
	cr_assert(eq(ptr, idmap_get(&m, 9), &a));
}
