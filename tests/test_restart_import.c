/*
 * test_restart_import.c - the import table across a restart, in process on
 * the host backend: the record (daemon/persist/state.c) brings back the
 * table's instance id, every export with its token, pins and import
 * records over the very same chunks, so that a handle of the previous gmbd
 * opens in the next and a freed allocation's chunks are never free; a
 * rejoining importer's claim (daemon/core/rejoin.c) keeps what it claims,
 * drops what it does not and is refused, changing nothing, for an import
 * gmbd has no record of; a reclaimed importer's records go with it; and a
 * damaged record (unknown clients and chunks, a chunk pinned twice or lent
 * elsewhere, facts that do not match) is refused export by export, the
 * pools' counters right after it and nothing left once every orphan is
 * reclaimed.
 *
 * The world: "trainer" (uid U) owns x (4 MiB, two chunks, imported by
 * "reader" twice and by itself once), y (2 MiB, exported, not imported) and
 * z (2 MiB, imported by "reader", then freed: kept for it); "engine" (uid U)
 * has e (2 MiB) lent. The restored broker keeps no free chunk warm, so a
 * chunk that came back free would be released at once.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/ipc_handle.h"
#include "daemon/core/broker_internal.h"
#include "daemon/core/import.h"
#include "daemon/persist/state.h"
#include "include/gmb.h"
#include "tests/util.h"

#define MiB	(1ULL << 20)
#define MAX_FDS 64

static struct {
	struct backend *be;
	struct broker *br, *br2;
	struct bclient *trainer, *reader, *engine;
	struct balloc *x, *y, *z, *e;
	uint64_t xid, zid; /* export ids */
	uint64_t zchunk;   /* z's chunk, pinned once z is freed */
	uint8_t hx[IPC_HANDLE_SIZE];
	struct state_fd fds[MAX_FDS];
	size_t nfds;
} fx;

static struct broker *new_broker(uint64_t keep)
{
	struct broker_opts bo = { .max_chunk = 2 * MiB, .pool_keep = keep, .daemon_uid = 0 };
	struct broker *br;

	cr_assert(eq(i32, broker_new(fx.be, &bo, &br), 0));
	return br;
}

static struct bclient *add_client(const char *name, pid_t pid)
{
	struct broker_peer peer = { .pid = pid, .uid = getuid(), .gid = getgid(), .start_time = 42 };
	struct bclient *c;

	cr_assert(eq(i32, broker_client_add(fx.br, &peer, name, true, false, &c), 0));
	return c;
}

static struct balloc *alloc(struct bclient *c, uint64_t size, const char *tag)
{
	struct broker_result res;
	char err[ERR_MSG_MAX];
	struct balloc *a;

	cr_assert(eq(i32, lend_alloc(fx.br, c, 0, size, tag, &res, err), 0), "%s", err);
	a = res.allocs[0];
	broker_result_deinit(&res);
	return a;
}

/* @c opens @a's handle (exported into @h when given); the export's id. */
static uint64_t import(struct bclient *c, const struct balloc *a, uint8_t *h)
{
	struct import_export *ex;
	uint8_t mine[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	uint64_t range;

	h = h ? h : mine;
	cr_assert(eq(i32, import_export(fx.br, a->tag->client, a->id, 0, h, err), 0), "%s", err);
	cr_assert(eq(i32, import_open(fx.br, c, h, IPC_HANDLE_SIZE, &ex, &range, err), 0), "%s",
		  err);
	return ex->id;
}

static void setup(void)
{
	struct backend_host_opts ho = { .ndevices = 1, .memory = 64 * MiB, .granularity = 2 * MiB };
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX];

	memset(&fx, 0, sizeof(fx));
	cr_assert(eq(i32, test_log_stderr("stderr"), 0));
	cr_assert(eq(i32, backend_host_open(&ho, &fx.be), 0));
	fx.br = new_broker(UINT64_MAX);
	fx.trainer = add_client("trainer", 100);
	fx.reader = add_client("reader", 101);
	fx.engine = add_client("engine", 102);
	fx.x = alloc(fx.trainer, 4 * MiB, "w");
	fx.y = alloc(fx.trainer, 2 * MiB, "w");
	fx.z = alloc(fx.trainer, 2 * MiB, "w");
	fx.e = alloc(fx.engine, 2 * MiB, "act");
	fx.xid = import(fx.reader, fx.x, fx.hx);
	import(fx.reader, fx.x, NULL);
	import(fx.trainer, fx.x, NULL);
	cr_assert(eq(i32, import_export(fx.br, fx.trainer, fx.y->id, 0, h, err), 0), "%s", err);
	fx.zid = import(fx.reader, fx.z, NULL);
	fx.zchunk = fx.z->chunks[0]->id;
	cr_assert(eq(i32, lend_free(fx.br, fx.trainer, fx.z->id, err), 0), "%s", err);
	fx.z = NULL;
}

