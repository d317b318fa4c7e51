/*
 * cycle.c - pause and resume of tags: the part of libgmb that gives memory
 * back to gmbd and takes it again at the same addresses.
 *
 * Pause: drain the devices once, copy PRESERVE bytes to their host copies
 * (save.c, which may hand saved allocations back as it goes), unmap each
 * allocation (one call each; the VA stays reserved), then tell gmbd; when
 * gmbd gives paused memory back to the driver, the imported handles of the
 * paused allocations go too, before pause returns. Resume: ask gmbd, adopt
 * each lend as the allocation's last lend (cache.c's rule), map it back to
 * back with one set_access, then restore the bytes per mode. Runs under
 * the operation lock.
 *
 * Invariants: an active tag's allocations are all mapped, a paused tag's all
 * unmapped; any failure leaves the tags as they were (mapped and active, or
 * unmapped and paused) and gmbd agreeing: a failed pause maps back the same
 * chunks (still lent to us) and has gmbd lend again to those it handed back
 * (restored from their copies); a failed resume unmaps and pauses again.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/mem/mem.h"

/* Tags. */

static bool cycle_tag_any(struct gmb__mem *m, bool paused)
{
	for (struct gmb__tag *t = m->tags; t; t = t->next)
		if (t->paused == paused)
			return true;
	return false;
}

/* Pause. */

/* The devices of the allocations of the tags in (@only, @paused). */
static uint64_t cycle_devices(struct gmb__mem *m, const struct gmb__tag *only, bool paused)
{
	uint64_t mask = 0;

	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		if (!gmb__tag_in(t, only, paused))
			continue;
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			mask |= GMB__DEV_BIT(a->dev);
	}
	return mask;
}

static int cycle_unmap_tags(struct gmb__mem *m, const struct gmb__tag *only, bool paused,
			    char *err);
static void cycle_release(struct gmb__mem *m, const struct gmb__tag *only);

static int cycle_take_back(struct gmb__mem *m, struct gmb__tag *t);

/*
 * Maps again what a failed pause unmapped (the chunks are still ours), and
 * has gmbd lend again to what it handed back. A tag one of whose
 * allocations cannot be mapped (a chunk went meanwhile, or gmbd has no
 * memory for one handed back) is paused instead, here and at gmbd as far
 * as it agrees: never "active" with memory unmapped, and resume gets it
 * new memory (and the saved bytes).
 */
static void cycle_remap(struct gmb__mem *m, const struct gmb__tag *only)
{
	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		bool failed;

		if (!gmb__tag_in(t, only, false))
			continue;
		failed = cycle_take_back(m, t) < 0;
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			if (!a->mapped && !a->given && gmb__mem_map(m, a, NULL) < 0)
				failed = true;
		if (!failed)
			continue;
		cycle_unmap_tags(m, t, false, NULL);
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			a->given = false;
		t->paused = true;
		gmb__mem_send_pause(m, t->name, 0, NULL);
		cycle_release(m, t);
	}
}

static int cycle_unmap_tags(struct gmb__mem *m, const struct gmb__tag *only, bool paused, char *err)
{
	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		if (!gmb__tag_in(t, only, paused))
			continue;
		for (struct gmb__alloc *a = t->allocs; a; a = a->next) {
			int rc = a->mapped ? gmb__mem_unmap(m, a, err) : 0;

			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

static void cycle_mark(struct gmb__mem *m, const struct gmb__tag *only, bool from, bool to)
{
	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		if (!gmb__tag_in(t, only, from))
			continue;
		t->paused = to;
		for (struct gmb__alloc *a = t->allocs; a; a = a->next) {
			a->given = false;
			if (!to)
				a->saved = false;
		}
	}
}

/* The handles of the last lends of @only's (or every) paused allocations go. */
static void cycle_let_go(struct gmb__mem *m, const struct gmb__tag *only)
{
	struct gmb__handle *rel = NULL;

	pthread_mutex_lock(&m->conn->lock);
	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		if (!gmb__tag_in(t, only, true))
			continue;
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			gmb__cache_let_go(&m->tab, a, &rel);
	}
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
}

