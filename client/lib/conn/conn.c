/*
 * conn.c - libgmb's connection to gmbd: hello, the connection's life (open,
 * start, stop) and the two library threads, the reader and the worker.
 * What a request does from its send to its last reply part is request.c's:
 * the reader here reads every packet and hands each reply part there.
 *
 * The reader thread owns every read of the socket. A reply part goes to the
 * pending request it answers (by reply_to, gmb__request_on_reply()); the
 * chunk fds it carries are handed to the memory layer's import callback at
 * once and closed, so that a reply lending thousands of chunks never holds
 * more than one batch of fds.
 * DropRequests go to the drop callback on the reader too: the memory layer
 * touches only the handle cache under the state lock, never the operation
 * lock, so a drop gmbd waits for is answered even while an operation of this
 * client waits for gmbd. ControlCommands go to the worker thread, whose
 * callback may run the application's handler and take the operation lock;
 * the reader never waits on either.
 *
 * When the connection is lost the reader reconnects (cbs.reconnect) unless
 * the client is gone for good: a tool, gmb_close(), gmbd's Bye (it stopped
 * and keeps nothing) or a refused rejoin. Requests wait for it (bounded by
 * reconnect_wait_ms); one whose answer the loss swallowed is sent again.
 *
 * Invariants:
 *   - connected is true while the current socket serves; once false, every
 *     pending request has completed (lost, status -ENOTCONN) and new ones
 *     wait for the next connection, or fail at once when gone.
 *   - gen counts connections; an answer to gmbd's request goes out only on
 *     the connection the request came on.
 *   - Once gone, the last socket stays open: a gmbd that still runs keeps
 *     counting this client's memory as lent (it still is mapped here) until
 *     gmb_close() unmaps it and closes the socket.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/conn/conn.h"
#include "common/env.h"
#include "common/deadline.h"
#include "common/spin.h"

static void *conn_reader_main(void *arg);
static void *conn_worker_main(void *arg);

static int conn_take_devices(struct gmb__conn *c, const Gmb__HelloReply *hr, char *err)
{
	if (hr->n_devices == 0 || hr->n_devices > BACKEND_MAX_DEVICES)
		return err_fmt(err, -EPROTO, "gmbd reported %zu devices (want 1..%d)",
			       hr->n_devices, BACKEND_MAX_DEVICES);
	for (size_t i = 0; i < hr->n_devices; i++) {
		uint64_t g = hr->devices[i]->granularity;

		if (g == 0 || (g & (g - 1)))
			return err_fmt(err, -EPROTO,
				       "gmbd reported granularity 0x%" PRIx64 " for device %zu", g,
				       i);
		c->devs.granularity[i] = g;
		c->devs.max_chunk[i] = hr->devices[i]->max_chunk_bytes;
		memset(c->devs.uuid[i], 0, sizeof(c->devs.uuid[i]));
		if (hr->devices[i]->uuid.len == sizeof(c->devs.uuid[i]))
			memcpy(c->devs.uuid[i], hr->devices[i]->uuid.data, sizeof(c->devs.uuid[i]));
	}
	c->devs.ndevices = (int)hr->n_devices;
	c->devs.device_bytes = hr->devices[0]->total_bytes;
	return 0;
}

static int conn_take_hello(struct gmb__conn *c, const Gmb__Envelope *rep, uint64_t id, char *err)
{
	const Gmb__HelloReply *hr = rep->hello_reply;

	if (rep->reply_to != id || rep->more)
		return err_fmt(err, -EPROTO, "gmbd answered hello out of turn");
	if (rep->status < 0)
		return err_fmt(err, rep->status, "gmbd refused hello: %s",
			       rep->error && *rep->error ? rep->error : strerror(-rep->status));
	if (rep->body_case != GMB__ENVELOPE__BODY_HELLO_REPLY)
		return err_fmt(err, -EPROTO, "gmbd answered hello with message %d",
			       (int)rep->body_case);
	if (hr->version != GMB_PROTOCOL_VERSION)
		return err_fmt(err, -EPROTO, "gmbd speaks protocol %u, libgmb %d", hr->version,
			       GMB_PROTOCOL_VERSION);
	if (!hr->backend || (strcmp(hr->backend, "host") && strcmp(hr->backend, "cuda")))
		return err_fmt(err, -EPROTO, "gmbd runs an unknown backend \"%s\"",
			       hr->backend ? hr->backend : "");
	snprintf(c->devs.backend_kind, sizeof(c->devs.backend_kind), "%s", hr->backend);
	c->id = hr->client_id;
	c->devs.release_on_pause = hr->release_on_pause;
	c->devs.gives_back = hr->gives_back;
	return conn_take_devices(c, hr, err);
}

/* Hello before the threads start: the daemon sends nothing else until it answers. */
static int conn_hello(struct gmb__conn *c, const char *name, unsigned flags, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT, *rep = NULL;
	Gmb__Hello hello = GMB__HELLO__INIT;
	int fds[WIRE_MAX_FDS], nfds = 0, rc;

	hello.version = GMB_PROTOCOL_VERSION;
	hello.name = (char *)name;
	/* No handler yet: gmb_set_control_handler() tells gmbd when one comes. */
	hello.tool = (flags & GMB_CONNECT_TOOL) != 0;
	hello.control = false;
	hello.group = c->group;
	hello.priority = c->priority;
	hello.preemptible = c->preemptible;
	env.id = ++c->next_id;
	env.body_case = GMB__ENVELOPE__BODY_HELLO;
	env.hello = &hello;
	rc = wire_send(c->sock, &env, NULL, 0);
	if (rc < 0)
		return err_fmt(err, rc, "sending hello to gmbd: %s", strerror(-rc));
	rc = wire_recv(c->sock, &rep, fds, &nfds);
	if (rc < 0)
		return err_fmt(err, rc, "reading gmbd's hello reply: %s", strerror(-rc));
	if (nfds > 0) {
		wire_close_fds(fds, nfds);
		rc = err_fmt(err, -EPROTO, "gmbd sent fds with its hello reply");
		goto out_rep;
	}
	rc = conn_take_hello(c, rep, env.id, err);
out_rep:
	gmb__envelope__free_unpacked(rep, NULL);
	return rc;
}

