/*
 * test_broker.c - gmbd's core over the real host backend: allocations,
 * reuse of chunks within a uid and never across uids, budgets and their
 * messages, drops (-EAGAIN until acked), pause/resume onto the same chunks
 * or new ones, all-or-nothing resume, client removal, trim/keep, who may
 * control whom, client selection and tag lookup, argument checks.
 *
 * Each step goes through tests/broker_fx.h, whose checks recompute every
 * counter and holder reference from the allocations after it. Arbitration
 * is in tests/test_arb.c, the walk.h visitors in tests/test_walk.c.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "tests/broker_fx.h"
#include "tests/util.h"
#include "daemon/core/broker_internal.h"
#include "include/gmb.h"

TestSuite(broker, .init = bfx_setup, .fini = bfx_teardown, .timeout = 30);

Test(broker, alloc_sizes_chunks_and_sends_each_once)
{
	struct bclient *a = bfx_client("trainer", 41, 1000);
	struct balloc *x = bfx_alloc_ok(a, 0, 20 * MiB, "kv", 1, 1);

	cr_assert(eq(u64, x->chunks[0]->size, 20 * MiB));
	x = bfx_alloc_ok(a, 0, 3 * GiB, "kv", 3, 3);
	for (int i = 0; i < 3; i++)
		cr_assert(eq(u64, x->chunks[i]->size, 1 * GiB));
	x = bfx_alloc_ok(a, 1, 1, "w", 1, 1);
	cr_assert(eq(u64, x->size, 2 * MiB), "rounded up to the granularity");
	cr_assert(eq(u64, bfx_br->pools[0].lent_bytes, 3 * GiB + 20 * MiB));
	cr_assert(eq(u64, bfx_br->pools[1].lent_bytes, 2 * MiB));
}

Test(broker, same_uid_reuses_chunks_without_resending_to_a_holder)
{
	struct bclient *a = bfx_client("trainer", 41, 1000), *b = bfx_client("eval", 43, 1000);
	struct balloc *w = bfx_alloc_ok(a, 0, 1 * GiB, "w", 1, 1), *kv;
	struct chunk *x = w->chunks[0];

	bfx_pause_ok(a, "w");
	kv = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 0);
	cr_assert(eq(ptr, kv->chunks[0], x), "A's own paused chunk, handle already there");
	bfx_free_ok(a, kv);
	cr_assert(x->free && pool_is_held_by(x, a), "w's last lend still has it");
	kv = bfx_alloc_ok(b, 0, 1 * GiB, "kv", 1, 1);
	cr_assert(eq(ptr, kv->chunks[0], x), "another client of the same uid gets it, with its fd");
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 1));
}

Test(broker, never_lends_across_uids)
{
	struct bclient *a = bfx_client("trainer", 41, 1000), *c = bfx_client("other", 50, 2000);
	struct balloc *x = bfx_alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	uint64_t old = x->chunks[0]->id;

	bfx_free_ok(a, x);
	x = bfx_alloc_ok(c, 0, 1 * GiB, "w", 1, 1);
	cr_assert(x->chunks[0]->id != old, "a fresh chunk for uid 2000");
	cr_assert(eq(u64, bfx_br->pools[0].free_bytes, 1 * GiB), "uid 1000's chunk stays warm");

	/* With the budget full, the idle chunk of uid 1000 goes back to make room. */
	bfx_open(2 * GiB, UINT64_MAX);
	a = bfx_client("trainer", 41, 1000);
	c = bfx_client("other", 50, 2000);
	x = bfx_alloc_ok(a, 0, 2 * GiB, "w", 2, 2);
	bfx_free_ok(a, x);
	x = bfx_alloc_ok(c, 0, 1 * GiB, "w", 1, 1);
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 2));
	cr_assert(eq(u64, bfx_br->pools[0].held_bytes, 2 * GiB));
	cr_assert(eq(i32, proc_count_memfds(), 2), "one chunk released, one created");
	cr_assert(eq(u32, bfx_br->pools[0].free_head->uid, 1000));
}

