/*
 * handlers_ctl.c - requests gmbd sends to clients and their replies:
 * DropRequests (the core wants handles back) and ControlCommands (an
 * operator's pause/resume forwarded to the target client).
 *
 * Each daemon request gets an id from the target session's counter and an
 * entry in its dreqs map until the client's last reply part arrives; a reply
 * to an id not in the map is a protocol error. A control entry outlives the
 * operator's answer (timeout): the target's late reply is then accepted and
 * ignored instead of being taken for a protocol breach.
 *
 * Lifetimes: the forward (struct hfwd) holds a reference to the operator's
 * session, so its timer may fire after the operator left; it completes at
 * the latest when the target disconnects (handlers__dreqs_fail()).
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
#include "daemon/transport/sess.h"

static int handlers_send_drop(struct handlers *h, struct sess *s, const uint64_t *ids, size_t n);
static void handlers_drop_acked(struct handlers *h, struct sess *s, struct hdreq *d, int status,
				const char *error);
static void handlers_dreq_free(struct hdreq *d);
static int handlers_ctl_target(struct hreq *rq, const char *sel, struct bclient **out);
static int handlers_ctl_forward(struct hreq *rq, struct bclient *target);
static void handlers_fwd_done(struct hfwd *f, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void handlers_fwd_answered(struct hfwd *f, const Gmb__Envelope *env);
static void handlers_on_fwd_timer(uv_timer_t *timer);
static void handlers_on_fwd_closed(uv_handle_t *handle);
static const char *handlers_op_verb(int op);
static const char *handlers_tag_text(const char *tag, char *buf, size_t len);

/* ---- drops ---- */

void handlers__send_drops(void *arg, struct bclient *c, const uint64_t *ids, size_t n)
{
	struct sess *s = c->transport;

	/* A doomed client is removed on the next loop turn, which forgets
	 * its holds: nothing is owed to it. */
	if (!s || s->state != SESS_OPEN)
		return;
	for (size_t off = 0; off < n; off += HANDLERS_DROP_BATCH) {
		size_t k = n - off < HANDLERS_DROP_BATCH ? n - off : HANDLERS_DROP_BATCH;

		if (handlers_send_drop(arg, s, ids + off, k) < 0)
			return;
	}
}

static int handlers_send_drop(struct handlers *h, struct sess *s, const uint64_t *ids, size_t n)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__DropRequest dr = GMB__DROP_REQUEST__INIT;
	struct hdreq *d;
	uint64_t id;
	int r = -ENOMEM;

	if (s->dreqs.count >= HANDLERS_MAX_DREQS) {
		sess_doom(s, LOG_LVL_WARNING, "%zu requests of gmbd unanswered", s->dreqs.count);
		return -EBUSY;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		goto err_doom;
	d->ids = malloc(n * sizeof(*d->ids));
	if (!d->ids)
		goto err_free;
	memcpy(d->ids, ids, n * sizeof(*d->ids));
	d->nids = n;
	d->kind = HDREQ_DROP;
	id = ++s->next_req_id;
	r = idmap_put(&s->dreqs, id, d);
	if (r < 0)
		goto err_free;
	env.id = id;
	env.body_case = GMB__ENVELOPE__BODY_DROP;
	env.drop = &dr;
	dr.n_chunk_ids = n;
	dr.chunk_ids = (uint64_t *)ids;
	return sess_send(s, &env);

err_free:
	handlers_dreq_free(d);
err_doom:
	/* The core counts the drop as sent: a client that never gets it would
	 * pin that memory, so it goes (and the memory comes back). */
	sess_doom(s, LOG_LVL_ERR, "out of memory asking it to drop %zu handles", n);
	return r;
}

static void handlers_drop_acked(struct handlers *h, struct sess *s, struct hdreq *d, int status,
				const char *error)
{
	if (status != 0) {
		/* Its handles stay, so the memory is not back: it returns when
		 * the client goes. */
		log_warn("client refused to drop handles " SESS_FMT " chunks=%zu status=%d"
			 " error=\"%s\"", SESS_ARGS(s), d->nids, status, error ? error : "");
		return;
	}
	broker_dropped(h->broker, s->client, d->ids, d->nids);
	handlers__settle(h);
	handlers__changed(h);
}

static void handlers_dreq_free(struct hdreq *d)
{
	if (!d)
		return;
	free(d->ids);
	free(d);
}

