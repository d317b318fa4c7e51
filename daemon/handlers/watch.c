/*
 * watch.c - events (daemon/core/event.h) to whoever listens: the sessions
 * that sent a WatchRequest, as WatchEvent notices, and the handlers'
 * on_event (gmbd: the metrics). Also the one place a refused request is
 * logged, so that every refusal leaves a line and an event.
 *
 * A watcher never slows gmbd: an event is queued on its session like any
 * packet, and a watcher with more than HANDLERS_WATCH_MAX_PACKETS or
 * HANDLERS_WATCH_MAX_BYTES queued gets one last event ("dropped") and is
 * disconnected. Any client may watch, as any may ask for the status: the
 * events say what status says, as it happens.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"
#include "include/gmb.h"

static void handlers_watch_send(struct handlers *h, struct sess *s, const struct event *ev);
static void handlers_watch_drain(struct handlers *h, struct sess *s);

/* A watcher dropped for falling behind: its queue (the last event at its
 * end) may still drain; it is disconnected once it has, or after
 * HANDLERS_WATCH_DRAIN_MS. */
struct hdrain {
	uv_timer_t timer;  /* frees the struct on close */
	struct sess *s;	   /* reference held */
	uint64_t deadline; /* uv_now() ms */
};

#define HANDLERS_WATCH_DRAIN_MS	     10000
#define HANDLERS_WATCH_DRAIN_TICK_MS 50
static void handlers_watch_remove(struct handlers *h, size_t i);

int handlers__watch(struct hreq *rq)
{
	struct handlers *h = rq->h;
	struct hconn *hc = hconn_of(rq->s);
	struct event ev = EVENT_INIT(EVENT_SUBSCRIBED);
	char detail[96];

	if (hc->watching)
		return handlers__fail(rq, -EALREADY, "this connection watches already");
	if (h->nwatchers >= HANDLERS_MAX_WATCHERS)
		return handlers__fail(rq, -EBUSY, "gmbd has %d watchers, the most it serves",
				      HANDLERS_MAX_WATCHERS);
	if (h->nwatchers == h->cap_watchers) {
		size_t cap = h->cap_watchers ? 2 * h->cap_watchers : 4;
		struct sess **v = realloc(h->watchers, cap * sizeof(*v));

		if (!v)
			return handlers__fail(rq, -ENOMEM, "out of memory for a watcher");
		h->watchers = v;
		h->cap_watchers = cap;
	}
	h->watchers[h->nwatchers++] = sess_ref(rq->s);
	hc->watching = true;
	log_debug("watcher subscribed " SESS_FMT, SESS_ARGS(rq->s));
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	snprintf(detail, sizeof(detail), "gmbd %s pid %d", GMB_VERSION, (int)getpid());
	ev.detail = detail;
	ev.pid = getpid();
	ev.time_ns = 0;
	handlers__emit_to(h, rq->s, &ev);
	return 0;
}

void handlers__watch_gone(struct handlers *h, struct sess *s)
{
	if (!hconn_of(s)->watching)
		return;
	for (size_t i = 0; i < h->nwatchers; i++)
		if (h->watchers[i] == s) {
			handlers_watch_remove(h, i);
			break;
		}
}

static void handlers_watch_remove(struct handlers *h, size_t i)
{
	struct sess *s = h->watchers[i];

	hconn_of(s)->watching = false;
	h->watchers[i] = h->watchers[--h->nwatchers];
	sess_unref(s);
	if (h->nwatchers == 0) {
		free(h->watchers);
		h->watchers = NULL;
		h->cap_watchers = 0;
	}
}

static uint64_t handlers_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void handlers__emit_to(struct handlers *h, struct sess *s, struct event *ev)
{
	if (!ev->time_ns)
		ev->time_ns = handlers_now_ns();
	handlers_watch_send(h, s, ev);
}

void handlers__emit(struct handlers *h, struct event *ev)
{
	if (!ev->time_ns)
		ev->time_ns = handlers_now_ns();
	if (h->on_event)
		h->on_event(h->event_arg, ev);
	/* Backwards: a watcher dropped on the way is swapped with the last. */
	for (size_t i = h->nwatchers; i-- > 0;)
		handlers_watch_send(h, h->watchers[i], ev);
}

