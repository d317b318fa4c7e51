/*
 * fuzz_util.c - the invariant checks of the fuzz harnesses (fuzz.h). The
 * core's state is redundant on purpose (tests/broker_fx.c proves it step
 * by step); here the same recomputation runs after every fuzzed input.
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/core/broker.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"
#include "tests/broker_refs.h"
#include "tests/fuzz/fuzz.h"

void fuzz_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "fuzz invariant broken: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

int fuzz_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		fuzz_fail("cannot open /proc/self/fd");
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

uint64_t fuzz_take(const uint8_t **p, const uint8_t *end, size_t n)
{
	uint64_t v = 0;

	for (size_t i = 0; i < n && *p < end; i++, (*p)++)
		v |= (uint64_t) * *p << (8 * i);
	return v;
}

static void fuzz_check_pool(const struct pool *p, int over_budget)
{
	uint64_t free_sum = 0, pend_sum = 0, prev = UINT64_MAX;

	for (const struct chunk *c = p->free_head; c; c = c->next) {
		if (!c->free || c->releasing || c->lent_to)
			fuzz_fail("dev %d: chunk %llu on the free list is not free", p->dev,
				  (unsigned long long)c->id);
		if (c->size > prev)
			fuzz_fail("dev %d: free list not sorted largest first", p->dev);
		prev = c->size;
		free_sum += c->size;
	}
	for (const struct chunk *c = p->pending_head; c; c = c->next) {
		if (!c->releasing || c->free || c->lent_to || c->nholders == 0)
			fuzz_fail("dev %d: chunk %llu pending but not releasing or unheld", p->dev,
				  (unsigned long long)c->id);
		pend_sum += c->size;
	}
	if (p->free_bytes != free_sum || p->pending_bytes != pend_sum)
		fuzz_fail("dev %d: free %llu (list %llu), pending %llu (list %llu)", p->dev,
			  (unsigned long long)p->free_bytes, (unsigned long long)free_sum,
			  (unsigned long long)p->pending_bytes, (unsigned long long)pend_sum);
	if (p->held_bytes != p->lent_bytes + p->free_bytes + p->pending_bytes)
		fuzz_fail("dev %d: held %llu != lent %llu + free + pending", p->dev,
			  (unsigned long long)p->held_bytes, (unsigned long long)p->lent_bytes);
	if (!over_budget && p->held_bytes > p->budget)
		fuzz_fail("dev %d: held %llu over the budget %llu", p->dev,
			  (unsigned long long)p->held_bytes, (unsigned long long)p->budget);
}

static void fuzz_check_alloc(const struct bclient *c, const struct balloc *a, uint64_t *lent)
{
	uint64_t sum = 0;

	if (idmap_get(&c->allocs, a->id) != a)
		fuzz_fail("client %llu: allocation %llu not in its map", (unsigned long long)c->id,
			  (unsigned long long)a->id);
	for (uint32_t i = 0; i < a->nchunks; i++) {
		const struct chunk *ch = a->chunks[i];

		if (a->active && (!ch || ch->lent_to != a))
			fuzz_fail("active allocation %llu: chunk %u not lent to it",
				  (unsigned long long)a->id, i);
		if (!ch)
			continue;
		if (ch->lent_to == a && !a->active)
			fuzz_fail("paused allocation %llu still lent chunk %llu",
				  (unsigned long long)a->id, (unsigned long long)ch->id);
		if (ch->dev != a->dev)
			fuzz_fail("allocation %llu on dev %d has a chunk of dev %d",
				  (unsigned long long)a->id, a->dev, ch->dev);
		sum += ch->size;
	}
	if (a->active) {
		if (sum != a->size)
			fuzz_fail("active allocation %llu: lend %llu bytes of %llu",
				  (unsigned long long)a->id, (unsigned long long)sum,
				  (unsigned long long)a->size);
		lent[a->dev] += a->size;
	}
}

static void fuzz_check_clients(const struct broker *br, uint64_t *lent)
{
	uint32_t nclients = 0;

	for (const struct bclient *c = br->clients; c; c = c->next, nclients++) {
		size_t nallocs = 0;

		for (const struct btag *t = c->tags; t; t = t->next) {
			uint64_t bytes = 0;
			uint32_t n = 0;

			for (const struct balloc *a = t->allocs; a; a = a->next, n++) {
				/* Not lent in an active tag is allowed: an orphan's
				 * allocation whose chunks did not come back, or a
				 * rejoin claim made while a pause waited for gmbd
				 * (unmapped, the tag not yet marked paused). Lent in
				 * a paused tag never is. */
				if (a->tag != t || (a->active && t->paused))
					fuzz_fail("allocation %llu: tag or state wrong",
						  (unsigned long long)a->id);
				fuzz_check_alloc(c, a, lent);
				bytes += a->size;
			}
			if (t->bytes != bytes || t->nallocs != n)
				fuzz_fail(
					"tag %s: %llu bytes in %u allocations, counted %llu in %u",
					t->name, (unsigned long long)t->bytes, t->nallocs,
					(unsigned long long)bytes, n);
			nallocs += n;
		}
		if (c->allocs.count != nallocs)
			fuzz_fail("client %llu: map %zu, tags %zu allocations",
				  (unsigned long long)c->id, c->allocs.count, nallocs);
	}
	if (br->nclients != nclients)
		fuzz_fail("broker counts %u clients, list %u", br->nclients, nclients);
}