Test(broker, budget_refusal_names_who_holds_the_memory)
{
	struct bclient *t, *i;
	char err[ERR_MSG_MAX] = "", before[4096], after[4096];

	bfx_open(4 * GiB, UINT64_MAX);
	t = bfx_client("trainer", 41, 1000);
	i = bfx_client("infer", 42, 1001);
	bfx_alloc_ok(t, 0, 3 * GiB, "w", 3, 3);
	bfx_alloc_ok(i, 0, 512 * MiB, "kv", 1, 1);
	bfx_snapshot(before, sizeof(before));
	cr_assert(eq(i32, bfx_alloc_rc(i, 0, 1 * GiB, "kv", err), -ENOMEM));
	cr_assert(not(eq(ptr,
			 strstr(err, "device 0: budget 4.0 GiB exhausted: need 512.0 MiB more"),
			 NULL)),
		  "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "trainer (pid 41, uid 1000) 3.0 GiB"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "infer (pid 42, uid 1001) 512.0 MiB"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "free in pool 0 B"), NULL)), "%s", err);
	bfx_snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before));
	cr_assert(eq(i32, bfx_alloc_rc(i, 0, 5 * GiB, "kv", err), -ENOMEM));
	cr_assert(eq(str, err, "allocation of 5.0 GiB exceeds device 0's budget of 4.0 GiB"));
}

Test(broker, eagain_until_holders_drop_then_success)
{
	struct bclient *a, *c;
	struct balloc *w;
	char err[ERR_MSG_MAX] = "";
	uint64_t ids[2];

	bfx_open(2 * GiB, UINT64_MAX);
	a = bfx_client("trainer", 41, 1000);
	c = bfx_client("other", 50, 2000);
	w = bfx_alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	ids[0] = w->chunks[0]->id;
	ids[1] = 12345;
	bfx_pause_ok(a, "w");
	cr_assert(eq(i32, bfx_alloc_rc(c, 0, 2 * GiB, "kv", err), -EAGAIN));
	cr_assert(not(eq(ptr, strstr(err, "waiting for clients to drop handles to 1.0 GiB"), NULL)),
		  "%s", err);
	cr_assert(eq(u64, bfx_br->pools[0].pending_bytes, 1 * GiB));
	/* An ack before the request is sent is ignored: drop_sent is not set yet. */
	broker_dropped(bfx_br, a, ids, 1);
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 1));
	bfx_flush(1);
	cr_assert(eq(ptr, bfx_drops.c[0], a));
	cr_assert(eq(sz, bfx_drops.n[0], 1));
	cr_assert(eq(u64, bfx_drops.ids[0][0], ids[0]));
	bfx_flush(0);
	cr_assert(eq(i32, bfx_alloc_rc(c, 0, 2 * GiB, "kv", err), -EAGAIN), "still waiting");
	broker_dropped(bfx_br, c, ids, 2);
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 1), "not c's drop to ack");
	broker_dropped(bfx_br, a, ids, 2);
	bfx_check();
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 0), "back to the backend");
	cr_assert(eq(ptr, w->chunks[0], NULL), "gone from the paused lend");
	bfx_alloc_ok(c, 0, 2 * GiB, "kv", 2, 2);
	cr_assert(eq(i32, bfx_resume_rc(a, "w", err), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "cannot resume tag 'w' of 'trainer': device 0: budget"),
			 NULL)),
		  "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "other (pid 50, uid 2000) 2.0 GiB"), NULL)), "%s", err);
	cr_assert(w->tag->paused);
}

