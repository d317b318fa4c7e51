/*
 * sess.c - one client connection: reading packets, the outgoing queue,
 * chunk fds at send time, credentials, and the session's lifetime.
 *
 * Invariants:
 *   - poll is started only while the state is OPEN: readable unless
 *     sess_read_paused(), plus writable while out_head != NULL and the host
 *     is not held; paused, it is stopped (held, nothing is written either);
 *   - chunk fds exist only inside sess_out_send(): exported, sent, closed,
 *     so at most one batch of chunk fds is open in the whole daemon (the
 *     cuda backend's own kept fd, one a device, aside: common/backend/cuda.c);
 *   - the connection's reference is dropped in the poll handle's close
 *     callback, so the struct outlives every libuv callback on it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/list.h"
#include "common/err.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/transport/sess.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

#define sess_of(handle) ((struct sess *)((char *)(handle)-offsetof(struct sess, poll)))

/* One queued packet: packed bytes and the chunks whose fds ride with it. */
struct sess_out {
	struct sess_out *next;
	uint8_t *buf;
	size_t len;
	uint64_t reply_to; /* the request it answers; 0: none */
	uint64_t *ids;
	int nids;
};

static int sess_read_creds(struct sess *s);
static void sess_read_groups(struct sess *s);
static void sess_on_poll(uv_poll_t *poll, int status, int events);
static void sess_on_closed(uv_handle_t *handle);
static void sess_poll_failed(struct sess *s, int status);
static void sess_read(struct sess *s);
static void sess_read_failed(struct sess *s, int err);
static void sess_log_env(const struct sess *s, const char *dir, const Gmb__Envelope *env);
static int sess_out_new(const Gmb__Envelope *env, struct sess_out **out);
static void sess_out_free(struct sess_out *o);
static int sess_out_send(struct sess *s, struct sess_out *o, bool *fds_failed);
static int sess_reply_lost(struct sess *s, int err);
static int sess_flush(struct sess *s, bool top);
static void sess_flushed(struct sess *s, int r);
static void sess_update_poll(struct sess *s);
static void sess_link(struct sess *s);
static void sess_unlink(struct sess *s);

int sess_new(struct sess_host *host, int fd, struct sess **out)
{
	struct sess *s;
	int r;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	*s = (struct sess){ .host = host,
			    .free_data = host->ops->free_data,
			    .fd = fd,
			    .refs = 1,
			    .state = SESS_OPEN,
			    .name = "-",
			    .log_name = "-",
			    .heard_ms = uv_now(host->loop) };
	r = sess_read_creds(s);
	if (r < 0)
		goto err_free;
	r = host->ops->open(host->arg, s, &s->data);
	if (r < 0)
		goto err_free;
	r = uv_poll_init(host->loop, &s->poll, fd);
	if (r < 0)
		goto err_free;
	r = uv_poll_start(&s->poll, UV_READABLE, sess_on_poll);
	if (r < 0)
		goto err_close_poll;
	s->poll_events = UV_READABLE;
	sess_link(s);
	*out = s;
	return 0;

err_close_poll:
	/* The handle is known to the loop: the close callback frees @s, and
	 * @fd goes back to the caller untouched. */
	s->fd = -1;
	s->state = SESS_CLOSED;
	uv_close((uv_handle_t *)&s->poll, sess_on_closed);
	return r;
err_free:
	if (s->data)
		host->ops->free_data(s->data);
	free(s->groups);
	free(s);
	return r;
}

static int sess_read_creds(struct sess *s)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);

	if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	s->pid = uc.pid;
	s->uid = uc.uid;
	s->gid = uc.gid;
	sess_read_groups(s);
	return 0;
}

/* Supplementary groups matter only for the admin-group rule; an old kernel
 * without SO_PEERGROUPS just leaves them out. */
static void sess_read_groups(struct sess *s)
{
	socklen_t len = 0;
	gid_t *groups;

	if (getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, NULL, &len) == 0 || errno != ERANGE ||
	    len == 0)
		return;
	groups = malloc(len);
	if (!groups)
		return;
	if (getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) {
		free(groups);
		return;
	}
	s->groups = groups;
	s->ngroups = (int)(len / sizeof(gid_t));
}

struct sess *sess_ref(struct sess *s)
{
	s->refs++;
	return s;
}

struct sess *sess_unref(struct sess *s)
{
	if (!s || --s->refs > 0)
		return NULL;
	if (s->data)
		s->free_data(s->data);
	free(s->groups);
	free(s);
	return NULL;
}