void handlers__daemon_reply(struct hreq *rq)
{
	const Gmb__Envelope *env = rq->env;
	struct sess *s = rq->s;
	struct hdreq *d = idmap_get(&s->dreqs, env->reply_to);

	if (!d) {
		sess_protocol_error(s, "a reply to request %" PRIu64 ", which gmbd did not send",
				    env->reply_to);
		return;
	}
	if (env->more)
		return; /* the last part carries the status */
	idmap_del(&s->dreqs, env->reply_to);
	if (d->kind == HDREQ_DROP)
		handlers_drop_acked(rq->h, s, d, env->status, env->error);
	else if (d->fwd)
		handlers_fwd_answered(d->fwd, env);
	else
		log_info("late control reply ignored " SESS_FMT " status=%d", SESS_ARGS(s),
			 env->status);
	handlers_dreq_free(d);
}

void handlers__dreqs_fail(struct handlers *h, struct sess *s)
{
	uint64_t id;
	void *v;

	for (size_t i = 0; idmap_next(&s->dreqs, &i, &id, &v);) {
		struct hdreq *d = v;

		if (d->fwd)
			handlers_fwd_done(d->fwd, -ECONNRESET, "client '%s' disconnected before it"
					  " answered", sess_name(s));
		handlers_dreq_free(d);
	}
	idmap_deinit(&s->dreqs);
	s->dreqs = (struct idmap)IDMAP_INIT;
	s->ctl_in = NULL;
}

/* ---- control forwarding ---- */

int handlers__control(struct hreq *rq)
{
	const Gmb__ControlRequest *m = rq->env->control;
	const char *sel = m->target ? m->target : "";
	const char *tag = m->tag ? m->tag : "";
	struct bclient *target = NULL;
	struct sess *ts;
	int r;

	if (m->op != GMB__OP__OP_PAUSE && m->op != GMB__OP__OP_RESUME)
		return handlers__fail(rq, -EINVAL, "op %d is not pause (1) or resume (2)", m->op);
	if (!sel[0])
		return handlers__fail(rq, -EINVAL, "no target client given");
	if ((r = handlers__check_name(rq, "the target", sel)) < 0 ||
	    (r = handlers__check_name(rq, "the tag", tag)) < 0)
		return r;
	r = handlers_ctl_target(rq, sel, &target);
	if (r < 0)
		return r;
	r = broker_may_control(rq->h->broker, rq->s->client, target, rq->err);
	if (r < 0)
		return r;
	if (!target->control)
		return handlers__fail(rq, -EOPNOTSUPP, "client '%s' registered no control handler",
				      sel);
	ts = target->transport;
	if (ts->ctl_in)
		return handlers__fail(rq, -EBUSY, "client '%s' is still carrying out another"
				      " control request", target->name);
	return handlers_ctl_forward(rq, target);
}

/* broker_client_find() says NULL for none and for several; tell which. */
static int handlers_ctl_target(struct hreq *rq, const char *sel, struct bclient **out)
{
	struct broker *br = rq->h->broker;
	struct bclient *c = broker_client_find(br, sel);
	struct sess *ts = c ? c->transport : NULL;
	int same = 0;

	if (c && ts && ts->state == SESS_OPEN) {
		*out = c;
		return 0;
	}
	for (struct bclient *o = br->clients; o; o = o->next)
		if (!o->tool && strcmp(o->name, sel) == 0)
			same++;
	if (same > 1)
		return handlers__fail(rq, -ENOTUNIQ, "%d clients are named '%s': name one by id"
				      " (#N) or pid", same, sel);
	return handlers__fail(rq, -ENOENT, "no client matches '%s'", sel);
}

