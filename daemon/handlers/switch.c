/*
 * switch.c - the switch family: an operator's SwitchRequest (pause FROM's
 * tags, then resume TO's tags in the order given, as one answer with each
 * step's time) and PriorityRequest.
 *
 * A switch runs as lanes, one per client of either side, each a list of
 * ControlCommands (daemon requests, drops.c) carried out one after the
 * other; the lanes of one side run at the same time (the ranks of a
 * tensor-parallel engine drain together). Phases: FROM's pauses, TO's
 * resumes; after a failure, TO's resumed tags are paused again and FROM's
 * paused tags resumed again, so that both sides end as they began, and the
 * answer says which step failed and whether the rollback succeeded.
 *
 * The core's switch (arb_handover_begin) keeps the chunks of FROM's
 * pauses for TO's resumes, so that between clients of one user TO maps
 * FROM's memory with no release, zeroing or create; it ends with the
 * switch, successful or not.
 *
 * Lifetimes: a switch holds a reference to the operator's session and
 * answers it if still there. A lane names its client by id (a client may
 * go at any time). Each step is a daemon request of kind HDREQ_SWITCH
 * (dreq.c) whose done handler, handlers__switch_step_done(), ends the step
 * however the request ended (answered, refused, timed out after
 * --control-timeout plus the wait of a resume, the client gone); a switch
 * that ends while gmbd stops cancels the steps it still waits for.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/list.h"
#include "common/log.h"
#include "common/size.h"
#include "common/wire.h"
#include "daemon/core/arb.h"
#include "daemon/core/broker.h"
#include "daemon/core/wait.h"
#include "daemon/core/walk.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

#define HSWITCH_MAX_LANES 64 /* per side */
#define HSWITCH_MAX_TAGS  64

typedef char hswitch_name[WIRE_MAX_NAME + 1];

enum hswitch_phase {
	HSW_PAUSE,
	HSW_RESUME,
	HSW_UNDO_TO,
	HSW_UNDO_FROM,
	HSW_DONE
};

struct hswitch_lane {
	struct hswitch *sw;
	uint64_t client_id;
	hswitch_name name;
	bool from;
	hswitch_name *fwd; /* forward steps in order; "" = every tag */
	size_t nfwd;
	hswitch_name *changed; /* tags in the other state at the start */
	size_t nchanged;
	size_t next;	    /* this phase's next step to send */
	size_t sent;	    /* forward steps sent: what a rollback may undo */
	hswitch_name *undo; /* this phase's undo steps */
	size_t nundo;
	struct hdreq *dreq; /* the command in flight; NULL: none */
	uint64_t t0;	    /* uv_hrtime() of its send */
	bool gone;
};

struct hswitch_step {
	hswitch_name client, tag;
	uint64_t client_id;
	int op, status;
	bool undo;
	double ms;
	char *error; /* malloc'd; NULL when none */
};

struct hswitch {
	struct handlers *h;
	struct sess *actor; /* reference held */
	uint64_t actor_req;
	hswitch_name from, to;
	struct bhandover *ho;
	struct hswitch_lane *lanes; /* FROM's first, then TO's */
	size_t nfrom, nto;
	enum hswitch_phase phase;
	uint32_t wait_ms;
	struct hswitch_step *steps;
	size_t nsteps, cap_steps;
	int status; /* the first failure of a forward step */
	char why[ERR_MSG_MAX];
	bool undo_failed;
	char undo_why[ERR_MSG_MAX];
	uint64_t t0;
	struct hswitch *prev, *next;
};

static void hswitch_advance(struct hswitch *sw);
static void hswitch_finish(struct hswitch *sw);
static void hswitch_destroy(struct hswitch *sw);

/* ---- setting up ---- */

static int hswitch_tag_push(hswitch_name **v, size_t *n, const char *tag)
{
	hswitch_name *nv = realloc(*v, (*n + 1) * sizeof(**v));

	if (!nv)
		return -ENOMEM;
	*v = nv;
	snprintf(nv[*n], sizeof(nv[*n]), "%s", tag);
	(*n)++;
	return 0;
}

