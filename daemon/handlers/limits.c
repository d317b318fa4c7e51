/*
 * limits.c - what one user's connections may hold of gmbd before any
 * request, and how gmbd says it refused something without flooding its log.
 *
 * Connections: one that never says hello is closed after --hello-timeout
 * (a wait of gmbd's, not read while replies are held, does not count); one
 * uid has at most --max-connections-per-uid open at once; and none is taken
 * that would eat into the fds gmbd keeps free for sending chunk fds
 * (broker.h: BROKER_FD_SPARE). Operators (root, gmbd's own uid, members of
 * --admin-group) must always be able to look and act, so they have a
 * reserve past both: HANDLERS_OPERATOR_CONNS connections more than their
 * uid's limit, and as many of the spare fds' margin. When a limit is
 * reached, an idle connection (a client that holds no memory, waits for
 * nothing and sent nothing for --hello-timeout) is closed to make room
 * before the new one is refused: of the same uid for the uid's limit; for
 * gmbd's fds the same uid's first, then any other's but an operator's
 * (unless the newcomer is one). At most HLIMITS_EVICT_PENDING such closes wait
 * for the reaper at once, so the fds they still hold stay within the
 * margin. Every open connection counts in the broker's fds_conns.
 *
 * Logging: a refusal of one kind from one source (a uid, a session) is
 * logged once at its level, then counted, and a line every
 * RATELOG_INTERVAL_MS says how many more came (common/ratelog.h). The
 * tick that says them is the one that checks the hello deadline.
 *
 * Every connection's hconn is on h->hconns from open to free; uid counts
 * live in h->uid_conns (key uid + 1, value the count), one for each hconn
 * with uid_counted. This file calls no other of the folder's.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

#include "common/list.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

#define HLIMITS_TICK_MS	      500
#define HLIMITS_EVICT_PENDING 8

static void handlers_on_limits_timer(uv_timer_t *t);

static uintptr_t handlers_uid_count(const struct handlers *h, uid_t uid)
{
	return (uintptr_t)idmap_get(&h->uid_conns, (uint64_t)uid + 1);
}

static void handlers_uid_uncount(struct handlers *h, uid_t uid)
{
	uintptr_t n = handlers_uid_count(h, uid);

	if (n > 1)
		idmap_put(&h->uid_conns, (uint64_t)uid + 1, (void *)(n - 1));
	else
		idmap_del(&h->uid_conns, (uint64_t)uid + 1);
}

/* The tick runs while a connection waits for its hello or a count waits. */
static void handlers_limits_arm(struct handlers *h)
{
	if (h->closed || uv_is_active((uv_handle_t *)&h->hello_timer))
		return;
	uv_timer_start(&h->hello_timer, handlers_on_limits_timer, HLIMITS_TICK_MS, HLIMITS_TICK_MS);
}

int handlers__limits_log_level(struct handlers *h, const char *what, uint64_t source,
			       const char *who, int level)
{
	bool first = ratelog_admit(&h->refusals, what, source, who, level, uv_now(h->loop));

	handlers_limits_arm(h);
	return first ? level : LOG_LVL_DEBUG;
}

/* Root, gmbd's own uid, or the admin group: who may always look and act. */
static bool handlers_limits_operator(const struct handlers *h, const struct sess *s)
{
	const struct broker_opts *o = &h->broker->opts;

	if (s->uid == 0 || s->uid == o->daemon_uid)
		return true;
	if (!o->have_admin_gid)
		return false;
	if (s->gid == o->admin_gid)
		return true;
	for (int i = 0; i < s->ngroups; i++)
		if (s->groups[i] == o->admin_gid)
			return true;
	return false;
}

/*
 * May gmbd take one more connection and keep the spare fds free (less
 * the operators' share of them for an operator)? Connections closed to
 * make room count as gone: they are, by the next loop turn.
 */
static bool handlers_limits_fds_ok(const struct handlers *h, bool op)
{
	const struct broker *br = h->broker;
	uint64_t keep = BROKER_FD_SPARE - (op ? HANDLERS_OPERATOR_CONNS : 0);

	if (!br->opts.fd_limit)
		return true;
	return br->fds_base + br->fds_conns - h->evicting + broker_chunk_fds(br) + 1 + keep <=
	       br->opts.fd_limit;
}

/* A connection that may go to make room: a client holding no memory,
 * waiting for nothing and quiet for --hello-timeout. */
