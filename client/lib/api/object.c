/*
 * object.c - the exported calls of named objects (include/gmb.h "Named
 * objects"): publish, open, close, drop, grant, pause and resume.
 *
 * A version is an import (client/lib/ipc/) marked as an object's and
 * mapped read-only: an open asks gmbd for the version's handle
 * (ObjectOpenRequest) and opens that handle as gmb_ipc_open() does; a
 * publish hands the allocation to gmbd (ObjectPublishRequest), lets go of
 * it here as a free does but keeps its address range, and opens the new
 * version's handle at that same range, so that the publisher's pointer
 * stays valid, read-only.
 *
 * Publish, open and close change this client's mappings: they hold
 * op_lock. Drop, grant, pause and resume only make a round trip (as
 * gmb_trim() does): tools (gmbctl) call them, and a control handler may
 * too. A pause or resume must not hold op_lock above all: gmbd asks every
 * process mapping the object to follow (IpcFollow) before it answers, this
 * one too when it has a version open, and its worker takes op_lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/api/client.h"
#include "common/objname.h"

static int obj_done(struct gmb_client *c, int rc, const char *err)
{
	if (rc >= 0)
		return rc;
	pthread_mutex_lock(&c->conn.lock);
	err_fmt(c->last_error, rc, "%s", *err ? err : gmb_strerror(rc));
	pthread_mutex_unlock(&c->conn.lock);
	return rc;
}

/* NAME or UID/NAME, checked here as gmbd checks it (common/objname.h), so
 * that a bad name says what is wrong with it before any request. */
static int obj_name_check(const char *name, char *err)
{
	const char *bare;
	uint32_t uid;
	bool has_uid;
	const char *why = objname_parse(name, &bare, &has_uid, &uid);

	return why ? err_fmt(err, -EINVAL, "object \"%.80s\": %s", name ? name : "", why) : 0;
}

/* A request about @name answered with a status alone (drop, grant, pause):
 * no operation lock, so that gmbctl calls them as a tool and a reader's
 * own thread answers the pause's IpcFollow meanwhile. */
static int obj_send_named(gmb_client *c, const char *name, Gmb__Envelope *env)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	rc = obj_name_check(name, err);
	if (rc == 0)
		rc = gmb__request_status(&c->conn, env, err);
	return obj_done(c, rc, err);
}

GMB_API int gmb_object_drop(gmb_client *c, const char *name, uint64_t version)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectDropRequest req = GMB__OBJECT_DROP_REQUEST__INIT;

	req.name = (char *)name;
	req.version = version;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_DROP;
	env.object_drop = &req;
	return obj_send_named(c, name, &env);
}

GMB_API int gmb_object_grant(gmb_client *c, const char *name, uint32_t uid, int revoke)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectGrantRequest req = GMB__OBJECT_GRANT_REQUEST__INIT;

	req.name = (char *)name;
	req.uid = uid;
	req.revoke = revoke != 0;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_GRANT;
	env.object_grant = &req;
	return obj_send_named(c, name, &env);
}

/* ObjectPauseRequest: the status is the answer (once the readers followed). */
static int obj_pause_send(gmb_client *c, const char *name, bool resume, bool discard)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectPauseRequest req = GMB__OBJECT_PAUSE_REQUEST__INIT;

	req.name = (char *)name;
	req.resume = resume;
	req.discard = discard;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_PAUSE;
	env.object_pause = &req;
	return obj_send_named(c, name, &env);
}

GMB_API int gmb_object_pause(gmb_client *c, const char *name, int discard)
{
	return obj_pause_send(c, name, false, discard != 0);
}

GMB_API int gmb_object_resume(gmb_client *c, const char *name)
{
	return obj_pause_send(c, name, true, false);
}