static void teardown(void)
{
	for (size_t i = 0; i < fx.nfds; i++)
		close(fx.fds[i].fd);
	broker_free(fx.br2);
	broker_free(fx.br);
	cr_expect(eq(i32, proc_count_memfds(), 0), "chunks leaked past broker_free");
	backend_close(fx.be);
	cr_expect(eq(i32, test_leak_check(), 0), "heap leaked: see the report");
}

TestSuite(restart_import, .init = setup, .fini = teardown, .timeout = 30);

/* ---- the record ---- */

/* fx.br's record, to change (the caller frees it). */
static Gmb__State *state_now(void)
{
	Gmb__State *rec;
	uint8_t *buf;
	size_t len;

	cr_assert(eq(i32, state_encode(fx.br, &buf, &len), 0));
	rec = gmb__state__unpack(NULL, len, buf);
	cr_assert(not(eq(ptr, rec, NULL)));
	free(buf);
	return rec;
}

/* Every chunk's fd of fx.br, as the fd store would hand them back. */
static void export_all(void)
{
	struct chunk *ch;
	uint64_t id;
	size_t it = 0;

	while (idmap_next(&fx.br->chunks, &it, &id, (void **)&ch)) {
		struct state_fd *f = &fx.fds[fx.nfds++];

		*f = (struct state_fd){ .id = id, .dev = ch->dev, .size = ch->size };
		cr_assert(eq(i32, fx.be->ops->chunk_export(fx.be, ch->handle, &f->fd), 0));
	}
}

/*
 * The restored broker's own bookkeeping, recomputed: each pool's lent
 * bytes are its active allocations' plus the chunks gone allocations'
 * exports pin (lent to nobody); a chunk is pinned once per export that
 * lists it and by no other; an export has records exactly while it pins
 * its chunks, and a gone one only while it has records.
 */
static void check_pools(const struct broker *br)
{
	const struct import_table *t = br->imports;
	uint64_t lent = 0, pins = 0, pinned = 0, recs = 0;
	struct chunk *ch;
	void *v;

	for (const struct bclient *c = br->clients; c; c = c->next)
		for (size_t it = 0; idmap_next(&c->allocs, &it, NULL, &v);)
			if (((struct balloc *)v)->active)
				lent += ((struct balloc *)v)->size;
	for (const struct import_export *ex = t ? t->exports : NULL; ex; ex = ex->next) {
		cr_assert(eq(i32, ex->nimports != 0, ex->chunks != NULL), "export %llu",
			  (unsigned long long)ex->id);
		cr_assert(ex->alloc || ex->nimports, "a gone export without records");
		for (uint32_t i = 0; i < ex->nchunks; i++) {
			cr_assert(eq(u32, ex->chunks[i]->pins, 1), "chunk %llu pinned twice",
				  (unsigned long long)ex->chunks[i]->id);
			cr_assert(not(ex->chunks[i]->free), "a pinned chunk is free");
			if (!ex->alloc)
				lent += ex->chunks[i]->size;
		}
		pinned += ex->nchunks;
		recs += ex->nimports;
	}
	for (size_t it = 0; idmap_next(&br->chunks, &it, NULL, (void **)&ch);)
		pins += ch->pins;
	cr_assert(eq(u64, pins, pinned));
	cr_assert(eq(u64, br->pools[0].lent_bytes, lent));
	cr_assert(
		eq(u64, br->pools[0].held_bytes,
		   br->pools[0].lent_bytes + br->pools[0].free_bytes + br->pools[0].pending_bytes));
	if (t)
		cr_assert(eq(u64, t->nrecs, recs));
}