void gmb__conn_init(struct gmb__conn *c)
{
	pthread_condattr_t ca;

	c->sock = -1;
	c->sock_next = -1;
	c->jobs_tail = &c->jobs;
	c->events_tail = &c->events;
	pthread_mutex_init(&c->op_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->send_lock, NULL);
	pthread_cond_init(&c->reply_cond, NULL);
	pthread_cond_init(&c->work_cond, NULL);
	/* gmb_poll's timeout must not jump with the wall clock. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->poll_cond, &ca);
	pthread_cond_init(&c->conn_cond, &ca);
	pthread_cond_init(&c->event_cond, &ca);
	pthread_condattr_destroy(&ca);
}

static void conn_free_jobs(struct gmb__job *job);

/* One list of @c's condition variables, so that none is left out of a
 * wake-up of every waiter or of the teardown. */
static void conn_each_cond(struct gmb__conn *c, int (*fn)(pthread_cond_t *))
{
	pthread_cond_t *all[] = { &c->reply_cond, &c->work_cond, &c->poll_cond, &c->conn_cond,
				  &c->event_cond };

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		fn(all[i]);
}

/* Empties the queue of commands; the list returned is the caller's to free. */
static struct gmb__job *conn_take_jobs(struct gmb__conn *c)
{
	struct gmb__job *jobs = c->jobs;

	c->jobs = NULL;
	c->jobs_tail = &c->jobs;
	return jobs;
}

void gmb__conn_deinit(struct gmb__conn *c)
{
	conn_free_jobs(conn_take_jobs(c));
	conn_free_jobs(c->events);
	c->events = NULL;
	c->events_tail = &c->events;
	conn_each_cond(c, pthread_cond_destroy);
	pthread_mutex_destroy(&c->send_lock);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->op_lock);
	free(c->path);
	c->path = NULL;
}

/* What the hello says for arbitration, from the environment (not tools). */
static int conn_arb_env(struct gmb__conn *c, unsigned flags, char *err)
{
	const char *g = getenv("GMB_GROUP"), *p = getenv("GMB_PRIORITY");
	char *end;
	long v;

	if (flags & GMB_CONNECT_TOOL)
		return 0;
	if (g && strlen(g) > WIRE_MAX_NAME)
		return err_fmt(err, -EINVAL, "GMB_GROUP is longer than %d bytes", WIRE_MAX_NAME);
	snprintf(c->group, sizeof(c->group), "%s", g ? g : "");
	if (p && *p) {
		errno = 0;
		v = strtol(p, &end, 10);
		if (errno || *end || v < INT32_MIN || v > INT32_MAX)
			return err_fmt(err, -EINVAL, "GMB_PRIORITY=\"%.32s\" is not an integer", p);
		c->priority = (int)v;
	}
	c->preemptible = false;
	return env_01("GMB_PREEMPTIBLE", &c->preemptible, err);
}

