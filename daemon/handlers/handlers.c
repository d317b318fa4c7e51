/*
 * handlers.c - the top of the handlers: the one dispatch table, the checks
 * every envelope passes, replies to gmbd's own requests (handed to dreq.c,
 * which completes them), and the callbacks the transport calls
 * (handlers_sess_ops). The handlers of each message family live in their
 * own file (internal.h lists them).
 *
 * Every envelope passes handlers_recv(), which checks what the protocol
 * requires of it (an id, hello first, a body a client may send), runs the
 * handler of its body case from handlers_table, and frees it on its one
 * exit path unless a parked request took it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/size.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/core/import.h"
#include "daemon/core/proc.h"
#include "daemon/core/rejoin.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"
#include "include/gmb.h"

/* Handler flags. */
#define H_SETTLE   0x1 /* may free memory or queue drops: settle afterwards */
#define H_INFLIGHT 0x2 /* may be parked or forwarded: counts in flight */
#define H_STATE	   0x4 /* may change the broker's record */

struct handler {
	const char *name;
	handlers_fn fn; /* NULL: not a body a client may send */
	unsigned flags;
};

static const struct handler *handlers_lookup(int body_case);
static int handlers_check(struct hreq *rq, const struct handler *hd);
static void handlers_daemon_reply(struct hreq *rq);
static int handlers_open(void *arg, struct sess *s, void **data);
static void handlers_recv(void *arg, struct sess *s, Gmb__Envelope *env);
static void handlers_gone(void *arg, struct sess *s);
static void handlers_free_data(void *data);
static int handlers_export_fds(void *arg, const uint64_t *ids, size_t n, int *fds);
static const char *handlers_body_name(int body_case);

const struct sess_ops handlers_sess_ops = {
	.open = handlers_open,
	.recv = handlers_recv,
	.gone = handlers_gone,
	.free_data = handlers_free_data,
	.export_fds = handlers_export_fds,
	.undeliverable = handlers__undeliverable,
	.body_name = handlers_body_name,
};

