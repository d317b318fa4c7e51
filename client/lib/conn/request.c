/*
 * request.c - libgmb's requests to gmbd and their replies: the pending
 * entry, the send, the wait for a connection and for the answer, a reply's
 * parts as the reader files them, and the gate that serializes operations.
 *
 * A file of its own beside conn.c because a round trip is one story told
 * from both of its ends: the requester's half (gmb__request()) runs on an
 * application thread or the worker, the filing half
 * (gmb__request_on_reply()) on the reader thread, and they meet only in
 * the pending entry, its done flag and reply_cond, under the state lock.
 * conn.c owns the socket and the threads: its reader calls in here for
 * every reply part, and completes what is pending when the connection is
 * lost. The operation gate (gmb__op_begin()) is here too, because a request
 * that waits for the connection parks the operation holding it, which is
 * what lets the reader re-announce.
 *
 * While gmbd is away a request waits for the next connection (at most
 * reconnect_wait_ms); one whose answer the loss swallowed is sent again.
 *
 * Invariants:
 *   - A pending entry lives on its requester's stack; only the requester
 *     unlinks it, after done (or after its send failed, when no reply can
 *     come), so the reader may use it outside the lock in between.
 *   - done is set under the lock and also atomically (release), so that a
 *     requester may poll it without the lock before it sleeps; the lock
 *     decides.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/lib/conn/conn.h"
#include "common/deadline.h"
#include "common/spin.h"

static void request_unlink(struct gmb__conn *c, struct gmb__pending *p)
{
	for (struct gmb__pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			return;
		}
	}
}

static struct gmb__pending *request_find(struct gmb__conn *c, uint64_t id)
{
	for (struct gmb__pending *p = c->pending; p; p = p->next)
		if (p->id == id && !p->done)
			return p;
	return NULL;
}

/** gmb__reply_deinit() - free every part of @rep. */
void gmb__reply_deinit(struct gmb__reply *rep)
{
	for (size_t i = 0; i < rep->nparts; i++)
		gmb__envelope__free_unpacked(rep->parts[i], NULL);
	free(rep->parts);
	rep->parts = NULL;
	rep->nparts = rep->cap = 0;
}

static int request_result(const struct gmb__reply *rep, char *err)
{
	if (rep->status < 0)
		return err_fmt(err, rep->status, "%s",
			       *rep->error ? rep->error : strerror(-rep->status));
	if (rep->import_err < 0)
		return err_fmt(err, rep->import_err, "%s", rep->import_msg);
	return 0;
}

/* Sends on connection @gen only; 0: whichever is current. */
static int request_send(struct gmb__conn *c, uint64_t gen, const Gmb__Envelope *env)
{
	int rc;

	pthread_mutex_lock(&c->send_lock);
	rc = gen && gen != c->gen ? -ENOTCONN : wire_send(c->sock, env, NULL, 0);
	pthread_mutex_unlock(&c->send_lock);
	/* A peer gone mid-send is the same lost connection the reader reports. */
	if (rc == -EPIPE || rc == -ECONNRESET)
		rc = -ENOTCONN;
	return rc;
}

/*
 * Under lock: waits until a connection other than @dead serves, for at most
 * reconnect_wait_ms. The operation holding op_lock counts as parked while
 * it waits, so that the reader may re-announce; once a re-announcement has
 * begun, it is waited for even past the deadline (it has its own timeouts).
 */
