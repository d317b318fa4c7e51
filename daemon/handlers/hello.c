/*
 * hello.c - how clients arrive and leave across restarts of gmbd: hello,
 * the rejoin hello, the claim (RejoinRequests) and its answer, and the Bye
 * that tells clients a stopping gmbd keeps nothing. Orphans that never
 * come back are orphans.c's.
 *
 * A rejoin hello names the client id of the previous gmbd. It is accepted
 * only for an orphan (a client restored from the fd store) whose recorded
 * uid and pid are the peer's, and whose process is the same one (start
 * time). The session then holds the orphan (handlers->conns) while the claim
 * arrives in parts; each part is kept (struct hrejoin owns the envelopes)
 * until the last, when rejoin_accept() checks all of it and the session
 * becomes the client's transport. A refused claim closes the connection
 * and the orphan's memory goes back to the pool.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/size.h"
#include "common/wire.h"
#include "daemon/core/arb.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/core/proc.h"
#include "daemon/core/rejoin.h"
#include "daemon/core/walk.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/server.h"
#include "daemon/transport/sess.h"
#include "include/gmb.h"

#define HREJOIN_MAX_PARTS    1024
#define HREJOIN_MAX_HELD     (1u << 20)
#define HREJOIN_MAX_IMPORTS  (1u << 20)
#define HREJOIN_IDS_PER_PART 4096

static int handlers_rejoin_hello(struct hreq *rq, bool control);
static int handlers_send_hello_reply(struct hreq *rq, const struct bclient *c, bool rejoined);

/* A claim on its way in. */
struct hrejoin {
	struct bclient *c; /* the orphan; handlers->conns names the session */
	bool control;
	char group[WIRE_MAX_NAME + 1]; /* the hello's, given to the client at the end */
	int priority;
	bool preemptible;
	Gmb__Envelope **parts; /* owned */
	size_t nparts;
	uint64_t *ids; /* the claim's chunk ids, pieces joined; owned */
	size_t ntags, nallocs, nheld, nimports;
};

/* ---- hello ---- */

/* HelloReply for @c; @rejoined: it is an orphan coming back. */
static int handlers_send_hello_reply(struct hreq *rq, const struct bclient *c, bool rejoined)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__HelloReply hr = GMB__HELLO_REPLY__INIT;
	Gmb__DeviceInfo di[BACKEND_MAX_DEVICES], *pdi[BACKEND_MAX_DEVICES];
	const struct broker *br = rq->h->broker;

	handlers__devices(br, di, pdi);
	hr.version = GMB_PROTOCOL_VERSION;
	hr.client_id = c->id;
	hr.rejoined = rejoined;
	/* Nothing kept warm: clients let go of paused memory, and it goes to the driver. */
	hr.release_on_pause = br->opts.pool_keep == 0;
	hr.gives_back = true;
	hr.backend = (char *)br->backend->ops->name;
	hr.n_devices = (size_t)br->ndevices;
	hr.devices = pdi;
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_HELLO_REPLY;
	env.hello_reply = &hr;
	sess_send(rq->s, &env);
	return 0;
}

