/*
 * test_client_mem.c - libgmb's handle cache and last-lend bookkeeping
 * (client/lib/cache/cache.c), which must follow the rule gmbd mirrors: a client holds
 * a chunk's handle exactly while some allocation of it has that chunk in its
 * last lend. No daemon and no backend: handles are plain numbers and the
 * release list is inspected directly.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/cache/cache.h"
#include "include/gmb.h"

#define MiB (1024ULL * 1024)

static struct gmb__cache mem;
static struct gmb__handle *rel;
static char err[ERR_MSG_MAX];

static void setup(void)
{
	memset(&mem, 0, sizeof(mem));
	rel = NULL;
	err[0] = 0;
}

static void teardown(void)
{
	struct gmb__handle *all = NULL;

	gmb__cache_clear(&mem, &all);
	gmb__cache_release_run(NULL, all);
	gmb__cache_release_run(NULL, rel);
	idmap_deinit(&mem.by_id);
	idmap_deinit(&mem.by_va);
}

TestSuite(client_mem, .init = setup, .fini = teardown, .timeout = 10);

/* An imported chunk: handle = 1000 + id, as a backend would hand out. */
static void import(uint64_t id, uint64_t size)
{
	cr_assert(eq(i32, gmb__cache_put(&mem, id, 1000 + id, size, &rel), 0));
}

static struct gmb__alloc *alloc_new(uint64_t id, uint64_t size)
{
	struct gmb__alloc *a = calloc(1, sizeof(*a));

	cr_assert(not(eq(ptr, a, NULL)));
	a->id = id;
	a->size = size;
	a->va = 0x7f0000000000ULL + id * (1ULL << 32);
	cr_assert(eq(i32, idmap_put(&mem.by_id, id, a), 0));
	return a;
}

static void alloc_free(struct gmb__alloc *a)
{
	gmb__cache_lend_clear(&mem, a, &rel);
	idmap_del(&mem.by_id, a->id);
	free(a);
}

static void lend(struct gmb__alloc *a, const uint64_t *ids, const uint64_t *sizes, uint32_t n)
{
	cr_assert(eq(i32, gmb__cache_lend_set(&mem, a, ids, sizes, n, &rel), 0));
}

static uint32_t refs(uint64_t id)
{
	struct gmb__handle *e = idmap_get(&mem.cache, id);

	return e ? e->refs : UINT32_MAX;
}

static bool cached(uint64_t id)
{
	return idmap_get(&mem.cache, id) != NULL;
}

/* Counts the release list and checks that it holds exactly @want handles. */
static size_t released(void)
{
	size_t n = 0;

	for (struct gmb__handle *h = rel; h; h = h->next)
		n++;
	return n;
}

static bool released_has(uint64_t id)
{
	for (struct gmb__handle *h = rel; h; h = h->next)
		if (h->id == id && h->handle == 1000 + id)
			return true;
	return false;
}

Test(client_mem, a_lend_references_each_chunk_once)
{
	static const uint64_t ids[] = { 1, 2 }, sizes[] = { 4 * MiB, 2 * MiB };
	struct gmb__alloc *a = alloc_new(10, 6 * MiB);

	import(1, 4 * MiB);
	import(2, 2 * MiB);
	cr_assert(eq(u32, refs(1), 0), "a fresh import is not held by any allocation yet");
	lend(a, ids, sizes, 2);
	cr_assert(eq(u32, refs(1), 1));
	cr_assert(eq(u32, refs(2), 1));
	cr_assert(eq(u32, a->nchunks, 2));
	cr_assert(eq(u64, a->chunk_ids[0], 1), "mapping order is kept");
	cr_assert(eq(sz, released(), 0));
	alloc_free(a);
	cr_assert(not(cached(1)), "a free drops the last reference");
	cr_assert(not(cached(2)));
	cr_assert(eq(sz, released(), 2));
	cr_assert(released_has(1) && released_has(2));
}

