/*
 * test_import.c - gmbd's record of memory shared between processes
 * (daemon/core/import.c) over the real broker and host backend: handles
 * are deterministic and name the chunk of the exported pointer; opens are
 * counted per importer and pin the chunks once; forged, bit-flipped,
 * truncated and stale handles and other uids are refused and map nothing;
 * an owner that frees or goes keeps its chunks out of the pool until the
 * last importer closes; an importer that goes has its imports dropped; a
 * pause of an imported tag is refused naming the importer; a grant lets
 * one more uid open until revoked; an import that follows its owner's pause
 * pins nothing while unmapped and pins the new chunks when mapped again.
 * After each case every counter is checked back at zero.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/ipc_handle.h"
#include "daemon/core/broker_internal.h"
#include "daemon/core/import.h"
#include "tests/util.h"

#define MiB (1024ULL * 1024)
#define GiB (1024 * MiB)

static struct backend *be;
static struct broker *br;

static void open_broker(uint64_t keep, uint64_t max_chunk)
{
	struct broker_opts o = { .max_chunk = max_chunk, .pool_keep = keep, .daemon_uid = 999 };

	if (br)
		broker_free(br);
	br = NULL;
	cr_assert(eq(i32, broker_new(be, &o, &br), 0));
}

static void setup(void)
{
	struct backend_host_opts o = { .ndevices = 1, .memory = 1 * GiB, .granularity = 2 * MiB };

	/* The core logs what it keeps for importers: into the test's file. */
	cr_assert(eq(i32, test_log_stderr("stderr"), 0));
	cr_assert(eq(i32, backend_host_open(&o, &be), 0));
	open_broker(0, 1 * GiB);
}

static void teardown(void)
{
	broker_free(br);
	br = NULL;
	cr_expect(eq(i32, proc_count_memfds(), 0), "chunks leaked past broker_free");
	backend_close(be);
	cr_expect(eq(i32, test_leak_check(), 0), "heap leaked: see the report");
}

TestSuite(import, .init = setup, .fini = teardown, .timeout = 30);

static struct bclient *client(const char *name, pid_t pid, uid_t uid)
{
	struct broker_peer peer = { .pid = pid, .uid = uid, .gid = uid };
	struct bclient *c = NULL;

	cr_assert(eq(i32, broker_client_add(br, &peer, name, true, false, &c), 0));
	return c;
}

static struct balloc *alloc_ok(struct bclient *c, uint64_t size, const char *tag)
{
	struct broker_result res;
	char err[ERR_MSG_MAX] = "";
	struct balloc *a;

	cr_assert(eq(i32, lend_alloc(br, c, 0, size, tag, &res, err), 0), "alloc: %s", err);
	a = res.allocs[0];
	broker_result_deinit(&res);
	return a;
}

static void export_ok(struct bclient *c, const struct balloc *a, uint64_t off, uint8_t *h)
{
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, import_export(br, c, a->id, off, h, err), 0), "export: %s", err);
}

static struct import_export *open_ok(struct bclient *c, const uint8_t *h, uint64_t *range)
{
	struct import_export *ex = NULL;
	char err[ERR_MSG_MAX] = "";
	uint64_t r = 0;

	cr_assert(eq(i32, import_open(br, c, h, IPC_HANDLE_SIZE, &ex, &r, err), 0), "open: %s",
		  err);
	if (range)
		*range = r;
	return ex;
}

static int open_rc(struct bclient *c, const uint8_t *h, size_t len, char *err)
{
	struct import_export *ex = NULL;
	uint64_t r = 0;

	return import_open(br, c, h, len, &ex, &r, err);
}

static const struct pool *pool0(void)
{
	return &br->pools[0];
}

static uint64_t free_list_bytes(void)
{
	uint64_t n = 0;

	for (const struct chunk *c = pool0()->free_head; c; c = c->next)
		n += c->size;
	return n;
}

