/*
 * broker.c - gmbd's core, part one: the broker's life, clients, tags, drops,
 * trim and who may control whom. Allocations, pause and resume live in
 * daemon/core/lend.c.
 *
 * Invariants (with pool.h's):
 *   - A client holds a chunk (an entry with refs = n) exactly when n of its
 *     allocations have the chunk in their last lend; an entry with refs 0
 *     survives only while a DropRequest for it is unanswered (drop_sent).
 *   - Every chunk alive is in br->chunks; every allocation of a client is
 *     in c->allocs and in exactly one of its tags.
 *   - c->drops is only a buffer of broker_flush_drops(): empty between calls.
 */
#include "common/list.h"
#include "daemon/core/broker_internal.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"
#include "include/gmb.h"

#define BROKER_DEFAULT_MAX_CHUNK (1ULL << 30)

/* The default budget leaves @reserve to processes that do not use the broker. */
static uint64_t broker_budget(const struct backend *b, const struct broker_opts *o, int dev)
{
	uint64_t total = b->devices[dev].total_bytes;

	if (o->budget)
		return o->budget;
	/* pool_init() raises anything under the granularity to one granule. */
	return total > o->reserve ? total - o->reserve : 1;
}

/* An orphan (restored, or its session ended while its process lives) has nobody to ask. */
static bool broker_holder_away(const struct bclient *c)
{
	return c->orphan;
}

int broker_new(struct backend *b, const struct broker_opts *o, struct broker **out)
{
	struct broker *br;
	int rc = 0;

	if (!b || !o || !out || b->ndevices < 1 || b->ndevices > BACKEND_MAX_DEVICES)
		return -EINVAL;
	br = calloc(1, sizeof(*br));
	if (!br)
		return -ENOMEM;
	br->backend = b;
	br->opts = *o;
	if (!br->opts.max_chunk)
		br->opts.max_chunk = BROKER_DEFAULT_MAX_CHUNK;
	br->next_chunk_id = br->next_client_id = br->next_alloc_id = 1;
	for (int d = 0; d < b->ndevices; d++) {
		struct pool_cfg cfg = {
			.budget = broker_budget(b, &br->opts, d),
			.max_chunk = br->opts.max_chunk,
			.keep = br->opts.pool_keep,
			.registry = &br->chunks,
			.hooks = br->opts.hooks,
		};

		rc = pool_init(&br->pools[d], b, d, &cfg, &br->next_chunk_id);
		if (rc < 0)
			goto err_pools;
		br->pools[d].holder_away = broker_holder_away;
		br->ndevices++;
	}
	*out = br;
	return 0;

err_pools:
	for (int d = 0; d < br->ndevices; d++)
		pool_deinit(&br->pools[d]);
	free(br);
	return rc;
}

void broker_free(struct broker *br)
{
	if (!br)
		return;
	while (br->clients)
		broker_client_remove(br, br->clients);
	/* The objects let go of their versions, whose exports go with the table. */
	object_deinit(br);
	import_deinit(br);
	for (int d = 0; d < br->ndevices; d++)
		pool_deinit(&br->pools[d]);
	idmap_deinit(&br->chunks);
	free(br);
}

/* ---- clients ---- */

/* A client record with @id, linked last (status lists clients oldest first). */
static int broker_client_new(struct broker *br, const struct broker_peer *peer, uint64_t id,
			     const char *name, bool control, bool tool, struct bclient **out)
{
	struct bclient *c, **tail;
	size_t len;

	if (!br || !peer || !out || peer->ngroups < 0 || (peer->ngroups && !peer->groups))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	if (peer->ngroups) {
		c->groups = malloc(peer->ngroups * sizeof(*c->groups));
		if (!c->groups) {
			free(c);
			return -ENOMEM;
		}
		memcpy(c->groups, peer->groups, peer->ngroups * sizeof(*c->groups));
	}
	c->ngroups = peer->ngroups;
	c->id = id;
	len = name ? strnlen(name, WIRE_MAX_NAME) : 0;
	memcpy(c->name, name ? name : "", len);
	c->name[len] = '\0';
	c->pid = peer->pid;
	c->uid = peer->uid;
	c->gid = peer->gid;
	c->start_time = peer->start_time;
	c->control = control;
	c->tool = tool;
	for (tail = &br->clients; *tail; tail = &(*tail)->next)
		c->prev = *tail;
	*tail = c;
	br->nclients++;
	*out = c;
	return 0;
}

