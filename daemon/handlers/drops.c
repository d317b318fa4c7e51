/*
 * drops.c - requests gmbd sends to clients, and the first kind of them:
 * DropRequests (the core wants handles back) and their acks.
 *
 * Each daemon request gets an id from the target connection's counter and
 * an entry in its dreqs map until the client's last reply part arrives; a
 * reply to an id not in the map is a protocol error (handlers.c). Control
 * commands (control.c) use the same table.
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

static int handlers_send_drop(struct handlers *h, struct sess *s, const uint64_t *ids, size_t n);

int handlers__dreq_add(struct sess *s, struct hdreq *d, uint64_t *id)
{
	struct hconn *hc = hconn_of(s);
	int r = idmap_put(&hc->dreqs, hc->next_req_id + 1, d);

	if (r < 0)
		return r;
	*id = ++hc->next_req_id;
	return 0;
}

void handlers__dreq_free(struct hdreq *d)
{
	if (!d)
		return;
	free(d->ids);
	free(d->tag);
	free(d);
}

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
		const struct chunk *ch = idmap_get(&h->broker->chunks, ids[i]);

		ev.bytes += ch ? ch->size : 0;
	}
	handlers__emit(h, &ev);
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
	struct hconn *hc = hconn_of(s);
	struct hdreq *d;
	uint64_t id;
	int r = -ENOMEM;

	if (hc->dreqs.count >= HANDLERS_MAX_DREQS) {
		sess_doom(s, LOG_LVL_WARNING, "%zu requests of gmbd unanswered", hc->dreqs.count);
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
	r = handlers__dreq_add(s, d, &id);
	if (r < 0)
		goto err_free;
	env.id = id;
	env.body_case = GMB__ENVELOPE__BODY_DROP;
	env.drop = &dr;
	dr.n_chunk_ids = n;
	dr.chunk_ids = (uint64_t *)ids;
	return sess_send(s, &env);

err_free:
	handlers__dreq_free(d);
err_doom:
	/* The core counts the drop as sent: a client that never gets it would
	 * pin that memory, so it goes (and the memory comes back). */
	sess_doom(s, LOG_LVL_ERR, "out of memory asking it to drop %zu handles", n);
	return r;
}

bool handlers__drop_acked(struct handlers *h, struct sess *s, struct hdreq *d, int status,
			  const char *error)
{
	if (status != 0) {
		/* Its handles stay, so the memory is not back: it returns when
		 * the client goes. */
		log_warn("client refused to drop handles " SESS_FMT " chunks=%zu status=%d"
			 " error=\"%s\"",
			 SESS_ARGS(s), d->nids, status, error ? error : "");
		return false;
	}
	broker_dropped(h->broker, hconn_of(s)->client, d->ids, d->nids);
	return true;
}

/* ---- control commands of gmbd's own: switches and preemption ---- */

int handlers__send_command(struct sess *s, struct hdreq *d, int op, const char *tag,
			   uint32_t wait_ms)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlCommand cc = GMB__CONTROL_COMMAND__INIT;
	uint64_t id;
	int r;

	if (hconn_of(s)->dreqs.count >= HANDLERS_MAX_DREQS)
		return -EBUSY;
	r = handlers__dreq_add(s, d, &id);
	if (r < 0)
		return r;
	env.id = id;
	env.body_case = GMB__ENVELOPE__BODY_CONTROL_CMD;
	env.control_cmd = &cc;
	cc.op = (Gmb__Op)op;
	cc.tag = (char *)tag;
	cc.wait_ms = wait_ms;
	/* A failed send dooms the client; its disconnect completes the entry. */
	sess_send(s, &env);
	return 0;
}

void handlers__send_preempt(struct handlers *h, struct bclient *victim, const struct bclient *for_c,
			    int dev, uint64_t need)
{
	struct sess *s = handlers__conn_client(h, victim);
	struct hdreq *d = calloc(1, sizeof(*d));

	if (!s || s->state != SESS_OPEN || !d)
		goto err_undo;
	*d = (struct hdreq){ .kind = HDREQ_PREEMPT, .for_client = for_c->id };
	if (handlers__send_command(s, d, GMB__OP__OP_PAUSE, "", 0) < 0)
		goto err_undo;
	log_notice("client preempted " SESS_FMT " for=%s for_id=%llu for_priority=%d"
		   " priority=%d device=%d need=%llu",
		   SESS_ARGS(s), for_c->name, (unsigned long long)for_c->id, for_c->priority,
		   victim->priority, dev, (unsigned long long)need);
	return;

err_undo:
	free(d);
	arb_preempt_done(victim);
}

void handlers__preempt_answered(struct handlers *h, struct sess *s, struct hdreq *d, int status,
				const char *error)
{
	struct bclient *c = hconn_of(s)->client;

	if (c)
		arb_preempt_done(c);
	if (status == 0)
		log_info("client paused for preemption " SESS_FMT " for_id=%llu", SESS_ARGS(s),
			 (unsigned long long)d->for_client);
	else
		log_warn("client refused preemption " SESS_FMT " for_id=%llu status=%d"
			 " error=\"%s\"",
			 SESS_ARGS(s), (unsigned long long)d->for_client, status,
			 error ? error : "");
}
