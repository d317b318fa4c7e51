/*
 * park.c - requests waiting for memory: an alloc/resume the core answered
 * with -EAGAIN (memory returns once clients drop handles), or with -ENOMEM
 * when the caller said it may wait (wait_ms), waits here with the handler
 * that parked it. Its place is the core's waiting queue (struct bwaiter:
 * priority, then arrival); after every drop ack and every operation that
 * frees memory (handlers__settle()) the queue is retried in that order,
 * and a request still short of a device's memory blocks those behind it
 * on that device, so that memory coming back goes to the first in line.
 * A request that may wait and is short may have gmbd preempt clients of
 * lower priority for it (once). At its deadline it is answered -ENOMEM
 * with the core's latest sentence, which names the holders.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "daemon/core/arb.h"
#include "daemon/core/broker.h"
#include "daemon/core/wait.h"
#include "daemon/core/walk.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

#define HPARK_MAX_VICTIMS 64

/* A request waiting for memory. */
struct hpark {
	struct bwaiter w;      /* its place in the broker's queue; w.owner = this */
	struct sess *s;	       /* reference held */
	Gmb__Envelope *env;    /* owned */
	handlers_fn fn;	       /* the handler that parked it, to retry it */
	bool may_wait;	       /* the caller gave a wait: -ENOMEM keeps it */
	char why[ERR_MSG_MAX]; /* the core's latest sentence */
	uint64_t start_ns;     /* uv_hrtime() when the request arrived */
};

static void handlers_unpark(struct handlers *h, struct hpark *p);
static void handlers_park_arm(struct handlers *h);
static void handlers_on_park_timer(uv_timer_t *timer);
static void handlers_retry_parked(struct handlers *h);
static void handlers_park_preempt(struct handlers *h, struct hpark *p);

/* What the handler said about its shortage, into the waiter. */
static void handlers_park_note(struct hpark *p, const struct hreq *rq)
{
	p->w.dev = rq->short_dev;
	p->w.need = rq->short_bytes;
	memcpy(p->why, rq->err, sizeof(p->why));
}

/* Only alloc and resume park. */
static const char *handlers_park_name(const struct hpark *p)
{
	return p->env->body_case == GMB__ENVELOPE__BODY_RESUME ? "resume" : "alloc";
}

int handlers__park(struct hreq *rq, handlers_fn fn)
{
	struct handlers *h = rq->h;
	uint64_t now = uv_now(h->loop), wait;
	struct hpark *p;

	p = calloc(1, sizeof(*p));
	if (!p)
		return handlers__fail(rq, -ENOMEM, "%s; out of memory waiting for it", rq->err);
	/* Drops come back quickly; a caller's wait may be longer than that. */
	wait = rq->wait_ms > h->park_timeout_ms || !rq->drops ? rq->wait_ms : h->park_timeout_ms;
	p->s = sess_ref(rq->s);
	p->env = rq->env;
	p->fn = fn;
	p->may_wait = rq->wait_ms > 0;
	p->w = (struct bwaiter){ .client = hconn_of(rq->s)->client,
				 .kind = rq->wait_kind,
				 .since = now,
				 .deadline = now + wait,
				 .owner = p };
	snprintf(p->w.tag, sizeof(p->w.tag), "%s", rq->wait_tag ? rq->wait_tag : "");
	handlers_park_note(p, rq);
	wait_add(h->broker, &p->w);
	h->nparked++;
	p->start_ns = rq->start_ns;
	hconn_of(rq->s)->inflight++;
	log_debug("request parked " SESS_FMT " req=%" PRIu64 " wait_ms=%" PRIu64 " why=\"%s\"",
		  SESS_ARGS(rq->s), rq->env->id, wait, rq->err);
	handlers_park_preempt(h, p);
	handlers_park_arm(h);
	return 0;
}

static void handlers_unpark(struct handlers *h, struct hpark *p)
{
	wait_remove(h->broker, &p->w);
	h->nparked--;
	hconn_of(p->s)->inflight--;
	gmb__envelope__free_unpacked(p->env, NULL);
	sess_unref(p->s);
	free(p);
}

/* What a walk of the waiting queue carries: the handlers, and each walk's own. */
struct hpark_walk {
	struct handlers *h;
	uint64_t now;	  /* park timer: the time; arm: the earliest deadline */
	uint64_t blocked; /* retry: devices a request still waits for */
	const struct sess *s;
};

static int handlers_park_first(void *arg, const struct bwaiter *w)
{
	struct hpark_walk *k = arg;

	if (w->deadline < k->now)
		k->now = w->deadline;
	return 0;
}

