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
 * A pause of a tag that other processes map is ipc_pause.c's.
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
#include "daemon/core/object.h"
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

/* The chunk fds of @ex, WIRE_MAX_FDS a part, then the part with its facts
 * (@remap: of a followed import mapped again, not of a new open). */
static int handlers_ipc_send(struct sess *s, uint64_t reply_to, const struct import_export *ex,
			     uint64_t range_off, bool remap)
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
	orp.read_only = ex->version != NULL;
	orp.remap = remap;
	return sess_send(s, &env);
}

/*
 * The chunk fds of an open's reply could not go out (@err): the importer
 * never got them, so the open is given back (one open fewer, as a close)
 * and the request answered with @err and a sentence; the session stays. A
 * remap's keeps the old way (the session doomed, its imports with it): its
 * import was mapped before and the client holds it. Return: 0, or @err.
 */
int handlers__ipc_undeliverable(struct handlers *h, struct sess *s, Gmb__Envelope *const *envs,
				size_t n, int err)
{
	struct bclient *c = hconn_of(s)->client;
	const Gmb__IpcOpenReply *last = NULL;
	const struct import_export *ex;
	struct import_export facts;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	char msg[ERR_MSG_MAX];

	for (size_t i = 0; i < n; i++)
		if (envs[i]->body_case == GMB__ENVELOPE__BODY_IPC_OPEN_REPLY &&
		    envs[i]->ipc_open_reply->export_id)
			last = envs[i]->ipc_open_reply;
	ex = last && c && !last->remap ? import_find(h->broker, last->export_id) : NULL;
	if (!ex)
		return err;
	facts = *ex;
	if (import_close(h->broker, c, last->export_id, NULL) < 0)
		return err;
	handlers__ipc_event(h, s, c, EVENT_IMPORT_CLOSE, &facts, 0);
	err_fmt(msg, err,
		"gmbd could not send the chunk fds of allocation %llu of client '%s' (%s), and"
		" gave the open back; gmbd holds %llu chunk fds and %llu others, of a limit of"
		" %llu open files",
		(unsigned long long)facts.alloc_id, facts.owner, strerror(-err),
		(unsigned long long)broker_chunk_fds(h->broker),
		(unsigned long long)(h->broker->fds_base + h->broker->fds_conns),
		(unsigned long long)h->broker->opts.fd_limit);
	log_warn("import given back, its chunk fds could not be sent " SESS_FMT
		 " owner=%s alloc=%llu err=\"%s\"",
		 SESS_ARGS(s), facts.owner, (unsigned long long)facts.alloc_id, strerror(-err));
	env.reply_to = envs[0]->reply_to;
	env.status = err;
	env.error = msg;
	sess_send(s, &env);
	handlers__changed(h);
	return 0;
}

/* An import event of @rq's client about @ex (@kind: import or its close). */
static void handlers_ipc_event(struct hreq *rq, enum event_kind kind,
			       const struct import_export *ex)
{
	handlers__ipc_event(rq->h, rq->s, hconn_of(rq->s)->client, kind, ex,
			    uv_hrtime() - rq->start_ns);
}

int handlers__ipc_open(struct hreq *rq)
{
	const Gmb__IpcOpenRequest *m = rq->env->ipc_open;
	struct bclient *c = hconn_of(rq->s)->client;
	struct import_export *ex = NULL;
	uint64_t range_off = 0;
	char b[SIZE_STR_MAX];
	int r;

	/* export_id and reopen: its idle import (kept mapped) is open again. */
	if (m->export_id && m->reopen) {
		r = import_reopen(rq->h->broker, c, m->export_id, rq->err);
		if (r < 0)
			return r;
		handlers__reply_status(rq->s, rq->env->id, 0, NULL);
		return 0;
	}
	/* export_id: its import followed a pause, and maps the chunks again. */
	if (m->export_id)
		r = import_remap(rq->h->broker, c, m->export_id, &ex, rq->err);
	else
		r = import_open(rq->h->broker, c, m->handle.data, m->handle.len, &ex, &range_off,
				rq->err);
	if (r < 0)
		return r;
	if (m->export_id) {
		log_debug("import mapped again " SESS_FMT " owner=%s alloc=%" PRIu64 " chunks=%u",
			  SESS_ARGS(rq->s), ex->owner, ex->alloc_id, ex->nchunks);
		handlers_ipc_send(rq->s, rq->env->id, ex, 0, true);
		handlers_ipc_event(rq, EVENT_IMPORT_MAP, ex);
		return 0;
	}
	log_debug("memory imported " SESS_FMT " owner=%s owner_pid=%d alloc=%" PRIu64
		  " bytes=%s chunks=%u",
		  SESS_ARGS(rq->s), ex->owner, (int)ex->owner_pid, ex->alloc_id,
		  size_str(ex->size, b), ex->nchunks);
	/* Fds that cannot go out give the open back (handlers__ipc_undeliverable). */
	handlers_ipc_send(rq->s, rq->env->id, ex, range_off, false);
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
	/* keep: its last open, the client keeps it mapped for the next (idle). */
	r = m->keep ? import_keep(rq->h->broker, hconn_of(rq->s)->client, m->export_id, rq->err) :
		      import_close(rq->h->broker, hconn_of(rq->s)->client, m->export_id, rq->err);
	if (r < 0)
		return r;
	handlers_ipc_event(rq, EVENT_IMPORT_CLOSE, &facts);
	log_debug("import closed " SESS_FMT " export=%" PRIu64, SESS_ARGS(rq->s), m->export_id);
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

int handlers__ipc_grant(struct hreq *rq)
{
	const Gmb__IpcGrantRequest *m = rq->env->ipc_grant;
	struct bclient *c = hconn_of(rq->s)->client;
	int r;

	r = import_export_grant(rq->h->broker, c, m->alloc_id, (uid_t)m->uid, m->revoke, rq->err);
	if (r < 0)
		return r;
	log_info("%s " SESS_FMT " alloc=%" PRIu64 " uid=%u",
		 m->revoke ? "import grant revoked" : "import granted", SESS_ARGS(rq->s),
		 m->alloc_id, (unsigned)m->uid);
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
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
		ii->unmapped = !r->mapped;
		ii->idle = r->idle;
		/* A named object's version: the object's name, not an allocation. */
		if (ex->version) {
			ii->object = (char *)ex->version->obj->name;
			ii->object_version = ex->version->version;
		}
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

int handlers__ipc_status_part(struct hreq *rq, const struct hipc_rows *rows, bool last)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusReply sr = GMB__STATUS_REPLY__INIT;

	sr.n_imports = rows->n;
	sr.imports = rows->pv;
	sr.imports_total = rows->total;
	env.reply_to = rq->env->id;
	env.more = !last;
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
