/*
 * rejoin.c - gmbd's core, part three: clients that outlive a restart of
 * gmbd. daemon/persist/state.c rebuilds the previous instance's record with
 * broker_restore_client() and rejoin_restore_alloc(); every restored client
 * is an orphan, its memory still counted and lent, until its process
 * reconnects and rejoin_accept() checks what it claims against the record.
 *
 * The rule that protects everyone else: a claim never gives a client a
 * chunk the record did not give it. Where the client knows better than a
 * record cut short by the restart (it unmapped a tag whose pause never got
 * an answer, or a resume's reply never arrived), the record follows the
 * client, but only towards holding less: memory it stopped mapping goes
 * back to the pool, a last lend the two sides disagree on is cleared on
 * both, an import it closed while gmbd was down is dropped. A mapped
 * allocation must match the record chunk for chunk, and an import the
 * client claims must be one the record gives it (daemon/core/import.h).
 *
 * rejoin_accept() checks everything first and changes nothing until the
 * whole claim is known to be acceptable; the only step that can fail after
 * that (creating tags the record lacks) is undone.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/size.h"
#include "daemon/core/broker_internal.h"
#include "daemon/core/import.h"
#include "include/gmb.h"

/* ---- restore ---- */

/* Holds (and, when @lend, lends) a restored allocation's chunks. */
static int rejoin_restore_hold(struct broker *br, struct bclient *c, struct balloc *a, bool lend)
{
	struct pool *p = &br->pools[a->dev];
	uint32_t i;
	int rc = 0;

	for (i = 0; i < a->nchunks; i++) {
		if (a->chunks[i] && (rc = pool_hold(p, a->chunks[i], c)) < 0)
			break;
	}
	if (rc == 0) {
		for (uint32_t j = 0; lend && j < a->nchunks; j++)
			pool_lend(p, a->chunks[j], a);
		return 0;
	}
	while (i-- > 0)
		if (a->chunks[i])
			pool_unhold(p, a->chunks[i], c, false);
	return rc;
}

/*
 * An active allocation needs every chunk, each free, on its device and named
 * once, and together exactly its size: a record that says otherwise (a
 * damaged or hostile one) would have the pool count bytes twice or lend
 * fewer than the client maps. Each chunk's free flag marks it seen during
 * the walk and is set back before returning.
 */
static bool rejoin_restore_can_lend(const struct balloc *a)
{
	uint64_t sum = 0;
	uint32_t i;
	bool ok = true;

	for (i = 0; i < a->nchunks; i++) {
		struct chunk *ch = a->chunks[i];

		if (!ch || !ch->free || ch->dev != a->dev) {
			ok = false;
			break;
		}
		ch->free = false;
		sum += ch->size;
	}
	while (i-- > 0)
		a->chunks[i]->free = true;
	return ok && sum == a->size;
}

int rejoin_restore_tag(struct bclient *c, const char *name, int mode, bool paused,
		       struct btag **out)
{
	bool created;
	int rc = broker__tag_get(c, name, out, &created, NULL);

	if (rc < 0)
		return rc;
	/* A record naming a tag twice would change the state of a tag whose
	 * allocations are restored already. */
	if (!created)
		return -EEXIST;
	(*out)->mode = mode;
	(*out)->paused = paused;
	return 0;
}

int rejoin_restore_alloc(struct broker *br, struct bclient *c, struct btag *t, uint64_t id, int dev,
			 uint64_t size, bool active, struct chunk **chunks, uint32_t n)
{
	struct balloc *a;
	bool lend;
	int rc;

	if (id == 0 || dev < 0 || dev >= br->ndevices || n == 0 || size == 0 ||
	    size % br->pools[dev].granularity || idmap_get(&c->allocs, id))
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	*a = (struct balloc){ .id = id, .dev = dev, .size = size, .tag = t, .nchunks = n };
	a->chunks = malloc(n * sizeof(*a->chunks));
	rc = -ENOMEM;
	if (!a->chunks)
		goto err_free;
	memcpy(a->chunks, chunks, n * sizeof(*a->chunks));
	/* Nothing of a paused tag is lent, whatever a record says. */
	lend = active && !t->paused && rejoin_restore_can_lend(a);
	if (active && !lend)
		log_warn("restored allocation cannot be lent again, restored paused client=%s"
			 " alloc=%llu",
			 c->name, (unsigned long long)id);
	rc = idmap_put(&c->allocs, id, a);
	if (rc < 0)
		goto err_free;
	rc = rejoin_restore_hold(br, c, a, lend);
	if (rc < 0)
		goto err_unmap;
	broker__tag_link(t, a);
	broker__alloc_activate(a, lend);
	if (br->next_alloc_id <= id)
		br->next_alloc_id = id + 1;
	return 0;

err_unmap:
	idmap_del(&c->allocs, id);
err_free:
	free(a->chunks);
	free(a);
	return rc;
}

