/*
 * test_restart_state.c - the pieces of restart without loss, in process on
 * the host backend: the record (daemon/persist/state.c) brings back every client,
 * tag, allocation, last lend, holder and byte count, over the very same
 * chunks (their bytes prove it); a claim (daemon/core/rejoin.c) is taken exactly
 * when the record agrees and changes nothing when refused; and the state
 * memfd (daemon/persist/persist.c) survives a write torn by a SIGKILL.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/core/broker_internal.h"
#include "daemon/persist/persist.h"
#include "daemon/persist/state.h"
#include "include/gmb.h"
#include "tests/util.h"

#define MiB	(1ULL << 20)
#define MAX_FDS 64

static struct {
	struct backend *be;
	struct broker *br, *br2;
	struct bclient *a, *b;
	struct state_fd fds[MAX_FDS];
	size_t nfds;
} fx;

static struct broker *new_broker(const struct pool_hooks *hooks)
{
	struct broker_opts bo = { .max_chunk = 4 * MiB,
				  .pool_keep = UINT64_MAX,
				  .daemon_uid = geteuid(),
				  .hooks = hooks };
	struct broker *br;

	cr_assert(eq(i32, broker_new(fx.be, &bo, &br), 0));
	return br;
}

static struct bclient *add_client(struct broker *br, const char *name, pid_t pid, bool tool)
{
	struct broker_peer peer = { .pid = pid, .uid = getuid(), .gid = getgid(), .start_time = 42 };
	struct bclient *c;

	cr_assert(eq(i32, broker_client_add(br, &peer, name, !tool, tool, &c), 0));
	return c;
}

static struct balloc *alloc(struct broker *br, struct bclient *c, uint64_t size, const char *tag)
{
	struct broker_result res;
	char err[ERR_MSG_MAX];
	struct balloc *a;

	cr_assert(eq(i32, lend_alloc(br, c, 0, size, tag, &res, err), 0), "%s", err);
	a = res.allocs[0];
	broker_result_deinit(&res);
	return a;
}

/* Writes @byte through a mapping of the chunk's own fd. */
static void chunk_fill(struct broker *br, uint64_t id, int byte, bool check)
{
	struct chunk *ch = idmap_get(&br->chunks, id);
	unsigned char *p;
	int fd;

	cr_assert(not(eq(ptr, ch, NULL)));
	cr_assert(eq(i32, br->backend->ops->chunk_export(br->backend, ch->handle, &fd), 0));
	p = mmap(NULL, ch->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(not(eq(ptr, p, MAP_FAILED)));
	if (check)
		cr_assert(eq(u8, p[0], byte), "chunk %llu lost its bytes", (unsigned long long)id);
	else
		memset(p, byte, ch->size);
	munmap(p, ch->size);
	close(fd);
}

/* The record's world: a trainer (weights active, kv paused), an engine, a tool. */
static void setup(void)
{
	struct backend_host_opts ho = { .ndevices = 1,
					.memory = 256 * MiB,
					.granularity = 2 * MiB };
	char err[ERR_MSG_MAX];

	memset(&fx, 0, sizeof(fx));
	log_max_level = LOG_LVL_ERR;
	cr_assert(eq(i32, backend_host_open(&ho, &fx.be), 0));
	fx.br = new_broker(NULL);
	fx.a = add_client(fx.br, "trainer", 100, false);
	add_client(fx.br, "gmbctl", 101, true);
	fx.b = add_client(fx.br, "engine", 102, false);
	cr_assert(eq(i32, broker_set_mode(fx.br, fx.a, "weights", GMB_MODE_PRESERVE, err), 0));
	alloc(fx.br, fx.a, 6 * MiB, "weights");
	alloc(fx.br, fx.a, 4 * MiB, "kv");
	cr_assert(eq(i32, lend_pause(fx.br, fx.a, "kv", false, err), 0));
	alloc(fx.br, fx.b, 2 * MiB, "act");
}

static void teardown(void)
{
	for (size_t i = 0; i < fx.nfds; i++)
		close(fx.fds[i].fd);
	broker_free(fx.br2);
	broker_free(fx.br);
	backend_close(fx.be);
}

TestSuite(state, .init = setup, .fini = teardown, .timeout = 30);

/* Every chunk's fd, as the fd store would hand them back. */
static void export_all(struct broker *br)
{
	struct chunk *ch;
	uint64_t id;
	size_t it = 0;

	while (idmap_next(&br->chunks, &it, &id, (void **)&ch)) {
		struct state_fd *f = &fx.fds[fx.nfds++];

		*f = (struct state_fd){ .id = id, .dev = ch->dev, .size = ch->size };
		cr_assert(eq(i32, br->backend->ops->chunk_export(br->backend, ch->handle, &f->fd),
			     0));
	}
}

static struct broker *restore(struct broker *from, struct state_stats *st)
{
	struct broker *br = new_broker(NULL);
	uint8_t *buf;
	size_t len;

	cr_assert(eq(i32, state_encode(from, &buf, &len), 0));
	export_all(from);
	cr_assert(eq(i32, state_restore(br, buf, len, fx.fds, fx.nfds, st), 0));
	free(buf);
	return br;
}

static struct bclient *client_by_id(struct broker *br, uint64_t id)
{
	for (struct bclient *c = br->clients; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

static void same_alloc(const struct balloc *x, const struct balloc *y)
{
	cr_assert(eq(u64, y->id, x->id));
	cr_assert(eq(i32, y->dev, x->dev));
	cr_assert(eq(u64, y->size, x->size));
	cr_assert(eq(i32, y->active, x->active));
	cr_assert(eq(u32, y->nchunks, x->nchunks));
	for (uint32_t i = 0; i < x->nchunks; i++) {
		cr_assert(eq(u64, y->chunks[i]->id, x->chunks[i]->id));
		cr_assert(eq(u32, y->chunks[i]->nholders, x->chunks[i]->nholders));
		cr_assert(eq(u64, y->chunks[i]->lent_to ? y->chunks[i]->lent_to->id : 0,
			     x->chunks[i]->lent_to ? x->chunks[i]->lent_to->id : 0));
	}
}

static void same_client(const struct bclient *x, const struct bclient *y)
{
	const struct btag *tx = x->tags, *ty = y->tags;

	cr_assert(eq(str, (char *)y->name, (char *)x->name));
	cr_assert(eq(i32, y->pid, x->pid));
	cr_assert(eq(u32, y->uid, x->uid));
	cr_assert(eq(u64, y->start_time, x->start_time));
	cr_assert(y->orphan, "a restored client must wait to rejoin");
	for (; tx && ty; tx = tx->next, ty = ty->next) {
		const struct balloc *ax = tx->allocs, *ay = ty->allocs;

		cr_assert(eq(str, (char *)ty->name, (char *)tx->name));
		cr_assert(eq(i32, ty->mode, tx->mode));
		cr_assert(eq(i32, ty->paused, tx->paused));
		cr_assert(eq(u64, ty->bytes, tx->bytes));
		for (; ax && ay; ax = ax->next, ay = ay->next)
			same_alloc(ax, ay);
		cr_assert(eq(ptr, (void *)ax, (void *)ay), "allocation lists differ in length");
	}
	cr_assert(eq(ptr, (void *)tx, (void *)ty), "tag lists differ in length");
}

Test(state, a_record_brings_back_everything_over_the_same_chunks)
{
	const struct pool *p0 = &fx.br->pools[0], *p1;
	struct state_stats st;
	struct chunk *ch;
	uint64_t id;
	size_t it = 0;

	while (idmap_next(&fx.br->chunks, &it, &id, (void **)&ch))
		chunk_fill(fx.br, id, (int)(id * 17), false);
	fx.br2 = restore(fx.br, &st);
	p1 = &fx.br2->pools[0];
	cr_assert(eq(u32, st.clients, 2), "the tool is not recorded");
	cr_assert(eq(u32, st.chunks, fx.br->chunks.count));
	cr_assert(eq(u32, st.lost, 0));
	cr_assert(eq(u64, p1->held_bytes, p0->held_bytes));
	cr_assert(eq(u64, p1->lent_bytes, p0->lent_bytes));
	cr_assert(eq(u64, p1->free_bytes, p0->free_bytes));
	same_client(fx.a, client_by_id(fx.br2, fx.a->id));
	same_client(fx.b, client_by_id(fx.br2, fx.b->id));
	cr_assert(eq(u64, fx.br2->next_client_id, fx.br->next_client_id));
	cr_assert(eq(u64, fx.br2->next_alloc_id, fx.br->next_alloc_id));
	cr_assert(eq(u64, fx.br2->next_chunk_id, fx.br->next_chunk_id));
	it = 0;
	while (idmap_next(&fx.br2->chunks, &it, &id, (void **)&ch)) {
		chunk_fill(fx.br2, id, (int)(id * 17), true);
		cr_assert(eq(u32, ch->uid, getuid()));
	}
}

Test(state, a_chunk_without_its_fd_is_left_out)
{
	struct state_stats st;
	uint8_t *buf;
	size_t len;

	cr_assert(eq(i32, state_encode(fx.br, &buf, &len), 0));
	export_all(fx.br);
	close(fx.fds[0].fd);
	fx.fds[0] = fx.fds[--fx.nfds];
	fx.br2 = new_broker(NULL);
	cr_assert(eq(i32, state_restore(fx.br2, buf, len, fx.fds, fx.nfds, &st), 0));
	free(buf);
	cr_assert(eq(u32, st.lost, 1));
	cr_assert(eq(u32, st.chunks, fx.br->chunks.count - 1));
}

/* ---- claims ---- */

struct claim {
	struct broker_claim_tag tags[4];
	struct broker_claim_alloc allocs[4];
	uint64_t ids[4][8];
	uint64_t held[16];
	struct broker_claim cl;
};

/* What @c of the restored broker holds, claimed truthfully. */
static void claim_of(struct bclient *c, struct claim *k)
{
	memset(k, 0, sizeof(*k));
	k->cl = (struct broker_claim){ .tags = k->tags, .allocs = k->allocs, .held = k->held };
	for (struct btag *t = c->tags; t; t = t->next) {
		k->tags[k->cl.ntags++] = (struct broker_claim_tag){ t->name, t->mode, t->paused };
		for (struct balloc *a = t->allocs; a; a = a->next) {
			size_t i = k->cl.nallocs++;

			for (uint32_t j = 0; j < a->nchunks; j++) {
				k->ids[i][j] = a->chunks[j]->id;
				k->held[k->cl.nheld++] = a->chunks[j]->id;
			}
			k->allocs[i] = (struct broker_claim_alloc){ a->id,     t->name,	  a->dev,
								    a->size,   a->active, k->ids[i],
								    a->nchunks };
		}
	}
}

static struct broker_claim_alloc *claimed(struct claim *k, const char *tag)
{
	for (size_t i = 0; i < k->cl.nallocs; i++)
		if (strcmp(k->allocs[i].tag, tag) == 0)
			return &k->allocs[i];
	return NULL;
}

Test(state, a_true_claim_is_taken_and_a_false_one_changes_nothing)
{
	struct broker_rejoin_result res;
	struct claim ka, kb;
	struct bclient *a, *b;
	struct state_stats st;
	char err[ERR_MSG_MAX] = "";
	uint64_t lent;

	fx.br2 = restore(fx.br, &st);
	a = client_by_id(fx.br2, fx.a->id);
	b = client_by_id(fx.br2, fx.b->id);
	claim_of(a, &ka);
	claim_of(b, &kb);
	lent = fx.br2->pools[0].lent_bytes;

	/* The trainer says its weights lie on the engine's chunk. */
	claimed(&ka, "weights")->chunk_ids = kb.allocs[0].chunk_ids;
	claimed(&ka, "weights")->nchunks = 1;
	cr_assert(eq(i32, rejoin_accept(fx.br2, a, &ka.cl, &res, err), -EPERM));
	cr_assert(not(eq(ptr, strstr(err, "did not lend it"), NULL)), "%s", err);
	cr_assert(a->orphan);
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, lent), "a refused claim changed the pool");
	/* An allocation of someone else. */
	claim_of(a, &ka);
	ka.allocs[0].id = kb.allocs[0].id;
	cr_assert(eq(i32, rejoin_accept(fx.br2, a, &ka.cl, &res, err), -EPERM));
	/* The truth. */
	claim_of(a, &ka);
	cr_assert(eq(i32, rejoin_accept(fx.br2, a, &ka.cl, &res, err), 0), "%s", err);
	cr_assert(not(a->orphan));
	cr_assert(eq(sz, res.ncleared, 0));
	cr_assert(eq(sz, res.ndrop, 0));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, lent));
	rejoin_result_deinit(&res);
	cr_assert(eq(i32, rejoin_accept(fx.br2, a, &ka.cl, &res, err), -EPERM), "twice");
	cr_assert(eq(u32, broker_orphans(fx.br2), 1));
}

