/*
 * object.c - named objects: the table of (uid, name), each object's
 * versions, publish, open, drop and grant (object.h has the invariants).
 *
 * The memory is never the object's own: each version's chunks are held by
 * its export in the import table (import_export_version()), so opens,
 * closes, a reader's death and the state record are the import table's
 * business; this file decides which version is held and which one an open
 * gets, and drops a version's record when import.c says its export went.
 */
#include "daemon/core/object.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/backend/backend.h"
#include "common/list.h"
#include "common/objname.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/import.h"

static void object_copy_drop(struct broker *br, struct bobject_version *v);
static const struct import_version_ops object_version_ops_table;

struct object_table *object_table(struct broker *br)
{
	return br->objects;
}

static struct object_table *object_table_get(struct broker *br, char *err)
{
	if (!br->objects) {
		br->objects = calloc(1, sizeof(*br->objects));
		if (!br->objects)
			err_fmt(err, -ENOMEM, "out of memory recording an object");
	}
	return br->objects;
}

bool object_name_valid(const char *bare)
{
	return objname_valid(bare);
}

int object_name_check(const struct bclient *c, const char *name, uid_t *uid, char *bare, char *err)
{
	const char *rest;
	uint32_t owner;
	bool has_uid;
	const char *why = objname_parse(name, &rest, &has_uid, &owner);

	if (why)
		return err_fmt(err, -EINVAL, "object name '%.80s': %s", name ? name : "", why);
	*uid = has_uid ? (uid_t)owner : c->uid;
	memcpy(bare, rest, strlen(rest) + 1);
	return 0;
}

static struct bobject *object_find(const struct broker *br, uid_t uid, const char *bare)
{
	for (struct bobject *o = br->objects ? br->objects->objects : NULL; o; o = o->next)
		if (o->uid == uid && strcmp(o->name, bare) == 0)
			return o;
	return NULL;
}

static uint64_t object_count_uid(const struct broker *br, uid_t uid)
{
	uint64_t n = 0;

	for (struct bobject *o = br->objects ? br->objects->objects : NULL; o; o = o->next)
		n += o->uid == uid;
	return n;
}

static struct bobject_version *object_version_find(const struct bobject *obj, uint64_t version)
{
	for (struct bobject_version *v = obj->versions; v; v = v->next)
		if (v->version == version)
			return v;
	return NULL;
}

/* @obj's record goes once it is dropped and its last version went. */
static void object_free_if_done(struct broker *br, struct bobject *obj)
{
	if (!obj->dropped || obj->versions)
		return;
	DLIST_UNLINK(br->objects->objects, obj);
	br->objects->nobjects--;
	free(obj);
}

/* @v is no longer held: it lives on for its readers only. */
static void object_unhold(struct broker *br, struct bobject_version *v)
{
	if (!v->held)
		return;
	v->held = false;
	/* Only the latest is held: without it the object holds nothing and is
	 * gone once its last version is (its name free again). */
	if (v->obj->latest == v->version) {
		v->obj->latest = 0;
		v->obj->dropped = true;
	}
	/* May free @v (and its object) at once when nobody reads it. */
	import_version_unheld(br, v->ex);
}

/* A new object @bare of @uid (not dropped, no version). */
static int object_new(struct broker *br, uid_t uid, const char *bare, struct bobject **out,
		      char *err)
{
	struct object_table *t = object_table_get(br, err);
	struct bobject *obj;

	if (!t)
		return -ENOMEM;
	if (object_count_uid(br, uid) >= OBJECT_MAX_PER_UID)
		return err_fmt(err, -ENOSPC, "uid %u has %d objects already: drop one first",
			       (unsigned)uid, OBJECT_MAX_PER_UID);
	obj = calloc(1, sizeof(*obj));
	if (!obj)
		return err_fmt(err, -ENOMEM, "out of memory recording object '%s'", bare);
	snprintf(obj->name, sizeof(obj->name), "%s", bare);
	obj->uid = uid;
	obj->next_version = 1;
	DLIST_PUSH(t->objects, obj);
	t->nobjects++;
	*out = obj;
	return 0;
}

