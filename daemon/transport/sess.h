/*
 * sess.h - one client connection of gmbd: the socket and its poll handle,
 * the peer's credentials and the outgoing queue. A session knows no
 * message's meaning: it hands every packet it reads to the layer above
 * through the struct sess_ops that layer gave the server, and keeps that
 * layer's per-connection state (sess->data) without looking into it.
 *
 * Lifetime. A session is reference-counted: the connection holds one
 * reference until its poll handle is closed; parked requests, switches and
 * watchers hold more, because their callbacks may outlive the socket. The
 * last sess_unref() frees it.
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
 * the loop turn, once the server says they may (held until then, even
 * when the session disconnects). While held, a session whose queue reaches
 * SESS_HOLD_MAX_* is not read (sess_read_paused()): a client that keeps
 * sending blocks in its own send instead of meeting the limit for gmbd's
 * failure, and is read again when the hold ends. The fds of the
 * chunks a packet names in fd_chunks are exported from the chunk handles at
 * send time and closed right after sendmsg(), so at most one batch of
 * exported fds exists at a time. A packet whose fds cannot be exported or
 * sent does not end the session when the layer above can answer its
 * request anew (sess_ops.undeliverable): the rest of that reply is dropped.
 */
#ifndef GMB_SESS_H
#define GMB_SESS_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/log.h"
#include "common/wire.h"
#include "proto/gmb.pb-c.h"

#define SESS_READ_BATCH	      32	 /* packets per wake-up, then yield */
#define SESS_OUT_MAX_BYTES    (4u << 20) /* queued bytes before we give up */
#define SESS_OUT_MAX_PACKETS  4096
/*
 * Held (struct sess_host.held), a session is not read while its queue
 * holds this much: a quarter of the limits above. The rest is room for what
 * comes without a request of the client's while it is not read (gmbd's
 * drops and control commands), for the reply to the last request read (a
 * large lend or status travels in many packets), and, once the hold ends,
 * the usual three quarters for a client that reads while gmbd answers; a
 * well-behaved client never has this many requests in flight.
 */
#define SESS_HOLD_MAX_BYTES   (SESS_OUT_MAX_BYTES / 4)
#define SESS_HOLD_MAX_PACKETS (SESS_OUT_MAX_PACKETS / 4)

enum sess_state {
	SESS_OPEN,
	SESS_DOOMED, /* reason logged, waiting for the server's reaper */
	SESS_CLOSED, /* disconnected; only references keep it alive */
};

struct sess;
struct sess_out;

/*
 * What the layer above does with its sessions; handed to server_start()
 * with an @arg passed back to every call but free_data.
 */
struct sess_ops {
	/* A new connection: *@data gets the layer's state for @s (kept in
	 * s->data, freed by free_data). Return: 0, -ENOMEM, or -ECONNREFUSED
	 * when a limit of the layer's refuses it: the layer said why in the
	 * log (as often as it sees fit), so the server closes it quietly. */
	int (*open)(void *arg, struct sess *s, void **data);
	/* One packet of @s; takes @env. */
	void (*recv)(void *arg, struct sess *s, Gmb__Envelope *env);
	/* @s disconnects (sess_disconnect()): fail what is pending. */
	void (*gone)(void *arg, struct sess *s);
	/* The session's last reference went: free what open() made. */
	void (*free_data)(void *data);
	/* New fds for @n chunk ids, the caller's to close; none open on failure. */
	int (*export_fds)(void *arg, const uint64_t *ids, size_t n, int *fds);
	/*
	 * The chunk fds of a packet of the reply to @envs[0]->reply_to could
	 * not be exported or sent (@err: -EMFILE, -ETOOMANYREFS, ...): that
	 * packet and every later one of the same reply are taken off the queue
	 * unsent and handed over here, unpacked, in order (the layer's to read
	 * during the call). Return 0 once the request is answered anew (a
	 * sess_send() from here queues behind what is queued); a negative
	 * errno dooms the session. NULL: always doomed.
	 */
	int (*undeliverable)(void *arg, struct sess *s, Gmb__Envelope *const *envs, size_t n,
			     int err);
	/* A body case's name for logs. */
	const char *(*body_name)(int body_case);
};

