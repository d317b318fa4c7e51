/*
 * reconnect.c - libgmb after its connection to gmbd is lost (gmbd
 * restarted, crashed, or was upgraded): reconnect with backoff and
 * re-announce what this client holds, on the reader thread.
 *
 * One attempt: connect (non-blocking, so that a full backlog is a retry,
 * not a hang), wait until no operation runs or the one running is parked
 * waiting for the connection (the tables are then still), say hello with
 * the client id of before (rejoin_id), send the claim in parts, apply the
 * answer (last lends gmbd cleared, handles to drop), then make the new
 * socket the client's. Mappings are never touched: the application's
 * pointers stay valid throughout, whatever gmbd answers.
 *
 * Transport failures are retried, 50 ms after the first and doubling up to
 * 2 s, until gmb_close(). The first try is at once, unless the connection
 * was lost within RECONNECT_STABLE_MS of the last reconnect: a gmbd that
 * takes the client back and then drops it again (a reply it cannot send)
 * gets the backoff where the last loss left it, not a new client every
 * millisecond. A refusal (gmbd has no record of this client:
 * it was stopped rather than restarted, or reclaimed the client after its
 * grace period; or it refused the claim) is final: the client is gone and
 * every later call fails with -ENOTCONN and gmbd's reason.
 *
 * The handshake has its own timeouts (a gmbd that accepted and hangs must
 * not hold the re-announcement, and with it the application, forever).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/conn/reconnect.h"
#include "common/deadline.h"

#define RECONNECT_FIRST_MS    50
#define RECONNECT_MAX_MS      2000
#define RECONNECT_STABLE_MS   5000 /* a connection this old was not lost "again" */
#define RECONNECT_HANDSHAKE_S 10
#define RECONNECT_WAIT_S      30 /* GMB_RECONNECT_TIMEOUT's default */
#define RECONNECT_PART_BYTES  (WIRE_MAX_MSG / 2)
#define RECONNECT_RETRY	      1 /* an attempt's "try again later" */

void gmb__reconnect_config(struct gmb__conn *c)
{
	const char *on = getenv("GMB_RECONNECT");
	const char *wait = getenv("GMB_RECONNECT_TIMEOUT");
	char *end;
	unsigned long s = RECONNECT_WAIT_S;

	c->sock_next = -1;
	c->reconnect = !(c->flags & GMB_CONNECT_TOOL) && !(on && strcmp(on, "0") == 0);
	if (wait && *wait) {
		errno = 0;
		s = strtoul(wait, &end, 10);
		if (errno || *end || s > 86400)
			s = RECONNECT_WAIT_S;
	}
	c->reconnect_wait_ms = (unsigned)s * 1000;
}

/* ---- the socket ---- */

/* Publishes @fd so that gmb_close() can shut it down; false when closing. */
static bool reconnect_publish(struct gmb__conn *c, int fd)
{
	bool ok;

	pthread_mutex_lock(&c->lock);
	ok = !c->closing;
	if (ok)
		c->sock_next = fd;
	pthread_mutex_unlock(&c->lock);
	return ok;
}

/* Waits @ms or until gmb_close(); false when closing. */
static bool reconnect_sleep(struct gmb__conn *c, unsigned ms)
{
	struct timespec until = deadline_in_ms(ms);
	bool closing;

	pthread_mutex_lock(&c->lock);
	while (!c->closing && pthread_cond_timedwait(&c->conn_cond, &c->lock, &until) != ETIMEDOUT)
		;
	closing = c->closing;
	pthread_mutex_unlock(&c->lock);
	return !closing;
}

/* No operation runs, or the one running is parked; none starts. */
static bool reconnect_quiesce(struct gmb__conn *c)
{
	bool ok;

	pthread_mutex_lock(&c->lock);
	while (c->op_running && !c->op_parked && !c->closing)
		pthread_cond_wait(&c->conn_cond, &c->lock);
	ok = !c->closing;
	c->rejoining = ok;
	pthread_mutex_unlock(&c->lock);
	return ok;
}

/* Ends an attempt that failed: operations may run again. */
static void reconnect_abandon(struct gmb__conn *c, int fd)
{
	pthread_mutex_lock(&c->lock);
	c->rejoining = false;
	c->sock_next = -1;
	pthread_cond_broadcast(&c->conn_cond);
	pthread_mutex_unlock(&c->lock);
	if (fd >= 0)
		close(fd);
}