Test(broker, pause_resume_reuses_the_exact_chunks)
{
	struct bclient *a = bfx_client("infer", 42, 1000);
	struct balloc *x = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	struct balloc *y = bfx_alloc_ok(a, 0, 20 * MiB, "kv", 1, 1);
	struct chunk *cx = x->chunks[0], *cy = y->chunks[0];
	char err[ERR_MSG_MAX];

	bfx_pause_ok(a, "kv");
	cr_assert(not(x->active || y->active));
	cr_assert(eq(u64, bfx_br->pools[0].lent_bytes, 0));
	cr_assert(eq(u64, bfx_br->pools[0].free_bytes, 1 * GiB + 20 * MiB));
	cr_assert(pool_is_held_by(cx, a) && pool_is_held_by(cy, a));
	bfx_pause_ok(a, "kv");
	cr_assert(eq(i32, bfx_alloc_rc(a, 0, 2 * MiB, "kv", err), -EBUSY));
	bfx_resume_ok(a, "kv", 2, 0);
	cr_assert(eq(ptr, x->chunks[0], cx));
	cr_assert(eq(ptr, y->chunks[0], cy));
	bfx_resume_ok(a, "kv", 0, 0);
	bfx_pause_ok(a, NULL);
	bfx_resume_ok(a, "", 2, 0);
	cr_assert(eq(i32, lend_pause(bfx_br, a, "nope", false, err), -ENOENT));
	cr_assert(eq(str, err, "client 'infer' has no tag 'nope'"));
	cr_assert(eq(i32, bfx_resume_rc(a, "nope", err), -ENOENT));
}

Test(broker, a_pause_with_handles_released_gives_the_chunks_back_at_once)
{
	struct bclient *a, *b;
	struct balloc *x, *y;
	char err[ERR_MSG_MAX] = "";

	bfx_open(0, 0);
	a = bfx_client("infer", 42, 1000);
	b = bfx_client("old", 43, 1000);
	x = bfx_alloc_ok(a, 0, 3 * GiB, "kv", 3, 3);
	y = bfx_alloc_ok(b, 0, 1 * GiB, "kv", 1, 1);
	cr_assert(eq(i32, lend_pause(bfx_br, a, "kv", true, err), 0), "%s", err);
	bfx_check();
	cr_assert(eq(u64, bfx_br->pools[0].held_bytes, 1 * GiB), "released within the call");
	cr_assert(eq(u64, bfx_br->pools[0].pending_bytes, 0), "no drop to wait for");
	cr_assert(eq(i32, proc_count_memfds(), 1), "only the other client's chunk is alive");
	for (uint32_t i = 0; i < x->nchunks; i++)
		cr_assert(eq(ptr, x->chunks[i], NULL), "the last lend names nothing any more");
	/* A client that keeps its handles: the chunk waits for its drop, as before. */
	bfx_pause_ok(b, "kv");
	cr_assert(eq(u64, bfx_br->pools[0].pending_bytes, 1 * GiB));
	cr_assert(pool_is_held_by(y->chunks[0], b));
	bfx_resume_ok(a, "kv", 1, 3);
	cr_assert(eq(u32, x->nchunks, 3), "new chunks, all sent again");
	cr_assert(eq(u64, bfx_br->pools[0].lent_bytes, 3 * GiB));
}

Test(broker, resume_after_another_client_took_the_chunks)
{
	struct bclient *a = bfx_client("infer", 42, 1000), *b = bfx_client("eval", 43, 1000);
	struct balloc *x = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1), *y;
	struct chunk *old = x->chunks[0];

	bfx_pause_ok(a, "kv");
	y = bfx_alloc_ok(b, 0, 1 * GiB, "kv", 1, 1);
	cr_assert(eq(ptr, y->chunks[0], old));
	bfx_resume_ok(a, "kv", 1, 1);
	cr_assert(x->chunks[0] != old, "a new chunk, with its fd");
	cr_assert(not(pool_is_held_by(old, a)), "the new lend replaced the old list");
	cr_assert(eq(u32, old->nholders, 1));
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 2));
}

Test(broker, failed_resume_rolls_back_new_chunks)
{
	struct bclient *a, *b;
	struct balloc *x1, *x2;
	char err[ERR_MSG_MAX], before[4096], after[4096];

	bfx_open(3 * GiB, UINT64_MAX);
	a = bfx_client("infer", 42, 1000);
	b = bfx_client("eval", 43, 1000);
	x1 = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	x2 = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	bfx_pause_ok(a, "kv");
	bfx_alloc_ok(b, 0, 2 * GiB, "w", 2, 2);
	/* The first allocation gets a new chunk, the second finds no room. */
	bfx_snapshot(before, sizeof(before));
	cr_assert(eq(i32, bfx_resume_rc(a, "kv", err), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "eval (pid 43, uid 1000) 2.0 GiB"), NULL)), "%s", err);
	bfx_snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before));
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 2), "the new chunk went back");
	cr_assert(not(x1->active || x2->active));
	cr_assert(x1->tag->paused);
}