/* A tag of @l's client a step will change goes on l->changed. */
static int hswitch_changed_tag(void *arg, const struct btag *t)
{
	struct hswitch_lane *l = arg;

	if (t->paused == l->from)
		return 0;
	return hswitch_tag_push(&l->changed, &l->nchanged, t->name);
}

static const struct walk_ops hswitch_changed_ops = { .tag = hswitch_changed_tag };

/*
 * @l's steps from @c's tags: the named ones it has (in the order given),
 * else one step for every tag; changed[] lists the tags a step will change
 * (FROM: active ones, TO: paused ones), which are what a rollback undoes.
 */
static int hswitch_lane_plan(struct hreq *rq, struct hswitch_lane *l, const struct bclient *c,
			     char *const *tags, size_t ntags)
{
	bool any = false;

	for (size_t i = 0; i < ntags; i++) {
		const struct btag *t = broker_tag_find(c, tags[i]);

		if (!t)
			continue;
		any = true;
		if (t->paused != l->from &&
		    (hswitch_tag_push(&l->fwd, &l->nfwd, t->name) < 0 ||
		     hswitch_tag_push(&l->changed, &l->nchanged, t->name) < 0))
			return handlers__fail(rq, -ENOMEM, "out of memory planning a switch");
	}
	if (ntags && !any)
		return handlers__fail(rq, -ENOENT, "client '%s' has none of the tags named",
				      c->name);
	if (ntags)
		return 0;
	if (walk_client(c, &hswitch_changed_ops, l) < 0)
		return handlers__fail(rq, -ENOMEM, "out of memory planning a switch");
	if (l->nchanged && hswitch_tag_push(&l->fwd, &l->nfwd, "") < 0)
		return handlers__fail(rq, -ENOMEM, "out of memory planning a switch");
	return 0;
}

/* The clients of one side, each connected, controllable by the operator. */
static int hswitch_side(struct hreq *rq, const char *sel, struct bclient **out)
{
	struct broker *br = rq->h->broker;
	struct bclient *actor = hconn_of(rq->s)->client;
	int n = arb_select(br, sel, out, HSWITCH_MAX_LANES, rq->err);

	for (int i = 0; i < n; i++) {
		struct sess *ts = handlers__conn_client(rq->h, out[i]);
		int r = broker_may_control(br, actor, out[i], rq->err);

		if (r < 0)
			return r;
		if (!ts || ts->state != SESS_OPEN)
			return handlers__not_connected(rq, out[i]);
		if (!out[i]->control)
			return handlers__fail(rq, -EOPNOTSUPP,
					      "client '%s' does not accept remote"
					      " control",
					      out[i]->name);
	}
	return n;
}

static void hswitch_free(struct hswitch *sw)
{
	for (size_t i = 0; i < sw->nfrom + sw->nto; i++) {
		free(sw->lanes[i].fwd);
		free(sw->lanes[i].changed);
		free(sw->lanes[i].undo);
	}
	for (size_t i = 0; i < sw->nsteps; i++)
		free(sw->steps[i].error);
	free(sw->steps);
	free(sw->lanes);
	free(sw);
}

static int hswitch_lanes(struct hreq *rq, struct hswitch *sw, struct bclient **c, size_t n,
			 char *const *tags, size_t ntags)
{
	for (size_t i = 0; i < n; i++) {
		struct hswitch_lane *l = &sw->lanes[i];
		int r;

		*l = (struct hswitch_lane){ .sw = sw,
					    .client_id = c[i]->id,
					    .from = i < sw->nfrom };
		snprintf(l->name, sizeof(l->name), "%s", c[i]->name);
		for (size_t j = 0; j < i; j++)
			if (sw->lanes[j].client_id == l->client_id)
				return handlers__fail(rq, -EINVAL,
						      "client '%s' is on both sides of"
						      " the switch",
						      l->name);
		r = hswitch_lane_plan(rq, l, c[i], tags, ntags);
		if (r < 0)
			return r;
	}
	return 0;
}

