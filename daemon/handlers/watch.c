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
 *
 * Except while replies are held (sess_held(): the state record is not
 * stored): then nothing leaves, so a full queue is gmbd's doing, not the
 * watcher's. Events past the bound are counted instead of queued
 * (hconn.watch_missed), and once the hold is over and the queue is down to
 * HANDLERS_WATCH_ROOM_*, the watcher gets one "missed" event with the
 * count, then events as before. Until then later events are counted too,
 * so that the gap is where the "missed" event is. The watch timer looks
 * at such watchers every HANDLERS_WATCH_TICK_MS, since the end of a hold
 * or a drained queue brings no event; a watcher that has no room
 * HANDLERS_WATCH_DRAIN_MS after the hold did not read what gmbd sent and
 * is dropped as one that fell behind.
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
static void handlers_watch_drop(struct handlers *h, struct sess *s, uint64_t time_ns);
static void handlers_watch_drain(struct handlers *h, struct sess *s);
static bool handlers_watch_catch_up(struct handlers *h, struct sess *s);
static void handlers_on_watch_tick(uv_timer_t *t);

/* A watcher dropped for falling behind: its queue (the last event at its
 * end) may still drain; it is disconnected once it has, or after
 * HANDLERS_WATCH_DRAIN_MS. */
struct hdrain {
	uv_timer_t timer;  /* frees the struct on close */
	struct sess *s;	   /* reference held */
	uint64_t deadline; /* uv_now() ms */
};

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
	hconn_of(s)->watch_missed = 0;
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
	we->count = ev->count;
}

static void handlers_watch_put(struct sess *s, const struct event *ev)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__WatchEvent we = GMB__WATCH_EVENT__INIT;

	handlers_watch_fill(&we, ev);
	env.body_case = GMB__ENVELOPE__BODY_WATCH_EVENT;
	env.watch_event = &we;
	sess_send(s, &env);
}

/*
 * One event to @s; counted instead while it missed events (held, or not
 * caught up since), or when its queue is full while held; or the last one
 * ("dropped") when @s fell behind.
 */
static void handlers_watch_send(struct handlers *h, struct sess *s, const struct event *ev)
{
	struct hconn *hc = hconn_of(s);
	bool behind = s->out_count >= HANDLERS_WATCH_MAX_PACKETS ||
		      s->out_bytes >= HANDLERS_WATCH_MAX_BYTES;

	if (s->state != SESS_OPEN)
		return;
	if (hc->watch_missed) {
		if (handlers_watch_catch_up(h, s)) {
			hc->watch_missed++;
			return;
		}
		if (!hc->watching || s->state != SESS_OPEN)
			return; /* dropped on the way */
		behind = s->out_count >= HANDLERS_WATCH_MAX_PACKETS ||
			 s->out_bytes >= HANDLERS_WATCH_MAX_BYTES;
	}
	if (behind && sess_held(s)) {
		log_notice("replies held, events past the watch bound are counted " SESS_FMT
			   " queued=%u",
			   SESS_ARGS(s), s->out_count);
		hc->watch_missed = 1;
		hc->watch_missed_by = 0;
		if (!uv_is_active((uv_handle_t *)&h->watch_timer) && !h->closed)
			uv_timer_start(&h->watch_timer, handlers_on_watch_tick,
				       HANDLERS_WATCH_TICK_MS, HANDLERS_WATCH_TICK_MS);
		return;
	}
	if (behind) {
		handlers_watch_drop(h, s, ev->time_ns);
		return;
	}
	handlers_watch_put(s, ev);
}

/* @s fell behind: one last event past its bound, then it goes. */
static void handlers_watch_drop(struct handlers *h, struct sess *s, uint64_t time_ns)
{
	struct event last = EVENT_INIT(EVENT_DROPPED);
	uint32_t queued = s->out_count;

	last.time_ns = time_ns;
	last.detail = "this watcher fell behind gmbd's events and is disconnected";
	handlers_watch_put(s, &last);
	log_notice("watcher fell behind, dropped " SESS_FMT " queued=%u", SESS_ARGS(s), queued);
	handlers__watch_gone(h, s);
	handlers_watch_drain(h, s);
}

/*
 * Watcher @s missed events: once replies are no longer held and its queue
 * has room, it is told how many and the count starts again; without room
 * by watch_missed_by, it is dropped. Return: true while it still misses
 * events (held, or no room yet), false once told or dropped.
 */
static bool handlers_watch_catch_up(struct handlers *h, struct sess *s)
{
	struct hconn *hc = hconn_of(s);
	struct event ev = EVENT_INIT(EVENT_MISSED);
	uint64_t now = uv_now(h->loop);

	if (sess_held(s)) {
		hc->watch_missed_by = 0;
		return true;
	}
	if (!hc->watch_missed_by)
		hc->watch_missed_by = now + HANDLERS_WATCH_DRAIN_MS;
	if (s->out_count > HANDLERS_WATCH_ROOM_PACKETS ||
	    s->out_bytes > HANDLERS_WATCH_ROOM_BYTES) {
		if (now < hc->watch_missed_by)
			return true;
		hc->watch_missed = 0;
		handlers_watch_drop(h, s, handlers_now_ns());
		return false;
	}
	ev.time_ns = handlers_now_ns();
	ev.count = hc->watch_missed;
	ev.detail = "gmbd could not store its state record and held its replies, so these "
		    "events were not sent to this watcher: re-read the status";
	log_notice("watcher told of the events it missed while replies were held " SESS_FMT
		   " missed=%" PRIu64,
		   SESS_ARGS(s), hc->watch_missed);
	hc->watch_missed = 0;
	handlers_watch_put(s, &ev);
	return false;
}

/* Watchers that missed events, until none does. */
static void handlers_on_watch_tick(uv_timer_t *t)
{
	struct handlers *h = t->data;
	bool pending = false;

	/* Backwards: a watcher dropped on the way is swapped with the last. */
	for (size_t i = h->nwatchers; i-- > 0;) {
		struct sess *s = h->watchers[i];

		if (!hconn_of(s)->watch_missed || s->state != SESS_OPEN)
			continue;
		if (handlers_watch_catch_up(h, s))
			pending = true;
	}
	if (!pending)
		uv_timer_stop(t);
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
	uv_timer_start(&d->timer, handlers_on_drain_tick, HANDLERS_WATCH_TICK_MS,
		       HANDLERS_WATCH_TICK_MS);
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

	char who[RATELOG_WHO_MAX];
	int lvl;

	ev.reason = event_reason_of(status);
	/* A client can repeat a refused request as fast as it likes: the
	 * first of a kind is said, the rest counted (the watchers and the
	 * metrics still hear of each). */
	snprintf(who, sizeof(who), SESS_FMT " request=%s reason=%s", SESS_ARGS(s), request,
		 event_reason_name(ev.reason));
	lvl = handlers__limits_log_level(h, "request refused", (uintptr_t)s, who, LOG_LVL_INFO);
	log_at(lvl, "request refused %s status=%d error=%s", who, status,
	       log_quote(why, q, sizeof(q)));
	handlers__event_client(&ev, s, hconn_of(s)->client);
	ev.request = request;
	ev.status = status;
	ev.detail = why;
	handlers__emit(h, &ev);
}