Test(broker, failed_resume_rolls_back_exact_lends)
{
	struct bclient *a, *b, *c;
	struct balloc *x1;
	char err[ERR_MSG_MAX], before[4096], after[4096];

	bfx_open(3 * GiB, UINT64_MAX);
	a = bfx_client("infer", 42, 1000);
	b = bfx_client("eval", 43, 1000);
	c = bfx_client("other", 50, 2000);
	x1 = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	bfx_pause_ok(a, "kv");
	bfx_alloc_ok(b, 0, 1 * GiB, "w", 1, 1);
	bfx_alloc_ok(c, 0, 1 * GiB, "w", 1, 1);
	/* One allocation could take its chunk back, the other has nowhere to go. */
	bfx_snapshot(before, sizeof(before));
	cr_assert(eq(i32, bfx_resume_rc(a, NULL, err), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "cannot resume the tags of 'infer'"), NULL)), "%s", err);
	bfx_snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before));
	cr_assert(eq(u64, bfx_br->pools[0].free_bytes, 1 * GiB));
	cr_assert(not(x1->active));
}

Test(broker, free_of_paused_and_unknown_allocations)
{
	struct bclient *a = bfx_client("infer", 42, 1000), *b = bfx_client("eval", 43, 1000);
	struct balloc *x = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	struct chunk *cx = x->chunks[0];
	uint64_t id = x->id;
	char err[ERR_MSG_MAX];

	bfx_pause_ok(a, "kv");
	cr_assert(eq(i32, lend_free(bfx_br, b, id, err), -ENOENT), "not b's allocation");
	cr_assert(eq(str, err, "allocation 1 does not exist"));
	bfx_free_ok(a, x);
	cr_assert(cx->free && cx->nholders == 0, "back in the pool, nobody holds it");
	cr_assert(eq(u64, broker_tag_find(a, "kv")->bytes, 0));
	cr_assert(eq(i32, lend_free(bfx_br, a, id, err), -ENOENT));

	/* Keep nothing warm: a free goes straight back to the backend. */
	bfx_open(0, 0);
	a = bfx_client("infer", 42, 1000);
	x = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	bfx_pause_ok(a, "kv");
	bfx_flush(1);
	bfx_free_ok(a, x);
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 1), "the drop of the paused chunk is unacked");
	broker_dropped(bfx_br, a, bfx_drops.ids[0], bfx_drops.n[0]);
	bfx_check();
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 0));
}

Test(broker, client_removal_returns_every_byte)
{
	struct bclient *a = bfx_client("infer", 42, 1000), *b = bfx_client("eval", 43, 1000);
	uint64_t released, pending;
	char err[ERR_MSG_MAX];

	bfx_alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	bfx_alloc_ok(a, 0, 20 * MiB, "kv", 1, 1);
	bfx_alloc_ok(a, 0, 512 * MiB, "kv", 1, 1);
	bfx_alloc_ok(a, 1, 64 * MiB, "kv", 1, 1);
	bfx_pause_ok(a, "kv");
	bfx_alloc_ok(b, 0, 20 * MiB, "kv", 1, 1);
	cr_assert(eq(i32, broker_trim(bfx_br, 0, &released, &pending, err), 0));
	cr_assert(eq(u64, released, 0));
	cr_assert(eq(u64, pending, 512 * MiB), "held by a's paused lend");
	bfx_flush(1);
	broker_client_remove(bfx_br, a);
	bfx_check();
	cr_assert(eq(u64, bfx_br->pools[0].lent_bytes, 20 * MiB), "b's lend only");
	cr_assert(eq(u64, bfx_br->pools[0].free_bytes, 1 * GiB));
	cr_assert(eq(u64, bfx_br->pools[0].pending_bytes, 0), "no drop owed by a gone client");
	cr_assert(eq(u64, bfx_br->pools[1].free_bytes, 64 * MiB));
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 2));
	broker_client_remove(bfx_br, b);
	bfx_check();
	cr_assert(eq(u64, bfx_br->pools[0].lent_bytes, 0));
	cr_assert(eq(u64, bfx_br->pools[0].free_bytes, 1 * GiB + 20 * MiB));
	cr_assert(eq(i32, broker_trim(bfx_br, -1, &released, &pending, err), 0));
	cr_assert(eq(u64, released, 1 * GiB + 84 * MiB));
	cr_assert(eq(u64, pending, 0));
	cr_assert(eq(i32, proc_count_memfds(), 0));
}

