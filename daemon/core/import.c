/*
 * import.c - memory shared between processes: the imports of each export,
 * the pins that keep imported chunks out of the pool, following a pause,
 * keeping an import for its next open, the broker's hooks and the walks
 * over the table (import.h has the invariants). The exports themselves and
 * their handles are made in import_export.c, which calls import_pin() here;
 * nothing here calls it, so an export's making stays apart from what its
 * importers do with it.
 *
 * A handle is checked field by field against the export its generation
 * names (instance, owner, allocation, device, token) before anything else
 * is looked at, and every mismatch answers the same -ENOENT: a forged or
 * bit-flipped handle learns nothing and maps nothing.
 */
#include "daemon/core/import.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/list.h"
#include "common/log.h"
#include "daemon/core/broker.h"

static void import_version_free(struct broker *br, struct import_export *ex);

struct import_table *import_table(struct broker *br)
{
	return br->imports;
}

/*
 * Is @range_off a place a handle of @a may name? A chunk's start (what gmbd
 * hands out), or any granularity multiple inside it: libgmb names the start
 * of the piece of a pack (client/lib/mem/pack.c) that the pointer is in,
 * which the application took for an allocation of its own.
 */
static bool import_is_range(const struct broker *br, const struct balloc *a, uint64_t range_off)
{
	uint64_t gran = br->pools[a->dev].granularity;

	return range_off < a->size && gran && range_off % gran == 0;
}

void import_version_unheld(struct broker *br, struct import_export *ex)
{
	if (!ex->imports)
		import_version_free(br, ex);
}

/* The export @h names, exactly; NULL for any difference. */
static struct import_export *import_lookup(const struct import_table *t, const struct ipc_handle *h)
{
	struct import_export *ex = idmap_get(&t->by_id, h->gen);
	uint8_t diff = 0;

	if (!ex || h->instance != t->instance || h->owner != ex->owner_id ||
	    h->alloc != ex->alloc_id || h->dev != (uint32_t)ex->dev)
		return NULL;
	/* Every byte compared: how long it takes says nothing of where it differs. */
	for (size_t i = 0; i < IPC_HANDLE_TOKEN; i++)
		diff |= h->token[i] ^ ex->token[i];
	return diff ? NULL : ex;
}

static struct import_rec *import_rec_find(const struct import_export *ex, const struct bclient *c)
{
	for (struct import_rec *r = ex->imports; r; r = r->next)
		if (r->importer == c)
			return r;
	return NULL;
}

/* The first mapped import of @ex: pin the allocation's chunks, once. */
int import_pin(struct broker *br, struct import_export *ex, char *err)
{
	struct balloc *a = ex->alloc;
	struct pool *p = &br->pools[ex->dev];

	ex->chunks = malloc((a->nchunks ? a->nchunks : 1) * sizeof(*ex->chunks));
	if (!ex->chunks)
		return err_fmt(err, -ENOMEM, "out of memory importing allocation %llu",
			       (unsigned long long)ex->alloc_id);
	for (uint32_t i = 0; i < a->nchunks; i++) {
		ex->chunks[i] = a->chunks[i];
		pool_pin(p, ex->chunks[i]);
	}
	ex->nchunks = a->nchunks;
	return 0;
}

static bool import_granted(const struct import_export *ex, uid_t uid)
{
	for (uint32_t i = 0; i < ex->ngrants; i++)
		if (ex->grants[i] == uid)
			return true;
	return false;
}

/* A named object's version: its object says who and when; range offset 0. */
static int import_open_version(struct import_export *ex, const struct bclient *c,
			       const struct ipc_handle *h, char *err)
{
	int rc = ex->vops->may_map(ex->version, c, err);

	if (rc < 0)
		return rc;
	if (h->range_off != 0)
		return err_fmt(err, -EINVAL,
			       "range offset %llu of a named object's version: a version's is 0",
			       (unsigned long long)h->range_off);
	return 0;
}

/* Check order: form, then identity (one answer for all), then who and when. */
static int import_open_check(const struct broker *br, const struct bclient *c,
			     const uint8_t *handle, size_t len, struct ipc_handle *h,
			     struct import_export **out, char *err)
{
	struct import_table *t = br->imports;
	struct import_export *ex;