/* The last part of @rep, of kind @body; NULL when gmbd sent another. */
static const Gmb__Envelope *obj_last(const struct gmb__reply *rep, Gmb__Envelope__BodyCase body)
{
	const Gmb__Envelope *last = rep->nparts ? rep->parts[rep->nparts - 1] : NULL;

	return last && last->body_case == body ? last : NULL;
}

/* A handle of gmbd's, naming its range's start (a version's handle does). */
static bool obj_handle_ok(const ProtobufCBinaryData *b)
{
	struct ipc_handle h;

	return b->len == IPC_HANDLE_SIZE && ipc_handle_decode(b->data, &h) == 0 && h.range_off == 0;
}

/*
 * gmbd took @a (version @version of @name, handle @handle): it leaves this
 * client, and its range is mapped again, read-only, as this process's open
 * of the version. On failure the range is freed: the version stays
 * published, the pointer is gone.
 */
static int obj_publish_map(struct gmb_client *c, struct gmb__alloc *a, const char *name,
			   uint64_t version, const uint8_t *handle, char *err)
{
	struct gmb__ipc_how how = { .dev_index = -1, .object = true };
	void *base = (void *)a->va, *p = NULL;
	int rc;

	gmb__allocs_give_away(&c->mem, a, &how.at, &how.at_size);
	if (!how.at)
		return err_fmt(err, -EIO,
			       "published version %" PRIu64 " of \"%s\", but %p could not be"
			       " unmapped to map it again read-only",
			       version, name, base);
	/* The handle names the range's start (obj_handle_ok()): p is base. */
	rc = gmb__ipc_open_how(&c->mem, &c->ipc, handle, &how, &p, err);
	if (rc < 0) {
		char why[ERR_MSG_MAX];

		snprintf(why, sizeof(why), "%s", *err ? err : gmb_strerror(rc));
		c->mem.be->ops->va_free(c->mem.be, how.at, how.at_size);
		err_fmt(err, rc,
			"published version %" PRIu64 " of \"%s\", but mapping it again: %s",
			version, name, why);
	}
	return rc;
}

GMB_API int gmb_object_publish(gmb_client *c, const char *name, void *ptr, const void *meta,
			       size_t meta_len, uint64_t *version)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectPublishRequest req = GMB__OBJECT_PUBLISH_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__Envelope *last;
	uint8_t handle[IPC_HANDLE_SIZE];
	char err[ERR_MSG_MAX] = "";
	struct gmb__alloc *a;
	uint64_t v = 0;
	int rc;

	if (!c)
		return -EINVAL;
	rc = obj_name_check(name, err);
	if (rc == 0 && strchr(name, '/'))
		rc = err_fmt(err, -EINVAL, "object \"%.80s\": one publishes under one's own uid",
			     name);
	if (rc == 0 && meta_len > GMB_OBJECT_META_MAX)
		rc = err_fmt(err, -E2BIG, "a description of %zu bytes is past %d", meta_len,
			     GMB_OBJECT_META_MAX);
	if (rc == 0 && !meta && meta_len)
		rc = err_fmt(err, -EINVAL, "no description for %zu bytes", meta_len);
	if (rc < 0)
		return obj_done(c, rc, err);
	gmb__op_begin(&c->conn);
	rc = gmb__allocs_give_check(&c->mem, ptr, &a, err);
	if (rc < 0)
		goto out;
	req.name = (char *)name;
	req.alloc_id = a->id;
	req.meta.data = (uint8_t *)meta;
	req.meta.len = meta_len;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_PUBLISH;
	env.object_publish = &req;
	rc = gmb__request(&c->conn, &env, &rep, err);
	if (rc < 0 && rep.status < 0)
		goto out; /* refused: the allocation is still ours */
	last = obj_last(&rep, GMB__ENVELOPE__BODY_OBJECT_PUBLISH_REPLY);
	if (rc == 0 && (!last || !obj_handle_ok(&last->object_publish_reply->handle) ||
			last->object_publish_reply->version == 0))
		rc = err_fmt(err, -EPROTO, "gmbd's publish reply lacks a version or its handle");
	if (rc < 0) {
		/* gmbd took it all the same: nothing of it may stay mapped here. */
		uintptr_t va;
		uint64_t size;

		gmb__allocs_give_away(&c->mem, a, &va, &size);
		if (va)
			c->mem.be->ops->va_free(c->mem.be, va, size);
		goto out;
	}
	v = last->object_publish_reply->version;
	memcpy(handle, last->object_publish_reply->handle.data, IPC_HANDLE_SIZE);
	if (version)
		*version = v;
	rc = obj_publish_map(c, a, name, v, handle, err);