/* A final refusal: the client is gone, for this reason. */
static int reconnect_refused(struct gmb__conn *c, int rc, const char *fmt, const char *why)
{
	pthread_mutex_lock(&c->lock);
	err_fmt(c->lost_msg, rc, fmt, why);
	pthread_mutex_unlock(&c->lock);
	return rc < 0 ? rc : -EPROTO;
}

/* ---- talking ---- */

/* Sends @env as request @id and reads the next packet: its answer. */
static int reconnect_ask(int fd, Gmb__Envelope *env, uint64_t id, Gmb__Envelope **rep)
{
	int fds[WIRE_MAX_FDS], nfds = 0, rc;

	env->id = id;
	rc = wire_send(fd, env, NULL, 0);
	if (rc == 0)
		rc = wire_recv(fd, rep, fds, &nfds);
	if (rc == 0 && (nfds > 0 || (*rep)->reply_to != id)) {
		wire_close_fds(fds, nfds);
		gmb__envelope__free_unpacked(*rep, NULL);
		rc = -EPROTO;
	}
	return rc;
}

/* gmbd's devices must be the ones this client reserved its ranges for. */
static bool reconnect_same_devices(const struct gmb__conn *c, const Gmb__HelloReply *hr)
{
	if (!hr->backend || strcmp(hr->backend, c->devs.backend_kind) != 0 ||
	    hr->n_devices != (size_t)c->devs.ndevices)
		return false;
	for (size_t i = 0; i < hr->n_devices; i++)
		if (hr->devices[i]->granularity != c->devs.granularity[i])
			return false;
	return true;
}

static int reconnect_hello(struct gmb__conn *c, int fd, uint64_t *next_id)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT, *rep = NULL;
	Gmb__Hello hello = GMB__HELLO__INIT;
	const Gmb__HelloReply *hr;
	int rc;

	hello.version = GMB_PROTOCOL_VERSION;
	hello.name = c->name;
	pthread_mutex_lock(&c->lock);
	hello.control = c->control;
	pthread_mutex_unlock(&c->lock);
	hello.rejoin_id = c->id;
	hello.group = c->group;
	hello.priority = c->priority;
	hello.preemptible = c->preemptible;
	env.body_case = GMB__ENVELOPE__BODY_HELLO;
	env.hello = &hello;
	rc = reconnect_ask(fd, &env, ++*next_id, &rep);
	if (rc < 0)
		return RECONNECT_RETRY;
	hr = rep->body_case == GMB__ENVELOPE__BODY_HELLO_REPLY ? rep->hello_reply : NULL;
	if (rep->status < 0)
		rc = reconnect_refused(
			c, rep->status,
			"gmbd refused this client back after the connection was lost: %s",
			rep->error ? rep->error : "");
	else if (!hr || !hr->rejoined || hr->client_id != c->id)
		rc = reconnect_refused(c, -EPROTO, "%s", "gmbd answered the rejoin out of turn");
	else if (!reconnect_same_devices(c, hr))
		rc = reconnect_refused(c, -ENODEV, "%s",
				       "gmbd came back with other devices than"
				       " the ones this client's memory is on");
	else { /* every operation waits for the rejoin: none reads it now */
		c->devs.release_on_pause = hr->release_on_pause;
		c->devs.gives_back = hr->gives_back;
	}
	gmb__envelope__free_unpacked(rep, NULL);
	return rc;
}

/* ---- the claim ---- */

void gmb__claim_free(struct gmb__claim *cl)
{
	free(cl->tags);
	free(cl->ptags);
	free(cl->allocs);
	free(cl->pallocs);
	free(cl->held);
	free(cl->imports);
	free(cl->pimports);
}

/* Where the claim's parts have got to: tags, allocations, held ids, imports. */
struct reconnect_at {
	size_t t, a, h, i;
};