	if (len != IPC_HANDLE_SIZE)
		return err_fmt(err, -EINVAL, "a handle of %zu bytes, not %d", len, IPC_HANDLE_SIZE);
	if (ipc_handle_decode(handle, h) < 0)
		return err_fmt(err, -EINVAL, "not a gmbd handle (magic, version or ids)");
	ex = t ? import_lookup(t, h) : NULL;
	if (!ex)
		return err_fmt(err, -ENOENT,
			       "the handle names no export of this gmbd (forged, or of an"
			       " earlier gmbd)");
	if (c->tool)
		return err_fmt(err, -EPERM, "a tool may not import memory");
	if (ex->version) {
		int rc = import_open_version(ex, c, h, err);

		if (rc == 0)
			*out = ex;
		return rc;
	}
	if (c->uid != ex->owner_uid && !import_granted(ex, c->uid))
		return err_fmt(err, -EPERM,
			       "allocation %llu belongs to client '%s' (pid %d, uid %u), which did"
			       " not grant uid %u: client '%s' may not open it",
			       (unsigned long long)ex->alloc_id, ex->owner, (int)ex->owner_pid,
			       (unsigned)ex->owner_uid, (unsigned)c->uid, c->name);
	if (!ex->alloc)
		return err_fmt(err, -ENOENT, "allocation %llu of client '%s' was freed",
			       (unsigned long long)ex->alloc_id, ex->owner);
	if (!ex->alloc->active)
		return err_fmt(err, -EBUSY, "allocation %llu of client '%s' is in paused tag '%s'",
			       (unsigned long long)ex->alloc_id, ex->owner, ex->alloc->tag->name);
	if (!import_is_range(br, ex->alloc, h->range_off))
		return err_fmt(err, -EINVAL, "range offset %llu is no place in allocation %llu",
			       (unsigned long long)h->range_off, (unsigned long long)ex->alloc_id);
	*out = ex;
	return 0;
}

/* @r maps its export's chunks from now on: the first mapped record pins them. */
static int import_rec_map(struct broker *br, struct import_rec *r, char *err)
{
	struct import_export *ex = r->ex;
	int rc;

	if (r->mapped)
		return 0;
	/* A version's chunks are pinned from its making to its end. */
	if (ex->nmapped == 0 && !ex->version && (rc = import_pin(br, ex, err)) < 0)
		return rc;
	r->mapped = true;
	ex->nmapped++;
	/* A grantee may keep a handle past its close: the chunks never serve
	 * another allocation (pool.c releases them when they come back). */
	if (r->importer->uid != ex->owner_uid)
		for (uint32_t i = 0; i < ex->nchunks; i++)
			ex->chunks[i]->shared_out = true;
	return 0;
}

/* @r maps nothing any more: the last mapped record unpins the chunks. */
static void import_rec_unmap(struct broker *br, struct import_rec *r)
{
	struct import_export *ex = r->ex;
	struct pool *p = &br->pools[ex->dev];

	if (!r->mapped)
		return;
	r->mapped = false;
	if (--ex->nmapped > 0 || ex->version)
		return;
	for (uint32_t i = 0; i < ex->nchunks; i++)
		pool_unpin(p, ex->chunks[i]);
	free(ex->chunks);
	ex->chunks = NULL;
	ex->nchunks = 0;
}

int import_open(struct broker *br, struct bclient *c, const uint8_t *handle, size_t len,
		struct import_export **out, uint64_t *range_off, char *err)
{
	struct import_table *t = br->imports;
	struct import_export *ex = NULL;
	struct import_rec *r;
	struct ipc_handle h;
	int rc;

