/*
 * server.h - gmbd's listening side: wires a listening socket to the loop,
 * accepts connections and keeps the list of sessions.
 *
 * Making the socket (wire_listen(), or an fd from socket activation) is
 * separate from this: server_start() takes any listening SOCK_SEQPACKET fd,
 * or none, in which case sessions come only through server_adopt() (tests).
 *
 * The server also runs the reaper: sessions doomed in the middle of a
 * handler (a failed send, a protocol error) are disconnected at the start of
 * the next loop turn, never under a handler's feet.
 */
#ifndef GMB_SERVER_H
#define GMB_SERVER_H

#include <stdbool.h>
#include <uv.h>

#include "daemon/transport/sess.h"

#define SERVER_ACCEPT_BATCH	 32
#define SERVER_EMFILE_RETRY_MS	 100
#define SERVER_CORK_RETRY_MIN_MS 10 /* a failed cork_cb: tried again after, doubling */
#define SERVER_CORK_RETRY_MAX_MS 1000

struct server {
	uv_loop_t *loop;
	struct sess_host host;	 /* the sessions and the layer above them */
	int listen_fd;		 /* owned; -1: none */
	uv_poll_t listen;	 /* initialized iff listen_fd >= 0 */
	uv_timer_t emfile_timer; /* accepting again after EMFILE/ENFILE */
	uv_timer_t reap_timer;	 /* disconnects doomed sessions */
	unsigned open_handles;	 /* the server is freed when this reaches 0 */
	bool emfile_paused;
	bool emfile_logged; /* said so once; said again when it ends */
	bool stopping;
	/* Corked: packets wait until the end of the loop turn, after cork_cb,
	 * and while it fails, until a later try succeeds. */
	uv_check_t uncork;	/* initialized iff cork_cb != NULL */
	uv_timer_t retry_timer; /* the same; wakes the loop to try again */
	unsigned retry_ms;	/* the last delay; 0: cork_cb succeeded */
	int (*cork_cb)(void *arg);
	void *cork_arg;
	/* Spinning: after a packet the loop polls without blocking until
	 * spin_until (uv_hrtime), expecting the client's next one. */
	uv_idle_t spin;	     /* initialized iff spin_ns != 0 */
	uint64_t spin_ns;    /* the budget after each packet; 0: never spins */
	uint64_t spin_until; /* while active */
};

/**
 * server_start() - accept connections on @listen_fd (-1: none) in @loop;
 * each becomes a session whose packets go to @ops (with @arg), which stay
 * the caller's and must outlive the server.
 * The server owns @listen_fd from the call on, also on failure (closed).
 * @out is the caller's until server_stop(), which frees it.
 * Return: 0, -ENOMEM, or libuv's error.
 */
int server_start(uv_loop_t *loop, int listen_fd, const struct sess_ops *ops, void *arg,
		 struct server **out);

/**
 * server_adopt() - serve the connected socket @fd as a session.
 * Return: 0 with @fd owned by the session; or a negative errno, @fd still
 * the caller's.
 */
int server_adopt(struct server *srv, int fd);

/**
 * server_stop() - stop accepting, close the listening fd and disconnect
 * every session (their memory goes back to the pools). @srv is freed once
 * its handles are closed, while the loop runs; do not use it afterwards.
 */
void server_stop(struct server *srv);

/**
 * server_cork() - from now on, what sessions send leaves at the end of the
 * loop turn, right after @cb(@arg) returned 0 (gmbd: the state is written
 * to the fd store before any reply of the turn, so no client learns of a
 * lend that a restart would not know). While @cb fails, nothing leaves,
 * not even at a disconnect: the packets wait in their queues and @cb is
 * tried again every turn and on a timer (10 ms, doubling to 1 s), since
 * nothing else may wake the loop. Meanwhile a session whose queue reaches
 * SESS_HOLD_MAX_* is not read (sess_read_paused()), so that a client that
 * keeps sending is not disconnected for gmbd's failure. Return: 0 or
 * libuv's error.
 */
int server_cork(struct server *srv, int (*cb)(void *arg), void *arg);

/**
 * server_spin() - after each packet a session reads, keep the loop from
 * blocking for @us microseconds (0: never), so that a client's next
 * request is read as it comes rather than after the CPU was woken
 * (common/spin.h says why). Call once, before the loop runs.
 * Return: 0 or libuv's error.
 */
int server_spin(struct server *srv, unsigned us);

/* Every session not yet disconnected, newest first; NULL: none. */
static inline struct sess *server_sessions(const struct server *srv)
{
	return srv->host.sessions;
}

#endif
