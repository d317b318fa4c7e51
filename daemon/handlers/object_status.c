/*
 * object_status.c - the named objects' part of the status reply: each
 * object (its owner, latest version, bytes, grants) with its versions, in
 * a part of its own after the imports, the last one (more = false).
 *
 * The part stays one packet whatever the objects are: at most
 * HOBJ_STATUS_MAX objects, each with its HOBJ_STATUS_VERSIONS newest
 * versions, and no object past HOBJ_STATUS_BYTES of packed rows;
 * objects_total counts every object, listed or not. Strings and grants
 * point into the broker's table: the rows live no longer than the request.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/broker.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

/* What a part of the reply may hold of rows: the envelope's room left. */
#define HOBJ_STATUS_BYTES (WIRE_MAX_MSG / 2)

/* One version's row of @obj, versions[] filled from @rows->vv[rows->nv]. */
static void handlers_object_version(struct hobj_rows *rows, const struct bobject *obj,
				    const struct bobject_version *v)
{
	Gmb__ObjectVersionInfo *vi = &rows->vv[rows->nv];

	gmb__object_version_info__init(vi);
	vi->version = v->version;
	vi->bytes = v->ex ? v->ex->size : 0;
	vi->device = v->ex && v->ex->dev >= 0 ? (uint32_t)v->ex->dev : 0;
	vi->readers = object_version_readers(v);
	vi->latest = obj->latest && v->version == obj->latest;
	vi->published_ns = v->published_ns;
	vi->publisher = (char *)v->publisher;
	vi->publisher_pid = (int32_t)v->publisher_pid;
	vi->meta_bytes = v->meta_len;
	rows->pvv[rows->nv++] = vi;
}

static int handlers_object_row(void *arg, const struct bobject *obj)
{
	struct hobj_rows *rows = arg;
	const struct bobject_version *v, *first = obj->versions;
	Gmb__ObjectInfo *oi;
	size_t skip, start = rows->nv;

	rows->total++;
	if (rows->n >= HOBJ_STATUS_MAX || rows->full)
		return 0;
	oi = &rows->v[rows->n];
	gmb__object_info__init(oi);
	oi->name = (char *)obj->name;
	oi->owner_uid = (uint32_t)obj->uid;
	oi->latest = obj->latest;
	oi->bytes = object_bytes(obj);
	oi->paused = obj->paused;
	oi->discarded = obj->discarded;
	/* uid_t is the kernel's 32-bit id: the wire's type. */
	oi->n_grants = obj->ngrants < OBJECT_MAX_GRANTS ? obj->ngrants : OBJECT_MAX_GRANTS;
	oi->grants = (uint32_t *)obj->grants;
	/* The newest versions, oldest first as on the object's list. */
	skip = obj->nversions > HOBJ_STATUS_VERSIONS ? obj->nversions - HOBJ_STATUS_VERSIONS : 0;
	for (v = first; v && skip; v = v->next, skip--)
		;
	for (; v && rows->nv - start < HOBJ_STATUS_VERSIONS; v = v->next)
		handlers_object_version(rows, obj, v);
	oi->n_versions = rows->nv - start;
	oi->versions = &rows->pvv[start];
	/* Past the part's room: this object and the rest are only counted. */
	rows->bytes += gmb__object_info__get_packed_size(oi) + 8;
	if (rows->n && rows->bytes > HOBJ_STATUS_BYTES) {
		rows->full = true;
		rows->nv = start;
		return 0;
	}
	rows->pv[rows->n++] = oi;
	return 0;
}

int handlers__object_rows(const struct broker *br, struct hobj_rows *rows)
{
	*rows = (struct hobj_rows){ 0 };
	rows->v = calloc(HOBJ_STATUS_MAX, sizeof(*rows->v));
	rows->pv = calloc(HOBJ_STATUS_MAX, sizeof(*rows->pv));
	rows->vv = calloc(HOBJ_STATUS_MAX * HOBJ_STATUS_VERSIONS, sizeof(*rows->vv));
	rows->pvv = calloc(HOBJ_STATUS_MAX * HOBJ_STATUS_VERSIONS, sizeof(*rows->pvv));
	if (!rows->v || !rows->pv || !rows->vv || !rows->pvv) {
		handlers__object_rows_free(rows);
		return -ENOMEM;
	}
	object_walk(br, handlers_object_row, rows);
	return 0;
}

int handlers__object_status_part(struct hreq *rq, const struct hobj_rows *rows)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusReply sr = GMB__STATUS_REPLY__INIT;

	sr.n_objects = rows->n;
	sr.objects = rows->pv;
	sr.objects_total = rows->total;
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REPLY;
	env.status_reply = &sr;
	return sess_send(rq->s, &env);
}

void handlers__object_rows_free(struct hobj_rows *rows)
{
	free(rows->pvv);
	free(rows->vv);
	free(rows->pv);
	free(rows->v);
	*rows = (struct hobj_rows){ 0 };
}
