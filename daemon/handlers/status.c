/*
 * status.c - StatusReply: the backend, every device's pool, and
 * every client that is not a tool with its tags, one TagInfo row per (tag,
 * device) that has allocations (device -1 for a tag with none).
 *
 * A node with many clients can outgrow one packet, so the reply may come in
 * parts of at most WIRE_MAX_MSG / 2 bytes: the first carries backend,
 * version and devices, every part carries some clients (the client library
 * concatenates them), and the last has more = false. One client with more
 * tags than a part holds takes several entries (ClientInfo.continued).
 * Imports of memory shared between processes, if any, come in a part of
 * their own (ipc.c builds it), and the named objects, if any, last in
 * another (object_status.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/wait.h"
#include "daemon/core/walk.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"
#include "include/gmb.h"

/* Waiting requests listed (the first ones in serving order). */
#define HSTATUS_MAX_WAITERS 64
/* Bytes of one client entry before its tags go on in another (continued). */
#define HSTATUS_ENTRY_MAX   (WIRE_MAX_MSG / 4)

/* Everything one StatusReply points to, owned here. */
struct hstatus {
	Gmb__DeviceInfo di[BACKEND_MAX_DEVICES];
	Gmb__DeviceInfo *pdi[BACKEND_MAX_DEVICES];
	Gmb__ClientInfo *ci, **pci;
	size_t nclients;
	Gmb__TagInfo *ti, **pti;
	size_t nrows;
	Gmb__WaiterInfo *wi, **pwi;
	size_t nwaiters;
	const struct handlers *h;
	int ndevices;
	uint64_t now;
	/* The walk's place: the entry and row being filled, the client's
	 * first row, and the tag whose allocations are being summed. */
	size_t entry, row, first;
	struct hstatus_tag {
		uint32_t count[BACKEND_MAX_DEVICES];
		uint64_t bytes[BACKEND_MAX_DEVICES];
		size_t rows; /* devices with allocations */
	} tag;
};

static int handlers_status_build(const struct broker *br, struct hstatus *st);
static size_t handlers_status_split(struct hstatus *st, size_t i, size_t first);
static int handlers_status_send(struct hreq *rq, struct hstatus *st, bool last);
static int handlers_status_part(struct hreq *rq, struct hstatus *st, size_t first, size_t n,
				bool head, bool last);
static void handlers_status_free(struct hstatus *st);

int handlers__status(struct hreq *rq)
{
	struct hstatus st = { .h = rq->h,
			      .ndevices = rq->h->broker->ndevices,
			      .now = uv_now(rq->h->loop) };
	struct hipc_rows imports = { 0 };
	struct hobj_rows objects = { 0 };
	int r;

	r = handlers_status_build(rq->h->broker, &st);
	if (r == 0)
		r = handlers__ipc_rows(rq->h->broker, &imports);
	if (r == 0)
		r = handlers__object_rows(rq->h->broker, &objects);
	if (r < 0) {
		r = handlers__fail(rq, r, "out of memory building the status");
		goto out_free;
	}
	/* A failed send dooms the session: nothing more to answer. */
	r = handlers_status_send(rq, &st, imports.total == 0 && objects.total == 0);
	if (r == 0 && imports.total)
		r = handlers__ipc_status_part(rq, &imports, objects.total == 0);
	if (r == 0 && objects.total)
		handlers__object_status_part(rq, &objects);
	r = 0;
out_free:
	handlers__object_rows_free(&objects);
	handlers__ipc_rows_free(&imports);
	handlers_status_free(&st);
	return r;
}

/*
 * A tag an operator's pause or resume was sent for, not answered yet (even
 * after the operator's wait timed out), is "pausing" or "resuming": the
 * client may still carry the command out.
 */
static const char *handlers_status_state(const struct handlers *h, const struct bclient *c,
					 const struct btag *t)
{
	const struct sess *s = handlers__conn_client(h, c);
	struct hdreq *d;
	size_t it = 0;

	while (s && idmap_next(&hconn_of(s)->dreqs, &it, NULL, (void **)&d)) {
		if (d->kind != HDREQ_CONTROL || (d->tag[0] && strcmp(d->tag, t->name)))
			continue;
		if (d->op == GMB__OP__OP_PAUSE && !t->paused)
			return "pausing";
		if (d->op == GMB__OP__OP_RESUME && t->paused)
			return "resuming";
	}
	return t->paused ? "paused" : "active";
}

