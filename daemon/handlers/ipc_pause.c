/*
 * ipc_pause.c - a pause of a tag whose memory other processes map (CUDA
 * IPC), and the resume after it. README: "Pause of an imported tag".
 *
 * Waits. A pause by a client that may wait (PauseRequest.wait_ms) waits
 * here for the importers to close: on its own timer, retried after every
 * operation that may drop imports (handlers__settle()), answered by its
 * handler once the importers closed, or at its deadline with EBUSY and the
 * sentence naming them. Waiting pauses are on handlers->ipc_waits.
 *
 * Idle imports. An importer that closed its last open but keeps the
 * import mapped for its next open (GMB_IPC_KEEP) is idle: gmbd asks for it
 * back (IpcFollow with drop) before a pause of its tag (in the pause's round,
 * or, for a waiting pause, before each retry), and as soon as its owner's
 * allocation is gone (handlers__ipc_retry(), after every change); the
 * importer closes it for good, or answers EBUSY when it has opened it again.
 *
 * Rounds. A pause of an imported tag first asks the idle importers back and,
 * with importers_follow, each importer that can be asked (connected, not the owner itself) to unmap (IpcFollow, map =
 * false, due in --control-timeout); an answer marks its record unmapped
 * (import_unmapped(), which unpins the chunks with the last one). When
 * every request has ended the pause is tried again: done, or waiting as
 * above for those that did not follow, or failed naming them. After the
 * owner resumed and restored the tag (IpcResumed), a round asks the
 * unmapped importers to map it again (map = true; they fetch the chunks
 * with IpcOpenRequest.export_id), and the owner is answered once every
 * request ended. Rounds are on handlers->ipc_rounds; a round lives until
 * its last request ended, however its owner's session fares.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/list.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

/* A pause waiting for importers to close. */
struct hipc_wait {
	uv_timer_t timer; /* its deadline; the struct is freed when it closes */
	struct handlers *h;
	struct sess *s;	    /* reference held */
	Gmb__Envelope *env; /* owned */
	handlers_fn fn;	    /* the handler to retry */
	uint64_t start_ns;  /* uv_hrtime() when the request arrived */
	uint64_t since;	    /* uv_now() when it began to wait */
	char why[ERR_MSG_MAX];
	struct hipc_wait *prev, *next;
};

static void handlers_ipc_free(uv_handle_t *t)
{
	free(t->data);
}

static void handlers_ipc_unwait(struct handlers *h, struct hipc_wait *w)
{
	DLIST_UNLINK(h->ipc_waits, w);
	hconn_of(w->s)->inflight--;
	gmb__envelope__free_unpacked(w->env, NULL);
	sess_unref(w->s);
	uv_close((uv_handle_t *)&w->timer, handlers_ipc_free);
}

/*
 * The waiting pause @w refused with @msg once the importers that followed
 * it before it waited map again (handlers__refuse_remapped()). Return:
 * HANDLERS_KEPT, w->env now the round's; 0, the caller answers.
 */
static int handlers_refuse_waited(struct hipc_wait *w, const char *msg)
{
	struct hreq rq = { .h = w->h, .s = w->s, .env = w->env, .start_ns = w->start_ns };
	const char *tag = w->env->pause->tag ? w->env->pause->tag : "";
	int r = handlers__refuse_remapped(&rq, tag, NULL, -EBUSY, msg);

	if (r == HANDLERS_KEPT)
		w->env = NULL; /* handlers_ipc_unwait() frees nothing then */
	return r;
}

static void handlers_ipc_expired(uv_timer_t *t)
{
	struct hipc_wait *w = t->data;
	struct handlers *h = w->h;
	char msg[ERR_MSG_MAX];

	err_fmt(msg, -EBUSY, "%.400s; waited %" PRIu64 " ms", w->why, uv_now(h->loop) - w->since);
	log_info("wait for importers expired " SESS_FMT " req=%" PRIu64, SESS_ARGS(w->s),
		 w->env->id);
	handlers__refused(h, w->s, "pause", -EBUSY, msg);
	if (handlers_refuse_waited(w, msg) != HANDLERS_KEPT)
		handlers__reply_status(w->s, w->env->id, -EBUSY, msg);
	handlers_ipc_unwait(h, w);
}