/* Nothing lent, nothing pinned, no import: what every case ends with. */
static void check_zero(void)
{
	const struct import_table *t = import_table(br);
	uint64_t key;
	void *val;

	cr_assert(eq(u64, pool0()->lent_bytes, 0));
	cr_assert(eq(u64, pool0()->held_bytes, pool0()->free_bytes + pool0()->pending_bytes));
	for (size_t it = 0; idmap_next(&br->chunks, &it, &key, &val);)
		cr_assert(eq(u32, ((const struct chunk *)val)->pins, 0));
	if (t)
		cr_assert(eq(u64, t->nrecs, 0));
}

Test(import, handle_is_deterministic_and_names_the_chunk)
{
	struct bclient *a;
	struct balloc *x, *y;
	uint8_t h1[IPC_HANDLE_SIZE], h2[IPC_HANDLE_SIZE], h3[IPC_HANDLE_SIZE];
	struct ipc_handle d;
	char err[ERR_MSG_MAX] = "";

	open_broker(0, 4 * MiB); /* 10 MiB: chunks of 4, 4 and 2 MiB */
	a = client("owner", 100, 1000);
	x = alloc_ok(a, 10 * MiB, "w");
	y = alloc_ok(a, 2 * MiB, "w");
	cr_assert(eq(u32, x->nchunks, 3));
	export_ok(a, x, 0, h1);
	export_ok(a, x, 0, h2);
	cr_assert(eq(i32, memcmp(h1, h2, IPC_HANDLE_SIZE), 0), "the same bytes every time");
	cr_assert(ipc_handle_is_gmb(h1));
	cr_assert(eq(i32, ipc_handle_decode(h1, &d), 0));
	cr_assert(eq(u64, d.owner, a->id));
	cr_assert(eq(u64, d.alloc, x->id));
	cr_assert(eq(u64, d.range_off, 0));
	/* An interior pointer names the chunk that holds it. */
	export_ok(a, x, 5 * MiB, h3);
	cr_assert(eq(i32, ipc_handle_decode(h3, &d), 0));
	cr_assert(eq(u64, d.range_off, x->chunks[0]->size));
	cr_assert(eq(i32, memcmp(h1 + 52, h3 + 52, IPC_HANDLE_TOKEN), 0), "one token an export");
	export_ok(a, y, 0, h2);
	cr_assert(not(eq(i32, memcmp(h1, h2, IPC_HANDLE_SIZE), 0)));
	cr_assert(eq(i32, import_export(br, a, x->id, 10 * MiB, h2, err), -EINVAL));
	cr_assert(eq(i32, import_export(br, a, 999, 0, h2, err), -ENOENT));
	cr_assert(eq(i32, lend_pause(br, a, "w", false, err), 0));
	cr_assert(eq(i32, import_export(br, a, x->id, 0, h2, err), -EBUSY));
	cr_assert(not(eq(ptr, strstr(err, "paused"), NULL)), "%s", err);
	broker_client_remove(br, a);
	check_zero();
	cr_assert(eq(u64, import_table(br)->nexports, 0), "exports go with their allocations");
}

Test(import, opens_are_counted_and_pin_once)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("reader", 101, 1000);
	struct balloc *x = alloc_ok(a, 8 * MiB, "w");
	struct import_export *ex;
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	uint64_t range = 1;

	export_ok(a, x, 0, h);
	ex = open_ok(b, h, &range);
	cr_assert(eq(u64, range, 0));
	cr_assert(eq(u32, ex->nchunks, x->nchunks));
	cr_assert(eq(ptr, ex->chunks[0], x->chunks[0]));
	cr_assert(eq(u32, x->chunks[0]->pins, 1));
	cr_assert(eq(ptr, open_ok(b, h, NULL), ex));
	cr_assert(eq(u32, x->chunks[0]->pins, 1), "pinned once however many opens");
	cr_assert(eq(u64, import_client_opens(br, b), 2));
	/* The owner may open its own handle: one more record. */
	open_ok(a, h, NULL);
	cr_assert(eq(u32, ex->nimports, 2));
	cr_assert(eq(i32, import_close(br, a, ex->id, err), 0));
	cr_assert(eq(i32, import_close(br, b, ex->id, err), 0));
	cr_assert(eq(u32, x->chunks[0]->pins, 1), "one open left");
	cr_assert(eq(i32, import_close(br, b, ex->id, err), 0));
	cr_assert(eq(u32, x->chunks[0]->pins, 0));
	cr_assert(eq(i32, import_close(br, b, ex->id, err), -ENOENT));
	cr_assert(eq(i32, import_close(br, b, 12345, err), -ENOENT));
	cr_assert(eq(u64, pool0()->lent_bytes, 8 * MiB), "still the owner's");
	cr_assert(eq(i32, lend_free(br, a, x->id, err), 0));
	check_zero();
}