/*
 * When gmbd releases paused memory (its hello said so, and the pause told
 * it this side lets go too), the handles of the paused allocations' last
 * lends go now: the memory is the driver's once both sides let go, before
 * gmb_pause() returns. A resume then gets (and imports) new chunks. Done
 * after gmbd's answer, so that a failed pause can still map the same chunks.
 */
static void cycle_release(struct gmb__mem *m, const struct gmb__tag *only)
{
	if (m->devs->release_on_pause)
		cycle_let_go(m, only);
}

/**
 * gmb__cycle_pause() - drain, save PRESERVE bytes, unmap (VA kept), tell gmbd.
 * @name NULL or "": every active tag. A paused tag is a no-op success.
 */
int gmb__cycle_pause(struct gmb__mem *m, const char *name, char *err)
{
	struct gmb__tag *only = NULL;
	uint64_t mask, copied = 0;
	int rc;

	if (name && *name) {
		only = gmb__mem_tag_find(m, name);
		if (!only)
			return err_fmt(err, -ENOENT, "no tag \"%s\"", name);
		if (only->paused)
			return 0;
	} else if (!cycle_tag_any(m, false)) {
		return 0;
	}
	gmb__backup_busy(&m->bufs);
	mask = cycle_devices(m, only, false);
	/*
	 * One drain: the application's work is done after it, and gmb__save()
	 * waits for its own copies (on the backend's stream) before returning.
	 */
	rc = gmb__mem_sync(m, mask, err);
	if (rc == 0)
		rc = gmb__save(m, only, &copied, err);
	if (rc == 0)
		rc = cycle_unmap_tags(m, only, false, err);
	if (rc == 0)
		rc = gmb__mem_send_pause(m, only ? only->name : "", copied, err);
	if (rc < 0) {
		cycle_remap(m, only);
		return rc;
	}
	cycle_mark(m, only, false, true);
	cycle_release(m, only);
	return 0;
}

/* Resume. */

/* Every lend of every part of a ResumeReply, in order, pieces joined in @ls. */
static int cycle_collect_lends(const struct gmb__reply *rep, struct gmb__lends *ls, char *err)
{
	const Gmb__Lend **v;
	size_t total = 0, k = 0;
	int rc;

	*ls = (struct gmb__lends){ 0 };
	for (size_t i = 0; i < rep->nparts; i++)
		if (rep->parts[i]->body_case == GMB__ENVELOPE__BODY_RESUME_REPLY)
			total += rep->parts[i]->resume_reply->n_lends;
	v = calloc(total ? total : 1, sizeof(*v));
	if (!v)
		return err_fmt(err, -ENOMEM, "out of memory reading gmbd's resume reply");
	for (size_t i = 0; i < rep->nparts; i++) {
		const Gmb__Envelope *e = rep->parts[i];

		if (e->body_case != GMB__ENVELOPE__BODY_RESUME_REPLY)
			continue;
		for (size_t j = 0; j < e->resume_reply->n_lends; j++)
			v[k++] = e->resume_reply->lends[j];
	}
	rc = gmb__cache_lends_join(v, total, ls, err);
	free(v);
	return rc;
}

/* Each lend is for a distinct allocation of the resumed tags, and mappable. */
static int cycle_check_lends(struct gmb__mem *m, const struct gmb__tag *only,
			     const Gmb__Lend **lends, size_t n, char *err)
{
	int rc = 0;

	for (struct gmb__tag *t = m->tags; t; t = t->next)
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			a->marked = false;
	pthread_mutex_lock(&m->conn->lock);
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct gmb__alloc *a = lends[i] ? idmap_get(&m->tab.by_id, lends[i]->alloc_id) :
						  NULL;

		if (!a || a->marked || !gmb__tag_in(a->tag, only, true))
			rc = err_fmt(err, -EPROTO,
				     "gmbd lent allocation %" PRIu64 " in a resume"
				     " that does not cover it",
				     lends[i] ? lends[i]->alloc_id : 0);
		else
			rc = gmb__cache_lend_check(&m->tab, a, lends[i], err);
		if (a)
			a->marked = true;
	}
	pthread_mutex_unlock(&m->conn->lock);
	for (struct gmb__tag *t = m->tags; t && rc == 0; t = t->next)
		for (struct gmb__alloc *a = t->allocs; a && rc == 0; a = a->next)
			if (gmb__tag_in(t, only, true) && !a->marked)
				rc = err_fmt(err, -EPROTO,
					     "gmbd's resume left allocation %" PRIu64
					     " of tag \"%s\" without memory",
					     a->id, t->name);
	return rc;
}

