/*
 * import_restore.c - the import table back from a previous gmbd's record
 * (import_restore.h has the invariants).
 *
 * An export is checked in this order, each step on what the record says
 * and the broker restored so far: its own facts (ids a handle can carry, a
 * device, a size, a token), its owner's allocation if it still exists (the
 * same device, size and uid), its import records (each left out on its
 * own), then the chunks it pins. Only then is anything made and linked,
 * and from there nothing fails.
 */
#include "daemon/core/import_restore.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/ipc_handle.h"
#include "common/list.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"

int import_restore_table(struct broker *br, uint64_t instance, uint64_t next_id)
{
	struct import_table *t;

	if (!instance)
		return 0;
	if (br->imports)
		return -EEXIST;
	/* An export id the idmap cannot hold would be the next one made. */
	if (next_id == UINT64_MAX)
		return -EINVAL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->instance = instance;
	t->next_id = next_id ? next_id : 1;
	br->imports = t;
	return 0;
}

/* What @rx says of itself: ids a handle can carry, a device, a size, a token. */
static int import_restore_check(const struct broker *br, const struct import_restore *rx, char *err)
{
	const struct import_table *t = br->imports;

	if (!t)
		return err_fmt(err, -EINVAL, "the record has exports but no instance id");
	/* 0 is no id of a handle (ipc_handle_decode()); UINT64_MAX none of an idmap. */
	if (rx->id == 0 || rx->id == UINT64_MAX || rx->alloc_id == 0 || rx->owner_id == 0)
		return err_fmt(err, -EINVAL, "an export, allocation or owner id of 0");
	if (idmap_get(&t->by_id, rx->id))
		return err_fmt(err, -EEXIST, "export %llu is in the record twice",
			       (unsigned long long)rx->id);
	if (rx->dev >= (uint32_t)br->ndevices || rx->size == 0 ||
	    rx->size % br->pools[rx->dev].granularity)
		return err_fmt(err, -EINVAL, "device %u or size %llu is not one of this gmbd",
			       rx->dev, (unsigned long long)rx->size);
	if (rx->token_len != IPC_HANDLE_TOKEN)
		return err_fmt(err, -EINVAL, "a token of %zu bytes, not %d", rx->token_len,
			       IPC_HANDLE_TOKEN);
	if (rx->nchunks > UINT32_MAX)
		return err_fmt(err, -EINVAL, "%zu chunks", rx->nchunks);
	return 0;
}

/* The owner's restored allocation, in *@out (NULL: gone); it must be the one @rx names. */
static int import_restore_alloc(struct broker *br, const struct import_restore *rx,
				struct balloc **out, char *err)
{
	struct bclient *c = broker_client_get(br, rx->owner_id);
	struct balloc *a = c ? broker_alloc_get(c, rx->alloc_id) : NULL;

	*out = a;
	if (!a)
		return 0;
	if (a->dev != (int)rx->dev || a->size != rx->size || c->uid != rx->owner_uid)
		return err_fmt(err, -EINVAL,
			       "allocation %llu of client %llu is not the one the export names"
			       " (device, size or uid)",
			       (unsigned long long)a->id, (unsigned long long)c->id);
	if (idmap_get(&br->imports->by_alloc, a->id))
		return err_fmt(err, -EEXIST, "allocation %llu has another export",
			       (unsigned long long)a->id);
	return 0;
}

static bool import_restore_granted(const struct import_restore *rx, uid_t uid)
{
	for (size_t i = 0; i < rx->ngrants; i++)
		if (rx->grants[i] == (uint32_t)uid)
			return true;
	return false;
}

