/*
 * broker_fx.c - the broker's unit tests' fixture (tests/broker_fx.h): a
 * broker over the host backend, the steps the tests take on it, and the
 * invariant checks each step ends with.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "tests/broker_fx.h"
#include "tests/broker_refs.h"
#include "tests/util.h"
#include "daemon/core/broker_internal.h"

struct backend *bfx_be;
struct broker *bfx_br;

struct bfx_drops bfx_drops;

static void bfx_check_pool(const struct pool *p)
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

static void bfx_check_alloc(const struct bclient *c, const struct balloc *a, uint64_t *lent)
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

static void bfx_check_clients(uint64_t *lent)
{
	uint32_t nclients = 0;

	for (const struct bclient *c = bfx_br->clients; c; c = c->next, nclients++) {
		size_t nallocs = 0;
		uint64_t lent_chunks = 0;

		for (const struct btag *t = c->tags; t; t = t->next) {
			uint64_t bytes = 0;
			uint32_t n = 0;

			for (const struct balloc *a = t->allocs; a; a = a->next, n++) {
				cr_assert(eq(ptr, a->tag, (void *)t));
				cr_assert(a->active != t->paused);
				bfx_check_alloc(c, a, lent);
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
	cr_assert(eq(u32, bfx_br->nclients, nclients));
}

/* Holder entries agree with the allocations' last lends. */
static void bfx_check_holders(void)
{
	uint64_t key;
	void *val;

	for (size_t it = 0; idmap_next(&bfx_br->chunks, &it, &key, &val);) {
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

void bfx_check(void)
{
	uint64_t lent[BACKEND_MAX_DEVICES] = { 0 };
	uint32_t nchunks = 0;

	bfx_check_clients(lent);
	for (int d = 0; d < bfx_br->ndevices; d++) {
		bfx_check_pool(&bfx_br->pools[d]);
		cr_assert(eq(u64, bfx_br->pools[d].lent_bytes, lent[d]), "device %d lent bytes", d);
		nchunks += bfx_br->pools[d].nchunks;
	}
	cr_assert(eq(sz, bfx_br->chunks.count, (size_t)nchunks));
	cr_assert(eq(i32, proc_count_memfds(), (int)nchunks), "backend chunks alive");
	bfx_check_holders();
}

/* Everything a failed call must leave as it was, as text. */
void bfx_snapshot(char *buf, size_t cap)
{
	FILE *f = fmemopen(buf, cap, "w");

	for (int d = 0; d < bfx_br->ndevices; d++) {
		const struct pool *p = &bfx_br->pools[d];

		fprintf(f, "dev%d held=%llu lent=%llu free=%llu pend=%llu n=%u free:", d,
			(unsigned long long)p->held_bytes, (unsigned long long)p->lent_bytes,
			(unsigned long long)p->free_bytes, (unsigned long long)p->pending_bytes,
			p->nchunks);
		for (const struct chunk *c = p->free_head; c; c = c->next)
			fprintf(f, " %llu", (unsigned long long)c->id);
		fprintf(f, "\n");
	}
	for (const struct bclient *c = bfx_br->clients; c; c = c->next)
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
	for (uint64_t id = 1; id < bfx_br->next_chunk_id; id++) {
		const struct chunk *ch = idmap_get(&bfx_br->chunks, id);

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

void bfx_open(uint64_t budget, uint64_t keep)
{
	struct broker_opts o = {
		.max_chunk = 1 * GiB, .pool_keep = keep, .budget = budget, .daemon_uid = 999
	};

	if (bfx_br)
		broker_free(bfx_br);
	bfx_br = NULL;
	cr_assert(eq(i32, broker_new(bfx_be, &o, &bfx_br), 0));
}

void bfx_setup(void)
{
	struct backend_host_opts o = { .ndevices = 2, .memory = 8 * GiB, .granularity = 2 * MiB };

	cr_assert(eq(i32, backend_host_open(&o, &bfx_be), 0));
	bfx_open(0, UINT64_MAX);
}

void bfx_teardown(void)
{
	broker_free(bfx_br);
	cr_expect(eq(i32, proc_count_memfds(), 0), "chunks leaked past broker_free");
	test_backend_restore(bfx_be);
	backend_close(bfx_be);
	cr_expect(eq(i32, test_leak_check(), 0), "heap leaked: see the report");
}

struct bclient *bfx_client_gid(const char *name, pid_t pid, uid_t uid, const gid_t *groups,
			       int ngroups)
{
	struct broker_peer peer = {
		.pid = pid, .uid = uid, .gid = uid, .groups = groups, .ngroups = ngroups
	};
	struct bclient *c = NULL;

	cr_assert(eq(i32, broker_client_add(bfx_br, &peer, name, true, false, &c), 0));
	return c;
}

struct bclient *bfx_client(const char *name, pid_t pid, uid_t uid)
{
	return bfx_client_gid(name, pid, uid, NULL, 0);
}

/* Allocates, checks how many chunks and fds it took, returns the allocation. */
struct balloc *bfx_alloc_ok(struct bclient *c, int dev, uint64_t size, const char *tag,
			    uint32_t want_chunks, size_t want_send)
{
	struct broker_result res;
	char err[ERR_MSG_MAX] = "";
	struct balloc *a;

	cr_assert(eq(i32, lend_alloc(bfx_br, c, dev, size, tag, &res, err), 0), "alloc: %s", err);
	cr_assert(eq(sz, res.nallocs, 1));
	a = res.allocs[0];
	if (want_chunks != UINT32_MAX)
		cr_assert(eq(u32, a->nchunks, want_chunks));
	if (want_send != BFX_ANY)
		cr_assert(eq(sz, res.nsend, want_send));
	broker_result_deinit(&res);
	bfx_check();
	return a;
}

int bfx_alloc_rc(struct bclient *c, int dev, uint64_t size, const char *tag, char *err)
{
	struct broker_result res;
	int rc = lend_alloc(bfx_br, c, dev, size, tag, &res, err);

	if (rc < 0) {
		cr_assert(eq(sz, res.nallocs, 0));
		cr_assert(eq(sz, res.nsend, 0));
	}
	broker_result_deinit(&res);
	bfx_check();
	return rc;
}

void bfx_resume_ok(struct bclient *c, const char *tag, size_t want_allocs, size_t want_send)
{
	struct broker_result res;
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, lend_resume(bfx_br, c, tag, &res, err), 0), "resume: %s", err);
	cr_assert(eq(sz, res.nallocs, want_allocs));
	cr_assert(eq(sz, res.nsend, want_send));
	broker_result_deinit(&res);
	bfx_check();
}

int bfx_resume_rc(struct bclient *c, const char *tag, char *err)
{
	struct broker_result res;
	int rc = lend_resume(bfx_br, c, tag, &res, err);

	broker_result_deinit(&res);
	bfx_check();
	return rc;
}

void bfx_pause_ok(struct bclient *c, const char *tag)
{
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, lend_pause(bfx_br, c, tag, false, err), 0), "pause: %s", err);
	bfx_check();
}

void bfx_free_ok(struct bclient *c, struct balloc *a)
{
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, lend_free(bfx_br, c, a->id, err), 0), "free: %s", err);
	bfx_check();
}

static void bfx_record_drops(void *arg, struct bclient *c, const uint64_t *ids, size_t n)
{
	int i = bfx_drops.calls++;

	cr_assert(lt(i32, i, 8));
	cr_assert(le(sz, n, 16));
	bfx_drops.c[i] = c;
	bfx_drops.n[i] = n;
	memcpy(bfx_drops.ids[i], ids, n * sizeof(*ids));
}

void bfx_flush(int want_calls)
{
	memset(&bfx_drops, 0, sizeof(bfx_drops));
	broker_flush_drops(bfx_br, bfx_record_drops, NULL);
	cr_assert(eq(i32, bfx_drops.calls, want_calls));
	bfx_check();
}
