/*
 * server.c - accepting connections and disconnecting doomed sessions.
 *
 * The listening fd is polled with a uv_poll_t (SOCK_SEQPACKET has no libuv
 * stream type) and drained with accept4() in bounded batches. When the
 * process runs out of fds, polling the listener would spin (the pending
 * connection keeps it readable), so accepting pauses and a timer resumes it.
 */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/transport/server.h"
#include "daemon/transport/sess.h"

static void server_on_listen(uv_poll_t *poll, int status, int events);
static void server_accept_failed(struct server *srv, int err);
static void server_on_emfile_timer(uv_timer_t *timer);
static void server_on_reap(uv_timer_t *timer);
static void server_close_handles(struct server *srv);
static void server_on_uncork(uv_check_t *check);
static void server_on_retry(uv_timer_t *timer);
static int server_settle(struct sess_host *host);
static void server_on_closed(uv_handle_t *handle);
static void server_reap_later(struct sess_host *host);
static void server_busy(struct sess_host *host);
static void server_on_spin(uv_idle_t *idle);

int server_start(uv_loop_t *loop, int listen_fd, const struct sess_ops *ops, void *arg,
		 struct server **out)
{
	struct server *srv;
	int r;

	srv = calloc(1, sizeof(*srv));
	if (!srv) {
		r = -ENOMEM;
		goto err_close_fd;
	}
	*srv = (struct server){
		.loop = loop,
		.listen_fd = -1,
		.host = { .loop = loop, .ops = ops, .arg = arg, .reap_later = server_reap_later }
	};
	/* Timer init cannot fail; the handles count from here on. */
	uv_timer_init(loop, &srv->emfile_timer);
	uv_timer_init(loop, &srv->reap_timer);
	srv->emfile_timer.data = srv;
	srv->reap_timer.data = srv;
	srv->open_handles = 2;
	if (listen_fd >= 0) {
		r = uv_poll_init(loop, &srv->listen, listen_fd);
		if (r < 0)
			goto err_close_handles;
		srv->listen.data = srv;
		srv->open_handles++;
		/* From here the fd is the server's: closed with the handle. */
		srv->listen_fd = listen_fd;
		listen_fd = -1;
		r = uv_poll_start(&srv->listen, UV_READABLE, server_on_listen);
		if (r < 0)
			goto err_close_handles;
	}
	*out = srv;
	return 0;

err_close_handles:
	/* @srv is freed by the last close callback, once the loop runs. */
	srv->stopping = true;
	server_close_handles(srv);
err_close_fd:
	if (listen_fd >= 0)
		close(listen_fd);
	return r;
}

int server_adopt(struct server *srv, int fd)
{
	struct sess *s;
	int r;

	if (srv->stopping)
		return -ESHUTDOWN;
	r = sess_new(&srv->host, fd, &s);
	if (r < 0)
		return r;
	log_debug("connection accepted pid=%d uid=%u gid=%u fd=%d", (int)s->pid, (unsigned)s->uid,
		  (unsigned)s->gid, fd);
	return 0;
}

static void server_on_listen(uv_poll_t *poll, int status, int events)
{
	struct server *srv = poll->data;

	if (status < 0) {
		log_warn("listening socket poll failed err=\"%s\"", uv_strerror(status));
		return;
	}
	for (int i = 0; i < SERVER_ACCEPT_BATCH && !srv->emfile_paused; i++) {
		int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		int r;

		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			server_accept_failed(srv, -errno);
			continue;
		}
		if (srv->emfile_logged) {
			log_notice("accepting connections again");
			srv->emfile_logged = false;
		}
		r = server_adopt(srv, fd);
		/* A limit's refusal was logged by the layer that knows which limit;
		 * a flood of them must not be a line each here. */
		if (r < 0 && r != -ECONNREFUSED)
			log_errno(LOG_LVL_WARNING, r, "cannot serve a new connection");
		if (r < 0)
			close(fd);
	}
}

static void server_accept_failed(struct server *srv, int err)
{
	switch (err) {
	case -EINTR:
	case -ECONNABORTED:
	case -EPROTO:
		return; /* that connection is gone; the next one may be fine */
	case -EMFILE:
	case -ENFILE:
		/* The connection stays queued and the listener readable: polling
		 * on would spin. Pause, and try again after a while. */
		if (!srv->emfile_logged)
			log_errno(LOG_LVL_WARNING, err,
				  "out of file descriptors, accepting paused"
				  " retry_ms=%d",
				  SERVER_EMFILE_RETRY_MS);
		srv->emfile_logged = true;
		srv->emfile_paused = true;
		uv_poll_stop(&srv->listen);
		uv_timer_start(&srv->emfile_timer, server_on_emfile_timer, SERVER_EMFILE_RETRY_MS,
			       0);
		return;
	default:
		log_errno(LOG_LVL_WARNING, err, "accept failed");
		return;
	}
}

static void server_on_emfile_timer(uv_timer_t *timer)
{
	struct server *srv = timer->data;
	int r;

	srv->emfile_paused = false;
	r = uv_poll_start(&srv->listen, UV_READABLE, server_on_listen);
	if (r < 0)
		log_err("cannot poll the listening socket again err=\"%s\"", uv_strerror(r));
}