Test(client_mem, a_new_lend_replaces_the_list_and_keeps_shared_chunks)
{
	static const uint64_t first[] = { 1, 2 }, second[] = { 2, 3 };
	static const uint64_t sizes[] = { 2 * MiB, 2 * MiB };
	struct gmb__alloc *a = alloc_new(10, 4 * MiB);

	import(1, 2 * MiB);
	import(2, 2 * MiB);
	lend(a, first, sizes, 2);
	import(3, 2 * MiB);
	lend(a, second, sizes, 2);
	cr_assert(not(cached(1)), "chunk 1 left the last lend: released");
	cr_assert(eq(u32, refs(2), 1), "chunk 2 is in both lends: kept, counted once");
	cr_assert(eq(u32, refs(3), 1));
	cr_assert(eq(sz, released(), 1));
	cr_assert(released_has(1));
	alloc_free(a);
}

Test(client_mem, a_chunk_in_two_last_lends_lives_until_both_move_on)
{
	static const uint64_t x[] = { 7 }, y[] = { 8 }, sizes[] = { 2 * MiB };
	struct gmb__alloc *a = alloc_new(10, 2 * MiB), *b = alloc_new(11, 2 * MiB);

	/* a paused with chunk 7 in its last lend; gmbd then lent 7 to b. */
	import(7, 2 * MiB);
	lend(a, x, sizes, 1);
	lend(b, x, sizes, 1);
	cr_assert(eq(u32, refs(7), 2));
	import(8, 2 * MiB);
	lend(a, y, sizes, 1);
	cr_assert(eq(u32, refs(7), 1), "b still names chunk 7");
	cr_assert(eq(sz, released(), 0));
	alloc_free(b);
	cr_assert(not(cached(7)));
	cr_assert(eq(u32, refs(8), 1));
	alloc_free(a);
	cr_assert(eq(sz, released(), 2));
}

Test(client_mem, a_drop_releases_regardless_of_refs_and_clears_last_lends)
{
	static const uint64_t ids[] = { 1, 2 }, sizes[] = { 2 * MiB, 2 * MiB };
	static const uint64_t drop[] = { 2, 99 };
	struct gmb__alloc *a = alloc_new(10, 4 * MiB), *b = alloc_new(11, 4 * MiB);

	import(1, 2 * MiB);
	import(2, 2 * MiB);
	lend(a, ids, sizes, 2);
	lend(b, ids, sizes, 2);
	cr_assert(eq(i32, gmb__cache_drop(&mem, drop, 2, &rel, err), 0));
	cr_assert(not(cached(2)), "dropped although two allocations named it");
	cr_assert(eq(sz, released(), 1), "the unknown id 99 is ignored");
	cr_assert(eq(u64, a->chunk_ids[1], 0), "a's last lend no longer names chunk 2");
	cr_assert(eq(u64, b->chunk_ids[1], 0));
	cr_assert(eq(u64, a->chunk_ids[0], 1));
	cr_assert(eq(u32, refs(1), 2));
	/* A re-sent chunk 2 after the drop must not be unreferenced by the old lists. */
	import(2, 2 * MiB);
	alloc_free(a);
	alloc_free(b);
	cr_assert(not(cached(1)));
	cr_assert(cached(2), "the new import of 2 is untouched by frees of stale lists");
	cr_assert(eq(u32, refs(2), 0));
}

Test(client_mem, mapping_a_lend_with_a_dropped_chunk_fails)
{
	static const uint64_t ids[] = { 1 }, sizes[] = { 2 * MiB };
	struct gmb__alloc *a = alloc_new(10, 2 * MiB);
	uint64_t h[1];

	import(1, 2 * MiB);
	lend(a, ids, sizes, 1);
	cr_assert(eq(i32, gmb__cache_lend_handles(&mem, a, h, err), 0));
	cr_assert(eq(u64, h[0], 1001));
	cr_assert(eq(i32, gmb__cache_drop(&mem, ids, 1, &rel, err), 0));
	cr_assert(eq(i32, gmb__cache_lend_handles(&mem, a, h, err), -EPROTO));
	cr_assert(ne(sz, strlen(err), 0));
	alloc_free(a);
}