static int hswitch_check(struct hreq *rq, const Gmb__SwitchRequest *m)
{
	int r;

	if (!m->from || !m->from[0] || !m->to || !m->to[0])
		return handlers__fail(rq, -EINVAL, "a switch needs FROM and TO");
	if (m->n_tags > HSWITCH_MAX_TAGS)
		return handlers__fail(rq, -E2BIG, "%zu tags named; at most %d", m->n_tags,
				      HSWITCH_MAX_TAGS);
	if ((r = handlers__check_name(rq, "FROM", m->from)) < 0 ||
	    (r = handlers__check_name(rq, "TO", m->to)) < 0)
		return r;
	for (size_t i = 0; i < m->n_tags; i++) {
		if (!m->tags[i] || !m->tags[i][0])
			return handlers__fail(rq, -EINVAL, "an empty tag name");
		if ((r = handlers__check_name(rq, "a tag", m->tags[i])) < 0)
			return r;
	}
	return 0;
}

int handlers__switch(struct hreq *rq)
{
	const Gmb__SwitchRequest *m = rq->env->switch_req;
	struct bclient *c[2 * HSWITCH_MAX_LANES];
	struct hswitch *sw;
	int nf, nt, r;

	if ((r = hswitch_check(rq, m)) < 0)
		return r;
	if ((nf = hswitch_side(rq, m->from, c)) < 0)
		return nf;
	if ((nt = hswitch_side(rq, m->to, c + nf)) < 0)
		return nt;
	sw = calloc(1, sizeof(*sw));
	if (!sw || !(sw->lanes = calloc((size_t)(nf + nt), sizeof(*sw->lanes)))) {
		free(sw);
		return handlers__fail(rq, -ENOMEM, "out of memory for a switch");
	}
	sw->nfrom = (size_t)nf;
	sw->nto = (size_t)nt;
	r = hswitch_lanes(rq, sw, c, sw->nfrom + sw->nto, m->tags, m->n_tags);
	if (r == 0)
		r = arb_handover_begin(rq->h->broker, c, sw->nfrom, c + nf, sw->nto, &sw->ho,
				       rq->err);
	if (r < 0) {
		hswitch_free(sw);
		return r;
	}
	sw->h = rq->h;
	sw->actor = sess_ref(rq->s);
	sw->actor_req = rq->env->id;
	sw->wait_ms = m->wait_ms;
	sw->t0 = uv_hrtime();
	snprintf(sw->from, sizeof(sw->from), "%s", m->from);
	snprintf(sw->to, sizeof(sw->to), "%s", m->to);
	DLIST_PUSH(rq->h->switches, sw);
	hconn_of(rq->s)->inflight++;
	log_info("switch started " SESS_FMT " from=%s to=%s from_clients=%d to_clients=%d"
		 " tags=%zu",
		 SESS_ARGS(rq->s), sw->from, sw->to, nf, nt, m->n_tags);
	hswitch_advance(sw);
	return 0;
}

/* ---- running ---- */

static bool hswitch_lane_in_phase(const struct hswitch *sw, const struct hswitch_lane *l)
{
	if (sw->phase == HSW_PAUSE || sw->phase == HSW_UNDO_FROM)
		return l->from;
	return !l->from && sw->phase != HSW_DONE;
}

static bool hswitch_forward(const struct hswitch *sw)
{
	return sw->phase == HSW_PAUSE || sw->phase == HSW_RESUME;
}

/* Pause for FROM's forward steps and TO's undo; resume for the others. */
static int hswitch_op(const struct hswitch *sw)
{
	return sw->phase == HSW_PAUSE || sw->phase == HSW_UNDO_TO ? GMB__OP__OP_PAUSE :
								    GMB__OP__OP_RESUME;
}

static const char *hswitch_step_tag(const struct hswitch_lane *l, size_t i)
{
	return hswitch_forward(l->sw) ? l->fwd[i] : l->undo[i];
}

static size_t hswitch_nsteps(const struct hswitch_lane *l)
{
	return hswitch_forward(l->sw) ? l->nfwd : l->nundo;
}