/* The next part from @at on: as much as RECONNECT_PART_BYTES holds. */
static void reconnect_part(const struct gmb__claim *cl, struct reconnect_at *at,
			   Gmb__RejoinRequest *req)
{
	size_t *t = &at->t, *a = &at->a, *h = &at->h, *i = &at->i;
	size_t bytes = 64;

	req->tags = cl->ptags + *t;
	while (*t < cl->ntags &&
	       (req->n_tags == 0 || bytes + gmb__rejoin_tag__get_packed_size(cl->ptags[*t]) + 8 <
					    RECONNECT_PART_BYTES)) {
		bytes += gmb__rejoin_tag__get_packed_size(cl->ptags[(*t)++]) + 8;
		req->n_tags++;
	}
	/* Every part makes progress: a tag, or else an allocation even if it
	 * is larger than a part should be (it goes alone, as gmbd lent it). */
	req->allocs = cl->pallocs + *a;
	while (*a < cl->nallocs &&
	       ((req->n_allocs == 0 && req->n_tags == 0) ||
		bytes + gmb__rejoin_alloc__get_packed_size(cl->pallocs[*a]) + 8 <
			RECONNECT_PART_BYTES)) {
		bytes += gmb__rejoin_alloc__get_packed_size(cl->pallocs[(*a)++]) + 8;
		req->n_allocs++;
	}
	req->held_chunk_ids = cl->held + *h;
	while (*h < cl->nheld && bytes + 11 < RECONNECT_PART_BYTES) {
		bytes += 11;
		(*h)++;
		req->n_held_chunk_ids++;
	}
	req->imports = cl->pimports + *i;
	while (*i < cl->nimports &&
	       bytes + gmb__rejoin_import__get_packed_size(cl->pimports[*i]) + 8 <
		       RECONNECT_PART_BYTES) {
		bytes += gmb__rejoin_import__get_packed_size(cl->pimports[(*i)++]) + 8;
		req->n_imports++;
	}
	req->last = *t == cl->ntags && *a == cl->nallocs && *h == cl->nheld && *i == cl->nimports;
}

static int reconnect_answer_add(uint64_t **v, size_t *n, const uint64_t *ids, size_t k)
{
	uint64_t *nv;

	if (!k)
		return 0;
	nv = realloc(*v, (*n + k) * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	memcpy(nv + *n, ids, k * sizeof(*nv));
	*v = nv;
	*n += k;
	return 0;
}

/* The rest of gmbd's answer to the last part: RejoinReply parts. */
static int reconnect_read_answer(struct gmb__conn *c, int fd, Gmb__Envelope *rep, uint64_t id,
				 struct gmb__claim_answer *ans)
{
	int fds[WIRE_MAX_FDS], nfds = 0, rc = 0;

	for (;;) {
		const Gmb__RejoinReply *rr = rep->rejoin_reply;
		bool more = rep->more;

		if (rep->status < 0)
			rc = reconnect_refused(c, rep->status,
					       "gmbd refused this client's claim"
					       " after its restart: %s",
					       rep->error ? rep->error : "");
		else if (rep->body_case != GMB__ENVELOPE__BODY_REJOIN_REPLY)
			rc = RECONNECT_RETRY;
		else if (reconnect_answer_add(&ans->cleared, &ans->ncleared, rr->cleared_alloc_ids,
					      rr->n_cleared_alloc_ids) < 0 ||
			 reconnect_answer_add(&ans->drop, &ans->ndrop, rr->drop_chunk_ids,
					      rr->n_drop_chunk_ids) < 0)
			rc = RECONNECT_RETRY;
		gmb__envelope__free_unpacked(rep, NULL);
		if (rc != 0 || !more)
			return rc;
		if (wire_recv(fd, &rep, fds, &nfds) < 0)
			return RECONNECT_RETRY;
		if (nfds || rep->reply_to != id) {
			wire_close_fds(fds, nfds);
			gmb__envelope__free_unpacked(rep, NULL);
			return RECONNECT_RETRY;
		}
	}
}

/* Every part, each answered; the last one's answer into @ans. */
static int reconnect_send_claim(struct gmb__conn *c, int fd, const struct gmb__claim *cl,
				uint64_t *next_id, struct gmb__claim_answer *ans)
{
	struct reconnect_at at = { 0 };

	for (;;) {
		Gmb__Envelope env = GMB__ENVELOPE__INIT, *rep = NULL;
		Gmb__RejoinRequest req = GMB__REJOIN_REQUEST__INIT;
		uint64_t id = ++*next_id;

		reconnect_part(cl, &at, &req);
		env.body_case = GMB__ENVELOPE__BODY_REJOIN;
		env.rejoin = &req;
		if (reconnect_ask(fd, &env, id, &rep) < 0)
			return RECONNECT_RETRY;
		if (req.last)
			return reconnect_read_answer(c, fd, rep, id, ans);
		if (rep->status < 0) {
			int rc = reconnect_refused(c, rep->status,
						   "gmbd refused this client's claim"
						   " after its restart: %s",
						   rep->error ? rep->error : "");

			gmb__envelope__free_unpacked(rep, NULL);
			return rc;
		}
		gmb__envelope__free_unpacked(rep, NULL);
	}
}

/* The new socket becomes the client's; the old one is closed. */
static int reconnect_commit(struct gmb__conn *c, int fd, uint64_t next_id)
{
	struct timeval none = { 0 };
	int old = -1;
	bool ok;

	/* From now on the reader waits as long as gmbd is quiet. */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
	pthread_mutex_lock(&c->send_lock);
	pthread_mutex_lock(&c->lock);
	ok = !c->closing;
	if (ok) {
		old = c->sock;
		c->sock = fd;
		c->gen++;
		c->connected = true;
		if (c->next_id < next_id)
			c->next_id = next_id;
	}
	c->sock_next = -1;
	c->rejoining = false;
	pthread_cond_broadcast(&c->conn_cond);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&c->send_lock);
	close(ok ? old : fd);
	return ok ? 0 : -ESHUTDOWN;
}