/*
 * ZERO: zero-filled; PRESERVE: the saved bytes (zero-filled if none were
 * saved). Queued as soon as the allocation is mapped, so the copy of one
 * runs while the next is mapped: mapping many small allocations would
 * otherwise add to the copy time instead of hiding under it.
 */
static int cycle_restore_one(struct gmb__mem *m, struct gmb__alloc *a, char *err)
{
	struct backend *be = m->be;
	bool copy = a->saved && a->copy.how != GMB__COPY_NONE;
	int mode = gmb__alloc_mode(a), rc;

	if (mode == GMB_MODE_DISCARD)
		return 0;
	/* Pageable and file copies go piece by piece through pinned memory. */
	if (mode == GMB_MODE_PRESERVE && copy && a->copy.how != GMB__COPY_PINNED)
		return gmb__backup_restore(m->be, &m->bufs, a, err);
	rc = copy ? gmb__backup_queue(be, a, BACKEND_FROM_HOST) :
		    be->ops->contents_queue(be, a->dev, BACKEND_ZERO, NULL, a->va, a->size);
	return rc < 0 ? backend_fail_msg(err, rc, "restoring an allocation's contents") : 0;
}

/* The lends become the allocations' last lends, then each is mapped. */
static int cycle_apply_lends(struct gmb__mem *m, const Gmb__Lend **lends, size_t n, char *err)
{
	struct gmb__handle *rel = NULL;
	int rc = 0;

	pthread_mutex_lock(&m->conn->lock);
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct gmb__alloc *a = idmap_get(&m->tab.by_id, lends[i]->alloc_id);

		rc = gmb__cache_lend_set(&m->tab, a, lends[i]->chunk_ids, lends[i]->chunk_sizes,
					 (uint32_t)lends[i]->n_chunk_ids, &rel);
	}
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
	if (rc == -ENOMEM)
		return err_fmt(err, rc, "out of memory recording gmbd's lends");
	if (rc < 0)
		return err_fmt(err, rc, "a chunk gmbd lent was dropped before it was mapped");
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct gmb__alloc *a = idmap_get(&m->tab.by_id, lends[i]->alloc_id);

		rc = gmb__mem_map(m, a, err);
		if (rc == 0)
			rc = cycle_restore_one(m, a, err);
	}
	return rc;
}

/* Ids per lend-again request: they fit one packet with room to spare. */
#define CYCLE_TAKE_MAX 1024u

/* Each lend is for a distinct one of @ids (sorted), and mappable; each of them has one. */
static int cycle_check_given(struct gmb__mem *m, const uint64_t *ids, size_t k,
			     const Gmb__Lend **lends, size_t n)
{
	int rc = 0;

	pthread_mutex_lock(&m->conn->lock);
	for (size_t i = 0; i < k; i++)
		((struct gmb__alloc *)idmap_get(&m->tab.by_id, ids[i]))->marked = false;
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct gmb__alloc *a = idmap_get(&m->tab.by_id, lends[i]->alloc_id);

		if (!a || a->marked ||
		    !bsearch(&lends[i]->alloc_id, ids, k, sizeof(*ids), idmap_cmp_key))
			rc = -EPROTO;
		else
			rc = gmb__cache_lend_check(&m->tab, a, lends[i], NULL);
		if (a)
			a->marked = true;
	}
	for (size_t i = 0; i < k && rc == 0; i++)
		if (!((struct gmb__alloc *)idmap_get(&m->tab.by_id, ids[i]))->marked)
			rc = -EPROTO;
	pthread_mutex_unlock(&m->conn->lock);
	return rc;
}

