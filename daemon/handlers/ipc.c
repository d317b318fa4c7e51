/*
 * ipc.c - the requests of memory shared between processes (CUDA IPC on
 * gmbd memory): export (a handle for an allocation of mine), open (import
 * the allocation a handle names), close. The record is the core's
 * (daemon/core/import.c); this file decodes, calls it and answers.
 *
 * An open's reply lends nothing new to anyone: it sends the fds of every
 * chunk of the allocation, in mapping order, WIRE_MAX_FDS a part, each
 * part with an IpcOpenReply body so that libgmb's reader imports them for
 * the open and not into its cache of lent chunks; the last part carries
 * the allocation's facts. A refused request gets its status and sentence
 * through the dispatcher, which logs it (handlers__refused()).
 *
 * A pause of a tag that other processes map, by a client that may wait
 * (PauseRequest.wait_ms), waits here: on its own timer, retried after
 * every operation that may drop imports (handlers__settle()), answered by
 * its handler once the importers closed, or at its deadline with EBUSY
 * and the sentence naming them. Waiting pauses are on handlers->ipc_waits.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/list.h"
#include "common/log.h"
#include "common/size.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/core/import.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

int handlers__ipc_export(struct hreq *rq)
{
	const Gmb__IpcExportRequest *m = rq->env->ipc_export;
	struct bclient *c = hconn_of(rq->s)->client;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcExportReply er = GMB__IPC_EXPORT_REPLY__INIT;
	uint8_t handle[IPC_HANDLE_SIZE];
	int r;

	r = import_export(rq->h->broker, c, m->alloc_id, m->offset, handle, rq->err);
	if (r < 0)
		return r;
	log_debug("handle exported " SESS_FMT " alloc=%" PRIu64 " offset=%" PRIu64,
		  SESS_ARGS(rq->s), m->alloc_id, m->offset);
	er.handle.data = handle;
	er.handle.len = sizeof(handle);
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_IPC_EXPORT_REPLY;
	env.ipc_export_reply = &er;
	sess_send(rq->s, &env);
	return 0;
}

/* The chunk fds of @ex, WIRE_MAX_FDS a part, then the part with its facts. */
static int handlers_ipc_send(struct sess *s, uint64_t reply_to, const struct import_export *ex,
			     uint64_t range_off)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcOpenReply orp = GMB__IPC_OPEN_REPLY__INIT;
	int r;

	/* The fd parts carry the body case too: libgmb keeps an open's chunks
	 * apart from its lends by it. */
	env.reply_to = reply_to;
	env.body_case = GMB__ENVELOPE__BODY_IPC_OPEN_REPLY;
	env.ipc_open_reply = &orp;
	r = handlers__send_chunk_fds(s, &env, ex->chunks, ex->nchunks);
	if (r < 0)
		return r;
	orp.export_id = ex->id;
	orp.owner_id = ex->owner_id;
	orp.owner = (char *)ex->owner;
	orp.owner_pid = (int32_t)ex->owner_pid;
	orp.alloc_id = ex->alloc_id;
	orp.device = (uint32_t)ex->dev;
	orp.size = ex->size;
	orp.range_offset = range_off;
	orp.nchunks = ex->nchunks;
	return sess_send(s, &env);
}

/* An import event of @rq's client about @ex (@kind: import or its close). */
static void handlers_ipc_event(struct hreq *rq, enum event_kind kind,
			       const struct import_export *ex)
{
	struct event ev = EVENT_INIT(kind);
	char detail[ERR_MSG_MAX];

	snprintf(detail, sizeof(detail), "allocation %" PRIu64 " of client '%s' (pid %d)",
		 ex->alloc_id, ex->owner, (int)ex->owner_pid);
	handlers__event_client(&ev, rq->s, hconn_of(rq->s)->client);
	ev.device = ex->dev;
	ev.bytes = ex->size;
	ev.detail = detail;
	ev.duration_ns = uv_hrtime() - rq->start_ns;
	handlers__emit(rq->h, &ev);
}