Test(broker, trim_and_keep)
{
	struct bclient *a;
	struct balloc *x;
	uint64_t released, pending, id;
	char err[ERR_MSG_MAX];

	bfx_open(0, 1 * GiB);
	a = bfx_client("infer", 42, 1000);
	x = bfx_alloc_ok(a, 0, 3 * GiB, "w", 3, 3);
	bfx_free_ok(a, x);
	cr_assert(eq(u64, bfx_br->pools[0].held_bytes, 1 * GiB), "keep 1 GiB warm");
	cr_assert(eq(i32, broker_trim(bfx_br, 5, &released, &pending, err), -ENODEV));
	cr_assert(eq(str, err, "device 5 does not exist (2 devices)"));
	cr_assert(eq(i32, broker_trim(bfx_br, -1, &released, &pending, err), 0));
	cr_assert(eq(u64, released, 1 * GiB));
	x = bfx_alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	bfx_pause_ok(a, "kv");
	cr_assert(eq(i32, broker_trim(bfx_br, 0, &released, &pending, err), 0));
	cr_assert(eq(u64, released, 0));
	cr_assert(eq(u64, pending, 1 * GiB));
	bfx_flush(1);
	id = bfx_drops.ids[0][0];
	cr_assert(eq(i32, broker_trim(bfx_br, 0, &released, &pending, err), 0));
	cr_assert(eq(u64, pending, 1 * GiB), "still waiting; no second drop");
	bfx_flush(0);
	broker_dropped(bfx_br, a, &id, 1);
	broker_dropped(bfx_br, a, &id, 1);
	bfx_check();
	cr_assert(eq(i32, proc_count_memfds(), 0));
	bfx_resume_ok(a, "kv", 1, 1);
	cr_assert(not(eq(ptr, x->chunks[0], NULL)));
}

Test(broker, may_control_rules)
{
	gid_t admin[] = { 5, 0 };
	struct bclient *t = bfx_client("trainer", 41, 1000), *same = bfx_client("mate", 44, 1000);
	struct bclient *root = bfx_client("root", 1, 0), *stranger = bfx_client("x", 45, 1001);
	struct bclient *adm = bfx_client_gid("ops", 46, 1002, admin, 2),
		       *gmbd = bfx_client("d", 47, 999);
	char err[ERR_MSG_MAX];

	admin[1] = 7; /* the broker keeps its own copy */
	cr_assert(eq(i32, broker_may_control(bfx_br, root, t, err), 0));
	cr_assert(eq(i32, broker_may_control(bfx_br, same, t, err), 0));
	cr_assert(eq(i32, broker_may_control(bfx_br, gmbd, t, err), 0));
	cr_assert(eq(i32, broker_may_control(bfx_br, adm, t, err), -EPERM), "no admin group set");
	cr_assert(eq(str, err,
		     "client 'ops' (uid 1002) may not control 'trainer' (uid 1000): "
		     "needs root, uid 1000, uid 999 (gmbd's)"));
	bfx_br->opts.have_admin_gid = true;
	bfx_br->opts.admin_gid = 0;
	cr_assert(eq(i32, broker_may_control(bfx_br, adm, t, err), 0), "supplementary group");
	cr_assert(eq(i32, broker_may_control(bfx_br, adm, NULL, err), 0));
	cr_assert(eq(i32, broker_may_control(bfx_br, stranger, t, err), -EPERM));
	cr_assert(eq(str, err,
		     "client 'x' (uid 1001) may not control 'trainer' (uid 1000): "
		     "needs root, uid 1000, uid 999 (gmbd's) or group 'root'"));
	cr_assert(eq(i32, broker_may_control(bfx_br, stranger, NULL, err), -EPERM));
	cr_assert(eq(str, err,
		     "client 'x' (uid 1001) may not trim the pools: "
		     "needs root, uid 999 (gmbd's) or group 'root'"));
	bfx_br->opts.admin_gid = 1001;
	cr_assert(eq(i32, broker_may_control(bfx_br, stranger, NULL, err), 0), "primary group");
}