int handlers__ipc_wait(struct hreq *rq, handlers_fn fn, uint32_t wait_ms)
{
	struct hconn *hc = hconn_of(rq->s);
	struct hipc_wait *w;

	if (hc->inflight >= WIRE_MAX_INFLIGHT)
		return handlers__fail(rq, -EBUSY, "%.400s; client has %u requests in flight",
				      rq->err, hc->inflight);
	w = calloc(1, sizeof(*w));
	if (!w)
		return handlers__fail(rq, -EBUSY, "%.400s; out of memory waiting", rq->err);
	uv_timer_init(rq->h->loop, &w->timer);
	w->timer.data = w;
	w->h = rq->h;
	w->s = sess_ref(rq->s);
	w->env = rq->env;
	w->fn = fn;
	w->start_ns = rq->start_ns;
	w->since = uv_now(rq->h->loop);
	memcpy(w->why, rq->err, sizeof(w->why));
	DLIST_PUSH(rq->h->ipc_waits, w);
	hc->inflight++;
	uv_timer_start(&w->timer, handlers_ipc_expired, wait_ms, 0);
	log_info("pause waits for importers " SESS_FMT " req=%" PRIu64 " wait_ms=%u why=\"%s\"",
		 SESS_ARGS(rq->s), rq->env->id, wait_ms, rq->err);
	return HANDLERS_KEPT;
}

/*
 * An IpcFollow of export @export_id (@map: map again, @drop: close an idle
 * import for good, neither: unmap) to session @ts for round @rd (NULL: a
 * lone request), due in --control-timeout.
 * Return: the request, now @ts's; NULL when it could not be sent.
 */
static struct hdreq *handlers_follow_send(struct handlers *h, struct sess *ts,
					  struct hipc_round *rd, uint64_t export_id, bool map,
					  bool drop)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcFollow f = GMB__IPC_FOLLOW__INIT;
	struct hdreq *d;

	if (!ts || ts->state != SESS_OPEN)
		return NULL;
	d = handlers__dreq_new(HDREQ_FOLLOW, rd);
	if (!d)
		return NULL;
	d->export_id = export_id;
	d->map = map;
	d->drop = drop;
	f.export_id = export_id;
	f.map = map;
	f.drop = drop;
	env.body_case = GMB__ENVELOPE__BODY_IPC_FOLLOW;
	env.ipc_follow = &f;
	if (handlers__dreq_send(ts, d, &env, h->control_timeout_ms) < 0) {
		handlers__dreq_free(d);
		return NULL;
	}
	return d;
}

/* A lone request to @r's importer to close its idle import for good. */
static void handlers_drop_ask(void *arg, const struct import_export *ex, struct import_rec *r)
{
	struct handlers *h = arg;
	struct sess *ts = handlers__conn_client(h, r->importer);

	/* Not connected: its going drops it. */
	if (!handlers_follow_send(h, ts, NULL, ex->id, false, true))
		return;
	r->asked = true;
	log_debug("idle import asked back " SESS_FMT " export=%" PRIu64, SESS_ARGS(ts), ex->id);
}

void handlers__ipc_retry(struct handlers *h)
{
	/* Idle imports of freed allocations pin memory nobody uses: ask them back. */
	import_idle_walk(h->broker, NULL, "", handlers_drop_ask, h);
	struct hipc_wait *w, *next;

	for (w = h->ipc_waits; w; w = next) {
		struct hreq rq = { .h = h,
				   .s = w->s,
				   .env = w->env,
				   .retry = true,
				   .short_dev = -1,
				   .start_ns = w->start_ns };
		int r;

		/* The handler neither waits anew nor retries: @next survives it. */
		next = w->next;
		if (w->s->state != SESS_OPEN)
			continue;
		/* Imports closed meanwhile but kept mapped (idle) hold the pause: ask them back. */
		import_idle_walk(h->broker, hconn_of(w->s)->client,
				 w->env->pause->tag ? w->env->pause->tag : "", handlers_drop_ask,
				 h);
		r = w->fn(&rq);
		if (r == HANDLERS_PARK) {
			memcpy(w->why, rq.err, sizeof(w->why));
			continue;
		}
		if (r < 0) {
			handlers__refused(h, w->s, "pause", r, rq.err);
			handlers__reply_status(w->s, w->env->id, r, rq.err);
		}
		handlers_ipc_unwait(h, w);
	}
}