int handlers__ipc_open(struct hreq *rq)
{
	const Gmb__IpcOpenRequest *m = rq->env->ipc_open;
	struct bclient *c = hconn_of(rq->s)->client;
	struct import_export *ex = NULL;
	uint64_t range_off = 0;
	char b[SIZE_STR_MAX];
	int r;

	r = import_open(rq->h->broker, c, m->handle.data, m->handle.len, &ex, &range_off, rq->err);
	if (r < 0)
		return r;
	log_info("memory imported " SESS_FMT " owner=%s owner_pid=%d alloc=%" PRIu64
		 " bytes=%s chunks=%u",
		 SESS_ARGS(rq->s), ex->owner, (int)ex->owner_pid, ex->alloc_id,
		 size_str(ex->size, b), ex->nchunks);
	/* A reply that cannot go out dooms the session: its imports go with it. */
	handlers_ipc_send(rq->s, rq->env->id, ex, range_off);
	handlers_ipc_event(rq, EVENT_IMPORT, ex);
	return 0;
}

int handlers__ipc_close(struct hreq *rq)
{
	const Gmb__IpcCloseRequest *m = rq->env->ipc_close;
	const struct import_export *ex = import_find(rq->h->broker, m->export_id);
	struct import_export facts = { 0 };
	int r;

	/* The export may go with the close: what the event says first. */
	if (ex)
		facts = *ex;
	r = import_close(rq->h->broker, hconn_of(rq->s)->client, m->export_id, rq->err);
	if (r < 0)
		return r;
	handlers_ipc_event(rq, EVENT_IMPORT_CLOSE, &facts);
	log_debug("import closed " SESS_FMT " export=%" PRIu64, SESS_ARGS(rq->s), m->export_id);
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

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

static void handlers_ipc_expired(uv_timer_t *t)
{
	struct hipc_wait *w = t->data;
	struct handlers *h = w->h;
	char msg[ERR_MSG_MAX];

	err_fmt(msg, -EBUSY, "%.400s; waited %" PRIu64 " ms", w->why, uv_now(h->loop) - w->since);
	log_info("wait for importers expired " SESS_FMT " req=%" PRIu64, SESS_ARGS(w->s),
		 w->env->id);
	handlers__refused(h, w->s, "pause", -EBUSY, msg);
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

void handlers__ipc_retry(struct handlers *h)
{
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

/* ---- status: who imported whose allocation ---- */

static int handlers_ipc_row(void *arg, const struct import_export *ex, const struct import_rec *r)
{
	struct hipc_rows *rows = arg;
	Gmb__ImportInfo *ii;

	if (rows->n < rows->cap) {
		ii = &rows->v[rows->n];
		gmb__import_info__init(ii);
		ii->importer_id = r->importer->id;
		ii->importer = (char *)r->importer->name;
		ii->importer_pid = (int32_t)r->importer->pid;
		ii->owner_id = ex->owner_id;
		ii->owner = (char *)ex->owner;
		ii->owner_pid = (int32_t)ex->owner_pid;
		ii->alloc_id = ex->alloc_id;
		ii->device = (uint32_t)ex->dev;
		ii->bytes = ex->size;
		ii->opens = r->refs;
		ii->owner_freed = ex->alloc == NULL;
		rows->pv[rows->n++] = ii;
	}
	rows->total++;
	return 0;
}

int handlers__ipc_rows(const struct broker *br, struct hipc_rows *rows)
{
	*rows = (struct hipc_rows){ .cap = HIPC_STATUS_MAX };
	rows->v = calloc(rows->cap, sizeof(*rows->v));
	rows->pv = calloc(rows->cap, sizeof(*rows->pv));
	if (!rows->v || !rows->pv) {
		handlers__ipc_rows_free(rows);
		return -ENOMEM;
	}
	return import_walk(br, handlers_ipc_row, rows);
}

int handlers__ipc_status_part(struct hreq *rq, const struct hipc_rows *rows)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusReply sr = GMB__STATUS_REPLY__INIT;

	sr.n_imports = rows->n;
	sr.imports = rows->pv;
	sr.imports_total = rows->total;
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REPLY;
	env.status_reply = &sr;
	return sess_send(rq->s, &env);
}

void handlers__ipc_rows_free(struct hipc_rows *rows)
{
	free(rows->v);
	free(rows->pv);
	*rows = (struct hipc_rows){ 0 };
}