/* What @sel finds: the client when one matches, and how many matched. */
static struct bclient *find(const char *sel, size_t want_n)
{
	struct broker_found f;
	struct bclient *c = broker_client_find(bfx_br, sel, &f);

	cr_assert(eq(sz, f.n, want_n), "'%s' matched %zu", sel, f.n);
	cr_assert(eq(ptr, c, want_n == 1 ? f.c[0] : NULL), "'%s'", sel);
	return c;
}

Test(broker, client_find_by_id_pid_and_name)
{
	struct broker_peer tool_peer = { .pid = 44, .uid = 1000, .gid = 1000 };
	struct bclient *t = bfx_client("trainer", 41, 1000), *i1 = bfx_client("infer", 42, 1000);
	struct bclient *i2 = bfx_client("infer", 43, 1000), *num = bfx_client("99999", 45, 1000),
		       *tool;
	char longname[300];

	cr_assert(eq(i32, broker_client_add(bfx_br, &tool_peer, "gmbctl", false, true, &tool), 0));
	cr_assert(eq(u64, t->id, 1));
	cr_assert(eq(ptr, find("#1", 1), t));
	cr_assert(eq(ptr, find("1", 1), t));
	cr_assert(eq(ptr, find("2", 1), i1));
	cr_assert(eq(ptr, find("43", 1), i2), "by pid");
	find("#43", 0); /* # is an id only */
	cr_assert(eq(ptr, find("trainer", 1), t));
	find("infer", 2); /* several, not none */
	cr_assert(eq(ptr, find("99999", 1), num), "digits that are a name");
	find("gmbctl", 0); /* tools are not selectable */
	find("#5", 0);
	find("44", 0);
	find("", 0);
	find("#", 0);
	find("nobody", 0);
	cr_assert(eq(ptr, broker_client_find(bfx_br, "trainer", NULL), t),
		  "the result is optional");
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	cr_assert(eq(sz, strlen(bfx_client(longname, 50, 1000)->name), (size_t)WIRE_MAX_NAME));
}

