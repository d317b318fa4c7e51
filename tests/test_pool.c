/*
 * test_pool.c - one device's pool over the real host backend: chunk sizing,
 * reuse of free chunks by uid and holder, the budget (refusal, releasing
 * idle chunks, -EAGAIN for held ones), shrink/keep, and injected backend
 * failures. Every test checks the byte counters against the lists and
 * counts the backend's memfds to prove that releases really happened.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/idmap.h"
#include "tests/util.h"
#include "daemon/core/pool.h"

#define MiB (1024ULL * 1024)
#define GiB (1024 * MiB)

/* Holders are only compared by address in the pool: any distinct pointers do. */
static char client_a, client_b;
#define CA ((struct bclient *)&client_a)
#define CB ((struct bclient *)&client_b)

static struct backend *be;
static struct pool pool;
static struct idmap reg = IDMAP_INIT;
static uint64_t next_id;

/* The host backend's chunks are memfds named "gmb-chunk": count the live ones. */
/* Counters against the lists: held = lent + free + pending, free list sorted. */
static void check_pool(const struct pool *p)
{
	uint64_t free_sum = 0, pend_sum = 0, prev = UINT64_MAX;
	uint32_t n = 0;

	for (const struct chunk *c = p->free_head; c; c = c->next, n++) {
		cr_assert(c->free && !c->releasing && !c->lent_to);
		cr_assert(c->size <= prev, "free list not sorted largest first");
		prev = c->size;
		free_sum += c->size;
	}
	for (const struct chunk *c = p->pending_head; c; c = c->next, n++) {
		cr_assert(c->releasing && !c->free && c->nholders > 0);
		pend_sum += c->size;
	}
	cr_assert(eq(u64, p->free_bytes, free_sum));
	cr_assert(eq(u64, p->pending_bytes, pend_sum));
	cr_assert(eq(u64, p->held_bytes, p->lent_bytes + p->free_bytes + p->pending_bytes));
	cr_assert(le(u32, n, p->nchunks));
	cr_assert(eq(sz, reg.count, (size_t)p->nchunks));
	cr_assert(eq(i32, proc_count_memfds(), (int)p->nchunks));
}

static void open_pool(uint64_t budget, uint64_t max_chunk, uint64_t keep)
{
	struct pool_cfg cfg = {
		.budget = budget, .max_chunk = max_chunk, .keep = keep, .registry = &reg
	};

	cr_assert(eq(i32, pool_init(&pool, be, 0, &cfg, &next_id), 0));
}

static void setup(void)
{
	struct backend_host_opts o = { .ndevices = 1, .memory = 8 * GiB, .granularity = 2 * MiB };

	cr_assert(eq(i32, backend_host_open(&o, &be), 0));
	next_id = 1;
	open_pool(4 * GiB, 1 * GiB, UINT64_MAX);
}

static void teardown(void)
{
	pool_deinit(&pool);
	cr_expect(eq(i32, proc_count_memfds(), 0), "chunks leaked past pool_deinit");
	idmap_deinit(&reg);
	test_backend_restore(be);
	backend_close(be);
	cr_expect(eq(i32, test_leak_check(), 0), "heap leaked: see the report");
}

TestSuite(pool, .init = setup, .fini = teardown, .timeout = 30);

/* Takes @size for @uid and lends every chunk to a dummy allocation. */
static struct pool_take take(uint64_t size, uid_t uid, struct bclient *prefer, int want_rc)
{
	struct pool_take t = { .size = size, .uid = uid, .prefer = prefer };

	cr_assert(eq(i32, pool_take(&pool, &t), want_rc));
	for (uint32_t i = 0; i < t.nchunks; i++)
		pool_lend(&pool, t.chunks[i], (struct balloc *)&pool);
	check_pool(&pool);
	return t;
}

static void put_all(struct pool_take *t)
{
	for (uint32_t i = 0; i < t->nchunks; i++)
		pool_put(&pool, t->chunks[i]);
	free(t->chunks);
	t->chunks = NULL;
	check_pool(&pool);
}