int handlers__hello(struct hreq *rq)
{
	const Gmb__Hello *m = rq->env->hello;
	struct sess *s = rq->s;
	const char *given = m->name ? m->name : "";
	struct broker_peer peer = { .pid = s->pid,
				    .uid = s->uid,
				    .gid = s->gid,
				    .groups = s->groups,
				    .ngroups = s->ngroups,
				    .start_time = proc_start_time(s->pid, NULL) };
	char name[WIRE_MAX_NAME + 1];
	struct bclient *c;
	int r;

	if (m->version != GMB_PROTOCOL_VERSION) {
		handlers__fail(rq, -EPROTO, "protocol version %u, gmbd speaks %d", m->version,
			       GMB_PROTOCOL_VERSION);
		handlers__reply_status(s, rq->env->id, -EPROTO, rq->err);
		sess_doom(s, LOG_LVL_NOTICE, "%s", rq->err);
		return 0;
	}
	r = handlers__check_name(rq, "the client name", given);
	if (r == 0)
		r = handlers__check_name(rq, "the group", m->group ? m->group : "");
	if (r < 0)
		return r;
	/* A tool holds no memory (memory.c), so it has none to claim back. */
	if (m->rejoin_id && m->tool)
		return handlers__fail(rq, -EPERM,
				      "a tool may not rejoin: it holds no memory to"
				      " claim back");
	if (m->rejoin_id)
		return handlers_rejoin_hello(rq, m->control);
	if (given[0])
		snprintf(name, sizeof(name), "%s", given);
	else
		snprintf(name, sizeof(name), "pid-%d", (int)s->pid);
	r = broker_client_add(rq->h->broker, &peer, name, m->control, m->tool, &c);
	if (r < 0)
		return handlers__fail(rq, r, "cannot register client '%s': %s", name, strerror(-r));
	if (handlers__conn_bind(rq->h, s, c) < 0) {
		broker_client_remove(rq->h->broker, c);
		return handlers__fail(rq, -ENOMEM, "cannot register client '%s': %s", name,
				      strerror(ENOMEM));
	}
	arb_client_set(c, m->group, m->priority, m->preemptible);
	/* Tools come and go all the time (gmbctl status): not worth a line. */
	log_at(m->tool ? LOG_LVL_DEBUG : LOG_LVL_INFO,
	       "client connected " SESS_FMT
	       " control=%d tool=%d group=%s priority=%d preemptible=%d",
	       SESS_ARGS(s), m->control ? 1 : 0, m->tool ? 1 : 0, c->group, c->priority,
	       c->preemptible ? 1 : 0);
	r = handlers_send_hello_reply(rq, c, false);
	if (!m->tool) {
		struct event ev = EVENT_INIT(EVENT_CONNECTED);

		handlers__event_client(&ev, s, c);
		ev.detail = m->control ? "control handler" : "no control handler";
		handlers__emit(rq->h, &ev);
	}
	return r;
}

