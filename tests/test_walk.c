/*
 * test_walk.c - the walk.h visitors over a broker of the real host backend:
 * the tree walk's order and levels, a callback's result stopping it, the
 * chunk walk, and the client and waiter walks whose callbacks remove what
 * they are handed.
 *
 * The broker comes from tests/broker_fx.h, whose checks recompute every
 * counter and holder reference from the allocations after each step.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "common/err.h"
#include "tests/broker_fx.h"
#include "daemon/core/broker_internal.h"
#include "daemon/core/walk.h"
#include "include/gmb.h"

TestSuite(walk, .init = bfx_setup, .fini = bfx_teardown, .timeout = 30);

/* What the tree walk saw, as text, and where to stop. */
struct trace {
	char buf[2048];
	size_t len;
	int calls, stop_at, stop_rc;
};

/* Appends to the trace; the callback's result: stop_rc at the stop_at-th call. */
__attribute__((format(printf, 2, 3))) static int trace_put(struct trace *tr, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tr->len += (size_t)vsnprintf(tr->buf + tr->len, sizeof(tr->buf) - tr->len, fmt, ap);
	va_end(ap);
	cr_assert(lt(sz, tr->len, sizeof(tr->buf)));
	return ++tr->calls == tr->stop_at ? tr->stop_rc : 0;
}

static int trace_client(void *arg, const struct bclient *c)
{
	return trace_put(arg, "c%llu[", (unsigned long long)c->id);
}

static int trace_tag(void *arg, const struct btag *t)
{
	return trace_put(arg, "%s(", t->name);
}

static int trace_alloc(void *arg, const struct balloc *a)
{
	return trace_put(arg, " a%llu:", (unsigned long long)a->id);
}

static int trace_chunk(void *arg, const struct balloc *a, uint32_t i, const struct chunk *ch)
{
	cr_assert(eq(ptr, (void *)ch, a->chunks[i]), "the chunk handed is the lend's i-th");
	return trace_put(arg, " k%llu", ch ? (unsigned long long)ch->id : 0ULL);
}

static int trace_tag_end(void *arg, const struct btag *t)
{
	(void)t;
	return trace_put(arg, ")");
}

static int trace_client_end(void *arg, const struct bclient *c)
{
	(void)c;
	return trace_put(arg, "]");
}

static const struct walk_ops trace_ops = { .client = trace_client,
					   .tag = trace_tag,
					   .alloc = trace_alloc,
					   .chunk = trace_chunk,
					   .tag_end = trace_tag_end,
					   .client_end = trace_client_end };

/* Two clients and a tool: a's tags w (two allocations) and kv (none), and
 * orphan b restored with an allocation whose second chunk was dropped. */
static void walk_tree_fixture(struct bclient **a, struct bclient **b, struct balloc **w1,
			      struct balloc **w2, struct chunk **kept)
{
	struct broker_peer peer = { .pid = 30, .uid = 1000, .gid = 1000 };
	char err[ERR_MSG_MAX] = "";
	struct bclient *tool = NULL, *tmp = bfx_client("tmp", 29, 1000);
	struct balloc *spare;
	struct chunk *chunks[2];
	struct btag *t;

	*a = bfx_client("a", 20, 1000);
	cr_assert(eq(i32, broker_client_add(bfx_br, &peer, "gmbctl", false, true, &tool), 0));
	*w1 = bfx_alloc_ok(*a, 0, 4 * MiB, "w", 1, BFX_ANY);
	*w2 = bfx_alloc_ok(*a, 1, 2 * MiB, "w", 1, BFX_ANY);
	cr_assert(eq(i32, broker_set_mode(bfx_br, *a, "kv", GMB_MODE_PRESERVE, err), 0), "%s", err);
	spare = bfx_alloc_ok(tmp, 0, 2 * MiB, "s", 1, BFX_ANY);
	*kept = spare->chunks[0];
	broker_client_remove(bfx_br, tmp); /* its chunk stays in the pool */
	cr_assert(eq(i32, broker_restore_client(bfx_br, &peer, 77, "b", true, b), 0));
	cr_assert(eq(i32, rejoin_restore_tag(*b, "x", GMB_MODE_DISCARD, true, &t), 0));
	chunks[0] = *kept;
	chunks[1] = NULL;
	cr_assert(
		eq(i32, rejoin_restore_alloc(bfx_br, *b, t, 900, 0, 4 * MiB, false, chunks, 2), 0));
	bfx_check();
}

Test(walk, the_walk_visits_every_node_once_in_the_records_order)
{
	struct bclient *a, *b;
	struct balloc *w1, *w2;
	struct chunk *kept;
	struct trace tr = { 0 };
	char want[512];

	walk_tree_fixture(&a, &b, &w1, &w2, &kept);
	cr_assert(eq(i32, walk_tree(bfx_br, &trace_ops, &tr), 0));
	/* Clients as added (no tool), tags as made, allocations newest first,
	 * a lend's chunks in mapping order with the dropped one as 0. */
	snprintf(want, sizeof(want),
		 "c%llu[w( a%llu: k%llu a%llu: k%llu)kv()]c77[x( a900: k%llu k0)]",
		 (unsigned long long)a->id, (unsigned long long)w2->id,
		 (unsigned long long)w2->chunks[0]->id, (unsigned long long)w1->id,
		 (unsigned long long)w1->chunks[0]->id, (unsigned long long)kept->id);
	cr_assert(eq(str, tr.buf, want));
}