Test(import, forged_flipped_truncated_and_stale_handles_map_nothing)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("reader", 101, 1000);
	struct balloc *x = alloc_ok(a, 2 * MiB, "w");
	uint8_t h[IPC_HANDLE_SIZE], f[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX];
	int rc;

	export_ok(a, x, 0, h);
	srand(20);
	for (int i = 0; i < 2000; i++) {
		for (int j = 0; j < IPC_HANDLE_SIZE; j++)
			f[j] = (uint8_t)rand();
		/* Half of them with gmbd's magic, so that they reach the lookup. */
		if (i % 2)
			memcpy(f, h, 8);
		err[0] = 0;
		rc = open_rc(b, f, IPC_HANDLE_SIZE, err);
		cr_assert(rc == -EINVAL || rc == -ENOENT, "random handle %d: %d", i, rc);
		cr_assert(gt(sz, strlen(err), 0), "a sentence for every refusal");
	}
	/* Every single bit flipped: a one-chunk allocation has no other valid form. */
	for (int bit = 0; bit < IPC_HANDLE_SIZE * 8; bit++) {
		memcpy(f, h, sizeof(f));
		f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		rc = open_rc(b, f, IPC_HANDLE_SIZE, err);
		cr_assert(rc == -EINVAL || rc == -ENOENT, "bit %d flipped: %d (%s)", bit, rc, err);
	}
	cr_assert(eq(i32, open_rc(b, h, IPC_HANDLE_SIZE - 1, err), -EINVAL), "truncated");
	cr_assert(eq(i32, open_rc(b, h, 0, err), -EINVAL));
	cr_assert(eq(u64, import_table(br)->nrecs, 0));
	cr_assert(eq(u32, x->chunks[0]->pins, 0));
	/* A handle of a freed allocation is stale, even once its id would be reused. */
	cr_assert(eq(i32, lend_free(br, a, x->id, err), 0));
	cr_assert(eq(i32, open_rc(b, h, IPC_HANDLE_SIZE, err), -ENOENT));
	x = alloc_ok(a, 2 * MiB, "w");
	export_ok(a, x, 0, f);
	cr_assert(eq(i32, open_rc(b, h, IPC_HANDLE_SIZE, err), -ENOENT));
	/* A handle of an earlier gmbd (another instance id) is stale too. */
	open_broker(0, 1 * GiB);
	a = client("owner", 100, 1000);
	b = client("reader", 101, 1000);
	x = alloc_ok(a, 2 * MiB, "w");
	export_ok(a, x, 0, h);
	cr_assert(eq(i32, open_rc(b, f, IPC_HANDLE_SIZE, err), -ENOENT), "%s", err);
	open_ok(b, h, NULL);
	broker_client_remove(br, b);
	broker_client_remove(br, a);
	check_zero();
}

Test(import, another_uid_gets_eperm_naming_the_owner)
{
	struct bclient *a = client("trainer", 4242, 1000), *b = client("stranger", 101, 2000);
	struct balloc *x = alloc_ok(a, 2 * MiB, "w");
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";

	export_ok(a, x, 0, h);
	cr_assert(eq(i32, open_rc(b, h, IPC_HANDLE_SIZE, err), -EPERM));
	cr_assert(not(eq(ptr, strstr(err, "'trainer' (pid 4242, uid 1000)"), NULL)), "%s", err);
	cr_assert(eq(u32, x->chunks[0]->pins, 0));
	broker_client_remove(br, a);
	check_zero();
}

