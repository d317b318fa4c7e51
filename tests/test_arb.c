/*
 * test_arb.c - the broker's arbitration over the real host backend: a
 * switch's handover of chunks between clients of one uid (and none across
 * uids), the waiting queue's order, the choice of clients to preempt,
 * requests that would wait for an orphan's drop, and the bound on chunks
 * lent per uid.
 *
 * Each step goes through tests/broker_fx.h, whose checks recompute every
 * counter and holder reference from the allocations after it.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "tests/broker_fx.h"
#include "daemon/core/broker_internal.h"

TestSuite(arb, .init = bfx_setup, .fini = bfx_teardown, .timeout = 30);

Test(arb, a_switch_keeps_from_chunks_for_to_whatever_the_keep_limit)
{
	struct bclient *a, *b, *other;
	struct bhandover *h;
	struct broker_handover_stats st;
	char err[ERR_MSG_MAX] = "";
	uint64_t created;

	bfx_open(4 * GiB, 0);
	a = bfx_client("from", 10, 1000);
	b = bfx_client("to", 11, 1000);
	other = bfx_client("other", 12, 1000);
	bfx_alloc_ok(b, 0, 2 * GiB, "kv", 2, 2);
	bfx_pause_ok(b, "kv");
	bfx_flush(1);
	broker_dropped(bfx_br, b, bfx_drops.ids[0], bfx_drops.n[0]);
	bfx_alloc_ok(a, 0, 2 * GiB, "w", 2, 2);
	created = bfx_br->pools[0].chunks_created;

	struct bclient *from[] = { a }, *to[] = { b };
	cr_assert(eq(i32, arb_handover_begin(bfx_br, from, 1, to, 1, &h, err), 0), "%s", err);
	cr_assert(eq(i32, arb_handover_begin(bfx_br, to, 1, from, 1, &h, err), -EBUSY));
	bfx_pause_ok(a, "w");
	bfx_flush(0); /* kept for TO: no drop, no release under --pool-keep 0 */
	cr_assert(eq(u64, bfx_br->pools[0].free_bytes, 2 * GiB));
	/* Nobody else may take them meanwhile. */
	cr_assert(eq(i32, bfx_alloc_rc(other, 0, 4 * GiB, "x", err), -ENOMEM), "%s", err);
	bfx_resume_ok(b, "kv", 1, 2);
	cr_assert(eq(u64, bfx_br->pools[0].chunks_created, created), "handed over, none created");
	cr_assert(eq(u64, bfx_br->pools[0].chunks_handed_over, 2));
	arb_handover_end(bfx_br, h, &st);
	cr_assert(eq(u64, st.handed_bytes, 2 * GiB));
	cr_assert(eq(u64, st.created_bytes, 0));
	cr_assert(eq(ptr, (void *)a->handover, NULL));
	bfx_check();
}

Test(arb, a_switch_between_users_reserves_nothing)
{
	struct bclient *a, *b;
	struct bhandover *h;
	char err[ERR_MSG_MAX] = "";

	bfx_open(4 * GiB, 0);
	a = bfx_client("from", 10, 1000);
	b = bfx_client("to", 11, 1001);
	bfx_alloc_ok(a, 0, 2 * GiB, "w", 2, 2);
	struct bclient *from[] = { a }, *to[] = { b };
	cr_assert(eq(i32, arb_handover_begin(bfx_br, from, 1, to, 1, &h, err), 0), "%s", err);
	bfx_pause_ok(a, "w");
	bfx_flush(1); /* released as any pause under --pool-keep 0 */
	arb_handover_end(bfx_br, h, NULL);
	bfx_check();
}

Test(arb, waiters_queue_by_priority_then_arrival)
{
	struct bclient *lo = bfx_client("lo", 10, 1000), *hi = bfx_client("hi", 11, 1000);
	struct bwaiter w[4] = {
		{ .client = lo, .dev = 0 },
		{ .client = hi, .dev = 0 },
		{ .client = lo, .dev = 1 },
		{ .client = hi, .dev = 0 },
	};
	const struct bwaiter *order[4], *p;
	size_t n = 0;

	arb_client_set(hi, "g", 5, false);
	for (int i = 0; i < 4; i++)
		wait_add(bfx_br, &w[i]);
	for (p = bfx_br->waiters; p; p = p->next)
		order[n++] = p;
	cr_assert(eq(sz, n, 4));
	cr_assert(order[0] == &w[1] && order[1] == &w[3] && order[2] == &w[0] && order[3] == &w[2]);
	cr_assert(wait_ahead(bfx_br, lo, 0));
	cr_assert(not(wait_ahead(bfx_br, hi, 1)), "a lower priority is not ahead");
	wait_set_priority(bfx_br, lo, 9);
	cr_assert(eq(ptr, (void *)bfx_br->waiters, &w[0]), "lo first now, arrival kept");
	cr_assert(eq(ptr, (void *)bfx_br->waiters->next, &w[2]));
	broker_client_remove(bfx_br, lo);
	cr_assert(eq(ptr, (void *)bfx_br->waiters, &w[1]), "a removed client's waiters leave");
	cr_assert(not(w[0].linked));
	wait_remove(bfx_br, &w[0]); /* no-op */
	wait_remove(bfx_br, &w[1]);
	wait_remove(bfx_br, &w[3]);
	cr_assert(eq(ptr, (void *)bfx_br->waiters, NULL));
}