/* *@crossed: the call waited for a connection (a re-announcement came first). */
static int request_wait_ready(struct gmb__conn *c, uint64_t dead, bool *crossed, char *err)
{
	bool mine = c->op_running && pthread_equal(c->op_owner, pthread_self());
	bool expired = false;
	struct timespec until = deadline_in_ms(c->reconnect_wait_ms);

	while (!c->gone && (!c->connected || c->gen == dead) && (!expired || c->rejoining)) {
		*crossed = true;
		if (mine && !c->op_parked) {
			c->op_parked = true;
			pthread_cond_broadcast(&c->conn_cond);
		}
		/* Past the deadline only a re-announcement is waited for: its
		 * end broadcasts, and a timed wait on the passed deadline would
		 * return at once, again and again (a busy loop). */
		if (expired)
			pthread_cond_wait(&c->conn_cond, &c->lock);
		else if (pthread_cond_timedwait(&c->conn_cond, &c->lock, &until) == ETIMEDOUT)
			expired = true;
	}
	if (mine)
		c->op_parked = false;
	if (c->gone)
		return err_fmt(err, -ENOTCONN, "%s",
			       c->lost_msg[0] ? c->lost_msg : "the connection to gmbd is lost");
	if (!c->connected || c->gen == dead)
		return err_fmt(err, -ENOTCONN,
			       "gmbd has been unreachable for %u ms; libgmb keeps"
			       " reconnecting",
			       c->reconnect_wait_ms);
	return 0;
}

/* Whether @arg's answer is in: read without the lock, as spin_until()'s hint. */
static bool request_pending_done(void *arg)
{
	const struct gmb__pending *p = arg;

	return __atomic_load_n(&p->done, __ATOMIC_ACQUIRE);
}

/*
 * One try on a connection other than @dead (*@gen: the one used). Return:
 * 0 with the reply (or p->lost) in @p; -ENOTCONN from the send, when the
 * socket died under it (nothing went out); or request_wait_ready()'s failure
 * with *@waited set.
 */
static int request_once(struct gmb__conn *c, Gmb__Envelope *env, struct gmb__pending *p,
			uint64_t dead, uint64_t *gen, bool *waited, bool *crossed, char *err)
{
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = request_wait_ready(c, dead, crossed, err);
	if (rc < 0) {
		pthread_mutex_unlock(&c->lock);
		*waited = true;
		return rc;
	}
	*p = (struct gmb__pending){ .id = ++c->next_id, .next = c->pending };
	c->pending = p;
	*gen = c->gen;
	pthread_mutex_unlock(&c->lock);
	env->id = p->id;
	env->reply_to = 0;
	rc = request_send(c, *gen, env);
	/* The answer of most requests is microseconds away: poll for it before
	 * sleeping on reply_cond (common/spin.h). A hint; the lock decides. */
	if (rc == 0)
		spin_until(request_pending_done, p, c->spin_ns);
	pthread_mutex_lock(&c->lock);
	while (rc == 0 && !p->done)
		pthread_cond_wait(&c->reply_cond, &c->lock);
	request_unlink(c, p);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/**
 * gmb__request() - send @env as a request and wait for its whole reply.
 * env->id is assigned here. While gmbd is away the call waits for the
 * reconnection (at most reconnect_wait_ms); a request whose answer the
 * loss swallowed is sent again once the client is back (rep->resent: the
 * first copy may have been carried out). @rep receives every part (the
 * caller owns it: gmb__reply_deinit(), also on failure); rep->status is
 * gmbd's status, or -ENOTCONN when there was no connection to be had.
 * Return: 0; gmbd's status with its message in @err; -ENOTCONN; or an
 * import failure of the reply's fds (rep->status then is 0: gmbd lent).
 */
int gmb__request(struct gmb__conn *c, Gmb__Envelope *env, struct gmb__reply *rep, char *err)
{
	struct gmb__pending p = { 0 };
	uint64_t dead = 0, gen = 0;
	bool resent = false, waited = false;
	int rc;

	for (;;) {
		/* A request that waited out a reconnection goes after the
		 * re-announcement too: resent, as one lost on the way. */
		rc = request_once(c, env, &p, dead, &gen, &waited, &resent, err);
		if (waited || (rc == 0 && !p.lost))
			break;
		gmb__reply_deinit(&p.reply);
		if (rc < 0 && rc != -ENOTCONN) {
			err_fmt(err, rc, "sending to gmbd: %s", strerror(-rc));
			break;
		}
		/* Lost on the way, or the send met the dead socket: the next
		 * connection (request_wait_ready() fails once there is none). Either
		 * way the request now goes after a re-announcement, which may
		 * have done it already (a free is left out of the claim). */
		resent = true;
		dead = gen;
	}
	*rep = p.reply;
	if (waited || rc < 0) {
		*rep = (struct gmb__reply)GMB__REPLY_INIT;
		rep->status = rc;
	}
	rep->resent = resent;
	if (rc < 0)
		return rc;
	return request_result(rep, err);
}

int gmb__request_status(struct gmb__conn *c, Gmb__Envelope *env, char *err)
{
	struct gmb__reply rep;
	int rc = gmb__request(c, env, &rep, err);

	gmb__reply_deinit(&rep);
	return rc;
}

/** gmb__send_reply() - answer gmbd's request @reply_to of connection @gen. */
int gmb__send_reply(struct gmb__conn *c, uint64_t gen, uint64_t reply_to, int status,
		    const char *error)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.reply_to = reply_to;
	env.status = status;
	env.error = (char *)(error ? error : "");
	return request_send(c, gen, &env);
}