Test(client_mem, sweep_releases_only_unreferenced_imports)
{
	static const uint64_t ids[] = { 1 }, sizes[] = { 2 * MiB };
	struct gmb__alloc *a = alloc_new(10, 2 * MiB);

	import(1, 2 * MiB);
	import(2, 2 * MiB); /* imported for a request that then failed */
	lend(a, ids, sizes, 1);
	gmb__cache_sweep(&mem, &rel);
	cr_assert(cached(1));
	cr_assert(not(cached(2)));
	cr_assert(eq(sz, released(), 1));
	cr_assert(released_has(2));
	alloc_free(a);
}

Test(client_mem, a_resent_chunk_keeps_its_refs_and_releases_the_old_handle)
{
	static const uint64_t ids[] = { 1 }, sizes[] = { 2 * MiB };
	struct gmb__alloc *a = alloc_new(10, 2 * MiB);

	import(1, 2 * MiB);
	lend(a, ids, sizes, 1);
	cr_assert(eq(i32, gmb__cache_put(&mem, 1, 5555, 2 * MiB, &rel), 0));
	cr_assert(eq(u32, refs(1), 1));
	cr_assert(eq(u64, ((struct gmb__handle *)idmap_get(&mem.cache, 1))->handle, 5555));
	cr_assert(eq(sz, released(), 1));
	cr_assert(released_has(1), "the handle it replaced is released");
	alloc_free(a);
}

Test(client_mem, lend_set_with_an_unknown_chunk_changes_nothing)
{
	static const uint64_t good[] = { 1 }, bad[] = { 1, 42 }, sizes[] = { 2 * MiB, 2 * MiB };
	struct gmb__alloc *a = alloc_new(10, 2 * MiB);

	import(1, 2 * MiB);
	lend(a, good, sizes, 1);
	cr_assert(eq(i32, gmb__cache_lend_set(&mem, a, bad, sizes, 2, &rel), -EPROTO));
	cr_assert(eq(u32, refs(1), 1), "no reference taken or dropped");
	cr_assert(eq(u32, a->nchunks, 1));
	alloc_free(a);
}

static Gmb__Lend make_lend(uint64_t alloc_id, uint64_t size, uint64_t *ids, uint64_t *sizes,
			   size_t n)
{
	Gmb__Lend l = GMB__LEND__INIT;

	l.alloc_id = alloc_id;
	l.size = size;
	l.n_chunk_ids = n;
	l.chunk_ids = ids;
	l.n_chunk_sizes = n;
	l.chunk_sizes = sizes;
	return l;
}

Test(client_mem, lend_check_refuses_what_cannot_be_mapped)
{
	uint64_t ids[] = { 1, 2 }, sizes[] = { 2 * MiB, 2 * MiB }, wrong[] = { 2 * MiB, 4 * MiB };
	struct gmb__alloc *a = alloc_new(10, 4 * MiB);
	Gmb__Lend l;

	import(1, 2 * MiB);
	l = make_lend(10, 4 * MiB, ids, sizes, 2);
	cr_assert(eq(i32, gmb__cache_lend_check(&mem, a, &l, err), -EPROTO), "chunk 2 never sent");
	cr_assert(not(eq(ptr, strstr(err, "without sending"), NULL)), "%s", err);
	import(2, 2 * MiB);
	cr_assert(eq(i32, gmb__cache_lend_check(&mem, a, &l, err), 0), "%s", err);
	l = make_lend(11, 4 * MiB, ids, sizes, 2);
	cr_assert(eq(i32, gmb__cache_lend_check(&mem, a, &l, err), -EPROTO),
		  "another allocation's lend");
	l = make_lend(10, 4 * MiB, ids, wrong, 2);
	cr_assert(eq(i32, gmb__cache_lend_check(&mem, a, &l, err), -EPROTO),
		  "size differs from the chunk");
	l = make_lend(10, 4 * MiB, ids, sizes, 1);
	cr_assert(eq(i32, gmb__cache_lend_check(&mem, a, &l, err), -EPROTO),
		  "chunks do not cover it");
	l = make_lend(10, 4 * MiB, ids, sizes, 2);
	l.n_chunk_sizes = 1;
	cr_assert(eq(i32, gmb__cache_lend_check(&mem, a, &l, err), -EPROTO),
		  "ids and sizes differ");
	cr_assert(eq(i32, gmb__cache_lend_check(&mem, a, NULL, err), -EPROTO));
	alloc_free(a);
}