Test(state, a_claim_cut_short_by_the_restart_is_reconciled)
{
	struct broker_rejoin_result res;
	struct broker_claim_alloc *w, *kv;
	struct bclient *a;
	struct state_stats st;
	struct claim k;
	char err[ERR_MSG_MAX] = "";
	uint64_t stale = 777;
	const struct btag *t;

	fx.br2 = restore(fx.br, &st);
	a = client_by_id(fx.br2, fx.a->id);
	claim_of(a, &k);
	/* weights: unmapped by a pause whose answer was lost; kv: a resume
	 * whose answer was lost, the client still names an old chunk. */
	w = claimed(&k, "weights");
	w->mapped = false;
	kv = claimed(&k, "kv");
	/* The client holds its old chunk, not the one gmbd lent since. */
	for (size_t i = 0; i < k.cl.nheld; i++)
		if (k.held[i] == kv->chunk_ids[0])
			k.held[i] = stale;
	kv->chunk_ids = &stale;
	kv->nchunks = 1;
	cr_assert(eq(i32, rejoin_accept(fx.br2, a, &k.cl, &res, err), 0), "%s", err);
	cr_assert(eq(sz, res.ncleared, 1));
	cr_assert(eq(u64, res.cleared[0], kv->id));
	cr_assert(eq(sz, res.ndrop, 1));
	cr_assert(eq(u64, res.drop[0], stale));
	rejoin_result_deinit(&res);
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 2 * MiB), "only the engine's 2 MiB");
	t = broker_tag_find(a, "kv");
	cr_assert(eq(ptr, t->allocs->chunks[0], NULL), "kv's last lend is cleared");
	cr_assert(not(t->allocs->active));
}