out:
	gmb__reply_deinit(&rep);
	gmb__op_end(&c->conn);
	return obj_done(c, rc, err);
}

/* The reply's facts for the caller; the version is open at @p already. */
static void obj_info_fill(struct gmb_client *c, const Gmb__ObjectOpenReply *r,
			  struct gmb_object_info *info, void *meta, size_t meta_cap)
{
	const struct backend *be = c->mem.be;

	/* An empty description comes as no data at all. */
	if (meta && meta_cap && r->meta.len)
		memcpy(meta, r->meta.data, r->meta.len < meta_cap ? r->meta.len : meta_cap);
	if (!info)
		return;
	*info = (struct gmb_object_info){
		.version = r->version,
		.size = r->size,
		/* gmbd's index, as this process's runtime names the device. */
		.device = r->device < (uint32_t)be->ndevices ? be->devices[r->device].ordinal : -1,
		.owner_uid = r->owner_uid,
		.meta_len = r->meta.len,
	};
}

GMB_API int gmb_object_open(gmb_client *c, const char *name, uint64_t version, void **ptr,
			    struct gmb_object_info *info, void *meta, size_t meta_cap)
{
	const struct gmb__ipc_how how = { .dev_index = -1, .object = true };
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectOpenRequest req = GMB__OBJECT_OPEN_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__ObjectOpenReply *r;
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	void *p = NULL;
	int rc;

	if (!c)
		return -EINVAL;
	rc = obj_name_check(name, err);
	if (rc == 0 && !ptr)
		rc = err_fmt(err, -EINVAL, "no place for the pointer");
	if (rc < 0)
		return obj_done(c, rc, err);
	gmb__op_begin(&c->conn);
	rc = gmb__mem_backend(&c->mem, err);
	if (rc < 0)
		goto out;
	req.name = (char *)name;
	req.version = version;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_OPEN;
	env.object_open = &req;
	rc = gmb__request(&c->conn, &env, &rep, err);
	last = obj_last(&rep, GMB__ENVELOPE__BODY_OBJECT_OPEN_REPLY);
	if (rc == 0 && (!last || !obj_handle_ok(&last->object_open_reply->handle) ||
			last->object_open_reply->version == 0 ||
			(version && last->object_open_reply->version != version)))
		rc = err_fmt(err, -EPROTO, "gmbd's open reply lacks the version or its handle");
	if (rc < 0)
		goto out;
	r = last->object_open_reply;
	rc = gmb__ipc_open_how(&c->mem, &c->ipc, r->handle.data, &how, &p, err);
	if (rc < 0)
		goto out;
	obj_info_fill(c, r, info, meta, meta_cap);
	*ptr = p;
out:
	gmb__reply_deinit(&rep);
	gmb__op_end(&c->conn);
	return obj_done(c, rc, err);
}

GMB_API int gmb_object_close(gmb_client *c, void *ptr)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	gmb__op_begin(&c->conn);
	if (!gmb__ipc_is_object(&c->ipc, ptr))
		rc = err_fmt(err, -ENXIO, "pointer %p is no open version of a named object here",
			     ptr);
	else
		rc = gmb__ipc_close(&c->mem, &c->ipc, ptr, err);
	gmb__op_end(&c->conn);
	return obj_done(c, rc, err);
}
