/*
 * test_broker.c - gmbd's core over the real host backend: allocations,
 * reuse of chunks within a uid and never across uids, budgets and their
 * messages, drops (-EAGAIN until acked), pause/resume onto the same chunks
 * or new ones, all-or-nothing resume, client removal, trim/keep, who may
 * control whom, and client selection.
 *
 * After each step check_broker() recomputes every counter and holder
 * reference from the allocations and compares: the core's state is
 * redundant on purpose, and this is where the redundancy is proven.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/util.h"
#include "tests/broker_refs.h"
#include "daemon/core/broker_internal.h"
#include "daemon/core/walk.h"
#include "include/gmb.h"

#define MiB (1024ULL * 1024)
#define GiB (1024 * MiB)
#define ANY SIZE_MAX

static struct backend *be;
static struct broker *br;

/* What broker_flush_drops() handed over. */
static struct {
	struct bclient *c[8];
	uint64_t ids[8][16];
	size_t n[8];
	int calls;
} drops;

static void check_pool(const struct pool *p)
{
	uint64_t free_sum = 0, pend_sum = 0, prev = UINT64_MAX;

	for (const struct chunk *c = p->free_head; c; c = c->next) {
		cr_assert(c->free && !c->releasing && !c->lent_to);
		cr_assert(c->size <= prev, "free list not sorted largest first");
		prev = c->size;
		free_sum += c->size;
	}
	for (const struct chunk *c = p->pending_head; c; c = c->next) {
		cr_assert(c->releasing && !c->free && !c->lent_to && c->nholders > 0);
		pend_sum += c->size;
	}
	cr_assert(eq(u64, p->free_bytes, free_sum));
	cr_assert(eq(u64, p->pending_bytes, pend_sum));
	cr_assert(eq(u64, p->held_bytes, p->lent_bytes + p->free_bytes + p->pending_bytes));
	cr_assert(le(u64, p->held_bytes, p->budget));
}

static void check_alloc(const struct bclient *c, const struct balloc *a, uint64_t *lent)
{
	uint64_t sum = 0;

	cr_assert(eq(ptr, idmap_get(&c->allocs, a->id), (void *)a));
	for (uint32_t i = 0; i < a->nchunks; i++) {
		const struct chunk *ch = a->chunks[i];

		if (a->active) {
			cr_assert(not(eq(ptr, (void *)ch, NULL)));
			cr_assert(eq(ptr, ch->lent_to, (void *)a));
		}
		if (ch) {
			cr_assert(ch->lent_to != a || a->active);
			cr_assert(eq(i32, ch->dev, a->dev));
			sum += ch->size;
		}
	}
	if (a->active) {
		cr_assert(eq(u64, sum, a->size), "an active lend covers the allocation");
		lent[a->dev] += a->size;
	}
}

static void check_clients(uint64_t *lent)
{
	uint32_t nclients = 0;

	for (const struct bclient *c = br->clients; c; c = c->next, nclients++) {
		size_t nallocs = 0;
		uint64_t lent_chunks = 0;

		for (const struct btag *t = c->tags; t; t = t->next) {
			uint64_t bytes = 0;
			uint32_t n = 0;

			for (const struct balloc *a = t->allocs; a; a = a->next, n++) {
				cr_assert(eq(ptr, a->tag, (void *)t));
				cr_assert(a->active != t->paused);
				check_alloc(c, a, lent);
				bytes += a->size;
				lent_chunks += a->active ? a->nchunks : 0;
			}
			cr_assert(eq(u64, t->bytes, bytes));
			cr_assert(eq(u32, t->nallocs, n));
			nallocs += n;
		}
		cr_assert(eq(sz, c->allocs.count, nallocs));
		/* The per-uid chunk bound counts what is really lent. */
		cr_assert(eq(u64, c->lent_chunks, lent_chunks), "client %s lent chunks", c->name);
		cr_assert(eq(sz, c->ndrops, 0));
	}
	cr_assert(eq(u32, br->nclients, nclients));
}

/* Holder entries agree with the allocations' last lends. */
static void check_holders(void)
{
	uint64_t key;
	void *val;

	for (size_t it = 0; idmap_next(&br->chunks, &it, &key, &val);) {
		const struct chunk *ch = val;

		cr_assert(eq(u64, ch->id, key));
		cr_assert(not(ch->acked));
		for (uint32_t i = 0; i < ch->nholders; i++) {
			const struct chunk_holder *h = &ch->holders[i];

			cr_assert(eq(u32, h->refs, test_count_refs(h->client, ch)),
				  "chunk %llu refs", (unsigned long long)ch->id);
			cr_assert(h->refs > 0 || h->drop_sent);
			cr_assert(ch->releasing || h->drop_sent == false);
		}
	}
}

static void check_broker(void)
{
	uint64_t lent[BACKEND_MAX_DEVICES] = { 0 };
	uint32_t nchunks = 0;

	check_clients(lent);
	for (int d = 0; d < br->ndevices; d++) {
		check_pool(&br->pools[d]);
		cr_assert(eq(u64, br->pools[d].lent_bytes, lent[d]), "device %d lent bytes", d);
		nchunks += br->pools[d].nchunks;
	}
	cr_assert(eq(sz, br->chunks.count, (size_t)nchunks));
	cr_assert(eq(i32, proc_count_memfds(), (int)nchunks), "backend chunks alive");
	check_holders();
}

/* Everything a failed call must leave as it was, as text. */
static void snapshot(char *buf, size_t cap)
{
	FILE *f = fmemopen(buf, cap, "w");

	for (int d = 0; d < br->ndevices; d++) {
		const struct pool *p = &br->pools[d];

		fprintf(f, "dev%d held=%llu lent=%llu free=%llu pend=%llu n=%u free:", d,
			(unsigned long long)p->held_bytes, (unsigned long long)p->lent_bytes,
			(unsigned long long)p->free_bytes, (unsigned long long)p->pending_bytes,
			p->nchunks);
		for (const struct chunk *c = p->free_head; c; c = c->next)
			fprintf(f, " %llu", (unsigned long long)c->id);
		fprintf(f, "\n");
	}
	for (const struct bclient *c = br->clients; c; c = c->next)
		for (const struct btag *t = c->tags; t; t = t->next)
			for (const struct balloc *a = t->allocs; a; a = a->next) {
				fprintf(f, "c%llu %s%s a%llu:", (unsigned long long)c->id, t->name,
					t->paused ? "(p)" : "", (unsigned long long)a->id);
				for (uint32_t i = 0; i < a->nchunks; i++)
					fprintf(f, " %llu",
						a->chunks[i] ?
							(unsigned long long)a->chunks[i]->id :
							0ULL);
				fprintf(f, "\n");
			}
	for (uint64_t id = 1; id < br->next_chunk_id; id++) {
		const struct chunk *ch = idmap_get(&br->chunks, id);

		if (!ch)
			continue;
		fprintf(f, "k%llu lent=%d rel=%d", (unsigned long long)id, ch->lent_to != NULL,
			ch->releasing);
		for (uint32_t i = 0; i < ch->nholders; i++)
			fprintf(f, " h%llu/%u/%d", (unsigned long long)ch->holders[i].client->id,
				ch->holders[i].refs, ch->holders[i].drop_sent);
		fprintf(f, "\n");
	}
	fclose(f);
}