Test(state, an_unclaimed_allocation_is_freed)
{
	struct broker_rejoin_result res;
	struct bclient *a;
	struct state_stats st;
	struct claim k;
	char err[ERR_MSG_MAX] = "";

	fx.br2 = restore(fx.br, &st);
	a = client_by_id(fx.br2, fx.a->id);
	claim_of(a, &k);
	/* A free on its way when gmbd died: the client leaves kv out. */
	for (size_t i = 0; i < k.cl.nallocs; i++)
		if (strcmp(k.allocs[i].tag, "kv") == 0)
			k.allocs[i] = k.allocs[--k.cl.nallocs];
	cr_assert(eq(i32, rejoin_accept(fx.br2, a, &k.cl, &res, err), 0), "%s", err);
	rejoin_result_deinit(&res);
	cr_assert(eq(u32, a->allocs.count, 1));
	cr_assert(eq(u32, broker_tag_find(a, "kv")->nallocs, 0));
}

/* ---- the state memfd ---- */

Test(state, a_torn_write_falls_back_to_the_previous_record)
{
	char dir[] = "/tmp/gmbstate.XXXXXX", path[64];
	struct persist *p, *q;
	struct sd_named_fd named = { .fd = -1 };
	struct fake_sd sd;
	struct state_stats st;
	struct bclient *c;
	int fd = -1;

	cr_assert(not(eq(ptr, mkdtemp(dir), NULL)));
	snprintf(path, sizeof(path), "%s/notify", dir);
	cr_assert(eq(i32, fake_sd_open(&sd, path), 0));
	setenv("NOTIFY_SOCKET", path, 1);
	cr_assert(eq(i32, persist_new(fx.be, 100, &p), 0));
	fx.br2 = new_broker(persist_hooks(p));
	cr_assert(eq(i32, persist_restore(p, fx.br2, NULL, 0, &st), 0));
	c = add_client(fx.br2, "first", 200, false);
	alloc(fx.br2, c, 2 * MiB, "t");
	persist_changed(p);
	persist_flush(p);
	add_client(fx.br2, "second", 201, false);
	persist_changed(p);
	persist_flush(p);
	cr_assert(eq(i32, fake_sd_sync(&sd), 0));
	cr_assert(eq(i32, fake_sd_count(&sd, "state"), 1));
	cr_assert(eq(i32, fake_sd_count(&sd, "chunk."), 1), "the chunk's fd is stored");
	/* The second record's payload torn: its crc fails, the first stands. */
	for (int i = 0; i < sd.nstore; i++)
		if (strcmp(sd.store[i].name, "state") == 0)
			fd = sd.store[i].fd;
	/* Records go at 4096, then after the one in force: the second at 8192. */
	cr_assert(eq(i32, pwrite(fd, "\xff\xff\xff\xff", 4, 8192), 4));
	named.fd = dup(fd);
	snprintf(named.name, sizeof(named.name), "state");
	cr_assert(eq(i32, persist_new(fx.be, 100, &q), 0));
	broker_free(fx.br);
	fx.br = new_broker(persist_hooks(q));
	cr_assert(eq(i32, persist_restore(q, fx.br, &named, 1, &st), 0));
	cr_assert(eq(u32, st.clients, 1), "not the first record");
	cr_assert(not(eq(ptr, client_by_id(fx.br, c->id), NULL)));
	persist_freeze(q);
	persist_freeze(p);
	unsetenv("NOTIFY_SOCKET");
	broker_free(fx.br);
	fx.br = NULL;
	persist_free(q);
	broker_free(fx.br2);
	fx.br2 = NULL;
	persist_free(p);
	fake_sd_close(&sd);
	rmdir(dir);
}