int server_cork(struct server *srv, int (*cb)(void *arg), void *arg)
{
	int r;

	if (srv->cork_cb || srv->stopping)
		return -EINVAL;
	r = uv_check_init(srv->loop, &srv->uncork);
	if (r < 0)
		return r;
	/* Timer init cannot fail; both close in server_close_handles(). */
	uv_timer_init(srv->loop, &srv->retry_timer);
	srv->uncork.data = srv;
	srv->retry_timer.data = srv;
	srv->cork_cb = cb;
	srv->cork_arg = arg;
	srv->host.corked = true;
	srv->host.settle = server_settle;
	srv->open_handles += 2;
	/* Every turn, and it keeps nothing alive on its own. */
	uv_unref((uv_handle_t *)&srv->uncork);
	return uv_check_start(&srv->uncork, server_on_uncork);
}

static void server_on_uncork(uv_check_t *check)
{
	struct server *srv = check->data;
	int r = srv->cork_cb(srv->cork_arg);

	srv->host.held = r < 0;
	if (r < 0) {
		/* Each session drops its interest in writing (it could not),
		 * and in reading once its queue is at SESS_HOLD_MAX_*. */
		for (struct sess *s = srv->host.sessions; s; s = s->next)
			sess_uncork(s);
		if (!uv_is_active((uv_handle_t *)&srv->retry_timer)) {
			srv->retry_ms = srv->retry_ms ? srv->retry_ms * 2 :
							SERVER_CORK_RETRY_MIN_MS;
			if (srv->retry_ms > SERVER_CORK_RETRY_MAX_MS)
				srv->retry_ms = SERVER_CORK_RETRY_MAX_MS;
			uv_timer_start(&srv->retry_timer, server_on_retry, srv->retry_ms, 0);
		}
		return;
	}
	srv->retry_ms = 0;
	uv_timer_stop(&srv->retry_timer);
	/* Sends what waited; a session not read for the hold is read again. */
	for (struct sess *s = srv->host.sessions; s; s = s->next)
		sess_uncork(s);
}

int server_spin(struct server *srv, unsigned us)
{
	int r;

	if (us == 0 || srv->spin_ns)
		return 0;
	r = uv_idle_init(srv->loop, &srv->spin);
	if (r < 0)
		return r;
	srv->spin.data = srv;
	srv->spin_ns = (uint64_t)us * 1000;
	srv->host.busy = server_busy;
	srv->open_handles++;
	/* An active idle handle makes every poll of the loop non-blocking; it
	 * keeps nothing alive on its own. */
	uv_unref((uv_handle_t *)&srv->spin);
	return 0;
}

/* A session read a packet: poll without blocking for the budget from now. */
static void server_busy(struct sess_host *host)
{
	struct server *srv = (struct server *)((char *)host - offsetof(struct server, host));

	if (srv->stopping)
		return;
	srv->spin_until = uv_hrtime() + srv->spin_ns;
	if (!uv_is_active((uv_handle_t *)&srv->spin))
		uv_idle_start(&srv->spin, server_on_spin);
}

/* Each turn while spinning; stops at the budget's end. Yields: see spin.h. */
static void server_on_spin(uv_idle_t *idle)
{
	struct server *srv = idle->data;

	if (uv_hrtime() >= srv->spin_until)
		uv_idle_stop(idle);
	else
		sched_yield();
}

/* Only wakes the loop: the check at the end of this turn tries again. */
static void server_on_retry(uv_timer_t *timer)
{
}

/* A session about to disconnect: may its queue leave now? */
static int server_settle(struct sess_host *host)
{
	struct server *srv = (struct server *)((char *)host - offsetof(struct server, host));

	return srv->cork_cb(srv->cork_arg);
}

/* Sessions call it when doomed: disconnect them on the next loop turn. */
static void server_reap_later(struct sess_host *host)
{
	struct server *srv = (struct server *)((char *)host - offsetof(struct server, host));

	if (srv->stopping)
		return; /* server_stop() disconnects everyone anyway */
	uv_timer_start(&srv->reap_timer, server_on_reap, 0, 0);
}

static void server_on_reap(uv_timer_t *timer)
{
	struct server *srv = timer->data;
	struct sess *s, *next;

	/* A disconnect may doom other sessions (their sends fail), never
	 * unlink them: only this loop and server_stop() disconnect. */
	for (s = srv->host.sessions; s; s = next) {
		next = s->next;
		if (s->state == SESS_DOOMED)
			sess_disconnect(s);
	}
}

void server_stop(struct server *srv)
{
	srv->stopping = true;
	server_close_handles(srv);
	while (srv->host.sessions)
		sess_disconnect(srv->host.sessions);
}

static void server_close_handles(struct server *srv)
{
	if (srv->listen_fd >= 0) {
		uv_close((uv_handle_t *)&srv->listen, server_on_closed);
		close(srv->listen_fd);
		srv->listen_fd = -1;
	}
	uv_close((uv_handle_t *)&srv->emfile_timer, server_on_closed);
	uv_close((uv_handle_t *)&srv->reap_timer, server_on_closed);
	if (srv->cork_cb) {
		uv_close((uv_handle_t *)&srv->uncork, server_on_closed);
		uv_close((uv_handle_t *)&srv->retry_timer, server_on_closed);
	}
	if (srv->spin_ns)
		uv_close((uv_handle_t *)&srv->spin, server_on_closed);
}

static void server_on_closed(uv_handle_t *handle)
{
	struct server *srv = handle->data;

	if (--srv->open_handles == 0)
		free(srv);
}