static void open_broker(uint64_t budget, uint64_t keep)
{
	struct broker_opts o = {
		.max_chunk = 1 * GiB, .pool_keep = keep, .budget = budget, .daemon_uid = 999
	};

	if (br)
		broker_free(br);
	br = NULL;
	cr_assert(eq(i32, broker_new(be, &o, &br), 0));
}

static void setup(void)
{
	struct backend_host_opts o = { .ndevices = 2, .memory = 8 * GiB, .granularity = 2 * MiB };

	cr_assert(eq(i32, backend_host_open(&o, &be), 0));
	open_broker(0, UINT64_MAX);
}

static void teardown(void)
{
	broker_free(br);
	cr_expect(eq(i32, proc_count_memfds(), 0), "chunks leaked past broker_free");
	test_backend_restore(be);
	backend_close(be);
	cr_expect(eq(i32, test_leak_check(), 0), "heap leaked: see the report");
}

TestSuite(broker, .init = setup, .fini = teardown, .timeout = 30);

static struct bclient *client_gid(const char *name, pid_t pid, uid_t uid, const gid_t *groups,
				  int ngroups)
{
	struct broker_peer peer = {
		.pid = pid, .uid = uid, .gid = uid, .groups = groups, .ngroups = ngroups
	};
	struct bclient *c = NULL;

	cr_assert(eq(i32, broker_client_add(br, &peer, name, true, false, &c), 0));
	return c;
}

static struct bclient *client(const char *name, pid_t pid, uid_t uid)
{
	return client_gid(name, pid, uid, NULL, 0);
}

/* Allocates, checks how many chunks and fds it took, returns the allocation. */
static struct balloc *alloc_ok(struct bclient *c, int dev, uint64_t size, const char *tag,
			       uint32_t want_chunks, size_t want_send)
{
	struct broker_result res;
	char err[ERR_MSG_MAX] = "";
	struct balloc *a;

	cr_assert(eq(i32, lend_alloc(br, c, dev, size, tag, &res, err), 0), "alloc: %s", err);
	cr_assert(eq(sz, res.nallocs, 1));
	a = res.allocs[0];
	if (want_chunks != UINT32_MAX)
		cr_assert(eq(u32, a->nchunks, want_chunks));
	if (want_send != ANY)
		cr_assert(eq(sz, res.nsend, want_send));
	broker_result_deinit(&res);
	check_broker();
	return a;
}

static int alloc_rc(struct bclient *c, int dev, uint64_t size, const char *tag, char *err)
{
	struct broker_result res;
	int rc = lend_alloc(br, c, dev, size, tag, &res, err);

	if (rc < 0) {
		cr_assert(eq(sz, res.nallocs, 0));
		cr_assert(eq(sz, res.nsend, 0));
	}
	broker_result_deinit(&res);
	check_broker();
	return rc;
}

static void resume_ok(struct bclient *c, const char *tag, size_t want_allocs, size_t want_send)
{
	struct broker_result res;
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, lend_resume(br, c, tag, &res, err), 0), "resume: %s", err);
	cr_assert(eq(sz, res.nallocs, want_allocs));
	cr_assert(eq(sz, res.nsend, want_send));
	broker_result_deinit(&res);
	check_broker();
}

static int resume_rc(struct bclient *c, const char *tag, char *err)
{
	struct broker_result res;
	int rc = lend_resume(br, c, tag, &res, err);

	broker_result_deinit(&res);
	check_broker();
	return rc;
}

static void pause_ok(struct bclient *c, const char *tag)
{
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, lend_pause(br, c, tag, false, err), 0), "pause: %s", err);
	check_broker();
}

static void free_ok(struct bclient *c, struct balloc *a)
{
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, lend_free(br, c, a->id, err), 0), "free: %s", err);
	check_broker();
}

static void record_drops(void *arg, struct bclient *c, const uint64_t *ids, size_t n)
{
	int i = drops.calls++;

	cr_assert(lt(i32, i, 8));
	cr_assert(le(sz, n, 16));
	drops.c[i] = c;
	drops.n[i] = n;
	memcpy(drops.ids[i], ids, n * sizeof(*ids));
}

static void flush(int want_calls)
{
	memset(&drops, 0, sizeof(drops));
	broker_flush_drops(br, record_drops, NULL);
	cr_assert(eq(i32, drops.calls, want_calls));
	check_broker();
}

Test(broker, alloc_sizes_chunks_and_sends_each_once)
{
	struct bclient *a = client("trainer", 41, 1000);
	struct balloc *x = alloc_ok(a, 0, 20 * MiB, "kv", 1, 1);

	cr_assert(eq(u64, x->chunks[0]->size, 20 * MiB));
	x = alloc_ok(a, 0, 3 * GiB, "kv", 3, 3);
	for (int i = 0; i < 3; i++)
		cr_assert(eq(u64, x->chunks[i]->size, 1 * GiB));
	x = alloc_ok(a, 1, 1, "w", 1, 1);
	cr_assert(eq(u64, x->size, 2 * MiB), "rounded up to the granularity");
	cr_assert(eq(u64, br->pools[0].lent_bytes, 3 * GiB + 20 * MiB));
	cr_assert(eq(u64, br->pools[1].lent_bytes, 2 * MiB));
}

Test(broker, same_uid_reuses_chunks_without_resending_to_a_holder)
{
	struct bclient *a = client("trainer", 41, 1000), *b = client("eval", 43, 1000);
	struct balloc *w = alloc_ok(a, 0, 1 * GiB, "w", 1, 1), *kv;
	struct chunk *x = w->chunks[0];

	pause_ok(a, "w");
	kv = alloc_ok(a, 0, 1 * GiB, "kv", 1, 0);
	cr_assert(eq(ptr, kv->chunks[0], x), "A's own paused chunk, handle already there");
	free_ok(a, kv);
	cr_assert(x->free && pool_is_held_by(x, a), "w's last lend still has it");
	kv = alloc_ok(b, 0, 1 * GiB, "kv", 1, 1);
	cr_assert(eq(ptr, kv->chunks[0], x), "another client of the same uid gets it, with its fd");
	cr_assert(eq(u32, br->pools[0].nchunks, 1));
}

