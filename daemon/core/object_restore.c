/*
 * object_restore.c - named objects back from a previous gmbd's record
 * (object.h, "Restart without loss"): the objects and their versions
 * first, without memory; the import table's restore then links each
 * version's export (which holds the chunks) by its id; the finish drops
 * what did not come back whole.
 *
 * Everything is checked as the record has it, never trusted: names, the
 * order of version numbers, the latest being a held version, one export per
 * version.
 */
#include "daemon/core/object.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/list.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/import.h"

/* Name, versions increasing and below next_version, latest held, grants bounded. */
static int object_restore_check(const struct object_restore *ro, char *err)
{
	size_t n = ro->name ? strlen(ro->name) : 0;
	uint64_t prev = 0;
	bool latest_seen = ro->latest == 0;

	if (!ro->name || !object_name_valid(ro->name))
		return err_fmt(err, -EINVAL,
			       "a recorded object name of %zu bytes that no object"
			       " may have",
			       n);
	if (ro->ngrants > OBJECT_MAX_GRANTS)
		return err_fmt(err, -EINVAL, "%zu grants, more than %d", ro->ngrants,
			       OBJECT_MAX_GRANTS);
	for (size_t i = 0; i < ro->nversions; i++) {
		const struct object_restore_version *rv = &ro->versions[i];

		if (rv->version <= prev || rv->version >= ro->next_version || !rv->export_id ||
		    rv->meta_len > OBJECT_META_MAX)
			return err_fmt(err, -EINVAL, "version %llu out of order or malformed",
				       (unsigned long long)rv->version);
		/* Only the latest is held. */
		if (rv->held && rv->version != ro->latest)
			return err_fmt(err, -EINVAL, "version %llu is held but not the latest %llu",
				       (unsigned long long)rv->version,
				       (unsigned long long)ro->latest);
		if (rv->version == ro->latest)
			latest_seen = rv->held;
		/* Paused with its bytes: they must have come back with it. */
		if (ro->paused && !ro->discarded && (rv->copy_fd < 0 || !rv->copy_size))
			return err_fmt(err, -EIO,
				       "version %llu's host copy is not in the fd store: its bytes"
				       " are lost",
				       (unsigned long long)rv->version);
		prev = rv->version;
	}
	if (!latest_seen)
		return err_fmt(err, -EINVAL, "its latest version %llu is none it holds",
			       (unsigned long long)ro->latest);
	return 0;
}

/* Does @rv come with a host copy to keep? */
static bool ro_paused_copy(const struct object_restore_version *rv)
{
	return rv->copy_fd >= 0 && rv->copy_size;
}

static int object_restore_version(struct bobject *obj, const struct object_restore_version *rv,
				  char *err)
{
	struct bobject_version *v = calloc(1, sizeof(*v)), **pos;

	if (!v || (rv->meta_len && !(v->meta = malloc(rv->meta_len)))) {
		free(v);
		return err_fmt(err, -ENOMEM, "out of memory restoring object '%s'", obj->name);
	}
	if (rv->meta_len)
		memcpy(v->meta, rv->meta, rv->meta_len);
	v->meta_len = (uint32_t)rv->meta_len;
	v->version = rv->version;
	v->export_id = rv->export_id;
	v->held = rv->held;
	v->obj = obj;
	v->published_ns = rv->published_ns;
	snprintf(v->publisher, sizeof(v->publisher), "%s", rv->publisher ? rv->publisher : "");
	v->publisher_pid = rv->publisher_pid;
	v->copy_fd = -1;
	if (ro_paused_copy(rv)) {
		v->copy_fd = fcntl(rv->copy_fd, F_DUPFD_CLOEXEC, 0);
		if (v->copy_fd < 0) {
			int rc = -errno;

			free(v->meta);
			free(v);
			return err_fmt(err, rc, "duplicating a host copy: %s", strerror(-rc));
		}
		v->copy_size = rv->copy_size;
	}
	/* Oldest first, as recorded. */
	for (pos = &obj->versions; *pos; pos = &(*pos)->next)
		v->prev = *pos;
	*pos = v;
	obj->nversions++;
	return 0;
}

int object_restore(struct broker *br, const struct object_restore *ro, char *err)
{
	struct bobject *obj;
	int rc = object_restore_check(ro, err);

	if (rc < 0)
		return rc;
	if (!br->objects && !(br->objects = calloc(1, sizeof(*br->objects))))
		return err_fmt(err, -ENOMEM, "out of memory restoring object '%s'", ro->name);
	for (obj = br->objects->objects; obj; obj = obj->next)
		if (obj->uid == ro->uid && strcmp(obj->name, ro->name) == 0)
			return err_fmt(err, -EEXIST, "object '%s' of uid %u recorded twice",
				       ro->name, (unsigned)ro->uid);
	obj = calloc(1, sizeof(*obj));
	if (!obj)
		return err_fmt(err, -ENOMEM, "out of memory restoring object '%s'", ro->name);
	snprintf(obj->name, sizeof(obj->name), "%s", ro->name);
	obj->uid = ro->uid;
	obj->next_version = ro->next_version;
	obj->latest = ro->latest;
	obj->dropped = ro->latest == 0;
	obj->paused = ro->paused;
	obj->discarded = ro->paused && ro->discarded;
	for (size_t i = 0; i < ro->ngrants; i++)
		obj->grants[obj->ngrants++] = (uid_t)ro->grants[i];
	for (size_t i = 0; i < ro->nversions; i++) {
		rc = object_restore_version(obj, &ro->versions[i], err);
		if (rc < 0) {
			object_free_records(obj);
			return rc;
		}
	}
	DLIST_PUSH(br->objects->objects, obj);
	br->objects->nobjects++;
	return 0;
}

struct bobject_version *object_restore_version_of(struct broker *br, uint64_t export_id)
{
	for (struct bobject *o = br->objects ? br->objects->objects : NULL; o; o = o->next)
		for (struct bobject_version *v = o->versions; v; v = v->next)
			if (v->export_id == export_id && !v->ex)
				return v;
	return NULL;
}

void object_restore_finish(struct broker *br)
{
	struct bobject *o, *onext;

	for (o = br->objects ? br->objects->objects : NULL; o; o = onext) {
		struct bobject_version *v, *next;

		onext = o->next;
		for (v = o->versions; v; v = next) {
			next = v->next;
			if (v->ex)
				continue;
			log_warn("object version not restored name=%s uid=%u version=%llu"
				 " reason=\"its export did not come back\"",
				 o->name, (unsigned)o->uid, (unsigned long long)v->version);
			if (o->latest == v->version)
				o->latest = 0;
			DLIST_UNLINK(o->versions, v);
			o->nversions--;
			free(v->meta);
			free(v);
		}
		if (!o->latest)
			o->dropped = true;
		/* Unheld with nobody reading (the record's readers did not come back). */
		for (v = o->versions; v; v = next) {
			next = v->next;
			if (!v->held && !v->ex->imports) {
				/* Frees @v, and @o with its last version when dropped. */
				if (!next)
					o = NULL;
				import_version_unheld(br, v->ex);
			}
		}
		if (o && o->dropped && !o->versions) {
			DLIST_UNLINK(br->objects->objects, o);
			br->objects->nobjects--;
			free(o);
		}
	}
}
