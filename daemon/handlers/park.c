/*
 * park.c - requests waiting for memory: an alloc/resume the core answered
 * with -EAGAIN (memory returns once clients drop handles) waits here with
 * the handler that parked it, and is retried in arrival order after every
 * drop ack and every operation that frees memory (handlers__settle());
 * answered -ENOMEM at its deadline.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

/* A request waiting for memory that clients are dropping. */
struct hpark {
	struct sess *s;              /* reference held */
	Gmb__Envelope *env;          /* owned */
	handlers_fn fn;              /* the handler that parked it, to retry it */
	uint64_t deadline;           /* uv_now() milliseconds */
	uint64_t start_ns;     /* uv_hrtime() when the request arrived */
	char why[ERR_MSG_MAX];       /* the core's latest -EAGAIN sentence */
	struct hpark *prev, *next;
};

static void handlers_unpark(struct handlers *h, struct hpark *p);
static void handlers_park_arm(struct handlers *h);
static void handlers_on_park_timer(uv_timer_t *timer);
static void handlers_retry_parked(struct handlers *h);

/* Only alloc and resume park. */
static const char *handlers_park_name(const struct hpark *p)
{
	return p->env->body_case == GMB__ENVELOPE__BODY_RESUME ? "resume" : "alloc";
}

int handlers__park(struct hreq *rq, handlers_fn fn)
{
	struct handlers *h = rq->h;
	struct hpark *p;

	p = calloc(1, sizeof(*p));
	if (!p)
		return handlers__fail(rq, -ENOMEM, "%s; out of memory waiting for it", rq->err);
	p->s = sess_ref(rq->s);
	p->env = rq->env;
	p->fn = fn;
	p->deadline = uv_now(h->loop) + h->park_timeout_ms;
	p->start_ns = rq->start_ns;
	memcpy(p->why, rq->err, sizeof(p->why));
	p->prev = h->parked_tail;
	if (h->parked_tail)
		h->parked_tail->next = p;
	else
		h->parked = p;
	h->parked_tail = p;
	hconn_of(rq->s)->inflight++;
	log_debug("request parked " SESS_FMT " req=%" PRIu64 " why=\"%s\"", SESS_ARGS(rq->s),
		  rq->env->id, rq->err);
	handlers_park_arm(h);
	return 0;
}

static void handlers_unpark(struct handlers *h, struct hpark *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		h->parked = p->next;
	if (p->next)
		p->next->prev = p->prev;
	else
		h->parked_tail = p->prev;
	hconn_of(p->s)->inflight--;
	gmb__envelope__free_unpacked(p->env, NULL);
	sess_unref(p->s);
	free(p);
}

/* Deadlines come in arrival order: the first one is the earliest. */
static void handlers_park_arm(struct handlers *h)
{
	uint64_t now = uv_now(h->loop);

	if (h->closed)
		return;
	if (!h->parked) {
		uv_timer_stop(&h->park_timer);
		return;
	}
	uv_timer_start(&h->park_timer, handlers_on_park_timer,
		       h->parked->deadline > now ? h->parked->deadline - now : 0, 0);
}

static void handlers_on_park_timer(uv_timer_t *timer)
{
	struct handlers *h = timer->data;
	uint64_t now = uv_now(h->loop);

	while (h->parked && h->parked->deadline <= now) {
		struct hpark *p = h->parked;
		char msg[ERR_MSG_MAX];

		err_fmt(msg, 0, "%.400s; still waiting after %" PRIu64 " ms", p->why,
			h->park_timeout_ms);
		handlers__refused(h, p->s, handlers_park_name(p), -ENOMEM, msg);
		handlers__reply_status(p->s, p->env->id, -ENOMEM, msg);
		handlers_unpark(h, p);
	}
	handlers_park_arm(h);
}

/* In arrival order; a request still short of memory keeps its place. */
static void handlers_retry_parked(struct handlers *h)
{
	struct hpark *p, *next;

	for (p = h->parked; p; p = next) {
		struct hreq rq = { .h = h, .s = p->s, .env = p->env, .start_ns = p->start_ns };
		int r;

		/* Only this function, the park timer and handlers__park_cancel()
		 * unpark, so @next survives the handler. */
		next = p->next;
		if (p->s->state != SESS_OPEN)
			continue;
		r = p->fn(&rq);
		if (r == HANDLERS_PARK) {
			memcpy(p->why, rq.err, sizeof(p->why));
			continue;
		}
		if (r < 0) {
			handlers__refused(h, p->s, handlers_park_name(p), r, rq.err);
			handlers__reply_status(p->s, p->env->id, r, rq.err);
		}
		handlers_unpark(h, p);
	}
	handlers_park_arm(h);
}

void handlers__settle(struct handlers *h)
{
	broker_flush_drops(h->broker, handlers__send_drops, h);
	if (h->retrying || !h->parked)
		return;
	h->retrying = true;
	handlers_retry_parked(h);
	h->retrying = false;
	broker_flush_drops(h->broker, handlers__send_drops, h);
	handlers__changed(h);
}

void handlers__park_cancel(struct handlers *h, struct sess *s)
{
	struct hpark *p, *next;

	for (p = h->parked; p; p = next) {
		next = p->next;
		if (p->s == s)
			handlers_unpark(h, p);
	}
	handlers_park_arm(h);
}
