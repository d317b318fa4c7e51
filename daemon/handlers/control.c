/*
 * control.c - an operator's pause/resume (ControlRequest) forwarded to the
 * target client as a ControlCommand, a daemon request (drops.c keeps their
 * table), and the operator's answer when the target replies, times out or
 * goes.
 *
 * A control entry outlives the operator's answer (timeout): the target's
 * late reply is then accepted and ignored instead of being taken for a
 * protocol breach.
 *
 * Lifetimes: the forward (struct hfwd) holds a reference to the operator's
 * session, so its timer may fire after the operator left; it completes at
 * the latest when the target disconnects (handlers__dreqs_fail()).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

static int handlers_ctl_target(struct hreq *rq, const char *sel, struct bclient **out);
static int handlers_ctl_forward(struct hreq *rq, struct bclient *target);
static void handlers_fwd_done(struct hfwd *f, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void handlers_on_fwd_timer(uv_timer_t *timer);
static void handlers_on_fwd_closed(uv_handle_t *handle);
static const char *handlers_op_verb(int op);
static const char *handlers_tag_text(const char *tag, char *buf, size_t len);

void handlers__dreqs_fail(struct handlers *h, struct sess *s)
{
	struct hconn *hc = hconn_of(s);
	uint64_t id;
	void *v;

	for (size_t i = 0; idmap_next(&hc->dreqs, &i, &id, &v);) {
		struct hdreq *d = v;

		if (d->fwd)
			handlers_fwd_done(d->fwd, -ECONNRESET,
					  "client '%s' disconnected before it"
					  " answered",
					  sess_name(s));
		if (d->kind == HDREQ_SWITCH)
			handlers__switch_lane_lost(h, d, sess_name(s));
		handlers__dreq_free(d);
	}
	idmap_deinit(&hc->dreqs);
	hc->dreqs = (struct idmap)IDMAP_INIT;
	hc->ctl_in = NULL;
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
	r = broker_may_control(rq->h->broker, hconn_of(rq->s)->client, target, rq->err);
	if (r < 0)
		return r;
	if (!target->control)
		return handlers__fail(rq, -EOPNOTSUPP,
				      "client '%s' has no control handler, so it"
				      " cannot be paused or resumed from outside: the program must"
				      " install one (gmb_set_control_handler) or run with"
				      " GMB_CONTROL=accept",
				      target->name);
	ts = handlers__conn_client(rq->h, target);
	if (hconn_of(ts)->ctl_in)
		return handlers__fail(rq, -EBUSY,
				      "client '%s' is still carrying out another"
				      " control request",
				      target->name);
	return handlers_ctl_forward(rq, target);
}

/* The one client @sel names, with a session that can take the command. */
static int handlers_ctl_target(struct hreq *rq, const char *sel, struct bclient **out)
{
	struct broker_found f;
	struct bclient *c = broker_client_find(rq->h->broker, sel, &f);
	struct sess *ts = c ? handlers__conn_client(rq->h, c) : NULL;

	if (!c)
		return broker_found_err(&f, sel, false, rq->err);
	if (!ts || ts->state != SESS_OPEN)
		return handlers__fail(rq, -ENOENT,
				      "client '%s' (#%" PRIu64 ") is not connected now; it may"
				      " be reconnecting to gmbd",
				      c->name, c->id);
	*out = c;
	return 0;
}

