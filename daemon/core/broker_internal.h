/*
 * broker_internal.h - what the core's files share beyond their headers
 * (included here, all of them); nothing outside daemon/core/ includes it.
 */
#ifndef GMB_BROKER_INTERNAL_H
#define GMB_BROKER_INTERNAL_H

#include "daemon/core/arb.h"
#include "daemon/core/broker.h"
#include "daemon/core/lend.h"
#include "daemon/core/rejoin.h"
#include "daemon/core/wait.h"

/*
 * Internals shared by daemon/core/broker.c (clients, tags, drops, control) and
 * daemon/core/lend.c (allocations, pause, resume); nothing else calls them.
 */
/* Bytes of @c's mapped (active) allocations on @dev. */
uint64_t broker__active_bytes(const struct bclient *c, int dev);
/* Finds or creates @name (checked: non-empty, <= WIRE_MAX_NAME, tag limit);
 * *@created says whether the caller must broker__tag_remove() it on failure. */
int broker__tag_get(struct bclient *c, const char *name, struct btag **out, bool *created,
		    char *err);
void broker__tag_remove(struct bclient *c, struct btag *t);
/* Links @a first in @t's list and counts it. */
void broker__tag_link(struct btag *t, struct balloc *a);
/* Marks @a active or not, keeping its client's lent_chunks (the per-uid
 * bound's count) right: every change of a->active goes through here. */
void broker__alloc_activate(struct balloc *a, bool active);
/* Chunks back to the pool, holds removed, unlinked and freed; no shrink. */
void broker__alloc_destroy(struct broker *br, struct bclient *c, struct balloc *a);

/* arb.c, for lend.c: the switch @c's takes belong to (0: none); whether
 * @c's pause keeps its chunks for the switch; a take's figures. */
uint64_t arb__handover_id(const struct bclient *c);
bool arb__handover_keeps(const struct bclient *c);
void arb__handover_took(struct pool *pool, struct bclient *c, const struct pool_take *t,
			uint64_t handed_bytes, uint32_t handed_chunks);
/* wait.c, for broker_client_remove(): @c's waiters leave the queue. */
void wait__forget(struct broker *br, struct bclient *c);

#endif