/* @v last on @obj's list (oldest first). */
static void object_version_append(struct bobject *obj, struct bobject_version *v)
{
	struct bobject_version **pos = &obj->versions, *last = NULL;

	while (*pos) {
		last = *pos;
		pos = &(*pos)->next;
	}
	v->prev = last;
	v->next = NULL;
	*pos = v;
}

static uint64_t object_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The publish's checks: who, what, how much. *@a is @c's allocation. */
static int object_publish_check(struct bclient *c, const char *name, uint64_t alloc_id,
				size_t meta_len, uid_t *uid, char *bare, struct balloc **a,
				char *err)
{
	int rc = object_name_check(c, name, uid, bare, err);

	if (rc < 0)
		return rc;
	if (c->tool)
		return err_fmt(err, -EPERM, "a tool may not publish memory");
	if (*uid != c->uid)
		return err_fmt(err, -EPERM,
			       "object '%s' would be uid %u's: client '%s' (uid %u) publishes"
			       " under its own uid only",
			       name, (unsigned)*uid, c->name, (unsigned)c->uid);
	if (meta_len > OBJECT_META_MAX)
		return err_fmt(err, -E2BIG, "a description of %zu bytes (at most %d)", meta_len,
			       OBJECT_META_MAX);
	*a = idmap_get(&c->allocs, alloc_id);
	if (!*a)
		return err_fmt(err, -ENOENT, "client '%s' has no allocation %llu", c->name,
			       (unsigned long long)alloc_id);
	if (!(*a)->active)
		return err_fmt(err, -EBUSY,
			       "allocation %llu is in paused tag '%s': resume it to publish it",
			       (unsigned long long)alloc_id, (*a)->tag->name);
	return 0;
}

int object_publish(struct broker *br, struct bclient *c, const char *name, uint64_t alloc_id,
		   const uint8_t *meta, size_t meta_len, struct bobject_version **out, char *err)
{
	char bare[OBJECT_NAME_MAX + 1];
	uint8_t handle[IPC_HANDLE_SIZE];
	struct bobject_version *v, *prev;
	struct bobject *obj;
	struct balloc *a = NULL;
	bool created = false;
	uid_t uid;
	int rc;

	rc = object_publish_check(c, name, alloc_id, meta_len, &uid, bare, &a, err);
	if (rc < 0)
		return rc;
	obj = object_find(br, uid, bare);
	if (obj && (obj->paused || obj->busy))
		return err_fmt(err, -EBUSY, "object '%s' is %s: resume it to publish", bare,
			       obj->busy ? "being paused or resumed" : "paused");
	if (!obj) {
		rc = object_new(br, uid, bare, &obj, err);
		if (rc < 0)
			return rc;
		created = true;
	}
	v = calloc(1, sizeof(*v));
	if (v)
		v->copy_fd = -1;
	if (!v || (meta_len && !(v->meta = malloc(meta_len)))) {
		rc = err_fmt(err, -ENOMEM, "out of memory recording a version of '%s'", bare);
		goto err_v;
	}
	rc = import_export_version(br, a, v, &object_version_ops_table, &v->ex, handle, err);
	if (rc < 0)
		goto err_v;
	v->export_id = v->ex->id;
	if (meta_len)
		memcpy(v->meta, meta, meta_len);
	v->meta_len = (uint32_t)meta_len;
	v->obj = obj;
	v->version = obj->next_version++;
	v->published_ns = object_now_ns();
	snprintf(v->publisher, sizeof(v->publisher), "%s", c->name);
	v->publisher_pid = c->pid;
	object_version_append(obj, v);
	obj->nversions++;
	/* The commit: the new one is the latest from here on, atomically. */
	prev = obj->latest ? object_version_find(obj, obj->latest) : NULL;
	v->held = true;
	obj->latest = v->version;
	obj->dropped = false;
	if (prev)
		object_unhold(br, prev);
	log_info("object published name=%s uid=%u version=%llu bytes=%llu chunks=%u client=%s",
		 obj->name, (unsigned)obj->uid, (unsigned long long)v->version,
		 (unsigned long long)v->ex->size, v->ex->nchunks, c->name);
	*out = v;
	return 0;

err_v:
	if (v)
		free(v->meta);
	free(v);
	if (created) {
		obj->dropped = true;
		object_free_if_done(br, obj);
	}
	return rc;
}