void sess_set_name(struct sess *s, const char *name, uint64_t client_id)
{
	const char *q;

	snprintf(s->name, sizeof(s->name), "%s", name ? name : "-");
	q = log_quote(s->name, s->log_name, sizeof(s->log_name));
	if (q != s->log_name)
		snprintf(s->log_name, sizeof(s->log_name), "%s", q);
	s->client_id = name ? client_id : 0;
}

void sess_doom(struct sess *s, int level, const char *fmt, ...)
{
	char reason[ERR_MSG_MAX];
	va_list ap;

	if (s->state != SESS_OPEN)
		return;
	va_start(ap, fmt);
	err_vfmt(reason, sizeof(reason), 0, fmt, ap);
	va_end(ap);
	log_at(level, "disconnecting " SESS_FMT " reason=\"%s\"", SESS_ARGS(s), reason);
	s->state = SESS_DOOMED;
	s->doomed = true;
	uv_poll_stop(&s->poll);
	s->poll_events = 0;
	s->host->reap_later(s->host);
}

void sess_peer_closed(struct sess *s)
{
	if (s->state == SESS_OPEN)
		s->peer_closed = true;
	sess_doom(s, LOG_LVL_DEBUG, "connection closed by the client");
}

void sess_disconnect(struct sess *s)
{
	if (s->state == SESS_CLOSED)
		return;
	if (s->state == SESS_OPEN)
		uv_poll_stop(&s->poll);
	s->state = SESS_CLOSED;
	s->poll_events = 0;
	/* Best effort: the last reply (say, a version mismatch) may still be
	 * queued; a peer that does not take it now will not get it. Corked,
	 * only once the host says so: a reply must not slip out here before
	 * the state it tells of is stored. */
	if (!s->host->corked || s->host->settle(s->host) == 0)
		(void)sess_flush(s, false);
	while (s->out_head) {
		struct sess_out *o = s->out_head;

		s->out_head = o->next;
		sess_out_free(o);
	}
	s->out_tail = NULL;
	s->out_bytes = 0;
	s->out_count = 0;
	sess_unlink(s);
	s->host->ops->gone(s->host->arg, s);
	uv_close((uv_handle_t *)&s->poll, sess_on_closed);
	/* Closing right after uv_close() is what libuv does for its own
	 * streams: the peer sees the end of the connection at once. */
	close(s->fd);
	s->fd = -1;
}

static void sess_on_closed(uv_handle_t *handle)
{
	sess_unref(sess_of(handle));
}

static void sess_on_poll(uv_poll_t *poll, int status, int events)
{
	struct sess *s = sess_of(poll);

	if (status < 0) {
		sess_poll_failed(s, status);
		return;
	}
	/* Corked, the end of the turn sends: not before the state is written. */
	if ((events & UV_WRITABLE) && !s->host->corked)
		sess_flushed(s, sess_flush(s, true));
	if ((events & UV_READABLE) && s->state == SESS_OPEN)
		sess_read(s);
}

/* libuv reports POLLERR as UV_EBADF: the socket's own error says more.
 * A peer that closes with replies unread leaves ECONNRESET there. */
static void sess_poll_failed(struct sess *s, int status)
{
	socklen_t len = sizeof(int);
	int err = 0;

	if (status == UV_EBADF && getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
	    (err == 0 || err == ECONNRESET || err == EPIPE)) {
		sess_peer_closed(s);
		return;
	}
	sess_doom(s, LOG_LVL_WARNING, "poll failed: %s", err ? strerror(err) : uv_strerror(status));
}

/* At most SESS_READ_BATCH packets, then back to the loop: one busy client
 * must not starve the others. Poll is level-triggered, so the rest waits.
 * Held, the queue is checked before each packet: at most the reply to one
 * request lands past SESS_HOLD_MAX_*. */
static void sess_read(struct sess *s)
{
	int fds[WIRE_MAX_FDS];

	for (int i = 0; i < SESS_READ_BATCH && s->state == SESS_OPEN; i++) {
		Gmb__Envelope *env = NULL;
		int nfds = 0;
		int r;

		if (sess_read_paused(s)) {
			sess_update_poll(s);
			break;
		}
		r = wire_recv(s->fd, &env, fds, &nfds);
		if (r == -EAGAIN)
			break;
		if (r < 0) {
			sess_read_failed(s, r);
			break;
		}
		if (nfds > 0) {
			wire_close_fds(fds, nfds);
			gmb__envelope__free_unpacked(env, NULL);
			sess_protocol_error(s, "a client may not send file descriptors (got %d)",
					    nfds);
			break;
		}
		s->heard_ms = uv_now(s->host->loop);
		sess_log_env(s, "recv", env);
		s->host->ops->recv(s->host->arg, s, env);
		if (s->host->busy)
			s->host->busy(s->host);
	}
}