/* @rec restored into a fresh fx.br2 over fx.br's chunks; its counters checked. */
static void restore_rec(const Gmb__State *rec, struct state_stats *st)
{
	size_t len = gmb__state__get_packed_size(rec);
	uint8_t *buf = malloc(len ? len : 1);

	cr_assert(not(eq(ptr, buf, NULL)));
	gmb__state__pack(rec, buf);
	export_all();
	fx.br2 = new_broker(0);
	cr_assert(eq(i32, state_restore(fx.br2, buf, len, fx.fds, fx.nfds, st), 0));
	free(buf);
	check_pools(fx.br2);
}

static void restore(struct state_stats *st)
{
	Gmb__State *rec = state_now();

	restore_rec(rec, st);
	gmb__state__free_unpacked(rec, NULL);
}

static struct bclient *client2(const struct bclient *c)
{
	struct bclient *r = broker_client_get(fx.br2, c->id);

	cr_assert(not(eq(ptr, r, NULL)));
	return r;
}

/* Whether fx.br2 has export @id. */
static bool exported(uint64_t id)
{
	return import_find(fx.br2, id) != NULL;
}

/* Every orphan reclaimed: nothing is lent, pinned or recorded any more. */
static void reclaim_all(void)
{
	while (fx.br2->clients)
		rejoin_reclaim(fx.br2, fx.br2->clients, "not back");
	check_pools(fx.br2);
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 0));
	cr_assert(eq(u64, fx.br2->pools[0].held_bytes, 0), "keep 0: every chunk released");
	cr_assert(fx.br2->imports == NULL || fx.br2->imports->nexports == 0);
}