int broker_client_add(struct broker *br, const struct broker_peer *peer, const char *name,
		      bool control, bool tool, struct bclient **out)
{
	int rc;

	if (!br)
		return -EINVAL;
	rc = broker_client_new(br, peer, br->next_client_id, name, control, tool, out);
	if (rc == 0)
		br->next_client_id++;
	return rc;
}

int broker_restore_client(struct broker *br, const struct broker_peer *peer, uint64_t id,
			  const char *name, bool control, struct bclient **out)
{
	int rc;

	if (!br || id == 0)
		return -EINVAL;
	for (struct bclient *o = br->clients; o; o = o->next)
		if (o->id == id)
			return -EINVAL;
	rc = broker_client_new(br, peer, id, name, control, false, out);
	if (rc < 0)
		return rc;
	(*out)->orphan = true;
	if (br->next_client_id <= id)
		br->next_client_id = id + 1;
	return 0;
}

uint32_t broker_orphans(const struct broker *br)
{
	uint32_t n = 0;

	for (const struct bclient *c = br->clients; c; c = c->next)
		n += c->orphan;
	return n;
}

void broker_client_remove(struct broker *br, struct bclient *c)
{
	struct btag *t;

	if (!br || !c)
		return;
	wait__forget(br, c);
	import_client_gone(br, c);
	for (t = c->tags; t; t = t->next)
		while (t->allocs)
			broker__alloc_destroy(br, c, t->allocs);
	/* Its process closed (or will close) every handle: acked or not, no drop is owed. */
	for (int d = 0; d < br->ndevices; d++)
		pool_forget(&br->pools[d], c);
	while (c->tags)
		broker__tag_remove(c, c->tags);
	DLIST_UNLINK(br->clients, c);
	br->nclients--;
	for (int d = 0; d < br->ndevices; d++)
		pool_shrink(&br->pools[d], br->opts.pool_keep, NULL);
	idmap_deinit(&c->allocs);
	free(c->drops);
	free(c->groups);
	free(c);
}

/*
 * The kernel's word on the process now: a rejoining client may have changed
 * groups since the record was written, and the admin-group rule reads them.
 * On -ENOMEM the old ones stay.
 */
int broker_client_set_creds(struct bclient *c, const struct broker_peer *peer)
{
	gid_t *groups = NULL;

	if (peer->ngroups < 0 || (peer->ngroups && !peer->groups))
		return -EINVAL;
	if (peer->ngroups) {
		groups = malloc((size_t)peer->ngroups * sizeof(*groups));
		if (!groups)
			return -ENOMEM;
		memcpy(groups, peer->groups, (size_t)peer->ngroups * sizeof(*groups));
	}
	free(c->groups);
	c->groups = groups;
	c->ngroups = peer->ngroups;
	c->gid = peer->gid;
	return 0;
}

/* Decimal digits only, no sign, no overflow. */
static bool broker_parse_u64(const char *s, uint64_t *v)
{
	uint64_t n = 0;

	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || n > (UINT64_MAX - 9) / 10)
			return false;
		n = n * 10 + (uint64_t)(*s - '0');
	}
	*v = n;
	return true;
}

struct bclient *broker_client_get(struct broker *br, uint64_t id)
{
	for (struct bclient *c = br->clients; c; c = c->next)
		if (c->id == id && !c->tool)
			return c;
	return NULL;
}

/* Adds @c to what @f found; only the first BROKER_FOUND_MAX are kept. */
static void broker_found_add(struct broker_found *f, struct bclient *c)
{
	if (f->n < BROKER_FOUND_MAX)
		f->c[f->n] = c;
	f->n++;
}

struct bclient *broker_client_find(struct broker *br, const char *selector,
				   struct broker_found *out)
{
	struct broker_found f = { 0 };
	struct bclient *c;
	uint64_t v;