/* The restored allocation @id of client @cid. */
static struct balloc *restored_alloc(struct broker *br, uint64_t cid, uint64_t id)
{
	struct bclient *c = client_by_id(br, cid);

	cr_assert(not(eq(ptr, c, NULL)));
	return idmap_get(&c->allocs, id);
}

/* fx.br's state as a record to change (the caller frees it). */
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

/* @rec packed into a buffer of *@len bytes (the caller frees it). */
static uint8_t *state_pack(const Gmb__State *rec, size_t *len)
{
	uint8_t *buf;

	*len = gmb__state__get_packed_size(rec);
	buf = malloc(*len);
	cr_assert(not(eq(ptr, buf, NULL)));
	gmb__state__pack(rec, buf);
	return buf;
}

/* fx.br's chunks handed over, then @buf restored into a fresh fx.br2. */
static void restore_second(const uint8_t *buf, size_t len, struct state_stats *st)
{
	export_all(fx.br);
	fx.br2 = new_broker(NULL);
	cr_assert(eq(i32, state_restore(fx.br2, buf, len, fx.fds, fx.nfds, st), 0));
}

/*
 * A record whose active lend does not cover its allocation exactly (sizes
 * that do not add up, a chunk named twice) is not lent again: the pool
 * would count bytes twice or lend fewer than the client maps. Found by
 * tests/fuzz/fuzz_state.c.
 */