void handlers__ipc_cancel(struct handlers *h, struct sess *s)
{
	struct hipc_wait *w, *next;

	for (w = h->ipc_waits; w; w = next) {
		next = w->next;
		if (!s || w->s == s)
			handlers_ipc_unwait(h, w);
	}
}

void handlers__ipc_event(struct handlers *h, struct sess *s, const struct bclient *c,
			 enum event_kind kind, const struct import_export *ex, uint64_t duration_ns)
{
	struct event ev = EVENT_INIT(kind);
	char detail[ERR_MSG_MAX];

	snprintf(detail, sizeof(detail), "allocation %" PRIu64 " of client '%s' (pid %d)",
		 ex->alloc_id, ex->owner, (int)ex->owner_pid);
	handlers__event_client(&ev, s, c);
	ev.device = ex->dev;
	ev.bytes = ex->size;
	ev.detail = detail;
	ev.duration_ns = duration_ns;
	handlers__emit(h, &ev);
}

/* An importer unmapped export @export_id to follow its owner: recorded,
 * told. Return: 0, or -ENOENT when it has no such import (closed since). */
static int handlers_follow_unmapped(struct hdreq *d, struct bclient *imp)
{
	const struct import_export *ex;

	if (import_unmapped(d->h->broker, imp, d->export_id) < 0)
		return -ENOENT;
	ex = import_find(d->h->broker, d->export_id);
	handlers__ipc_event(d->h, d->target, imp, EVENT_IMPORT_UNMAP, ex, 0);
	return 0;
}

/* ---- rounds: importers that follow their owner ---- */

struct hipc_round {
	struct handlers *h;
	struct sess *s;	    /* the owner's; reference held */
	Gmb__Envelope *env; /* owned: its PauseRequest or IpcResumed; NULL once handed on */
	handlers_fn fn;	    /* a pause's handler, tried again at the end; NULL: a resume */
	uint64_t start_ns;
	uint64_t since;		 /* uv_now() when it began */
	struct hdreq **dreqs;	 /* the requests not ended yet (NULL where ended) */
	uint32_t ndreqs, asking; /* sent, and not ended yet */
	bool dead;		 /* the owner's session went, or gmbd stops: nobody to answer */
	struct bobject *obj;	 /* a named object's readers (object_pause.c); NULL: a tag's */
	char why[ERR_MSG_MAX];	 /* the importers that did not follow, and why */
	int status;		 /* a resume's (no fn) answer: 0, or a refusal's -errno... */
	char msg[ERR_MSG_MAX];	 /* ...and its sentence */
	struct hipc_round *prev, *next; /* handlers->ipc_rounds */
};

/* "; client 'x' (pid n) <what>" into @why, the first few importers. */
static void handlers_round_why(char *why, uint32_t *n, const struct bclient *imp, const char *what)
{
	if ((*n)++ >= 8)
		return;
	err_append(why, "%sclient '%s' (pid %d) %s", *why ? "; " : "", imp->name, (int)imp->pid,
		   what);
}

struct hipc_ask {
	struct hipc_round *rd;
	bool map;
	bool follow; /* a pause's: the open ones are asked to unmap too */
	uint32_t cap, skipped;
};

static int handlers_round_ask(void *arg, const struct import_export *ex, const struct import_rec *r)
{
	struct hipc_ask *a = arg;
	struct hipc_round *rd = a->rd;
	struct sess *ts = handlers__conn_client(rd->h, r->importer);
	struct hdreq *d;

	if (rd->ndreqs == a->cap)
		return 0; /* counted before: cannot happen */
	/* A pause asks an idle import back always, an open one only following. */
	if (!a->map && !r->idle && !a->follow)
		return 0;
	/* A tag's owner pauses under its op_lock and cannot follow; an object's
	 * pause holds none (gmb_object_pause()): its asker follows as any reader. */
	if (!rd->obj && r->importer == hconn_of(rd->s)->client) {
		handlers_round_why(rd->why, &a->skipped, r->importer, "is the owner itself");
		return 0;
	}
	if (!ts || ts->state != SESS_OPEN) {
		handlers_round_why(rd->why, &a->skipped, r->importer, "is not connected");
		return 0;
	}
	d = handlers_follow_send(rd->h, ts, rd, ex->id, a->map, !a->map && r->idle);
	if (!d) {
		handlers_round_why(rd->why, &a->skipped, r->importer, "could not be asked");
		return 0;
	}
	rd->dreqs[rd->ndreqs++] = d;
	rd->asking++;
	return 0;
}

