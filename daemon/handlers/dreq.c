/*
 * dreq.c - a request gmbd sends to a client (struct hdreq, internal.h):
 * one type for every kind, the table of kinds, the one timer for every
 * deadline, and completion.
 *
 * Kinds. hdreq_kinds below names, for each kind, what it is called in logs,
 * the body its envelope carries and its done handler. A new kind is one row
 * there and one done handler; the initiator builds its body and calls
 * handlers__dreq_send() with a timeout or none.
 *
 * Lifetime. handlers__dreq_new() makes a request for its initiator (arg),
 * who fills in the kind's payload; handlers__dreq_send() gives it an id
 * from the target connection's counter, enters it in that connection's
 * dreqs map and, with a timeout, in the handlers' deadline queue
 * (h->dreqs_due, earliest first), then sends it. From then on the request
 * is the target connection's: it stays in dreqs until the client's last
 * reply part comes or the target's session goes, and is freed then, and
 * only then. A reply to an id that is not in the map is a protocol error.
 *
 * Completion. The kind's done handler runs exactly once for every request
 * sent, at the first of:
 *   ANSWERED   the client's last reply part, status 0;
 *   REFUSED    the same with a negative status (a positive one, a client's
 *              bug, counts as -EIO);
 *   TIMED_OUT  its deadline (-ETIMEDOUT);
 *   GONE       the target's session went (-ECONNRESET);
 *   CANCELLED  its initiator gave up on it (handlers__dreq_cancel(),
 *              -ECANCELED): an operator that disconnected, a switch that
 *              ends while gmbd stops.
 * It never runs inside handlers__dreq_send(). After a timeout or a
 * cancellation the request stays in dreqs, done, until the client answers
 * or goes: the command is with the client, which may still carry it out
 * (status.c shows such a control as "pausing"/"resuming"), and its late
 * reply is logged and dropped, neither a protocol error nor a second call;
 * a kind whose client acts on the request even late (an importer that
 * unmapped after all) has a late handler, told of a late answer.
 *
 * The done handler is the one way up from this file (internal.h): it may
 * answer an operator, send further requests, cancel others; the request
 * it gets is valid during the call.
 *
 * Backpressure: a client that leaves HANDLERS_MAX_DREQS requests
 * unanswered gets no more (-EBUSY): drops doom it then, since the core
 * counts a drop as sent.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/list.h"
#include "common/log.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

struct hdreq_kind_row {
	const char *name; /* in logs */
	int body;	  /* the envelope's body case */
	hdreq_done_fn done;
	unsigned flags; /* HDREQ_SETTLE, HDREQ_STATE after an answer */
	/* A late answer (status 0) after the request was done; NULL: none. */
	void (*late)(struct hdreq *d);
};

static void hdreq_complete(struct hdreq *d, enum hdreq_end end, int status, const char *error);
static void hdreq_due_add(struct handlers *h, struct hdreq *d);
static void hdreq_due_remove(struct hdreq *d);
static void hdreq_arm(struct handlers *h);
static void hdreq_on_timer(uv_timer_t *t);

static const struct hdreq_kind_row hdreq_kinds[HDREQ_NKINDS] = {
	[HDREQ_DROP] = { "drop", GMB__ENVELOPE__BODY_DROP, handlers__drop_done,
			 HDREQ_SETTLE | HDREQ_STATE, NULL },
	[HDREQ_CONTROL] = { "control", GMB__ENVELOPE__BODY_CONTROL_CMD, handlers__fwd_done, 0,
			    NULL },
	[HDREQ_SWITCH] = { "switch step", GMB__ENVELOPE__BODY_CONTROL_CMD,
			   handlers__switch_step_done, 0, NULL },
	[HDREQ_PREEMPT] = { "preemption", GMB__ENVELOPE__BODY_CONTROL_CMD, handlers__preempt_done,
			    0, NULL },
	/* An unmap unpins chunks: the pool may give them on. */
	[HDREQ_FOLLOW] = { "importer follow", GMB__ENVELOPE__BODY_IPC_FOLLOW, handlers__follow_done,
			   HDREQ_SETTLE | HDREQ_STATE, handlers__follow_late },
};

struct hdreq *handlers__dreq_new(enum hdreq_kind kind, void *arg)
{
	struct hdreq *d = calloc(1, sizeof(*d));

	if (d)
		*d = (struct hdreq){ .kind = kind, .arg = arg };
	return d;
}

void handlers__dreq_free(struct hdreq *d)
{
	if (!d)
		return;
	free(d->ids);
	free(d->tag);
	free(d);
}

int handlers__dreq_send(struct sess *s, struct hdreq *d, Gmb__Envelope *env, uint64_t timeout_ms)
{
	struct hconn *hc = hconn_of(s);
	uint64_t id = hc->next_req_id + 1;
	int r;

	if ((unsigned)d->kind >= HDREQ_NKINDS || (int)env->body_case != hdreq_kinds[d->kind].body)
		return -EINVAL; /* gmbd's bug: say so rather than send it */
	if (s->state != SESS_OPEN)
		return -EPIPE;
	if (hc->dreqs.count >= HANDLERS_MAX_DREQS)
		return -EBUSY;
	r = idmap_put(&hc->dreqs, id, d);
	if (r < 0)
		return r;
	hc->next_req_id = id;
	d->h = hc->h;
	d->target = s;
	d->id = id;
	if (timeout_ms) {
		d->deadline = uv_now(d->h->loop) + timeout_ms;
		hdreq_due_add(d->h, d);
	}
	env->id = id;
	/* A failed send dooms @s; its going completes @d (GONE). */
	sess_send(s, env);
	return 0;
}