/* $GMB_SPIN_US: microseconds polled before a blocking wait (spin.h). */
static int conn_spin_env(struct gmb__conn *c, char *err)
{
	unsigned long us = SPIN_DEFAULT_US;
	int rc = env_uint("GMB_SPIN_US", SPIN_MAX_US, "microseconds", &us, err);

	c->spin_ns = (uint64_t)us * 1000;
	return rc;
}

/**
 * gmb__conn_open() - connect to @path (NULL: the default) and say hello.
 * The socket is c->sock on success (owned by @c), closed on failure.
 */
int gmb__conn_open(struct gmb__conn *c, const char *path, const char *name, unsigned flags,
		   char *err)
{
	int rc;

	if (!path)
		path = wire_default_socket();
	if (!name)
		name = program_invocation_short_name;
	c->path = strdup(path);
	if (!c->path)
		return err_fmt(err, -ENOMEM, "out of memory for the socket path");
	snprintf(c->name, sizeof(c->name), "%s", name);
	rc = conn_arb_env(c, flags, err);
	if (rc == 0)
		rc = conn_spin_env(c, err);
	if (rc < 0)
		return rc;
	rc = wire_connect(path, &c->sock);
	if (rc == -ENOTSOCK)
		return err_fmt(err, rc, "%s is not a socket (name gmbd's socket)", path);
	if (rc == -ENOENT || rc == -ECONNREFUSED)
		return err_fmt(err, rc, "no gmbd listens on %s (%s)", path, strerror(-rc));
	if (rc < 0)
		return err_fmt(err, rc, "connecting to gmbd at %s: %s", path, strerror(-rc));
	c->flags = flags;
	rc = conn_hello(c, name, flags, err);
	if (rc < 0)
		goto out_sock;
	c->connected = true;
	c->gen = 1;
	return 0;

out_sock:
	close(c->sock);
	c->sock = -1;
	return rc;
}