static int handlers_ctl_forward(struct hreq *rq, struct bclient *target)
{
	const Gmb__ControlRequest *m = rq->env->control;
	struct sess *ts = handlers__conn_client(rq->h, target);
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlCommand cc = GMB__CONTROL_COMMAND__INIT;
	struct hfwd *f;
	struct hdreq *d;
	uint64_t id;
	char q[LOG_QUOTE_MAX], qt[LOG_QUOTE_MAX];
	int r = -ENOMEM;

	f = calloc(1, sizeof(*f));
	d = calloc(1, sizeof(*d));
	if (!f || !d)
		goto err_free;
	r = handlers__dreq_add(ts, d, &id);
	if (r < 0)
		goto err_free;
	/* What status shows as "pausing"/"resuming" until the target answers. */
	*d = (struct hdreq){
		.kind = HDREQ_CONTROL, .fwd = f, .op = m->op, .tag = strdup(m->tag ? m->tag : "")
	};
	if (!d->tag) {
		idmap_del(&hconn_of(ts)->dreqs, id);
		r = -ENOMEM;
		goto err_free;
	}
	*f = (struct hfwd){ .h = rq->h,
			    .actor = sess_ref(rq->s),
			    .actor_req = rq->env->id,
			    .target = ts,
			    .dreq = d,
			    .op = m->op,
			    .start_ns = rq->start_ns };
	snprintf(f->tag, sizeof(f->tag), "%s", m->tag ? m->tag : "");
	snprintf(f->target_name, sizeof(f->target_name), "%s", target->name);
	/* Timer init cannot fail; from here the forward is freed on close. */
	uv_timer_init(rq->h->loop, &f->timer);
	f->timer.data = f;
	/* A resume that may wait for memory gets that long on top. */
	uv_timer_start(&f->timer, handlers_on_fwd_timer,
		       rq->h->control_timeout_ms + (m->op == GMB__OP__OP_RESUME ? m->wait_ms : 0),
		       0);
	hconn_of(ts)->ctl_in = f;
	hconn_of(rq->s)->inflight++;
	log_info("control forwarded " SESS_FMT " target=%s target_id=%" PRIu64 " op=%s tag=%s",
		 SESS_ARGS(rq->s), log_quote(target->name, qt, sizeof(qt)), target->id,
		 handlers_op_verb(f->op), handlers__tag_log(f->tag, q));
	env.id = id;
	env.body_case = GMB__ENVELOPE__BODY_CONTROL_CMD;
	env.control_cmd = &cc;
	cc.op = (Gmb__Op)m->op;
	cc.tag = f->tag;
	cc.wait_ms = m->op == GMB__OP__OP_RESUME ? m->wait_ms : 0;
	/* A failed send dooms the target; its disconnect answers the actor. */
	sess_send(ts, &env);
	return 0;

err_free:
	free(d);
	free(f);
	return handlers__fail(rq, r, "out of memory forwarding the request");
}

void handlers__fwd_answered(struct hdreq *d, const Gmb__Envelope *env, struct sess *s)
{
	struct hfwd *f = d->fwd;
	char t[WIRE_MAX_NAME + 8];
	int status = env->status;

	if (!f) {
		log_info("late control reply ignored " SESS_FMT " status=%d", SESS_ARGS(s),
			 env->status);
		return;
	}

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

	/* The command cannot be taken back: say that it may still be carried out. */
	handlers_fwd_done(f, -ETIMEDOUT,
			  "client '%s' did not %s %s within %g s; it has the"
			  " command and may still carry it out (gmbctl status shows \"%s\" until"
			  " it answers)",
			  f->target_name, handlers_op_verb(f->op),
			  handlers_tag_text(f->tag, t, sizeof(t)),
			  (double)f->h->control_timeout_ms / 1000,
			  f->op == GMB__OP__OP_PAUSE ? "pausing" : "resuming");
}

/* Answers the operator once (if still connected) and lets the forward go;
 * the target's entry stays until it replies or goes. */
static void handlers_fwd_done(struct hfwd *f, int status, const char *fmt, ...)
{
	char msg[ERR_MSG_MAX], qm[ERR_MSG_MAX + 16], qt[LOG_QUOTE_MAX];
	struct event ev = EVENT_INIT(EVENT_CONTROL);
	va_list ap;

	if (f->done)
		return;
	f->done = true;
	va_start(ap, fmt);
	err_vfmt(msg, sizeof(msg), 0, fmt, ap);
	va_end(ap);
	if (f->dreq)
		f->dreq->fwd = NULL;
	f->dreq = NULL;
	if (hconn_of(f->target)->ctl_in == f)
		hconn_of(f->target)->ctl_in = NULL;
	hconn_of(f->actor)->inflight--;
	if (f->actor->state == SESS_OPEN)
		handlers__reply_status(f->actor, f->actor_req, status, msg);
	log_info("control done " SESS_FMT " target=%s op=%s status=%d%s%s", SESS_ARGS(f->actor),
		 log_quote(f->target_name, qt, sizeof(qt)), handlers_op_verb(f->op), status,
		 status ? " error=" : "", status ? log_quote(msg, qm, sizeof(qm)) : "");
	ev.client = f->target_name;
	ev.client_id = f->target->client_id;
	ev.pid = f->target->pid;
	ev.tag = f->tag;
	ev.request = handlers_op_verb(f->op);
	ev.status = status;
	ev.detail = status ? msg : NULL;
	ev.actor = sess_name(f->actor);
	ev.duration_ns = uv_hrtime() - f->start_ns;
	handlers__emit(f->h, &ev);
	if (status < 0)
		handlers__refused(f->h, f->actor, "control", status, msg);
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