Test(state, an_active_lend_that_does_not_add_up_is_restored_paused)
{
	struct state_stats st;
	Gmb__State *rec;
	Gmb__StateAlloc *w = NULL, *act = NULL;
	uint8_t *buf;
	size_t len;

	rec = state_now();
	for (size_t i = 0; i < rec->n_clients; i++)
		for (size_t j = 0; j < rec->clients[i]->n_tags; j++) {
			Gmb__StateTag *t = rec->clients[i]->tags[j];

			if (!strcmp(t->name, "weights"))
				w = t->allocs[0];
			if (!strcmp(t->name, "act"))
				act = t->allocs[0];
		}
	cr_assert(w && act && w->active && act->active && w->n_chunk_ids == 2);
	act->size = 4 * MiB;		   /* its chunk holds 2 MiB */
	w->chunk_ids[0] = w->chunk_ids[1]; /* 2 + 2 MiB: named twice, and short */
	buf = state_pack(rec, &len);
	restore_second(buf, len, &st);
	cr_assert(not(restored_alloc(fx.br2, fx.a->id, w->id)->active));
	cr_assert(not(restored_alloc(fx.br2, fx.b->id, act->id)->active));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 0), "bytes lent over a wrong lend");
	cr_assert(eq(u64, fx.br2->pools[0].held_bytes,
		     fx.br2->pools[0].free_bytes + fx.br2->pools[0].pending_bytes));
	gmb__state__free_unpacked(rec, NULL);
	free(buf);
}