bool object_may_open(const struct bobject *obj, uid_t uid)
{
	if (uid == obj->uid)
		return true;
	for (uint32_t i = 0; i < obj->ngrants; i++)
		if (obj->grants[i] == uid)
			return true;
	return false;
}

/* @c's view of @name: the object it may see, or -ENOENT / -EPERM. */
static int object_lookup(struct broker *br, const struct bclient *c, bool may_admin,
			 const char *name, struct bobject **out, char *err)
{
	char bare[OBJECT_NAME_MAX + 1];
	struct bobject *obj;
	uid_t uid;
	int rc = object_name_check(c, name, &uid, bare, err);

	if (rc < 0)
		return rc;
	obj = object_find(br, uid, bare);
	if (!obj || (obj->dropped && !obj->versions))
		return err_fmt(err, -ENOENT, "no object '%s' of uid %u", bare, (unsigned)uid);
	/* An administrator drops or pauses what it was never granted to open. */
	if (!may_admin && !object_may_open(obj, c->uid))
		return err_fmt(err, -EPERM,
			       "object '%s' belongs to uid %u, which did not grant uid %u", bare,
			       (unsigned)uid, (unsigned)c->uid);
	*out = obj;
	return 0;
}

int object_open(struct broker *br, struct bclient *c, const char *name, uint64_t version,
		struct bobject_version **out, char *err)
{
	struct bobject *obj;
	struct bobject_version *v;
	int rc = object_lookup(br, c, false, name, &obj, err);

	if (rc < 0)
		return rc;
	if (c->tool)
		return err_fmt(err, -EPERM, "a tool may not open objects");
	if (version == 0 && !obj->latest)
		return err_fmt(err, -ENOENT, "object '%s' of uid %u was dropped", obj->name,
			       (unsigned)obj->uid);
	if (obj->paused || obj->busy)
		return err_fmt(err, -EBUSY, "object '%s' of uid %u is %s", obj->name,
			       (unsigned)obj->uid,
			       obj->busy ? "being paused or resumed" : "paused: resume it first");
	v = object_version_find(obj, version ? version : obj->latest);
	if (!v)
		return err_fmt(err, -ENOENT,
			       "object '%s' has no version %llu (latest %llu; an older one lives"
			       " only while a reader holds it)",
			       obj->name, (unsigned long long)version,
			       (unsigned long long)obj->latest);
	*out = v;
	return 0;
}

/* @name for @c to @what (drop, pause or resume): its owner's uid or an
 * administrator, never while a pause or resume of it runs. */
static int object_acting(struct broker *br, const struct bclient *c, bool may_admin,
			 const char *name, const char *what, struct bobject **out, char *err)
{
	struct bobject *obj;
	int rc = object_lookup(br, c, may_admin, name, &obj, err);

	if (rc < 0)
		return rc;
	if (c->uid != obj->uid && !may_admin)
		return err_fmt(err, -EPERM, "object '%s' belongs to uid %u: uid %u may not %s it",
			       obj->name, (unsigned)obj->uid, (unsigned)c->uid, what);
	if (obj->busy)
		return err_fmt(err, -EBUSY, "object '%s' is being paused or resumed", obj->name);
	*out = obj;
	return 0;
}