/* The client's control handler came or went: status and control follow it. */
int handlers__control_state(struct hreq *rq)
{
	struct bclient *c = hconn_of(rq->s)->client;
	bool on = rq->env->control_state->control;

	if (c->control != on)
		log_info("control handler %s " SESS_FMT, on ? "installed" : "removed",
			 SESS_ARGS(rq->s));
	c->control = on;
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

/* ---- the rejoin hello ---- */

static int handlers_rejoin_check_peer(struct hreq *rq, const struct bclient *c)
{
	struct sess *s = rq->s;
	uint64_t st = proc_start_time(s->pid, NULL);

	if (c->uid != s->uid || c->pid != s->pid || (c->start_time && st && c->start_time != st))
		return handlers__fail(rq, -EPERM,
				      "client %" PRIu64 " was pid %d uid %u; this is"
				      " pid %d uid %u",
				      c->id, (int)c->pid, (unsigned)c->uid, (int)s->pid,
				      (unsigned)s->uid);
	if (!c->orphan)
		return handlers__fail(rq, -EALREADY, "client %" PRIu64 " is connected already",
				      c->id);
	if (handlers_sess_of(rq->h, c))
		return handlers__fail(rq, -EBUSY,
				      "client %" PRIu64 " is rejoining on another"
				      " connection",
				      c->id);
	return 0;
}

static int handlers_rejoin_hello(struct hreq *rq, bool control)
{
	struct sess *s = rq->s;
	struct broker_peer peer = { .pid = s->pid,
				    .uid = s->uid,
				    .gid = s->gid,
				    .groups = s->groups,
				    .ngroups = s->ngroups };
	uint64_t id = rq->env->hello->rejoin_id;
	struct bclient *c = broker_client_get(rq->h->broker, id);
	struct hrejoin *r;
	int rc;

	if (!c)
		return handlers__fail(rq, -ESTALE,
				      "gmbd has no record of client %" PRIu64 ": it"
				      " was restarted without its state, or reclaimed the client's"
				      " memory",
				      id);
	rc = handlers_rejoin_check_peer(rq, c);
	if (rc < 0)
		return rc;
	if (broker_client_set_creds(c, &peer) < 0)
		return handlers__fail(rq, -ENOMEM, "out of memory for a rejoin");
	r = calloc(1, sizeof(*r));
	if (!r || handlers__conn_bind(rq->h, rq->s, c) < 0) {
		free(r);
		return handlers__fail(rq, -ENOMEM, "out of memory for a rejoin");
	}
	*r = (struct hrejoin){ .c = c,
			       .control = control,
			       .priority = rq->env->hello->priority,
			       .preemptible = rq->env->hello->preemptible };
	snprintf(r->group, sizeof(r->group), "%s",
		 rq->env->hello->group ? rq->env->hello->group : "");
	hconn_of(rq->s)->rejoin = r;
	log_debug("client rejoining " SESS_FMT " as_id=%" PRIu64, SESS_ARGS(rq->s), id);
	return handlers_send_hello_reply(rq, c, true);
}

void handlers__rejoin_gone(struct handlers *h, struct sess *s)
{
	struct hrejoin *r = hconn_of(s)->rejoin;

	if (!r)
		return;
	for (size_t i = 0; i < r->nparts; i++)
		gmb__envelope__free_unpacked(r->parts[i], NULL);
	free(r->parts);
	free(r->ids);
	if (r->c)
		handlers__conn_unbind(h, r->c);
	free(r);
	hconn_of(s)->rejoin = NULL;
}

/* ---- the claim ---- */

static int handlers_rejoin_keep(struct hreq *rq, struct hrejoin *r)
{
	const Gmb__RejoinRequest *m = rq->env->rejoin;
	Gmb__Envelope **v;

	r->ntags += m->n_tags;
	r->nallocs += m->n_allocs;
	r->nheld += m->n_held_chunk_ids;
	r->nimports += m->n_imports;
	if (r->nparts >= HREJOIN_MAX_PARTS || r->ntags > BROKER_MAX_TAGS ||
	    r->nallocs > BROKER_MAX_ALLOCS || r->nheld > HREJOIN_MAX_HELD ||
	    r->nimports > HREJOIN_MAX_IMPORTS) {
		sess_protocol_error(rq->s,
				    "a rejoin claim over the limits (%zu parts, %zu tags,"
				    " %zu allocations, %zu handles, %zu imports)",
				    r->nparts + 1, r->ntags, r->nallocs, r->nheld, r->nimports);
		return -EPROTO;
	}
	v = realloc(r->parts, (r->nparts + 1) * sizeof(*v));
	if (!v)
		return handlers__fail(rq, -ENOMEM, "out of memory keeping the claim");
	r->parts = v;
	r->parts[r->nparts++] = rq->env;
	return 0;
}

/* Names in the claim are checked like every name a client sends. */
static int handlers_rejoin_names(struct hreq *rq, struct broker_claim *cl)
{
	int rc = 0;

	for (size_t i = 0; i < cl->ntags && rc == 0; i++)
		rc = handlers__check_name(rq, "a claimed tag", cl->tags[i].name);
	for (size_t i = 0; i < cl->nallocs && rc == 0; i++)
		rc = handlers__check_name(rq, "a claimed allocation's tag", cl->allocs[i].tag);
	return rc;
}

/* Chunk ids in every claimed allocation piece. */
static size_t handlers_rejoin_nids(const struct hrejoin *r)
{
	size_t n = 0;

	for (size_t p = 0; p < r->nparts; p++)
		for (size_t i = 0; i < r->parts[p]->rejoin->n_allocs; i++)
			n += r->parts[p]->rejoin->allocs[i]->n_chunk_ids;
	return n;
}

/*
 * One claimed allocation, or a piece continuing the one before (a lend too
 * long for one part): its ids go to r->ids, right after the previous
 * piece's, so that each allocation's list stays in one run.
 */
static int handlers_rejoin_alloc(struct hreq *rq, struct hrejoin *r, struct broker_claim *cl,
				 struct broker_claim_alloc *allocs, const Gmb__RejoinAlloc *a)
{
	struct broker_claim_alloc *prev = cl->nallocs ? &allocs[cl->nallocs - 1] : NULL;
	uint64_t *at = prev ? (uint64_t *)prev->chunk_ids + prev->nchunks : r->ids;

	if (a->n_chunk_ids)
		memcpy(at, a->chunk_ids, a->n_chunk_ids * sizeof(*at));
	if (a->first_chunk == 0) {
		allocs[cl->nallocs++] = (struct broker_claim_alloc){ .id = a->alloc_id,
								     .tag = a->tag ? a->tag : "",
								     .dev = a->device > INT32_MAX ?
										    -1 :
										    (int)a->device,
								     .size = a->size,
								     .mapped = a->mapped,
								     .chunk_ids = at,
								     .nchunks = a->n_chunk_ids };
		return 0;
	}
	if (!prev || prev->id != a->alloc_id || prev->nchunks != a->first_chunk) {
		return handlers__fail(rq, -EPROTO,
				      "claims a piece of allocation %" PRIu64
				      " from chunk %u out of order",
				      a->alloc_id, a->first_chunk);
	}
	prev->nchunks += a->n_chunk_ids;
	return 0;
}

/* The parts as one broker_claim; its arrays (not the strings) are malloc'd. */
static int handlers_rejoin_claim(struct hreq *rq, struct hrejoin *r, struct broker_claim *cl)
{
	struct broker_claim_tag *tags = calloc(r->ntags + 1, sizeof(*tags));
	struct broker_claim_alloc *allocs = calloc(r->nallocs + 1, sizeof(*allocs));
	uint64_t *held = calloc(r->nheld + 1, sizeof(*held));
	struct broker_claim_import *imports = calloc(r->nimports + 1, sizeof(*imports));

	*cl = (struct broker_claim){
		.tags = tags, .allocs = allocs, .held = held, .imports = imports
	};
	r->ids = calloc(handlers_rejoin_nids(r) + 1, sizeof(*r->ids));
	if (!tags || !allocs || !held || !imports || !r->ids)
		return handlers__fail(rq, -ENOMEM, "out of memory reading the claim");
	for (size_t p = 0; p < r->nparts; p++) {
		const Gmb__RejoinRequest *m = r->parts[p]->rejoin;

		for (size_t i = 0; i < m->n_tags; i++)
			tags[cl->ntags++] = (struct broker_claim_tag){
				.name = m->tags[i]->name ? m->tags[i]->name : "",
				.mode = (int)m->tags[i]->mode,
				.paused = m->tags[i]->paused
			};
		for (size_t i = 0; i < m->n_allocs; i++)
			if (handlers_rejoin_alloc(rq, r, cl, allocs, m->allocs[i]) < 0)
				return -EPROTO; /* rq->err says why */
		if (m->n_held_chunk_ids)
			memcpy(held + cl->nheld, m->held_chunk_ids,
			       m->n_held_chunk_ids * sizeof(*held));
		cl->nheld += m->n_held_chunk_ids;
		for (size_t i = 0; i < m->n_imports; i++)
			imports[cl->nimports++] =
				(struct broker_claim_import){ .export_id = m->imports[i]->export_id,
							      .alloc_id = m->imports[i]->alloc_id,
							      .opens = m->imports[i]->opens,
							      .unmapped = m->imports[i]->unmapped,
							      .idle = m->imports[i]->idle };
	}
	return handlers_rejoin_names(rq, cl);
}

static void handlers_rejoin_claim_free(struct broker_claim *cl)
{
	free((void *)cl->tags);
	free((void *)cl->allocs);
	free((void *)cl->held);
	free((void *)cl->imports);
}

/* RejoinReply in parts of at most HREJOIN_IDS_PER_PART ids of each kind. */
static void handlers_rejoin_reply(struct sess *s, uint64_t reply_to,
				  const struct broker_rejoin_result *res)
{
	size_t c = 0, d = 0;

	do {
		Gmb__Envelope env = GMB__ENVELOPE__INIT;
		Gmb__RejoinReply rr = GMB__REJOIN_REPLY__INIT;
		size_t nc = res->ncleared - c, nd = res->ndrop - d;

		rr.n_cleared_alloc_ids = nc < HREJOIN_IDS_PER_PART ? nc : HREJOIN_IDS_PER_PART;
		rr.cleared_alloc_ids = res->cleared + c;
		rr.n_drop_chunk_ids = nd < HREJOIN_IDS_PER_PART ? nd : HREJOIN_IDS_PER_PART;
		rr.drop_chunk_ids = res->drop + d;
		c += rr.n_cleared_alloc_ids;
		d += rr.n_drop_chunk_ids;
		env.reply_to = reply_to;
		env.more = c < res->ncleared || d < res->ndrop;
		env.body_case = GMB__ENVELOPE__BODY_REJOIN_REPLY;
		env.rejoin_reply = &rr;
		if (sess_send(s, &env) < 0)
			return;
	} while (c < res->ncleared || d < res->ndrop);
}

/* What a client holds, summed over its tags. */
struct hello_sum {
	size_t allocs;
	uint64_t bytes;
};

static int handlers_sum_tag(void *arg, const struct btag *t)
{
	struct hello_sum *sum = arg;

	sum->allocs += t->nallocs;
	sum->bytes += t->bytes;
	return 0;
}

static const struct walk_ops handlers_sum_ops = { .tag = handlers_sum_tag };

static void handlers_rejoin_attach(struct hreq *rq, struct hrejoin *r,
				   const struct broker_rejoin_result *res)
{
	struct bclient *c = r->c;
	struct hello_sum sum = { 0 };
	char b[SIZE_STR_MAX];

	c->control = r->control;
	arb_client_set(c, r->group, r->priority, r->preemptible);
	/* The entry exists since the rejoin hello: this cannot fail. */
	(void)handlers__conn_bind(rq->h, rq->s, c);
	r->c = NULL;
	walk_client(c, &handlers_sum_ops, &sum);
	log_info("client rejoined " SESS_FMT " allocations=%zu bytes=%s cleared=%zu dropped=%zu",
		 SESS_ARGS(rq->s), sum.allocs, size_str(sum.bytes, b), res->ncleared, res->ndrop);
}

/* The last part: check and apply the whole claim, or reclaim and hang up. */
/* A claim that could not be taken: answer, forget it, hang up. */
static void handlers_rejoin_fail(struct hreq *rq, uint64_t req, int rc)
{
	handlers__reply_status(rq->s, req, rc, rq->err);
	handlers__rejoin_gone(rq->h, rq->s);
	sess_doom(rq->s, LOG_LVL_WARNING, "rejoin refused: %s", rq->err);
}

/*
 * The last part: check and apply the whole claim, or hang up (a refused
 * claim also reclaims the orphan). rq->env is one of the parts: it is
 * freed with them, so its id is read first.
 */
static void handlers_rejoin_finish(struct hreq *rq, struct hrejoin *r)
{
	struct broker_rejoin_result res;
	struct broker_claim cl;
	struct bclient *c = r->c;
	uint64_t req = rq->env->id;
	char why[ERR_MSG_MAX];
	int rc;

	rc = handlers_rejoin_claim(rq, r, &cl);
	if (rc == 0)
		rc = rejoin_accept(rq->h->broker, c, &cl, &res, rq->err);
	handlers_rejoin_claim_free(&cl);
	if (rc == -ENOMEM) {
		handlers_rejoin_fail(rq, req, rc);
		return;
	}
	if (rc < 0) {
		snprintf(why, sizeof(why), "%s", rq->err);
		handlers__fail(rq, rc, "client '%s' (%" PRIu64 ") %s", c->name, c->id, why);
		handlers_rejoin_fail(rq, req, rc);
		rejoin_reclaim(rq->h->broker, c, "its claim was refused");
		handlers__changed(rq->h);
		return;
	}
	handlers_rejoin_attach(rq, r, &res);
	handlers__rejoin_gone(rq->h, rq->s);
	handlers_rejoin_reply(rq->s, req, &res);
	rejoin_result_deinit(&res);
	handlers__changed(rq->h);
}

int handlers__rejoin(struct hreq *rq)
{
	struct hrejoin *r = hconn_of(rq->s)->rejoin;
	bool last = rq->env->rejoin->last;
	int rc;

	rc = handlers_rejoin_keep(rq, r);
	if (rc == -EPROTO)
		return 0;
	if (rc < 0) {
		/* Not kept: the dispatcher answers and frees it; the claim is lost. */
		handlers__reply_status(rq->s, rq->env->id, rc, rq->err);
		handlers__rejoin_gone(rq->h, rq->s);
		sess_doom(rq->s, LOG_LVL_WARNING, "rejoin refused: %s", rq->err);
		return 0;
	}
	if (!last)
		handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	else
		handlers_rejoin_finish(rq, r);
	/* Kept in the claim (and freed with it), whatever happened since. */
	return HANDLERS_KEPT;
}

/* ---- stopping for good ---- */

void handlers_goodbye(struct handlers *h, struct server *srv, const char *reason)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__Bye bye = GMB__BYE__INIT;

	bye.reason = (char *)reason;
	env.body_case = GMB__ENVELOPE__BODY_BYE;
	env.bye = &bye;
	for (struct sess *s = server_sessions(srv); s; s = s->next)
		if (s->state == SESS_OPEN && hconn_of(s)->client)
			sess_send(s, &env);
}