Test(restart_import, a_record_brings_back_every_export_pin_and_import)
{
	const struct import_table *t1 = fx.br->imports, *t2;
	const struct import_export *x2, *y2, *z2;
	struct import_export *ex;
	struct state_stats st;
	struct chunk *zc;
	char err[ERR_MSG_MAX] = "";
	uint64_t range;

	restore(&st);
	t2 = fx.br2->imports;
	cr_assert(not(eq(ptr, (void *)t2, NULL)), "no import table restored");
	cr_assert(eq(u64, t2->instance, t1->instance), "handles of before would be stale");
	cr_assert(eq(u64, t2->next_id, t1->next_id));
	cr_assert(eq(u64, t2->nexports, 3));
	cr_assert(eq(u64, t2->nrecs, 3));
	cr_assert(eq(u32, st.exports, 3));
	cr_assert(eq(u32, st.imports, 3));
	x2 = import_find(fx.br2, fx.xid);
	z2 = import_find(fx.br2, fx.zid);
	y2 = import_find(fx.br2, fx.xid + 1);
	cr_assert(x2 && y2 && z2);
	cr_assert(
		eq(i32, memcmp(x2->token, import_find(fx.br, fx.xid)->token, IPC_HANDLE_TOKEN), 0));
	cr_assert(eq(ptr, x2->alloc, broker_alloc_get(client2(fx.trainer), fx.x->id)));
	cr_assert(eq(u32, x2->nchunks, 2));
	cr_assert(eq(ptr, x2->chunks[1], x2->alloc->chunks[1]));
	cr_assert(eq(u32, import_record_of(fx.br2, fx.xid, client2(fx.reader))->refs, 2));
	cr_assert(eq(u32, import_record_of(fx.br2, fx.xid, client2(fx.trainer))->refs, 1));
	cr_assert(eq(ptr, y2->alloc, broker_alloc_get(client2(fx.trainer), fx.y->id)));
	cr_assert(eq(u32, y2->nimports, 0));
	cr_assert(eq(ptr, y2->chunks, NULL), "an export nobody imports pins nothing");
	/* z's chunk: kept for its importer, out of the pool, never released. */
	cr_assert(eq(ptr, z2->alloc, NULL));
	zc = broker_chunk_get(fx.br2, fx.zchunk);
	cr_assert(not(eq(ptr, zc, NULL)), "the freed allocation's chunk was released");
	cr_assert(eq(u32, zc->pins, 1));
	cr_assert(eq(ptr, zc->lent_to, NULL));
	cr_assert(not(zc->free));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, fx.br->pools[0].lent_bytes));
	/* A handle of the previous gmbd opens in this one. */
	cr_assert(eq(i32,
		     import_open(fx.br2, client2(fx.engine), fx.hx, IPC_HANDLE_SIZE, &ex, &range,
				 err),
		     0),
		  "%s", err);
	cr_assert(eq(u64, ex->id, fx.xid));
	/* And the owner's tag does not pause while it is imported. */
	cr_assert(eq(i32, lend_pause(fx.br2, client2(fx.trainer), "w", false, err), -EBUSY));
	cr_assert(not(eq(ptr, strstr(err, "client 'reader' (pid 101)"), NULL)), "%s", err);
	/* The last close of z gives its chunk back (released: keep 0). */
	cr_assert(eq(i32, import_close(fx.br2, client2(fx.reader), fx.zid, err), 0), "%s", err);
	cr_assert(eq(ptr, broker_chunk_get(fx.br2, fx.zchunk), NULL));
	check_pools(fx.br2);
	reclaim_all();
}

/* ---- claims ---- */

/* rejoin_accept() of @cl for @c; its result let go of. */
static int accept_claim(struct bclient *c, const struct broker_claim *cl, char *err)
{
	struct broker_rejoin_result res;
	int rc;

	err[0] = '\0';
	rc = rejoin_accept(fx.br2, c, cl, &res, err);
	if (rc == 0)
		rejoin_result_deinit(&res);
	return rc;
}

static int claim(struct bclient *c, const struct broker_claim_import *imp, size_t n, char *err)
{
	struct broker_claim cl = { .imports = imp, .nimports = n };

	return accept_claim(c, &cl, err);
}

Test(restart_import, a_claim_keeps_what_it_names_and_drops_what_it_does_not)
{
	struct state_stats st;
	struct bclient *r;
	char err[ERR_MSG_MAX];
	uint64_t lent;

	restore(&st);
	r = client2(fx.reader);
	lent = fx.br2->pools[0].lent_bytes;
	{
		const struct broker_claim_import bad[][1] = {
			{ { fx.xid + 7, fx.x->id, 1, false, false } }, /* no such export */
			{ { fx.xid + 1, fx.y->id, 1, false,
			    false } },				   /* an export it never opened */
			{ { fx.xid, fx.y->id, 1, false, false } }, /* another allocation */
			{ { fx.xid, fx.x->id, 3, false, false } }, /* more opens than recorded */
			{ { fx.xid, fx.x->id, 0, false, false } }, /* no open */
		};
		const int want[] = { -EPERM, -EPERM, -EPERM, -EPERM, -EPROTO };

		for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
			cr_assert(eq(i32, claim(r, bad[i], 1, err), want[i]), "claim %zu: %s", i,
				  err);
			cr_assert(gt(sz, strlen(err), 0));
		}
	}
	{
		const struct broker_claim_import twice[] = {
			{ fx.xid, fx.x->id, 1, false, false }, { fx.xid, fx.x->id, 1, false, false }
		};

		cr_assert(eq(i32, claim(r, twice, 2, err), -EPROTO), "%s", err);
	}
	/* Refused: nothing changed. */
	cr_assert(r->orphan);
	cr_assert(eq(u64, fx.br2->imports->nrecs, 3));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, lent));
	check_pools(fx.br2);
	/* The truth: x with one open (it closed one meanwhile), z closed. */
	{
		const struct broker_claim_import ok[] = { { fx.xid, fx.x->id, 1, false, false } };

		cr_assert(eq(i32, claim(r, ok, 1, err), 0), "%s", err);
	}
	cr_assert(not(r->orphan));
	cr_assert(eq(u32, import_record_of(fx.br2, fx.xid, r)->refs, 1));
	cr_assert(not(exported(fx.zid)), "an unclaimed import stayed");
	cr_assert(eq(ptr, broker_chunk_get(fx.br2, fx.zchunk), NULL), "z's chunk stayed pinned");
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, lent - 2 * MiB));
	check_pools(fx.br2);
	reclaim_all();
}

