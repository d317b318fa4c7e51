/*
 * arb.c - gmbd's core, part four: arbitration between clients. Groups (a
 * switch may name every client of one), priorities, switches that hand
 * FROM's chunks straight to TO, the queue of requests waiting for memory,
 * and the choice of whom to preempt for one of them.
 *
 * A switch (struct bhandover) only marks: while it lasts, FROM's pauses
 * leave their chunks free in the pool with chunk->handover set to the
 * switch's id (lend.c), which pool.c never releases nor lends to anyone
 * else, and TO's takes carry that id, so TO's resume picks those chunks up
 * (sending fds, never creating or zeroing) in the same step that lends them.
 * Between users nothing is reserved: another uid's chunks go through the
 * backend as for any request.
 *
 * The queue of requests waiting for memory is wait.c's, below this file
 * and broker.c alike.
 */
#include "common/list.h"
#include "daemon/core/broker_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

struct bhandover {
	uint64_t id;
	uid_t *to_uids; /* TO's users: FROM of those hands over */
	size_t nto_uids;
	struct broker_handover_stats st;
};

/* ---- groups and priorities ---- */

void arb_client_set(struct bclient *c, const char *group, int priority, bool preemptible)
{
	size_t len = group ? strnlen(group, WIRE_MAX_NAME) : 0;

	memcpy(c->group, group ? group : "", len);
	c->group[len] = '\0';
	c->priority = priority;
	c->preemptible = preemptible;
}

int arb_select(struct broker *br, const char *sel, struct bclient **out, size_t max, char *err)
{
	bool group_only = sel[0] == '@';
	const char *g = group_only ? sel + 1 : sel;
	struct broker_found f = { 0 };
	struct bclient *c = group_only ? NULL : broker_client_find(br, sel, &f);
	size_t n = 0;

	if (c && max >= 1) {
		out[0] = c;
		return 1;
	}
	/* None or several by that name: a group of that name, then. */
	for (c = br->clients; c; c = c->next) {
		if (c->tool || c->orphan || !g[0] || strcmp(c->group, g) != 0)
			continue;
		if (n == max)
			return err_fmt(err, -E2BIG, "group '%s' has more than %zu clients", g, max);
		out[n++] = c;
	}
	if (n > 0)
		return (int)n;
	return broker_found_err(&f, sel, true, err);
}

/* ---- switches ---- */

int arb_handover_begin(struct broker *br, struct bclient *const *from, size_t nfrom,
		       struct bclient *const *to, size_t nto, struct bhandover **out, char *err)
{
	struct bhandover *h;

	for (size_t i = 0; i < nfrom + nto; i++) {
		const struct bclient *c = i < nfrom ? from[i] : to[i - nfrom];

		if (c->handover)
			return err_fmt(err, -EBUSY, "client '%s' is part of another switch",
				       c->name);
	}
	h = calloc(1, sizeof(*h));
	if (!h || !(h->to_uids = calloc(nto ? nto : 1, sizeof(*h->to_uids)))) {
		free(h);
		return err_fmt(err, -ENOMEM, "out of memory starting a switch");
	}
	h->id = ++br->next_handover_id;
	for (size_t i = 0; i < nto; i++) {
		to[i]->handover = h;
		to[i]->handover_from = false;
		h->to_uids[h->nto_uids++] = to[i]->uid;
	}
	/* A client named on both sides is a FROM: its pause comes first. */
	for (size_t i = 0; i < nfrom; i++) {
		from[i]->handover = h;
		from[i]->handover_from = true;
	}
	*out = h;
	return 0;
}

void arb_handover_end(struct broker *br, struct bhandover *h, struct broker_handover_stats *st)
{
	if (!h)
		return;
	for (struct bclient *c = br->clients; c; c = c->next)
		if (c->handover == h)
			c->handover = NULL;
	/* What TO did not take is an ordinary free chunk again. */
	for (int d = 0; d < br->ndevices; d++) {
		struct pool *p = &br->pools[d];

		for (struct chunk *ch = p->free_head; ch; ch = ch->next)
			if (ch->handover == h->id)
				ch->handover = 0;
		pool_shrink(p, br->opts.pool_keep, NULL);
	}
	if (st)
		*st = h->st;
	free(h->to_uids);
	free(h);
}

uint64_t arb__handover_id(const struct bclient *c)
{
	return c->handover ? c->handover->id : 0;
}

bool arb__handover_keeps(const struct bclient *c)
{
	const struct bhandover *h = c->handover;

	if (!h || !c->handover_from)
		return false;
	for (size_t i = 0; i < h->nto_uids; i++)
		if (h->to_uids[i] == c->uid)
			return true;
	return false;
}

void arb__handover_took(struct pool *pool, struct bclient *c, const struct pool_take *t,
			uint64_t handed_bytes, uint32_t handed_chunks)
{
	struct bhandover *h = c->handover;
	uint32_t reused = t->nchunks - t->ncreated;

	if (!h)
		return;
	/* FROM taking its own chunks back (a rollback) hands nothing over. */
	if (!c->handover_from && handed_chunks) {
		h->st.handed_bytes += handed_bytes;
		h->st.handed_chunks += handed_chunks;
		pool->chunks_handed_over += handed_chunks;
	}
	for (uint32_t i = reused; i < t->nchunks; i++) {
		h->st.created_bytes += t->chunks[i]->size;
		h->st.created_chunks++;
	}
}

/* ---- preemption ---- */

static bool arb_preemptible(const struct bclient *c, const struct bwaiter *w)
{
	return c != w->client && !c->tool && !c->orphan && c->control && c->preemptible &&
	       !c->preempt_for && !c->handover && c->priority < w->client->priority &&
	       broker__active_bytes(c, w->dev) > 0;
}

/* The next victim: lowest priority, then most memory on the device. */
static struct bclient *arb_preempt_next(struct broker *br, const struct bwaiter *w,
					struct bclient *const *taken, size_t ntaken)
{
	struct bclient *best = NULL;
	uint64_t best_bytes = 0;

	for (struct bclient *c = br->clients; c; c = c->next) {
		uint64_t bytes;
		bool seen = false;

		for (size_t i = 0; i < ntaken; i++)
			seen |= taken[i] == c;
		if (seen || !arb_preemptible(c, w))
			continue;
		bytes = broker__active_bytes(c, w->dev);
		if (!best || c->priority < best->priority ||
		    (c->priority == best->priority && bytes > best_bytes)) {
			best = c;
			best_bytes = bytes;
		}
	}
	return best;
}

size_t arb_preempt_pick(struct broker *br, const struct bwaiter *w, struct bclient **out,
			size_t max)
{
	uint64_t covered = 0;
	size_t n = 0;
	struct bclient *c;

	while (covered < w->need && n < max && (c = arb_preempt_next(br, w, out, n))) {
		out[n++] = c;
		covered += broker__active_bytes(c, w->dev);
	}
	if (covered < w->need)
		return 0; /* pausing them all would not serve it: pause nobody */
	for (size_t i = 0; i < n; i++)
		out[i]->preempt_for = w->client->id;
	return n;
}

void arb_preempt_done(struct bclient *c)
{
	c->preempt_for = 0;
}
