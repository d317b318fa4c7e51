/*
 * limits.c - what one user's connections may hold of gmbd before any
 * request: a connection that never says hello is closed after
 * --hello-timeout (a wait of gmbd's, not read while replies are held, does
 * not count), one uid has at most --max-connections-per-uid open at once,
 * and none is taken that would eat into the fds gmbd keeps free for
 * sending chunk fds (broker.h: BROKER_FD_SPARE); the next is closed at
 * accept. Each is logged once at notice (then at debug), so that a flood
 * does not flood the journal too. Every open connection counts in the
 * broker's fds_conns.
 *
 * Every connection's hconn is on h->hconns from open to free; uid counts
 * live in h->uid_conns (key uid + 1, value the count).
 */
#include <errno.h>
#include <stdint.h>

#include "common/list.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

#define HLIMITS_TICK_MS 500

static void handlers_on_hello_timer(uv_timer_t *t);

static uintptr_t handlers_uid_count(const struct handlers *h, uid_t uid)
{
	return (uintptr_t)idmap_get(&h->uid_conns, (uint64_t)uid + 1);
}

/* A new connection of @s->uid: 0, or -EMFILE past the uid's limit or gmbd's fds. */
int handlers__limits_open(struct handlers *h, struct sess *s, struct hconn *hc)
{
	uintptr_t n = handlers_uid_count(h, s->uid);
	int r;

	if (!broker_fds_can_open(h->broker)) {
		log_at(h->fds_logged ? LOG_LVL_DEBUG : LOG_LVL_NOTICE,
		       "connection refused: gmbd keeps its last open files for sending chunk"
		       " fds uid=%u limit=%llu chunk_fds=%llu connections=%llu (logged once)",
		       (unsigned)s->uid, (unsigned long long)h->broker->opts.fd_limit,
		       (unsigned long long)broker_chunk_fds(h->broker),
		       (unsigned long long)h->broker->fds_conns);
		h->fds_logged = true;
		return -EMFILE;
	}

	if (h->max_conns_per_uid && n >= h->max_conns_per_uid) {
		log_at(h->limit_logged ? LOG_LVL_DEBUG : LOG_LVL_NOTICE,
		       "connection refused: uid %u has %u connections open"
		       " (--max-connections-per-uid; logged once)",
		       (unsigned)s->uid, (unsigned)n);
		h->limit_logged = true;
		return -EMFILE;
	}
	r = idmap_put(&h->uid_conns, (uint64_t)s->uid + 1, (void *)(n + 1));
	if (r < 0)
		return r;
	*hc = (struct hconn){ .dreqs = IDMAP_INIT,
			      .h = h,
			      .uid = s->uid,
			      .sess = s,
			      .hello_from_ms = uv_now(h->loop) };
	DLIST_PUSH(h->hconns, hc);
	h->broker->fds_conns++;
	hc->fd_counted = true;
	if (h->hello_timeout_ms && !uv_is_active((uv_handle_t *)&h->hello_timer))
		uv_timer_start(&h->hello_timer, handlers_on_hello_timer, HLIMITS_TICK_MS,
			       HLIMITS_TICK_MS);
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
}

/* @hc's session is freed: its uid counts one less. */
void handlers__limits_free(struct hconn *hc)
{
	struct handlers *h = hc->h;
	uintptr_t n = handlers_uid_count(h, hc->uid);

	DLIST_UNLINK(h->hconns, hc);
	/* Only a session that failed before serving gets here uncounted. */
	handlers__limits_fd_closed(hc);
	if (n > 1)
		idmap_put(&h->uid_conns, (uint64_t)hc->uid + 1, (void *)(n - 1));
	else
		idmap_del(&h->uid_conns, (uint64_t)hc->uid + 1);
	if (!h->hconns && !h->closed)
		uv_timer_stop(&h->hello_timer);
}

/* Closes the connections that said nothing for --hello-timeout. */
static void handlers_on_hello_timer(uv_timer_t *t)
{
	struct handlers *h = t->data;
	uint64_t now = uv_now(h->loop);

	for (struct hconn *hc = h->hconns, *next; hc; hc = next) {
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
		sess_doom(hc->sess, h->hello_logged ? LOG_LVL_DEBUG : LOG_LVL_NOTICE,
			  "no hello within %llu s (--hello-timeout; logged once)",
			  (unsigned long long)(h->hello_timeout_ms / 1000));
		h->hello_logged = true;
	}
}