static void hswitch_record(struct hswitch *sw, struct hswitch_lane *l, const char *tag, int status,
			   const char *error)
{
	struct hswitch_step *st;

	if (sw->nsteps == sw->cap_steps) {
		size_t cap = sw->cap_steps ? 2 * sw->cap_steps : 8;
		struct hswitch_step *v = realloc(sw->steps, cap * sizeof(*v));

		if (!v)
			return; /* the answer lacks a row; the outcome stays right */
		sw->steps = v;
		sw->cap_steps = cap;
	}
	st = &sw->steps[sw->nsteps++];
	*st = (struct hswitch_step){ .client_id = l->client_id,
				     .op = hswitch_op(sw),
				     .status = status,
				     .undo = !hswitch_forward(sw) };
	snprintf(st->client, sizeof(st->client), "%s", l->name);
	snprintf(st->tag, sizeof(st->tag), "%s", tag);
	st->ms = l->t0 ? (double)(uv_hrtime() - l->t0) / 1e6 : 0;
	st->error = status < 0 ? strdup(error && *error ? error : strerror(-status)) : NULL;
}

/* A step of @l ended with @status (0 or -errno, @error its sentence). */
static void hswitch_step_done(struct hswitch_lane *l, int status, const char *error)
{
	struct hswitch *sw = l->sw;
	const char *tag = hswitch_step_tag(l, l->next - 1);
	char what[WIRE_MAX_NAME + 16];

	hswitch_record(sw, l, tag, status, error);
	l->dreq = NULL;
	l->t0 = 0;
	if (status == 0)
		return;
	snprintf(what, sizeof(what), tag[0] ? "tag '%s'" : "every tag%s", tag);
	if (hswitch_forward(sw) && sw->status == 0) {
		sw->status = status;
		err_fmt(sw->why, 0, "%s of %s of '%s' failed: %s",
			sw->phase == HSW_PAUSE ? "pause" : "resume", what, l->name,
			error && *error ? error : strerror(-status));
	} else if (!hswitch_forward(sw)) {
		if (!sw->undo_failed)
			err_fmt(sw->undo_why, 0, "'%s' could not %s %s: %s", l->name,
				hswitch_op(sw) == GMB__OP__OP_PAUSE ? "pause" : "resume", what,
				error && *error ? error : strerror(-status));
		sw->undo_failed = true;
	}
}

static void hswitch_lane_send(struct hswitch_lane *l)
{
	struct hswitch *sw = l->sw;
	struct bclient *c = broker_client_get(sw->h->broker, l->client_id);
	struct sess *s = c ? handlers__conn_client(sw->h, c) : NULL;
	uint32_t wait = hswitch_op(sw) == GMB__OP__OP_RESUME ? sw->wait_ms : 0;
	struct hdreq *d;
	int r;

	l->t0 = uv_hrtime();
	l->next++;
	if (hswitch_forward(sw))
		l->sent = l->next;
	if (!s || s->state != SESS_OPEN) {
		l->gone = true;
		hswitch_step_done(l, -ECONNRESET, "the client is gone");
		return;
	}
	d = handlers__dreq_new(HDREQ_SWITCH, l);
	if (!d) {
		hswitch_step_done(l, -ENOMEM, "out of memory sending the command");
		return;
	}
	r = handlers__dreq_command(s, d, hswitch_op(sw), hswitch_step_tag(l, l->next - 1), wait,
				   sw->h->control_timeout_ms + wait);
	if (r < 0) {
		handlers__dreq_free(d);
		hswitch_step_done(l, r, "cannot send the command");
		return;
	}
	l->dreq = d;
}

/* The undo steps of a phase: what @l's forward steps sent (the failed one
 * too: it may have done part) changed. */
static int hswitch_lane_undo(struct hswitch_lane *l)
{
	size_t upto = l->sent;

	free(l->undo);
	l->undo = NULL;
	l->nundo = 0;
	l->next = 0;
	for (size_t i = 0; i < l->nchanged; i++) {
		bool covered = false;

		for (size_t j = 0; j < upto; j++)
			covered |= !l->fwd[j][0] || strcmp(l->fwd[j], l->changed[i]) == 0;
		if (covered && hswitch_tag_push(&l->undo, &l->nundo, l->changed[i]) < 0)
			return -ENOMEM;
	}
	return 0;
}