Test(pool, init_rounds_budget_and_max_chunk)
{
	pool_deinit(&pool);
	open_pool(0, 0, 0);
	cr_assert(eq(u64, pool.budget, 8 * GiB), "budget 0 = the device's total");
	cr_assert(eq(u64, pool.max_chunk, 1 * GiB), "max_chunk 0 = 1 GiB");
	pool_deinit(&pool);
	open_pool(5 * MiB, 3 * MiB, 0);
	cr_assert(eq(u64, pool.budget, 4 * MiB), "rounded down to the granularity");
	cr_assert(eq(u64, pool.max_chunk, 2 * MiB));
	pool_deinit(&pool);
	open_pool(1 * MiB, 1, 0);
	cr_assert(eq(u64, pool.budget, 2 * MiB), "never below one granule");
	cr_assert(eq(u64, pool.max_chunk, 2 * MiB));
	pool_deinit(&pool);
	open_pool(64 * GiB, 1 * GiB, 0);
	cr_assert(eq(u64, pool.budget, 8 * GiB), "never past the device");
}

Test(pool, take_sizes_chunks_by_max_chunk)
{
	struct pool_take t = take(20 * MiB, 1000, NULL, 0);

	cr_assert(eq(u32, t.nchunks, 1));
	cr_assert(eq(u32, t.ncreated, 1));
	cr_assert(eq(u64, t.chunks[0]->size, 20 * MiB));
	cr_assert(t.chunks[0]->uid_set && t.chunks[0]->uid == 1000);
	cr_assert(eq(ptr, idmap_get(&reg, t.chunks[0]->id), t.chunks[0]));
	put_all(&t);

	t = take(3 * GiB, 1000, NULL, 0);
	cr_assert(eq(u32, t.nchunks, 3));
	for (uint32_t i = 0; i < 3; i++)
		cr_assert(eq(u64, t.chunks[i]->size, 1 * GiB));
	cr_assert(eq(u64, pool.lent_bytes, 3 * GiB));
	put_all(&t);

	/* 2.5 GiB: two free 1 GiB chunks, then 512 MiB fresh: the free 20 MiB
	 * chunk would make it four chunks instead of three. */
	t = take(2 * GiB + 512 * MiB, 1000, NULL, 0);
	cr_assert(eq(u32, t.nchunks, 3));
	cr_assert(eq(u32, t.ncreated, 1));
	cr_assert(eq(u64, t.chunks[2]->size, 512 * MiB));
	cr_assert(eq(u64, pool.free_bytes, 1 * GiB + 20 * MiB));
	cr_assert(eq(i32, pool_take(&pool, &(struct pool_take){ .size = 3 * MiB }), -EINVAL));
	put_all(&t);
}

Test(pool, free_chunks_reused_largest_first_by_uid)
{
	struct pool_take a = take(1 * GiB + 20 * MiB, 1000, NULL, 0);
	uint64_t big = a.chunks[0]->id, small = a.chunks[1]->id;
	struct pool_take b;

	put_all(&a);
	cr_assert(eq(u64, pool.free_head->id, big));
	b = take(20 * MiB, 1000, NULL, 0);
	cr_assert(eq(u64, b.chunks[0]->id, small), "the chunk that fits, not the larger one");
	cr_assert(eq(u32, b.ncreated, 0));
	put_all(&b);
	/* Another uid gets fresh (zeroed) chunks; the old ones stay in the pool. */
	b = take(1 * GiB + 20 * MiB, 2000, NULL, 0);
	cr_assert(eq(u32, b.ncreated, 2));
	cr_assert(b.chunks[0]->id != big && b.chunks[1]->id != small);
	cr_assert(eq(u64, pool.free_bytes, 1 * GiB + 20 * MiB));
	put_all(&b);
}

Test(pool, small_free_chunks_skipped_unless_the_budget_needs_them)
{
	struct pool_take s = take(20 * MiB, 1000, NULL, 0);
	struct chunk *small = s.chunks[0];
	struct pool_take l, t;

	cr_assert(eq(i32, pool_hold(&pool, small, CA), 0));
	put_all(&s);
	t = take(1 * GiB, 1000, NULL, 0);
	cr_assert(eq(u32, t.nchunks, 1), "one fresh 1 GiB chunk, not 20 MiB + 1004 MiB");
	cr_assert(small->free);
	put_all(&t);
	pool_shrink(&pool, 20 * MiB, NULL);
	l = take(3 * GiB, 1000, NULL, 0);
	/* 1004 MiB of room left: now the held warm chunk must serve. */
	t = take(1 * GiB, 1000, NULL, 0);
	cr_assert(eq(u32, t.nchunks, 2));
	cr_assert(eq(ptr, t.chunks[0], small));
	cr_assert(eq(u64, pool.held_bytes, 4 * GiB));
	put_all(&t);
	put_all(&l);
	pool_forget(&pool, CA);
}