static int handlers_ctl_forward(struct hreq *rq, struct bclient *target)
{
	const Gmb__ControlRequest *m = rq->env->control;
	struct sess *ts = target->transport;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlCommand cc = GMB__CONTROL_COMMAND__INIT;
	struct hfwd *f;
	struct hdreq *d;
	uint64_t id = ts->next_req_id + 1;
	char t[WIRE_MAX_NAME + 8];
	int r = -ENOMEM;

	f = calloc(1, sizeof(*f));
	d = calloc(1, sizeof(*d));
	if (!f || !d)
		goto err_free;
	r = idmap_put(&ts->dreqs, id, d);
	if (r < 0)
		goto err_free;
	ts->next_req_id = id;
	*d = (struct hdreq){ .kind = HDREQ_CONTROL, .fwd = f };
	*f = (struct hfwd){ .h = rq->h, .actor = sess_ref(rq->s), .actor_req = rq->env->id,
			    .target = ts, .dreq = d, .op = m->op };
	snprintf(f->tag, sizeof(f->tag), "%s", m->tag ? m->tag : "");
	snprintf(f->target_name, sizeof(f->target_name), "%s", target->name);
	/* Timer init cannot fail; from here the forward is freed on close. */
	uv_timer_init(rq->h->loop, &f->timer);
	f->timer.data = f;
	uv_timer_start(&f->timer, handlers_on_fwd_timer, rq->h->control_timeout_ms, 0);
	ts->ctl_in = f;
	rq->s->inflight++;
	log_info("control forwarded " SESS_FMT " target=%s target_id=%" PRIu64 " op=%s tag=%s",
		 SESS_ARGS(rq->s), target->name, target->id, handlers_op_verb(f->op),
		 handlers_tag_text(f->tag, t, sizeof(t)));
	env.id = id;
	env.body_case = GMB__ENVELOPE__BODY_CONTROL_CMD;
	env.control_cmd = &cc;
	cc.op = (Gmb__Op)m->op;
	cc.tag = f->tag;
	/* A failed send dooms the target; its disconnect answers the actor. */
	sess_send(ts, &env);
	return 0;

err_free:
	free(d);
	free(f);
	return handlers__fail(rq, r, "out of memory forwarding the request");
}

static void handlers_fwd_answered(struct hfwd *f, const Gmb__Envelope *env)
{
	char t[WIRE_MAX_NAME + 8];
	int status = env->status;

	if (status == 0) {
		handlers_fwd_done(f, 0, "%s", "");
		return;
	}
	/* A client's status must be a negative errno; anything else is its bug. */
	if (status > 0)
		status = -EIO;
	handlers_fwd_done(f, status, "client '%s' could not %s %s: %s", f->target_name,
			  handlers_op_verb(f->op), handlers_tag_text(f->tag, t, sizeof(t)),
			  env->error && env->error[0] ? env->error : strerror(-status));
}

static void handlers_on_fwd_timer(uv_timer_t *timer)
{
	struct hfwd *f = timer->data;
	char t[WIRE_MAX_NAME + 8];

	handlers_fwd_done(f, -ETIMEDOUT, "client '%s' did not %s %s within %g s",
			  f->target_name, handlers_op_verb(f->op),
			  handlers_tag_text(f->tag, t, sizeof(t)),
			  (double)f->h->control_timeout_ms / 1000);
}

/* Answers the operator once (if still connected) and lets the forward go;
 * the target's entry stays until it replies or goes. */
static void handlers_fwd_done(struct hfwd *f, int status, const char *fmt, ...)
{
	char msg[ERR_MSG_MAX];
	va_list ap;

	if (f->done)
		return;
	f->done = true;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (f->dreq)
		f->dreq->fwd = NULL;
	f->dreq = NULL;
	if (f->target->ctl_in == f)
		f->target->ctl_in = NULL;
	f->actor->inflight--;
	if (f->actor->state == SESS_OPEN)
		handlers__reply_status(f->actor, f->actor_req, status, msg);
	log_info("control done " SESS_FMT " target=%s op=%s status=%d%s%s%s",
		 SESS_ARGS(f->actor), f->target_name, handlers_op_verb(f->op), status,
		 status ? " error=\"" : "", status ? msg : "", status ? "\"" : "");
	uv_timer_stop(&f->timer);
	uv_close((uv_handle_t *)&f->timer, handlers_on_fwd_closed);
}

static void handlers_on_fwd_closed(uv_handle_t *handle)
{
	struct hfwd *f = handle->data;

	sess_unref(f->actor);
	free(f);
}

static const char *handlers_op_verb(int op)
{
	return op == GMB__OP__OP_PAUSE ? "pause" : "resume";
}

static const char *handlers_tag_text(const char *tag, char *buf, size_t len)
{
	if (tag[0])
		snprintf(buf, len, "tag '%s'", tag);
	else
		snprintf(buf, len, "every tag");
	return buf;
}