Test(broker, never_lends_across_uids)
{
	struct bclient *a = client("trainer", 41, 1000), *c = client("other", 50, 2000);
	struct balloc *x = alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	uint64_t old = x->chunks[0]->id;

	free_ok(a, x);
	x = alloc_ok(c, 0, 1 * GiB, "w", 1, 1);
	cr_assert(x->chunks[0]->id != old, "a fresh chunk for uid 2000");
	cr_assert(eq(u64, br->pools[0].free_bytes, 1 * GiB), "uid 1000's chunk stays warm");

	/* With the budget full, the idle chunk of uid 1000 goes back to make room. */
	open_broker(2 * GiB, UINT64_MAX);
	a = client("trainer", 41, 1000);
	c = client("other", 50, 2000);
	x = alloc_ok(a, 0, 2 * GiB, "w", 2, 2);
	free_ok(a, x);
	x = alloc_ok(c, 0, 1 * GiB, "w", 1, 1);
	cr_assert(eq(u32, br->pools[0].nchunks, 2));
	cr_assert(eq(u64, br->pools[0].held_bytes, 2 * GiB));
	cr_assert(eq(i32, proc_count_memfds(), 2), "one chunk released, one created");
	cr_assert(eq(u32, br->pools[0].free_head->uid, 1000));
}

Test(broker, budget_refusal_names_who_holds_the_memory)
{
	struct bclient *t, *i;
	char err[ERR_MSG_MAX] = "", before[4096], after[4096];

	open_broker(4 * GiB, UINT64_MAX);
	t = client("trainer", 41, 1000);
	i = client("infer", 42, 1001);
	alloc_ok(t, 0, 3 * GiB, "w", 3, 3);
	alloc_ok(i, 0, 512 * MiB, "kv", 1, 1);
	snapshot(before, sizeof(before));
	cr_assert(eq(i32, alloc_rc(i, 0, 1 * GiB, "kv", err), -ENOMEM));
	cr_assert(not(eq(ptr,
			 strstr(err, "device 0: budget 4.0 GiB exhausted: need 512.0 MiB more"),
			 NULL)),
		  "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "trainer (pid 41, uid 1000) 3.0 GiB"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "infer (pid 42, uid 1001) 512.0 MiB"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "free in pool 0 B"), NULL)), "%s", err);
	snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before));
	cr_assert(eq(i32, alloc_rc(i, 0, 5 * GiB, "kv", err), -ENOMEM));
	cr_assert(eq(str, err, "allocation of 5.0 GiB exceeds device 0's budget of 4.0 GiB"));
}

Test(broker, eagain_until_holders_drop_then_success)
{
	struct bclient *a, *c;
	struct balloc *w;
	char err[ERR_MSG_MAX] = "";
	uint64_t ids[2];

	open_broker(2 * GiB, UINT64_MAX);
	a = client("trainer", 41, 1000);
	c = client("other", 50, 2000);
	w = alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	ids[0] = w->chunks[0]->id;
	ids[1] = 12345;
	pause_ok(a, "w");
	cr_assert(eq(i32, alloc_rc(c, 0, 2 * GiB, "kv", err), -EAGAIN));
	cr_assert(not(eq(ptr, strstr(err, "waiting for clients to drop handles to 1.0 GiB"), NULL)),
		  "%s", err);
	cr_assert(eq(u64, br->pools[0].pending_bytes, 1 * GiB));
	/* An ack before the request is sent is ignored: drop_sent is not set yet. */
	broker_dropped(br, a, ids, 1);
	cr_assert(eq(u32, br->pools[0].nchunks, 1));
	flush(1);
	cr_assert(eq(ptr, drops.c[0], a));
	cr_assert(eq(sz, drops.n[0], 1));
	cr_assert(eq(u64, drops.ids[0][0], ids[0]));
	flush(0);
	cr_assert(eq(i32, alloc_rc(c, 0, 2 * GiB, "kv", err), -EAGAIN), "still waiting");
	broker_dropped(br, c, ids, 2);
	cr_assert(eq(u32, br->pools[0].nchunks, 1), "not c's drop to ack");
	broker_dropped(br, a, ids, 2);
	check_broker();
	cr_assert(eq(u32, br->pools[0].nchunks, 0), "back to the backend");
	cr_assert(eq(ptr, w->chunks[0], NULL), "gone from the paused lend");
	alloc_ok(c, 0, 2 * GiB, "kv", 2, 2);
	cr_assert(eq(i32, resume_rc(a, "w", err), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "cannot resume tag 'w' of 'trainer': device 0: budget"),
			 NULL)),
		  "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "other (pid 50, uid 2000) 2.0 GiB"), NULL)), "%s", err);
	cr_assert(w->tag->paused);
}

Test(broker, pause_resume_reuses_the_exact_chunks)
{
	struct bclient *a = client("infer", 42, 1000);
	struct balloc *x = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	struct balloc *y = alloc_ok(a, 0, 20 * MiB, "kv", 1, 1);
	struct chunk *cx = x->chunks[0], *cy = y->chunks[0];
	char err[ERR_MSG_MAX];

	pause_ok(a, "kv");
	cr_assert(not(x->active || y->active));
	cr_assert(eq(u64, br->pools[0].lent_bytes, 0));
	cr_assert(eq(u64, br->pools[0].free_bytes, 1 * GiB + 20 * MiB));
	cr_assert(pool_is_held_by(cx, a) && pool_is_held_by(cy, a));
	pause_ok(a, "kv");
	cr_assert(eq(i32, alloc_rc(a, 0, 2 * MiB, "kv", err), -EBUSY));
	resume_ok(a, "kv", 2, 0);
	cr_assert(eq(ptr, x->chunks[0], cx));
	cr_assert(eq(ptr, y->chunks[0], cy));
	resume_ok(a, "kv", 0, 0);
	pause_ok(a, NULL);
	resume_ok(a, "", 2, 0);
	cr_assert(eq(i32, lend_pause(br, a, "nope", false, err), -ENOENT));
	cr_assert(eq(str, err, "client 'infer' has no tag 'nope'"));
	cr_assert(eq(i32, resume_rc(a, "nope", err), -ENOENT));
}