/* The owner's truthful claim of x and y in tag "w", x @x_mapped over @xids. */
static int owner_claim(bool x_mapped, const uint64_t *xids, char *err)
{
	struct bclient *t = client2(fx.trainer);
	const struct balloc *x = broker_alloc_get(t, fx.x->id), *y = broker_alloc_get(t, fx.y->id);
	uint64_t yids[] = { y->chunks[0]->id };
	struct broker_claim_tag tag = { "w", GMB_MODE_DISCARD, false };
	struct broker_claim_alloc allocs[] = {
		{ x->id, "w", 0, x->size, x_mapped, xids, 2 },
		{ y->id, "w", 0, y->size, true, yids, 1 },
	};
	uint64_t held[] = { xids[0], xids[1], yids[0] };
	struct broker_claim cl = {
		.tags = &tag, .ntags = 1, .allocs = allocs, .nallocs = 2, .held = held, .nheld = 3
	};

	return accept_claim(t, &cl, err);
}

/* An owner whose pause of an imported tag the restart cut short (it
 * unmapped first) keeps its lend: the pause is refused, and it maps again. */
Test(restart_import, an_imported_allocation_claimed_unmapped_stays_lent)
{
	struct state_stats st;
	struct balloc *x;
	char err[ERR_MSG_MAX];
	uint64_t xids[2], swapped[2], lent;

	restore(&st);
	x = broker_alloc_get(client2(fx.trainer), fx.x->id);
	xids[0] = swapped[1] = x->chunks[0]->id;
	xids[1] = swapped[0] = x->chunks[1]->id;
	lent = fx.br2->pools[0].lent_bytes;
	cr_assert(eq(i32, owner_claim(false, swapped, err), -EPERM), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "another process maps"), NULL)), "%s", err);
	cr_assert(eq(i32, owner_claim(false, xids, err), 0), "%s", err);
	cr_assert(x->active, "an imported allocation went back to the pool");
	cr_assert(eq(ptr, x->chunks[0]->lent_to, x));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, lent));
	cr_assert(eq(i32, lend_pause(fx.br2, client2(fx.trainer), "w", false, err), -EBUSY));
	check_pools(fx.br2);
	reclaim_all();
}

Test(restart_import, a_reclaimed_orphan_importer_drops_its_imports)
{
	uint64_t xchunk = fx.x->chunks[0]->id;
	struct state_stats st;

	restore(&st);
	rejoin_reclaim(fx.br2, client2(fx.reader), "its process is gone");
	check_pools(fx.br2);
	cr_assert(not(exported(fx.zid)));
	cr_assert(eq(ptr, broker_chunk_get(fx.br2, fx.zchunk), NULL), "z's chunk stayed pinned");
	cr_assert(eq(u64, fx.br2->imports->nrecs, 1), "the owner's own import stays");
	cr_assert(eq(u32, broker_chunk_get(fx.br2, xchunk)->pins, 1));
	rejoin_reclaim(fx.br2, client2(fx.trainer), "its process is gone");
	cr_assert(eq(ptr, broker_chunk_get(fx.br2, xchunk), NULL), "x's chunk stayed pinned");
	reclaim_all();
}