static void handlers_watch_fill(Gmb__WatchEvent *we, const struct event *ev)
{
	we->kind = (char *)event_kind_name(ev->kind);
	we->time_ns = ev->time_ns;
	we->client_id = ev->client_id;
	we->client = (char *)(ev->client ? ev->client : "");
	we->pid = (int32_t)ev->pid;
	we->tag = (char *)(ev->tag ? ev->tag : "");
	we->device = ev->device;
	we->bytes = ev->bytes;
	we->duration_ns = ev->duration_ns;
	we->reason = (char *)(ev->kind == EVENT_REFUSED ? event_reason_name(ev->reason) : "");
	we->detail = (char *)(ev->detail ? ev->detail : "");
	we->request = (char *)(ev->request ? ev->request : "");
	we->status = ev->status;
	we->actor = (char *)(ev->actor ? ev->actor : "");
}

/* One event to @s, or the last one ("dropped") when @s fell behind. */
static void handlers_watch_send(struct handlers *h, struct sess *s, const struct event *ev)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__WatchEvent we = GMB__WATCH_EVENT__INIT;
	struct event last = EVENT_INIT(EVENT_DROPPED);
	bool behind = s->out_count >= HANDLERS_WATCH_MAX_PACKETS ||
		      s->out_bytes >= HANDLERS_WATCH_MAX_BYTES;
	size_t queued = s->out_count;

	if (s->state != SESS_OPEN)
		return;
	if (behind) {
		last.time_ns = ev->time_ns;
		last.detail = "this watcher fell behind gmbd's events and is disconnected";
		ev = &last;
	}
	handlers_watch_fill(&we, ev);
	env.body_case = GMB__ENVELOPE__BODY_WATCH_EVENT;
	env.watch_event = &we;
	sess_send(s, &env);
	if (behind) {
		log_notice("watcher fell behind, dropped " SESS_FMT " queued=%zu", SESS_ARGS(s),
			   queued);
		handlers__watch_gone(h, s);
		handlers_watch_drain(h, s);
	}
}

static void handlers_on_drain_closed(uv_handle_t *handle)
{
	struct hdrain *d = handle->data;

	sess_unref(d->s);
	free(d);
}

static void handlers_on_drain_tick(uv_timer_t *t)
{
	struct hdrain *d = t->data;

	if (d->s->state == SESS_OPEN && d->s->out_count && uv_now(t->loop) < d->deadline)
		return;
	sess_doom(d->s, LOG_LVL_INFO, "dropped watcher disconnected queued=%u", d->s->out_count);
	uv_timer_stop(t);
	uv_close((uv_handle_t *)t, handlers_on_drain_closed);
}

/* Nothing more is sent to @s; it goes once its queue is out. */
static void handlers_watch_drain(struct handlers *h, struct sess *s)
{
	struct hdrain *d = calloc(1, sizeof(*d));

	if (!d || h->closed) {
		free(d);
		sess_doom(s, LOG_LVL_INFO, "dropped watcher disconnected");
		return;
	}
	d->s = sess_ref(s);
	d->deadline = uv_now(h->loop) + HANDLERS_WATCH_DRAIN_MS;
	uv_timer_init(h->loop, &d->timer);
	d->timer.data = d;
	uv_timer_start(&d->timer, handlers_on_drain_tick, HANDLERS_WATCH_DRAIN_TICK_MS,
		       HANDLERS_WATCH_DRAIN_TICK_MS);
}

void handlers__event_client(struct event *ev, const struct sess *s, const struct bclient *c)
{
	ev->client_id = c ? c->id : s->client_id;
	ev->client = c ? c->name : s->name;
	ev->pid = c ? c->pid : s->pid;
	ev->uid = c ? c->uid : s->uid;
}

void handlers__refused(struct handlers *h, struct sess *s, const char *request, int status,
		       const char *err)
{
	struct event ev = EVENT_INIT(EVENT_REFUSED);
	const char *why = err && *err ? err : strerror(-status);
	char q[ERR_MSG_MAX + 16];

	ev.reason = event_reason_of(status);
	log_info("request refused " SESS_FMT " request=%s reason=%s status=%d error=%s",
		 SESS_ARGS(s), request, event_reason_name(ev.reason), status,
		 log_quote(why, q, sizeof(q)));
	handlers__event_client(&ev, s, hconn_of(s)->client);
	ev.request = request;
	ev.status = status;
	ev.detail = why;
	handlers__emit(h, &ev);
}