Test(broker, a_pause_with_handles_released_gives_the_chunks_back_at_once)
{
	struct bclient *a, *b;
	struct balloc *x, *y;
	char err[ERR_MSG_MAX] = "";

	open_broker(0, 0);
	a = client("infer", 42, 1000);
	b = client("old", 43, 1000);
	x = alloc_ok(a, 0, 3 * GiB, "kv", 3, 3);
	y = alloc_ok(b, 0, 1 * GiB, "kv", 1, 1);
	cr_assert(eq(i32, lend_pause(br, a, "kv", true, err), 0), "%s", err);
	check_broker();
	cr_assert(eq(u64, br->pools[0].held_bytes, 1 * GiB), "released within the call");
	cr_assert(eq(u64, br->pools[0].pending_bytes, 0), "no drop to wait for");
	cr_assert(eq(i32, proc_count_memfds(), 1), "only the other client's chunk is alive");
	for (uint32_t i = 0; i < x->nchunks; i++)
		cr_assert(eq(ptr, x->chunks[i], NULL), "the last lend names nothing any more");
	/* A client that keeps its handles: the chunk waits for its drop, as before. */
	pause_ok(b, "kv");
	cr_assert(eq(u64, br->pools[0].pending_bytes, 1 * GiB));
	cr_assert(pool_is_held_by(y->chunks[0], b));
	resume_ok(a, "kv", 1, 3);
	cr_assert(eq(u32, x->nchunks, 3), "new chunks, all sent again");
	cr_assert(eq(u64, br->pools[0].lent_bytes, 3 * GiB));
}

Test(broker, resume_after_another_client_took_the_chunks)
{
	struct bclient *a = client("infer", 42, 1000), *b = client("eval", 43, 1000);
	struct balloc *x = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1), *y;
	struct chunk *old = x->chunks[0];

	pause_ok(a, "kv");
	y = alloc_ok(b, 0, 1 * GiB, "kv", 1, 1);
	cr_assert(eq(ptr, y->chunks[0], old));
	resume_ok(a, "kv", 1, 1);
	cr_assert(x->chunks[0] != old, "a new chunk, with its fd");
	cr_assert(not(pool_is_held_by(old, a)), "the new lend replaced the old list");
	cr_assert(eq(u32, old->nholders, 1));
	cr_assert(eq(u32, br->pools[0].nchunks, 2));
}

Test(broker, failed_resume_rolls_back_new_chunks)
{
	struct bclient *a, *b;
	struct balloc *x1, *x2;
	char err[ERR_MSG_MAX], before[4096], after[4096];

	open_broker(3 * GiB, UINT64_MAX);
	a = client("infer", 42, 1000);
	b = client("eval", 43, 1000);
	x1 = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	x2 = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	pause_ok(a, "kv");
	alloc_ok(b, 0, 2 * GiB, "w", 2, 2);
	/* The first allocation gets a new chunk, the second finds no room. */
	snapshot(before, sizeof(before));
	cr_assert(eq(i32, resume_rc(a, "kv", err), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "eval (pid 43, uid 1000) 2.0 GiB"), NULL)), "%s", err);
	snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before));
	cr_assert(eq(u32, br->pools[0].nchunks, 2), "the new chunk went back");
	cr_assert(not(x1->active || x2->active));
	cr_assert(x1->tag->paused);
}

Test(broker, failed_resume_rolls_back_exact_lends)
{
	struct bclient *a, *b, *c;
	struct balloc *x1;
	char err[ERR_MSG_MAX], before[4096], after[4096];

	open_broker(3 * GiB, UINT64_MAX);
	a = client("infer", 42, 1000);
	b = client("eval", 43, 1000);
	c = client("other", 50, 2000);
	x1 = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	pause_ok(a, "kv");
	alloc_ok(b, 0, 1 * GiB, "w", 1, 1);
	alloc_ok(c, 0, 1 * GiB, "w", 1, 1);
	/* One allocation could take its chunk back, the other has nowhere to go. */
	snapshot(before, sizeof(before));
	cr_assert(eq(i32, resume_rc(a, NULL, err), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "cannot resume the tags of 'infer'"), NULL)), "%s", err);
	snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before));
	cr_assert(eq(u64, br->pools[0].free_bytes, 1 * GiB));
	cr_assert(not(x1->active));
}

Test(broker, free_of_paused_and_unknown_allocations)
{
	struct bclient *a = client("infer", 42, 1000), *b = client("eval", 43, 1000);
	struct balloc *x = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	struct chunk *cx = x->chunks[0];
	uint64_t id = x->id;
	char err[ERR_MSG_MAX];

	pause_ok(a, "kv");
	cr_assert(eq(i32, lend_free(br, b, id, err), -ENOENT), "not b's allocation");
	cr_assert(eq(str, err, "allocation 1 does not exist"));
	free_ok(a, x);
	cr_assert(cx->free && cx->nholders == 0, "back in the pool, nobody holds it");
	cr_assert(eq(u64, broker_tag_find(a, "kv")->bytes, 0));
	cr_assert(eq(i32, lend_free(br, a, id, err), -ENOENT));

	/* Keep nothing warm: a free goes straight back to the backend. */
	open_broker(0, 0);
	a = client("infer", 42, 1000);
	x = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	pause_ok(a, "kv");
	flush(1);
	free_ok(a, x);
	cr_assert(eq(u32, br->pools[0].nchunks, 1), "the drop of the paused chunk is unacked");
	broker_dropped(br, a, drops.ids[0], drops.n[0]);
	check_broker();
	cr_assert(eq(u32, br->pools[0].nchunks, 0));
}