Test(arb, preemption_picks_low_priority_opted_in_clients_that_cover_the_need)
{
	struct bclient *hi = bfx_client("hi", 10, 1000), *a = bfx_client("a", 11, 1000);
	struct bclient *b = bfx_client("b", 12, 1000), *no = bfx_client("no", 13, 1000);
	struct bclient *out[8];
	struct bwaiter w = { .client = hi, .dev = 0, .need = 3 * GiB };

	arb_client_set(hi, "", 10, false);
	arb_client_set(a, "", 1, true);
	arb_client_set(b, "", 0, true);
	arb_client_set(no, "", 0, false);
	bfx_alloc_ok(a, 0, 2 * GiB, "x", 2, 2);
	bfx_alloc_ok(b, 0, 2 * GiB, "x", 2, 2);
	bfx_alloc_ok(no, 0, 2 * GiB, "x", 2, 2);
	w.need = 5 * GiB;
	cr_assert(eq(sz, arb_preempt_pick(bfx_br, &w, out, 8), 0), "4 GiB cannot cover 5");
	w.need = 3 * GiB;
	cr_assert(eq(sz, arb_preempt_pick(bfx_br, &w, out, 8), 2));
	cr_assert(out[0] == b && out[1] == a, "lowest priority first");
	cr_assert(eq(u64, a->preempt_for, hi->id));
	cr_assert(eq(sz, arb_preempt_pick(bfx_br, &w, out, 8), 0), "not asked twice");
	arb_preempt_done(a);
	arb_preempt_done(b);
	w.need = 1 * GiB;
	cr_assert(eq(sz, arb_preempt_pick(bfx_br, &w, out, 8), 1));
	cr_assert(eq(ptr, (void *)out[0], b));
}

/* 2 GiB: a trainer holding 1 GiB of a tag it paused, and another client. */
static void trainer_and_other(struct bclient **a, struct bclient **c)
{
	bfx_open(2 * GiB, UINT64_MAX);
	*a = bfx_client("trainer", 41, 1000);
	*c = bfx_client("other", 50, 2000);
	bfx_alloc_ok(*a, 0, 1 * GiB, "w", 1, 1);
	bfx_pause_ok(*a, "w");
}

/* Handles of a client without a session are not asked for: no wait for them. */
Test(arb, memory_an_orphan_holds_is_refused_at_once_with_its_name)
{
	struct bclient *a, *c;
	char err[ERR_MSG_MAX] = "";

	trainer_and_other(&a, &c);
	rejoin_orphan(bfx_br, a);
	cr_assert(eq(i32, bfx_alloc_rc(c, 0, 2 * GiB, "kv", err), -ENOMEM),
		  "a request waited for a drop nobody can send: %s", err);
	cr_assert(not(eq(ptr, strstr(err, "not connected"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "trainer (pid 41, uid 1000) 1.0 GiB"), NULL)), "%s", err);
	cr_assert(eq(u64, bfx_br->pools[0].pending_bytes, 0), "the orphan's chunk was marked");
	bfx_check();
}

/* The same when the holder went after its chunk was marked releasing. */
Test(arb, a_wait_for_a_holder_that_went_ends_at_once)
{
	struct bclient *a, *c;
	char err[ERR_MSG_MAX] = "";

	trainer_and_other(&a, &c);
	cr_assert(eq(i32, bfx_alloc_rc(c, 0, 2 * GiB, "kv", err), -EAGAIN));
	rejoin_orphan(bfx_br, a);
	err[0] = 0;
	cr_assert(eq(i32, bfx_alloc_rc(c, 0, 2 * GiB, "kv", err), -ENOMEM),
		  "still waiting for an orphan's drop: %s", err);
	cr_assert(not(eq(ptr, strstr(err, "trainer (pid 41, uid 1000) 1.0 GiB"), NULL)), "%s", err);
	bfx_check();
}

/* ---- the chunk bound per uid ---- */

Test(arb, the_chunk_bound_is_per_uid_over_its_clients_and_devices)
{
	struct bclient *a = bfx_client("a", 10, 1000), *b = bfx_client("b", 11, 1000);
	struct bclient *other = bfx_client("o", 12, 2000);
	char err[ERR_MSG_MAX] = "", before[8192], after[8192];
	struct balloc *big;

	bfx_br->opts.max_chunks_per_uid = 4;
	big = bfx_alloc_ok(a, 0, 2 * GiB, "t", 2, 2);
	bfx_alloc_ok(b, 1, 1 * GiB, "t", 1, 1);
	cr_assert(eq(u64, broker_uid_chunks(bfx_br, 1000), 3));
	bfx_snapshot(before, sizeof(before));
	cr_assert(eq(i32, bfx_alloc_rc(b, 0, 2 * GiB, "t", err), -ENOSPC), "%s", err);
	cr_assert(
		not(eq(ptr, strstr(err, "uid 1000 has 3 chunks lent and this needs 2 more"), NULL)),
		"%s", err);
	bfx_snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before), "a refusal changed nothing");
	bfx_alloc_ok(other, 0, 4 * GiB, "t", 4, 4);

	/* A paused allocation's chunks are not lent: they count again at resume. */
	bfx_pause_ok(a, "t");
	cr_assert(eq(u64, broker_uid_chunks(bfx_br, 1000), 1));
	bfx_alloc_ok(b, 0, 2 * GiB, "u", 2, BFX_ANY);
	cr_assert(eq(i32, bfx_resume_rc(a, "t", err), -ENOSPC), "%s", err);
	cr_assert(a->tags->paused, "a refused resume leaves the tag paused");
	cr_assert(not(big->active));
	cr_assert(eq(i32, lend_free(bfx_br, b, b->tags->next->allocs->id, err), 0), "%s", err);
	cr_assert(eq(i32, bfx_resume_rc(a, "t", err), 0), "%s", err);
	cr_assert(eq(u64, broker_uid_chunks(bfx_br, 1000), 3));
}