Test(pool, prefers_chunks_the_client_holds)
{
	struct pool_take a = take(3 * GiB, 1000, NULL, 0);
	struct chunk *mine = a.chunks[2];

	cr_assert(eq(i32, pool_hold(&pool, a.chunks[0], CB), 0));
	cr_assert(eq(i32, pool_hold(&pool, mine, CA), 0));
	put_all(&a);
	a = take(1 * GiB, 1000, CA, 0);
	cr_assert(eq(ptr, a.chunks[0], mine), "the chunk A holds: no fd to send");
	put_all(&a);
	/* Without a preference: an idle chunk before one B holds. */
	a = take(1 * GiB, 1000, NULL, 0);
	cr_assert(eq(u32, a.chunks[0]->nholders, 0));
	put_all(&a);
	pool_unhold(&pool, mine, CA, false);
	pool_forget(&pool, CB);
	cr_assert(eq(u32, pool.free_head->nholders, 0));
	cr_assert(eq(u32, pool.free_head->next->nholders, 0));
	check_pool(&pool);
}

Test(pool, budget_refusal_changes_nothing)
{
	struct pool_take a = take(3 * GiB, 1000, NULL, 0);
	struct pool_take b = { .size = 3 * GiB, .uid = 1000 };

	pool_put(&pool, a.chunks[2]); /* 1 GiB free; lent 2 GiB; budget 4 GiB */
	cr_assert(eq(i32, pool_take(&pool, &b), -ENOMEM));
	cr_assert(eq(u64, b.shortfall, 1 * GiB));
	cr_assert(eq(ptr, b.chunks, NULL));
	cr_assert(eq(u64, pool.free_bytes, 1 * GiB), "step 1's chunk went back");
	cr_assert(eq(u64, pool.held_bytes, 3 * GiB));
	cr_assert(eq(u32, pool.nchunks, 3));
	check_pool(&pool);
	pool_put(&pool, a.chunks[0]);
	pool_put(&pool, a.chunks[1]);
	free(a.chunks);
	check_pool(&pool);
}

Test(pool, releases_idle_chunks_to_make_room)
{
	struct pool_take a = take(4 * GiB, 1000, NULL, 0);
	struct pool_take b;

	put_all(&a);
	cr_assert(eq(i32, proc_count_memfds(), 4));
	/* Another uid cannot use them; two idle ones go back for two new ones. */
	b = take(2 * GiB, 2000, NULL, 0);
	cr_assert(eq(u32, b.ncreated, 2));
	cr_assert(eq(u64, pool.held_bytes, 4 * GiB));
	cr_assert(eq(u64, pool.free_bytes, 2 * GiB));
	cr_assert(eq(i32, proc_count_memfds(), 4));
	put_all(&b);
}

Test(pool, eagain_when_held_chunks_must_be_dropped)
{
	struct pool_take a = take(4 * GiB, 1000, NULL, 0);
	struct pool_take b = { .size = 1 * GiB, .uid = 2000 };

	for (uint32_t i = 0; i < 4; i++)
		cr_assert(eq(i32, pool_hold(&pool, a.chunks[i], CA), 0));
	put_all(&a);
	cr_assert(eq(i32, pool_take(&pool, &b), -EAGAIN));
	cr_assert(eq(u64, pool.pending_bytes, 1 * GiB), "one held chunk marked releasing");
	cr_assert(eq(u64, pool.free_bytes, 3 * GiB));
	check_pool(&pool);
	/* A second try while the drop is on its way marks nothing more. */
	cr_assert(eq(i32, pool_take(&pool, &b), -EAGAIN));
	cr_assert(eq(u64, pool.pending_bytes, 1 * GiB));
	/* The drop is acked: the chunk goes back, the retry succeeds. */
	pool.pending_head->holders[0].drop_sent = true;
	cr_assert(eq(i32, pool_unhold(&pool, pool.pending_head, CA, false), 0),
		  "drop_sent keeps the entry until the ack");
	cr_assert(eq(i32, pool_unhold(&pool, pool.pending_head, CA, true), 1));
	cr_assert(eq(u64, pool.pending_bytes, 0));
	cr_assert(eq(i32, proc_count_memfds(), 3));
	b = take(1 * GiB, 2000, NULL, 0);
	cr_assert(eq(u32, b.ncreated, 1));
	put_all(&b);
	pool_forget(&pool, CA);
	check_pool(&pool);
}