	if (!br || !selector || !*selector)
		goto out;
	if (selector[0] == '#') {
		if (broker_parse_u64(selector + 1, &v) && (c = broker_client_get(br, v)))
			broker_found_add(&f, c);
		goto out;
	}
	if (broker_parse_u64(selector, &v)) {
		if ((c = broker_client_get(br, v))) {
			broker_found_add(&f, c);
			goto out;
		}
		/* One process may hold several connections: all of them match. */
		for (c = br->clients; c; c = c->next)
			if (!c->tool && (uint64_t)c->pid == v)
				broker_found_add(&f, c);
		f.by_pid = f.n > 0;
		if (f.n)
			goto out;
	}
	for (c = br->clients; c; c = c->next)
		if (!c->tool && strcmp(c->name, selector) == 0)
			broker_found_add(&f, c);
out:
	if (out)
		*out = f;
	return f.n == 1 ? f.c[0] : NULL;
}

int broker_found_err(const struct broker_found *f, const char *selector, bool groups, char *err)
{
	size_t shown = f->n < BROKER_FOUND_MAX ? f->n : BROKER_FOUND_MAX;

	if (f->n == 0)
		return err_fmt(err, -ENOENT, "no client%s matches '%s'", groups ? " or group" : "",
			       selector);
	if (f->by_pid)
		err_fmt(err, 0, "%zu clients have pid %s (", f->n, selector);
	else
		err_fmt(err, 0, "%zu clients are named '%s' (", f->n, selector);
	for (size_t i = 0; i < shown; i++) {
		const struct bclient *c = f->c[i];

		if (f->by_pid)
			err_append(err, "%s#%" PRIu64 " '%s'", i ? ", " : "", c->id, c->name);
		else
			err_append(err, "%s#%" PRIu64 " pid %d", i ? ", " : "", c->id, (int)c->pid);
	}
	err_append(err, "%s): name one by id (#N)%s%s", f->n > shown ? ", ..." : "",
		   f->by_pid ? "" : " or pid", groups ? ", or give them a group" : "");
	return -ENOTUNIQ;
}

/* ---- tags ---- */

void broker__tag_link(struct btag *t, struct balloc *a)
{
	DLIST_PUSH(t->allocs, a);
	t->nallocs++;
	t->bytes += a->size;
}

static void broker_tag_unlink(struct btag *t, struct balloc *a)
{
	DLIST_UNLINK(t->allocs, a);
	t->nallocs--;
	t->bytes -= a->size;
}

void broker__alloc_activate(struct balloc *a, bool active)
{
	struct bclient *c = a->tag->client;

	if (a->active == active)
		return;
	a->active = active;
	if (active)
		c->lent_chunks += a->nchunks;
	else
		c->lent_chunks -= a->nchunks;
}

void broker__alloc_destroy(struct broker *br, struct bclient *c, struct balloc *a)
{
	struct pool *p = &br->pools[a->dev];

	/* Chunks another process maps stay pinned, out of the pool. */
	import_alloc_gone(br, a);
	for (uint32_t i = 0; i < a->nchunks; i++) {
		struct chunk *ch = a->chunks[i];

		if (!ch)
			continue;
		if (a->active)
			pool_put(p, ch);
		pool_unhold(p, ch, c, false);
	}
	broker__alloc_activate(a, false);
	broker_tag_unlink(a->tag, a);
	idmap_del(&c->allocs, a->id);
	free(a->chunks);
	free(a);
}

struct btag *broker_tag_find(const struct bclient *c, const char *name)
{
	for (struct btag *t = c->tags; t; t = t->next)
		if (strcmp(t->name, name) == 0)
			return t;
	return NULL;
}

/* Room kept at the end of broker_tag_check()'s sentence for " and N more". */
#define BROKER_TAGS_MORE_ROOM 24

int broker_tag_check(const struct bclient *c, const char *tag, char *err)
{
	uint32_t shown = 0;

	if (!tag[0] || broker_tag_find(c, tag))
		return 0;
	if (!err)
		return -ENOENT;
	err_fmt(err, 0, "client '%s' has no tag '%s'", c->name, tag);
	if (!c->tags) {
		err_append(err, ": it has no tags yet");
		return -ENOENT;
	}
	err_append(err, "; its tags:");
	for (const struct btag *t = c->tags; t; t = t->next) {
		/* Up to 256 tags of 255 bytes: those that fit, then how many more. */
		if (strlen(err) + strlen(t->name) + 4 + BROKER_TAGS_MORE_ROOM >= ERR_MSG_MAX)
			break;
		err_append(err, "%s '%s'", shown++ ? "," : "", t->name);
	}
	if (shown < c->ntags)
		err_append(err, " and %u more", c->ntags - shown);
	return -ENOENT;
}