Test(broker, client_removal_returns_every_byte)
{
	struct bclient *a = client("infer", 42, 1000), *b = client("eval", 43, 1000);
	uint64_t released, pending;
	char err[ERR_MSG_MAX];

	alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	alloc_ok(a, 0, 20 * MiB, "kv", 1, 1);
	alloc_ok(a, 0, 512 * MiB, "kv", 1, 1);
	alloc_ok(a, 1, 64 * MiB, "kv", 1, 1);
	pause_ok(a, "kv");
	alloc_ok(b, 0, 20 * MiB, "kv", 1, 1);
	cr_assert(eq(i32, broker_trim(br, 0, &released, &pending, err), 0));
	cr_assert(eq(u64, released, 0));
	cr_assert(eq(u64, pending, 512 * MiB), "held by a's paused lend");
	flush(1);
	broker_client_remove(br, a);
	check_broker();
	cr_assert(eq(u64, br->pools[0].lent_bytes, 20 * MiB), "b's lend only");
	cr_assert(eq(u64, br->pools[0].free_bytes, 1 * GiB));
	cr_assert(eq(u64, br->pools[0].pending_bytes, 0), "no drop owed by a gone client");
	cr_assert(eq(u64, br->pools[1].free_bytes, 64 * MiB));
	cr_assert(eq(u32, br->pools[0].nchunks, 2));
	broker_client_remove(br, b);
	check_broker();
	cr_assert(eq(u64, br->pools[0].lent_bytes, 0));
	cr_assert(eq(u64, br->pools[0].free_bytes, 1 * GiB + 20 * MiB));
	cr_assert(eq(i32, broker_trim(br, -1, &released, &pending, err), 0));
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

	open_broker(0, 1 * GiB);
	a = client("infer", 42, 1000);
	x = alloc_ok(a, 0, 3 * GiB, "w", 3, 3);
	free_ok(a, x);
	cr_assert(eq(u64, br->pools[0].held_bytes, 1 * GiB), "keep 1 GiB warm");
	cr_assert(eq(i32, broker_trim(br, 5, &released, &pending, err), -ENODEV));
	cr_assert(eq(str, err, "device 5 does not exist (2 devices)"));
	cr_assert(eq(i32, broker_trim(br, -1, &released, &pending, err), 0));
	cr_assert(eq(u64, released, 1 * GiB));
	x = alloc_ok(a, 0, 1 * GiB, "kv", 1, 1);
	pause_ok(a, "kv");
	cr_assert(eq(i32, broker_trim(br, 0, &released, &pending, err), 0));
	cr_assert(eq(u64, released, 0));
	cr_assert(eq(u64, pending, 1 * GiB));
	flush(1);
	id = drops.ids[0][0];
	cr_assert(eq(i32, broker_trim(br, 0, &released, &pending, err), 0));
	cr_assert(eq(u64, pending, 1 * GiB), "still waiting; no second drop");
	flush(0);
	broker_dropped(br, a, &id, 1);
	broker_dropped(br, a, &id, 1);
	check_broker();
	cr_assert(eq(i32, proc_count_memfds(), 0));
	resume_ok(a, "kv", 1, 1);
	cr_assert(not(eq(ptr, x->chunks[0], NULL)));
}

Test(broker, may_control_rules)
{
	gid_t admin[] = { 5, 0 };
	struct bclient *t = client("trainer", 41, 1000), *same = client("mate", 44, 1000);
	struct bclient *root = client("root", 1, 0), *stranger = client("x", 45, 1001);
	struct bclient *adm = client_gid("ops", 46, 1002, admin, 2), *gmbd = client("d", 47, 999);
	char err[ERR_MSG_MAX];

	admin[1] = 7; /* the broker keeps its own copy */
	cr_assert(eq(i32, broker_may_control(br, root, t, err), 0));
	cr_assert(eq(i32, broker_may_control(br, same, t, err), 0));
	cr_assert(eq(i32, broker_may_control(br, gmbd, t, err), 0));
	cr_assert(eq(i32, broker_may_control(br, adm, t, err), -EPERM), "no admin group set");
	cr_assert(eq(str, err,
		     "client 'ops' (uid 1002) may not control 'trainer' (uid 1000): "
		     "needs root, uid 1000, uid 999 (gmbd's)"));
	br->opts.have_admin_gid = true;
	br->opts.admin_gid = 0;
	cr_assert(eq(i32, broker_may_control(br, adm, t, err), 0), "supplementary group");
	cr_assert(eq(i32, broker_may_control(br, adm, NULL, err), 0));
	cr_assert(eq(i32, broker_may_control(br, stranger, t, err), -EPERM));
	cr_assert(eq(str, err,
		     "client 'x' (uid 1001) may not control 'trainer' (uid 1000): "
		     "needs root, uid 1000, uid 999 (gmbd's) or group 'root'"));
	cr_assert(eq(i32, broker_may_control(br, stranger, NULL, err), -EPERM));
	cr_assert(eq(str, err,
		     "client 'x' (uid 1001) may not trim the pools: "
		     "needs root, uid 999 (gmbd's) or group 'root'"));
	br->opts.admin_gid = 1001;
	cr_assert(eq(i32, broker_may_control(br, stranger, NULL, err), 0), "primary group");
}

/* What @sel finds: the client when one matches, and how many matched. */
static struct bclient *find(const char *sel, size_t want_n)
{
	struct broker_found f;
	struct bclient *c = broker_client_find(br, sel, &f);

	cr_assert(eq(sz, f.n, want_n), "'%s' matched %zu", sel, f.n);
	cr_assert(eq(ptr, c, want_n == 1 ? f.c[0] : NULL), "'%s'", sel);
	return c;
}

Test(broker, client_find_by_id_pid_and_name)
{
	struct broker_peer tool_peer = { .pid = 44, .uid = 1000, .gid = 1000 };
	struct bclient *t = client("trainer", 41, 1000), *i1 = client("infer", 42, 1000);
	struct bclient *i2 = client("infer", 43, 1000), *num = client("99999", 45, 1000), *tool;
	char longname[300];

	cr_assert(eq(i32, broker_client_add(br, &tool_peer, "gmbctl", false, true, &tool), 0));
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
	cr_assert(eq(ptr, broker_client_find(br, "trainer", NULL), t), "the result is optional");
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	cr_assert(eq(sz, strlen(client(longname, 50, 1000)->name), (size_t)WIRE_MAX_NAME));
}

/* None, one, several: the candidates are named, each case has its sentence. */
Test(broker, client_find_says_none_one_or_several_with_the_candidates)
{
	struct bclient *i1 = client("infer", 42, 1000), *i2 = client("infer", 43, 1000);
	struct bclient *a = client("a", 77, 1000), *b = client("b", 77, 1000);
	struct broker_found f;
	char err[ERR_MSG_MAX];

	cr_assert(eq(ptr, broker_client_find(br, "ghost", &f), NULL));
	cr_assert(eq(sz, f.n, 0));
	cr_assert(eq(i32, broker_found_err(&f, "ghost", false, err), -ENOENT));
	cr_assert(eq(str, err, "no client matches 'ghost'"));
	cr_assert(eq(i32, broker_found_err(&f, "ghost", true, err), -ENOENT));
	cr_assert(eq(str, err, "no client or group matches 'ghost'"));

	cr_assert(eq(ptr, broker_client_find(br, "infer", &f), NULL));
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
	cr_assert(eq(ptr, broker_client_find(br, "77", &f), NULL));
	cr_assert(eq(sz, f.n, 2));
	cr_assert(f.by_pid);
	cr_assert(f.c[0] == a ? f.c[1] == b : f.c[0] == b && f.c[1] == a);
	cr_assert(eq(i32, broker_found_err(&f, "77", false, err), -ENOTUNIQ));
	cr_assert(not(eq(ptr, strstr(err, "2 clients have pid 77 (#"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "'a'"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "): name one by id (#N)"), NULL)), "%s", err);
	cr_assert(eq(ptr, strstr(err, "or pid"), NULL), "a pid cannot tell them apart: %s", err);
	cr_assert(eq(ptr, broker_client_find(br, "#3", &f), a));
	cr_assert(eq(sz, f.n, 1));
}