static bool handlers_limits_idle(const struct handlers *h, const struct hconn *hc, uint64_t now)
{
	const struct bclient *c = hc->client;

	if (!c || hc->rejoin || hc->evicted || hc->watching || hc->sess->state != SESS_OPEN)
		return false;
	if (broker_client_nallocs(c) || c->handover || hc->inflight || hc->ctl_in ||
	    hc->dreqs.count)
		return false;
	return now - hc->sess->heard_ms >= h->hello_timeout_ms;
}

/* The connection quiet the longest that may go, of @uid (@same) or not. */
static struct hconn *handlers_limits_quietest(const struct handlers *h, uid_t uid, bool same,
					      bool op)
{
	uint64_t now = uv_now(h->loop);
	struct hconn *v = NULL;

	for (struct hconn *hc = h->hconns; hc; hc = hc->next) {
		if ((hc->uid == uid) != same || (!op && hc->op))
			continue;
		if (handlers_limits_idle(h, hc, now) &&
		    (!v || hc->sess->heard_ms < v->sess->heard_ms))
			v = hc;
	}
	return v;
}

/*
 * An idle connection to close for a new one of @uid (an operator's: @op):
 * its own uid's first, so that a flood churns its own connections; then,
 * when @any_uid, another uid's, but never an operator's for someone else.
 */
static struct hconn *handlers_limits_victim(const struct handlers *h, uid_t uid, bool any_uid,
					    bool op)
{
	struct hconn *v;

	if (!h->hello_timeout_ms || h->evicting >= HLIMITS_EVICT_PENDING)
		return NULL;
	v = handlers_limits_quietest(h, uid, true, true);
	if (!v && any_uid)
		v = handlers_limits_quietest(h, uid, false, op);
	return v;
}

/* Closes @v for a connection of @uid that a limit would refuse. */
static void handlers_limits_evict(struct handlers *h, struct hconn *v, uid_t uid)
{
	static const char what[] = "idle connection closed to make room for a new one";
	char who[64];
	int lvl;

	snprintf(who, sizeof(who), "uid=%u", (unsigned)v->uid);
	lvl = handlers__limits_log_level(h, what, v->uid, who, LOG_LVL_NOTICE);
	sess_doom(v->sess, lvl,
		  "%s: it held no memory and sent nothing for %llu s (--hello-timeout) for_uid=%u",
		  what, (unsigned long long)((uv_now(h->loop) - v->sess->heard_ms) / 1000),
		  (unsigned)uid);
	v->evicted = true;
	if (v->fd_counted)
		h->evicting++;
	if (v->uid_counted) {
		handlers_uid_uncount(h, v->uid);
		v->uid_counted = false;
	}
}

/* Room under --max-connections-per-uid for @s: 0 or -ECONNREFUSED, said. */
static int handlers_limits_uid_room(struct handlers *h, struct sess *s, bool op)
{
	uint64_t n = handlers_uid_count(h, s->uid), max = h->max_conns_per_uid;
	const char *what;
	struct hconn *v;
	char who[64];
	int lvl;

	if (!max || n < max || (op && n < max + HANDLERS_OPERATOR_CONNS))
		return 0;
	v = handlers_limits_victim(h, s->uid, false, op);
	if (v) {
		handlers_limits_evict(h, v, s->uid);
		return 0;
	}
	what = op ? "connection refused: the uid is past its connection limit"
		    " (--max-connections-per-uid) and the operators' reserve" :
		    "connection refused: the uid is at its connection limit"
		    " (--max-connections-per-uid)";
	snprintf(who, sizeof(who), "uid=%u limit=%llu", (unsigned)s->uid, (unsigned long long)max);
	lvl = handlers__limits_log_level(h, what, s->uid, who, LOG_LVL_NOTICE);
	log_at(lvl, "%s %s connections=%llu pid=%d", what, who, (unsigned long long)n, (int)s->pid);
	return -ECONNREFUSED;
}

