/*
 * drops.c - gmbd's own requests to clients, two kinds of daemon request
 * (dreq.c): DropRequests (the core wants handles back) and their acks, and
 * preemption (pause every tag so that a request of higher priority may be
 * served). Neither has a deadline nor an initiator that may go: a drop
 * waits for its ack or for the client to go, which frees its holds too.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/arb.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

static int handlers_send_drop(struct sess *s, const uint64_t *ids, size_t n);

void handlers__send_drops(void *arg, struct bclient *c, const uint64_t *ids, size_t n)
{
	struct handlers *h = arg;
	struct sess *s = handlers__conn_client(arg, c);
	struct event ev = EVENT_INIT(EVENT_DROP);

	/* A doomed client is removed on the next loop turn, which forgets
	 * its holds: nothing is owed to it. */
	if (!s || s->state != SESS_OPEN)
		return;
	handlers__event_client(&ev, s, c);
	for (size_t i = 0; i < n; i++) {
		const struct chunk *ch = broker_chunk_get(h->broker, ids[i]);

		ev.bytes += ch ? ch->size : 0;
	}
	handlers__emit(h, &ev);
	for (size_t off = 0; off < n; off += HANDLERS_DROP_BATCH) {
		size_t k = n - off < HANDLERS_DROP_BATCH ? n - off : HANDLERS_DROP_BATCH;

		if (handlers_send_drop(s, ids + off, k) < 0)
			return;
	}
}

static int handlers_send_drop(struct sess *s, const uint64_t *ids, size_t n)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__DropRequest dr = GMB__DROP_REQUEST__INIT;
	struct hdreq *d = handlers__dreq_new(HDREQ_DROP, NULL);
	int r = -ENOMEM;

	if (!d || !(d->ids = malloc(n * sizeof(*d->ids))))
		goto err_free;
	memcpy(d->ids, ids, n * sizeof(*d->ids));
	d->nids = n;
	env.body_case = GMB__ENVELOPE__BODY_DROP;
	env.drop = &dr;
	dr.n_chunk_ids = n;
	dr.chunk_ids = (uint64_t *)ids;
	r = handlers__dreq_send(s, d, &env, 0);
	if (r == 0)
		return 0;

err_free:
	handlers__dreq_free(d);
	/* The core counts the drop as sent: a client that never gets it would
	 * pin that memory, so it goes (and the memory comes back). */
	if (r == -EBUSY)
		sess_doom(s, LOG_LVL_WARNING, "%zu requests of gmbd unanswered",
			  hconn_of(s)->dreqs.count);
	else if (r != -EPIPE)
		sess_doom(s, LOG_LVL_ERR, "out of memory asking it to drop %zu handles", n);
	return r;
}

void handlers__drop_done(struct hdreq *d, const struct hdreq_result *res)
{
	struct sess *s = d->target;
	struct bclient *c = hconn_of(s)->client;

	if (res->end == HDREQ_REFUSED) {
		/* Its handles stay, so the memory is not back: it returns when
		 * the client goes. */
		log_warn("client refused to drop handles " SESS_FMT " chunks=%zu status=%d"
			 " error=\"%s\"",
			 SESS_ARGS(s), d->nids, res->status, res->error);
		return;
	}
	/* Gone: the client's removal (or its orphan's reclaim) lets go of
	 * its holds; the caller settles once the memory is back. */
	if (res->end == HDREQ_ANSWERED && c)
		broker_dropped(d->h->broker, c, d->ids, d->nids);
}

/* ---- preemption ---- */

void handlers__send_preempt(struct handlers *h, struct bclient *victim, const struct bclient *for_c,
			    int dev, uint64_t need)
{
	struct sess *s = handlers__conn_client(h, victim);
	struct hdreq *d = handlers__dreq_new(HDREQ_PREEMPT, NULL);

	if (!s || !d)
		goto err_undo;
	d->for_client = for_c->id;
	if (handlers__dreq_command(s, d, GMB__OP__OP_PAUSE, "", 0, 0) < 0)
		goto err_undo;
	log_notice("client preempted " SESS_FMT " for=%s for_id=%llu for_priority=%d"
		   " priority=%d device=%d need=%llu",
		   SESS_ARGS(s), for_c->name, (unsigned long long)for_c->id, for_c->priority,
		   victim->priority, dev, (unsigned long long)need);
	return;

err_undo:
	handlers__dreq_free(d);
	arb_preempt_done(victim);
}

void handlers__preempt_done(struct hdreq *d, const struct hdreq_result *res)
{
	struct sess *s = d->target;
	struct bclient *c = hconn_of(s)->client;

	/* Gone too: a client kept as an orphan may be preempted again once back. */
	if (c)
		arb_preempt_done(c);
	if (res->end == HDREQ_ANSWERED)
		log_info("client paused for preemption " SESS_FMT " for_id=%llu", SESS_ARGS(s),
			 (unsigned long long)d->for_client);
	else if (res->end == HDREQ_REFUSED)
		log_warn("client refused preemption " SESS_FMT " for_id=%llu status=%d"
			 " error=\"%s\"",
			 SESS_ARGS(s), (unsigned long long)d->for_client, res->status, res->error);
}