/* Why record @i of @rx stays out, NULL if it may come back; @seen: importers kept so far. */
static const char *import_restore_rec_bad(struct broker *br, const struct import_restore *rx,
					  const struct bobject_version *v, size_t i,
					  const struct idmap *seen, struct bclient **out)
{
	const struct import_restore_rec *rr = &rx->recs[i];
	struct bclient *c = broker_client_get(br, rr->importer_id);

	*out = c;
	if (!c)
		return "no such client in the record";
	if (v ? !object_may_open(v->obj, c->uid) :
		c->uid != rx->owner_uid && !import_restore_granted(rx, c->uid))
		return "a client of another uid than the owner's, not granted";
	if (rr->opens == 0)
		return "no open";
	if (idmap_get(seen, c->id))
		return "the client's second record of the export";
	return NULL;
}

/* The records of @rx that come back, new, in *@out (malloc'd, record order). */
static int import_restore_recs(struct broker *br, const struct import_restore *rx,
			       const struct bobject_version *ver, struct import_rec ***out,
			       size_t *n, char *err)
{
	struct import_rec **v = calloc(rx->nrecs + 1, sizeof(*v));
	struct idmap seen = IDMAP_INIT;
	size_t i;

	*n = 0;
	if (!v)
		goto err_nomem;
	for (i = 0; i < rx->nrecs; i++) {
		struct bclient *c;
		const char *why = import_restore_rec_bad(br, rx, ver, i, &seen, &c);

		if (why) {
			log_warn("import not restored export=%llu importer=%llu reason=\"%s\"",
				 (unsigned long long)rx->id,
				 (unsigned long long)rx->recs[i].importer_id, why);
			continue;
		}
		v[*n] = calloc(1, sizeof(*v[*n]));
		if (!v[*n] || idmap_put(&seen, c->id, c) < 0)
			goto err_free;
		*v[(*n)++] =
			(struct import_rec){ .importer = c,
					     .refs = rx->recs[i].opens,
					     .mapped = !rx->recs[i].unmapped,
					     .idle = rx->recs[i].idle && !rx->recs[i].unmapped };
	}
	idmap_deinit(&seen);
	*out = v;
	return 0;

err_free:
	for (i = 0; i <= *n; i++)
		free(v[i]);
	free(v);
	idmap_deinit(&seen);
	*n = 0;
err_nomem:
	return err_fmt(err, -ENOMEM, "out of memory restoring export %llu",
		       (unsigned long long)rx->id);
}

/* Imported and still its owner's: the recorded chunks are @a's own, lent to it. */
static int import_restore_lent(const struct import_restore *rx, const struct balloc *a,
			       struct chunk **v, char *err)
{
	if (!a->active || rx->nchunks != a->nchunks)
		return err_fmt(err, -EINVAL,
			       "allocation %llu is imported but not lent over the chunks recorded",
			       (unsigned long long)a->id);
	for (uint32_t i = 0; i < a->nchunks; i++) {
		struct chunk *ch = a->chunks[i];

		if (!ch || ch->id != rx->chunk_ids[i] || ch->lent_to != a || ch->pins)
			return err_fmt(err, -EINVAL,
				       "allocation %llu is imported but not lent over the chunks"
				       " recorded",
				       (unsigned long long)a->id);
		v[i] = ch;
	}
	return 0;
}

/*
 * May @rx pin @ch, pinned already? Only where one is a named object's
 * version and the other the export its allocation had before it was
 * published (both gone from every allocation): one other export, the
 * other kind, listing @ch. Walked only for a pinned chunk.
 */
static bool import_restore_shared(const struct broker *br, const struct import_restore *rx,
				  const struct chunk *ch)
{
	const struct import_export *other = NULL;
	unsigned n = 0;

	if (ch->free || !ch->pins || ch->lent_to || ch->pins != 1)
		return false;
	for (const struct import_export *ex = br->imports->exports; ex; ex = ex->next)
		for (uint32_t i = 0; i < ex->nchunks; i++)
			if (ex->chunks[i] == ch) {
				other = ex;
				n++;
			}
	return n == 1 && !other->alloc && (other->version != NULL) != rx->version;
}