/* Room in gmbd's open files for @s: 0 or -ECONNREFUSED, said. */
static int handlers_limits_fd_room(struct handlers *h, struct sess *s, bool op)
{
	static const char what[] = "connection refused: gmbd keeps its last open files"
				   " for sending chunk fds (RLIMIT_NOFILE)";
	const struct broker *br = h->broker;
	struct hconn *v;
	char who[64];
	int lvl;

	if (handlers_limits_fds_ok(h, op))
		return 0;
	v = handlers_limits_victim(h, s->uid, true, op);
	if (v) {
		handlers_limits_evict(h, v, s->uid);
		if (handlers_limits_fds_ok(h, op))
			return 0;
	}
	snprintf(who, sizeof(who), "uid=%u limit=%llu", (unsigned)s->uid,
		 (unsigned long long)br->opts.fd_limit);
	lvl = handlers__limits_log_level(h, what, s->uid, who, LOG_LVL_NOTICE);
	log_at(lvl, "%s %s chunk_fds=%llu connections=%llu pid=%d", what, who,
	       (unsigned long long)broker_chunk_fds(br), (unsigned long long)br->fds_conns,
	       (int)s->pid);
	return -ECONNREFUSED;
}

/* A new connection of @s->uid: 0, or -ECONNREFUSED past a limit (logged). */
int handlers__limits_open(struct handlers *h, struct sess *s, struct hconn *hc)
{
	bool op = handlers_limits_operator(h, s);
	uintptr_t n;
	int r;

	r = handlers_limits_uid_room(h, s, op);
	if (r == 0)
		r = handlers_limits_fd_room(h, s, op);
	if (r < 0)
		return r;
	n = handlers_uid_count(h, s->uid);
	r = idmap_put(&h->uid_conns, (uint64_t)s->uid + 1, (void *)(n + 1));
	if (r < 0)
		return r;
	*hc = (struct hconn){ .dreqs = IDMAP_INIT,
			      .h = h,
			      .uid = s->uid,
			      .sess = s,
			      .hello_from_ms = uv_now(h->loop),
			      .uid_counted = true,
			      .op = op };
	DLIST_PUSH(h->hconns, hc);
	h->broker->fds_conns++;
	hc->fd_counted = true;
	if (h->hello_timeout_ms)
		handlers_limits_arm(h);
	return 0;
}

/* At disconnect, on the loop, while the broker is certainly there: the last
 * unref (free_data) may come after gmbd freed it at shutdown. */
void handlers__limits_fd_closed(struct hconn *hc)
{
	if (!hc->fd_counted)
		return;
	hc->fd_counted = false;
	hc->h->broker->fds_conns--;
	if (hc->evicted)
		hc->h->evicting--;
}

/* @hc's session is freed: its uid counts one less. */
void handlers__limits_free(struct hconn *hc)
{
	struct handlers *h = hc->h;

	DLIST_UNLINK(h->hconns, hc);
	/* Only a session that failed before serving gets here uncounted. */
	handlers__limits_fd_closed(hc);
	if (hc->uid_counted)
		handlers_uid_uncount(h, hc->uid);
	if (!h->hconns && !h->closed && !ratelog_pending(&h->refusals))
		uv_timer_stop(&h->hello_timer);
}

/* Closes the connections that said nothing for --hello-timeout. */
static void handlers_limits_hello_check(struct handlers *h, uint64_t now)
{
	static const char what[] = "connection closed: no hello within --hello-timeout";

	for (struct hconn *hc = h->hconns, *next; hc; hc = next) {
		char who[32];

		next = hc->next;
		if (hc->client || hc->rejoin || hc->sess->state != SESS_OPEN)
			continue;
		/* Not read while replies are held: its hello may be waiting in
		 * the socket, and the wait is gmbd's. Its time starts again once
		 * it is read. */
		if (sess_read_paused(hc->sess))
			hc->hello_from_ms = now;
		if (now - hc->hello_from_ms < h->hello_timeout_ms)
			continue;
		snprintf(who, sizeof(who), "uid=%u", (unsigned)hc->uid);
		sess_doom(hc->sess,
			  handlers__limits_log_level(h, what, hc->uid, who, LOG_LVL_NOTICE),
			  "no hello within %llu s (--hello-timeout)",
			  (unsigned long long)(h->hello_timeout_ms / 1000));
	}
}

static void handlers_on_limits_timer(uv_timer_t *t)
{
	struct handlers *h = t->data;
	uint64_t now = uv_now(h->loop);

	ratelog_tick(&h->refusals, now);
	if (h->hello_timeout_ms)
		handlers_limits_hello_check(h, now);
	if ((!h->hconns || !h->hello_timeout_ms) && !ratelog_pending(&h->refusals))
		uv_timer_stop(t);
}

void handlers__limits_close(struct handlers *h)
{
	ratelog_flush(&h->refusals, uv_now(h->loop));
}
