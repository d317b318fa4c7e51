/*
 * wait.c - gmbd's core: the queue of requests waiting for memory. One list
 * in serving order (priority, then arrival); the queue of a device is its
 * entries of that device. The handlers own the entries (struct bwaiter in
 * their parked request) and retry them; the core only keeps the order, and
 * forgets a client's entries when the client goes (broker.c) or its
 * priority changes.
 */
#include "common/list.h"
#include "daemon/core/broker_internal.h"

#include <stdbool.h>

#include "common/log.h"

/* Does @a come before @b in serving order? */
static bool wait_before(const struct bwaiter *a, const struct bwaiter *b)
{
	if (a->client->priority != b->client->priority)
		return a->client->priority > b->client->priority;
	return a->seq < b->seq;
}

static void wait_insert(struct broker *br, struct bwaiter *w)
{
	struct bwaiter *pos = br->waiters, *prev = NULL;

	while (pos && wait_before(pos, w)) {
		prev = pos;
		pos = pos->next;
	}
	w->prev = prev;
	w->next = pos;
	if (pos)
		pos->prev = w;
	if (prev)
		prev->next = w;
	else
		br->waiters = w;
	w->linked = true;
}

void wait_add(struct broker *br, struct bwaiter *w)
{
	w->seq = ++br->next_wait_seq;
	wait_insert(br, w);
	log_debug("request waits client=%s kind=%s dev=%d need=%llu priority=%d", w->client->name,
		  w->kind == BROKER_WAIT_ALLOC ? "alloc" : "resume", w->dev,
		  (unsigned long long)w->need, w->client->priority);
}

void wait_remove(struct broker *br, struct bwaiter *w)
{
	if (!w->linked)
		return;
	DLIST_UNLINK(br->waiters, w);
	w->linked = false;
}

bool wait_ahead(const struct broker *br, const struct bclient *c, int dev)
{
	for (const struct bwaiter *w = br->waiters; w; w = w->next)
		if (w->dev == dev && w->client != c && w->client->priority >= c->priority)
			return true;
	return false;
}

void wait_set_priority(struct broker *br, struct bclient *c, int priority)
{
	struct bwaiter *mine = NULL, *w, *next;

	c->priority = priority;
	/* Out in order, back in order: seq keeps arrival among equals. */
	for (w = br->waiters; w; w = next) {
		next = w->next;
		if (w->client != c)
			continue;
		DLIST_UNLINK(br->waiters, w);
		w->next = mine;
		mine = w;
	}
	for (w = mine; w; w = next) {
		next = w->next;
		wait_insert(br, w);
	}
}

void wait__forget(struct broker *br, struct bclient *c)
{
	struct bwaiter *w, *next;

	for (w = br->waiters; w; w = next) {
		next = w->next;
		if (w->client == c)
			wait_remove(br, w);
	}
}