	rc = import_open_check(br, c, handle, len, &h, &ex, err);
	if (rc < 0)
		return rc;
	r = import_rec_find(ex, c);
	if (r) {
		/* Its fds go out: it maps them (again, if it had followed a pause). */
		rc = import_rec_map(br, r, err);
		if (rc < 0)
			return rc;
		r->refs++;
		goto out;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return err_fmt(err, -ENOMEM, "out of memory importing allocation %llu",
			       (unsigned long long)ex->alloc_id);
	r->importer = c;
	r->ex = ex;
	rc = import_rec_map(br, r, err);
	if (rc < 0) {
		free(r);
		return rc;
	}
	r->refs = 1;
	DLIST_PUSH(ex->imports, r);
	ex->nimports++;
	t->nrecs++;
out:
	*out = ex;
	*range_off = h.range_off;
	return 0;
}

static void import_export_free(struct import_table *t, struct import_export *ex)
{
	idmap_del(&t->by_id, ex->id);
	if (ex->alloc)
		idmap_del(&t->by_alloc, ex->alloc_id);
	DLIST_UNLINK(t->exports, ex);
	t->nexports--;
	free(ex->chunks);
	free(ex);
}

/* @r goes with all its opens; the last record of @ex unpins its chunks. */
static void import_rec_drop(struct broker *br, struct import_rec *r)
{
	struct import_table *t = br->imports;
	struct import_export *ex = r->ex;
	struct pool *p = &br->pools[ex->dev];

	import_rec_unmap(br, r);
	import_record_idle(br, r, false);
	DLIST_UNLINK(ex->imports, r);
	ex->nimports--;
	t->nrecs--;
	free(r);
	if (ex->imports)
		return;
	if (ex->version) {
		/* Held, or a job copying its bytes: its object lets go of it later. */
		if (!ex->vops->kept(ex->version))
			import_version_free(br, ex);
		return;
	}
	if (!ex->alloc) {
		log_debug("imported chunks back alloc=%llu owner=%s dev=%d",
			  (unsigned long long)ex->alloc_id, ex->owner, ex->dev);
		import_export_free(t, ex);
		pool_shrink(p, br->opts.pool_keep, NULL);
	}
}

/* Version export @ex goes (unheld, no record): its chunks back, its version with it. */
static void import_version_free(struct broker *br, struct import_export *ex)
{
	struct pool *p = &br->pools[ex->dev];
	struct bobject_version *v = ex->version;
	const struct import_version_ops *ops = ex->vops;

	log_debug("object version's chunks back export=%llu dev=%d chunks=%u",
		  (unsigned long long)ex->id, ex->dev, ex->nchunks);
	for (uint32_t i = 0; i < ex->nchunks; i++)
		pool_unpin(p, ex->chunks[i]);
	ex->nchunks = 0;
	ex->version = NULL;
	import_export_free(br->imports, ex);
	ops->gone(br, v);
	pool_shrink(p, br->opts.pool_keep, NULL);
}

/* @c's record of export @export_id, or NULL with @err (-ENOENT). */
static struct import_rec *import_rec_get(struct broker *br, const struct bclient *c,
					 uint64_t export_id, char *err)
{
	struct import_export *ex = br->imports ? idmap_get(&br->imports->by_id, export_id) : NULL;
	struct import_rec *r = ex ? import_rec_find(ex, c) : NULL;

	if (!r)
		err_fmt(err, -ENOENT, "client '%s' has no import of export %llu", c->name,
			(unsigned long long)export_id);
	return r;
}

int import_close(struct broker *br, struct bclient *c, uint64_t export_id, char *err)
{
	struct import_rec *r = import_rec_get(br, c, export_id, err);

	if (!r)
		return -ENOENT;
	if (--r->refs == 0)
		import_rec_drop(br, r);
	return 0;
}

int import_keep(struct broker *br, struct bclient *c, uint64_t export_id, char *err)
{
	struct import_rec *r = import_rec_get(br, c, export_id, err);

	if (!r)
		return -ENOENT;
	if (r->refs != 1 || r->idle || !r->mapped)
		return err_fmt(err, -EINVAL,
			       "client '%s' keeps export %llu with %u opens, idle %d, mapped %d",
			       c->name, (unsigned long long)export_id, r->refs, r->idle, r->mapped);
	import_record_idle(br, r, true);
	return 0;
}

int import_reopen(struct broker *br, struct bclient *c, uint64_t export_id, char *err)
{
	struct import_rec *r = import_rec_get(br, c, export_id, err);

	if (!r)
		return -ENOENT;
	if (!r->idle)
		return err_fmt(err, -EINVAL, "client '%s' reopens export %llu, which is not idle",
			       c->name, (unsigned long long)export_id);
	import_record_idle(br, r, false);
	return 0;
}

const struct import_export *import_find(const struct broker *br, uint64_t export_id)
{
	return br->imports ? idmap_get(&br->imports->by_id, export_id) : NULL;
}

uint64_t import_client_opens(struct broker *br, const struct bclient *c)
{
	uint64_t n = 0;

	if (!br->imports)
		return 0;
	for (struct import_export *ex = br->imports->exports; ex; ex = ex->next)
		for (struct import_rec *r = ex->imports; r; r = r->next)
			if (r->importer == c)
				n += r->refs;
	return n;
}

int import_walk(const struct broker *br, import_walk_fn fn, void *arg)
{
	const struct import_table *t = br->imports;
	int r;

	for (const struct import_export *ex = t ? t->exports : NULL; ex; ex = ex->next)
		for (const struct import_rec *rec = ex->imports; rec; rec = rec->next)
			if ((r = fn(arg, ex, rec)) != 0)
				return r;
	return 0;
}

void import_alloc_gone(struct broker *br, struct balloc *a)
{
	struct import_table *t = br->imports;
	struct import_export *ex = t ? idmap_del(&t->by_alloc, a->id) : NULL;

	if (!ex)
		return;
	ex->alloc = NULL;
	if (!ex->imports) {
		import_export_free(t, ex);
		return;
	}
	log_info("imported allocation freed by its owner, kept for its importers alloc=%llu"
		 " owner=%s importers=%u",
		 (unsigned long long)ex->alloc_id, ex->owner, ex->nimports);
}

void import_client_gone(struct broker *br, struct bclient *c)
{
	struct import_table *t = br->imports;
	struct import_export *ex, *next;

	if (!t)
		return;
	for (ex = t->exports; ex; ex = next) {
		struct import_rec *r = import_rec_find(ex, c);

		/* Dropping the last record may free @ex. */
		next = ex->next;
		if (r)
			import_rec_drop(br, r);
	}
}

/* Does @ex's allocation belong to @c's tag @tag ("": any)? */
static bool import_of_tag(const struct import_export *ex, const struct bclient *c, const char *tag)
{
	const struct balloc *a = ex->alloc;

	return a && a->tag->client == c && (!tag || !*tag || strcmp(a->tag->name, tag) == 0);
}

int import_pause_check(struct broker *br, const struct bclient *c, const char *tag, char *err)
{
	struct import_table *t = br->imports;
	unsigned named = 0;

	if (!t)
		return 0;
	for (const struct import_export *ex = t->exports; ex; ex = ex->next) {
		if (!ex->nmapped || !import_of_tag(ex, c, tag))
			continue;
		for (const struct import_rec *r = ex->imports; r; r = r->next) {
			if (!r->mapped)
				continue;
			if (named++ == 0)
				err_fmt(err, -EBUSY,
					"other processes map this memory: tag '%s' stays active"
					" until they close it:",
					ex->alloc->tag->name);
			if (named <= 8)
				err_append(err, " client '%s' (pid %d) has allocation %llu %s",
					   r->importer->name, (int)r->importer->pid,
					   (unsigned long long)ex->alloc_id,
					   r->idle ? "kept mapped, idle" : "open");
		}
	}
	if (named > 8)
		err_append(err, " and %u more", named - 8);
	return named ? -EBUSY : 0;
}

void import_record_idle(struct broker *br, struct import_rec *r, bool idle)
{
	if (r->idle != idle) {
		r->idle = idle;
		if (idle)
			br->imports->nidle++;
		else
			br->imports->nidle--;
	}
	r->asked = false;
}

void import_idle_walk(struct broker *br, const struct bclient *owner, const char *tag,
		      import_idle_fn fn, void *arg)
{
	struct import_table *t = br->imports;

	/* Called after every change (handlers__ipc_retry()): nothing to walk for most. */
	if (!t || !t->nidle)
		return;
	for (struct import_export *ex = t ? t->exports : NULL; ex; ex = ex->next) {
		if (owner ? !import_of_tag(ex, owner, tag) :
			    ex->alloc != NULL || (ex->version && ex->vops->kept(ex->version)))
			continue;
		for (struct import_rec *r = ex->imports; r; r = r->next)
			if (r->idle && !r->asked)
				fn(arg, ex, r);
	}
}

int import_unmapped(struct broker *br, struct bclient *c, uint64_t export_id)
{
	struct import_table *t = br->imports;
	struct import_export *ex = t ? idmap_get(&t->by_id, export_id) : NULL;
	struct import_rec *r = ex ? import_rec_find(ex, c) : NULL;

	if (!r)
		return -ENOENT;
	import_rec_unmap(br, r);
	return 0;
}

int import_remap(struct broker *br, struct bclient *c, uint64_t export_id,
		 struct import_export **out, char *err)
{
	struct import_rec *r = import_rec_get(br, c, export_id, err);
	struct import_export *ex = r ? r->ex : NULL;
	int rc;