static void fuzz_check_holders(const struct broker *br)
{
	uint64_t key;
	void *val;

	for (size_t it = 0; idmap_next(&br->chunks, &it, &key, &val);) {
		const struct chunk *ch = val;

		if (ch->id != key || ch->acked)
			fuzz_fail("chunk %llu: registry key %llu or scratch flag",
				  (unsigned long long)ch->id, (unsigned long long)key);
		for (uint32_t i = 0; i < ch->nholders; i++) {
			const struct chunk_holder *h = &ch->holders[i];

			if (h->refs != test_count_refs(h->client, ch))
				fuzz_fail("chunk %llu: holder %llu has %u refs, lends say %u",
					  (unsigned long long)ch->id,
					  (unsigned long long)h->client->id, h->refs,
					  test_count_refs(h->client, ch));
			if ((h->refs == 0 && !h->drop_sent) || (h->drop_sent && !ch->releasing))
				fuzz_fail("chunk %llu: holder entry without reason",
					  (unsigned long long)ch->id);
		}
	}
}

/* A version's export pins chunks exactly while its object is not paused
 * (a resume in flight, busy, has taken them already). */
static bool fuzz_version_chunks_ok(const struct import_export *ex)
{
	const struct bobject *obj = ex->version->obj;

	if (!obj->paused)
		return ex->chunks != NULL;
	return obj->busy || (ex->chunks == NULL && ex->nmapped == 0);
}

/* One export's imports and pins (daemon/core/import.h's invariants). */
static void fuzz_check_export(const struct import_export *ex, uint64_t *lent, uint64_t *nrecs,
			      uint64_t *nidle)
{
	uint32_t n = 0, mapped = 0;

	for (const struct import_rec *r = ex->imports; r; r = r->next, n++) {
		if (r->refs == 0 || r->ex != ex)
			fuzz_fail("export %llu: an import record of no open",
				  (unsigned long long)ex->id);
		if (r->idle && !r->mapped)
			fuzz_fail("export %llu: an idle import that maps nothing",
				  (unsigned long long)ex->id);
		mapped += r->mapped;
		*nidle += r->idle;
	}
	if (mapped != ex->nmapped)
		fuzz_fail("export %llu: %u mapped records, counted %u", (unsigned long long)ex->id,
			  mapped, ex->nmapped);
	/* A named object's version lives unread while its object holds it. */
	if (n != ex->nimports || (!ex->alloc && n == 0 && !(ex->version && ex->version->held)))
		fuzz_fail("export %llu: %u records, counted %u, allocation %s",
			  (unsigned long long)ex->id, n, ex->nimports,
			  ex->alloc ? "alive" : "gone");
	*nrecs += n;
	/* Only imports that followed the pause (unmapped) outlive it. */
	if (mapped && ex->alloc && !ex->alloc->active)
		fuzz_fail("export %llu: mapped while paused", (unsigned long long)ex->id);
	if (ex->version ? ex->alloc || ex->version->ex != ex || !fuzz_version_chunks_ok(ex) :
			  (mapped != 0) != (ex->chunks != NULL))
		fuzz_fail("export %llu: pinned chunks without mapped imports, or the reverse",
			  (unsigned long long)ex->id);
	for (uint32_t i = 0; i < ex->nchunks; i++) {
		const struct chunk *ch = ex->chunks[i];

		/* Two exports may pin one chunk: a published allocation's old one and its version. */
		if (ch->pins == 0 || ch->free || ch->releasing)
			fuzz_fail("export %llu: chunk %llu pins %u, free %d",
				  (unsigned long long)ex->id, (unsigned long long)ch->id, ch->pins,
				  ch->free);
		/* A freed allocation's chunks stay lent, to nobody (counted once below). */
		if (!ex->alloc && ch->lent_to)
			fuzz_fail("chunk %llu of a freed import lent again",
				  (unsigned long long)ch->id);
	}
}