/* One attempt: 0 (back), RECONNECT_RETRY, or a final negative errno. */
static int reconnect_once(struct gmb__conn *c)
{
	struct gmb__claim_answer ans = { 0 };
	struct gmb__claim cl;
	uint64_t next_id;
	int fd = -1, rc;

	if (wire_connect_timed(c->path, RECONNECT_HANDSHAKE_S, &fd) < 0)
		return RECONNECT_RETRY;
	if (!reconnect_publish(c, fd) || !reconnect_quiesce(c)) {
		reconnect_abandon(c, fd);
		return -ESHUTDOWN;
	}
	pthread_mutex_lock(&c->lock);
	next_id = c->next_id;
	pthread_mutex_unlock(&c->lock);
	rc = reconnect_hello(c, fd, &next_id);
	if (rc == 0)
		rc = c->cbs.claim_build(c->cbs.mem_arg, &cl) < 0 ? RECONNECT_RETRY : 0;
	if (rc == 0) {
		rc = reconnect_send_claim(c, fd, &cl, &next_id, &ans);
		gmb__claim_free(&cl);
	}
	if (rc == 0)
		c->cbs.claim_apply(c->cbs.mem_arg, &ans);
	free(ans.cleared);
	free(ans.drop);
	if (rc != 0) {
		reconnect_abandon(c, fd);
		return rc;
	}
	return reconnect_commit(c, fd, next_id);
}

static unsigned reconnect_next_delay(unsigned delay)
{
	return delay * 2 < RECONNECT_MAX_MS ? delay * 2 : RECONNECT_MAX_MS;
}

int gmb__reconnect(struct gmb__conn *c)
{
	uint64_t now = deadline_now_ns();
	bool again = c->reconnect_back_ns &&
		     now - c->reconnect_back_ns < (uint64_t)RECONNECT_STABLE_MS * 1000000;
	unsigned delay = again && c->reconnect_delay_ms ? c->reconnect_delay_ms :
							  RECONNECT_FIRST_MS;

	/* The first try at once, after a connection that lived: under socket
	 * activation the manager queues the connection until the next gmbd
	 * accepts it. */
	if (again) {
		if (!reconnect_sleep(c, delay))
			return -ESHUTDOWN;
		delay = reconnect_next_delay(delay);
	}
	for (;;) {
		int rc = reconnect_once(c);

		if (rc == 0) {
			c->reconnect_back_ns = deadline_now_ns();
			c->reconnect_delay_ms = delay;
		}
		if (rc <= 0)
			return rc;
		if (!reconnect_sleep(c, delay))
			return -ESHUTDOWN;
		delay = reconnect_next_delay(delay);
	}
}
