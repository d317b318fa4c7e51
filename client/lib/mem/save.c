/*
 * save.c - a pause's saving of PRESERVE bytes to their host copies, and the
 * handing back of each allocation to gmbd as soon as its bytes are saved.
 *
 * Pinned copies are queued back to back and waited for, so that many small
 * allocations copy at the link's bandwidth; pageable and file copies then
 * go through their pinned pieces one allocation at a time (backup.c).
 *
 * When gmbd gives paused memory back to the driver, a large pause does not
 * keep all of it until its last byte is saved: the copies run in groups of
 * m->give_bytes, and while one group copies, the one before it is unmapped
 * and handed back (PauseRequest.alloc_ids), so that the driver has it at
 * once. Memory given back right before it is created again fills slower
 * (bench/scrub_probe.cu: 50.5 against 55.2 GB/s within 50 ms of a 16 GiB
 * release), which a resume right after a pause would otherwise pay in
 * full. Only saved allocations go ahead (a failed pause must leave every
 * byte where it was: cycle.c lends the given ones again and restores them
 * from their copies), never an allocation another process may map (gmbd
 * would refuse), and never the last group: the pause itself takes it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "client/lib/mem/mem.h"

/* Bytes saved per group given back ahead of the pause, by default. */
#define SAVE_GIVE_BYTES (1ULL << 30)
/* Allocations per group: their ids fit one packet with room to spare. */
#define SAVE_GIVE_MAX	1024u

/* One pause's saving: the allocations of its tags, in order. */
struct save_run {
	struct gmb__mem *m;
	struct gmb__alloc **v;
	size_t n;
	uint64_t group; /* PRESERVE bytes per group given back; 0: none is */
	uint64_t *copied;
	char *err;
};

/* Waits for the contents operations queued on the devices in @mask. */
static int save_wait(struct gmb__mem *m, uint64_t mask, char *err)
{
	int first = 0;

	for (int d = 0; d < m->devs->ndevices; d++) {
		int rc = mask & GMB__DEV_BIT(d) ? m->be->ops->wait(m->be, d) : 0;

		if (rc < 0 && first == 0)
			first = backend_fail_msg(err, rc, "waiting for the copies to host");
	}
	return first;
}

/* @a's copy made ready: a->marked says it is no pinned one (it waits for later). */
static int save_prepare(struct save_run *r, struct gmb__alloc *a)
{
	int rc;

	a->marked = a->saved = false;
	if (gmb__alloc_mode(a) != GMB_MODE_PRESERVE)
		return 0;
	rc = gmb__backup_prepare(r->m->be, &r->m->bufs, a, r->err);
	if (rc < 0)
		return rc;
	a->marked = a->copy.how != GMB__COPY_PINNED;
	*r->copied += a->size;
	return 0;
}

/* @a's pinned copy queued (prepared before); its device joins *@queued. */
static int save_queue(struct save_run *r, struct gmb__alloc *a, uint64_t *queued)
{
	int rc;

	if (gmb__alloc_mode(a) != GMB_MODE_PRESERVE || a->marked)
		return 0;
	rc = gmb__backup_queue(r->m->be, a, BACKEND_TO_HOST);
	if (rc < 0)
		return backend_fail_msg(r->err, rc, "saving a preserved allocation");
	*queued |= GMB__DEV_BIT(a->dev);
	return 0;
}

/* Where the group that starts at @from ends (one past its last). */
static size_t save_group_end(const struct save_run *r, size_t from)
{
	uint64_t bytes = 0;
	size_t i = from;

	if (!r->group)
		return r->n;
	while (i < r->n && bytes < r->group && i - from < SAVE_GIVE_MAX) {
		if (gmb__alloc_mode(r->v[i]) == GMB_MODE_PRESERVE)
			bytes += r->v[i]->size;
		i++;
	}
	return i;
}

/*
 * The saved allocations of v[@from, @to) whose copies are pinned (@slow
 * false) or not (true) are unmapped and handed back; once gmbd answers
 * this side lets go of their handles too. On failure the unmapped ones
 * are still lent (cycle.c maps them back).
 */
static int save_give(struct save_run *r, size_t from, size_t to, bool slow)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PauseRequest req = GMB__PAUSE_REQUEST__INIT;
	struct gmb__mem *m = r->m;
	struct gmb__handle *rel = NULL;
	uint64_t ids[SAVE_GIVE_MAX];
	size_t k = 0;
	int rc = 0;

	for (size_t i = from; i < to && rc == 0; i++) {
		struct gmb__alloc *a = r->v[i];

		if (!a->saved || a->given || a->marked != slow)
			continue;
		rc = gmb__mem_unmap(m, a, r->err);
		if (rc == 0)
			ids[k++] = a->id;
	}
	if (rc < 0 || k == 0)
		return rc;
	req.alloc_ids = ids;
	req.n_alloc_ids = k;
	req.handles_released = true;
	env.body_case = GMB__ENVELOPE__BODY_PAUSE;
	env.pause = &req;
	rc = gmb__request_status(m->conn, &env, r->err);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&m->conn->lock);
	for (size_t i = from; i < to; i++) {
		struct gmb__alloc *a = r->v[i];

		if (!a->saved || a->given || a->marked != slow)
			continue;
		a->given = true;
		gmb__cache_let_go(&m->tab, a, &rel);
	}
	pthread_mutex_unlock(&m->conn->lock);
	gmb__cache_release_run(m->be, rel);
	return 0;
}