static int handlers_round_count(void *arg, const struct import_export *ex,
				const struct import_rec *r)
{
	(void)ex;
	(void)r;
	(*(uint32_t *)arg)++;
	return 0;
}

/* @fn for every import record of @obj's versions (@obj non-NULL) that is
 * @mapped, else of @c's tag @tag (import_followers()). */
static int handlers_round_walk(const struct broker *br, const struct bclient *c, const char *tag,
			       const struct bobject *obj, bool mapped, import_follow_fn fn,
			       void *arg)
{
	int rc;

	if (!obj)
		return import_followers(br, c, tag, mapped, fn, arg);
	for (const struct bobject_version *v = obj->versions; v; v = v->next)
		for (const struct import_rec *r = v->ex->imports; r; r = r->next)
			if (r->mapped == mapped && (rc = fn(arg, v->ex, r)) != 0)
				return rc;
	return 0;
}

static void handlers_round_free(struct hipc_round *rd)
{
	struct handlers *h = rd->h;

	DLIST_UNLINK(h->ipc_rounds, rd);
	if (rd->env) {
		hconn_of(rd->s)->inflight--;
		gmb__envelope__free_unpacked(rd->env, NULL);
	}
	sess_unref(rd->s);
	free(rd->dreqs);
	free(rd);
}

/*
 * A round for @rq (@fn: a pause's handler; NULL: a resume's IpcResumed):
 * an IpcFollow (@map) to every importer of @tag whose record is @!map.
 * Return: HANDLERS_KEPT, the round owning rq->env; 0 when nobody could be
 * asked (rq->err says who and why); -ENOMEM.
 */
static int handlers_round_start(struct hreq *rq, handlers_fn fn, const char *tag,
				struct bobject *obj, bool map, bool follow)
{
	const struct bclient *c = hconn_of(rq->s)->client;
	struct hipc_round *rd;
	struct hipc_ask a = { .map = map, .follow = follow };
	uint32_t n = 0;

	handlers_round_walk(rq->h->broker, c, tag, obj, !map, handlers_round_count, &n);
	if (!n)
		return 0;
	rd = calloc(1, sizeof(*rd));
	if (!rd || !(rd->dreqs = calloc(n, sizeof(*rd->dreqs)))) {
		free(rd);
		return -ENOMEM;
	}
	rd->h = rq->h;
	rd->s = sess_ref(rq->s);
	rd->fn = fn;
	rd->start_ns = rq->start_ns;
	rd->since = uv_now(rq->h->loop);
	rd->obj = obj;
	DLIST_PUSH(rq->h->ipc_rounds, rd);
	a.rd = rd;
	a.cap = n;
	handlers_round_walk(rq->h->broker, c, tag, obj, !map, handlers_round_ask, &a);
	if (!rd->asking) {
		if (*rq->err && *rd->why)
			err_append(rq->err, "; ");
		err_append(rq->err, "%s", rd->why);
		handlers_round_free(rd);
		return 0;
	}
	rd->env = rq->env;
	hconn_of(rq->s)->inflight++;
	log_info("importers asked to %s " SESS_FMT " req=%" PRIu64 " importers=%u not_asked=\"%s\"",
		 map ? "map again" : "unmap", SESS_ARGS(rq->s), rq->env->id, rd->asking, rd->why);
	return HANDLERS_KEPT;
}

