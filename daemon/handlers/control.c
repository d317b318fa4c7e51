/*
 * control.c - an operator's pause/resume (ControlRequest) forwarded to the
 * target client as a ControlCommand, a daemon request of kind
 * HDREQ_CONTROL (dreq.c), and the operator's answer once that request
 * ends: answered, refused, timed out (--control-timeout, plus the wait of
 * a resume), or the target gone.
 *
 * Before forwarding, gmbd refuses what it can tell itself: a target that
 * is not one connected client (by name, pid or id: broker_found_err()
 * says why), an operator without the permission, a target without a
 * control handler, and a tag the target does not have ("" is every tag,
 * also of a client that has none; a tag with no allocations yet is one
 * it has), so that a typo is answered here with the tags it has, and the
 * application's handler never runs for it.
 *
 * Lifetimes: a forward (struct hfwd) names its operator's session without
 * a reference: it ends, at the latest, when the operator goes (its request
 * is cancelled then, handlers__control_gone()) or when the target goes.
 * The request outlives the forward when it timed out or was cancelled: the
 * target's late reply is then accepted and ignored (dreq.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/list.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

/* A control request forwarded from an operator (actor) to a target. */
struct hfwd {
	struct hdreq *dreq; /* the target's ControlCommand, until it ends */
	struct sess *actor; /* no reference: the forward ends before it goes */
	uint64_t actor_req; /* the ControlRequest's id */
	int op;		    /* GMB__OP__OP_PAUSE or GMB__OP__OP_RESUME */
	uint64_t start_ns;  /* uv_hrtime() when the operator asked */
	char tag[WIRE_MAX_NAME + 1];
	char target_name[WIRE_MAX_NAME + 1];
	struct hfwd *prev, *next; /* the actor's hconn->fwds */
};

static int handlers_ctl_target(struct hreq *rq, const char *sel, struct bclient **out,
			       struct sess **ts);
static int handlers_ctl_forward(struct hreq *rq, struct bclient *target, struct sess *ts);
static void handlers_fwd_sentence(const struct hfwd *f, const struct hdreq *d,
				  const struct hdreq_result *res, char *msg);
static void handlers_fwd_event(const struct hfwd *f, const struct hdreq *d, int status,
			       const char *msg);
static const char *handlers_op_verb(int op);
static const char *handlers_tag_text(const char *tag, char *buf, size_t len);

/* ---- control forwarding ---- */

int handlers__control(struct hreq *rq)
{
	const Gmb__ControlRequest *m = rq->env->control;
	const char *sel = m->target ? m->target : "";
	const char *tag = m->tag ? m->tag : "";
	struct bclient *target = NULL;
	struct sess *ts = NULL;
	int r;

	if (m->op != GMB__OP__OP_PAUSE && m->op != GMB__OP__OP_RESUME)
		return handlers__fail(rq, -EINVAL, "op %d is not pause (1) or resume (2)", m->op);
	if (!sel[0])
		return handlers__fail(rq, -EINVAL, "no target client given");
	if ((r = handlers__check_name(rq, "the target", sel)) < 0 ||
	    (r = handlers__check_name(rq, "the tag", tag)) < 0)
		return r;
	r = handlers_ctl_target(rq, sel, &target, &ts);
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
	/* Only once the operator may control it: its tags are its business. */
	r = broker_tag_check(target, tag, rq->err);
	if (r < 0)
		return r;
	if (hconn_of(ts)->ctl_in)
		return handlers__fail(rq, -EBUSY,
				      "client '%s' is still carrying out another"
				      " control request",
				      target->name);
	return handlers_ctl_forward(rq, target, ts);
}

/* The one client @sel names, with a session that can take the command. */
static int handlers_ctl_target(struct hreq *rq, const char *sel, struct bclient **out,
			       struct sess **ts)
{
	struct broker_found f;
	struct bclient *c = broker_client_find(rq->h->broker, sel, &f);

	if (!c)
		return broker_found_err(&f, sel, false, rq->err);
	*ts = handlers__conn_client(rq->h, c);
	if (!*ts || (*ts)->state != SESS_OPEN)
		return handlers__not_connected(rq, c);
	*out = c;
	return 0;
}

