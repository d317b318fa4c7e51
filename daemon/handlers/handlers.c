/*
 * handlers.c - dispatch of client requests and the memory requests (hello,
 * alloc, free, tag mode, pause, resume, trim), their replies, and parked
 * requests. Control forwarding and drops live in handlers_ctl.c, status in
 * handlers_status.c.
 *
 * Every envelope passes handlers_dispatch(), which checks what the protocol
 * requires of it (an id, hello first, a body a client may send), runs the
 * handler of its body case from handlers_table, and frees it on its one
 * exit path unless a parked request took it.
 *
 * Replies that lend memory (AllocReply, ResumeReply) go out in parts: first
 * the chunk fds, at most WIRE_MAX_FDS per part (more = true, no body), then
 * the lends in parts of at most WIRE_MAX_MSG / 2 bytes; the last part has
 * more = false and status 0.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/handlers.h"
#include "daemon/service/opts.h"
#include "daemon/transport/sess.h"
#include "include/gmb.h"

/* Handler flags. */
#define H_SETTLE 0x1    /* may free memory or queue drops: settle afterwards */
#define H_INFLIGHT 0x2  /* may be parked or forwarded: counts in flight */
#define H_STATE 0x4     /* may change the broker's record */

/* A request waiting for memory that clients are dropping. */
struct hpark {
	struct sess *s;              /* reference held */
	Gmb__Envelope *env;          /* owned */
	uint64_t deadline;           /* uv_now() milliseconds */
	char why[ERR_MSG_MAX];       /* the core's latest -EAGAIN sentence */
	struct hpark *prev, *next;
};

struct handler {
	const char *name;
	handlers_fn fn;              /* NULL: not a body a client may send */
	unsigned flags;
};

static int handlers_alloc(struct hreq *rq);
static int handlers_free(struct hreq *rq);
static int handlers_tag_mode(struct hreq *rq);
static int handlers_pause(struct hreq *rq);
static int handlers_resume(struct hreq *rq);
static int handlers_trim(struct hreq *rq);
static const struct handler *handlers_lookup(int body_case);
static int handlers_check(struct hreq *rq, const struct handler *hd);
static bool handlers_utf8_ok(const char *s);
static int handlers_send_result(struct hreq *rq, const struct broker_result *res, bool resume);
static int handlers_send_fds(struct sess *s, uint64_t reply_to, const struct broker_result *res);
static int handlers_send_lends(struct sess *s, uint64_t reply_to, Gmb__Lend *lends, size_t n,
			       bool resume);
static int handlers_send_lend_part(struct sess *s, uint64_t reply_to, Gmb__Lend **lends,
				   size_t n, bool resume, bool last);
static void handlers_tag_usage(const struct bclient *c, const char *tag, uint64_t *bytes,
			       uint64_t *chunks);
static int handlers_park(struct hreq *rq);
static void handlers_unpark(struct handlers *h, struct hpark *p);
static void handlers_park_arm(struct handlers *h);
static void handlers_on_park_timer(uv_timer_t *timer);
static void handlers_retry_parked(struct handlers *h);

