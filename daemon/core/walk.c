/*
 * walk.c - the visitors of walk.h: the only code that follows the broker's
 * links on behalf of callers outside daemon/core/.
 *
 * Each walk takes the next node before it calls back, so that a callback
 * allowed to remove the node it was handed (walk_clients(), walk_waiters())
 * leaves the walk on solid ground.
 */
#include "daemon/core/wait.h"
#include "daemon/core/walk.h"

#include <stddef.h>

#include "common/idmap.h"

static int walk_alloc(const struct balloc *a, const struct walk_ops *ops, void *arg)
{
	int r = ops->alloc ? ops->alloc(arg, a) : 0;

	for (uint32_t i = 0; r == 0 && ops->chunk && i < a->nchunks; i++)
		r = ops->chunk(arg, a, i, a->chunks[i]);
	return r;
}

static int walk_tag(const struct btag *t, const struct walk_ops *ops, void *arg)
{
	bool deeper = ops->alloc || ops->chunk;
	int r = ops->tag ? ops->tag(arg, t) : 0;

	for (const struct balloc *a = t->allocs; r == 0 && deeper && a; a = a->next)
		r = walk_alloc(a, ops, arg);
	if (r == 0 && ops->tag_end)
		r = ops->tag_end(arg, t);
	return r;
}

int walk_client(const struct bclient *c, const struct walk_ops *ops, void *arg)
{
	bool deeper = ops->tag || ops->tag_end || ops->alloc || ops->chunk;
	int r = ops->client ? ops->client(arg, c) : 0;

	for (const struct btag *t = c->tags; r == 0 && deeper && t; t = t->next)
		r = walk_tag(t, ops, arg);
	if (r == 0 && ops->client_end)
		r = ops->client_end(arg, c);
	return r;
}

int walk_tree(const struct broker *br, const struct walk_ops *ops, void *arg)
{
	int r = 0;

	for (const struct bclient *c = br->clients; r == 0 && c; c = c->next)
		if (!c->tool)
			r = walk_client(c, ops, arg);
	return r;
}

int walk_chunks(const struct broker *br, walk_chunk_fn fn, void *arg)
{
	struct chunk *ch;
	size_t it = 0;
	int r = 0;

	while (r == 0 && idmap_next(&br->chunks, &it, NULL, (void **)&ch))
		r = fn(arg, ch);
	return r;
}

int walk_clients(struct broker *br, walk_client_fn fn, void *arg)
{
	struct bclient *c, *next;
	int r = 0;

	for (c = br->clients; r == 0 && c; c = next) {
		next = c->next;
		r = fn(arg, c);
	}
	return r;
}

int walk_waiters(const struct broker *br, walk_waiter_fn fn, void *arg)
{
	const struct bwaiter *w, *next;
	int r = 0;

	for (w = br->waiters; r == 0 && w; w = next) {
		next = w->next;
		r = fn(arg, w);
	}
	return r;
}