static int handlers_ctl_forward(struct hreq *rq, struct bclient *target, struct sess *ts)
{
	const Gmb__ControlRequest *m = rq->env->control;
	uint32_t wait = m->op == GMB__OP__OP_RESUME ? m->wait_ms : 0;
	struct hfwd *f = calloc(1, sizeof(*f));
	struct hdreq *d = handlers__dreq_new(HDREQ_CONTROL, f);
	char q[LOG_QUOTE_MAX], qt[LOG_QUOTE_MAX];
	int r = -ENOMEM;

	if (!f || !d)
		goto err_free;
	*f = (struct hfwd){ .dreq = d,
			    .actor = rq->s,
			    .actor_req = rq->env->id,
			    .op = m->op,
			    .start_ns = rq->start_ns };
	snprintf(f->tag, sizeof(f->tag), "%s", m->tag ? m->tag : "");
	snprintf(f->target_name, sizeof(f->target_name), "%s", target->name);
	/* A resume that may wait for memory gets that long on top; a pause whose
	 * importers follow, their own --control-timeout. */
	d->importers_follow = m->op == GMB__OP__OP_PAUSE && m->importers_follow;
	r = handlers__dreq_command(ts, d, m->op, f->tag, wait,
				   rq->h->control_timeout_ms * (d->importers_follow ? 2 : 1) +
					   wait);
	if (r < 0)
		goto err_free;
	hconn_of(ts)->ctl_in = f;
	DLIST_PUSH(hconn_of(rq->s)->fwds, f);
	hconn_of(rq->s)->inflight++;
	log_info("control forwarded " SESS_FMT " target=%s target_id=%" PRIu64 " op=%s tag=%s",
		 SESS_ARGS(rq->s), log_quote(target->name, qt, sizeof(qt)), target->id,
		 handlers_op_verb(f->op), handlers__tag_log(f->tag, q));
	return 0;

err_free:
	handlers__dreq_free(d);
	free(f);
	if (r == -EBUSY)
		return handlers__fail(rq, r,
				      "client '%s' leaves too many requests of gmbd"
				      " unanswered",
				      target->name);
	return handlers__fail(rq, r, "out of memory forwarding the request");
}

void handlers__control_gone(struct sess *s)
{
	struct hconn *hc = hconn_of(s);

	/* Each cancellation ends its forward, which leaves the list. */
	while (hc->fwds)
		handlers__dreq_cancel(hc->fwds->dreq);
}

/* Answers the operator once (if still connected) and lets the forward go;
 * the target's request stays until it replies or goes. */
void handlers__fwd_done(struct hdreq *d, const struct hdreq_result *res)
{
	struct hfwd *f = d->arg;
	struct hconn *tc = hconn_of(d->target);
	char msg[ERR_MSG_MAX], qm[ERR_MSG_MAX + 16], qt[LOG_QUOTE_MAX];

	handlers_fwd_sentence(f, d, res, msg);
	if (tc->ctl_in == f)
		tc->ctl_in = NULL;
	DLIST_UNLINK(hconn_of(f->actor)->fwds, f);
	hconn_of(f->actor)->inflight--;
	if (f->actor->state == SESS_OPEN)
		handlers__reply_status(f->actor, f->actor_req, res->status, msg);
	log_info("control done " SESS_FMT " target=%s op=%s status=%d%s%s", SESS_ARGS(f->actor),
		 log_quote(f->target_name, qt, sizeof(qt)), handlers_op_verb(f->op), res->status,
		 res->status ? " error=" : "", res->status ? log_quote(msg, qm, sizeof(qm)) : "");
	handlers_fwd_event(f, d, res->status, msg);
	/* A cancelled forward has nobody left to refuse. */
	if (res->status < 0 && res->end != HDREQ_CANCELLED)
		handlers__refused(d->h, f->actor, "control", res->status, msg);
	free(f);
}

/* What the operator is told of @res, into @msg (ERR_MSG_MAX bytes). */
static void handlers_fwd_sentence(const struct hfwd *f, const struct hdreq *d,
				  const struct hdreq_result *res, char *msg)
{
	char t[WIRE_MAX_NAME + 8];
	const char *verb = handlers_op_verb(f->op);

	handlers_tag_text(f->tag, t, sizeof(t));
	switch (res->end) {
	case HDREQ_ANSWERED:
		msg[0] = '\0';
		break;
	case HDREQ_REFUSED:
		err_fmt(msg, 0, "client '%s' could not %s %s: %s", f->target_name, verb, t,
			res->error[0] ? res->error : strerror(-res->status));
		break;
	case HDREQ_TIMED_OUT:
		/* The command cannot be taken back: say that it may still be carried out. */
		err_fmt(msg, 0,
			"client '%s' did not %s %s within %g s; it has the command and may"
			" still carry it out (gmbctl status shows \"%s\" until it answers)",
			f->target_name, verb, t, (double)d->h->control_timeout_ms / 1000,
			f->op == GMB__OP__OP_PAUSE ? "pausing" : "resuming");
		break;
	case HDREQ_GONE:
		err_fmt(msg, 0, "client '%s' disconnected before it answered", f->target_name);
		break;
	case HDREQ_CANCELLED:
		err_fmt(msg, 0, "the operator disconnected before client '%s' answered",
			f->target_name);
		break;
	}
}

/* One EVENT_CONTROL a forward, however it ended. */
static void handlers_fwd_event(const struct hfwd *f, const struct hdreq *d, int status,
			       const char *msg)
{
	struct event ev = EVENT_INIT(EVENT_CONTROL);

	ev.client = f->target_name;
	ev.client_id = d->target->client_id;
	ev.pid = d->target->pid;
	ev.tag = f->tag;
	ev.request = handlers_op_verb(f->op);
	ev.status = status;
	ev.detail = status ? msg : NULL;
	ev.actor = sess_name(f->actor);
	ev.duration_ns = uv_hrtime() - f->start_ns;
	handlers__emit(d->h, &ev);
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