/*
 * Pinned copies, group by group: the next group's copies are made ready
 * while this one's run, queued once it is done, and this one is handed
 * back while they run. Without groups (r->group 0) it is one group: every
 * copy prepared and queued in turn, waited for once.
 */
static int save_pinned(struct save_run *r)
{
	size_t from = 0, to = save_group_end(r, 0), next;
	uint64_t queued = 0;
	int rc = 0, wrc;

	for (size_t i = from; i < to && rc == 0; i++) {
		rc = save_prepare(r, r->v[i]);
		if (rc == 0)
			rc = save_queue(r, r->v[i], &queued);
	}
	for (;;) {
		next = save_group_end(r, to);
		for (size_t i = to; i < next && rc == 0; i++)
			rc = save_prepare(r, r->v[i]);
		/* Even after a failure: queued copies still write the host copies. */
		wrc = save_wait(r->m, queued, rc ? NULL : r->err);
		rc = rc ? rc : wrc;
		if (rc < 0)
			return rc;
		for (size_t i = from; i < to; i++)
			r->v[i]->saved = gmb__alloc_mode(r->v[i]) == GMB_MODE_PRESERVE &&
					 !r->v[i]->marked;
		if (to == r->n)
			return 0;
		queued = 0;
		for (size_t i = to; i < next && rc == 0; i++)
			rc = save_queue(r, r->v[i], &queued);
		if (rc == 0)
			rc = save_give(r, from, to, false);
		from = to;
		to = next;
	}
}

/* Pageable and file copies, one at a time; with groups, handed back as they fill. */
static int save_slow(struct save_run *r)
{
	uint64_t bytes = 0;
	size_t from = 0, last = r->n;
	int rc = 0;

	for (size_t i = 0; i < r->n; i++)
		if (r->v[i]->marked)
			last = i;
	if (last == r->n)
		return 0;
	/* The last pinned group goes before the slow copies begin. */
	if (r->group)
		rc = save_give(r, 0, r->n, false);
	for (size_t i = 0; i <= last && rc == 0; i++) {
		struct gmb__alloc *a = r->v[i];

		if (!a->marked)
			continue;
		rc = gmb__backup_save(r->m->be, &r->m->bufs, a, r->err);
		a->saved = rc == 0;
		bytes += a->size;
		if (rc == 0 && r->group && i < last &&
		    (bytes >= r->group || i + 1 - from >= SAVE_GIVE_MAX)) {
			rc = save_give(r, from, i + 1, true);
			from = i + 1;
			bytes = 0;
		}
	}
	return rc;
}

/* The allocations of the tags in (@only, active), in order, into r->v; whether groups pay. */
static int save_collect(struct save_run *r, const struct gmb__tag *only)
{
	uint64_t preserved = 0;
	bool shared = false;
	size_t n = 0;

	for (struct gmb__tag *t = r->m->tags; t; t = t->next)
		if (gmb__tag_in(t, only, false))
			n += t->nallocs;
	r->v = calloc(n ? n : 1, sizeof(*r->v));
	if (!r->v)
		return err_fmt(r->err, -ENOMEM, "out of memory pausing %zu allocations", n);
	for (struct gmb__tag *t = r->m->tags; t; t = t->next) {
		if (!gmb__tag_in(t, only, false))
			continue;
		for (struct gmb__alloc *a = t->allocs; a && r->n < n; a = a->next) {
			r->v[r->n++] = a;
			a->given = false;
			shared |= a->ipc_known;
			if (gmb__alloc_mode(a) == GMB_MODE_PRESERVE)
				preserved += a->size;
		}
	}
	r->group = r->m->give_bytes ? r->m->give_bytes : SAVE_GIVE_BYTES;
	/* Given back early only where the driver gets it, nobody else may map
	 * it, and a pause has at least two groups to overlap. */
	if (!r->m->devs->release_on_pause || !r->m->devs->gives_back || shared ||
	    preserved < 2 * r->group)
		r->group = 0;
	return 0;
}

/**
 * gmb__save() - PRESERVE allocations of the tags in (@only, active): device
 * to host, before the pause unmaps the rest. Allocations handed back here
 * have a->given set; *@copied gets the PRESERVE bytes prepared.
 */
int gmb__save(struct gmb__mem *m, const struct gmb__tag *only, uint64_t *copied, char *err)
{
	struct save_run r = { .m = m, .copied = copied, .err = err };
	int rc;

	rc = save_collect(&r, only);
	if (rc == 0)
		rc = save_pinned(&r);
	if (rc == 0)
		rc = save_slow(&r);
	free(r.v);
	return rc;
}
