/*
 * object.c - the exported calls of named objects (include/gmb.h "Named
 * objects"): publish, open, close, drop, grant.
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
 * op_lock. Drop and grant only make a round trip (as gmb_trim() does):
 * tools (gmbctl) call them, and a control handler may too.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/api/client.h"

/* Bytes of a bare name (gmbd's OBJECT_NAME_MAX) and of "UID/NAME". */
#define OBJ_NAME_MAX 64
#define OBJ_UID_MAX  10

static int obj_done(struct gmb_client *c, int rc, const char *err)
{
	if (rc >= 0)
		return rc;
	pthread_mutex_lock(&c->conn.lock);
	err_fmt(c->last_error, rc, "%s", *err ? err : gmb_strerror(rc));
	pthread_mutex_unlock(&c->conn.lock);
	return rc;
}

static bool obj_name_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '.' || ch == '_' || ch == '-';
}

/*
 * NAME or UID/NAME, checked here as gmbd checks it, so that a bad name
 * says what is wrong with it before any request.
 */
static int obj_name_check(const char *name, char *err)
{
	const char *slash, *bare;
	size_t n;

	if (!name || !*name)
		return err_fmt(err, -EINVAL, "an object needs a name");
	slash = strchr(name, '/');
	bare = slash ? slash + 1 : name;
	if (slash) {
		if (slash == name || (size_t)(slash - name) > OBJ_UID_MAX)
			return err_fmt(err, -EINVAL, "object \"%.80s\": UID/NAME wants a uid",
				       name);
		for (const char *p = name; p < slash; p++)
			if (*p < '0' || *p > '9')
				return err_fmt(err, -EINVAL,
					       "object \"%.80s\": \"%.*s\" is not a uid", name,
					       (int)(slash - name), name);
	}
	n = strlen(bare);
	if (n == 0 || n > OBJ_NAME_MAX)
		return err_fmt(err, -EINVAL, "object \"%.80s\": a name is 1 to %d bytes", name,
			       OBJ_NAME_MAX);
	for (size_t i = 0; i < n; i++)
		if (!obj_name_char(bare[i]))
			return err_fmt(err, -EINVAL,
				       "object \"%.80s\": a name is made of [A-Za-z0-9._-]", name);
	return 0;
}

GMB_API int gmb_object_drop(gmb_client *c, const char *name, uint64_t version)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectDropRequest req = GMB__OBJECT_DROP_REQUEST__INIT;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	rc = obj_name_check(name, err);
	if (rc < 0)
		return obj_done(c, rc, err);
	req.name = (char *)name;
	req.version = version;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_DROP;
	env.object_drop = &req;
	return obj_done(c, gmb__request_status(&c->conn, &env, err), err);
}

GMB_API int gmb_object_grant(gmb_client *c, const char *name, uint32_t uid, int revoke)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ObjectGrantRequest req = GMB__OBJECT_GRANT_REQUEST__INIT;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	rc = obj_name_check(name, err);
	if (rc < 0)
		return obj_done(c, rc, err);
	req.name = (char *)name;
	req.uid = uid;
	req.revoke = revoke != 0;
	env.body_case = GMB__ENVELOPE__BODY_OBJECT_GRANT;
	env.object_grant = &req;
	return obj_done(c, gmb__request_status(&c->conn, &env, err), err);
}