Test(import, owner_free_keeps_chunks_until_the_last_close)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("reader", 101, 1000);
	struct bclient *c = client("other", 102, 1000);
	struct balloc *x = alloc_ok(a, 8 * MiB, "w");
	struct import_export *ex;
	struct chunk *ch = x->chunks[0];
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	uint64_t id;

	export_ok(a, x, 0, h);
	ex = open_ok(b, h, NULL);
	id = ex->id;
	cr_assert(eq(i32, lend_free(br, a, x->id, err), 0));
	/* Out of the pool: lent, not free, not lent to anyone, not released. */
	cr_assert(eq(u64, pool0()->lent_bytes, 8 * MiB));
	cr_assert(eq(u64, free_list_bytes(), 0));
	cr_assert(not(ch->free));
	cr_assert(eq(ptr, idmap_get(&br->chunks, ch->id), ch));
	/* Another client of the same uid gets new chunks, never the pinned one. */
	x = alloc_ok(c, 8 * MiB, "w");
	cr_assert(not(eq(ptr, x->chunks[0], ch)));
	cr_assert(eq(i32, open_rc(b, h, IPC_HANDLE_SIZE, err), -ENOENT), "freed: stale");
	cr_assert(not(eq(ptr, strstr(err, "freed"), NULL)), "%s", err);
	cr_assert(eq(i32, import_close(br, b, id, err), 0));
	cr_assert(eq(u64, pool0()->lent_bytes, 8 * MiB), "only c's now");
	cr_assert(eq(u64, import_table(br)->nexports, 0));
	cr_assert(eq(i32, lend_free(br, c, x->id, err), 0));
	check_zero();
	cr_assert(eq(u64, pool0()->held_bytes, 0), "keep 0: every chunk back to the backend");
}

Test(import, owner_gone_importers_keep_working_memory_back_at_last_close)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("reader", 101, 1000);
	struct bclient *b2 = client("reader2", 103, 1000);
	struct balloc *x = alloc_ok(a, 4 * MiB, "w");
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	uint64_t id;

	export_ok(a, x, 0, h);
	id = open_ok(b, h, NULL)->id;
	open_ok(b2, h, NULL);
	broker_client_remove(br, a);
	cr_assert(eq(u64, pool0()->lent_bytes, 4 * MiB));
	cr_assert(eq(i32, import_close(br, b, id, err), 0));
	cr_assert(eq(u64, pool0()->lent_bytes, 4 * MiB), "reader2 still maps it");
	/* The last importer goes without closing: its connection ended. */
	broker_client_remove(br, b2);
	check_zero();
	cr_assert(eq(u64, pool0()->held_bytes, 0));
	cr_assert(eq(u64, import_table(br)->nexports, 0));
	broker_client_remove(br, b);
}

Test(import, importer_gone_drops_its_imports)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("reader", 101, 1000);
	struct balloc *x = alloc_ok(a, 4 * MiB, "w");
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";

	export_ok(a, x, 0, h);
	open_ok(b, h, NULL);
	open_ok(b, h, NULL);
	broker_client_remove(br, b);
	cr_assert(eq(u64, import_table(br)->nrecs, 0));
	cr_assert(eq(u32, x->chunks[0]->pins, 0));
	/* Nothing imported now: the owner pauses and frees as usual. */
	cr_assert(eq(i32, lend_pause(br, a, "w", false, err), 0), "%s", err);
	cr_assert(eq(i32, lend_free(br, a, x->id, err), 0));
	check_zero();
	broker_client_remove(br, a);
}

