/*
 * orphans.c - clients restored from the previous gmbd that have not come
 * back: reclaimed (their memory back to the pool, one log line each) as
 * soon as their process is gone, and otherwise when the grace period after
 * the restart ends; a timer looks every second while any are left. One in
 * the middle of its claim past the grace period is hung up on.
 */
#include <inttypes.h>
#include <stdio.h>

#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/proc.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

#define HORPHANS_TICK_MS 1000

static void handlers_on_orphan_timer(uv_timer_t *t);

/*
 * Reclaims orphans whose process is gone, and all of them past @expired,
 * those in the middle of a claim too: a client that connected and then
 * hangs must not keep its memory lent for ever.
 */
static void handlers_orphans_check(struct handlers *h, bool expired)
{
	struct bclient *c, *next;
	char why[96];
	bool any = false;

	snprintf(why, sizeof(why), "it did not come back within %" PRIu64 " s",
		 h->orphan_grace_ms / 1000);
	for (c = h->broker->clients; c; c = next) {
		struct sess *s = c->orphan ? handlers_sess_of(h, c) : NULL;

		next = c->next;
		if (!c->orphan || (s && !expired))
			continue;
		if (s) {
			handlers__rejoin_gone(h, s);
			sess_doom(s, LOG_LVL_NOTICE, "its rejoin claim did not arrive within the"
				  " grace period");
		}
		if (!proc_alive(c->pid, c->start_time))
			broker_reclaim(h->broker, c, "its process is gone");
		else if (expired)
			broker_reclaim(h->broker, c, why);
		else
			continue;
		any = true;
	}
	if (any) {
		handlers__changed(h);
		handlers__settle(h);
	}
}

void handlers_orphans_start(struct handlers *h, uint64_t grace_ms)
{
	if (broker_orphans(h->broker) == 0)
		return;
	h->orphan_grace_ms = grace_ms;
	h->orphan_deadline = uv_now(h->loop) + grace_ms;
	handlers_orphans_check(h, false);
	if (broker_orphans(h->broker) > 0 && !h->closed)
		uv_timer_start(&h->orphan_timer, handlers_on_orphan_timer, HORPHANS_TICK_MS,
			       HORPHANS_TICK_MS);
}

static void handlers_on_orphan_timer(uv_timer_t *t)
{
	struct handlers *h = t->data;

	handlers_orphans_check(h, uv_now(h->loop) >= h->orphan_deadline);
	if (broker_orphans(h->broker) == 0)
		uv_timer_stop(t);
}