/* Allocations @ids, handed back by a pause that failed, lent again, mapped, restored. */
static int cycle_take_back_ids(struct gmb__mem *m, uint64_t *ids, size_t k)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ResumeRequest req = GMB__RESUME_REQUEST__INIT;
	struct gmb__reply rep;
	struct gmb__lends ls = { 0 };
	uint64_t mask = 0;
	int rc, src;

	qsort(ids, k, sizeof(*ids), idmap_cmp_key);
	req.alloc_ids = ids;
	req.n_alloc_ids = k;
	env.body_case = GMB__ENVELOPE__BODY_RESUME;
	env.resume = &req;
	rc = gmb__request(m->conn, &env, &rep, NULL);
	/* A refusal (lends_cleared among them) leaves them given back on both sides. */
	if (rc == 0 && rep.status < 0)
		rc = rep.status;
	if (rc < 0)
		goto out_rep;
	rc = cycle_collect_lends(&rep, &ls, NULL);
	if (rc == 0)
		rc = cycle_check_given(m, ids, k, ls.v, ls.n);
	if (rc < 0)
		goto out_lends;
	rc = cycle_apply_lends(m, ls.v, ls.n, NULL);
	/* The restores queued run out before anything is unmapped again. */
	for (size_t i = 0; i < ls.n; i++)
		mask |= GMB__DEV_BIT(ls.v[i]->device);
	src = gmb__mem_sync(m, mask, NULL);
	rc = rc ? rc : src;
	for (size_t i = 0; i < ls.n && rc == 0; i++)
		((struct gmb__alloc *)idmap_get(&m->tab.by_id, ls.v[i]->alloc_id))->given = false;
out_lends:
	gmb__cache_lends_free(&ls);
out_rep:
	gmb__reply_deinit(&rep);
	return rc;
}

/*
 * The allocations of @t that a pause which failed handed back (save.c):
 * lent again, mapped and restored from their copies, a packet of ids at a
 * time. Return: 0, or <0 for a tag that keeps some without memory.
 */
static int cycle_take_back(struct gmb__mem *m, struct gmb__tag *t)
{
	uint64_t ids[CYCLE_TAKE_MAX];
	struct gmb__alloc *a = t->allocs;
	int rc = 0;

	while (rc == 0 && a) {
		size_t k = 0;

		for (; a && k < CYCLE_TAKE_MAX; a = a->next)
			if (a->given)
				ids[k++] = a->id;
		if (k)
			rc = cycle_take_back_ids(m, ids, k);
	}
	return rc;
}

/* Puts a failed resume back: unmapped here, paused at gmbd, tag by tag. */
static void cycle_repause(struct gmb__mem *m, const struct gmb__tag *only)
{
	cycle_unmap_tags(m, only, true, NULL);
	for (struct gmb__tag *t = m->tags; t; t = t->next)
		if (gmb__tag_in(t, only, true))
			gmb__mem_send_pause(m, t->name, 0, NULL);
	cycle_release(m, only);
}

static int cycle_resume_reply(struct gmb__mem *m, const struct gmb__tag *only,
			      const struct gmb__reply *rep, char *err)
{
	struct gmb__lends ls;
	int rc;

	rc = cycle_collect_lends(rep, &ls, err);
	if (rc == 0)
		rc = cycle_check_lends(m, only, ls.v, ls.n, err);
	if (rc == 0) {
		rc = cycle_apply_lends(m, ls.v, ls.n, err);
		/*
		 * Wait for the queued restores even after a failure (a repause would
		 * unmap under them); the application's next kernel must see the
		 * restored bytes anyway. The queue is on each device's primary
		 * context, which draining the device waits for.
		 */
		int src = gmb__mem_sync(m, cycle_devices(m, only, true), rc ? NULL : err);

		rc = rc ? rc : src;
	}
	gmb__cache_lends_free(&ls);
	return rc;
}