/* Named objects (daemon/core/object.h's invariants): unique names, a
 * latest that is a held version, versions increasing, each on its export. */
static void fuzz_check_objects(const struct broker *br)
{
	for (const struct bobject *o = br->objects ? br->objects->objects : NULL; o; o = o->next) {
		uint64_t prev = 0, held = 0;
		uint32_t n = 0;

		for (const struct bobject *p = o->next; p; p = p->next)
			if (p->uid == o->uid && strcmp(p->name, o->name) == 0)
				fuzz_fail("object '%s' of uid %u twice", o->name, (unsigned)o->uid);
		for (const struct bobject_version *v = o->versions; v; v = v->next, n++) {
			if (v->version <= prev || v->version >= o->next_version || v->obj != o ||
			    !v->ex || v->ex->version != v)
				fuzz_fail("object '%s': version %llu out of order or unlinked",
					  o->name, (unsigned long long)v->version);
			if (v->held)
				held = v->version;
			prev = v->version;
		}
		if (n != o->nversions || held != o->latest || (o->dropped && o->latest) ||
		    (o->dropped && n == 0))
			fuzz_fail("object '%s': %u versions (counted %u), latest %llu held %llu",
				  o->name, n, o->nversions, (unsigned long long)o->latest,
				  (unsigned long long)held);
	}
}

static void fuzz_check_imports(const struct broker *br, uint64_t *lent)
{
	const struct import_table *t = br->imports;
	uint64_t nrecs = 0, nexports = 0, nidle = 0, pinned = 0, pins = 0, key;
	void *val;

	for (const struct import_export *ex = t ? t->exports : NULL; ex; ex = ex->next) {
		fuzz_check_export(ex, lent, &nrecs, &nidle);
		pinned += ex->nchunks;
		nexports++;
	}
	for (size_t it = 0; idmap_next(&br->chunks, &it, &key, &val);) {
		const struct chunk *ch = val;

		pins += ch->pins;
		/* Pinned and lent to nobody: a gone allocation's, counted as lent. */
		if (ch->pins && !ch->lent_to)
			lent[ch->dev] += ch->size;
	}
	if (pins != pinned ||
	    (t && (t->nrecs != nrecs || t->nexports != nexports || t->nidle != nidle)))
		fuzz_fail("imports: %llu pins for %llu pinned chunks, records %llu, idle %llu",
			  (unsigned long long)pins, (unsigned long long)pinned,
			  (unsigned long long)nrecs, (unsigned long long)nidle);
}

void fuzz_check_broker(const struct broker *br, int over_budget)
{
	uint64_t lent[BACKEND_MAX_DEVICES] = { 0 };
	uint32_t nchunks = 0;

	fuzz_check_clients(br, lent);
	fuzz_check_imports(br, lent);
	fuzz_check_objects(br);
	for (int d = 0; d < br->ndevices; d++) {
		fuzz_check_pool(&br->pools[d], over_budget);
		if (br->pools[d].lent_bytes != lent[d])
			fuzz_fail("dev %d: %llu bytes lent, clients' active allocations %llu", d,
				  (unsigned long long)br->pools[d].lent_bytes,
				  (unsigned long long)lent[d]);
		nchunks += br->pools[d].nchunks;
	}
	if (br->chunks.count != nchunks)
		fuzz_fail("registry %zu chunks, pools %u", br->chunks.count, nchunks);
	fuzz_check_holders(br);
}
