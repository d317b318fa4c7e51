/*
 * walk.h - the way over the broker's lists from outside daemon/core/: the
 * tree (clients -> tags -> allocations -> the chunks of each last lend),
 * every chunk alive, the waiting requests, and the clients to act on.
 *
 * Visitors, not iterators nor a snapshot. The consumers (the status reply,
 * the state record, the metrics page) each build one flat message in two
 * passes, counting and then filling, so they need a walk in a fixed order
 * with a hook where a tag's and a client's rows are complete; a visitor
 * gives that with no cursor type whose layout would leak the lists, and
 * a snapshot would copy the whole tree only to be copied again into a
 * protobuf message. Callers see the nodes (struct bclient, btag, balloc,
 * chunk) and read their scalar fields; how the nodes are linked (lists,
 * maps, arrays) is the core's alone.
 *
 * Invariants:
 *   - walk_tree() visits every client that is not a tool (a tool holds
 *     nothing, and no consumer lists it) once, in the order clients were
 *     added; within a client its tags, in the order they were made; within
 *     a tag its allocations, newest first; within an allocation the chunks of its
 *     last lend in mapping order, a dropped one as NULL. Each node's _end
 *     hook runs after all of its children. That order is the state
 *     record's: it must not change, or a record's bytes do.
 *   - A walk that only reads (the const ones) must not change the broker
 *     from a callback; walk_clients() and walk_waiters() say what theirs
 *     may remove.
 *   - Every callback returns 0 to go on; anything else stops the walk,
 *     which returns it (a negative errno for a failure, a positive value
 *     for "found what I looked for").
 */
#ifndef GMB_WALK_H
#define GMB_WALK_H

#include <stdint.h>

#include "daemon/core/broker.h"

/* What walk_tree() and walk_client() call; NULL members are skipped, and a
 * level whose callbacks and whose children's callbacks are all NULL is not
 * visited at all. */
struct walk_ops {
	int (*client)(void *arg, const struct bclient *c);
	int (*tag)(void *arg, const struct btag *t);
	int (*alloc)(void *arg, const struct balloc *a);
	/* The @i-th chunk of @a's last lend; @ch NULL: dropped. */
	int (*chunk)(void *arg, const struct balloc *a, uint32_t i, const struct chunk *ch);
	int (*tag_end)(void *arg, const struct btag *t);
	int (*client_end)(void *arg, const struct bclient *c);
};

/**
 * walk_tree() - every client of @br that is not a tool, and below it what
 * @ops asks for, in the order above.
 * Return: 0 once all is visited, or the first nonzero callback result.
 */
int walk_tree(const struct broker *br, const struct walk_ops *ops, void *arg);

/**
 * walk_client() - @c (tool or not) and below it what @ops asks for, as
 * walk_tree() does for each client.
 * Return: 0, or the first nonzero callback result.
 */
int walk_client(const struct bclient *c, const struct walk_ops *ops, void *arg);

typedef int (*walk_chunk_fn)(void *arg, const struct chunk *ch);
/**
 * walk_chunks() - every chunk alive on any device, in the registry's order
 * (the state record's).
 * Return: 0, or the first nonzero result of @fn.
 */
int walk_chunks(const struct broker *br, walk_chunk_fn fn, void *arg);

typedef int (*walk_client_fn)(void *arg, struct bclient *c);
/**
 * walk_clients() - every client, tools too, in the order they were added,
 * to act on: @fn may change @c and may remove it (broker_client_remove(),
 * rejoin_reclaim()), no other client.
 * Return: 0, or the first nonzero result of @fn.
 */
int walk_clients(struct broker *br, walk_client_fn fn, void *arg);

typedef int (*walk_waiter_fn)(void *arg, const struct bwaiter *w);
/**
 * walk_waiters() - the requests waiting for memory, in serving order. @fn
 * may take @w out of the queue (its owner's business), no other waiter.
 * Return: 0, or the first nonzero result of @fn.
 */
int walk_waiters(const struct broker *br, walk_waiter_fn fn, void *arg);

#endif