/** gmb__op_begin() - op_lock for an operation; see conn.h. */
void gmb__op_begin(struct gmb__conn *c)
{
	pthread_mutex_lock(&c->op_lock);
	pthread_mutex_lock(&c->lock);
	while (c->rejoining)
		pthread_cond_wait(&c->conn_cond, &c->lock);
	c->op_running = true;
	c->op_parked = false;
	c->op_owner = pthread_self();
	pthread_mutex_unlock(&c->lock);
}

void gmb__op_end(struct gmb__conn *c)
{
	pthread_mutex_lock(&c->lock);
	c->op_running = false;
	pthread_cond_broadcast(&c->conn_cond);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&c->op_lock);
}

/* The reader thread's half: a reply's parts, filed with their request. */

/** gmb__reply_import_fail() - the first failure importing @rep's fds is the one kept. */
void gmb__reply_import_fail(struct gmb__reply *rep, int rc, const char *what, uint64_t id)
{
	if (rep->import_err < 0)
		return;
	rep->import_err = rc;
	snprintf(rep->import_msg, sizeof(rep->import_msg), "importing chunk %" PRIu64 ": %s", id,
		 what);
}

/* Keeps @env in @rep (consumed either way). */
static void request_keep_part(struct gmb__reply *rep, Gmb__Envelope *env)
{
	if (rep->nparts == rep->cap) {
		size_t cap = rep->cap ? rep->cap * 2 : 4;
		Gmb__Envelope **v = realloc(rep->parts, cap * sizeof(*v));

		if (!v) {
			gmb__reply_import_fail(rep, -ENOMEM, "no memory to keep gmbd's reply", 0);
			gmb__envelope__free_unpacked(env, NULL);
			return;
		}
		rep->parts = v;
		rep->cap = cap;
	}
	rep->parts[rep->nparts++] = env;
}

/**
 * gmb__request_on_reply() - file a part of a reply with its request, on the
 * reader thread; consumes @env and @fds.
 */
void gmb__request_on_reply(struct gmb__conn *c, Gmb__Envelope *env, int *fds, int nfds)
{
	struct gmb__pending *p;
	struct gmb__reply *rep;

	pthread_mutex_lock(&c->lock);
	p = request_find(c, env->reply_to);
	pthread_mutex_unlock(&c->lock);
	if (!p) {
		/* An answer to nothing of ours (a request given up on): nothing to do. */
		wire_close_fds(fds, nfds);
		gmb__envelope__free_unpacked(env, NULL);
		return;
	}
	rep = &p->reply;
	/* The layer above imports the chunks; the fds are closed here whatever happens. */
	if (nfds > 0)
		c->cbs.import(c->cbs.mem_arg, env, fds, nfds, rep);
	wire_close_fds(fds, nfds);
	pthread_mutex_lock(&c->lock);
	if (!env->more) {
		/* Atomic for request_pending_done(); under the lock for everyone else. */
		__atomic_store_n(&p->done, true, __ATOMIC_RELEASE);
		rep->status = env->status > 0 ? -EPROTO : env->status;
		snprintf(rep->error, sizeof(rep->error), "%s", env->error ? env->error : "");
		pthread_cond_broadcast(&c->reply_cond);
	}
	request_keep_part(rep, env);
	pthread_mutex_unlock(&c->lock);
}