Test(import, pause_of_an_imported_tag_fails_naming_the_importer)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("engine", 777, 1000);
	struct balloc *x = alloc_ok(a, 4 * MiB, "weights");
	struct balloc *y = alloc_ok(a, 2 * MiB, "kv");
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	uint64_t id;

	export_ok(a, x, 0, h);
	id = open_ok(b, h, NULL)->id;
	cr_assert(eq(i32, lend_pause(br, a, "weights", false, err), -EBUSY));
	cr_assert(not(eq(ptr, strstr(err, "client 'engine' (pid 777)"), NULL)), "%s", err);
	cr_assert(x->active, "the tag stays active");
	cr_assert(not(x->tag->paused));
	cr_assert(eq(i32, lend_pause(br, a, NULL, false, err), -EBUSY), "every tag: refused");
	cr_assert(not(y->tag->paused));
	/* Another tag of the owner pauses. */
	cr_assert(eq(i32, lend_pause(br, a, "kv", false, err), 0), "%s", err);
	cr_assert(eq(i32, import_close(br, b, id, err), 0));
	cr_assert(eq(i32, lend_pause(br, a, "weights", false, err), 0), "%s", err);
	/* An open of a paused allocation waits for nobody: EBUSY. */
	cr_assert(eq(i32, open_rc(b, h, IPC_HANDLE_SIZE, err), -EBUSY));
	broker_client_remove(br, a);
	check_zero();
	broker_client_remove(br, b);
}

Test(import, a_grant_lets_one_more_uid_open_until_revoked)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("other", 101, 2000);
	struct balloc *x = alloc_ok(a, 2 * MiB, "w");
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	uint64_t id;

	/* A grant makes the export: the handle taken after names the same one. */
	cr_assert(eq(i32, import_export_grant(br, a, x->id, 2000, false, err), 0), "%s", err);
	cr_assert(eq(i32, import_export_grant(br, a, x->id, 2000, false, err), 0), "twice is once");
	export_ok(a, x, 0, h);
	id = open_ok(b, h, NULL)->id;
	cr_assert(eq(i32, import_export_grant(br, a, x->id, 2000, true, err), 0));
	cr_assert(eq(i32, import_export_grant(br, a, x->id, 2000, true, err), 0),
		  "revoked twice: fine");
	cr_assert(eq(i32, open_rc(b, h, IPC_HANDLE_SIZE, err), -EPERM), "no new open");
	cr_assert(not(eq(ptr, strstr(err, "did not grant uid 2000"), NULL)), "%s", err);
	cr_assert(eq(u32, x->chunks[0]->pins, 1), "the open one stays");
	cr_assert(eq(i32, import_close(br, b, id, err), 0));
	cr_assert(eq(i32, import_export_grant(br, a, x->id, 1000, false, err), -EINVAL),
		  "its own uid");
	cr_assert(eq(i32, import_export_grant(br, a, 999, 2000, false, err), -ENOENT));
	for (uid_t u = 0; u < IMPORT_MAX_GRANTS; u++)
		cr_assert(eq(i32, import_export_grant(br, a, x->id, 3000 + u, false, err), 0));
	cr_assert(eq(i32, import_export_grant(br, a, x->id, 4000, false, err), -ENOSPC));
	broker_client_remove(br, a);
	broker_client_remove(br, b);
	check_zero();
}

/* Counts the records import_followers() visits. */
static int count_rec(void *arg, const struct import_export *ex, const struct import_rec *r)
{
	(void)ex;
	(void)r;
	(*(unsigned *)arg)++;
	return 0;
}