/* Adoption enters both tables and references the lend, or changes nothing at all. */
Test(client_mem, adopt_enters_the_tables_or_nothing)
{
	uint64_t ids[] = { 1, 2 }, sizes[] = { 2 * MiB, 2 * MiB };
	struct gmb__alloc a = { .id = 20, .size = 4 * MiB, .va = 0x7e0000000000ULL };
	struct gmb__alloc twin = a;
	Gmb__Lend l = make_lend(20, 4 * MiB, ids, sizes, 2);

	import(1, 2 * MiB);
	cr_assert(eq(i32, gmb__cache_adopt(&mem, &a, &l, &rel, err), -EPROTO), "chunk 2 not sent");
	cr_assert(eq(ptr, idmap_get(&mem.by_id, 20), NULL));
	cr_assert(eq(ptr, idmap_get(&mem.by_va, a.va), NULL));
	cr_assert(eq(u32, refs(1), 0));
	import(2, 2 * MiB);
	cr_assert(eq(i32, gmb__cache_adopt(&mem, &a, &l, &rel, err), 0), "%s", err);
	cr_assert(eq(ptr, idmap_get(&mem.by_id, 20), &a));
	cr_assert(eq(ptr, idmap_get(&mem.by_va, a.va), &a));
	cr_assert(eq(u32, refs(1), 1));
	cr_assert(eq(u32, refs(2), 1));
	/* gmbd lending the same allocation id again is refused; the first stays. */
	twin.va += 4 * MiB;
	cr_assert(eq(i32, gmb__cache_adopt(&mem, &twin, &l, &rel, err), -EPROTO));
	cr_assert(not(eq(ptr, strstr(err, "twice"), NULL)), "%s", err);
	cr_assert(eq(ptr, idmap_get(&mem.by_id, 20), &a));
	cr_assert(eq(ptr, idmap_get(&mem.by_va, twin.va), NULL));
	cr_assert(eq(u32, refs(1), 1));
	/* Forgetting takes it out of both and releases what no lend names. */
	gmb__cache_forget(&mem, &a, &rel);
	cr_assert(eq(ptr, idmap_get(&mem.by_id, 20), NULL));
	cr_assert(eq(ptr, idmap_get(&mem.by_va, a.va), NULL));
	cr_assert(eq(ptr, idmap_get(&mem.cache, 1), NULL));
	cr_assert(eq(ptr, idmap_get(&mem.cache, 2), NULL));
	cr_assert(eq(u32, a.nchunks, 0));
}

/*
 * The same rules end to end: a real gmbd (host backend) on a temporary
 * socket, small chunks so that allocations span several of them.
 */

#include <pthread.h>
#include <unistd.h>

#include "tests/util.h"

static struct gmbd_proc gmbd;

