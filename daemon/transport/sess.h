/*
 * sess.h - one client connection of gmbd: the socket and its poll handle,
 * the peer's credentials, the outgoing queue, and what the handlers keep per
 * client (daemon requests in flight, the control forwarded to it).
 *
 * Lifetime. A session is reference-counted: the connection holds one
 * reference until its poll handle is closed; parked requests and forwarded
 * control requests hold more, because their callbacks may outlive the
 * socket. The last sess_unref() frees it.
 *
 * States. OPEN -> DOOMED -> CLOSED. sess_doom() logs the reason once, stops
 * reading and asks the server to disconnect the session on the next loop
 * turn; sess_disconnect() then removes the client from the broker (its
 * memory goes back to the pools), fails what is pending and closes the fd.
 * Nothing frees a session's client in the middle of a handler, so a handler
 * may send to any session (which at worst dooms it) and keep its pointers.
 *
 * Outgoing packets are sent at once when the socket takes them, else queued
 * (bounded: a client that stops reading is disconnected). On a corked
 * server (server_cork()) they are always queued, and leave at the end of
 * the loop turn. The fds of the
 * chunks a packet names in fd_chunks are exported from the chunk handles at
 * send time and closed right after sendmsg(), so at most one batch of
 * exported fds exists at a time.
 */
#ifndef GMB_SESS_H
#define GMB_SESS_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/idmap.h"
#include "common/log.h"
#include "proto/gmb.pb-c.h"

#define SESS_READ_BATCH 32          /* packets per wake-up, then yield */
#define SESS_OUT_MAX_BYTES (4u << 20) /* queued bytes before we give up */
#define SESS_OUT_MAX_PACKETS 4096

enum sess_state {
	SESS_OPEN,
	SESS_DOOMED,  /* reason logged, waiting for the server's reaper */
	SESS_CLOSED,  /* disconnected; only references keep it alive */
};

struct server;
struct bclient;
struct hfwd;
struct hrejoin;
struct sess_out;

struct sess {
	struct server *srv;
	int fd;                   /* owned; -1 once closed */
	uv_poll_t poll;           /* embedded; memory lives until its close cb */
	int poll_events;          /* events the poll is started with now */
	unsigned refs;
	enum sess_state state;

	/* Peer credentials, read once at accept. */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	gid_t *groups;            /* SO_PEERGROUPS; NULL when the kernel said no */
	int ngroups;

	struct bclient *client;   /* NULL until hello; owned by the broker */

	struct sess_out *out_head, *out_tail;
	size_t out_bytes;
	uint32_t out_count;

	/* Kept by daemon/handlers/handlers.c. */
	uint64_t next_req_id;     /* ids of daemon -> client requests */
	struct idmap dreqs;       /* id -> struct hdreq: daemon requests unanswered */
	uint32_t inflight;        /* parked + forwarded requests of this client */
	struct hfwd *ctl_in;      /* the control request this client carries out */
	struct hrejoin *rejoin;   /* between a rejoin hello and the end of its claim */

	struct sess *prev, *next; /* the server's list */
};

/* Names the session in a log line: SESS_FMT's four facts. */
#define SESS_FMT "client=%s id=%" PRIu64 " pid=%d uid=%u"
#define SESS_ARGS(s) sess_name(s), sess_client_id(s), (int)(s)->pid, (unsigned)(s)->uid

/**
 * sess_new() - a session for the connected socket @fd, linked into @srv.
 * Reads the peer's credentials and starts polling. On success the session
 * owns @fd; on failure @fd is still the caller's.
 * Return: 0, -ENOMEM, or the errno of getsockopt(SO_PEERCRED)/uv_poll_init.
 */
int sess_new(struct server *srv, int fd, struct sess **out);

struct sess *sess_ref(struct sess *s);
/* Drops one reference; the last frees the session. Returns NULL. */
struct sess *sess_unref(struct sess *s);

/**
 * sess_doom() - give up on this client: log the reason (at @level, naming
 * the client), stop reading, and let the server disconnect it on the next
 * loop turn. Does nothing once the session is no longer OPEN.
 */
void sess_doom(struct sess *s, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* A protocol error: sess_doom() at warning level with the reason. */
#define sess_protocol_error(s, ...) sess_doom((s), LOG_LVL_WARNING, "protocol error: " __VA_ARGS__)

/**
 * sess_disconnect() - close the session now: pending requests fail, the
 * client's memory returns to the pools, the fd is closed and the poll
 * handle's close callback drops the connection's reference. Call it only
 * from the top of a loop callback (the server's reaper and shutdown).
 */
void sess_disconnect(struct sess *s);

/**
 * sess_send() - send @env, or queue it while the socket is full.
 * The chunks in env->fd_chunks are exported when the packet leaves (their
 * fds ride with it and are closed right after). @env stays the caller's:
 * the packed bytes are copied. On any failure the session is doomed (the
 * peer cannot make sense of the rest of a reply), so callers may stop there.
 * Return: 0, or a negative errno (-EPIPE once the session is not OPEN).
 */
int sess_send(struct sess *s, const Gmb__Envelope *env);

/* Corked server: send what this session queued this turn (server.c). */
void sess_uncork(struct sess *s);

/* The client's name and broker id for logs ("-" and 0 before hello). */
const char *sess_name(const struct sess *s);
uint64_t sess_client_id(const struct sess *s);

#endif
