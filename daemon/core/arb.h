/*
 * arb.h - arbitration between clients (daemon/core/arb.c): groups,
 * priorities, switches that hand one client's chunks straight to the
 * next, and the choice of whom to preempt for a request waiting for
 * memory (the queue itself is wait.h's).
 *
 * Invariants (with broker.h's and pool.h's):
 *   - A client is in at most one switch (bclient.handover), on one side.
 *   - While a switch lasts, a free chunk whose handover mark is the
 *     switch's id is never released nor lent outside the switch; the
 *     marks end with it (arb_handover_end()), and the keep limit
 *     applies again.
 *   - Between users nothing is reserved: FROM's chunks are kept for TO only
 *     when some TO client has the same uid.
 *   - bclient.preempt_for is set only by arb_preempt_pick() and cleared
 *     only by arb_preempt_done(): a client is asked to pause for one
 *     waiting request at a time.
 *
 * Ownership: struct bhandover is the broker's from arb_handover_begin()
 * to arb_handover_end(); the client arrays filled here hold the
 * broker's clients, valid until its next call. @err (ERR_MSG_MAX bytes,
 * may be NULL) gets a sentence on failure.
 */
#ifndef GMB_ARB_H
#define GMB_ARB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/core/broker.h"

/**
 * arb_client_set() - @c's group (@group "" or NULL: none; copied,
 * truncated to WIRE_MAX_NAME), priority and whether gmbd may preempt it.
 * Waiting requests keep their place: wait_set_priority() moves them.
 * Return: nothing.
 */
void arb_client_set(struct bclient *c, const char *group, int priority, bool preemptible);
/**
 * arb_select() - the clients @sel names: one client (id, pid or unique
 * name, as broker_client_find()), else every client of group @sel ("@NAME"
 * names a group only). At most @max go to @out (the broker's).
 * Return: how many (>= 1); -ENOENT, -ENOTUNIQ or -E2BIG with @err saying why.
 */
int arb_select(struct broker *br, const char *sel, struct bclient **out, size_t max, char *err);

/* What a switch lent TO: straight from FROM's chunks, and newly made. */
struct broker_handover_stats {
	uint64_t handed_bytes, handed_chunks;
	uint64_t created_bytes, created_chunks;
};

/**
 * arb_handover_begin() - a switch from @from to @to starts: the chunks
 * FROM's pauses give back are reserved for it (never released, whatever
 * the keep limit, and lent to nobody else) when some TO client has the same
 * uid; TO's and FROM's own lends may use them. Each client is in at most
 * one switch. *@out belongs to the broker until arb_handover_end().
 * Return: 0; -EBUSY (a client is in another switch) or -ENOMEM, with @err.
 */
int arb_handover_begin(struct broker *br, struct bclient *const *from, size_t nfrom,
		       struct bclient *const *to, size_t nto, struct bhandover **out, char *err);
/**
 * arb_handover_end() - the switch is over: reservations end (the keep
 * limit applies again), @st (may be NULL) gets its figures, @h is freed.
 * Return: nothing.
 */
void arb_handover_end(struct broker *br, struct bhandover *h, struct broker_handover_stats *st);

/**
 * arb_preempt_pick() - whom to pause so that @w can be served: clients
 * of lower priority that accept control and opted into preemption, not in
 * a switch, not asked already, holding memory on @w->dev; lowest priority,
 * then most memory, first, until their memory covers @w->need. None when
 * even all of them would not. At most @max go to @out, each marked
 * preempt_for = @w->client->id (clear it with arb_preempt_done()).
 * Return: how many.
 */
size_t arb_preempt_pick(struct broker *br, const struct bwaiter *w, struct bclient **out,
			size_t max);
/**
 * arb_preempt_done() - @c's preemption is answered (or moot): it may be
 * picked again.
 * Return: nothing.
 */
void arb_preempt_done(struct bclient *c);

#endif