size_t broker_client_nallocs(const struct bclient *c)
{
	return c->allocs.count;
}

struct balloc *broker_alloc_get(const struct bclient *c, uint64_t id)
{
	return idmap_get(&c->allocs, id);
}

struct chunk *broker_chunk_get(const struct broker *br, uint64_t id)
{
	return idmap_get(&br->chunks, id);
}

uint64_t broker__active_bytes(const struct bclient *c, int dev)
{
	uint64_t n = 0;

	for (const struct btag *t = c->tags; t; t = t->next)
		for (const struct balloc *a = t->allocs; a; a = a->next)
			if (a->active && a->dev == dev)
				n += a->size;
	return n;
}

int broker__tag_get(struct bclient *c, const char *name, struct btag **out, bool *created,
		    char *err)
{
	struct btag *t, **tail;
	size_t len = name ? strnlen(name, WIRE_MAX_NAME + 1) : 0;

	*created = false;
	if (len == 0)
		return err_fmt(err, -EINVAL, "empty tag");
	if (len > WIRE_MAX_NAME)
		return err_fmt(err, -EINVAL, "tag is longer than %d bytes", WIRE_MAX_NAME);
	t = broker_tag_find(c, name);
	if (t) {
		*out = t;
		return 0;
	}
	if (c->ntags >= BROKER_MAX_TAGS)
		return err_fmt(err, -ENOSPC, "client '%s' already has %d tags, the limit", c->name,
			       BROKER_MAX_TAGS);
	t = calloc(1, sizeof(*t));
	if (!t)
		return err_fmt(err, -ENOMEM, "out of memory creating tag '%s'", name);
	memcpy(t->name, name, len + 1);
	t->mode = GMB_MODE_DISCARD;
	t->client = c;
	for (tail = &c->tags; *tail; tail = &(*tail)->next)
		;
	*tail = t;
	c->ntags++;
	*created = true;
	*out = t;
	return 0;
}

void broker__tag_remove(struct bclient *c, struct btag *t)
{
	struct btag **pos;

	for (pos = &c->tags; *pos && *pos != t; pos = &(*pos)->next)
		;
	if (!*pos)
		return;
	*pos = t->next;
	c->ntags--;
	free(t);
}

int broker_set_mode(struct broker *br, struct bclient *c, const char *tag, int mode, char *err)
{
	struct btag *t;
	bool created;
	int rc;

	if (mode < GMB_MODE_DISCARD || mode > GMB_MODE_PRESERVE)
		return err_fmt(err, -EINVAL, "mode %d is not discard (0), zero (1) or preserve (2)",
			       mode);
	rc = broker__tag_get(c, tag, &t, &created, err);
	if (rc < 0)
		return rc;
	t->mode = mode;
	return 0;
}

/* ---- drops and trim ---- */

int broker_trim(struct broker *br, int dev, uint64_t *released, uint64_t *pending, char *err)
{
	uint64_t rel = 0, pend = 0;

	if (dev < -1 || dev >= br->ndevices)
		return err_fmt(err, -ENODEV, "device %d does not exist (%d device%s)", dev,
			       br->ndevices, br->ndevices == 1 ? "" : "s");
	for (int d = 0; d < br->ndevices; d++)
		if (dev == -1 || d == dev)
			rel += pool_shrink(&br->pools[d], 0, &pend);
	if (released)
		*released = rel;
	if (pending)
		*pending = pend;
	return 0;
}