static void sess_read_failed(struct sess *s, int err)
{
	switch (err) {
	case -ECONNRESET:
		/* The client closed its end: the usual goodbye. */
		sess_peer_closed(s);
		break;
	case -EMSGSIZE:
		sess_protocol_error(s, "packet over %d bytes", WIRE_MAX_MSG);
		break;
	case -EPROTO:
		sess_protocol_error(s, "undecodable packet or file descriptors out of place");
		break;
	default:
		sess_doom(s, LOG_LVL_WARNING, "receive failed: %s", strerror(-err));
		break;
	}
}

static void sess_log_env(const struct sess *s, const char *dir, const Gmb__Envelope *env)
{
	log_debug("%s " SESS_FMT " type=%s req=%" PRIu64 " reply_to=%" PRIu64
		  " status=%d more=%d fds=%zu",
		  dir, SESS_ARGS(s), s->host->ops->body_name(env->body_case), env->id,
		  env->reply_to, env->status, env->more ? 1 : 0, env->n_fd_chunks);
}

int sess_send(struct sess *s, const Gmb__Envelope *env)
{
	struct sess_out *o;
	int r;

	if (s->state != SESS_OPEN)
		return -EPIPE;
	if (env->n_fd_chunks > WIRE_MAX_FDS || env->n_fd_sizes != env->n_fd_chunks) {
		sess_doom(s, LOG_LVL_ERR, "internal error: a reply names %zu fds",
			  env->n_fd_chunks);
		return -EMSGSIZE;
	}
	r = sess_out_new(env, &o);
	if (r < 0) {
		sess_doom(s, LOG_LVL_ERR, "cannot encode a %s: %s",
			  s->host->ops->body_name(env->body_case), strerror(-r));
		return r;
	}
	if (s->out_count >= SESS_OUT_MAX_PACKETS || s->out_bytes + o->len > SESS_OUT_MAX_BYTES) {
		sess_out_free(o);
		sess_doom(s, LOG_LVL_WARNING, "the client does not read its replies (%u queued)",
			  s->out_count);
		return -ENOBUFS;
	}
	sess_log_env(s, "send", env);
	if (s->out_tail)
		s->out_tail->next = o;
	else
		s->out_head = o;
	s->out_tail = o;
	s->out_bytes += o->len;
	s->out_count++;
	/* From sess_flush()'s own callback: its loop sends this one next. */
	if (s->host->corked || s->flushing)
		return 0;
	r = sess_flush(s, false);
	sess_flushed(s, r);
	return r == -EAGAIN ? 0 : r;
}

void sess_uncork(struct sess *s)
{
	if (s->state != SESS_OPEN)
		return;
	if (s->host->held || !s->out_head)
		sess_update_poll(s);
	else
		sess_flushed(s, sess_flush(s, true));
}

static int sess_out_new(const Gmb__Envelope *env, struct sess_out **out)
{
	struct sess_out *o;
	int r;

	o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	r = wire_pack(env, &o->buf, &o->len);
	if (r < 0)
		goto err_free;
	o->reply_to = env->reply_to;
	o->nids = (int)env->n_fd_chunks;
	if (o->nids) {
		o->ids = malloc(sizeof(*o->ids) * (size_t)o->nids);
		r = -ENOMEM;
		if (!o->ids)
			goto err_buf;
		memcpy(o->ids, env->fd_chunks, sizeof(*o->ids) * (size_t)o->nids);
	}
	*out = o;
	return 0;

err_buf:
	free(o->buf);
err_free:
	free(o);
	return r;
}

static void sess_out_free(struct sess_out *o)
{
	free(o->ids);
	free(o->buf);
	free(o);
}

/*
 * Exports the packet's fds, sends, and closes them whatever happened: a
 * packet that meets a full socket exports again on the next try, so that
 * across every session at most one batch of exported fds is open.
 * *@fds_failed: the fds, not the socket, failed (the export, or the
 * kernel's bound on fds in flight: ETOOMANYREFS).
 */
static int sess_out_send(struct sess *s, struct sess_out *o, bool *fds_failed)
{
	int fds[WIRE_MAX_FDS];
	int r;

	r = s->host->ops->export_fds(s->host->arg, o->ids, (size_t)o->nids, fds);
	if (r < 0) {
		*fds_failed = true;
		return r;
	}
	r = wire_send_packed(s->fd, o->buf, o->len, fds, o->nids);
	wire_close_fds(fds, o->nids);
	*fds_failed = r == -ETOOMANYREFS && o->nids > 0;
	return r;
}