Test(pool, shrink_keeps_warm_bytes_and_marks_held_ones)
{
	struct pool_take a = take(3 * GiB, 1000, NULL, 0);
	uint64_t pending = 0;

	cr_assert(eq(i32, pool_hold(&pool, a.chunks[0], CA), 0));
	put_all(&a);
	cr_assert(eq(u64, pool_shrink(&pool, 1 * GiB, &pending), 2 * GiB),
		  "the two idle chunks go first");
	cr_assert(eq(u64, pending, 0));
	cr_assert(eq(u32, pool.free_head->nholders, 1));
	cr_assert(eq(u64, pool_shrink(&pool, 0, &pending), 0));
	cr_assert(eq(u64, pending, 1 * GiB), "the held one waits for its drop");
	check_pool(&pool);
	cr_assert(eq(i32, pool_unhold(&pool, pool.pending_head, CA, false), 1),
		  "no drop was sent: the last unhold releases it");
	cr_assert(eq(u32, pool.nchunks, 0));
	check_pool(&pool);
}

Test(pool, backend_failure_leaks_nothing)
{
	struct pool_take a = take(1 * GiB, 1000, NULL, 0);
	struct pool_take b = { .size = 4 * GiB, .uid = 1000 };

	put_all(&a);
	test_backend_fail_creates(be, 1);
	/* 1 GiB from the pool, one created, the second creation fails. */
	cr_assert(eq(i32, pool_take(&pool, &b), -EIO));
	cr_assert(eq(ptr, b.chunks, NULL));
	cr_assert(eq(u32, pool.nchunks, 1));
	cr_assert(eq(u64, pool.free_bytes, 1 * GiB));
	cr_assert(eq(u64, pool.lent_bytes, 0));
	check_pool(&pool);
	test_backend_restore(be);
}

Test(pool, untake_restores_the_pool)
{
	struct pool_take a = take(1 * GiB, 1000, NULL, 0);
	uint64_t id = a.chunks[0]->id;

	put_all(&a);
	a = take(3 * GiB, 1000, NULL, 0);
	cr_assert(eq(u32, a.ncreated, 2));
	pool_untake(&pool, &a);
	cr_assert(eq(u32, pool.nchunks, 1));
	cr_assert(eq(u64, pool.free_head->id, id));
	cr_assert(eq(u64, pool.lent_bytes, 0));
	check_pool(&pool);
}

Test(pool, available_counts_room_and_usable_chunks)
{
	struct pool_take a = take(2 * GiB, 1000, NULL, 0);

	cr_assert(eq(i32, pool_hold(&pool, a.chunks[0], CA), 0));
	put_all(&a);
	cr_assert(eq(u64, pool_available(&pool, 1000), 4 * GiB));
	cr_assert(eq(u64, pool_available(&pool, 2000), 3 * GiB),
		  "a chunk held by another uid's client is not available");
	pool_forget(&pool, CA);
}

/* The bounds a broker sets: checked before anything is taken or made. */
Test(pool, bounds_refuse_before_touching_a_chunk)
{
	struct pool_take warm = take(1 * GiB, 7, CA, 0), t;
	uint32_t created;

	put_all(&warm); /* one free 1 GiB chunk of uid 7 */
	created = (uint32_t)pool.chunks_created;

	/* 3 GiB: the free chunk and 2 new ones; only 2 chunks allowed. */
	t = (struct pool_take){
		.size = 3 * GiB, .uid = 7, .bounded = true, .max_chunks = 2, .max_new = UINT64_MAX
	};
	cr_assert(eq(i32, pool_take(&pool, &t), -ENOSPC));
	cr_assert(eq(u64, t.need_chunks, 3));
	cr_assert(eq(u64, pool.free_bytes, 1 * GiB), "the free chunk went back");
	cr_assert(eq(u64, pool.chunks_created, created), "nothing was made");
	check_pool(&pool);

	/* Room for the chunks, not for 2 new fds. */
	t = (struct pool_take){
		.size = 3 * GiB, .uid = 7, .bounded = true, .max_chunks = 3, .max_new = 1
	};
	cr_assert(eq(i32, pool_take(&pool, &t), -EMFILE));
	cr_assert(eq(u64, t.need_new, 2));
	cr_assert(eq(u64, pool.chunks_created, created));
	check_pool(&pool);

	/* No new chunk needed: the bound on new ones does not matter. */
	t = (struct pool_take){
		.size = 1 * GiB, .uid = 7, .bounded = true, .max_chunks = 1, .max_new = 0
	};
	cr_assert(eq(i32, pool_take(&pool, &t), 0));
	cr_assert(eq(u32, t.nchunks, 1));
	put_all(&t);

	t = (struct pool_take){
		.size = 3 * GiB, .uid = 7, .bounded = true, .max_chunks = 3, .max_new = 2
	};
	cr_assert(eq(i32, pool_take(&pool, &t), 0));
	cr_assert(eq(u32, t.ncreated, 2));
	put_all(&t);
}