static int broker_drops_push(struct bclient *c, uint64_t id)
{
	if (c->ndrops == c->cap_drops) {
		size_t cap = c->cap_drops ? c->cap_drops * 2 : 16;
		uint64_t *v = realloc(c->drops, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		c->drops = v;
		c->cap_drops = cap;
	}
	c->drops[c->ndrops++] = id;
	return 0;
}

/* Queues a drop for every holder of a releasing chunk not yet asked. */
static void broker_queue_drops(struct pool *p)
{
	for (struct chunk *ch = p->pending_head; ch; ch = ch->next) {
		for (uint32_t i = 0; i < ch->nholders; i++) {
			struct chunk_holder *h = &ch->holders[i];

			/* An orphan has nobody to ask: asked once it is back. */
			if (h->drop_sent || h->client->orphan)
				continue;
			/* Left unsent, it is queued again by the next flush. */
			if (broker_drops_push(h->client, ch->id) < 0) {
				log_err("out of memory queueing a drop client=%s chunk=%llu",
					h->client->name, (unsigned long long)ch->id);
				continue;
			}
			h->drop_sent = true;
		}
	}
}

void broker_flush_drops(struct broker *br, broker_drop_cb cb, void *arg)
{
	struct bclient *c, *next;

	for (int d = 0; d < br->ndevices; d++)
		broker_queue_drops(&br->pools[d]);
	for (c = br->clients; c; c = next) {
		size_t n = c->ndrops;

		/* Read first: the callback may remove @c (a failed send). */
		next = c->next;
		if (n == 0)
			continue;
		c->ndrops = 0;
		cb(arg, c, c->drops, n);
	}
}

/* Clears acked chunks from @c's last lends (only paused ones can have them). */
static void broker_clear_acked(struct bclient *c)
{
	for (struct btag *t = c->tags; t; t = t->next)
		for (struct balloc *a = t->allocs; a; a = a->next)
			for (uint32_t i = 0; i < a->nchunks; i++)
				if (a->chunks[i] && a->chunks[i]->acked)
					a->chunks[i] = NULL;
}

void broker_dropped(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n)
{
	struct chunk_holder *h;
	struct chunk *ch;
	bool any = false;

	/* Mark, clear the lends in one pass, then unhold: linear in ids + lends. */
	for (size_t i = 0; i < n; i++) {
		ch = idmap_get(&br->chunks, ids[i]);
		h = ch ? pool_holder(ch, c) : NULL;
		if (h && h->drop_sent) {
			ch->acked = true;
			any = true;
		}
	}
	if (!any)
		return;
	broker_clear_acked(c);
	for (size_t i = 0; i < n; i++) {
		ch = idmap_get(&br->chunks, ids[i]);
		if (!ch || !ch->acked)
			continue;
		ch->acked = false;
		pool_unhold(&br->pools[ch->dev], ch, c, true);
	}
}

/* ---- permissions ---- */

static bool broker_in_admin_group(const struct broker *br, const struct bclient *c)
{
	if (!br->opts.have_admin_gid)
		return false;
	if (c->gid == br->opts.admin_gid)
		return true;
	for (int i = 0; i < c->ngroups; i++)
		if (c->groups[i] == br->opts.admin_gid)
			return true;
	return false;
}

/* ", uid N", " or group 'gmb'": who would be allowed, for the refusal. */
static void broker_needs(const struct broker *br, const struct bclient *target, char *err)
{
	struct group grp, *res = NULL;
	char buf[1024];

	err_append(err, "needs root");
	if (target)
		err_append(err, ", uid %u", (unsigned)target->uid);
	if (br->opts.daemon_uid != 0 && (!target || target->uid != br->opts.daemon_uid))
		err_append(err, ", uid %u (gmbd's)", (unsigned)br->opts.daemon_uid);
	if (!br->opts.have_admin_gid)
		return;
	if (getgrgid_r(br->opts.admin_gid, &grp, buf, sizeof(buf), &res) == 0 && res)
		err_append(err, " or group '%s'", res->gr_name);
	else
		err_append(err, " or group %u", (unsigned)br->opts.admin_gid);
}

int broker_may_control(const struct broker *br, const struct bclient *actor,
		       const struct bclient *target, char *err)
{
	uid_t uid = actor->uid;

	if (uid == 0 || uid == br->opts.daemon_uid || (target && uid == target->uid) ||
	    broker_in_admin_group(br, actor))
		return 0;
	if (target)
		err_fmt(err, -EPERM,
			"client '%s' (uid %u) may not control '%s' (uid %u): ", actor->name,
			(unsigned)uid, target->name, (unsigned)target->uid);
	else
		err_fmt(err, -EPERM, "client '%s' (uid %u) may not trim the pools: ", actor->name,
			(unsigned)uid);
	broker_needs(br, target, err);
	return -EPERM;
}

void broker_result_deinit(struct broker_result *r)
{
	if (!r)
		return;
	free(r->allocs);
	free(r->send);
	*r = (struct broker_result)BROKER_RESULT_INIT;
}

void broker_client_usage(const struct bclient *c, const char *tag, uint64_t *bytes,
			 uint64_t *chunks)
{
	*bytes = *chunks = 0;
	for (const struct btag *t = c->tags; t; t = t->next) {
		if (tag[0] && strcmp(t->name, tag) != 0)
			continue;
		for (const struct balloc *a = t->allocs; a; a = a->next) {
			if (!a->active)
				continue;
			*bytes += a->size;
			*chunks += a->nchunks;
		}
	}
}

void broker_client_pausing(const struct bclient *c, const char *tag, uint64_t *bytes,
			   uint64_t *chunks)
{
	*bytes = *chunks = 0;
	for (const struct btag *t = c->tags; t; t = t->next) {
		if (t->paused || (tag[0] && strcmp(t->name, tag) != 0))
			continue;
		for (const struct balloc *a = t->allocs; a; a = a->next) {
			*bytes += a->size;
			*chunks += a->nchunks;
		}
	}
}

uint64_t broker_uid_chunks(const struct broker *br, uid_t uid)
{
	uint64_t n = 0;

	for (const struct bclient *c = br->clients; c; c = c->next)
		if (c->uid == uid)
			n += c->lent_chunks;
	/* What the uid's named objects keep counts as its own. */
	return n + object_uid_chunks(br, uid);
}

/* Uids but @uid that hold lent chunks; on ENOMEM every such client counts
 * as a uid of its own, which only makes the share smaller. */
static uint64_t broker_other_uids(const struct broker *br, uid_t uid)
{
	struct idmap seen = IDMAP_INIT;
	uint64_t n = 0;
	bool short_of_memory = false;

	for (const struct bclient *c = br->clients; c; c = c->next) {
		if (c->uid == uid || !c->lent_chunks || idmap_get(&seen, (uint64_t)c->uid + 1))
			continue;
		if (!short_of_memory && idmap_put(&seen, (uint64_t)c->uid + 1, (void *)1) < 0)
			short_of_memory = true;
		n++;
	}
	idmap_deinit(&seen);
	return n;
}

uint64_t broker_uid_bound(const struct broker *br, uid_t uid)
{
	uint64_t share = br->opts.chunk_share;

	if (br->opts.max_chunks_per_uid || !share)
		return br->opts.max_chunks_per_uid;
	share /= broker_other_uids(br, uid) + 2;
	return share ? share : 1;
}

uint64_t broker_chunk_fds(const struct broker *br)
{
	uint64_t n = 0;

	for (int d = 0; d < br->ndevices; d++)
		n += br->pools[d].nchunks;
	return n * br->backend->ops->chunk_fds;
}

uint64_t broker_fds_chunk_room(const struct broker *br)
{
	unsigned per = br->backend->ops->chunk_fds;
	uint64_t conns = br->fds_conns > BROKER_FD_CONN_ROOM ? br->fds_conns : BROKER_FD_CONN_ROOM;
	uint64_t used = br->fds_base + conns + broker_chunk_fds(br) + BROKER_FD_SPARE;

	if (!br->opts.fd_limit || !per)
		return UINT64_MAX;
	return used < br->opts.fd_limit ? (br->opts.fd_limit - used) / per : 0;
}

int broker_export_fds(struct broker *br, const uint64_t *ids, size_t n, int *fds)
{
	struct backend *be = br->backend;
	size_t i;
	int r;

	for (i = 0; i < n; i++) {
		struct chunk *ch = idmap_get(&br->chunks, ids[i]);

		r = ch ? be->ops->chunk_export(be, ch->handle, &fds[i]) : -ENOENT;
		if (r < 0)
			goto err_close_fds;
	}
	return 0;

err_close_fds:
	while (i > 0)
		close(fds[--i]);
	return r;
}