static void sess_out_pop(struct sess *s, struct sess_out **pos)
{
	struct sess_out *o = *pos, *prev = NULL;

	for (struct sess_out *p = s->out_head; p != o; p = p->next)
		prev = p;
	*pos = o->next;
	if (s->out_tail == o)
		s->out_tail = prev;
	s->out_bytes -= o->len;
	s->out_count--;
	sess_out_free(o);
}

/*
 * The head packet's fds failed (@err): it and the rest of its reply leave
 * the queue unsent and go, unpacked, to the layer above, which answers the
 * request anew. Return: 0, or @err once the session is doomed for it.
 */
static int sess_reply_lost(struct sess *s, int err)
{
	struct sess_out *head = s->out_head, **pos = &s->out_head;
	uint64_t reply_to = head->reply_to;
	int nids = head->nids; /* for the log line: @head is freed on the way */
	Gmb__Envelope **envs;
	size_t n = 0, cap = 0;
	int r = -ENOMEM;

	if (!s->host->ops->undeliverable || !reply_to || s->state != SESS_OPEN)
		goto err_doom;
	for (struct sess_out *o = head; o; o = o->next)
		cap += o->reply_to == reply_to;
	envs = calloc(cap, sizeof(*envs));
	if (!envs)
		goto err_doom;
	while (*pos) {
		if ((*pos)->reply_to != reply_to) {
			pos = &(*pos)->next;
			continue;
		}
		envs[n] = gmb__envelope__unpack(NULL, (*pos)->len, (*pos)->buf);
		n += envs[n] != NULL;
		sess_out_pop(s, pos);
	}
	r = n == cap ? s->host->ops->undeliverable(s->host->arg, s, envs, n, err) : -ENOMEM;
	for (size_t i = 0; i < n; i++)
		gmb__envelope__free_unpacked(envs[i], NULL);
	free(envs);
	if (r == 0)
		return 0;
err_doom:
	sess_doom(s, LOG_LVL_ERR, "cannot send %d chunk fds: %s", nids, strerror(-err));
	return err;
}

/*
 * Sends queued packets until the socket is full. @top: called from the top
 * of a loop callback; else (from sess_send(), inside a handler that may
 * still use what the packet lends) a packet whose fds fail waits for the
 * next writable event, where the layer above may take its lend back.
 * Return: 0 (queue empty), -EAGAIN (socket full, or fds to retry from the
 * top), or the error that ended the connection.
 */
static int sess_flush(struct sess *s, bool top)
{
	struct sess_out *o;
	bool was = s->flushing;
	int r = 0;

	s->flushing = true;
	while ((o = s->out_head)) {
		bool fds_failed = false;

		r = sess_out_send(s, o, &fds_failed);
		if (r < 0 && fds_failed && !top && s->state == SESS_OPEN) {
			r = -EAGAIN;
			break;
		}
		if (r < 0 && fds_failed) {
			r = sess_reply_lost(s, r);
			if (r == 0)
				continue;
		}
		if (r < 0)
			break;
		sess_out_pop(s, &s->out_head);
	}
	s->flushing = was;
	return r;
}

static void sess_flushed(struct sess *s, int r)
{
	if (r == 0 || r == -EAGAIN) {
		sess_update_poll(s);
		return;
	}
	if (r == -EPIPE || r == -ECONNRESET)
		sess_peer_closed(s);
	else
		sess_doom(s, LOG_LVL_WARNING, "send failed: %s", strerror(-r));
}

/* Writable interest only while something waits: a SEQPACKET socket is
 * writable nearly always, and polling it for nothing spins the loop. */
static void sess_update_poll(struct sess *s)
{
	/* Held, a writable socket would only spin the loop. */
	int want = UV_READABLE | (s->out_head && !s->host->held ? UV_WRITABLE : 0);
	int r;

	/* Not read for the hold: its requests wait in the socket, where they
	 * block the client's sends. (A peer that closes meanwhile is seen once
	 * it is read again; held, nothing could reach it anyway.) */
	if (sess_read_paused(s))
		want = 0;
	if (s->state != SESS_OPEN || want == s->poll_events)
		return;
	if (want == 0) {
		uv_poll_stop(&s->poll);
		s->poll_events = 0;
		return;
	}
	r = uv_poll_start(&s->poll, want, sess_on_poll);
	if (r < 0) {
		sess_doom(s, LOG_LVL_WARNING, "poll failed: %s", uv_strerror(r));
		return;
	}
	s->poll_events = want;
}

static void sess_link(struct sess *s)
{
	DLIST_PUSH(s->host->sessions, s);
	s->host->nsessions++;
}

static void sess_unlink(struct sess *s)
{
	DLIST_UNLINK(s->host->sessions, s);
	s->host->nsessions--;
}