/* A bounded take of @size for @uid with room for @max_new new chunks. */
static int take_fds(uint64_t size, uid_t uid, uint64_t max_new, struct pool_take *t)
{
	*t = (struct pool_take){ .size = size,
				 .uid = uid,
				 .bounded = true,
				 .max_chunks = UINT64_MAX,
				 .max_new = max_new };
	return pool_take(&pool, t);
}

Test(pool, idle_chunks_give_their_fds_to_new_ones_smallest_first_as_needed)
{
	struct pool_take w1 = take(1 * GiB, 7, NULL, 0), w2 = take(1 * GiB, 7, NULL, 0);
	struct pool_take w3 = take(20 * MiB, 7, NULL, 0), t, u;
	struct chunk *held = w1.chunks[0];
	uint64_t released;

	/* Warm for uid 7: 1 GiB its client holds, 1 GiB and 20 MiB idle. */
	cr_assert(eq(i32, pool_hold(&pool, held, CA), 0));
	put_all(&w1);
	put_all(&w2);
	put_all(&w3);
	released = pool.chunks_released;
	cr_assert(eq(u64, pool_idle_chunks(&pool, 0), 2));

	/* Uid 8 cannot use them; no room for a new fd: the smallest idle one goes. */
	cr_assert(eq(i32, take_fds(1 * GiB, 8, 0, &t), 0));
	cr_assert(eq(u32, t.ncreated, 1));
	cr_assert(eq(u64, pool.chunks_released, released + 1), "more went back than needed");
	cr_assert(eq(u64, pool.free_bytes, 2 * GiB), "the 20 MiB chunk should have gone");
	check_pool(&pool);
	/* Then the other idle one; the held one is a client's handle and stays. */
	cr_assert(eq(i32, take_fds(1 * GiB, 8, 0, &u), 0));
	cr_assert(eq(u64, pool.free_bytes, 1 * GiB));
	cr_assert(held->free);
	put_all(&u);
	/* u's chunk, idle now, serves the next take itself: it cannot make room for it too. */
	cr_assert(eq(i32, take_fds(2 * GiB, 8, 0, &u), -EMFILE));
	cr_assert(eq(u64, u.fd_short, 1));
	cr_assert(eq(u64, pool.free_bytes, 2 * GiB), "a refused take released chunks");
	check_pool(&pool);
	put_all(&t);
	pool_forget(&pool, CA);
}

Test(pool, short_of_fds_small_warm_chunks_serve_instead_of_new_ones)
{
	struct pool_take a = take(20 * MiB, 7, NULL, 0), b = take(20 * MiB, 7, NULL, 0), t;
	uint64_t created;

	/* Held (warm handles of a client): not idle, so they cannot go for fds. */
	cr_assert(eq(i32, pool_hold(&pool, a.chunks[0], CA), 0));
	cr_assert(eq(i32, pool_hold(&pool, b.chunks[0], CA), 0));
	put_all(&a);
	put_all(&b);
	created = pool.chunks_created;
	/* With fds to spare one fresh chunk beats two small ones ... */
	cr_assert(eq(i32, take_fds(40 * MiB, 7, 1, &t), 0));
	cr_assert(eq(u32, t.nchunks, 1));
	cr_assert(eq(u32, t.ncreated, 1));
	pool_untake(&pool, &t);
	/* ... without, the two warm ones serve it. */
	cr_assert(eq(i32, take_fds(40 * MiB, 7, 0, &t), 0));
	cr_assert(eq(u32, t.nchunks, 2));
	cr_assert(eq(u32, t.ncreated, 0));
	cr_assert(eq(u64, pool.chunks_created, created + 1));
	pool_untake(&pool, &t);
	check_pool(&pool);
	pool_forget(&pool, CA);
}