/* Nothing of a paused tag is lent, and a tag named twice is not restored
 * twice (the second would change a tag whose allocations are back already).
 * Found by tests/fuzz/fuzz_state.c. */
Test(state, a_paused_tag_lends_nothing_and_a_tag_comes_back_once)
{
	struct state_stats st;
	Gmb__State *rec;
	Gmb__StateClient *cl = NULL;
	Gmb__StateTag *w = NULL, *twice[3], **tags;
	uint8_t *buf;
	size_t len;

	rec = state_now();
	for (size_t i = 0; i < rec->n_clients; i++)
		if (rec->clients[i]->id == fx.a->id)
			cl = rec->clients[i];
	cr_assert(not(eq(ptr, cl, NULL)));
	for (size_t j = 0; j < cl->n_tags; j++)
		if (!strcmp(cl->tags[j]->name, "weights"))
			w = cl->tags[j];
	cr_assert(w && w->allocs[0]->active && cl->n_tags == 2);
	w->paused = true; /* its allocation still says active */
	twice[0] = cl->tags[0], twice[1] = cl->tags[1], twice[2] = w;
	tags = cl->tags;
	cl->tags = twice, cl->n_tags = 3; /* and weights once more */
	buf = state_pack(rec, &len);
	cl->tags = tags, cl->n_tags = 2; /* rec's own, freed with it */
	restore_second(buf, len, &st);
	{
		struct bclient *c = client_by_id(fx.br2, fx.a->id);
		struct balloc *a = idmap_get(&c->allocs, w->allocs[0]->id);

		cr_assert(eq(u32, c->ntags, 2));
		cr_assert(not(a->active), "an allocation of a paused tag was lent");
		cr_assert(a->tag->paused);
		cr_assert(eq(u32, a->tag->nallocs, 1));
	}
	free(buf);
	gmb__state__free_unpacked(rec, NULL);
}

/* A record keeps every supplementary group (the admin-group rule reads them). */
Test(state, a_client_s_groups_come_back_all)
{
	static gid_t groups[100];
	struct broker_peer peer = { .pid = 4321,
				    .uid = getuid(),
				    .gid = getgid(),
				    .groups = groups,
				    .ngroups = 100,
				    .start_time = 42 };
	struct state_stats st;
	struct bclient *c, *back;

	for (int i = 0; i < 100; i++)
		groups[i] = (gid_t)(5000 + i);
	cr_assert(eq(i32, broker_client_add(fx.br, &peer, "many-groups", true, false, &c), 0));
	fx.br2 = restore(fx.br, &st);
	back = client_by_id(fx.br2, c->id);
	cr_assert(not(eq(ptr, back, NULL)));
	cr_assert(eq(i32, back->ngroups, 100), "groups were cut on restore");
	cr_assert(eq(u32, (unsigned)back->groups[99], 5099));
}