/* What a session knows of the server it belongs to (embedded there). */
struct sess_host {
	uv_loop_t *loop;
	const struct sess_ops *ops;
	void *arg;
	bool corked;				    /* packets leave at the end of the loop turn */
	bool held;				    /* corked and the last try failed: none leave */
	int (*settle)(struct sess_host *host);	    /* corked: 0 when packets may leave now */
	void (*reap_later)(struct sess_host *host); /* doomed: disconnect next turn */
	void (*busy)(struct sess_host *host);	    /* a packet was read; NULL: nothing */
	struct sess *sessions;			    /* every session not yet disconnected */
	unsigned nsessions;
};

struct sess {
	/* The host may be gone before the last unref (its handles close first
	 * at shutdown): what the unref needs is copied here. */
	struct sess_host *host;
	void (*free_data)(void *data);
	int fd;		 /* owned; -1 once closed */
	uv_poll_t poll;	 /* embedded; memory lives until its close cb */
	int poll_events; /* events the poll is started with now */
	unsigned refs;
	enum sess_state state;
	/* Why it ended: gmbd doomed it (a limit, bad input) while the peer may
	 * still be there, unless the peer closed its end first. Neither: gmbd
	 * stops. The layer above keeps a live peer's memory in the first case. */
	bool doomed, peer_closed;

	/* Peer credentials, read once at accept. */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	gid_t *groups; /* SO_PEERGROUPS; NULL when the kernel said no */
	int ngroups;
	/* uv_now() at accept, then of the last packet read: how long the peer
	 * has been quiet (the layer above closes idle ones first at a limit). */
	uint64_t heard_ms;

	/* For logs: the client's name and id, set by the layer above; log_name
	 * is the name as a key=value value (quoted when it has spaces). */
	char name[WIRE_MAX_NAME + 1];
	char log_name[LOG_QUOTE_MAX];
	uint64_t client_id;
	void *data; /* the layer above's (sess_ops.open) */

	struct sess_out *out_head, *out_tail;
	size_t out_bytes;
	uint32_t out_count;
	bool flushing; /* in sess_flush(): sess_send() only queues */

	struct sess *prev, *next; /* host->sessions */
};

/* Names the session in a log line: SESS_FMT's four facts. */
#define SESS_FMT     "client=%s id=%" PRIu64 " pid=%d uid=%u"
#define SESS_ARGS(s) (s)->log_name, (s)->client_id, (int)(s)->pid, (unsigned)(s)->uid

/**
 * sess_new() - a session for the connected socket @fd, linked into @host.
 * Reads the peer's credentials, asks the layer above for its state
 * (ops->open) and starts polling. On success the session owns @fd; on
 * failure @fd is still the caller's.
 * Return: 0, -ENOMEM, -ECONNREFUSED (ops->open refused it), or the errno
 * of getsockopt(SO_PEERCRED)/uv_poll_init.
 */
int sess_new(struct sess_host *host, int fd, struct sess **out);

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

/* The peer closed its end: sess_doom() at debug level, marked peer_closed. */
void sess_peer_closed(struct sess *s);

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
 * peer cannot make sense of the rest of a reply), so callers may stop there;
 * fds that cannot go out later go to sess_ops.undeliverable instead.
 * Return: 0, or a negative errno (-EPIPE once the session is not OPEN).
 */
int sess_send(struct sess *s, const Gmb__Envelope *env);

/* Corked server: send what this session queued this turn (server.c);
 * while the host is held, only stop asking to write, and stop reading a
 * session at SESS_HOLD_MAX_*; once it is no longer held, read again. */
void sess_uncork(struct sess *s);

/*
 * sess_read_paused() - gmbd does not read @s now: replies are held and its
 * queue has reached SESS_HOLD_MAX_*. Only while held: when nothing is
 * held, a client that does not read its replies is one to disconnect at
 * SESS_OUT_MAX_* (pausing it then would keep it, and what it holds,
 * forever), and once a hold ends the session is read at once, so that
 * such a client still meets the limit.
 */
static inline bool sess_read_paused(const struct sess *s)
{
	return s->host->held &&
	       (s->out_count >= SESS_HOLD_MAX_PACKETS || s->out_bytes >= SESS_HOLD_MAX_BYTES);
}

/* Replies are held: nothing leaves any session until a write succeeds. */
static inline bool sess_held(const struct sess *s)
{
	return s->host->held;
}

/* Names the session in logs from now on (NULL: "-", as before hello). */
void sess_set_name(struct sess *s, const char *name, uint64_t client_id);
static inline const char *sess_name(const struct sess *s)
{
	return s->name;
}

#endif