/* None, one, several: the candidates are named, each case has its sentence. */
Test(broker, client_find_says_none_one_or_several_with_the_candidates)
{
	struct bclient *i1 = bfx_client("infer", 42, 1000), *i2 = bfx_client("infer", 43, 1000);
	struct bclient *a = bfx_client("a", 77, 1000), *b = bfx_client("b", 77, 1000);
	struct broker_found f;
	char err[ERR_MSG_MAX];

	cr_assert(eq(ptr, broker_client_find(bfx_br, "ghost", &f), NULL));
	cr_assert(eq(sz, f.n, 0));
	cr_assert(eq(i32, broker_found_err(&f, "ghost", false, err), -ENOENT));
	cr_assert(eq(str, err, "no client matches 'ghost'"));
	cr_assert(eq(i32, broker_found_err(&f, "ghost", true, err), -ENOENT));
	cr_assert(eq(str, err, "no client or group matches 'ghost'"));

	cr_assert(eq(ptr, broker_client_find(bfx_br, "infer", &f), NULL));
	cr_assert(eq(sz, f.n, 2));
	cr_assert(f.by_pid == false);
	cr_assert(f.c[0] == i1 ? f.c[1] == i2 : f.c[0] == i2 && f.c[1] == i1);
	cr_assert(eq(i32, broker_found_err(&f, "infer", false, err), -ENOTUNIQ));
	cr_assert(eq(str, err,
		     f.c[0] == i1 ? "2 clients are named 'infer' (#1 pid 42, #2 pid 43): name one"
				    " by id (#N) or pid" :
				    "2 clients are named 'infer' (#2 pid 43, #1 pid 42): name one"
				    " by id (#N) or pid"));
	cr_assert(eq(i32, broker_found_err(&f, "infer", true, err), -ENOTUNIQ));
	cr_assert(not(eq(ptr, strstr(err, "or pid, or give them a group"), NULL)), "%s", err);

	/* Two connections of one process share its pid. */
	cr_assert(eq(ptr, broker_client_find(bfx_br, "77", &f), NULL));
	cr_assert(eq(sz, f.n, 2));
	cr_assert(f.by_pid);
	cr_assert(f.c[0] == a ? f.c[1] == b : f.c[0] == b && f.c[1] == a);
	cr_assert(eq(i32, broker_found_err(&f, "77", false, err), -ENOTUNIQ));
	cr_assert(not(eq(ptr, strstr(err, "2 clients have pid 77 (#"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "'a'"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "): name one by id (#N)"), NULL)), "%s", err);
	cr_assert(eq(ptr, strstr(err, "or pid"), NULL), "a pid cannot tell them apart: %s", err);
	cr_assert(eq(ptr, broker_client_find(bfx_br, "#3", &f), a));
	cr_assert(eq(sz, f.n, 1));
}

/* More candidates than the result keeps: the count is right, the rest elided. */
Test(broker, client_find_keeps_the_first_candidates_and_counts_them_all)
{
	struct broker_found f;
	char err[ERR_MSG_MAX];

	for (int i = 0; i < BROKER_FOUND_MAX + 3; i++)
		bfx_client("rank", 100 + i, 1000);
	cr_assert(eq(ptr, broker_client_find(bfx_br, "rank", &f), NULL));
	cr_assert(eq(sz, f.n, (size_t)BROKER_FOUND_MAX + 3));
	for (int i = 0; i < BROKER_FOUND_MAX; i++)
		cr_assert(eq(str, f.c[i]->name, "rank"));
	cr_assert(eq(i32, broker_found_err(&f, "rank", false, err), -ENOTUNIQ));
	cr_assert(not(eq(ptr, strstr(err, "11 clients are named 'rank' (#"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, ", ...): name one"), NULL)), "%s", err);
}

/* "" is every tag; a tag exists with or without allocations; the sentence lists the tags. */
Test(broker, tag_check_knows_every_tag_and_names_the_tags_a_client_has)
{
	struct bclient *c = bfx_client("trainer", 41, 1000), *empty = bfx_client("new", 42, 1000);
	char err[ERR_MSG_MAX], name[WIRE_MAX_NAME + 1];

	cr_assert(eq(i32, broker_tag_check(empty, "", err), 0), "every tag of none");
	cr_assert(eq(i32, broker_tag_check(empty, "kv", err), -ENOENT));
	cr_assert(eq(str, err, "client 'new' has no tag 'kv': it has no tags yet"));
	bfx_alloc_ok(c, 0, 2 * MiB, "kv", UINT32_MAX, BFX_ANY);
	cr_assert(eq(i32, broker_set_mode(bfx_br, c, "weights", GMB_MODE_PRESERVE, err), 0), "%s",
		  err);
	cr_assert(eq(i32, broker_tag_check(c, "kv", err), 0));
	cr_assert(eq(i32, broker_tag_check(c, "weights", err), 0), "a tag without allocations");
	cr_assert(eq(i32, broker_tag_check(c, "", err), 0));
	cr_assert(eq(i32, broker_tag_check(c, "*", err), -ENOENT), "* is a name, not every tag");
	cr_assert(eq(i32, broker_tag_check(c, "nosuchtag", err), -ENOENT));
	cr_assert(
		eq(str, err, "client 'trainer' has no tag 'nosuchtag'; its tags: 'kv', 'weights'"));
	/* 256 tags of 255 bytes do not fit a sentence: those that do, then a count. */
	for (int i = 0; i < 20; i++) {
		memset(name, 'a' + i, WIRE_MAX_NAME);
		name[WIRE_MAX_NAME] = '\0';
		cr_assert(eq(i32, broker_set_mode(bfx_br, c, name, GMB_MODE_DISCARD, err), 0), "%s",
			  err);
	}
	cr_assert(eq(i32, broker_tag_check(c, "nosuchtag", err), -ENOENT));
	cr_assert(lt(sz, strlen(err), (size_t)ERR_MSG_MAX - 1), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "'kv', 'weights'"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, " more"), NULL)), "%s", err);
	cr_assert(eq(i32, broker_tag_check(c, "nosuchtag", NULL), -ENOENT));
}