/* Library threads take no signals: those belong to the application's threads. */
static int conn_spawn(pthread_t *t, void *(*fn)(void *), struct gmb__conn *c)
{
	sigset_t all, old;
	int rc;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(t, NULL, fn, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

/** gmb__conn_start() - start the reader and the worker. */
int gmb__conn_start(struct gmb__conn *c, char *err)
{
	int rc = conn_spawn(&c->reader, conn_reader_main, c);

	if (rc < 0)
		return err_fmt(err, rc, "starting libgmb's reader thread: %s", strerror(-rc));
	c->reader_started = true;
	rc = conn_spawn(&c->worker, conn_worker_main, c);
	if (rc < 0)
		return err_fmt(err, rc, "starting libgmb's worker thread: %s", strerror(-rc));
	c->worker_started = true;
	return 0;
}

/**
 * gmb__conn_closing() - gmb_close() begins: no reconnecting from now on. A
 * reconnect that has not published its socket yet sees closing and gives
 * up; one that has is shut down here. The current connection stays up.
 */
void gmb__conn_closing(struct gmb__conn *c)
{
	int next;

	pthread_mutex_lock(&c->lock);
	c->closing = true;
	next = c->sock_next;
	pthread_cond_broadcast(&c->conn_cond);
	pthread_mutex_unlock(&c->lock);
	if (next >= 0)
		shutdown(next, SHUT_RDWR);
}

/**
 * gmb__conn_stop() - end the connection and join the threads. The socket
 * fd stays open (the caller closes it): only shutdown() wakes the reader.
 */
void gmb__conn_stop(struct gmb__conn *c)
{
	int sock;

	gmb__conn_closing(c);
	pthread_mutex_lock(&c->lock);
	sock = c->sock;
	pthread_mutex_unlock(&c->lock);
	if (sock >= 0)
		shutdown(sock, SHUT_RDWR);
	if (c->reader_started)
		pthread_join(c->reader, NULL);
	c->reader_started = false;
	/* The reader's exit marked the client gone, which wakes the worker. */
	pthread_mutex_lock(&c->lock);
	c->connected = false;
	c->gone = true;
	pthread_cond_broadcast(&c->work_cond);
	pthread_mutex_unlock(&c->lock);
	if (c->worker_started)
		pthread_join(c->worker, NULL);
	c->worker_started = false;
}

/* The reader thread. */

static void conn_handled(struct gmb__conn *c)
{
	pthread_mutex_lock(&c->lock);
	c->handled++;
	pthread_cond_broadcast(&c->poll_cond);
	pthread_mutex_unlock(&c->lock);
}

static int conn_enqueue(struct gmb__conn *c, Gmb__Envelope *env)
{
	struct gmb__job *job = malloc(sizeof(*job));

	if (!job)
		return -ENOMEM;
	/* Only the reader changes gen, and this is the reader. */
	*job = (struct gmb__job){ .env = env, .gen = c->gen };
	pthread_mutex_lock(&c->lock);
	*c->jobs_tail = job;
	c->jobs_tail = &job->next;
	pthread_cond_signal(&c->work_cond);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* A request from gmbd; consumes @env. */
static void conn_on_request(struct gmb__conn *c, Gmb__Envelope *env)
{
	char err[ERR_MSG_MAX] = "";
	uint64_t id = env->id;
	int rc;

	switch (env->body_case) {
	case GMB__ENVELOPE__BODY_DROP:
		rc = c->cbs.drop(c->cbs.mem_arg, env->drop->chunk_ids, env->drop->n_chunk_ids, err);
		gmb__send_reply(c, c->gen, id, rc < 0 ? rc : 0, rc < 0 ? err : NULL);
		conn_handled(c);
		break;
	case GMB__ENVELOPE__BODY_CONTROL_CMD:
	case GMB__ENVELOPE__BODY_IPC_FOLLOW: /* an import follows its owner: op_lock */
		if (conn_enqueue(c, env) == 0)
			return;
		gmb__send_reply(c, c->gen, id, -ENOMEM, "libgmb is out of memory");
		break;
	default:
		gmb__send_reply(c, c->gen, id, -EOPNOTSUPP, "libgmb does not handle this request");
		break;
	}
	gmb__envelope__free_unpacked(env, NULL);
}

/* gmbd stops and keeps nothing: the coming end of stream is final. */
static void conn_on_bye(struct gmb__conn *c, Gmb__Envelope *env)
{
	pthread_mutex_lock(&c->lock);
	c->bye = true;
	/* gmbd's reason is a sentence of its own ("gmbd stopped and kept no state"). */
	err_fmt(c->lost_msg, -ENOTCONN, "%s",
		env->bye->reason && *env->bye->reason ? env->bye->reason : "gmbd stopped");
	pthread_mutex_unlock(&c->lock);
	gmb__envelope__free_unpacked(env, NULL);
}

/* A WatchEvent notice: queued for gmb_watch_next(); consumes @env. */
static void conn_on_event(struct gmb__conn *c, Gmb__Envelope *env)
{
	struct gmb__job *ev = NULL;

	pthread_mutex_lock(&c->lock);
	if (c->nevents < GMB__MAX_EVENTS)
		ev = malloc(sizeof(*ev));
	if (ev) {
		*ev = (struct gmb__job){ .env = env, .gen = c->gen };
		*c->events_tail = ev;
		c->events_tail = &ev->next;
		c->nevents++;
		pthread_cond_broadcast(&c->event_cond);
	} else {
		c->events_lost++;
	}
	pthread_mutex_unlock(&c->lock);
	if (!ev)
		gmb__envelope__free_unpacked(env, NULL);
}

/* One packet. Return: 0, or why reading must stop. */
static int conn_read_one(struct gmb__conn *c)
{
	Gmb__Envelope *env = NULL;
	int fds[WIRE_MAX_FDS], nfds = 0, rc;
	uint64_t now;

	/* After a reply the caller's next request is likely microseconds away:
	 * its answer is read as it comes, not after a wake-up (spin.h). */
	if (c->reader_spin_until) {
		now = deadline_now_ns();
		if (now < c->reader_spin_until)
			spin_fd_readable(c->sock, c->reader_spin_until - now);
		c->reader_spin_until = 0;
	}
	rc = wire_recv(c->sock, &env, fds, &nfds);
	if (rc < 0)
		return rc;
	/* Requests carry no fds, and every fd needs its chunk's size. */
	if (env->n_fd_sizes != env->n_fd_chunks || (nfds > 0 && !env->reply_to)) {
		wire_close_fds(fds, nfds);
		gmb__envelope__free_unpacked(env, NULL);
		return -EPROTO;
	}
	if (env->reply_to) {
		gmb__request_on_reply(c, env, fds, nfds);
		if (c->spin_ns)
			c->reader_spin_until = deadline_now_ns() + c->spin_ns;
	} else if (env->id)
		conn_on_request(c, env);
	else if (env->body_case == GMB__ENVELOPE__BODY_BYE)
		conn_on_bye(c, env);
	else if (env->body_case == GMB__ENVELOPE__BODY_WATCH_EVENT)
		conn_on_event(c, env);
	else
		gmb__envelope__free_unpacked(env, NULL);
	return 0;
}

static void conn_free_jobs(struct gmb__job *job)
{
	while (job) {
		struct gmb__job *next = job->next;

		gmb__envelope__free_unpacked(job->env, NULL);
		free(job);
		job = next;
	}
}

/*
 * Every waiter learns the connection is lost: pending requests complete
 * (lost), queued commands are dropped (they can only be answered on their
 * own connection). Return: whether to reconnect.
 */
static bool conn_lost(struct gmb__conn *c, int why)
{
	struct gmb__job *jobs;
	bool again;

	pthread_mutex_lock(&c->lock);
	c->connected = false;
	for (struct gmb__pending *p = c->pending; p; p = p->next) {
		if (p->done)
			continue;
		p->lost = true;
		__atomic_store_n(&p->done, true, __ATOMIC_RELEASE);
		p->reply.status = -ENOTCONN;
		snprintf(p->reply.error, sizeof(p->reply.error),
			 "the connection to gmbd was lost before it answered");
	}
	jobs = conn_take_jobs(c);
	again = c->reconnect && !c->bye && !c->closing;
	if (!again) {
		c->gone = true;
		if (!c->lost_msg[0])
			err_fmt(c->lost_msg, -ENOTCONN, "the connection to gmbd is lost (%s)",
				strerror(-why));
	}
	conn_each_cond(c, pthread_cond_broadcast);
	pthread_mutex_unlock(&c->lock);
	conn_free_jobs(jobs);
	return again;
}

static void conn_gone(struct gmb__conn *c)
{
	pthread_mutex_lock(&c->lock);
	c->connected = false;
	c->gone = true;
	conn_each_cond(c, pthread_cond_broadcast);
	pthread_mutex_unlock(&c->lock);
}

static void *conn_reader_main(void *arg)
{
	struct gmb__conn *c = arg;
	int rc;

	do {
		while ((rc = conn_read_one(c)) == 0)
			;
	} while (conn_lost(c, rc) && c->cbs.reconnect(c) == 0);
	conn_gone(c);
	return NULL;
}

/* The worker thread. */

static struct gmb__job *conn_next_job(struct gmb__conn *c)
{
	struct gmb__job *job;

	pthread_mutex_lock(&c->lock);
	while (!c->jobs && !c->gone)
		pthread_cond_wait(&c->work_cond, &c->lock);
	job = c->gone ? NULL : c->jobs;
	if (job) {
		c->jobs = job->next;
		if (!c->jobs)
			c->jobs_tail = &c->jobs;
	}
	pthread_mutex_unlock(&c->lock);
	return job;
}

/* Commands that arrived before the connection died can no longer be answered. */
static void conn_drop_jobs(struct gmb__conn *c)
{
	struct gmb__job *job;

	pthread_mutex_lock(&c->lock);
	job = conn_take_jobs(c);
	pthread_mutex_unlock(&c->lock);
	conn_free_jobs(job);
}

static void *conn_worker_main(void *arg)
{
	struct gmb__conn *c = arg;
	struct gmb__job *job;

	while ((job = conn_next_job(c))) {
		c->cbs.control(c->cbs.ctl_arg, job);
		gmb__envelope__free_unpacked(job->env, NULL);
		free(job);
		conn_handled(c);
	}
	conn_drop_jobs(c);
	return NULL;
}