/*
 * A refused resume whose lend gmbd took back (it could not send the chunk
 * fds): gmbd cleared the tags' last lends, so this side lets go of them too,
 * as a pause that releases handles does, and both sides agree.
 */
static bool cycle_lends_cleared(const struct gmb__reply *rep)
{
	const Gmb__Envelope *last = rep->nparts ? rep->parts[rep->nparts - 1] : NULL;

	return last && last->body_case == GMB__ENVELOPE__BODY_RESUME_REPLY &&
	       last->resume_reply->lends_cleared;
}

/* Without retain, a copy is freed once resume has copied it back (and drained). */
static void cycle_drop_copies(struct gmb__mem *m, const struct gmb__tag *only)
{
	if (gmb__backup_retain())
		return;
	for (struct gmb__tag *t = m->tags; t; t = t->next) {
		if (!gmb__tag_in(t, only, true))
			continue;
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			gmb__backup_free(m->be, &m->bufs, a);
	}
}

/* Importers that followed the pause of the resumed tags (ResumeReply.followers). */
static uint32_t cycle_followers(const struct gmb__reply *rep)
{
	const Gmb__Envelope *last = rep->nparts ? rep->parts[rep->nparts - 1] : NULL;

	return last && last->body_case == GMB__ENVELOPE__BODY_RESUME_REPLY ?
		       last->resume_reply->followers :
		       0;
}

/*
 * The bytes are back: gmbd has the importers that followed the pause map
 * the tags again, and answers once they did. Their failures are theirs
 * (they stay unmapped until they open the handle again): the resume stands.
 */
static void cycle_tell_followers(struct gmb__mem *m, const char *name)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcResumed req = GMB__IPC_RESUMED__INIT;

	req.tag = (char *)name;
	env.body_case = GMB__ENVELOPE__BODY_IPC_RESUMED;
	env.ipc_resumed = &req;
	gmb__request_status(m->conn, &env, NULL);
}

/**
 * gmb__cycle_resume() - lend, map at the same addresses, restore contents.
 * @name NULL or "": every paused tag. An active tag is a no-op success; on
 * any failure (-ENOMEM from gmbd among them) the tags stay paused.
 */
int gmb__cycle_resume(struct gmb__mem *m, const char *name, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ResumeRequest req = GMB__RESUME_REQUEST__INIT;
	struct gmb__tag *only = NULL;
	struct gmb__reply rep;
	int rc;

	if (name && *name) {
		only = gmb__mem_tag_find(m, name);
		if (!only)
			return err_fmt(err, -ENOENT, "no tag \"%s\"", name);
		if (!only->paused)
			return 0;
	} else if (!cycle_tag_any(m, true)) {
		return 0;
	}
	gmb__backup_busy(&m->bufs);
	req.tag = only ? only->name : "";
	req.wait_ms = m->wait_ms;
	env.body_case = GMB__ENVELOPE__BODY_RESUME;
	env.resume = &req;
	rc = gmb__request(m->conn, &env, &rep, err);
	if (rep.status < 0) {
		/* Still paused on both sides; gmbd may have cleared the last lends. */
		if (cycle_lends_cleared(&rep))
			cycle_let_go(m, only);
		goto out_rep;
	}
	if (rc == 0)
		rc = cycle_resume_reply(m, only, &rep, err);
	if (rc < 0) {
		cycle_repause(m, only);
	} else {
		cycle_drop_copies(m, only);
		cycle_mark(m, only, true, false);
		if (cycle_followers(&rep))
			cycle_tell_followers(m, req.tag);
	}
out_rep:
	gmb__mem_sweep(m);
	gmb__reply_deinit(&rep);
	return rc;
}

/* Close. */

/**
 * gmb__cycle_close() - drain and unmap every active allocation (gmb_close),
 * before the connection ends: gmbd may lend the chunks to others then.
 */
void gmb__cycle_close(struct gmb__mem *m)
{
	if (!m->be)
		return;
	gmb__mem_sync(m, cycle_devices(m, NULL, false), NULL);
	cycle_unmap_tags(m, NULL, false, NULL);
}