/* ---- checking a claim ---- */

/* A claim being checked and applied; scratch owned by rejoin_accept(). */
struct rejoin {
	struct broker *br;
	struct bclient *c;
	const struct broker_claim *cl;
	char *err;
	struct idmap claimed; /* alloc id -> its broker_claim_alloc */
	struct idmap mapped;  /* chunk id -> chunk, of mapped claims */
	struct idmap imports; /* export id -> its broker_claim_import */
};

static const struct broker_claim_tag *rejoin_claim_tag(const struct broker_claim *cl,
						       const char *name)
{
	for (size_t i = 0; i < cl->ntags; i++)
		if (strcmp(cl->tags[i].name, name) == 0)
			return &cl->tags[i];
	return NULL;
}

/* The claimed last lend is the recorded one, id for id (NULL = 0). */
static bool rejoin_same_lend(const struct balloc *a, const struct broker_claim_alloc *ca)
{
	if (ca->nchunks != a->nchunks)
		return false;
	for (size_t i = 0; i < ca->nchunks; i++)
		if (ca->chunk_ids[i] != (a->chunks[i] ? a->chunks[i]->id : 0))
			return false;
	return true;
}

static int rejoin_check_tags(struct rejoin *rj)
{
	const struct broker_claim *cl = rj->cl;

	if (cl->ntags > BROKER_MAX_TAGS)
		return err_fmt(rj->err, -EPROTO, "claims %zu tags (at most %d)", cl->ntags,
			       BROKER_MAX_TAGS);
	for (size_t i = 0; i < cl->ntags; i++) {
		const struct broker_claim_tag *t = &cl->tags[i];

		if (!t->name[0] || strlen(t->name) > WIRE_MAX_NAME || t->mode < GMB_MODE_DISCARD ||
		    t->mode > GMB_MODE_PRESERVE)
			return err_fmt(rj->err, -EPROTO,
				       "claims a tag without a valid name"
				       " or mode");
		if (rejoin_claim_tag(cl, t->name) != t)
			return err_fmt(rj->err, -EPROTO, "claims tag '%s' twice", t->name);
	}
	return 0;
}

/* A mapped claim: over exactly its recorded chunks, each lent to it or free. */
static int rejoin_check_mapped(struct rejoin *rj, const struct balloc *a,
			       const struct broker_claim_alloc *ca)
{
	if (!rejoin_same_lend(a, ca))
		return err_fmt(rj->err, -EPERM,
			       "maps allocation %llu over chunks gmbd did"
			       " not lend it",
			       (unsigned long long)a->id);
	for (uint32_t i = 0; i < a->nchunks; i++) {
		struct chunk *ch = a->chunks[i];
		int rc;

		if (!ch)
			return err_fmt(rj->err, -EPROTO,
				       "maps allocation %llu with a dropped"
				       " chunk",
				       (unsigned long long)a->id);
		if (ch->lent_to != a && !ch->free)
			return err_fmt(rj->err, -EPERM,
				       "maps chunk %llu, which gmbd lent to"
				       " another allocation",
				       (unsigned long long)ch->id);
		if (idmap_get(&rj->mapped, ch->id))
			return err_fmt(rj->err, -EPERM, "maps chunk %llu twice",
				       (unsigned long long)ch->id);
		rc = idmap_put(&rj->mapped, ch->id, ch);
		if (rc < 0)
			return err_fmt(rj->err, rc, "out of memory checking the claim");
	}
	return 0;
}