static void daemon_start(void)
{
	/* The warm pool: trims and handles kept over a pause are what these test. */
	static const char *const args[] = { "--host-memory", "64MiB",	    "--max-chunk",
					    "4MiB",	     "--pool-keep", "unlimited",
					    "--log-level",   "warning",	    NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void daemon_stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(client_daemon, .init = daemon_start, .fini = daemon_stop, .timeout = 60);

static bool all_zero(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

Test(client_daemon, three_modes_keep_addresses_over_cycles_of_several_chunks)
{
	const size_t size = 10 * MiB + 1; /* 12 MiB: three 4 MiB chunks mapped back to back */
	unsigned char *p, *z, *d;
	gmb_client *c;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "modes", &c), 0), "%s", gmb_last_error(NULL));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "p", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "z", GMB_MODE_ZERO), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, size, 0, "p"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&z, size, 0, "z"), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&d, size, 0, "d"), 0));
	cr_assert(eq(i64, test_status_i64(c, "used_bytes"), (int64_t)(36 * MiB)));
	test_fill(p, size, 1);
	for (unsigned round = 0; round < 20; round++) {
		unsigned char *was[3] = { p, z, d };

		memset(z, 0xee, size);
		memset(d, 0xdd, size);
		cr_assert(eq(i32, gmb_pause(c, NULL), 0), "%u: %s", round, gmb_last_error(c));
		cr_assert(eq(i64, test_status_i64(c, "used_bytes"), 0),
			  "paused memory is back in the pool");
		cr_assert(eq(i32, gmb_resume(c, NULL), 0), "%u: %s", round, gmb_last_error(c));
		cr_assert(test_holds(p, size, round + 1), "round %u: preserved bytes", round);
		cr_assert(all_zero(z, size), "round %u: zero tag reads zero", round);
		d[size - 1] = 1; /* discard: undefined but mapped and writable */
		cr_assert(was[0] == p && was[1] == z && was[2] == d);
		test_fill(p, size, round + 2);
	}
	cr_assert(eq(i32, gmb_free(c, p), 0));
	cr_assert(eq(i32, gmb_free(c, z), 0));
	cr_assert(eq(i32, gmb_free(c, d), 0));
	cr_assert(eq(i64, test_status_i64(c, "used_bytes"), 0));
	gmb_close(c);
}

Test(client_daemon, trim_of_a_paused_tag_drops_handles_and_resume_brings_new_ones)
{
	uint64_t released = 0, pending = 0;
	gmb_client *c;
	unsigned char *p;
	int fds_active;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "trimmed", &c), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "w", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, 8 * MiB, 0, "w"), 0));
	test_fill(p, 8 * MiB, 7);
	fds_active = proc_count_fds(getpid());
	cr_assert(eq(i32, gmb_pause(c, "w"), 0));
	cr_assert(eq(i32, proc_count_fds(getpid()), fds_active), "paused: handles kept for resume");
	/* gmbd asks this very client to drop while it waits for the trim: the
	 * reader answers drops on its own, so this returns. */
	cr_assert(eq(i32, gmb_trim(c, -1, &released, &pending), 0), "%s", gmb_last_error(c));
	cr_assert(eq(u64, released + pending, 8 * MiB));
	cr_assert(ge(i32, gmb_poll(c, 5000), 1), "the drop counts as a handled request");
	cr_assert(eq(i64, test_status_i64(c, "pool_bytes"), 0),
		  "the chunks went back to the driver");
	cr_assert(eq(i32, proc_count_fds(getpid()), fds_active - 2), "both chunk handles dropped");
	cr_assert(eq(i32, gmb_resume(c, "w"), 0), "%s", gmb_last_error(c));
	cr_assert(test_holds(p, 8 * MiB, 7), "preserved across new chunks");
	cr_assert(eq(i32, proc_count_fds(getpid()), fds_active), "new chunks imported, fds closed");
	cr_assert(eq(i32, gmb_free(c, p), 0));
	cr_assert(eq(i32, proc_count_fds(getpid()), fds_active - 2));
	gmb_close(c);
}

Test(client_daemon, cycles_leak_no_fds)
{
	int before = proc_count_fds(getpid());
	gmb_client *c;
	void *p;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "fds", &c), 0));
	cr_assert(eq(i32, gmb_malloc(c, &p, 16 * MiB, 0, "kv"), 0));
	for (int i = 0; i < 50; i++) {
		cr_assert(eq(i32, gmb_pause(c, "kv"), 0));
		cr_assert(eq(i32, gmb_resume(c, "kv"), 0));
	}
	cr_assert(eq(i32, proc_count_fds(getpid()), before + 1 + 4), "socket + four chunk handles");
	cr_assert(eq(i32, gmb_free(c, p), 0));
	gmb_close(c);
	cr_assert(eq(i32, proc_count_fds(getpid()), before));
}

struct seen {
	int calls, op;
	char tag[64];
	int answer;
};