/*
 * Imported after its allocation went: every recorded chunk must be free
 * (not lent to an allocation), or pinned already by the one other export
 * it may share with (import_restore_shared()); on the export's device, of the owner's uid, named
 * once, and together exactly its size.
 */
static int import_restore_free(struct broker *br, const struct import_restore *rx, struct chunk **v,
			       char *err)
{
	struct idmap seen = IDMAP_INIT;
	uint64_t sum = 0;
	int rc = 0;

	if (rx->nchunks == 0)
		return err_fmt(err, -EINVAL, "imported with no chunk");
	for (size_t i = 0; i < rx->nchunks; i++) {
		struct chunk *ch = broker_chunk_get(br, rx->chunk_ids[i]);

		if (!ch || ch->dev != (int)rx->dev) {
			rc = err_fmt(err, -EINVAL, "chunk %llu is not restored on device %u",
				     (unsigned long long)rx->chunk_ids[i], rx->dev);
			break;
		}
		if (!(ch->free && !ch->pins) && !import_restore_shared(br, rx, ch)) {
			rc = err_fmt(err, -EINVAL,
				     "chunk %llu is lent to an allocation or pinned by another"
				     " export",
				     (unsigned long long)ch->id);
			break;
		}
		if (idmap_get(&seen, ch->id)) {
			rc = err_fmt(err, -EINVAL, "chunk %llu is named twice",
				     (unsigned long long)ch->id);
			break;
		}
		if (idmap_put(&seen, ch->id, ch) < 0) {
			rc = err_fmt(err, -ENOMEM, "out of memory restoring export %llu",
				     (unsigned long long)rx->id);
			break;
		}
		if (!ch->uid_set || ch->uid != rx->owner_uid) {
			rc = err_fmt(err, -EINVAL, "chunk %llu is not of the owner's uid %u",
				     (unsigned long long)ch->id, (unsigned)rx->owner_uid);
			break;
		}
		v[i] = ch;
		sum += ch->size;
	}
	idmap_deinit(&seen);
	if (rc == 0 && sum != rx->size)
		rc = err_fmt(err, -EINVAL, "its chunks add up to %llu bytes, not %llu",
			     (unsigned long long)sum, (unsigned long long)rx->size);
	return rc;
}

/* The export of @rx, linked to @a (NULL: gone) and in the table; no pin, no record yet. */
static int import_restore_new(struct import_table *t, const struct import_restore *rx,
			      struct balloc *a, struct import_export **out, char *err)
{
	struct import_export *ex = calloc(1, sizeof(*ex));

	if (!ex)
		goto err_nomem;
	*ex = (struct import_export){ .id = rx->id,
				      .alloc_id = rx->alloc_id,
				      .alloc = a,
				      .owner_id = rx->owner_id,
				      .owner_pid = rx->owner_pid,
				      .owner_uid = rx->owner_uid,
				      .dev = (int)rx->dev,
				      .size = rx->size };
	snprintf(ex->owner, sizeof(ex->owner), "%s", rx->owner ? rx->owner : "");
	memcpy(ex->token, rx->token, sizeof(ex->token));
	if (idmap_put(&t->by_id, ex->id, ex) < 0)
		goto err_free;
	if (a && idmap_put(&t->by_alloc, a->id, ex) < 0) {
		idmap_del(&t->by_id, ex->id);
		goto err_free;
	}
	DLIST_PUSH(t->exports, ex);
	t->nexports++;
	*out = ex;
	return 0;

err_free:
	free(ex);
err_nomem:
	return err_fmt(err, -ENOMEM, "out of memory restoring export %llu",
		       (unsigned long long)rx->id);
}