static int rejoin_check_alloc(struct rejoin *rj, const struct broker_claim_alloc *ca)
{
	const struct broker_claim_tag *ct = rejoin_claim_tag(rj->cl, ca->tag);
	const struct balloc *a = idmap_get(&rj->c->allocs, ca->id);
	int rc;

	if (!ct)
		return err_fmt(rj->err, -EPROTO,
			       "claims allocation %llu in tag '%s', which"
			       " it does not claim",
			       (unsigned long long)ca->id, ca->tag);
	if (ca->mapped && ct->paused)
		return err_fmt(rj->err, -EPROTO, "maps allocation %llu of paused tag '%s'",
			       (unsigned long long)ca->id, ca->tag);
	if (!a)
		return err_fmt(rj->err, -EPERM,
			       "claims allocation %llu, which gmbd did not"
			       " lend it",
			       (unsigned long long)ca->id);
	if (a->dev != ca->dev || a->size != ca->size || strcmp(a->tag->name, ca->tag) != 0)
		return err_fmt(rj->err, -EPERM,
			       "claims allocation %llu as %llu bytes on"
			       " device %d in tag '%s'; gmbd lent %llu bytes on device %d in"
			       " tag '%s'",
			       (unsigned long long)ca->id, (unsigned long long)ca->size, ca->dev,
			       ca->tag, (unsigned long long)a->size, a->dev, a->tag->name);
	if (idmap_get(&rj->claimed, ca->id))
		return err_fmt(rj->err, -EPROTO, "claims allocation %llu twice",
			       (unsigned long long)ca->id);
	rc = idmap_put(&rj->claimed, ca->id, (void *)ca);
	if (rc < 0)
		return err_fmt(rj->err, rc, "out of memory checking the claim");
	/* Imported: its chunks are the importers' too, whatever the client maps. */
	if (a->active && import_record_maps(rj->br, a) && !rejoin_same_lend(a, ca))
		return err_fmt(rj->err, -EPERM,
			       "claims allocation %llu over other chunks than the ones another"
			       " process maps",
			       (unsigned long long)a->id);
	return ca->mapped ? rejoin_check_mapped(rj, a, ca) : 0;
}

/* A claimed import: one the record gives the client, of that allocation, no more opens. */
static int rejoin_check_import(struct rejoin *rj, const struct broker_claim_import *ci)
{
	const struct import_rec *r = import_record_of(rj->br, ci->export_id, rj->c);
	int rc;

	if (ci->opens == 0)
		return err_fmt(rj->err, -EPROTO, "claims an import of export %llu with no open",
			       (unsigned long long)ci->export_id);
	if (!r)
		return err_fmt(rj->err, -EPERM,
			       "claims an import of export %llu, which gmbd has no record"
			       " of",
			       (unsigned long long)ci->export_id);
	if (r->ex->alloc_id != ci->alloc_id)
		return err_fmt(rj->err, -EPERM,
			       "claims export %llu as of allocation %llu; it is of"
			       " allocation %llu",
			       (unsigned long long)ci->export_id, (unsigned long long)ci->alloc_id,
			       (unsigned long long)r->ex->alloc_id);
	if (ci->opens > r->refs)
		return err_fmt(rj->err, -EPERM, "claims %u opens of export %llu; gmbd recorded %u",
			       ci->opens, (unsigned long long)ci->export_id, r->refs);
	/* Unmapped in the record, it pins nothing: mapped, the client may map
	 * chunks gone to others. The other way the record follows the client. */
	if (!ci->unmapped && !r->mapped)
		return err_fmt(rj->err, -EPERM,
			       "claims export %llu mapped; gmbd recorded it unmapped (it followed"
			       " its owner's pause)",
			       (unsigned long long)ci->export_id);
	if (idmap_get(&rj->imports, ci->export_id))
		return err_fmt(rj->err, -EPROTO, "claims the import of export %llu twice",
			       (unsigned long long)ci->export_id);
	rc = idmap_put(&rj->imports, ci->export_id, (void *)ci);
	if (rc < 0)
		return err_fmt(rj->err, rc, "out of memory checking the claim");
	return 0;
}

static int rejoin_check(struct rejoin *rj)
{
	int rc;

	if (!rj->c->orphan)
		return err_fmt(rj->err, -EPERM, "client %llu is not waiting to rejoin",
			       (unsigned long long)rj->c->id);
	rc = rejoin_check_tags(rj);
	for (size_t i = 0; rc == 0 && i < rj->cl->nallocs; i++)
		rc = rejoin_check_alloc(rj, &rj->cl->allocs[i]);
	for (size_t i = 0; rc == 0 && i < rj->cl->nimports; i++)
		rc = rejoin_check_import(rj, &rj->cl->imports[i]);
	return rc;
}