static const struct handler handlers_table[] = {
	[GMB__ENVELOPE__BODY__NOT_SET] = { "none", NULL, 0 },
	[GMB__ENVELOPE__BODY_HELLO] = { "hello", handlers__hello, H_STATE },
	[GMB__ENVELOPE__BODY_HELLO_REPLY] = { "hello_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_ALLOC] = { "alloc", handlers_alloc, H_SETTLE | H_INFLIGHT | H_STATE },
	[GMB__ENVELOPE__BODY_ALLOC_REPLY] = { "alloc_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_FREE] = { "free", handlers_free, H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_TAG_MODE] = { "tag_mode", handlers_tag_mode, H_STATE },
	[GMB__ENVELOPE__BODY_PAUSE] = { "pause", handlers_pause, H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_PAUSE_REPLY] = { "pause_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_RESUME] = { "resume", handlers_resume,
					 H_SETTLE | H_INFLIGHT | H_STATE },
	[GMB__ENVELOPE__BODY_RESUME_REPLY] = { "resume_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_STATUS_REQ] = { "status", handlers__status, 0 },
	[GMB__ENVELOPE__BODY_STATUS_REPLY] = { "status_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_CONTROL] = { "control", handlers__control, H_INFLIGHT },
	[GMB__ENVELOPE__BODY_CONTROL_CMD] = { "control_cmd", NULL, 0 },
	[GMB__ENVELOPE__BODY_DROP] = { "drop", NULL, 0 },
	[GMB__ENVELOPE__BODY_TRIM] = { "trim", handlers_trim, H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_TRIM_REPLY] = { "trim_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_REJOIN] = { "rejoin", handlers__rejoin, H_SETTLE },
	[GMB__ENVELOPE__BODY_REJOIN_REPLY] = { "rejoin_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_BYE] = { "bye", NULL, 0 },
};

#define HANDLERS_N (sizeof(handlers_table) / sizeof(handlers_table[0]))

int handlers_init(struct handlers *h, uv_loop_t *loop, struct broker *br,
		  uint64_t control_timeout_ms)
{
	int r;

	*h = (struct handlers){ .loop = loop, .broker = br,
				.control_timeout_ms = control_timeout_ms,
				.park_timeout_ms = HANDLERS_PARK_TIMEOUT_MS };
	r = uv_timer_init(loop, &h->park_timer);
	if (r < 0)
		return r;
	h->park_timer.data = h;
	/* Cannot fail once the first one did not. */
	uv_timer_init(loop, &h->orphan_timer);
	h->orphan_timer.data = h;
	return 0;
}

void handlers_close(struct handlers *h)
{
	if (h->closed)
		return;
	h->closed = true;
	uv_close((uv_handle_t *)&h->park_timer, NULL);
	uv_close((uv_handle_t *)&h->orphan_timer, NULL);
}

const char *handlers_body_name(int body_case)
{
	const struct handler *hd = handlers_lookup(body_case);

	return hd ? hd->name : "unknown";
}

static const struct handler *handlers_lookup(int body_case)
{
	if (body_case < 0 || (size_t)body_case >= HANDLERS_N || !handlers_table[body_case].name)
		return NULL;
	return &handlers_table[body_case];
}

int handlers__fail(struct hreq *rq, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rq->err, sizeof(rq->err), fmt, ap);
	va_end(ap);
	return rc;
}

void handlers__reply_status(struct sess *s, uint64_t reply_to, int status, const char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.reply_to = reply_to;
	env.status = status;
	if (status < 0)
		env.error = (char *)(err && *err ? err : strerror(-status));
	sess_send(s, &env);
}

void handlers_dispatch(struct handlers *h, struct sess *s, Gmb__Envelope *env)
{
	struct hreq rq = { .h = h, .s = s, .env = env };
	const struct handler *hd = handlers_lookup(env->body_case);
	int r;

	if (env->reply_to) {
		handlers__daemon_reply(&rq);
		goto out_free;
	}
	if (handlers_check(&rq, hd) < 0)
		goto out_free;
	if ((hd->flags & H_INFLIGHT) && s->inflight >= WIRE_MAX_INFLIGHT) {
		handlers__fail(&rq, -EAGAIN, "client '%s' has %u requests in flight, the limit",
			       sess_name(s), s->inflight);
		handlers__reply_status(s, env->id, -EAGAIN, rq.err);
		goto out_free;
	}
	r = hd->fn(&rq);
	if (r == HANDLERS_KEPT)
		env = NULL; /* the handler's now (or freed already) */
	if (r == HANDLERS_PARK) {
		r = handlers_park(&rq);
		if (r == 0)
			env = NULL; /* the parked request owns it now */
	}
	if (r < 0)
		handlers__reply_status(s, rq.env->id, r, rq.err);
	if (hd->flags & H_SETTLE)
		handlers__settle(h);
	if (hd->flags & H_STATE)
		handlers__changed(h);
out_free:
	if (env)
		gmb__envelope__free_unpacked(env, NULL);
}

/* What the protocol requires of a request; a breach dooms the session. */
static int handlers_check(struct hreq *rq, const struct handler *hd)
{
	struct sess *s = rq->s;
	const char *name = hd ? hd->name : "unknown";

	if (rq->env->id == 0) {
		sess_protocol_error(s, "a %s request without an id", name);
		return -EPROTO;
	}
	if (!hd || !hd->fn) {
		sess_protocol_error(s, "a client may not send a %s message", name);
		return -EPROTO;
	}
	if (s->rejoin && rq->env->body_case != GMB__ENVELOPE__BODY_REJOIN) {
		sess_protocol_error(s, "a %s before the rejoin claim is complete", name);
		return -EPROTO;
	}
	if (!s->rejoin && rq->env->body_case == GMB__ENVELOPE__BODY_REJOIN) {
		sess_protocol_error(s, "a rejoin claim without a rejoin hello");
		return -EPROTO;
	}
	if (!s->client && !s->rejoin && rq->env->body_case != GMB__ENVELOPE__BODY_HELLO) {
		sess_protocol_error(s, "the first request must be hello, not %s", name);
		return -EPROTO;
	}
	if ((s->client || s->rejoin) && rq->env->body_case == GMB__ENVELOPE__BODY_HELLO) {
		sess_protocol_error(s, "a second hello");
		return -EPROTO;
	}
	return 0;
}

int handlers__check_name(struct hreq *rq, const char *what, const char *name)
{
	if (strnlen(name, WIRE_MAX_NAME + 1) > WIRE_MAX_NAME)
		return handlers__fail(rq, -EINVAL, "%s is longer than %d bytes", what,
				      WIRE_MAX_NAME);
	if (!handlers_utf8_ok(name))
		return handlers__fail(rq, -EINVAL, "%s is not UTF-8 text without control characters",
				      what);
	return 0;
}

/* Well-formed UTF-8 (no overlong forms, surrogates or values past
 * U+10FFFF) without C0/C1 control characters: names end up in logs. */
static bool handlers_utf8_ok(const char *str)
{
	const unsigned char *p = (const unsigned char *)str;

	while (*p) {
		unsigned cp, n;

		if (*p < 0x80) {
			if (*p < 0x20 || *p == 0x7f)
				return false;
			p++;
			continue;
		}
		if (*p >= 0xc2 && *p <= 0xdf)
			n = 1, cp = *p & 0x1f;
		else if (*p >= 0xe0 && *p <= 0xef)
			n = 2, cp = *p & 0x0f;
		else if (*p >= 0xf0 && *p <= 0xf4)
			n = 3, cp = *p & 0x07;
		else
			return false;
		for (unsigned i = 1; i <= n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f))
			return false;
		p += n + 1;
	}
	return true;
}

void handlers__devices(const struct broker *br, Gmb__DeviceInfo *di, Gmb__DeviceInfo **pdi)
{
	for (int d = 0; d < br->ndevices; d++) {
		const struct pool *p = &br->pools[d];

		gmb__device_info__init(&di[d]);
		di[d].index = (uint32_t)d;
		di[d].name = (char *)br->backend->devices[d].name;
		di[d].uuid.data = (uint8_t *)br->backend->devices[d].uuid;
		di[d].uuid.len = sizeof(br->backend->devices[d].uuid);
		di[d].total_bytes = p->total;
		di[d].budget_bytes = p->budget;
		di[d].granularity = p->granularity;
		di[d].pool_bytes = p->held_bytes;
		di[d].used_bytes = p->lent_bytes;
		di[d].free_bytes = p->free_bytes;
		pdi[d] = &di[d];
	}
}

static int handlers_alloc(struct hreq *rq)
{
	const Gmb__AllocRequest *m = rq->env->alloc;
	struct broker *br = rq->h->broker;
	const char *tag = m->tag ? m->tag : "";
	struct broker_result res = BROKER_RESULT_INIT;
	int r;

	r = handlers__check_name(rq, "the tag", tag);
	if (r < 0)
		return r;
	/* The core takes an int: a huge uint32 must not wrap to a valid one. */
	if (m->device >= (uint32_t)br->ndevices)
		return handlers__fail(rq, -ENODEV, "device %u does not exist (%d devices)",
				      m->device, br->ndevices);
	r = broker_alloc(br, rq->s->client, (int)m->device, m->size, tag, &res, rq->err);
	if (r == -EAGAIN)
		return HANDLERS_PARK;
	if (r < 0)
		return r;
	handlers_send_result(rq, &res, false);
	broker_result_deinit(&res);
	return 0;
}

static int handlers_free(struct hreq *rq)
{
	int r = broker_free_alloc(rq->h->broker, rq->s->client, rq->env->free->alloc_id, rq->err);

	if (r < 0)
		return r;
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

static int handlers_tag_mode(struct hreq *rq)
{
	const Gmb__TagModeRequest *m = rq->env->tag_mode;
	const char *tag = m->tag ? m->tag : "";
	int r;

	r = handlers__check_name(rq, "the tag", tag);
	if (r < 0)
		return r;
	r = broker_set_mode(rq->h->broker, rq->s->client, tag, (int)m->mode, rq->err);
	if (r < 0)
		return r;
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

/* Bytes and chunks lent to @c's active allocations in @tag ("": all). */
static void handlers_tag_usage(const struct bclient *c, const char *tag, uint64_t *bytes,
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

static int handlers_pause(struct hreq *rq)
{
	const char *tag = rq->env->pause->tag ? rq->env->pause->tag : "";
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PauseReply pr = GMB__PAUSE_REPLY__INIT;
	uint64_t bytes, chunks;
	char b[24];
	int r;

	r = handlers__check_name(rq, "the tag", tag);
	if (r < 0)
		return r;
	handlers_tag_usage(rq->s->client, tag, &bytes, &chunks);
	r = broker_pause(rq->h->broker, rq->s->client, tag, rq->err);
	if (r < 0)
		return r;
	if (chunks)
		log_info("tag paused " SESS_FMT " tag=%s bytes=%s chunks=%" PRIu64,
			 SESS_ARGS(rq->s), tag[0] ? tag : "*", opts_size_format(bytes, b, sizeof(b)),
			 chunks);
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_PAUSE_REPLY;
	env.pause_reply = &pr;
	sess_send(rq->s, &env);
	return 0;
}

static int handlers_resume(struct hreq *rq)
{
	const char *tag = rq->env->resume->tag ? rq->env->resume->tag : "";
	struct broker_result res = BROKER_RESULT_INIT;
	uint64_t bytes = 0, chunks = 0;
	char b[24];
	int r;

	r = handlers__check_name(rq, "the tag", tag);
	if (r < 0)
		return r;
	r = broker_resume(rq->h->broker, rq->s->client, tag, &res, rq->err);
	if (r == -EAGAIN)
		return HANDLERS_PARK;
	if (r < 0)
		return r;
	for (size_t i = 0; i < res.nallocs; i++) {
		bytes += res.allocs[i]->size;
		chunks += res.allocs[i]->nchunks;
	}
	if (res.nallocs)
		log_info("tag resumed " SESS_FMT " tag=%s bytes=%s chunks=%" PRIu64 " fds=%zu",
			 SESS_ARGS(rq->s), tag[0] ? tag : "*", opts_size_format(bytes, b, sizeof(b)),
			 chunks, res.nsend);
	handlers_send_result(rq, &res, true);
	broker_result_deinit(&res);
	return 0;
}

static int handlers_trim(struct hreq *rq)
{
	const Gmb__TrimRequest *m = rq->env->trim;
	struct broker *br = rq->h->broker;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__TrimReply tr = GMB__TRIM_REPLY__INIT;
	char b1[24], b2[24];
	int r;

	r = broker_may_control(br, rq->s->client, NULL, rq->err);
	if (r < 0)
		return r;
	r = broker_trim(br, m->device, &tr.released_bytes, &tr.pending_bytes, rq->err);
	if (r < 0)
		return r;
	log_info("pools trimmed " SESS_FMT " device=%d released=%s pending=%s", SESS_ARGS(rq->s),
		 m->device, opts_size_format(tr.released_bytes, b1, sizeof(b1)),
		 opts_size_format(tr.pending_bytes, b2, sizeof(b2)));
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_TRIM_REPLY;
	env.trim_reply = &tr;
	sess_send(rq->s, &env);
	return 0;
}

/* ---- replies that lend memory ---- */

/*
 * The core already lent @res: a reply we cannot build would leave the
 * client without memory the broker counts as its own, so an encoding
 * failure disconnects it (and the memory comes back).
 */
static int handlers_send_result(struct hreq *rq, const struct broker_result *res, bool resume)
{
	Gmb__Lend *lends = NULL;
	uint64_t *vals = NULL;
	size_t total = 0, off = 0;
	int r;

	r = handlers_send_fds(rq->s, rq->env->id, res);
	if (r < 0)
		return r;
	for (size_t i = 0; i < res->nallocs; i++)
		total += res->allocs[i]->nchunks;
	lends = calloc(res->nallocs ? res->nallocs : 1, sizeof(*lends));
	vals = malloc(2 * (total ? total : 1) * sizeof(*vals));
	if (!lends || !vals) {
		r = -ENOMEM;
		sess_doom(rq->s, LOG_LVL_ERR, "out of memory encoding a %s reply",
			  resume ? "resume" : "alloc");
		goto out_free;
	}
	for (size_t i = 0; i < res->nallocs; i++) {
		const struct balloc *a = res->allocs[i];
		Gmb__Lend *l = &lends[i];

		gmb__lend__init(l);
		l->alloc_id = a->id;
		l->device = (uint32_t)a->dev;
		l->size = a->size;
		l->n_chunk_ids = l->n_chunk_sizes = a->nchunks;
		l->chunk_ids = vals + off;
		l->chunk_sizes = vals + total + off;
		for (uint32_t j = 0; j < a->nchunks; j++) {
			l->chunk_ids[j] = a->chunks[j] ? a->chunks[j]->id : 0;
			l->chunk_sizes[j] = a->chunks[j] ? a->chunks[j]->size : 0;
		}
		off += a->nchunks;
	}
	r = handlers_send_lends(rq->s, rq->env->id, lends, res->nallocs, resume);
out_free:
	free(vals);
	free(lends);
	return r;
}

/* The fds of the chunks the client holds no handle to, WIRE_MAX_FDS a part. */
static int handlers_send_fds(struct sess *s, uint64_t reply_to, const struct broker_result *res)
{
	uint64_t ids[WIRE_MAX_FDS], sizes[WIRE_MAX_FDS];

	for (size_t off = 0; off < res->nsend;) {
		Gmb__Envelope env = GMB__ENVELOPE__INIT;
		size_t n = res->nsend - off < WIRE_MAX_FDS ? res->nsend - off : WIRE_MAX_FDS;
		int r;

		for (size_t i = 0; i < n; i++) {
			ids[i] = res->send[off + i]->id;
			sizes[i] = res->send[off + i]->size;
		}
		env.reply_to = reply_to;
		env.more = true;
		env.n_fd_chunks = env.n_fd_sizes = n;
		env.fd_chunks = ids;
		env.fd_sizes = sizes;
		r = sess_send(s, &env);
		if (r < 0)
			return r;
		off += n;
	}
	return 0;
}

/* Lends in parts of at most WIRE_MAX_MSG / 2 bytes; a lend bigger than
 * that goes alone (sess_send() refuses one over WIRE_MAX_MSG). */
static int handlers_send_lends(struct sess *s, uint64_t reply_to, Gmb__Lend *lends, size_t n,
			       bool resume)
{
	/* Envelope fields around the lends: reply_to, status, more, tags. */
	const size_t base = 64;
	Gmb__Lend **ptrs;
	size_t first = 0, bytes = base;
	int r = 0;

	ptrs = malloc((n ? n : 1) * sizeof(*ptrs));
	if (!ptrs) {
		sess_doom(s, LOG_LVL_ERR, "out of memory encoding a reply");
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		size_t sz = gmb__lend__get_packed_size(&lends[i]) + 16;

		ptrs[i] = &lends[i];
		if (i > first && bytes + sz > WIRE_MAX_MSG / 2) {
			r = handlers_send_lend_part(s, reply_to, ptrs + first, i - first, resume,
						    false);
			if (r < 0)
				goto out_free;
			first = i;
			bytes = base;
		}
		bytes += sz;
	}
	r = handlers_send_lend_part(s, reply_to, ptrs + first, n - first, resume, true);
out_free:
	free(ptrs);
	return r;
}

static int handlers_send_lend_part(struct sess *s, uint64_t reply_to, Gmb__Lend **lends,
				   size_t n, bool resume, bool last)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__AllocReply ar = GMB__ALLOC_REPLY__INIT;
	Gmb__ResumeReply rr = GMB__RESUME_REPLY__INIT;

	env.reply_to = reply_to;
	env.more = !last;
	if (resume) {
		rr.n_lends = n;
		rr.lends = lends;
		env.body_case = GMB__ENVELOPE__BODY_RESUME_REPLY;
		env.resume_reply = &rr;
	} else {
		ar.lend = n ? lends[0] : NULL;
		env.body_case = GMB__ENVELOPE__BODY_ALLOC_REPLY;
		env.alloc_reply = &ar;
	}
	return sess_send(s, &env);
}

/* ---- parked requests ---- */

static int handlers_park(struct hreq *rq)
{
	struct handlers *h = rq->h;
	struct hpark *p;

	p = calloc(1, sizeof(*p));
	if (!p)
		return handlers__fail(rq, -ENOMEM, "%s; out of memory waiting for it", rq->err);
	p->s = sess_ref(rq->s);
	p->env = rq->env;
	p->deadline = uv_now(h->loop) + h->park_timeout_ms;
	memcpy(p->why, rq->err, sizeof(p->why));
	p->prev = h->parked_tail;
	if (h->parked_tail)
		h->parked_tail->next = p;
	else
		h->parked = p;
	h->parked_tail = p;
	rq->s->inflight++;
	log_debug("request parked " SESS_FMT " req=%" PRIu64 " why=\"%s\"", SESS_ARGS(rq->s),
		  rq->env->id, rq->err);
	handlers_park_arm(h);
	return 0;
}

static void handlers_unpark(struct handlers *h, struct hpark *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		h->parked = p->next;
	if (p->next)
		p->next->prev = p->prev;
	else
		h->parked_tail = p->prev;
	p->s->inflight--;
	gmb__envelope__free_unpacked(p->env, NULL);
	sess_unref(p->s);
	free(p);
}

/* Deadlines come in arrival order: the first one is the earliest. */
static void handlers_park_arm(struct handlers *h)
{
	uint64_t now = uv_now(h->loop);

	if (h->closed)
		return;
	if (!h->parked) {
		uv_timer_stop(&h->park_timer);
		return;
	}
	uv_timer_start(&h->park_timer, handlers_on_park_timer,
		       h->parked->deadline > now ? h->parked->deadline - now : 0, 0);
}

static void handlers_on_park_timer(uv_timer_t *timer)
{
	struct handlers *h = timer->data;
	uint64_t now = uv_now(h->loop);

	while (h->parked && h->parked->deadline <= now) {
		struct hpark *p = h->parked;
		char msg[ERR_MSG_MAX];

		snprintf(msg, sizeof(msg), "%.400s; still waiting after %" PRIu64 " ms", p->why,
			 h->park_timeout_ms);
		handlers__reply_status(p->s, p->env->id, -ENOMEM, msg);
		handlers_unpark(h, p);
	}
	handlers_park_arm(h);
}

/* In arrival order; a request still short of memory keeps its place. */
static void handlers_retry_parked(struct handlers *h)
{
	struct hpark *p, *next;

	for (p = h->parked; p; p = next) {
		struct hreq rq = { .h = h, .s = p->s, .env = p->env };
		int r;

		/* Only this function, the park timer and handlers_sess_gone()
		 * unpark, so @next survives the handler. */
		next = p->next;
		if (p->s->state != SESS_OPEN)
			continue;
		r = handlers_lookup(p->env->body_case)->fn(&rq);
		if (r == HANDLERS_PARK) {
			memcpy(p->why, rq.err, sizeof(p->why));
			continue;
		}
		if (r < 0)
			handlers__reply_status(p->s, p->env->id, r, rq.err);
		handlers_unpark(h, p);
	}
	handlers_park_arm(h);
}

void handlers__settle(struct handlers *h)
{
	broker_flush_drops(h->broker, handlers__send_drops, h);
	if (h->retrying || !h->parked)
		return;
	h->retrying = true;
	handlers_retry_parked(h);
	h->retrying = false;
	broker_flush_drops(h->broker, handlers__send_drops, h);
	handlers__changed(h);
}

/* ---- fds and sessions ---- */

int handlers_export_fds(struct handlers *h, const uint64_t *ids, size_t n, int *fds)
{
	struct backend *be = h->broker->backend;
	size_t i;
	int r;

	for (i = 0; i < n; i++) {
		struct chunk *ch = idmap_get(&h->broker->chunks, ids[i]);

		r = ch ? be->ops->chunk_export(be, ch->handle, &fds[i]) : -ENOENT;
		if (r < 0)
			goto err_close_fds;
	}
	return 0;

err_close_fds:
	wire_close_fds(fds, (int)i);
	return r;
}

void handlers_sess_gone(struct handlers *h, struct sess *s)
{
	struct hpark *p, *next;
	uint64_t bytes = 0, chunks = 0;
	char b[24];

	for (p = h->parked; p; p = next) {
		next = p->next;
		if (p->s == s)
			handlers_unpark(h, p);
	}
	handlers_park_arm(h);
	handlers__dreqs_fail(h, s);
	handlers__rejoin_gone(h, s);
	if (!s->client) {
		log_debug("connection closed pid=%d uid=%u", (int)s->pid, (unsigned)s->uid);
		return;
	}
	handlers_tag_usage(s->client, "", &bytes, &chunks);
	if (h->handover)
		log_debug("client left for the next gmbd " SESS_FMT, SESS_ARGS(s));
	else
		log_at(s->client->tool ? LOG_LVL_DEBUG : LOG_LVL_INFO, "client disconnected "
		       SESS_FMT " returned=%s chunks=%" PRIu64, SESS_ARGS(s),
		       opts_size_format(bytes, b, sizeof(b)), chunks);
	broker_client_remove(h->broker, s->client);
	s->client = NULL;
	handlers__settle(h);
	handlers__changed(h);
}