/* One tag's allocations per device (st->tag), counted as the walk goes. */
static int handlers_status_tag(void *arg, const struct btag *t)
{
	struct hstatus *st = arg;

	(void)t;
	memset(&st->tag, 0, sizeof(st->tag));
	return 0;
}

static int handlers_status_alloc(void *arg, const struct balloc *a)
{
	struct hstatus *st = arg;

	if (a->dev < 0 || a->dev >= st->ndevices)
		return 0;
	if (st->tag.count[a->dev]++ == 0)
		st->tag.rows++;
	st->tag.bytes[a->dev] += a->size;
	return 0;
}

static int handlers_status_count_client(void *arg, const struct bclient *c)
{
	(void)c;
	((struct hstatus *)arg)->nclients++;
	return 0;
}

static int handlers_status_count_tag_end(void *arg, const struct btag *t)
{
	struct hstatus *st = arg;

	(void)t;
	st->nrows += st->tag.rows ? st->tag.rows : 1;
	return 0;
}

/* The waiting requests, in serving order; the first part carries them: a
 * bounded number fits it. */
static int handlers_status_count_waiter(void *arg, const struct bwaiter *w)
{
	struct hstatus *st = arg;

	(void)w;
	return ++st->nwaiters >= HSTATUS_MAX_WAITERS;
}

static int handlers_status_waiter(void *arg, const struct bwaiter *w)
{
	struct hstatus *st = arg;
	Gmb__WaiterInfo *wi = &st->wi[st->nwaiters];
	uint64_t now = st->now;

	gmb__waiter_info__init(wi);
	wi->client_id = w->client->id;
	wi->client = (char *)w->client->name;
	wi->device = w->dev < 0 ? 0 : (uint32_t)w->dev;
	wi->kind = (char *)(w->kind == BROKER_WAIT_ALLOC ? "alloc" : "resume");
	wi->tag = (char *)w->tag;
	wi->bytes = w->need;
	wi->priority = w->client->priority;
	wi->waited_ms = now > w->since ? now - w->since : 0;
	wi->left_ms = w->deadline > now ? w->deadline - now : 0;
	st->pwi[st->nwaiters++] = wi;
	return st->nwaiters >= HSTATUS_MAX_WAITERS;
}

static int handlers_status_waiters(const struct broker *br, struct hstatus *st)
{
	size_t n;

	walk_waiters(br, handlers_status_count_waiter, st);
	n = st->nwaiters;
	st->nwaiters = 0;
	st->wi = calloc(n + 1, sizeof(*st->wi));
	st->pwi = calloc(n + 1, sizeof(*st->pwi));
	if (!st->wi || !st->pwi)
		return -ENOMEM;
	if (n)
		walk_waiters(br, handlers_status_waiter, st);
	return 0;
}

/* A client's entry, its rows from st->ti[st->row]. */
static int handlers_status_client(void *arg, const struct bclient *c)
{
	struct hstatus *st = arg;
	Gmb__ClientInfo *ci = &st->ci[st->entry];

	gmb__client_info__init(ci);
	ci->id = c->id;
	ci->name = (char *)c->name;
	ci->pid = (int32_t)c->pid;
	ci->uid = (uint32_t)c->uid;
	ci->gid = (uint32_t)c->gid;
	ci->control = c->control;
	ci->group = (char *)c->group;
	ci->priority = c->priority;
	ci->preemptible = c->preemptible;
	ci->tags = &st->pti[st->row];
	st->pci[st->entry] = ci;
	st->first = st->row;
	return 0;
}

/* A tag's rows: one a device it has allocations on, device -1 when none. */
static int handlers_status_tag_end(void *arg, const struct btag *t)
{
	struct hstatus *st = arg;
	Gmb__ClientInfo *ci = &st->ci[st->entry];

	for (int d = -1; d < st->ndevices; d++) {
		Gmb__TagInfo *ti = &st->ti[st->row];

		if (d == -1 ? t->nallocs != 0 : st->tag.count[d] == 0)
			continue;
		gmb__tag_info__init(ti);
		ti->name = (char *)t->name;
		ti->device = d;
		ti->state = (char *)handlers_status_state(st->h, t->client, t);
		ti->mode = (Gmb__Mode)t->mode;
		ti->allocations = d < 0 ? 0 : st->tag.count[d];
		ti->bytes = d < 0 ? 0 : st->tag.bytes[d];
		st->pti[st->row++] = ti;
		ci->n_tags++;
	}
	return 0;
}