/* ---- applying it ---- */

/* Missing tags first: the one step that can fail. *@created: a bit per claimed tag. */
static int rejoin_make_tags(struct rejoin *rj, uint8_t *created)
{
	for (size_t i = 0; i < rj->cl->ntags; i++) {
		struct btag *t;
		bool made;
		int rc = broker__tag_get(rj->c, rj->cl->tags[i].name, &t, &made, rj->err);

		if (rc < 0) {
			for (size_t j = 0; j < i; j++)
				if (created[j])
					broker__tag_remove(rj->c,
							   broker_tag_find(rj->c,
									   rj->cl->tags[j].name));
			return rc;
		}
		created[i] = made;
	}
	return 0;
}

/* Drops a gmbd restart made stale are sent again once the client is back. */
static void rejoin_reset_drops(struct rejoin *rj)
{
	struct chunk *ch;
	uint64_t id;
	size_t it = 0;

	while (idmap_next(&rj->br->chunks, &it, &id, (void **)&ch)) {
		struct chunk_holder *h = pool_holder(ch, rj->c);

		if (!h || !h->drop_sent)
			continue;
		h->drop_sent = false;
		/* An entry kept only for the drop goes (and maybe the chunk with it). */
		if (h->refs == 0)
			pool_unhold(&rj->br->pools[ch->dev], ch, rj->c, true);
	}
}

static void rejoin_free_unclaimed(struct rejoin *rj, uint64_t *touched)
{
	for (struct btag *t = rj->c->tags; t; t = t->next) {
		struct balloc *a, *next;

		for (a = t->allocs; a; a = next) {
			next = a->next;
			if (idmap_get(&rj->claimed, a->id))
				continue;
			*touched |= 1ULL << a->dev;
			broker__alloc_destroy(rj->br, rj->c, a);
		}
	}
}

/* One claimed allocation: lent, back in the pool, or cleared. */
static void rejoin_apply_alloc(struct rejoin *rj, const struct broker_claim_alloc *ca,
			       struct broker_rejoin_result *res)
{
	struct balloc *a = idmap_get(&rj->c->allocs, ca->id);
	struct pool *p = &rj->br->pools[a->dev];
	bool same = rejoin_same_lend(a, ca);
	/* Unmapped by a pause whose answer the restart cut short, in a tag still
	 * active: gmbd refuses that pause while another process maps the
	 * memory, and the client then maps it again, so it stays lent. */
	bool keep = import_record_maps(rj->br, a) && !rejoin_claim_tag(rj->cl, ca->tag)->paused;

	if (a->active && !ca->mapped && !keep) {
		for (uint32_t i = 0; i < a->nchunks; i++)
			if (a->chunks[i])
				pool_put(p, a->chunks[i]);
		broker__alloc_activate(a, false);
	}
	if (!a->active && ca->mapped) {
		for (uint32_t i = 0; i < a->nchunks; i++)
			pool_lend(p, a->chunks[i], a);
		broker__alloc_activate(a, true);
	}
	if (same)
		return;
	/* Only unmapped ones get here (checked): neither side keeps this lend. */
	for (uint32_t i = 0; i < a->nchunks; i++) {
		if (a->chunks[i])
			pool_unhold(p, a->chunks[i], rj->c, false);
		a->chunks[i] = NULL;
	}
	res->cleared[res->ncleared++] = a->id;
}

static void rejoin_apply_tags(struct rejoin *rj)
{
	struct btag *t, *next;

	for (t = rj->c->tags; t; t = next) {
		const struct broker_claim_tag *ct = rejoin_claim_tag(rj->cl, t->name);

		next = t->next;
		if (!ct) {
			/* Unclaimed: its allocations went with rejoin_free_unclaimed(). */
			broker__tag_remove(rj->c, t);
			continue;
		}
		t->mode = ct->mode;
		t->paused = ct->paused;
	}
}

/* Held handles the record does not give the client: it drops them. */
static void rejoin_drops(struct rejoin *rj, struct broker_rejoin_result *res)
{
	for (size_t i = 0; i < rj->cl->nheld; i++) {
		struct chunk *ch = idmap_get(&rj->br->chunks, rj->cl->held[i]);

		if (!ch || !pool_is_held_by(ch, rj->c))
			res->drop[res->ndrop++] = rj->cl->held[i];
	}
}