static void hswitch_enter(struct hswitch *sw, enum hswitch_phase phase)
{
	sw->phase = phase;
	for (size_t i = 0; i < sw->nfrom + sw->nto; i++) {
		struct hswitch_lane *l = &sw->lanes[i];

		l->next = 0;
		if (!hswitch_forward(sw) && hswitch_lane_in_phase(sw, l) &&
		    hswitch_lane_undo(l) < 0) {
			sw->undo_failed = true;
			err_fmt(sw->undo_why, 0, "out of memory planning the rollback of '%s'",
				l->name);
		}
	}
}

static enum hswitch_phase hswitch_next_phase(const struct hswitch *sw)
{
	switch (sw->phase) {
	case HSW_PAUSE:
		return sw->status ? HSW_UNDO_FROM : HSW_RESUME;
	case HSW_RESUME:
		return sw->status ? HSW_UNDO_TO : HSW_DONE;
	case HSW_UNDO_TO:
		return HSW_UNDO_FROM;
	default:
		return HSW_DONE;
	}
}

/* Sends what can be sent; moves to the next phase when this one is over. */
static void hswitch_advance(struct hswitch *sw)
{
	while (sw->phase != HSW_DONE) {
		bool busy = false;

		for (size_t i = 0; i < sw->nfrom + sw->nto; i++) {
			struct hswitch_lane *l = &sw->lanes[i];

			if (!hswitch_lane_in_phase(sw, l))
				continue;
			/* After a failure no forward step starts: the rollback comes. */
			while (!l->dreq && !l->gone && l->next < hswitch_nsteps(l) &&
			       !(hswitch_forward(sw) && sw->status))
				hswitch_lane_send(l);
			busy |= l->dreq != NULL;
		}
		if (busy)
			return;
		hswitch_enter(sw, hswitch_next_phase(sw));
	}
	hswitch_finish(sw);
}

void handlers__switch_step_done(struct hdreq *d, const struct hdreq_result *res)
{
	struct hswitch_lane *l = d->arg;
	char msg[ERR_MSG_MAX];

	l->dreq = NULL;
	switch (res->end) {
	case HDREQ_CANCELLED:
		return; /* the switch ends without it */
	case HDREQ_ANSWERED:
	case HDREQ_REFUSED:
		hswitch_step_done(l, res->status, res->error);
		break;
	case HDREQ_TIMED_OUT:
		err_fmt(msg, 0, "no answer within %.3f s", (double)(uv_hrtime() - l->t0) / 1e9);
		hswitch_step_done(l, res->status, msg);
		break;
	case HDREQ_GONE:
		l->gone = true;
		err_fmt(msg, 0, "client '%s' disconnected before it answered",
			sess_name(d->target));
		hswitch_step_done(l, res->status, msg);
		break;
	}
	hswitch_advance(l->sw);
}

/* ---- the answer ---- */

/* "'a', 'b'" for the clients of one side, into @buf. */
static const char *hswitch_side_text(const struct hswitch *sw, bool from, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < sw->nfrom + sw->nto && off < len; i++)
		if (sw->lanes[i].from == from)
			off += (size_t)snprintf(buf + off, len - off, "%s'%s'", off ? ", " : "",
						sw->lanes[i].name);
	return buf;
}

/* The failure's sentence: what failed, then how both sides were left. */
static void hswitch_failure_text(const struct hswitch *sw, char *msg)
{
	char f[256], t[256];

	hswitch_side_text(sw, true, f, sizeof(f));
	hswitch_side_text(sw, false, t, sizeof(t));
	err_fmt(msg, 0, "%s", sw->why);
	if (sw->undo_failed) {
		err_append(msg, "; rollback incomplete: %s", sw->undo_why);
		return;
	}
	for (size_t i = 0; i < sw->nsteps; i++)
		if (!sw->steps[i].undo && sw->steps[i].op == GMB__OP__OP_RESUME) {
			err_append(msg, "; TO (%s) paused again", t);
			break;
		}
	err_append(msg, "; FROM (%s) resumed again: both sides are as before", f);
}

