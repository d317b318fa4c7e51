/*
 * pack.h - packing (pack.c): a tag's small allocations carved out of
 * shared allocations ("packs"), so that a pause unmaps, and a resume lends
 * and maps, one chunk for many of them.
 *
 * Layer: part of libgmb's memory (client/lib/mem/), under op_lock like the
 * rest of it; the pieces table is also read under the state lock
 * (gmb_owns()). Sends nothing: allocs.c makes and frees the packs themselves.
 */
#ifndef GMB_CLIENT_MEM_PACK_H
#define GMB_CLIENT_MEM_PACK_H

#include <stdbool.h>
#include <stdint.h>

#include "client/lib/cache/cache.h"

/* Allocations of at most this are packed, into packs of MIN..MAX bytes. */
#define GMB__PACK_PIECE_MAX (32ULL << 20)
#define GMB__PACK_MIN	    (64ULL << 20)
#define GMB__PACK_MAX	    (256ULL << 20)

/* One allocation the application made, carved out of a pack at va. */
struct gmb__piece {
	uintptr_t va;
	uint64_t size;
	struct gmb__alloc *pack;	/* the allocation gmbd knows */
	struct gmb__piece *prev, *next; /* in the pack, by address */
};

/* What a new piece must share with its pack: its device, peers and mode. */
struct gmb__pack_key {
	int dev;
	uint64_t peers;
	bool own_mode;
	int mode, backup; /* own_mode only */
};

/* GMB_PACK_* from $GMB_PACK ("off", "hooks", "all"); -EINVAL if malformed. */
int gmb__pack_env(void);
/* The size of @t's next pack for a piece of @size: as much as its packs hold
 * so far, bounded (by @max_chunk too, when not 0: a pack is one chunk), in
 * whole pieces of @size. */
uint64_t gmb__pack_size(const struct gmb__tag *t, const struct gmb__pack_key *k, uint64_t size,
			uint64_t max_chunk);
/* A pack of @t with room for @size (key @k), and where: NULL if none. */
struct gmb__alloc *gmb__pack_find(const struct gmb__tag *t, const struct gmb__pack_key *k,
				  uint64_t size, uintptr_t *va);
/* Records a piece [@va, +@size) of @pack: 0 or -ENOMEM. */
int gmb__pack_carve(struct gmb__alloc *pack, uintptr_t va, uint64_t size, struct gmb__piece **out);
/* Takes @p out of its pack and frees it; true when the pack is empty now. */
bool gmb__pack_uncarve(struct gmb__piece *p);
/* The piece of @pack holding address @p, or NULL. */
const struct gmb__piece *gmb__pack_piece_at(const struct gmb__alloc *pack, uintptr_t p);
/* Frees every piece of @pack (it is going away). */
void gmb__pack_clear(struct gmb__alloc *pack);

#endif