/* More candidates than the result keeps: the count is right, the rest elided. */
Test(broker, client_find_keeps_the_first_candidates_and_counts_them_all)
{
	struct broker_found f;
	char err[ERR_MSG_MAX];

	for (int i = 0; i < BROKER_FOUND_MAX + 3; i++)
		client("rank", 100 + i, 1000);
	cr_assert(eq(ptr, broker_client_find(br, "rank", &f), NULL));
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
	struct bclient *c = client("trainer", 41, 1000), *empty = client("new", 42, 1000);
	char err[ERR_MSG_MAX], name[WIRE_MAX_NAME + 1];

	cr_assert(eq(i32, broker_tag_check(empty, "", err), 0), "every tag of none");
	cr_assert(eq(i32, broker_tag_check(empty, "kv", err), -ENOENT));
	cr_assert(eq(str, err, "client 'new' has no tag 'kv': it has no tags yet"));
	alloc_ok(c, 0, 2 * MiB, "kv", UINT32_MAX, ANY);
	cr_assert(eq(i32, broker_set_mode(br, c, "weights", GMB_MODE_PRESERVE, err), 0), "%s", err);
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
		cr_assert(eq(i32, broker_set_mode(br, c, name, GMB_MODE_DISCARD, err), 0), "%s",
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
	struct bclient *a = client("infer", 42, 1000);
	char err[ERR_MSG_MAX], tag[WIRE_MAX_NAME + 2];

	cr_assert(eq(i32, alloc_rc(a, 3, 1 * MiB, "kv", err), -ENODEV));
	cr_assert(eq(str, err, "device 3 does not exist (2 devices)"));
	cr_assert(eq(i32, alloc_rc(a, -1, 1 * MiB, "kv", err), -ENODEV));
	cr_assert(eq(i32, alloc_rc(a, 0, 0, "kv", err), -EINVAL));
	cr_assert(eq(i32, alloc_rc(a, 0, 1 * MiB, "", err), -EINVAL));
	memset(tag, 't', sizeof(tag) - 1);
	tag[sizeof(tag) - 1] = '\0';
	cr_assert(eq(i32, alloc_rc(a, 0, 1 * MiB, tag, err), -EINVAL));
	cr_assert(eq(i32, broker_set_mode(br, a, "w", 3, err), -EINVAL));
	cr_assert(eq(i32, broker_set_mode(br, a, "w", GMB_MODE_PRESERVE, err), 0));
	cr_assert(eq(i32, broker_tag_find(a, "w")->mode, GMB_MODE_PRESERVE));
	for (int i = 1; i < BROKER_MAX_TAGS; i++) {
		snprintf(tag, sizeof(tag), "t%d", i);
		cr_assert(eq(i32, broker_set_mode(br, a, tag, GMB_MODE_ZERO, err), 0));
	}
	cr_assert(eq(i32, broker_set_mode(br, a, "one-too-many", 0, err), -ENOSPC));
	cr_assert(eq(i32, alloc_rc(a, 0, 1 * MiB, "one-too-many", err), -ENOSPC));
	cr_assert(eq(str, err, "client 'infer' already has 256 tags, the limit"));
	cr_assert(eq(i32, alloc_rc(a, 0, 1 * MiB, "w", err), 0));
	cr_assert(eq(u32, a->ntags, BROKER_MAX_TAGS));
}

Test(broker, failed_alloc_leaks_nothing)
{
	struct bclient *a = client("infer", 42, 1000);
	char err[ERR_MSG_MAX];

	alloc_ok(a, 0, 1 * GiB, "w", 1, 1);
	test_backend_fail_creates(be, 1);
	/* Four chunks: the first created, the second fails. */
	cr_assert(eq(i32, alloc_rc(a, 0, 4 * GiB, "kv", err), -EIO));
	cr_assert(not(eq(ptr, strstr(err, "injected chunk_create failure"), NULL)), "%s", err);
	cr_assert(eq(u32, br->pools[0].nchunks, 1));
	cr_assert(eq(ptr, broker_tag_find(a, "kv"), NULL), "no tag left behind");
	cr_assert(eq(sz, a->allocs.count, 1));
	test_backend_restore(be);
	alloc_ok(a, 0, 4 * GiB, "kv", 4, 4);
}

/* ---- arbitration: switches, the waiting queue, preemption ---- */

Test(broker, a_switch_keeps_from_chunks_for_to_whatever_the_keep_limit)
{
	struct bclient *a, *b, *other;
	struct bhandover *h;
	struct broker_handover_stats st;
	char err[ERR_MSG_MAX] = "";
	uint64_t created;

	open_broker(4 * GiB, 0);
	a = client("from", 10, 1000);
	b = client("to", 11, 1000);
	other = client("other", 12, 1000);
	alloc_ok(b, 0, 2 * GiB, "kv", 2, 2);
	pause_ok(b, "kv");
	flush(1);
	broker_dropped(br, b, drops.ids[0], drops.n[0]);
	alloc_ok(a, 0, 2 * GiB, "w", 2, 2);
	created = br->pools[0].chunks_created;

	struct bclient *from[] = { a }, *to[] = { b };
	cr_assert(eq(i32, arb_handover_begin(br, from, 1, to, 1, &h, err), 0), "%s", err);
	cr_assert(eq(i32, arb_handover_begin(br, to, 1, from, 1, &h, err), -EBUSY));
	pause_ok(a, "w");
	flush(0); /* kept for TO: no drop, no release under --pool-keep 0 */
	cr_assert(eq(u64, br->pools[0].free_bytes, 2 * GiB));
	/* Nobody else may take them meanwhile. */
	cr_assert(eq(i32, alloc_rc(other, 0, 4 * GiB, "x", err), -ENOMEM), "%s", err);
	resume_ok(b, "kv", 1, 2);
	cr_assert(eq(u64, br->pools[0].chunks_created, created), "handed over, none created");
	cr_assert(eq(u64, br->pools[0].chunks_handed_over, 2));
	arb_handover_end(br, h, &st);
	cr_assert(eq(u64, st.handed_bytes, 2 * GiB));
	cr_assert(eq(u64, st.created_bytes, 0));
	cr_assert(eq(ptr, (void *)a->handover, NULL));
	check_broker();
}

Test(broker, a_switch_between_users_reserves_nothing)
{
	struct bclient *a, *b;
	struct bhandover *h;
	char err[ERR_MSG_MAX] = "";

	open_broker(4 * GiB, 0);
	a = client("from", 10, 1000);
	b = client("to", 11, 1001);
	alloc_ok(a, 0, 2 * GiB, "w", 2, 2);
	struct bclient *from[] = { a }, *to[] = { b };
	cr_assert(eq(i32, arb_handover_begin(br, from, 1, to, 1, &h, err), 0), "%s", err);
	pause_ok(a, "w");
	flush(1); /* released as any pause under --pool-keep 0 */
	arb_handover_end(br, h, NULL);
	check_broker();
}

Test(broker, waiters_queue_by_priority_then_arrival)
{
	struct bclient *lo = client("lo", 10, 1000), *hi = client("hi", 11, 1000);
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
		wait_add(br, &w[i]);
	for (p = br->waiters; p; p = p->next)
		order[n++] = p;
	cr_assert(eq(sz, n, 4));
	cr_assert(order[0] == &w[1] && order[1] == &w[3] && order[2] == &w[0] && order[3] == &w[2]);
	cr_assert(wait_ahead(br, lo, 0));
	cr_assert(not(wait_ahead(br, hi, 1)), "a lower priority is not ahead");
	wait_set_priority(br, lo, 9);
	cr_assert(eq(ptr, (void *)br->waiters, &w[0]), "lo first now, arrival kept");
	cr_assert(eq(ptr, (void *)br->waiters->next, &w[2]));
	broker_client_remove(br, lo);
	cr_assert(eq(ptr, (void *)br->waiters, &w[1]), "a removed client's waiters leave");
	cr_assert(not(w[0].linked));
	wait_remove(br, &w[0]); /* no-op */
	wait_remove(br, &w[1]);
	wait_remove(br, &w[3]);
	cr_assert(eq(ptr, (void *)br->waiters, NULL));
}

Test(broker, preemption_picks_low_priority_opted_in_clients_that_cover_the_need)
{
	struct bclient *hi = client("hi", 10, 1000), *a = client("a", 11, 1000);
	struct bclient *b = client("b", 12, 1000), *no = client("no", 13, 1000);
	struct bclient *out[8];
	struct bwaiter w = { .client = hi, .dev = 0, .need = 3 * GiB };

	arb_client_set(hi, "", 10, false);
	arb_client_set(a, "", 1, true);
	arb_client_set(b, "", 0, true);
	arb_client_set(no, "", 0, false);
	alloc_ok(a, 0, 2 * GiB, "x", 2, 2);
	alloc_ok(b, 0, 2 * GiB, "x", 2, 2);
	alloc_ok(no, 0, 2 * GiB, "x", 2, 2);
	w.need = 5 * GiB;
	cr_assert(eq(sz, arb_preempt_pick(br, &w, out, 8), 0), "4 GiB cannot cover 5");
	w.need = 3 * GiB;
	cr_assert(eq(sz, arb_preempt_pick(br, &w, out, 8), 2));
	cr_assert(out[0] == b && out[1] == a, "lowest priority first");
	cr_assert(eq(u64, a->preempt_for, hi->id));
	cr_assert(eq(sz, arb_preempt_pick(br, &w, out, 8), 0), "not asked twice");
	arb_preempt_done(a);
	arb_preempt_done(b);
	w.need = 1 * GiB;
	cr_assert(eq(sz, arb_preempt_pick(br, &w, out, 8), 1));
	cr_assert(eq(ptr, (void *)out[0], b));
}

/* 2 GiB: a trainer holding 1 GiB of a tag it paused, and another client. */
static void trainer_and_other(struct bclient **a, struct bclient **c)
{
	open_broker(2 * GiB, UINT64_MAX);
	*a = client("trainer", 41, 1000);
	*c = client("other", 50, 2000);
	alloc_ok(*a, 0, 1 * GiB, "w", 1, 1);
	pause_ok(*a, "w");
}

/* Handles of a client without a session are not asked for: no wait for them. */
Test(broker, memory_an_orphan_holds_is_refused_at_once_with_its_name)
{
	struct bclient *a, *c;
	char err[ERR_MSG_MAX] = "";

	trainer_and_other(&a, &c);
	rejoin_orphan(br, a);
	cr_assert(eq(i32, alloc_rc(c, 0, 2 * GiB, "kv", err), -ENOMEM),
		  "a request waited for a drop nobody can send: %s", err);
	cr_assert(not(eq(ptr, strstr(err, "not connected"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "trainer (pid 41, uid 1000) 1.0 GiB"), NULL)), "%s", err);
	cr_assert(eq(u64, br->pools[0].pending_bytes, 0), "the orphan's chunk was marked");
	check_broker();
}

/* The same when the holder went after its chunk was marked releasing. */
Test(broker, a_wait_for_a_holder_that_went_ends_at_once)
{
	struct bclient *a, *c;
	char err[ERR_MSG_MAX] = "";

	trainer_and_other(&a, &c);
	cr_assert(eq(i32, alloc_rc(c, 0, 2 * GiB, "kv", err), -EAGAIN));
	rejoin_orphan(br, a);
	err[0] = 0;
	cr_assert(eq(i32, alloc_rc(c, 0, 2 * GiB, "kv", err), -ENOMEM),
		  "still waiting for an orphan's drop: %s", err);
	cr_assert(not(eq(ptr, strstr(err, "trainer (pid 41, uid 1000) 1.0 GiB"), NULL)), "%s", err);
	check_broker();
}

/* ---- the chunk bound per uid ---- */

Test(broker, the_chunk_bound_is_per_uid_over_its_clients_and_devices)
{
	struct bclient *a = client("a", 10, 1000), *b = client("b", 11, 1000);
	struct bclient *other = client("o", 12, 2000);
	char err[ERR_MSG_MAX] = "", before[8192], after[8192];
	struct balloc *big;

	br->opts.max_chunks_per_uid = 4;
	big = alloc_ok(a, 0, 2 * GiB, "t", 2, 2);
	alloc_ok(b, 1, 1 * GiB, "t", 1, 1);
	cr_assert(eq(u64, broker_uid_chunks(br, 1000), 3));
	snapshot(before, sizeof(before));
	cr_assert(eq(i32, alloc_rc(b, 0, 2 * GiB, "t", err), -ENOSPC), "%s", err);
	cr_assert(
		not(eq(ptr, strstr(err, "uid 1000 has 3 chunks lent and this needs 2 more"), NULL)),
		"%s", err);
	snapshot(after, sizeof(after));
	cr_assert(eq(str, after, before), "a refusal changed nothing");
	alloc_ok(other, 0, 4 * GiB, "t", 4, 4);

	/* A paused allocation's chunks are not lent: they count again at resume. */
	pause_ok(a, "t");
	cr_assert(eq(u64, broker_uid_chunks(br, 1000), 1));
	alloc_ok(b, 0, 2 * GiB, "u", 2, ANY);
	cr_assert(eq(i32, resume_rc(a, "t", err), -ENOSPC), "%s", err);
	cr_assert(a->tags->paused, "a refused resume leaves the tag paused");
	cr_assert(not(big->active));
	cr_assert(eq(i32, lend_free(br, b, b->tags->next->allocs->id, err), 0), "%s", err);
	cr_assert(eq(i32, resume_rc(a, "t", err), 0), "%s", err);
	cr_assert(eq(u64, broker_uid_chunks(br, 1000), 3));
}

/* ---- walk.h ---- */

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
	struct bclient *tool = NULL, *tmp = client("tmp", 29, 1000);
	struct balloc *spare;
	struct chunk *chunks[2];
	struct btag *t;

	*a = client("a", 20, 1000);
	cr_assert(eq(i32, broker_client_add(br, &peer, "gmbctl", false, true, &tool), 0));
	*w1 = alloc_ok(*a, 0, 4 * MiB, "w", 1, ANY);
	*w2 = alloc_ok(*a, 1, 2 * MiB, "w", 1, ANY);
	cr_assert(eq(i32, broker_set_mode(br, *a, "kv", GMB_MODE_PRESERVE, err), 0), "%s", err);
	spare = alloc_ok(tmp, 0, 2 * MiB, "s", 1, ANY);
	*kept = spare->chunks[0];
	broker_client_remove(br, tmp); /* its chunk stays in the pool */
	cr_assert(eq(i32, broker_restore_client(br, &peer, 77, "b", true, b), 0));
	cr_assert(eq(i32, rejoin_restore_tag(*b, "x", GMB_MODE_DISCARD, true, &t), 0));
	chunks[0] = *kept;
	chunks[1] = NULL;
	cr_assert(eq(i32, rejoin_restore_alloc(br, *b, t, 900, 0, 4 * MiB, false, chunks, 2), 0));
	check_broker();
}