	if (!r)
		return -ENOENT;
	if (!ex->alloc && !ex->version)
		return err_fmt(err, -ENOENT, "allocation %llu of client '%s' was freed",
			       (unsigned long long)ex->alloc_id, ex->owner);
	if (ex->version && (rc = ex->vops->may_map(ex->version, c, err)) < 0)
		return rc;
	if (ex->alloc && !ex->alloc->active)
		return err_fmt(err, -EBUSY, "allocation %llu of client '%s' is in paused tag '%s'",
			       (unsigned long long)ex->alloc_id, ex->owner, ex->alloc->tag->name);
	rc = import_rec_map(br, r, err);
	if (rc < 0)
		return rc;
	*out = ex;
	return 0;
}

int import_followers(const struct broker *br, const struct bclient *c, const char *tag, bool mapped,
		     import_follow_fn fn, void *arg)
{
	const struct import_table *t = br->imports;
	int rc;

	for (const struct import_export *ex = t ? t->exports : NULL; ex; ex = ex->next) {
		if (!import_of_tag(ex, c, tag))
			continue;
		for (const struct import_rec *r = ex->imports; r; r = r->next)
			if (r->mapped == mapped && (rc = fn(arg, ex, r)) != 0)
				return rc;
	}
	return 0;
}

void import_deinit(struct broker *br)
{
	struct import_table *t = br->imports;

	if (!t)
		return;
	while (t->exports) {
		struct import_export *ex = t->exports;

		while (ex->imports)
			import_rec_drop(br, ex->imports);
		/* The last drop freed an export whose allocation was gone. */
		if (t->exports == ex && ex->version)
			import_version_free(br, ex);
		else if (t->exports == ex)
			import_export_free(t, ex);
	}
	idmap_deinit(&t->by_id);
	idmap_deinit(&t->by_alloc);
	free(t);
	br->imports = NULL;
}

/* ---- restart without loss: the records a rejoin keeps, the record's walk ---- */

struct import_rec *import_record_of(const struct broker *br, uint64_t export_id,
				    const struct bclient *c)
{
	const struct import_export *ex = import_find(br, export_id);

	return ex ? import_rec_find(ex, c) : NULL;
}

bool import_record_maps(const struct broker *br, const struct balloc *a)
{
	const struct import_export *ex = br->imports ? idmap_get(&br->imports->by_alloc, a->id) :
						       NULL;

	return ex && ex->alloc == a && ex->imports;
}

void import_record_sweep(struct broker *br, struct bclient *c, import_record_keep_fn keep,
			 void *arg)
{
	struct import_table *t = br->imports;
	struct import_export *ex, *next;

	for (ex = t ? t->exports : NULL; ex; ex = next) {
		struct import_rec *r = import_rec_find(ex, c);

		/* Dropping the last record may free @ex. */
		next = ex->next;
		if (r && !keep(arg, r))
			import_rec_drop(br, r);
	}
}

int import_record_walk(const struct broker *br, import_record_export_fn export_fn,
		       import_walk_fn rec_fn, void *arg)
{
	const struct import_table *t = br->imports;
	int r;

	for (const struct import_export *ex = t ? t->exports : NULL; ex; ex = ex->next) {
		if ((r = export_fn(arg, ex)) != 0)
			return r;
		for (const struct import_rec *rec = ex->imports; rec_fn && rec; rec = rec->next)
			if ((r = rec_fn(arg, ex, rec)) != 0)
				return r;
	}
	return 0;
}