int object_drop(struct broker *br, struct bclient *c, bool may_admin, const char *name,
		uint64_t version, char *err)
{
	struct bobject_version *v, *next;
	struct bobject *obj = NULL;
	int rc = object_acting(br, c, may_admin, name, "drop", &obj, err);

	if (rc < 0)
		return rc;
	if (version) {
		v = object_version_find(obj, version);
		if (!v || !v->held)
			return err_fmt(err, -ENOENT, "object '%s' holds no version %llu", obj->name,
				       (unsigned long long)version);
		log_info("object version dropped name=%s uid=%u version=%llu client=%s", obj->name,
			 (unsigned)obj->uid, (unsigned long long)version, c->name);
		object_unhold(br, v);
		return 0;
	}
	log_info("object dropped name=%s uid=%u versions=%u client=%s", obj->name,
		 (unsigned)obj->uid, obj->nversions, c->name);
	obj->dropped = true;
	for (v = obj->versions; v; v = next) {
		next = v->next;
		/* The last unhold may free the object with its last version. */
		if (!next && v->held) {
			object_unhold(br, v);
			return 0;
		}
		object_unhold(br, v);
	}
	object_free_if_done(br, obj);
	return 0;
}

int object_grant(struct broker *br, struct bclient *c, const char *name, uid_t uid, bool revoke,
		 char *err)
{
	struct bobject *obj;
	uint32_t i;
	int rc = object_lookup(br, c, false, name, &obj, err);

	if (rc < 0)
		return rc;
	if (c->uid != obj->uid)
		return err_fmt(err, -EPERM, "object '%s' belongs to uid %u: only it grants",
			       obj->name, (unsigned)obj->uid);
	if (uid == obj->uid)
		return err_fmt(err, -EINVAL, "uid %u owns object '%s': it needs no grant",
			       (unsigned)uid, obj->name);
	for (i = 0; i < obj->ngrants && obj->grants[i] != uid; i++)
		;
	if (revoke) {
		if (i < obj->ngrants)
			obj->grants[i] = obj->grants[--obj->ngrants];
		return 0;
	}
	if (i < obj->ngrants)
		return 0;
	if (obj->ngrants == OBJECT_MAX_GRANTS)
		return err_fmt(err, -ENOSPC, "object '%s' is granted to %d uids already", obj->name,
			       OBJECT_MAX_GRANTS);
	obj->grants[obj->ngrants++] = uid;
	return 0;
}

void object_version_gone(struct broker *br, struct bobject_version *v)
{
	struct bobject *obj = v->obj;

	log_debug("object version gone name=%s version=%llu", obj->name,
		  (unsigned long long)v->version);
	DLIST_UNLINK(obj->versions, v);
	obj->nversions--;
	if (obj->latest == v->version)
		obj->latest = 0;
	object_copy_drop(br, v);
	free(v->meta);
	free(v);
	object_free_if_done(br, obj);
}

uint64_t object_bytes(const struct bobject *obj)
{
	uint64_t n = 0;

	for (const struct bobject_version *v = obj->versions; v; v = v->next)
		n += v->ex->size;
	return n;
}

uint64_t object_uid_chunks(const struct broker *br, uid_t uid)
{
	uint64_t n = 0;

	for (struct bobject *o = br->objects ? br->objects->objects : NULL; o; o = o->next)
		if (o->uid == uid)
			for (const struct bobject_version *v = o->versions; v; v = v->next)
				n += v->ex->nchunks;
	return n;
}

int object_walk(const struct broker *br, object_walk_fn fn, void *arg)
{
	int rc;

	for (struct bobject *o = br->objects ? br->objects->objects : NULL; o; o = o->next)
		if ((rc = fn(arg, o)) != 0)
			return rc;
	return 0;
}

uint32_t object_version_readers(const struct bobject_version *v)
{
	return v->ex->nimports;
}

void object_free_records(struct bobject *obj)
{
	while (obj->versions) {
		struct bobject_version *v = obj->versions;

		DLIST_UNLINK(obj->versions, v);
		if (v->copy_fd >= 0)
			close(v->copy_fd);
		free(v->meta);
		free(v);
	}
	free(obj);
}

