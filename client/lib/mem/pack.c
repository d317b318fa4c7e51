/*
 * pack.c - packing small allocations into shared ones; see pack.h.
 *
 * PyTorch's caching allocator turns 2,048 tensors of 2 MiB into 205
 * segments of 20 MiB. Each segment as its own allocation is its own chunk:
 * a lend costs gmbd's export, the client's import and a mapping per chunk,
 * and a pause one unmap per mapping, so a tag of small segments paused and
 * resumed at a fraction of the speed of one of large ones. A pack is an
 * ordinary allocation (gmbd lends, pauses and resumes it as any other)
 * whose range is carved into pieces here: an allocation that fits in one
 * of its tag's packs costs no request at all, and a pause or resume costs
 * one chunk per pack.
 *
 * The price is memory: a pack is lent whole, and its free room counts
 * against the budget until a piece fills it or the last piece goes (then
 * allocs.c frees the pack). The pack sizes grow with the tag (doubling what
 * its packs hold, from GMB__PACK_MIN to GMB__PACK_MAX and never past
 * gmbd's largest chunk, cut to a whole number of the first piece's size),
 * so the room left is at most the last pack's. A pack is one chunk: where
 * two pieces do not fit in one, allocs.c does not pack. A PRESERVE pack's host copy is the whole pack, room included.
 *
 * Pieces of a pack are kept by address; a new one goes in the first gap
 * that fits. Sizes and addresses are granularity multiples (allocs.c rounds).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/mem/pack.h"
#include "common/list.h"
#include "include/gmb.h"

int gmb__pack_env(void)
{
	const char *s = getenv("GMB_PACK");

	if (!s || !*s || strcmp(s, "hooks") == 0)
		return GMB_PACK_HOOKS;
	if (strcmp(s, "off") == 0 || strcmp(s, "0") == 0)
		return GMB_PACK_OFF;
	if (strcmp(s, "all") == 0 || strcmp(s, "1") == 0)
		return GMB_PACK_ALL;
	return -EINVAL;
}

static bool pack_matches(const struct gmb__alloc *a, const struct gmb__pack_key *k)
{
	if (!a->packed || a->dev != k->dev || a->peers != k->peers || a->own_mode != k->own_mode)
		return false;
	return !k->own_mode || (a->mode == k->mode && a->backup == k->backup);
}

uint64_t gmb__pack_size(const struct gmb__tag *t, const struct gmb__pack_key *k, uint64_t size,
			uint64_t max_chunk)
{
	uint64_t held = 0, n;

	for (const struct gmb__alloc *a = t->allocs; a; a = a->next)
		if (pack_matches(a, k))
			held += a->size;
	n = held < GMB__PACK_MIN ? GMB__PACK_MIN : held;
	if (n > GMB__PACK_MAX)
		n = GMB__PACK_MAX;
	if (max_chunk && n > max_chunk)
		n = max_chunk;
	/* A whole number of pieces of this size: PyTorch's segments are alike,
	 * and room they cannot fill would only be lent and copied. */
	return n < size ? size : n / size * size;
}

/* The first gap of @a of @size bytes: its address, or 0. */
static uintptr_t pack_gap(const struct gmb__alloc *a, uint64_t size)
{
	uintptr_t at = a->va;

	for (const struct gmb__piece *p = a->pieces; p; p = p->next) {
		if (p->va - at >= size)
			return at;
		at = p->va + p->size;
	}
	return a->va + a->size - at >= size ? at : 0;
}

struct gmb__alloc *gmb__pack_find(const struct gmb__tag *t, const struct gmb__pack_key *k,
				  uint64_t size, uintptr_t *va)
{
	for (struct gmb__alloc *a = t->allocs; a; a = a->next) {
		uintptr_t at;

		if (!pack_matches(a, k) || !a->mapped)
			continue;
		at = pack_gap(a, size);
		if (at) {
			*va = at;
			return a;
		}
	}
	return NULL;
}

int gmb__pack_carve(struct gmb__alloc *pack, uintptr_t va, uint64_t size, struct gmb__piece **out)
{
	struct gmb__piece *p = calloc(1, sizeof(*p)), *after = NULL;

	if (!p)
		return -ENOMEM;
	*p = (struct gmb__piece){ .va = va, .size = size, .pack = pack };
	for (struct gmb__piece *q = pack->pieces; q && q->va < va; q = q->next)
		after = q;
	if (after) {
		p->prev = after;
		p->next = after->next;
		if (after->next)
			after->next->prev = p;
		after->next = p;
	} else {
		DLIST_PUSH(pack->pieces, p);
	}
	pack->npieces++;
	*out = p;
	return 0;
}

bool gmb__pack_uncarve(struct gmb__piece *p)
{
	struct gmb__alloc *pack = p->pack;

	DLIST_UNLINK(pack->pieces, p);
	pack->npieces--;
	free(p);
	return pack->npieces == 0;
}

const struct gmb__piece *gmb__pack_piece_at(const struct gmb__alloc *pack, uintptr_t p)
{
	for (const struct gmb__piece *q = pack->pieces; q && q->va <= p; q = q->next)
		if (p - q->va < q->size)
			return q;
	return NULL;
}

void gmb__pack_clear(struct gmb__alloc *pack)
{
	while (pack->pieces)
		gmb__pack_uncarve(pack->pieces);
}