static int on_control(void *arg, int op, const char *tag)
{
	struct seen *s = arg;

	s->calls++;
	s->op = op;
	snprintf(s->tag, sizeof(s->tag), "%s", tag ? tag : "(all)");
	return s->answer;
}

Test(client_daemon, a_client_may_control_itself_without_deadlock)
{
	struct seen seen = { 0 };
	gmb_client *c;
	unsigned char *p;
	void *q;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "selfctl", &c), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, 4 * MiB, 0, "kv"), 0));
	cr_assert(eq(i32, gmb_control(c, "selfctl", GMB_OP_PAUSE, "kv"), -EOPNOTSUPP));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(c), "handler"), NULL)), "%s",
		  gmb_last_error(c));
	cr_assert(eq(i32, gmb_set_control_handler(c, on_control, &seen), 0));
	cr_assert(eq(i32, gmb_control(c, "selfctl", GMB_OP_PAUSE, "kv"), 0), "%s",
		  gmb_last_error(c));
	cr_assert(eq(i32, seen.calls, 1));
	cr_assert(eq(i32, seen.op, GMB_OP_PAUSE));
	cr_assert(eq(str, seen.tag, "kv"));
	/* The worker counts the request after its answer went: gmb_control() may be back first. */
	cr_assert(ge(i32, gmb_poll(c, 1000), 1));
	cr_assert(eq(i32, gmb_poll(c, 0), 0), "poll counts each request once");
	cr_assert(eq(i32, gmb_malloc(c, &q, 2 * MiB, 0, "kv"), -EBUSY), "the tag is paused");
	cr_assert(eq(i32, gmb_control(c, "selfctl", GMB_OP_RESUME, NULL), 0));
	cr_assert(eq(str, seen.tag, "(all)"));
	memset(p, 1, 4 * MiB);
	seen.answer = -EBUSY;
	cr_assert(lt(i32, gmb_control(c, "selfctl", GMB_OP_PAUSE, NULL), 0));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(c), "refused"), NULL)), "%s",
		  gmb_last_error(c));
	cr_assert(eq(u8, p[4 * MiB - 1], 1), "a refusal pauses nothing");
	gmb_close(c);
}

struct churn {
	gmb_client *c;
	int id;
	int failures;
};

static void *churn_alloc(void *arg)
{
	struct churn *t = arg;
	char tag[16];

	snprintf(tag, sizeof(tag), "t%d", t->id);
	for (int i = 0; i < 40; i++) {
		unsigned char *p;

		if (gmb_malloc(t->c, (void **)&p, 2 * MiB + (size_t)i, 0, tag)) {
			t->failures++;
			continue;
		}
		memset(p, t->id, 2 * MiB);
		t->failures += p[2 * MiB - 1] != t->id;
		t->failures += gmb_free(t->c, p) != 0;
	}
	return NULL;
}

static void *churn_cycle(void *arg)
{
	struct churn *t = arg;
	unsigned char *p;

	if (gmb_malloc(t->c, (void **)&p, 6 * MiB, 0, "cyc")) {
		t->failures++;
		return NULL;
	}
	test_fill(p, 6 * MiB, 3);
	for (int i = 0; i < 20; i++) {
		t->failures += gmb_pause(t->c, "cyc") != 0;
		t->failures += gmb_resume(t->c, "cyc") != 0;
		t->failures += !test_holds(p, 6 * MiB, 3);
	}
	t->failures += gmb_free(t->c, p) != 0;
	return NULL;
}

Test(client_daemon, threads_allocate_free_and_cycle_at_once)
{
	struct churn t[5];
	pthread_t th[5];
	gmb_client *c;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "threads", &c), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "cyc", GMB_MODE_PRESERVE), 0));
	for (int i = 0; i < 5; i++) {
		t[i] = (struct churn){ .c = c, .id = i + 1 };
		cr_assert(eq(i32,
			     pthread_create(&th[i], NULL, i ? churn_alloc : churn_cycle, &t[i]),
			     0));
	}
	for (int i = 0; i < 5; i++) {
		pthread_join(th[i], NULL);
		cr_expect(eq(i32, t[i].failures, 0), "thread %d: %s", i, gmb_last_error(c));
	}
	cr_assert(eq(i64, test_status_i64(c, "used_bytes"), 0));
	gmb_close(c);
}