Test(broker, the_walk_visits_every_node_once_in_the_records_order)
{
	struct bclient *a, *b;
	struct balloc *w1, *w2;
	struct chunk *kept;
	struct trace tr = { 0 };
	char want[512];

	walk_tree_fixture(&a, &b, &w1, &w2, &kept);
	cr_assert(eq(i32, walk_tree(br, &trace_ops, &tr), 0));
	/* Clients as added (no tool), tags as made, allocations newest first,
	 * a lend's chunks in mapping order with the dropped one as 0. */
	snprintf(want, sizeof(want),
		 "c%llu[w( a%llu: k%llu a%llu: k%llu)kv()]c77[x( a900: k%llu k0)]",
		 (unsigned long long)a->id, (unsigned long long)w2->id,
		 (unsigned long long)w2->chunks[0]->id, (unsigned long long)w1->id,
		 (unsigned long long)w1->chunks[0]->id, (unsigned long long)kept->id);
	cr_assert(eq(str, tr.buf, want));
}

Test(broker, a_walk_stops_at_the_first_nonzero_callback_and_returns_it)
{
	struct bclient *a, *b;
	struct balloc *w1, *w2;
	struct chunk *kept;
	struct trace tr = { .stop_at = 3, .stop_rc = 7 };
	char want[128];

	walk_tree_fixture(&a, &b, &w1, &w2, &kept);
	cr_assert(eq(i32, walk_tree(br, &trace_ops, &tr), 7), "a positive result: found");
	snprintf(want, sizeof(want), "c%llu[w( a%llu:", (unsigned long long)a->id,
		 (unsigned long long)w2->id);
	cr_assert(eq(str, tr.buf, want), "nothing after the stop, no _end either");
	tr = (struct trace){ .stop_at = 1, .stop_rc = -ENOMEM };
	cr_assert(eq(i32, walk_client(b, &trace_ops, &tr), -ENOMEM), "a failure");
	cr_assert(eq(str, tr.buf, "c77["));
}