/* @ex's chunks @v (@n of them, checked) pinned once each; its records @recs linked. */
static void import_restore_link(struct broker *br, struct import_export *ex, struct chunk **v,
				uint32_t n, struct import_rec **recs, size_t nrecs)
{
	struct import_table *t = br->imports;
	struct pool *p = &br->pools[ex->dev];

	/* Owned by @ex from now on (NULL without mapped records: nothing pinned). */
	ex->chunks = v;
	ex->nchunks = n;
	for (uint32_t i = 0; i < n; i++) {
		/* A gone allocation's chunk leaves the free list, lent to nobody:
		 * the state pool.h gives a pinned chunk its allocation put back. */
		if (!ex->alloc)
			pool_lend(p, v[i], NULL);
		pool_pin(p, v[i]);
	}
	/* Linked first: the record's last first keeps the record's order. */
	for (size_t i = nrecs; i-- > 0;) {
		recs[i]->ex = ex;
		DLIST_PUSH(ex->imports, recs[i]);
		ex->nimports++;
		t->nrecs++;
		t->nidle += recs[i]->idle;
	}
}

int import_restore_export(struct broker *br, const struct import_restore *rx, char *err)
{
	struct import_export *ex = NULL;
	struct import_rec **recs = NULL;
	struct chunk **chunks = NULL;
	struct balloc *a = NULL;
	struct bobject_version *v = NULL;
	size_t nrecs = 0;
	uint32_t nmapped = 0;
	int rc;

	rc = import_restore_check(br, rx, err);
	if (rc == 0 && rx->version) {
		v = object_restore_version_of(br, rx->id);
		if (!v)
			rc = err_fmt(err, -ENOENT, "it names no recorded object version");
	} else if (rc == 0) {
		rc = import_restore_alloc(br, rx, &a, err);
	}
	if (rc == 0)
		rc = import_restore_recs(br, rx, v, &recs, &nrecs, err);
	if (rc < 0)
		return rc;
	if (!a && !v && nrecs == 0) {
		rc = err_fmt(err, -ENOENT, "its allocation is gone and no client imports it");
		goto err_recs;
	}
	for (size_t i = 0; i < nrecs; i++)
		nmapped += recs[i]->mapped;
	if (rx->ngrants > IMPORT_MAX_GRANTS) {
		rc = err_fmt(err, -EINVAL, "%zu grants, more than %d", rx->ngrants,
			     IMPORT_MAX_GRANTS);
		goto err_recs;
	}
	/* A paused object's readers map nothing and its versions hold no chunk. */
	if (v && v->obj->paused && (nmapped || rx->nchunks)) {
		rc = err_fmt(err, -EINVAL,
			     "a paused object's version with chunks or mapped readers");
		goto err_recs;
	}
	/* Only mapped imports pin, those that followed a pause map nothing; a
	 * version's chunks are pinned for its life (while not paused). */
	if (nmapped || (v && !v->obj->paused)) {
		rc = -ENOMEM;
		chunks = calloc(rx->nchunks + 1, sizeof(*chunks));
		if (!chunks) {
			err_fmt(err, rc, "out of memory restoring export %llu",
				(unsigned long long)rx->id);
			goto err_recs;
		}
		rc = a ? import_restore_lent(rx, a, chunks, err) :
			 import_restore_free(br, rx, chunks, err);
		if (rc < 0)
			goto err_chunks;
	}
	rc = import_restore_new(br->imports, rx, a, &ex, err);
	if (rc < 0)
		goto err_chunks;
	/* Nothing fails from here on. */
	import_restore_link(br, ex, chunks, chunks ? (uint32_t)rx->nchunks : 0, recs, nrecs);
	ex->nmapped = nmapped;
	if (v) {
		ex->version = v;
		ex->vops = object_version_ops();
		v->ex = ex;
	}
	for (size_t i = 0; i < rx->ngrants; i++)
		ex->grants[ex->ngrants++] = (uid_t)rx->grants[i];
	free(recs);
	if (br->imports->next_id <= rx->id)
		br->imports->next_id = rx->id + 1;
	return 0;

err_chunks:
	free(chunks);
err_recs:
	for (size_t i = 0; i < nrecs; i++)
		free(recs[i]);
	free(recs);
	return rc;
}