/* A recorded import stays with the opens claimed; one not claimed is dropped. */
static bool rejoin_keep_import(void *arg, struct import_rec *r)
{
	struct rejoin *rj = arg;
	const struct broker_claim_import *ci = idmap_get(&rj->imports, r->ex->id);

	if (!ci) {
		log_info("import dropped: not claimed on rejoin client=%s export=%llu alloc=%llu",
			 rj->c->name, (unsigned long long)r->ex->id,
			 (unsigned long long)r->ex->alloc_id);
		return false;
	}
	r->refs = ci->opens;
	/* It unmapped to follow a pause whose answer the restart cut short. */
	if (ci->unmapped && r->mapped)
		import_unmapped(rj->br, rj->c, r->ex->id);
	/* Idle or open as the client says (a keep or reopen cut short). */
	import_record_idle(rj->br, r, ci->idle && r->mapped);
	return true;
}

static void rejoin_apply(struct rejoin *rj, struct broker_rejoin_result *res)
{
	uint64_t touched = 0;

	rejoin_reset_drops(rj);
	/* Imports it closed while gmbd was down go (their pins with them). */
	import_record_sweep(rj->br, rj->c, rejoin_keep_import, rj);
	rejoin_free_unclaimed(rj, &touched);
	for (size_t i = 0; i < rj->cl->nallocs; i++) {
		rejoin_apply_alloc(rj, &rj->cl->allocs[i], res);
		touched |= 1ULL << rj->cl->allocs[i].dev;
	}
	rejoin_apply_tags(rj);
	rejoin_drops(rj, res);
	rj->c->orphan = false;
	for (int d = 0; d < rj->br->ndevices; d++)
		if (touched & (1ULL << d))
			pool_shrink(&rj->br->pools[d], rj->br->opts.pool_keep, NULL);
}

int rejoin_accept(struct broker *br, struct bclient *c, const struct broker_claim *claim,
		  struct broker_rejoin_result *res, char *err)
{
	struct rejoin rj = { .br = br,
			     .c = c,
			     .cl = claim,
			     .err = err,
			     .claimed = IDMAP_INIT,
			     .mapped = IDMAP_INIT,
			     .imports = IDMAP_INIT };
	uint8_t *created = NULL;
	int rc;

	*res = (struct broker_rejoin_result){ 0 };
	rc = rejoin_check(&rj);
	if (rc < 0)
		goto out;
	res->cleared = malloc((claim->nallocs + 1) * sizeof(*res->cleared));
	res->drop = malloc((claim->nheld + 1) * sizeof(*res->drop));
	created = calloc(claim->ntags + 1, 1);
	rc = -ENOMEM;
	if (!res->cleared || !res->drop || !created) {
		err_fmt(err, rc, "out of memory applying the claim");
		goto out;
	}
	rc = rejoin_make_tags(&rj, created);
	if (rc < 0)
		goto out;
	rejoin_apply(&rj, res);
out:
	if (rc < 0)
		rejoin_result_deinit(res);
	free(created);
	idmap_deinit(&rj.claimed);
	idmap_deinit(&rj.mapped);
	idmap_deinit(&rj.imports);
	return rc;
}

void rejoin_result_deinit(struct broker_rejoin_result *res)
{
	free(res->cleared);
	free(res->drop);
	*res = (struct broker_rejoin_result){ 0 };
}

void rejoin_orphan(struct broker *br, struct bclient *c)
{
	(void)br;
	/* Drops asked of it are lost with the connection: asked again once
	 * it is back (rejoin_reset_drops()); none is queued meanwhile. */
	c->orphan = true;
}

void rejoin_reclaim(struct broker *br, struct bclient *c, const char *why)
{
	uint64_t bytes = 0;
	uint32_t allocs = 0;
	char b[SIZE_STR_MAX];

	for (const struct btag *t = c->tags; t; t = t->next) {
		bytes += t->bytes;
		allocs += t->nallocs;
	}
	log_notice("client reclaimed client=%s id=%" PRIu64 " pid=%d uid=%u"
		   " allocations=%u returned=%s reason=\"%s\"",
		   c->name, c->id, (int)c->pid, (unsigned)c->uid, allocs, size_str(bytes, b), why);
	broker_client_remove(br, c);
}