static int handlers_status_client_end(void *arg, const struct bclient *c)
{
	struct hstatus *st = arg;

	(void)c;
	st->entry = handlers_status_split(st, st->entry, st->first);
	return 0;
}

static int handlers_status_build(const struct broker *br, struct hstatus *st)
{
	static const struct walk_ops count = { .client = handlers_status_count_client,
					       .tag = handlers_status_tag,
					       .alloc = handlers_status_alloc,
					       .tag_end = handlers_status_count_tag_end };
	static const struct walk_ops fill = { .client = handlers_status_client,
					      .tag = handlers_status_tag,
					      .alloc = handlers_status_alloc,
					      .tag_end = handlers_status_tag_end,
					      .client_end = handlers_status_client_end };

	handlers__devices(br, st->di, st->pdi);
	walk_tree(br, &count, st);
	/* A client may take several entries: at most one a row more. */
	st->ci = calloc(st->nclients + st->nrows + 1, sizeof(*st->ci));
	st->pci = calloc(st->nclients + st->nrows + 1, sizeof(*st->pci));
	st->ti = calloc(st->nrows + 1, sizeof(*st->ti));
	st->pti = calloc(st->nrows + 1, sizeof(*st->pti));
	if (!st->ci || !st->pci || !st->ti || !st->pti)
		return -ENOMEM;
	if (handlers_status_waiters(br, st) < 0)
		return -ENOMEM;
	walk_tree(br, &fill, st);
	st->nclients = st->entry;
	return 0;
}

/*
 * Entry @i (a client, its rows from @first) split where its tags would
 * outgrow HSTATUS_ENTRY_MAX: each entry after the first has continued =
 * true, the client's id and the next tags. Returns the next free entry.
 */
static size_t handlers_status_split(struct hstatus *st, size_t i, size_t first)
{
	Gmb__ClientInfo *ci = &st->ci[i];
	size_t n = ci->n_tags, bytes, start = 0, next = i + 1;

	ci->n_tags = 0;
	bytes = gmb__client_info__get_packed_size(ci);
	for (size_t k = 0; k < n; k++) {
		size_t sz = gmb__tag_info__get_packed_size(st->pti[first + k]) + 4;

		if (k > start && bytes + sz > HSTATUS_ENTRY_MAX) {
			Gmb__ClientInfo *more = &st->ci[next];

			gmb__client_info__init(more);
			more->id = ci->id;
			more->continued = true;
			more->tags = &st->pti[first + k];
			st->pci[next] = more;
			ci = more;
			next++;
			start = k;
			bytes = 32;
		}
		ci->n_tags++;
		bytes += sz;
	}
	return next;
}

/* The parts of @st; the last one says more = false when @last. */
static int handlers_status_send(struct hreq *rq, struct hstatus *st, bool last)
{
	/* The first part also carries backend, version and the devices. */
	size_t base = 64 + (size_t)rq->h->broker->ndevices * 128 +
		      st->nwaiters * (64 + 2 * WIRE_MAX_NAME);
	size_t first = 0, bytes = base;
	bool head = true;
	int r;

	for (size_t i = 0; i < st->nclients; i++) {
		size_t sz = gmb__client_info__get_packed_size(&st->ci[i]) + 16;

		if (i > first && bytes + sz > WIRE_MAX_MSG / 2) {
			r = handlers_status_part(rq, st, first, i - first, head, false);
			if (r < 0)
				return r;
			head = false;
			first = i;
			bytes = 64;
		}
		bytes += sz;
	}
	return handlers_status_part(rq, st, first, st->nclients - first, head, last);
}

static int handlers_status_part(struct hreq *rq, struct hstatus *st, size_t first, size_t n,
				bool head, bool last)
{
	const struct broker *br = rq->h->broker;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusReply sr = GMB__STATUS_REPLY__INIT;

	if (head) {
		sr.backend = (char *)br->backend->ops->name;
		sr.version = (char *)GMB_VERSION;
		sr.n_devices = (size_t)br->ndevices;
		sr.devices = st->pdi;
		sr.n_waiters = st->nwaiters;
		sr.waiters = st->pwi;
	}
	sr.n_clients = n;
	sr.clients = st->pci + first;
	env.reply_to = rq->env->id;
	env.more = !last;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REPLY;
	env.status_reply = &sr;
	return sess_send(rq->s, &env);
}

static void handlers_status_free(struct hstatus *st)
{
	free(st->pwi);
	free(st->wi);
	free(st->pti);
	free(st->ti);
	free(st->pci);
	free(st->ci);
}
