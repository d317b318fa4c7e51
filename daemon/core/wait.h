/*
 * wait.h - the queue of requests waiting for memory (daemon/core/wait.c):
 * one list in serving order; the queue of a device is its entries of that
 * device.
 *
 * Invariants:
 *   - Serving order: higher priority first, then arrival (seq) among
 *     equals; a priority change moves a client's entries, keeping their
 *     arrival among equals.
 *   - An entry is linked (in br->waiters) exactly while linked is true; a
 *     client's entries leave when the client goes (broker_client_remove()).
 *
 * Ownership: the caller owns each struct bwaiter (the handlers keep it in
 * their parked request) and must take it out before freeing it; the
 * broker only links it. walk_waiters() (walk.h) goes over the queue.
 */
#ifndef GMB_WAIT_H
#define GMB_WAIT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/wire.h"
#include "daemon/core/broker.h"

enum {
	BROKER_WAIT_ALLOC = 1,
	BROKER_WAIT_RESUME = 2
};

/* A request waiting for memory; owned by the caller, linked by the broker. */
struct bwaiter {
	struct bclient *client;
	int kind; /* BROKER_WAIT_* */
	int dev;  /* the device it is short of */
	char tag[WIRE_MAX_NAME + 1];
	uint64_t need;		  /* bytes missing at the last try */
	uint64_t since, deadline; /* the caller's millisecond clock */
	bool preempt_asked;	  /* its preemption was tried already */
	void *owner;		  /* the caller's */
	/* The broker's: */
	uint64_t seq;
	bool linked;
	struct bwaiter *prev, *next;
};

/**
 * wait_add() - enters @w (client, kind, dev, ... set) in serving
 * order: higher priority first, then first come first served.
 * Return: nothing; it cannot fail.
 */
void wait_add(struct broker *br, struct bwaiter *w);
/**
 * wait_remove() - takes @w out (no-op when it is not in).
 * Return: nothing.
 */
void wait_remove(struct broker *br, struct bwaiter *w);
/**
 * wait_ahead() - does a request of another client, of @c's priority
 * or higher, wait for @dev already?
 * Return: true if one does.
 */
bool wait_ahead(const struct broker *br, const struct bclient *c, int dev);
/**
 * wait_set_priority() - @c's priority; its waiting requests take their
 * new place.
 * Return: nothing.
 */
void wait_set_priority(struct broker *br, struct bclient *c, int priority);

#endif
