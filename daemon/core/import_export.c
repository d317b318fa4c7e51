/*
 * import_export.c - the making side of memory shared between processes:
 * the table at its first use (its random instance id), an allocation's
 * export (made at its first handle or grant, with its random token), a
 * named object's version export, the handles encoded from them, and the
 * uids an export is granted to (import.h has the invariants).
 *
 * Everything here makes or names an export; nothing here opens, closes
 * or drops an import record. import.c, which keeps the records and checks
 * every handle it is given, never calls this file: the one call goes this
 * way, import_pin() for a version's chunks at its making.
 */
#include "daemon/core/import.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/err.h"
#include "common/list.h"
#include "daemon/core/broker.h"

static int import_export_random(void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = getrandom((char *)buf + got, n - got, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -EIO;
		got += (size_t)r;
	}
	return 0;
}

static struct import_table *import_export_table(struct broker *br, char *err)
{
	struct import_table *t = br->imports;

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t) {
		err_fmt(err, -ENOMEM, "out of memory recording an export");
		return NULL;
	}
	/* Never 0: decode refuses it. */
	while (!t->instance) {
		if (import_export_random(&t->instance, sizeof(t->instance)) < 0) {
			free(t);
			err_fmt(err, -EIO, "no randomness for gmbd's instance id");
			return NULL;
		}
	}
	t->next_id = 1;
	br->imports = t;
	return t;
}

/* The offset of the chunk of @a holding @offset; -EINVAL past its end. */
static int import_export_range_of(const struct balloc *a, uint64_t offset, uint64_t *range_off)
{
	uint64_t off = 0;

	for (uint32_t i = 0; i < a->nchunks && a->chunks[i]; i++) {
		if (offset < off + a->chunks[i]->size) {
			*range_off = off;
			return 0;
		}
		off += a->chunks[i]->size;
	}
	return -EINVAL;
}

static int import_export_new(struct import_table *t, struct balloc *a, struct import_export **out,
			     char *err)
{
	struct bclient *c = a->tag->client;
	struct import_export *ex = calloc(1, sizeof(*ex));

	if (!ex)
		return err_fmt(err, -ENOMEM, "out of memory recording an export");
	if (import_export_random(ex->token, sizeof(ex->token)) < 0) {
		free(ex);
		return err_fmt(err, -EIO, "no randomness for the export's token");
	}
	ex->id = t->next_id;
	ex->alloc_id = a->id;
	ex->alloc = a;
	ex->owner_id = c->id;
	snprintf(ex->owner, sizeof(ex->owner), "%s", c->name);
	ex->owner_pid = c->pid;
	ex->owner_uid = c->uid;
	ex->dev = a->dev;
	ex->size = a->size;
	if (idmap_put(&t->by_id, ex->id, ex) < 0)
		goto err_free;
	if (idmap_put(&t->by_alloc, a->id, ex) < 0)
		goto err_by_id;
	t->next_id++;
	DLIST_PUSH(t->exports, ex);
	t->nexports++;
	*out = ex;
	return 0;

err_by_id:
	idmap_del(&t->by_id, ex->id);
err_free:
	free(ex);
	return err_fmt(err, -ENOMEM, "out of memory recording an export");
}

static void import_export_handle_of(const struct import_table *t, const struct import_export *ex,
				    uint64_t range_off, uint8_t *out)
{
	struct ipc_handle h = {
		.instance = t->instance,
		.owner = ex->owner_id,
		.alloc = ex->alloc_id,
		.gen = ex->id,
		.range_off = range_off,
		.dev = (uint32_t)ex->dev,
	};

	memcpy(h.token, ex->token, sizeof(h.token));
	ipc_handle_encode(&h, out);
}

/* @c's allocation @alloc_id, or NULL with @err. */
static struct balloc *import_export_alloc_of(struct bclient *c, uint64_t alloc_id, char *err)
{
	struct balloc *a = idmap_get(&c->allocs, alloc_id);

	if (!a)
		err_fmt(err, -ENOENT, "client '%s' has no allocation %llu", c->name,
			(unsigned long long)alloc_id);
	return a;
}

/* @a's export, made at the first call. */
static int import_export_of(struct broker *br, struct balloc *a, struct import_export **out,
			    char *err)
{
	struct import_table *t = import_export_table(br, err);

	if (!t)
		return -ENOMEM;
	*out = idmap_get(&t->by_alloc, a->id);
	return *out ? 0 : import_export_new(t, a, out, err);
}

