/*
 * orphans.c - clients restored from the previous gmbd, or whose connection
 * gmbd ended while their process lived, that have not come back: reclaimed
 * (their memory back to the pool, one log line each) as soon as their
 * process is gone, and otherwise when their grace period ends (from the
 * restart, or from the hang-up); a timer looks every second while any are
 * left. One in
 * the middle of its claim past the grace period is hung up on.
 */
#include <inttypes.h>
#include <stdio.h>

#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/proc.h"
#include "daemon/core/rejoin.h"
#include "daemon/core/walk.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

#define HORPHANS_TICK_MS 1000

static void handlers_on_orphan_timer(uv_timer_t *t);

/* What one look at the orphans needs: the handlers, the time, the sentence. */
struct horphans_check {
	struct handlers *h;
	uint64_t now;
	char why[96];
	bool any;
};

/*
 * Reclaims @c if it is an orphan whose process is gone, or one past its
 * deadline, in the middle of a claim too: a client that connected and
 * then hangs must not keep its memory lent for ever.
 */
static int handlers_orphan_check(void *arg, struct bclient *c)
{
	struct horphans_check *k = arg;
	struct handlers *h = k->h;
	struct sess *s = c->orphan ? handlers_sess_of(h, c) : NULL;
	bool expired = k->now >= c->orphan_deadline;

	if (!c->orphan || (s && !expired))
		return 0;
	if (s) {
		handlers__rejoin_gone(h, s);
		sess_doom(s, LOG_LVL_NOTICE,
			  "its rejoin claim did not arrive within the"
			  " grace period");
	}
	if (!proc_alive(c->pid, c->start_time))
		rejoin_reclaim(h->broker, c, "its process is gone");
	else if (expired)
		rejoin_reclaim(h->broker, c, k->why);
	else
		return 0;
	k->any = true;
	return 0;
}

static void handlers_orphans_check(struct handlers *h)
{
	struct horphans_check k = { .h = h, .now = uv_now(h->loop) };

	snprintf(k.why, sizeof(k.why), "it did not come back within %" PRIu64 " s",
		 h->orphan_grace_ms / 1000);
	walk_clients(h->broker, handlers_orphan_check, &k);
	if (k.any) {
		handlers__changed(h);
		handlers__settle(h);
	}
}

/* The timer runs while any orphan is left. */
static void handlers_orphans_tick(struct handlers *h)
{
	if (broker_orphans(h->broker) > 0 && !h->closed &&
	    !uv_is_active((uv_handle_t *)&h->orphan_timer))
		uv_timer_start(&h->orphan_timer, handlers_on_orphan_timer, HORPHANS_TICK_MS,
			       HORPHANS_TICK_MS);
}

static int handlers_orphan_deadline(void *arg, struct bclient *c)
{
	if (c->orphan)
		c->orphan_deadline = *(const uint64_t *)arg;
	return 0;
}

void handlers_orphans_start(struct handlers *h, uint64_t grace_ms)
{
	uint64_t until = uv_now(h->loop) + grace_ms;

	h->orphan_grace_ms = grace_ms;
	walk_clients(h->broker, handlers_orphan_deadline, &until);
	if (broker_orphans(h->broker) == 0)
		return;
	handlers_orphans_check(h);
	handlers_orphans_tick(h);
}

void handlers__orphan_watch(struct handlers *h, struct bclient *c)
{
	c->orphan_deadline = uv_now(h->loop) + h->orphan_grace_ms;
	handlers_orphans_tick(h);
}

static void handlers_on_orphan_timer(uv_timer_t *t)
{
	struct handlers *h = t->data;

	handlers_orphans_check(h);
	if (broker_orphans(h->broker) == 0)
		uv_timer_stop(t);
}