void object_deinit(struct broker *br)
{
	struct object_table *t = br->objects;

	if (!t)
		return;
	/* Every version unheld: those nobody reads go now, the rest with the import table. */
	while (t->objects) {
		struct bobject *obj = t->objects;

		obj->dropped = true;
		for (struct bobject_version *v = obj->versions, *next; v; v = next) {
			next = v->next;
			object_unhold(br, v);
		}
		/* Still read: the import table's deinit frees what is left. */
		if (t->objects == obj) {
			for (struct bobject_version *v = obj->versions; v; v = v->next)
				v->ex->version = NULL;
			DLIST_UNLINK(t->objects, obj);
			object_free_records(obj);
		}
	}
	free(t);
	br->objects = NULL;
}

/* ---- pause and resume ---- */

int object_pause_find(struct broker *br, struct bclient *c, bool may_admin, const char *name,
		      bool resume, struct bobject **out, char *err)
{
	struct bobject *obj = NULL;
	int rc = object_acting(br, c, may_admin, name, resume ? "resume" : "pause", &obj, err);

	if (rc < 0)
		return rc;
	*out = obj;
	return obj->paused == !resume ? 1 : 0;
}

uint32_t object_mapped_readers(const struct bobject *obj)
{
	uint32_t n = 0;

	for (const struct bobject_version *v = obj->versions; v; v = v->next)
		n += v->ex->nmapped;
	return n;
}

/* The hooks of @br's owner, if any. */
static const struct object_hooks *object_hooks_of(const struct broker *br)
{
	const struct object_hooks *h = br->opts.object_hooks;

	return h && h->copy_made && h->copy_gone ? h : NULL;
}

/* @v's copy goes: closed, its owner told. */
static void object_copy_drop(struct broker *br, struct bobject_version *v)
{
	const struct object_hooks *hk = object_hooks_of(br);

	if (v->copy_fd < 0)
		return;
	if (hk)
		hk->copy_gone(hk->arg, v->export_id, v->copy_size);
	close(v->copy_fd);
	v->copy_fd = -1;
	v->copy_size = 0;
}

int object_pause_release(struct broker *br, struct bobject *obj, int *copy_fds, char *err)
{
	const struct object_hooks *hk = object_hooks_of(br);
	struct bobject_version *v;
	uint64_t touched = 0;
	size_t i = 0;
	int rc;

	/* Every copy kept where a restart finds it, or none. */
	for (v = obj->versions; copy_fds && hk && v; v = v->next, i++) {
		rc = hk->copy_made(hk->arg, v->export_id, v->ex->size, copy_fds[i]);
		if (rc < 0) {
			for (struct bobject_version *u = obj->versions; u != v; u = u->next)
				hk->copy_gone(hk->arg, u->export_id, u->ex->size);
			return err_fmt(err, rc, "object '%s': its host copy cannot be kept: %s",
				       obj->name, backend_last_error());
		}
	}
	for (v = obj->versions, i = 0; v; v = v->next, i++) {
		struct import_export *ex = v->ex;
		struct pool *p = &br->pools[ex->dev];

		if (copy_fds) {
			v->copy_fd = copy_fds[i];
			v->copy_size = ex->size;
			copy_fds[i] = -1;
		}
		for (uint32_t k = 0; k < ex->nchunks; k++)
			pool_unpin(p, ex->chunks[k]);
		free(ex->chunks);
		ex->chunks = NULL;
		ex->nchunks = 0;
		touched |= 1ULL << (unsigned)ex->dev;
	}
	obj->paused = true;
	obj->discarded = !copy_fds;
	/* The driver gets them back now, as a tag's pause gives them (the keep limit). */
	for (int d = 0; d < br->ndevices; d++)
		if (touched & (1ULL << (unsigned)d))
			pool_shrink(&br->pools[d], br->opts.pool_keep, NULL);
	log_info("object paused name=%s uid=%u versions=%u discarded=%d", obj->name,
		 (unsigned)obj->uid, obj->nversions, obj->discarded);
	return 0;
}