static const struct handler handlers_table[] = {
	[GMB__ENVELOPE__BODY__NOT_SET] = { "none", NULL, 0 },
	[GMB__ENVELOPE__BODY_HELLO] = { "hello", handlers__hello, H_STATE },
	[GMB__ENVELOPE__BODY_HELLO_REPLY] = { "hello_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_ALLOC] = { "alloc", handlers__alloc, H_SETTLE | H_INFLIGHT | H_STATE },
	[GMB__ENVELOPE__BODY_ALLOC_REPLY] = { "alloc_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_FREE] = { "free", handlers__free, H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_TAG_MODE] = { "tag_mode", handlers__tag_mode, H_STATE },
	[GMB__ENVELOPE__BODY_PAUSE] = { "pause", handlers__pause, H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_PAUSE_REPLY] = { "pause_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_RESUME] = { "resume", handlers__resume,
					 H_SETTLE | H_INFLIGHT | H_STATE },
	[GMB__ENVELOPE__BODY_RESUME_REPLY] = { "resume_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_STATUS_REQ] = { "status", handlers__status, 0 },
	[GMB__ENVELOPE__BODY_STATUS_REPLY] = { "status_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_CONTROL] = { "control", handlers__control, H_INFLIGHT },
	[GMB__ENVELOPE__BODY_CONTROL_CMD] = { "control_cmd", NULL, 0 },
	[GMB__ENVELOPE__BODY_DROP] = { "drop", NULL, 0 },
	[GMB__ENVELOPE__BODY_TRIM] = { "trim", handlers__trim, H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_TRIM_REPLY] = { "trim_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_REJOIN] = { "rejoin", handlers__rejoin, H_SETTLE },
	[GMB__ENVELOPE__BODY_REJOIN_REPLY] = { "rejoin_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_BYE] = { "bye", NULL, 0 },
	[GMB__ENVELOPE__BODY_SWITCH_REQ] = { "switch", handlers__switch,
					     H_SETTLE | H_INFLIGHT | H_STATE },
	[GMB__ENVELOPE__BODY_SWITCH_REPLY] = { "switch_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_PRIORITY] = { "priority", handlers__priority, H_SETTLE },
	[GMB__ENVELOPE__BODY_CONTROL_STATE] = { "control_state", handlers__control_state, H_STATE },
	[GMB__ENVELOPE__BODY_WATCH] = { "watch", handlers__watch, 0 },
	[GMB__ENVELOPE__BODY_WATCH_EVENT] = { "watch_event", NULL, 0 },
	/* A handle or an open leaves only once the record has it (restart without loss). */
	[GMB__ENVELOPE__BODY_IPC_EXPORT] = { "ipc_export", handlers__ipc_export, H_STATE },
	[GMB__ENVELOPE__BODY_IPC_EXPORT_REPLY] = { "ipc_export_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_IPC_OPEN] = { "ipc_open", handlers__ipc_open, H_STATE },
	[GMB__ENVELOPE__BODY_IPC_OPEN_REPLY] = { "ipc_open_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_IPC_CLOSE] = { "ipc_close", handlers__ipc_close, H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_IPC_FOLLOW] = { "ipc_follow", NULL, 0 },
	[GMB__ENVELOPE__BODY_IPC_RESUMED] = { "ipc_resumed", handlers__ipc_resumed, H_INFLIGHT },
	[GMB__ENVELOPE__BODY_IPC_GRANT] = { "ipc_grant", handlers__ipc_grant, H_STATE },
	/* A version superseded or dropped may give memory back: waiters are retried. */
	[GMB__ENVELOPE__BODY_OBJECT_PUBLISH] = { "object_publish", handlers__object_publish,
						 H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_OBJECT_PUBLISH_REPLY] = { "object_publish_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_OBJECT_OPEN] = { "object_open", handlers__object_open, 0 },
	[GMB__ENVELOPE__BODY_OBJECT_OPEN_REPLY] = { "object_open_reply", NULL, 0 },
	[GMB__ENVELOPE__BODY_OBJECT_DROP] = { "object_drop", handlers__object_drop,
					      H_SETTLE | H_STATE },
	[GMB__ENVELOPE__BODY_OBJECT_GRANT] = { "object_grant", handlers__object_grant, H_STATE },
	[GMB__ENVELOPE__BODY_OBJECT_PAUSE] = { "object_pause", handlers__object_pause,
					       H_SETTLE | H_INFLIGHT | H_STATE },
};

#define HANDLERS_N (sizeof(handlers_table) / sizeof(handlers_table[0]))

int handlers_init(struct handlers *h, uv_loop_t *loop, struct broker *br,
		  uint64_t control_timeout_ms)
{
	int r;

	*h = (struct handlers){ .loop = loop,
				.broker = br,
				.control_timeout_ms = control_timeout_ms,
				.park_timeout_ms = HANDLERS_PARK_TIMEOUT_MS };
	r = uv_timer_init(loop, &h->park_timer);
	if (r < 0)
		return r;
	h->park_timer.data = h;
	/* Cannot fail once the first one did not. */
	uv_timer_init(loop, &h->orphan_timer);
	h->orphan_timer.data = h;
	uv_timer_init(loop, &h->hello_timer);
	h->hello_timer.data = h;
	uv_timer_init(loop, &h->watch_timer);
	h->watch_timer.data = h;
	uv_timer_init(loop, &h->dreq_timer);
	h->dreq_timer.data = h;
	h->settle = handlers__settle;
	return 0;
}

void handlers_close(struct handlers *h)
{
	if (h->closed)
		return;
	h->closed = true;
	handlers__switch_close_all(h);
	handlers__ipc_cancel(h, NULL);
	handlers__ipc_rounds_gone(h, NULL);
	idmap_deinit(&h->conns);
	while (h->nwatchers)
		handlers__watch_gone(h, h->watchers[h->nwatchers - 1]);
	uv_close((uv_handle_t *)&h->park_timer, NULL);
	uv_close((uv_handle_t *)&h->orphan_timer, NULL);
	handlers__limits_close(h);
	uv_close((uv_handle_t *)&h->hello_timer, NULL);
	uv_close((uv_handle_t *)&h->watch_timer, NULL);
	uv_close((uv_handle_t *)&h->dreq_timer, NULL);
	idmap_deinit(&h->uid_conns);
}

static const char *handlers_body_name(int body_case)
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

static void handlers_recv(void *arg, struct sess *s, Gmb__Envelope *env)
{
	struct handlers *h = arg;
	struct hconn *hc = hconn_of(s);
	struct hreq rq = { .h = h, .s = s, .env = env, .short_dev = -1, .start_ns = uv_hrtime() };
	const struct handler *hd = handlers_lookup(env->body_case);
	int r;

	if (env->reply_to) {
		handlers_daemon_reply(&rq);
		goto out_free;
	}
	if (handlers_check(&rq, hd) < 0)
		goto out_free;
	if ((hd->flags & H_INFLIGHT) && hc->inflight >= WIRE_MAX_INFLIGHT) {
		handlers__fail(&rq, -EAGAIN, "client '%s' has %u requests in flight, the limit",
			       sess_name(s), hc->inflight);
		handlers__refused(h, s, hd->name, -EAGAIN, rq.err);
		handlers__reply_status(s, env->id, -EAGAIN, rq.err);
		goto out_free;
	}
	r = hd->fn(&rq);
	if (r == HANDLERS_KEPT)
		env = NULL; /* the handler's now (or freed already) */
	if (r == HANDLERS_PARK) {
		r = handlers__park(&rq, hd->fn);
		if (r == 0)
			env = NULL; /* the parked request owns it now */
	}
	if (r < 0) {
		handlers__refused(h, s, hd->name, r, rq.err);
		handlers__reply_status(s, rq.env->id, r, rq.err);
	}
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
	struct hconn *hc = hconn_of(s);
	const char *name = hd ? hd->name : "unknown";

	if (rq->env->id == 0) {
		sess_protocol_error(s, "a %s request without an id", name);
		return -EPROTO;
	}
	if (!hd || !hd->fn) {
		sess_protocol_error(s, "a client may not send a %s message", name);
		return -EPROTO;
	}
	if (hc->rejoin && rq->env->body_case != GMB__ENVELOPE__BODY_REJOIN) {
		sess_protocol_error(s, "a %s before the rejoin claim is complete", name);
		return -EPROTO;
	}
	if (!hc->rejoin && rq->env->body_case == GMB__ENVELOPE__BODY_REJOIN) {
		sess_protocol_error(s, "a rejoin claim without a rejoin hello");
		return -EPROTO;
	}
	if (!hc->client && !hc->rejoin && rq->env->body_case != GMB__ENVELOPE__BODY_HELLO) {
		sess_protocol_error(s, "the first request must be hello, not %s", name);
		return -EPROTO;
	}
	if ((hc->client || hc->rejoin) && rq->env->body_case == GMB__ENVELOPE__BODY_HELLO) {
		sess_protocol_error(s, "a second hello");
		return -EPROTO;
	}
	return 0;
}

/* A client's reply to a request of gmbd: dreq.c completes the request; an
 * answer that gives memory back (a drop's) is settled here, as H_SETTLE and
 * H_STATE would have a request's. */
static void handlers_daemon_reply(struct hreq *rq)
{
	unsigned flags = handlers__dreq_reply(rq->s, rq->env);

	if (flags & HDREQ_SETTLE)
		handlers__settle(rq->h);
	if (flags & HDREQ_STATE)
		handlers__changed(rq->h);
}

/* ---- the transport's callbacks ---- */

static int handlers_open(void *arg, struct sess *s, void **data)
{
	struct hconn *hc = calloc(1, sizeof(*hc));
	int r;

	if (!hc)
		return -ENOMEM;
	r = handlers__limits_open(arg, s, hc);
	if (r < 0) {
		free(hc);
		return r;
	}
	*data = hc;
	return 0;
}

static void handlers_free_data(void *data)
{
	struct hconn *hc = data;

	handlers__limits_free(hc);
	idmap_deinit(&hc->dreqs);
	free(hc);
}

static int handlers_export_fds(void *arg, const uint64_t *ids, size_t n, int *fds)
{
	struct handlers *h = arg;

	return broker_export_fds(h->broker, ids, n, fds);
}

/*
 * gmbd ended @s (a limit, bad input, a reply it could not build) while its
 * process lives and may map what it was lent: that memory must not go to
 * anyone else. The client becomes an orphan, as after a restart, reclaimed
 * once its process is gone or after the grace period; libgmb reconnects
 * and rejoins. Return: whether @c was kept.
 */
static bool handlers_keep_orphan(struct handlers *h, struct sess *s, struct bclient *c)
{
	if (h->handover || h->closed || !s->doomed || s->peer_closed || c->tool ||
	    (broker_client_nallocs(c) == 0 && !import_client_opens(h->broker, c)) ||
	    !proc_alive(c->pid, c->start_time))
		return false;
	log_notice("client kept as an orphan " SESS_FMT " allocations=%zu grace_s=%" PRIu64,
		   SESS_ARGS(s), broker_client_nallocs(c), h->orphan_grace_ms / 1000);
	handlers__conn_unbind(h, c);
	hconn_of(s)->client = NULL;
	sess_set_name(s, NULL, 0);
	rejoin_orphan(h->broker, c);
	handlers__orphan_watch(h, c);
	handlers__settle(h);
	handlers__changed(h);
	return true;
}

static void handlers_gone(void *arg, struct sess *s)
{
	struct handlers *h = arg;
	struct hconn *hc = hconn_of(s);
	struct event ev = EVENT_INIT(EVENT_GONE);
	uint64_t bytes = 0, chunks = 0;
	char b[SIZE_STR_MAX];

	handlers__limits_fd_closed(hc);
	handlers__watch_gone(h, s);
	handlers__park_cancel(h, s);
	handlers__ipc_cancel(h, s);
	handlers__ipc_rounds_gone(h, s);
	handlers__dreqs_gone(s);
	handlers__control_gone(s);
	handlers__rejoin_gone(h, s);
	if (!hc->client) {
		log_debug("connection closed pid=%d uid=%u", (int)s->pid, (unsigned)s->uid);
		return;
	}
	if (handlers_keep_orphan(h, s, hc->client))
		return;
	broker_client_usage(hc->client, "", &bytes, &chunks);
	if (h->handover)
		log_debug("client left for the next gmbd " SESS_FMT, SESS_ARGS(s));
	else
		log_at(hc->client->tool ? LOG_LVL_DEBUG : LOG_LVL_INFO,
		       "client disconnected " SESS_FMT " returned=%s chunks=%" PRIu64, SESS_ARGS(s),
		       size_str(bytes, b), chunks);
	if (!hc->client->tool && !h->handover) {
		handlers__event_client(&ev, s, hc->client);
		ev.bytes = bytes;
		handlers__emit(h, &ev);
	}
	handlers__conn_unbind(h, hc->client);
	broker_client_remove(h->broker, hc->client);
	hc->client = NULL;
	sess_set_name(s, NULL, 0);
	handlers__settle(h);
	handlers__changed(h);
}