int handlers__refuse_remapped(struct hreq *rq, const char *tag, struct bobject *obj, int status,
			      const char *msg)
{
	int r = handlers_round_start(rq, NULL, tag, obj, true, false);
	struct hipc_round *rd = rq->h->ipc_rounds;

	if (r != HANDLERS_KEPT)
		return 0;
	/* The round just started is the list's head (DLIST_PUSH). */
	rd->status = status;
	snprintf(rd->msg, sizeof(rd->msg), "%s", msg);
	return r;
}

int handlers__ipc_follow(struct hreq *rq, handlers_fn fn, const char *tag, bool follow)
{
	int r = handlers_round_start(rq, fn, tag, NULL, false, follow);

	return r < 0 ? 0 : r;
}

uint32_t handlers__ipc_followers(struct handlers *h, const struct bclient *c, const char *tag)
{
	uint32_t n = 0;

	import_followers(h->broker, c, tag, false, handlers_round_count, &n);
	return n;
}

int handlers__ipc_resumed(struct hreq *rq)
{
	const char *tag = rq->env->ipc_resumed->tag ? rq->env->ipc_resumed->tag : "";
	int r;

	r = handlers__check_name(rq, "the tag", tag);
	if (r < 0)
		return r;
	r = handlers_round_start(rq, NULL, tag, NULL, true, false);
	if (r == HANDLERS_KEPT)
		return r;
	/* Nobody to map again (or nobody reachable: they stay unmapped until they reopen). */
	if (*rq->err)
		log_info("importers not mapped again " SESS_FMT " why=\"%s\"", SESS_ARGS(rq->s),
			 rq->err);
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

/* The tag of @rd's pause ("" for every tag, or a round of another request). */
static const char *handlers_round_tag(const struct hipc_round *rd)
{
	if (rd->env->body_case != GMB__ENVELOPE__BODY_PAUSE || !rd->env->pause->tag)
		return "";
	return rd->env->pause->tag;
}

/* Every request of @rd ended: try the pause again, or answer the resume. */
static void handlers_round_end(struct hipc_round *rd)
{
	struct handlers *h = rd->h;
	struct hreq rq = { .h = h,
			   .s = rd->s,
			   .env = rd->env,
			   .retry = true,
			   .short_dev = -1,
			   .start_ns = rd->start_ns };
	uint32_t wait_ms, waited;
	int r;

	if (rd->dead || rd->s->state != SESS_OPEN) {
		handlers_round_free(rd);
		return;
	}
	if (!rd->fn) {
		if (*rd->why)
			log_info("importers not mapped again " SESS_FMT " why=\"%s\"",
				 SESS_ARGS(rd->s), rd->why);
		handlers__reply_status(rd->s, rd->env->id, rd->status, rd->status ? rd->msg : NULL);
		handlers_round_free(rd);
		return;
	}
	rq.not_followed = rd->why;
	r = rd->fn(&rq);
	if (r == HANDLERS_KEPT) {
		/* Handed on (an object's copy): its new owner counts it in flight. */
		hconn_of(rd->s)->inflight--;
		rd->env = NULL;
		handlers_round_free(rd);
		return;
	}
	wait_ms = rd->obj ? 0 : rd->env->pause->wait_ms;
	waited = (uint32_t)(uv_now(h->loop) - rd->since);
	if (r == HANDLERS_PARK && wait_ms > waited) {
		/* Some did not follow: the client's wait, less the round's time, for them. */
		hconn_of(rd->s)->inflight--;
		r = handlers__ipc_wait(&rq, rd->fn, wait_ms - waited);
		if (r == HANDLERS_KEPT) {
			rd->env = NULL; /* the wait's now */
			handlers_round_free(rd);
			return;
		}
		hconn_of(rd->s)->inflight++;
	}
	if (r == HANDLERS_PARK)
		r = -EBUSY;
	if (r < 0) {
		if (*rd->why)
			err_append(rq.err, "; did not follow: %s", rd->why);
		handlers__refused(h, rd->s, rd->obj ? "object_pause" : "pause", r, rq.err);
		/* An object's handler refuses through handlers__refuse_remapped()
		 * itself; a tag's importers that followed map again first. */
		if (!rd->obj && handlers__refuse_remapped(&rq, handlers_round_tag(rd), NULL, r,
							  rq.err) == HANDLERS_KEPT) {
			hconn_of(rd->s)->inflight--; /* counted by the new round */
			rd->env = NULL;
			handlers_round_free(rd);
			return;
		}
		handlers__reply_status(rd->s, rd->env->id, r, rq.err);
	}
	handlers_round_free(rd);
	/* Paused outside any request of the owner's (the last request may have
	 * timed out): the memory it gave back may serve a waiter, the record
	 * changed. */
	if (r == 0) {
		h->settle(h);
		handlers__changed(h);
	}
}

void handlers__follow_done(struct hdreq *d, const struct hdreq_result *res)
{
	struct hipc_round *rd = d->arg;
	struct bclient *imp = hconn_of(d->target)->client;
	uint32_t skipped = 0;
	char what[ERR_MSG_MAX];

	/* Answered: it unmapped (gmbd no longer pins for it), or mapped again;
	 * a drop's answer comes after its close, which dropped the record. */
	if (res->end == HDREQ_ANSWERED && !d->map && !d->drop && imp)
		handlers_follow_unmapped(d, imp);
	if (d->drop && res->end != HDREQ_ANSWERED && imp) {
		struct import_rec *r = import_record_of(d->h->broker, d->export_id, imp);

		if (r)
			r->asked = false; /* open again: asked anew when idle again */
	}
	if (!rd)
		return; /* a lone request (handlers__follow_late(), a drop) */
	if (res->end != HDREQ_ANSWERED && imp) {
		snprintf(what, sizeof(what), "did not %s: %.200s",
			 d->drop ? "give an idle import back" :
			 d->map	 ? "map it again" :
				   "unmap",
			 *res->error ? res->error : strerror(-res->status));
		handlers_round_why(rd->why, &skipped, imp, what);
	}
	for (uint32_t i = 0; i < rd->ndreqs; i++)
		if (rd->dreqs[i] == d)
			rd->dreqs[i] = NULL;
	if (--rd->asking == 0)
		handlers_round_end(rd);
}

void handlers__follow_late(struct hdreq *d)
{
	struct handlers *h = d->h;
	struct bclient *imp = hconn_of(d->target)->client;
	const struct import_export *ex = import_find(h->broker, d->export_id);

	if (d->map || d->drop || !imp || handlers_follow_unmapped(d, imp) < 0)
		return;
	/* The pause failed without it, or is over: the owner's memory is
	 * mapped, so the importer maps it again; a later pause asks anew. */
	if (!ex || (ex->version ? ex->version->obj->paused || ex->version->obj->busy :
				  !ex->alloc || !ex->alloc->active))
		return;
	log_info("import unmapped late, asked to map again " SESS_FMT " export=%" PRIu64,
		 SESS_ARGS(d->target), d->export_id);
	handlers_follow_send(h, d->target, NULL, d->export_id, true, false);
}

void handlers__ipc_rounds_gone(struct handlers *h, struct sess *s)
{
	struct hipc_round *rd, *next;

	for (rd = h->ipc_rounds; rd; rd = next) {
		struct hdreq **live;
		uint32_t n = rd->ndreqs;

		next = rd->next;
		if (s && rd->s != s)
			continue;
		rd->dead = true;
		/* Cancelling ends each request, and the last one frees the round:
		 * walk a copy. Out of memory, the requests end at their deadline. */
		live = malloc(n * sizeof(*live));
		if (!live)
			continue;
		memcpy(live, rd->dreqs, n * sizeof(*live));
		for (uint32_t i = 0; i < n; i++)
			if (live[i])
				handlers__dreq_cancel(live[i]);
		free(live);
	}
}

/* ---- named objects' readers (object_pause.c) ---- */

int handlers__object_follow(struct hreq *rq, handlers_fn fn, struct bobject *obj, bool map)
{
	return handlers_round_start(rq, fn, "", obj, map, true);
}

void handlers__object_remap_all(struct handlers *h, const struct bobject *obj)
{
	for (const struct bobject_version *v = obj->versions; v; v = v->next)
		for (const struct import_rec *r = v->ex->imports; r; r = r->next)
			if (!r->mapped)
				handlers_follow_send(h, handlers__conn_client(h, r->importer), NULL,
						     v->ex->id, true, false);
}