int handlers__dreq_command(struct sess *s, struct hdreq *d, int op, const char *tag,
			   uint32_t wait_ms, uint64_t timeout_ms)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlCommand cc = GMB__CONTROL_COMMAND__INIT;

	free(d->tag);
	d->tag = strdup(tag);
	if (!d->tag)
		return -ENOMEM;
	d->op = op;
	env.body_case = GMB__ENVELOPE__BODY_CONTROL_CMD;
	env.control_cmd = &cc;
	cc.op = (Gmb__Op)op;
	cc.tag = d->tag;
	cc.wait_ms = wait_ms;
	cc.importers_follow = d->importers_follow;
	return handlers__dreq_send(s, d, &env, timeout_ms);
}

void handlers__dreq_cancel(struct hdreq *d)
{
	if (d && !d->done)
		hdreq_complete(d, HDREQ_CANCELLED, -ECANCELED, "");
}

unsigned handlers__dreq_reply(struct sess *s, const Gmb__Envelope *env)
{
	struct hconn *hc = hconn_of(s);
	struct hdreq *d = idmap_get(&hc->dreqs, env->reply_to);
	unsigned flags = 0;
	int status = env->status > 0 ? -EIO : env->status;

	if (!d) {
		sess_protocol_error(s, "a reply to request %" PRIu64 ", which gmbd did not send",
				    env->reply_to);
		return 0;
	}
	if (env->more)
		return 0; /* the last part carries the status */
	idmap_del(&hc->dreqs, env->reply_to);
	if (d->done && status == 0 && hdreq_kinds[d->kind].late) {
		log_info("late reply " SESS_FMT " request=%s", SESS_ARGS(s),
			 hdreq_kinds[d->kind].name);
		hdreq_kinds[d->kind].late(d);
		flags = hdreq_kinds[d->kind].flags;
	} else if (d->done) {
		log_info("late reply ignored " SESS_FMT " request=%s status=%d", SESS_ARGS(s),
			 hdreq_kinds[d->kind].name, env->status);
	} else {
		if (status == 0)
			flags = hdreq_kinds[d->kind].flags;
		hdreq_complete(d, status ? HDREQ_REFUSED : HDREQ_ANSWERED, status,
			       env->error ? env->error : "");
	}
	handlers__dreq_free(d);
	return flags;
}

void handlers__dreqs_gone(struct sess *s)
{
	struct hconn *hc = hconn_of(s);

	/* A done handler may send elsewhere, never to @s (it is not open):
	 * still, take the map first so that nothing changes it under the walk. */
	while (hc->dreqs.count) {
		struct idmap m = hc->dreqs;
		uint64_t id;
		void *v;

		hc->dreqs = (struct idmap)IDMAP_INIT;
		for (size_t i = 0; idmap_next(&m, &i, &id, &v);) {
			struct hdreq *d = v;

			if (!d->done)
				hdreq_complete(d, HDREQ_GONE, -ECONNRESET, "");
			handlers__dreq_free(d);
		}
		idmap_deinit(&m);
	}
	idmap_deinit(&hc->dreqs);
}

/* The one place a request ends: its done handler, once. */
static void hdreq_complete(struct hdreq *d, enum hdreq_end end, int status, const char *error)
{
	const struct hdreq_result res = { .end = end, .status = status, .error = error };

	d->done = true; /* first: the handler may cancel, or the target go */
	hdreq_due_remove(d);
	hdreq_kinds[d->kind].done(d, &res);
	d->arg = NULL;
}

/* ---- the deadlines: one queue, one timer ---- */

static void hdreq_due_add(struct handlers *h, struct hdreq *d)
{
	struct hdreq *at = h->dreqs_due, *before = NULL;

	/* Most requests share one timeout, so the newest tends to go last. */
	while (at && at->deadline <= d->deadline) {
		before = at;
		at = at->next;
	}
	d->prev = before;
	d->next = at;
	if (at)
		at->prev = d;
	if (before)
		before->next = d;
	else
		h->dreqs_due = d;
	if (h->dreqs_due == d)
		hdreq_arm(h);
}

static void hdreq_due_remove(struct hdreq *d)
{
	struct handlers *h = d->h;
	bool first;

	if (!d->deadline)
		return;
	first = h->dreqs_due == d;
	DLIST_UNLINK(h->dreqs_due, d);
	d->deadline = 0;
	if (first)
		hdreq_arm(h);
}

/* The timer runs for the earliest deadline, and only while there is one. */
static void hdreq_arm(struct handlers *h)
{
	uint64_t now = uv_now(h->loop);
	const struct hdreq *d = h->dreqs_due;

	if (!d) {
		uv_timer_stop(&h->dreq_timer);
		return;
	}
	uv_timer_start(&h->dreq_timer, hdreq_on_timer, d->deadline > now ? d->deadline - now : 0,
		       0);
}

static void hdreq_on_timer(uv_timer_t *t)
{
	struct handlers *h = t->data;
	uint64_t now = uv_now(h->loop);
	struct hdreq *d;

	/* A done handler may add or end others: take the first anew each time. */
	while ((d = h->dreqs_due) && d->deadline <= now)
		hdreq_complete(d, HDREQ_TIMED_OUT, -ETIMEDOUT, "");
	hdreq_arm(h);
}