Test(walk, a_walk_stops_at_the_first_nonzero_callback_and_returns_it)
{
	struct bclient *a, *b;
	struct balloc *w1, *w2;
	struct chunk *kept;
	struct trace tr = { .stop_at = 3, .stop_rc = 7 };
	char want[128];

	walk_tree_fixture(&a, &b, &w1, &w2, &kept);
	cr_assert(eq(i32, walk_tree(bfx_br, &trace_ops, &tr), 7), "a positive result: found");
	snprintf(want, sizeof(want), "c%llu[w( a%llu:", (unsigned long long)a->id,
		 (unsigned long long)w2->id);
	cr_assert(eq(str, tr.buf, want), "nothing after the stop, no _end either");
	tr = (struct trace){ .stop_at = 1, .stop_rc = -ENOMEM };
	cr_assert(eq(i32, walk_client(b, &trace_ops, &tr), -ENOMEM), "a failure");
	cr_assert(eq(str, tr.buf, "c77["));
}

Test(walk, a_walk_of_one_client_sees_only_the_levels_asked_for)
{
	static const struct walk_ops tags_only = { .tag = trace_tag, .tag_end = trace_tag_end };
	struct bclient *a, *b;
	struct balloc *w1, *w2;
	struct chunk *kept;
	struct trace tr = { 0 };

	walk_tree_fixture(&a, &b, &w1, &w2, &kept);
	cr_assert(eq(i32, walk_client(a, &tags_only, &tr), 0));
	cr_assert(eq(str, tr.buf, "w()kv()"));
}

static int count_chunk(void *arg, const struct chunk *ch)
{
	uint64_t *v = arg;

	cr_assert(eq(ptr, idmap_get(&bfx_br->chunks, ch->id), (void *)ch));
	v[0]++;
	v[1] += ch->size;
	return 0;
}

Test(walk, the_chunk_walk_visits_every_chunk_alive_once)
{
	struct bclient *a, *b;
	struct balloc *w1, *w2;
	struct chunk *kept;
	uint64_t v[2] = { 0 }, held = 0;

	walk_tree_fixture(&a, &b, &w1, &w2, &kept);
	cr_assert(eq(i32, walk_chunks(bfx_br, count_chunk, v), 0));
	for (int d = 0; d < bfx_br->ndevices; d++)
		held += bfx_br->pools[d].held_bytes;
	cr_assert(eq(u64, v[0], bfx_br->chunks.count));
	cr_assert(eq(u64, v[1], held));
}

/* Removes every client it is handed but the first, and counts them all. */
static int remove_but_first(void *arg, struct bclient *c)
{
	int *n = arg;

	if ((*n)++ > 0)
		broker_client_remove(bfx_br, c);
	return 0;
}

Test(walk, the_client_walk_lets_its_callback_remove_the_client)
{
	struct bclient *a = bfx_client("a", 20, 1000);
	int n = 0;

	bfx_client("b", 21, 1000);
	bfx_alloc_ok(bfx_client("c", 22, 1001), 0, 4 * MiB, "w", 1, BFX_ANY);
	bfx_client("d", 23, 1000);
	cr_assert(eq(i32, walk_clients(bfx_br, remove_but_first, &n), 0));
	cr_assert(eq(i32, n, 4), "each client once");
	cr_assert(eq(ptr, bfx_br->clients, a));
	cr_assert(eq(u32, bfx_br->nclients, 1));
	bfx_check();
}

/* Records the order and takes each second waiter out as it goes. */
static int take_every_second(void *arg, const struct bwaiter *w)
{
	const struct bwaiter **seen = arg;
	size_t i = 0;

	while (seen[i])
		i++;
	seen[i] = w;
	if (i % 2)
		wait_remove(bfx_br, (struct bwaiter *)w);
	return 0;
}

Test(walk, the_waiter_walk_goes_in_serving_order_and_survives_removal)
{
	struct bclient *lo = bfx_client("lo", 10, 1000), *hi = bfx_client("hi", 11, 1000);
	struct bwaiter w[4] = {
		{ .client = lo, .dev = 0 },
		{ .client = hi, .dev = 0 },
		{ .client = lo, .dev = 1 },
		{ .client = hi, .dev = 0 },
	};
	const struct bwaiter *seen[5] = { 0 }, *left[5] = { 0 };

	arb_client_set(hi, "g", 5, false);
	for (int i = 0; i < 4; i++)
		wait_add(bfx_br, &w[i]);
	cr_assert(eq(i32, walk_waiters(bfx_br, take_every_second, seen), 0));
	cr_assert(seen[0] == &w[1] && seen[1] == &w[3] && seen[2] == &w[0] && seen[3] == &w[2]);
	cr_assert(eq(i32, walk_waiters(bfx_br, take_every_second, left), 0));
	cr_assert(left[0] == &w[1] && left[1] == &w[0] && !left[2], "the second and fourth left");
	wait_remove(bfx_br, &w[1]);
}