Test(broker, alloc_and_mode_arguments_are_checked)
{
	struct bclient *a = bfx_client("infer", 42, 1000);
	char err[ERR_MSG_MAX], tag[WIRE_MAX_NAME + 2];

	cr_assert(eq(i32, bfx_alloc_rc(a, 3, 1 * MiB, "kv", err), -ENODEV));
	cr_assert(eq(str, err, "device 3 does not exist (2 devices)"));
	cr_assert(eq(i32, bfx_alloc_rc(a, -1, 1 * MiB, "kv", err), -ENODEV));
	cr_assert(eq(i32, bfx_alloc_rc(a, 0, 0, "kv", err), -EINVAL));
	cr_assert(eq(i32, bfx_alloc_rc(a, 0, 1 * MiB, "", err), -EINVAL));
	memset(tag, 't', sizeof(tag) - 1);
	tag[sizeof(tag) - 1] = '\0';
	cr_assert(eq(i32, bfx_alloc_rc(a, 0, 1 * MiB, tag, err), -EINVAL));
	cr_assert(eq(i32, broker_set_mode(bfx_br, a, "w", 3, err), -EINVAL));
	cr_assert(eq(i32, broker_set_mode(bfx_br, a, "w", GMB_MODE_PRESERVE, err), 0));
	cr_assert(eq(i32, broker_tag_find(a, "w")->mode, GMB_MODE_PRESERVE));
	for (int i = 1; i < BROKER_MAX_TAGS; i++) {
		snprintf(tag, sizeof(tag), "t%d", i);
		cr_assert(eq(i32, broker_set_mode(bfx_br, a, tag, GMB_MODE_ZERO, err), 0));
	}
	cr_assert(eq(i32, broker_set_mode(bfx_br, a, "one-too-many", 0, err), -ENOSPC));
	cr_assert(eq(i32, bfx_alloc_rc(a, 0, 1 * MiB, "one-too-many", err), -ENOSPC));
	cr_assert(eq(str, err, "client 'infer' already has 256 tags, the limit"));
	cr_assert(eq(i32, bfx_alloc_rc(a, 0, 1 * MiB, "w", err), 0));
	cr_assert(eq(u32, a->ntags, BROKER_MAX_TAGS));
}

Test(broker, failed_alloc_leaks_nothing)
{
	struct bclient *a = bfx_client("infer", 42, 1000);
	char err[ERR_MSG_MAX];

	bfx_alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	test_backend_fail_creates(bfx_be, 1);
	/* Four chunks: the first created, the second fails. */
	cr_assert(eq(i32, bfx_alloc_rc(a, 0, 4 * GiB, "kv", err), -EIO));
	cr_assert(not(eq(ptr, strstr(err, "injected chunk_create failure"), NULL)), "%s", err);
	cr_assert(eq(u32, bfx_br->pools[0].nchunks, 1));
	cr_assert(eq(ptr, broker_tag_find(a, "kv"), NULL), "no tag left behind");
	cr_assert(eq(sz, a->allocs.count, 1));
	test_backend_restore(bfx_be);
	bfx_alloc_ok(a, 0, 4 * GiB, "kv", 4, 4);
}