/* The earliest deadline of the queue (deadlines differ: each caller's wait). */
static void handlers_park_arm(struct handlers *h)
{
	uint64_t now = uv_now(h->loop);
	struct hpark_walk k = { .h = h, .now = UINT64_MAX };

	if (h->closed)
		return;
	walk_waiters(h->broker, handlers_park_first, &k);
	if (k.now == UINT64_MAX) {
		uv_timer_stop(&h->park_timer);
		return;
	}
	uv_timer_start(&h->park_timer, handlers_on_park_timer, k.now > now ? k.now - now : 0, 0);
}

static int handlers_park_expire(void *arg, const struct bwaiter *w)
{
	struct hpark_walk *k = arg;
	struct hpark *p = w->owner;
	uint64_t now = k->now;
	char msg[ERR_MSG_MAX];

	if (w->deadline > now)
		return 0;
	if (p->may_wait)
		err_fmt(msg, 0, "%.400s; waited %" PRIu64 " ms", p->why, now - w->since);
	else
		err_fmt(msg, 0, "%.400s; still waiting after %" PRIu64 " ms", p->why,
			now - w->since);
	log_info("wait expired " SESS_FMT " req=%" PRIu64 " waited_ms=%" PRIu64, SESS_ARGS(p->s),
		 p->env->id, now - w->since);
	handlers__refused(k->h, p->s, handlers_park_name(p), -ENOMEM, msg);
	handlers__reply_status(p->s, p->env->id, -ENOMEM, msg);
	handlers_unpark(k->h, p);
	return 0;
}

static void handlers_on_park_timer(uv_timer_t *timer)
{
	struct handlers *h = timer->data;
	struct hpark_walk k = { .h = h, .now = uv_now(h->loop) };

	walk_waiters(h->broker, handlers_park_expire, &k);
	handlers_park_arm(h);
}

/*
 * In serving order. A request still short of device d keeps its place and
 * blocks every request behind it on d (first come, first served within a
 * priority, and no lower priority first); one short for drops only too.
 * Only this walk, the park timer and handlers__park_cancel() unpark, and a
 * handler never parks anew on a retry: the walk's next waiter survives the
 * handler.
 */
static int handlers_park_retry(void *arg, const struct bwaiter *w)
{
	struct hpark_walk *k = arg;
	struct hpark *p = w->owner;
	struct hreq rq = { .h = k->h,
			   .s = p->s,
			   .env = p->env,
			   .retry = true,
			   .short_dev = -1,
			   .start_ns = p->start_ns };
	int r;

	if (p->s->state != SESS_OPEN)
		return 0;
	if (w->dev >= 0 && w->dev < 64 && (k->blocked & (1ULL << w->dev)))
		return 0;
	r = p->fn(&rq);
	if (r == HANDLERS_PARK) {
		handlers_park_note(p, &rq);
		if (w->dev >= 0 && w->dev < 64)
			k->blocked |= 1ULL << w->dev;
		handlers_park_preempt(k->h, p);
		return 0;
	}
	if (r < 0) {
		handlers__refused(k->h, p->s, handlers_park_name(p), r, rq.err);
		handlers__reply_status(p->s, p->env->id, r, rq.err);
	}
	handlers_unpark(k->h, p);
	return 0;
}

static void handlers_retry_parked(struct handlers *h)
{
	struct hpark_walk k = { .h = h };

	walk_waiters(h->broker, handlers_park_retry, &k);
	handlers_park_arm(h);
}

/* Once per request that may wait and is short: pause lower priorities for it. */
static void handlers_park_preempt(struct handlers *h, struct hpark *p)
{
	struct bclient *victims[HPARK_MAX_VICTIMS];
	size_t n;

	if (!p->may_wait || p->w.preempt_asked || p->w.dev < 0 || p->w.need == 0)
		return;
	p->w.preempt_asked = true;
	n = arb_preempt_pick(h->broker, &p->w, victims, HPARK_MAX_VICTIMS);
	for (size_t i = 0; i < n; i++)
		handlers__send_preempt(h, victims[i], p->w.client, p->w.dev, p->w.need);
}

void handlers__settle(struct handlers *h)
{
	/* A pause that waited for importers gives memory to those below. */
	handlers__ipc_retry(h);
	broker_flush_drops(h->broker, handlers__send_drops, h);
	if (h->retrying || !h->nparked)
		return;
	h->retrying = true;
	handlers_retry_parked(h);
	h->retrying = false;
	broker_flush_drops(h->broker, handlers__send_drops, h);
	handlers__changed(h);
}

static int handlers_park_cancel_one(void *arg, const struct bwaiter *w)
{
	struct hpark_walk *k = arg;
	struct hpark *p = w->owner;

	if (p->s == k->s)
		handlers_unpark(k->h, p);
	return 0;
}

void handlers__park_cancel(struct handlers *h, struct sess *s)
{
	struct hpark_walk k = { .h = h, .s = s };

	walk_waiters(h->broker, handlers_park_cancel_one, &k);
	handlers_park_arm(h);
}
