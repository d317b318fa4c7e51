/*
 * rejoin.c - what this client holds, as the re-announcement after a gmbd
 * restart tells it (reconnect.c asks through the connection's callbacks):
 * its tags, allocations and held handles, and the imports of other
 * processes' memory it maps (listed by client/lib/ipc/ through
 * m->claim_imports); and gmbd's answer applied to the memory tables.
 *
 * Both run on the reader thread while every operation is still: none runs,
 * or the one running is parked waiting for the connection, and none starts
 * (conn->rejoining), so the tags and allocations, which change under
 * op_lock only, hold still; the tables the reader itself changes are read
 * under the state lock. Mappings are never touched.
 */
#include <errno.h>
#include <stdlib.h>

#include "client/lib/conn/reconnect.h"
#include "client/lib/mem/mem.h"

/* Chunk ids per claimed piece of an allocation: a part holds a piece. */
#define REJOIN_PIECE 1024u

static size_t rejoin_pieces(const struct gmb__alloc *a)
{
	return a->nchunks ? (a->nchunks + REJOIN_PIECE - 1) / REJOIN_PIECE : 1;
}

static void rejoin_counts(struct gmb__mem *m, size_t *ntags, size_t *nallocs)
{
	*ntags = *nallocs = 0;
	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		(*ntags)++;
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			*nallocs += rejoin_pieces(a);
	}
}

static void rejoin_claim_tag(struct gmb__claim *cl, struct gmb__tag *t)
{
	Gmb__RejoinTag *rt = &cl->tags[cl->ntags];

	gmb__rejoin_tag__init(rt);
	rt->name = t->name;
	rt->mode = (Gmb__Mode)t->mode;
	rt->paused = t->paused;
	cl->ptags[cl->ntags++] = rt;
	for (struct gmb__alloc *a = t->allocs; a; a = a->next) {
		/* A free on its way is not claimed: gmbd lets the allocation go. */
		if (!a->id || a->freeing)
			continue;
		for (uint32_t first = 0; first == 0 || first < a->nchunks; first += REJOIN_PIECE) {
			Gmb__RejoinAlloc *ra = &cl->allocs[cl->nallocs];
			uint32_t n = a->nchunks - first;

			gmb__rejoin_alloc__init(ra);
			ra->alloc_id = a->id;
			ra->tag = t->name;
			ra->device = (uint32_t)a->dev;
			ra->size = a->size;
			ra->mapped = a->mapped;
			ra->first_chunk = first;
			ra->n_chunk_ids = n < REJOIN_PIECE ? n : REJOIN_PIECE;
			ra->chunk_ids = a->chunk_ids + first;
			cl->pallocs[cl->nallocs++] = ra;
		}
	}
}

/* The imports of others' memory, as the IPC layer lists them; state lock held. */
static int rejoin_claim_imports(struct gmb__mem *m, struct gmb__claim *cl)
{
	size_t n = m->claim_imports ? m->claim_imports(m->claim_imports_arg, NULL, 0) : 0;

	cl->imports = calloc(n + 1, sizeof(*cl->imports));
	cl->pimports = calloc(n + 1, sizeof(*cl->pimports));
	if (!cl->imports || !cl->pimports)
		return -ENOMEM;
	if (n) {
		size_t got = m->claim_imports(m->claim_imports_arg, cl->imports, n);

		cl->nimports = got < n ? got : n;
	}
	for (size_t i = 0; i < cl->nimports; i++)
		cl->pimports[i] = &cl->imports[i];
	return 0;
}

/* Everything this client holds, read while every operation is still. */
int gmb__rejoin_claim_build(void *arg, struct gmb__claim *cl)
{
	struct gmb__mem *m = arg;
	struct gmb__handle *e;
	size_t ntags, nallocs, it = 0;
	uint64_t id;
	int rc = -ENOMEM;

	*cl = (struct gmb__claim){ 0 };
	rejoin_counts(m, &ntags, &nallocs);
	pthread_mutex_lock(&m->conn->lock);
	cl->tags = calloc(ntags + 1, sizeof(*cl->tags));
	cl->ptags = calloc(ntags + 1, sizeof(*cl->ptags));
	cl->allocs = calloc(nallocs + 1, sizeof(*cl->allocs));
	cl->pallocs = calloc(nallocs + 1, sizeof(*cl->pallocs));
	cl->held = calloc(m->tab.cache.count + 1, sizeof(*cl->held));
	if (cl->tags && cl->ptags && cl->allocs && cl->pallocs && cl->held) {
		for (struct gmb__tag *t = m->tags; t; t = t->next)
			rejoin_claim_tag(cl, t);
		while (idmap_next(&m->tab.cache, &it, &id, (void **)&e))
			if (e->refs > 0)
				cl->held[cl->nheld++] = id;
		rc = rejoin_claim_imports(m, cl);
	}
	pthread_mutex_unlock(&m->conn->lock);
	if (rc < 0)
		gmb__claim_free(cl);
	return rc;
}

/* gmbd's answer, applied to the tables: both sides now agree. */
void gmb__rejoin_claim_apply(void *arg, const struct gmb__claim_answer *ans)
{
	struct gmb__mem *m = arg;
	struct gmb__handle *rel = NULL;

	pthread_mutex_lock(&m->conn->lock);
	for (size_t i = 0; i < ans->ncleared; i++) {
		struct gmb__alloc *a = idmap_get(&m->tab.by_id, ans->cleared[i]);

		/* gmbd clears only unmapped ones; a mapped one keeps its lend. */
		if (a && !a->mapped)
			gmb__cache_lend_clear(&m->tab, a, &rel);
	}
	/* A refusal keeps every handle: memory still mapped here outranks gmbd's record. */
	(void)gmb__cache_drop(&m->tab, ans->drop, ans->ndrop, &rel, NULL);
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
}