/* ---- damaged records ---- */

static Gmb__StateExport *rec_export(Gmb__State *rec, uint64_t id)
{
	for (size_t i = 0; i < rec->n_exports; i++)
		if (rec->exports[i]->id == id)
			return rec->exports[i];
	cr_assert(false, "export %llu is not in the record", (unsigned long long)id);
	return NULL;
}

/* The chunk ids of @c's allocation @id in @rec. */
static Gmb__StateAlloc *rec_alloc(Gmb__State *rec, uint64_t cid, uint64_t id)
{
	for (size_t i = 0; i < rec->n_clients; i++)
		for (size_t j = 0; rec->clients[i]->id == cid && j < rec->clients[i]->n_tags; j++)
			for (size_t k = 0; k < rec->clients[i]->tags[j]->n_allocs; k++)
				if (rec->clients[i]->tags[j]->allocs[k]->id == id)
					return rec->clients[i]->tags[j]->allocs[k];
	cr_assert(false, "allocation %llu is not in the record", (unsigned long long)id);
	return NULL;
}

Test(restart_import, records_of_clients_the_record_lacks_are_left_out)
{
	Gmb__State *rec = state_now();
	struct state_stats st;

	rec_export(rec, fx.zid)->imports[0]->importer_id = 999;
	rec_export(rec, fx.xid)->imports[0]->importer_id = 998;
	restore_rec(rec, &st);
	/* z had one record: gone and imported by nobody, it does not come back. */
	cr_assert(not(exported(fx.zid)));
	cr_assert(eq(ptr, broker_chunk_get(fx.br2, fx.zchunk), NULL), "pinned for nobody");
	cr_assert(eq(u32, import_find(fx.br2, fx.xid)->nimports, 1));
	cr_assert(eq(u32, st.imports, 1));
	gmb__state__free_unpacked(rec, NULL);
	reclaim_all();
}

Test(restart_import, an_export_over_a_chunk_it_cannot_pin_is_refused)
{
	Gmb__State *rec;
	Gmb__StateExport *ze;
	struct state_stats st;
	uint64_t echunk = fx.e->chunks[0]->id, xchunk = fx.x->chunks[0]->id;
	/* z's chunk unknown, lent to engine's e, lent to the export's own
	 * owner's x (pinned by x's export too), named twice. */
	const uint64_t bad[][2] = { { 777, 0 }, { echunk, 0 }, { xchunk, 0 }, { 0, 0 } };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct balloc *e2;

		rec = state_now();
		ze = rec_export(rec, fx.zid);
		if (bad[i][0]) {
			ze->chunk_ids[0] = bad[i][0];
		} else {
			/* Twice the same chunk, and a size that adds up. */
			uint64_t *two = malloc(2 * sizeof(*two));

			two[0] = two[1] = fx.zchunk;
			free(ze->chunk_ids);
			ze->chunk_ids = two;
			ze->n_chunk_ids = 2;
			ze->size = 4 * MiB;
		}
		restore_rec(rec, &st);
		cr_assert(not(exported(fx.zid)), "case %zu", i);
		cr_assert(eq(u32, st.exports, 2), "case %zu", i);
		e2 = broker_alloc_get(client2(fx.engine), fx.e->id);
		cr_assert(e2->active, "case %zu: e lost its chunk", i);
		cr_assert(eq(u32, e2->chunks[0]->pins, 0), "case %zu", i);
		cr_assert(eq(u32, broker_chunk_get(fx.br2, xchunk)->pins, 1), "case %zu", i);
		gmb__state__free_unpacked(rec, NULL);
		reclaim_all();
		broker_free(fx.br2);
		fx.br2 = NULL;
		for (size_t j = 0; j < fx.nfds; j++)
			close(fx.fds[j].fd);
		fx.nfds = 0;
	}
}