static void hswitch_reply(struct hswitch *sw, const struct broker_handover_stats *hs,
			  double total_ms, const char *msg)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__SwitchReply sr = GMB__SWITCH_REPLY__INIT;
	Gmb__SwitchStep *st = calloc(sw->nsteps + 1, sizeof(*st));
	Gmb__SwitchStep **pst = calloc(sw->nsteps + 1, sizeof(*pst));

	if (st && pst) {
		for (size_t i = 0; i < sw->nsteps; i++) {
			const struct hswitch_step *s = &sw->steps[i];

			gmb__switch_step__init(&st[i]);
			st[i] = (Gmb__SwitchStep){ .base = st[i].base,
						   .client = (char *)s->client,
						   .client_id = s->client_id,
						   .op = (Gmb__Op)s->op,
						   .tag = (char *)s->tag,
						   .ms = s->ms,
						   .status = s->status,
						   .error = s->error ? s->error : "",
						   .undo = s->undo };
			pst[i] = &st[i];
		}
		sr.n_steps = sw->nsteps;
		sr.steps = pst;
	}
	sr.total_ms = total_ms;
	sr.handed_over_bytes = hs->handed_bytes;
	sr.created_bytes = hs->created_bytes;
	env.reply_to = sw->actor_req;
	env.status = sw->status;
	env.error = sw->status ? (char *)msg : "";
	env.body_case = GMB__ENVELOPE__BODY_SWITCH_REPLY;
	env.switch_reply = &sr;
	sess_send(sw->actor, &env);
	free(pst);
	free(st);
}

static void hswitch_finish(struct hswitch *sw)
{
	struct broker_handover_stats hs = { 0 };
	double total = (double)(uv_hrtime() - sw->t0) / 1e6;
	char msg[ERR_MSG_MAX] = "", b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];

	arb_handover_end(sw->h->broker, sw->ho, &hs);
	sw->ho = NULL;
	if (sw->status)
		hswitch_failure_text(sw, msg);
	log_info("switch done " SESS_FMT " from=%s to=%s status=%d ms=%.3f handed_over=%s"
		 " created=%s%s%s%s",
		 SESS_ARGS(sw->actor), sw->from, sw->to, sw->status, total,
		 size_str(hs.handed_bytes, b1), size_str(hs.created_bytes, b2),
		 sw->status ? " error=\"" : "", msg, sw->status ? "\"" : "");
	hconn_of(sw->actor)->inflight--;
	if (sw->actor->state == SESS_OPEN)
		hswitch_reply(sw, &hs, total, msg);
	DLIST_UNLINK(sw->h->switches, sw);
	handlers__settle(sw->h);
	handlers__changed(sw->h);
	hswitch_destroy(sw);
}

static void hswitch_destroy(struct hswitch *sw)
{
	sess_unref(sw->actor);
	hswitch_free(sw);
}

void handlers__switch_close_all(struct handlers *h)
{
	while (h->switches) {
		struct hswitch *sw = h->switches;

		for (size_t i = 0; i < sw->nfrom + sw->nto; i++)
			handlers__dreq_cancel(sw->lanes[i].dreq);
		arb_handover_end(h->broker, sw->ho, NULL);
		sw->ho = NULL;
		DLIST_UNLINK(h->switches, sw);
		hswitch_destroy(sw);
	}
}

/* ---- priorities ---- */

int handlers__priority(struct hreq *rq)
{
	const Gmb__PriorityRequest *m = rq->env->priority;
	const char *sel = m->target ? m->target : "";
	struct broker *br = rq->h->broker;
	struct bclient *c[HSWITCH_MAX_LANES];
	int n, r;

	if (!sel[0])
		return handlers__fail(rq, -EINVAL, "no target client given");
	if ((r = handlers__check_name(rq, "the target", sel)) < 0)
		return r;
	n = arb_select(br, sel, c, HSWITCH_MAX_LANES, rq->err);
	for (int i = 0; i < n; i++)
		if ((r = broker_may_control(br, hconn_of(rq->s)->client, c[i], rq->err)) < 0)
			return r;
	if (n < 0)
		return n;
	for (int i = 0; i < n; i++) {
		log_info("priority set " SESS_FMT " target=%s target_id=%" PRIu64 " priority=%d"
			 " was=%d",
			 SESS_ARGS(rq->s), c[i]->name, c[i]->id, m->priority, c[i]->priority);
		wait_set_priority(br, c[i], m->priority);
	}
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}
