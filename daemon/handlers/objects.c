/*
 * objects.c - the requests of named objects: publish (an allocation of
 * mine becomes a version), open (a version's handle and description), drop
 * and grant. The record is the core's (daemon/core/object.c); opening the
 * handle is an ordinary import (ipc.c), read-only on the client's side.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/core/import.h"
#include "daemon/core/lend.h"
#include "daemon/core/object.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

/* An object event of @rq's client about @v (@kind: publish or drop). */
static void handlers_object_event(struct hreq *rq, enum event_kind kind, const char *name,
				  uint64_t version, int dev, uint64_t bytes)
{
	struct event ev = EVENT_INIT(kind);
	char detail[OBJECT_NAME_MAX + 32];

	if (version)
		snprintf(detail, sizeof(detail), "%s v%" PRIu64, name, version);
	else
		snprintf(detail, sizeof(detail), "%s", name);
	handlers__event_client(&ev, rq->s, hconn_of(rq->s)->client);
	ev.device = dev;
	ev.bytes = bytes;
	ev.detail = detail;
	ev.duration_ns = uv_hrtime() - rq->start_ns;
	handlers__emit(rq->h, &ev);
}

int handlers__object_publish(struct hreq *rq)
{
	const Gmb__ObjectPublishRequest *m = rq->env->object_publish;
	struct bclient *c = hconn_of(rq->s)->client;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectPublishReply pr = GMB__OBJECT_PUBLISH_REPLY__INIT;
	uint8_t handle[IPC_HANDLE_SIZE];
	struct bobject_version *v;
	int r;

	r = object_publish(rq->h->broker, c, m->name, m->alloc_id, m->meta.data, m->meta.len, &v,
			   rq->err);
	if (r < 0)
		return r;
	/* The allocation leaves its client as a free takes it; the pins keep its chunks. */
	lend_free(rq->h->broker, c, m->alloc_id, NULL);
	import_export_version_handle(rq->h->broker, v->ex, handle);
	pr.version = v->version;
	pr.handle.data = handle;
	pr.handle.len = sizeof(handle);
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_PUBLISH_REPLY;
	env.object_publish_reply = &pr;
	sess_send(rq->s, &env);
	handlers_object_event(rq, EVENT_OBJECT_PUBLISH, v->obj->name, v->version, v->ex->dev,
			      v->ex->size);
	return 0;
}

int handlers__object_open(struct hreq *rq)
{
	const Gmb__ObjectOpenRequest *m = rq->env->object_open;
	struct bclient *c = hconn_of(rq->s)->client;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectOpenReply orp = GMB__OBJECT_OPEN_REPLY__INIT;
	uint8_t handle[IPC_HANDLE_SIZE];
	struct bobject_version *v;
	int r;

	r = object_open(rq->h->broker, c, m->name, m->version, &v, rq->err);
	if (r < 0)
		return r;
	import_export_version_handle(rq->h->broker, v->ex, handle);
	orp.version = v->version;
	orp.handle.data = handle;
	orp.handle.len = sizeof(handle);
	orp.size = v->ex->size;
	orp.device = (uint32_t)v->ex->dev;
	orp.owner_uid = (uint32_t)v->obj->uid;
	orp.meta.data = v->meta;
	orp.meta.len = v->meta_len;
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_OPEN_REPLY;
	env.object_open_reply = &orp;
	log_debug("object handle given " SESS_FMT " name=%s version=%" PRIu64, SESS_ARGS(rq->s),
		  v->obj->name, v->version);
	sess_send(rq->s, &env);
	return 0;
}

int handlers__object_drop(struct hreq *rq)
{
	const Gmb__ObjectDropRequest *m = rq->env->object_drop;
	struct bclient *c = hconn_of(rq->s)->client;
	bool admin = broker_may_control(rq->h->broker, c, NULL, NULL) == 0;
	int r;

	r = object_drop(rq->h->broker, c, admin, m->name, m->version, rq->err);
	if (r < 0)
		return r;
	handlers_object_event(rq, EVENT_OBJECT_DROP, m->name, m->version, -1, 0);
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

int handlers__object_grant(struct hreq *rq)
{
	const Gmb__ObjectGrantRequest *m = rq->env->object_grant;
	struct bclient *c = hconn_of(rq->s)->client;
	int r;

	r = object_grant(rq->h->broker, c, m->name, (uid_t)m->uid, m->revoke, rq->err);
	if (r < 0)
		return r;
	log_info("%s " SESS_FMT " object=%s uid=%u",
		 m->revoke ? "object grant revoked" : "object granted", SESS_ARGS(rq->s), m->name,
		 (unsigned)m->uid);
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}