Test(restart_import, two_exports_of_one_chunk_pin_it_once)
{
	Gmb__State *rec = state_now();
	Gmb__StateExport **v = malloc((rec->n_exports + 1) * sizeof(*v)), *copy;
	Gmb__StateExport *ze = rec_export(rec, fx.zid);
	struct state_stats st;

	/* A second export of another freed allocation over z's chunk, and one
	 * with z's id again: each refused, z's own restored once. */
	copy = malloc(2 * sizeof(*copy));
	copy[0] = *ze;
	copy[0].id = 50;
	copy[0].alloc_id = 9999;
	copy[1] = *ze;
	memcpy(v, rec->exports, rec->n_exports * sizeof(*v));
	v[rec->n_exports] = &copy[0];
	{
		Gmb__StateExport **w = malloc((rec->n_exports + 2) * sizeof(*w));

		memcpy(w, v, (rec->n_exports + 1) * sizeof(*w));
		w[rec->n_exports + 1] = &copy[1];
		free(v);
		v = w;
	}
	{
		Gmb__StateExport **own = rec->exports;
		size_t n = rec->n_exports;
		uint8_t *buf;
		size_t len;

		rec->exports = v;
		rec->n_exports = n + 2;
		len = gmb__state__get_packed_size(rec);
		buf = malloc(len);
		gmb__state__pack(rec, buf);
		rec->exports = own;
		rec->n_exports = n;
		gmb__state__free_unpacked(rec, NULL);
		rec = gmb__state__unpack(NULL, len, buf);
		free(buf);
	}
	free(v);
	free(copy);
	restore_rec(rec, &st);
	cr_assert(eq(u32, st.exports, 3), "only the record's own three");
	cr_assert(eq(u32, broker_chunk_get(fx.br2, fx.zchunk)->pins, 1));
	cr_assert(not(exported(50)));
	gmb__state__free_unpacked(rec, NULL);
	reclaim_all();
}

Test(restart_import, an_export_whose_facts_do_not_match_is_refused)
{
	struct state_stats st;
	Gmb__State *rec;
	/* x's export: another size than x, a short token, no instance id at all. */
	for (int i = 0; i < 4; i++) {
		rec = state_now();
		if (i == 0)
			rec_export(rec, fx.xid)->size = 2 * MiB;
		if (i == 1)
			rec_export(rec, fx.xid)->token.len = 4;
		if (i == 2)
			rec->import_instance = 0;
		if (i == 3)
			rec_alloc(rec, fx.trainer->id, fx.x->id)->active =
				false; /* imported, paused */
		restore_rec(rec, &st);
		cr_assert(not(exported(fx.xid)), "case %d", i);
		cr_assert(eq(u32, st.exports, i == 2 ? 0 : 2), "case %d", i);
		gmb__state__free_unpacked(rec, NULL);
		reclaim_all();
		broker_free(fx.br2);
		fx.br2 = NULL;
		for (size_t j = 0; j < fx.nfds; j++)
			close(fx.fds[j].fd);
		fx.nfds = 0;
	}
}

Test(restart_import, a_record_without_imports_restores_as_before)
{
	Gmb__State *rec = state_now();
	struct state_stats st;
	uint8_t h[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";

	/* What a gmbd before the import table wrote: none of fields 50-52. */
	rec->import_instance = 0;
	rec->import_next_export_id = 0;
	rec->n_exports = 0;
	restore_rec(rec, &st);
	rec->n_exports = 3; /* its own, freed with it */
	cr_assert(eq(ptr, fx.br2->imports, NULL));
	cr_assert(eq(u32, st.clients, 3));
	/* A table is made at the first export, with an instance of its own. */
	cr_assert(eq(i32, import_export(fx.br2, client2(fx.trainer), fx.x->id, 0, h, err), 0), "%s",
		  err);
	cr_assert(not(eq(u64, fx.br2->imports->instance, fx.br->imports->instance)));
	gmb__state__free_unpacked(rec, NULL);
	reclaim_all();
}