int import_export(struct broker *br, struct bclient *c, uint64_t alloc_id, uint64_t offset,
		  uint8_t *handle, char *err)
{
	struct balloc *a = import_export_alloc_of(c, alloc_id, err);
	struct import_export *ex;
	uint64_t range_off;
	int rc;

	if (!a)
		return -ENOENT;
	if (!a->active)
		return err_fmt(err, -EBUSY,
			       "allocation %llu is in paused tag '%s': resume it to share it",
			       (unsigned long long)alloc_id, a->tag->name);
	if (import_export_range_of(a, offset, &range_off) < 0)
		return err_fmt(err, -EINVAL, "offset %llu is past allocation %llu's %llu bytes",
			       (unsigned long long)offset, (unsigned long long)alloc_id,
			       (unsigned long long)a->size);
	rc = import_export_of(br, a, &ex, err);
	if (rc < 0)
		return rc;
	import_export_handle_of(br->imports, ex, range_off, handle);
	return 0;
}

int import_export_version(struct broker *br, struct balloc *a, struct bobject_version *v,
			  const struct import_version_ops *ops, struct import_export **out,
			  uint8_t *handle, char *err)
{
	struct import_table *t = import_export_table(br, err);
	struct import_export *ex;
	int rc;

	if (!t)
		return -ENOMEM;
	ex = calloc(1, sizeof(*ex));
	if (!ex)
		return err_fmt(err, -ENOMEM, "out of memory recording a version");
	rc = import_export_random(ex->token, sizeof(ex->token));
	if (rc < 0) {
		free(ex);
		return err_fmt(err, -EIO, "no randomness for the version's token");
	}
	ex->id = t->next_id;
	ex->alloc_id = a->id;
	ex->owner_id = a->tag->client->id;
	snprintf(ex->owner, sizeof(ex->owner), "%s", a->tag->client->name);
	ex->owner_pid = a->tag->client->pid;
	ex->owner_uid = a->tag->client->uid;
	ex->dev = a->dev;
	ex->size = a->size;
	ex->version = v;
	ex->vops = ops;
	/* The allocation goes right after: pin its chunks for the version now. */
	ex->alloc = a;
	rc = import_pin(br, ex, err);
	ex->alloc = NULL;
	if (rc < 0 || idmap_put(&t->by_id, ex->id, ex) < 0) {
		for (uint32_t i = 0; rc == 0 && i < ex->nchunks; i++)
			pool_unpin(&br->pools[ex->dev], ex->chunks[i]);
		free(ex->chunks);
		free(ex);
		return rc < 0 ? rc : err_fmt(err, -ENOMEM, "out of memory recording a version");
	}
	t->next_id++;
	DLIST_PUSH(t->exports, ex);
	t->nexports++;
	import_export_handle_of(t, ex, 0, handle);
	*out = ex;
	return 0;
}

void import_export_version_handle(const struct broker *br, const struct import_export *ex,
				  uint8_t *handle)
{
	import_export_handle_of(br->imports, ex, 0, handle);
}

int import_export_grant(struct broker *br, struct bclient *c, uint64_t alloc_id, uid_t uid,
			bool revoke, char *err)
{
	struct balloc *a = import_export_alloc_of(c, alloc_id, err);
	struct import_export *ex;
	uint32_t i;
	int rc;

	if (!a)
		return -ENOENT;
	if (uid == c->uid)
		return err_fmt(err, -EINVAL, "uid %u is the owner's own: it needs no grant",
			       (unsigned)uid);
	ex = br->imports ? idmap_get(&br->imports->by_alloc, alloc_id) : NULL;
	if (!ex && revoke)
		return 0;
	if (!ex && (rc = import_export_of(br, a, &ex, err)) < 0)
		return rc;
	for (i = 0; i < ex->ngrants && ex->grants[i] != uid; i++)
		;
	if (revoke) {
		if (i < ex->ngrants)
			ex->grants[i] = ex->grants[--ex->ngrants];
		return 0;
	}
	if (i < ex->ngrants)
		return 0;
	if (ex->ngrants == IMPORT_MAX_GRANTS)
		return err_fmt(err, -ENOSPC, "allocation %llu is granted to %d uids already",
			       (unsigned long long)alloc_id, IMPORT_MAX_GRANTS);
	ex->grants[ex->ngrants++] = uid;
	return 0;
}