Test(import, a_follower_unmapped_pins_nothing_and_maps_again_after_the_resume)
{
	struct bclient *a = client("owner", 100, 1000), *b = client("engine", 101, 1000),
		       *c = client("other", 102, 1000);
	struct balloc *x = alloc_ok(a, 8 * MiB, "w");
	struct broker_result res = BROKER_RESULT_INIT;
	struct import_export *ex = NULL;
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	unsigned n = 0;
	uint64_t id;

	export_ok(a, x, 0, h);
	id = open_ok(b, h, NULL)->id;
	open_ok(c, h, NULL);
	import_followers(br, a, "w", true, count_rec, &n);
	cr_assert(eq(u32, n, 2), "two mapped records of tag w");
	/* One follows: still pinned for the other, the pause still refused. */
	cr_assert(eq(i32, import_unmapped(br, b, id), 0));
	cr_assert(eq(u32, x->chunks[0]->pins, 1));
	cr_assert(eq(i32, lend_pause(br, a, "w", false, err), -EBUSY));
	cr_assert(not(eq(ptr, strstr(err, "'other'"), NULL)), "%s", err);
	cr_assert(eq(ptr, strstr(err, "'engine'"), NULL), "a follower is not named: %s", err);
	cr_assert(eq(i32, import_unmapped(br, c, id), 0));
	cr_assert(eq(u32, x->chunks[0]->pins, 0), "no mapped record: no pin");
	cr_assert(eq(i32, import_unmapped(br, c, 12345), -ENOENT));
	cr_assert(eq(i32, lend_pause(br, a, "w", false, err), 0), "%s", err);
	cr_assert(eq(u64, pool0()->lent_bytes, 0), "the chunks are back");
	cr_assert(eq(i32, import_remap(br, b, id, &ex, err), -EBUSY), "paused: not yet");
	n = 0;
	import_followers(br, a, "w", false, count_rec, &n);
	cr_assert(eq(u32, n, 2), "both wait to map again");
	cr_assert(eq(i32, lend_resume(br, a, "w", &res, err), 0), "%s", err);
	broker_result_deinit(&res);
	cr_assert(eq(i32, import_remap(br, b, id, &ex, err), 0), "%s", err);
	cr_assert(eq(ptr, ex->chunks[0], x->chunks[0]), "the new chunks are pinned");
	cr_assert(eq(u32, x->chunks[0]->pins, 1));
	cr_assert(eq(i32, import_remap(br, b, id, &ex, err), 0), "again: a no-op");
	cr_assert(eq(u32, x->chunks[0]->pins, 1));
	/* An unmapped follower that opens again maps again too. */
	open_ok(c, h, NULL);
	cr_assert(eq(u32, ex->nmapped, 2));
	cr_assert(eq(u32, x->chunks[0]->pins, 1), "pinned once");
	cr_assert(eq(i32, import_remap(br, a, id, &ex, err), -ENOENT), "not an importer");
	/* The owner frees: a remap finds nothing to map. */
	cr_assert(eq(i32, import_unmapped(br, b, id), 0));
	cr_assert(eq(i32, lend_free(br, a, x->id, err), 0));
	cr_assert(eq(i32, import_remap(br, b, id, &ex, err), -ENOENT));
	broker_client_remove(br, c);
	broker_client_remove(br, b);
	broker_client_remove(br, a);
	check_zero();
}

Test(import, chunks_another_uid_mapped_never_serve_another_allocation)
{
	struct bclient *a, *b;
	struct balloc *x, *y;
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	uint64_t id, xchunk;

	open_broker(UINT64_MAX, 2 * MiB); /* the pool keeps what comes back */
	a = client("owner", 100, 1000);
	b = client("grantee", 101, 2000);
	x = alloc_ok(a, 2 * MiB, "w");
	y = alloc_ok(a, 2 * MiB, "w");
	xchunk = x->chunks[0]->id;
	cr_assert(eq(i32, import_export_grant(br, a, x->id, 2000, false, err), 0), "%s", err);
	export_ok(a, x, 0, h);
	id = open_ok(b, h, NULL)->id;
	cr_assert(eq(i32, import_close(br, b, id, err), 0));
	cr_assert(eq(i32, lend_free(br, a, x->id, err), 0));
	cr_assert(eq(i32, lend_free(br, a, y->id, err), 0));
	/* y's chunk is back in the pool; x's went to the backend. */
	cr_assert(eq(u64, free_list_bytes(), 2 * MiB));
	cr_assert(eq(ptr, broker_chunk_get(br, xchunk), NULL), "the grantee's chunk was released");
	x = alloc_ok(a, 2 * MiB, "w");
	cr_assert(not(eq(u64, x->chunks[0]->id, xchunk)));
	cr_assert(eq(i32, lend_free(br, a, x->id, err), 0));
	broker_client_remove(br, b);
	broker_client_remove(br, a);
	check_zero();
}