Test(broker, a_walk_of_one_client_sees_only_the_levels_asked_for)
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

	cr_assert(eq(ptr, idmap_get(&br->chunks, ch->id), (void *)ch));
	v[0]++;
	v[1] += ch->size;
	return 0;
}

Test(broker, the_chunk_walk_visits_every_chunk_alive_once)
{
	struct bclient *a, *b;
	struct balloc *w1, *w2;
	struct chunk *kept;
	uint64_t v[2] = { 0 }, held = 0;

	walk_tree_fixture(&a, &b, &w1, &w2, &kept);
	cr_assert(eq(i32, walk_chunks(br, count_chunk, v), 0));
	for (int d = 0; d < br->ndevices; d++)
		held += br->pools[d].held_bytes;
	cr_assert(eq(u64, v[0], br->chunks.count));
	cr_assert(eq(u64, v[1], held));
}

/* Removes every client it is handed but the first, and counts them all. */
static int remove_but_first(void *arg, struct bclient *c)
{
	int *n = arg;

	if ((*n)++ > 0)
		broker_client_remove(br, c);
	return 0;
}

Test(broker, the_client_walk_lets_its_callback_remove_the_client)
{
	struct bclient *a = client("a", 20, 1000);
	int n = 0;

	client("b", 21, 1000);
	alloc_ok(client("c", 22, 1001), 0, 4 * MiB, "w", 1, ANY);
	client("d", 23, 1000);
	cr_assert(eq(i32, walk_clients(br, remove_but_first, &n), 0));
	cr_assert(eq(i32, n, 4), "each client once");
	cr_assert(eq(ptr, br->clients, a));
	cr_assert(eq(u32, br->nclients, 1));
	check_broker();
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
		wait_remove(br, (struct bwaiter *)w);
	return 0;
}

Test(broker, the_waiter_walk_goes_in_serving_order_and_survives_removal)
{
	struct bclient *lo = client("lo", 10, 1000), *hi = client("hi", 11, 1000);
	struct bwaiter w[4] = {
		{ .client = lo, .dev = 0 },
		{ .client = hi, .dev = 0 },
		{ .client = lo, .dev = 1 },
		{ .client = hi, .dev = 0 },
	};
	const struct bwaiter *seen[5] = { 0 }, *left[5] = { 0 };

	arb_client_set(hi, "g", 5, false);
	for (int i = 0; i < 4; i++)
		wait_add(br, &w[i]);
	cr_assert(eq(i32, walk_waiters(br, take_every_second, seen), 0));
	cr_assert(seen[0] == &w[1] && seen[1] == &w[3] && seen[2] == &w[0] && seen[3] == &w[2]);
	cr_assert(eq(i32, walk_waiters(br, take_every_second, left), 0));
	cr_assert(left[0] == &w[1] && left[1] == &w[0] && !left[2], "the second and fourth left");
	wait_remove(br, &w[1]);
}