/* @ex's new chunks for @size bytes of uid @uid, pinned and lent to nobody. */
static int object_take(struct broker *br, struct import_export *ex, uid_t uid, char *err)
{
	struct pool *p = &br->pools[ex->dev];
	struct pool_take t = { .size = ex->size, .uid = uid };
	int rc = pool_take(p, &t);

	if (rc < 0)
		return err_fmt(err, rc,
			       "device %d: %llu bytes for object version (export %llu): %s%s",
			       ex->dev, (unsigned long long)ex->size, (unsigned long long)ex->id,
			       rc == -ENOMEM ? "the budget is exhausted" : strerror(-rc),
			       rc == -EAGAIN ? " (waiting for drops)" : "");
	for (uint32_t i = 0; i < t.nchunks; i++) {
		pool_lend(p, t.chunks[i], NULL);
		pool_pin(p, t.chunks[i]);
	}
	ex->chunks = t.chunks;
	ex->nchunks = t.nchunks;
	return 0;
}

/* @ex's chunks back (a resume undone). */
static void object_untake(struct broker *br, struct import_export *ex)
{
	struct pool *p = &br->pools[ex->dev];

	for (uint32_t i = 0; i < ex->nchunks; i++)
		pool_unpin(p, ex->chunks[i]);
	free(ex->chunks);
	ex->chunks = NULL;
	ex->nchunks = 0;
	pool_shrink(p, br->opts.pool_keep, NULL);
}

int object_resume_take(struct broker *br, struct bobject *obj, char *err)
{
	struct bobject_version *v;
	int rc = 0;

	for (v = obj->versions; v && rc == 0; v = v->next)
		rc = object_take(br, v->ex, obj->uid, err);
	if (rc == 0)
		return 0;
	object_resume_undo(br, obj);
	return rc;
}

void object_resume_undo(struct broker *br, struct bobject *obj)
{
	for (struct bobject_version *v = obj->versions; v; v = v->next)
		if (v->ex->chunks)
			object_untake(br, v->ex);
}

void object_resume_done(struct broker *br, struct bobject *obj)
{
	for (struct bobject_version *v = obj->versions; v; v = v->next)
		object_copy_drop(br, v);
	obj->paused = false;
	obj->discarded = false;
	log_info("object resumed name=%s uid=%u versions=%u", obj->name, (unsigned)obj->uid,
		 obj->nversions);
}

void object_job_end(struct broker *br, struct bobject *obj)
{
	struct bobject_version *v, *next;

	obj->busy = false;
	/* Readers that closed while it copied: their versions go now (maybe @obj too). */
	for (v = obj->versions; v; v = next) {
		next = v->next;
		if (!v->held && !v->ex->imports) {
			if (!next) {
				import_version_unheld(br, v->ex);
				return;
			}
			import_version_unheld(br, v->ex);
		}
	}
}

/* ---- what the import table asks of a version (import.h) ---- */

static int object_ops_may_map(const struct bobject_version *v, const struct bclient *c, char *err)
{
	const struct bobject *obj = v->obj;

	if (!object_may_open(obj, c->uid))
		return err_fmt(err, -EPERM,
			       "object '%s' belongs to uid %u, which did not grant uid %u:"
			       " client '%s' may not open it",
			       obj->name, (unsigned)obj->uid, (unsigned)c->uid, c->name);
	if (obj->paused || obj->busy)
		return err_fmt(err, -EBUSY, "object '%s' is paused: resume it first", obj->name);
	return 0;
}

/* Held, or a job copying its object's bytes (it lets go in object_job_end()). */
static bool object_ops_kept(const struct bobject_version *v)
{
	return v->held || v->obj->busy;
}

static const struct import_version_ops object_version_ops_table = {
	.may_map = object_ops_may_map,
	.kept = object_ops_kept,
	.gone = object_version_gone,
};

const struct import_version_ops *object_version_ops(void)
{
	return &object_version_ops_table;
}
