/*
 * broker_refs.h - a holder entry's refs recounted from the allocations, for
 * the broker's unit tests and the fuzz harnesses' invariant checks alike.
 */
#ifndef GMB_TEST_BROKER_REFS_H
#define GMB_TEST_BROKER_REFS_H

#include <stdint.h>

#include "daemon/core/broker.h"

/* How many allocations of @c have @ch in their last lend. */
static inline uint32_t test_count_refs(const struct bclient *c, const struct chunk *ch)
{
	uint32_t n = 0;

	for (const struct btag *t = c->tags; t; t = t->next)
		for (const struct balloc *a = t->allocs; a; a = a->next)
			for (uint32_t i = 0; i < a->nchunks; i++)
				n += a->chunks[i] == ch;
	return n;
}

#endif