Test(client_daemon, a_lost_connection_fails_requests_but_keeps_memory_usable)
{
	unsigned char *p;
	gmb_client *c;
	void *q;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "orphan", &c), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "w", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, 4 * MiB, 0, "w"), 0));
	test_fill(p, 4 * MiB, 9);
	cr_assert(eq(i32, gmbd_stop(&gmbd), 0));
	cr_assert(eq(i32, gmb_poll(c, 10000), -ENOTCONN));
	cr_assert(eq(i32, gmb_malloc(c, &q, 2 * MiB, 0, "w"), -ENOTCONN));
	cr_assert(eq(i32, gmb_pause(c, "w"), -ENOTCONN));
	cr_assert(test_holds(p, 4 * MiB, 9), "a failed pause leaves the tag mapped, bytes intact");
	cr_assert(eq(i32, gmb_free(c, p), 0), "free still releases what this side holds");
	gmb_close(c);
}

Test(client_daemon, bad_calls_fail_with_a_reason)
{
	char name[WIRE_MAX_NAME + 2];
	gmb_client *c;
	void *p;

	cr_assert(eq(i32, gmb_connect("/nonexistent/gmbd.sock", NULL, &c), -ENOENT));
	cr_assert(eq(ptr, c, NULL));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(NULL), "/nonexistent/gmbd.sock"), NULL)));
	cr_assert(eq(i32, gmb_connect(gmbd.sock, NULL, &c), 0));
	cr_assert(gt(u64, gmb_client_id(c), 0));
	cr_assert(eq(i32, gmb_free(c, (void *)0x1234), -EINVAL));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(c), "not allocated by gmb_malloc"), NULL)));
	cr_assert(eq(i32, gmb_malloc(c, NULL, 4096, 0, NULL), -EINVAL));
	memset(name, 'x', sizeof(name) - 1);
	name[sizeof(name) - 1] = 0;
	cr_assert(eq(i32, gmb_malloc(c, &p, 4096, 0, name), -ENAMETOOLONG));
	cr_assert(eq(i32, gmb_malloc(c, &p, 4096, -1, NULL), -ENODEV));
	cr_assert(eq(i32, gmb_malloc(c, &p, 128 * MiB, 0, NULL), -ENOMEM), "over the budget");
	cr_assert(ne(sz, strlen(gmb_last_error(c)), 0));
	cr_assert(eq(i32, gmb_resume(c, "nosuch"), -ENOENT));
	cr_assert(eq(i32, gmb_control(c, "nobody-by-this-name", GMB_OP_PAUSE, NULL), -ENOENT));
	cr_assert(eq(i32, gmb_control(c, "x", 7, NULL), -EINVAL));
	cr_assert(eq(str, (char *)gmb_strerror(-ENOMEM), "Cannot allocate memory"));
	cr_assert(gmb_strerror(-123456) != NULL, "never NULL");
	cr_assert(eq(i32, gmb_poll(c, 0), 0));
	gmb_close(c);
	gmb_close(NULL);
}

Test(client_daemon, preserve_set_while_paused_resumes_zero_filled)
{
	unsigned char *p;
	gmb_client *c;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "late", &c), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, 4 * MiB, 0, "w"), 0));
	memset(p, 0x77, 4 * MiB);
	cr_assert(eq(i32, gmb_pause(c, "w"), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "w", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_resume(c, "w"), 0));
	cr_assert(all_zero(p, 4 * MiB), "nothing was saved at the pause");
	test_fill(p, 4 * MiB, 5);
	cr_assert(eq(i32, gmb_pause(c, "w"), 0));
	cr_assert(eq(i32, gmb_resume(c, "w"), 0));
	cr_assert(test_holds(p, 4 * MiB, 5), "from the next pause on, bytes are kept");
	gmb_close(c);
}
