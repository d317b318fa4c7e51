/*
 * api.c - the exported functions of include/gmb.h.
 *
 * Each public call checks its arguments, runs the internal operation under
 * the right lock and, on failure, copies the operation's message into the
 * client's last_error under the state lock. Operations that change memory
 * (malloc, free, mode, pause, resume) hold op_lock, which the worker thread
 * also takes to carry out gmbd's ControlCommands, so a remote pause never
 * interleaves with the application's own calls. Queries (status, control of
 * another client, trim) only make a round trip and take no op_lock, so a
 * gmb_control() aimed at this very client cannot deadlock.
 *
 * While gmbd is away (a restart), every call that needs it waits for the
 * library to reconnect, at most $GMB_RECONNECT_TIMEOUT seconds (default
 * 30; 0: not at all), then fails with -ENOTCONN and says so in
 * gmb_last_error(). Memory stays mapped and usable meanwhile.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/api/client.h"
#include "client/lib/api/status_json.h"
#include "client/lib/conn/reconnect.h"
#include "common/deadline.h"
#include "common/env.h"
#include "common/size.h"

/* gmb_connect() fails before there is a client to hold the reason: the
 * calling thread keeps it, for gmb_last_error(NULL). */
static __thread char api_connect_error[ERR_MSG_MAX];

static int api_done(struct gmb_client *c, int rc, const char *err)
{
	if (rc >= 0)
		return rc;
	pthread_mutex_lock(&c->conn.lock);
	err_fmt(c->last_error, rc, "%s", *err ? err : gmb_strerror(rc));
	pthread_mutex_unlock(&c->conn.lock);
	return rc;
}

static void api_control_run(void *arg, const struct gmb__job *job);

/* $GMB_WAIT_MS: the initial wait of every client (the preload shim's too). */
static int api_wait_env(struct gmb_client *c, char *err)
{
	unsigned long v = c->mem.wait_ms;
	int rc = env_uint("GMB_WAIT_MS", UINT32_MAX, "milliseconds", &v, err);

	c->mem.wait_ms = (uint32_t)v;
	return rc;
}

/* $GMB_IPC_FOLLOW and $GMB_IPC_KEEP (0 or 1), $GMB_IPC_GRANT (uids, comma-separated). */
static int api_ipc_env(struct gmb_client *c, char *err)
{
	const char *g = getenv("GMB_IPC_GRANT");
	const size_t max = sizeof(c->mem.ipc_grants) / sizeof(c->mem.ipc_grants[0]);
	unsigned long v;
	char *end;
	int rc;

	rc = env_01("GMB_IPC_FOLLOW", &c->mem.ipc_follow, err);
	if (rc == 0)
		rc = env_01("GMB_IPC_KEEP", &c->mem.ipc_keep, err);
	if (rc < 0)
		return rc;
	c->mem.pack = gmb__pack_env();
	if (c->mem.pack < 0)
		return err_fmt(err, -EINVAL, "GMB_PACK=\"%.32s\" is none of off, hooks, all",
			       getenv("GMB_PACK"));
	while (g && *g) {
		errno = 0;
		v = strtoul(g, &end, 10);
		if (errno || end == g || (*end && *end != ',') || g[0] == '-' || v > UINT32_MAX)
			return err_fmt(err, -EINVAL, "GMB_IPC_GRANT: \"%.32s\" is not a uid", g);
		if (c->mem.nipc_grants == max)
			return err_fmt(err, -EINVAL, "GMB_IPC_GRANT names more than %zu uids", max);
		c->mem.ipc_grants[c->mem.nipc_grants++] = (uint32_t)v;
		g = *end ? end + 1 : end;
	}
	return 0;
}

/* The wait for requests that take no op_lock (written under both locks). */
static uint32_t api_wait(struct gmb_client *c)
{
	uint32_t ms;

	pthread_mutex_lock(&c->conn.lock);
	ms = c->mem.wait_ms;
	pthread_mutex_unlock(&c->conn.lock);
	return ms;
}

static void api_client_free(struct gmb_client *c)
{
	gmb__conn_deinit(&c->conn);
	free(c);
}

/* A client whose layers know each other: the connection calls up only through cbs. */
static struct gmb_client *api_client_new(void)
{
	struct gmb_client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	gmb__conn_init(&c->conn);
	gmb__mem_init(&c->mem, &c->conn);
	gmb__mem_cbs(&c->mem, &c->conn.cbs);
	c->conn.cbs.claim_build = gmb__rejoin_claim_build;
	c->conn.cbs.claim_apply = gmb__rejoin_claim_apply;
	c->mem.claim_imports = gmb__ipc_claim;
	c->mem.claim_imports_arg = &c->ipc;
	c->conn.cbs.ctl_arg = c;
	c->conn.cbs.control = api_control_run;
	c->conn.cbs.reconnect = gmb__reconnect;
	return c;
}

GMB_API int gmb_connect(const char *socket_path, const char *client_name, gmb_client **out)
{
	return gmb_connect_flags(socket_path, client_name, 0, out);
}

GMB_API int gmb_connect_flags(const char *socket_path, const char *client_name, unsigned flags,
			      gmb_client **out)
{
	char *err = api_connect_error;
	struct gmb_client *c;
	int rc;

	if (!out)
		return err_fmt(err, -EINVAL, "no place for the client");
	*out = NULL;
	if (flags & ~(unsigned)GMB_CONNECT_TOOL)
		return err_fmt(err, -EINVAL, "unknown connect flags 0x%x", flags);
	c = api_client_new();
	if (!c)
		return err_fmt(err, -ENOMEM, "out of memory for a client");
	rc = gmb__conn_open(&c->conn, socket_path, client_name, flags, err);
	if (rc < 0)
		goto out_client;
	gmb__reconnect_config(&c->conn);
	rc = api_wait_env(c, err);
	if (rc == 0)
		rc = api_ipc_env(c, err);
	if (rc < 0)
		goto out_sock;
	/* Workers learn now, not at their first malloc, that they cannot map. */
	if (!(flags & GMB_CONNECT_TOOL)) {
		rc = gmb__mem_backend(&c->mem, err);
		if (rc < 0)
			goto out_sock;
	}
	rc = gmb__conn_start(&c->conn, err);
	if (rc < 0)
		goto out_threads;
	*out = c;
	return 0;

out_threads:
	gmb__conn_stop(&c->conn);
out_sock:
	gmb__mem_deinit(&c->mem);
	close(c->conn.sock);
out_client:
	api_client_free(c);
	return rc;
}

/*
 * gmb_close() - the caller guarantees that no other call on @c is running or
 * follows, and that this is not the control handler (it joins that thread).
 */
GMB_API void gmb_close(gmb_client *c)
{
	if (!c)
		return;
	/* A re-announcement in progress gives up first: it would otherwise
	 * hold the operations (and so this) until its own timeouts. */
	gmb__conn_closing(&c->conn);
	/* Unmap while still connected: once the socket closes gmbd may lend the
	 * chunks to another client, and nothing here may still write to them. */
	gmb__op_begin(&c->conn);
	gmb__ipc_close_all(&c->mem, &c->ipc);
	gmb__cycle_close(&c->mem);
	gmb__op_end(&c->conn);
	gmb__conn_stop(&c->conn);
	gmb__mem_deinit(&c->mem);
	close(c->conn.sock);
	api_client_free(c);
}

GMB_API int gmb_malloc(gmb_client *c, void **ptr, size_t size, int device, const char *tag)
{
	return gmb__malloc_how(c, ptr, size, device, tag, NULL, 0, GMB__PACK_PLAIN);
}

GMB_API int gmb_malloc_peers(gmb_client *c, void **ptr, size_t size, int device, const char *tag,
			     uint64_t peers)
{
	return gmb__malloc_how(c, ptr, size, device, tag, NULL, peers, GMB__PACK_NEVER);
}

int gmb__malloc_how(struct gmb_client *c, void **ptr, size_t size, int device, const char *tag,
		    const struct gmb__mem_how *how, uint64_t peers, enum gmb__pack_class pc)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	gmb__op_begin(&c->conn);
	rc = gmb__allocs_malloc(&c->mem, ptr, size, device, tag, how, peers, pc, err);
	gmb__op_end(&c->conn);
	return api_done(c, rc, err);
}

GMB_API int gmb_free(gmb_client *c, void *ptr)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	gmb__op_begin(&c->conn);
	/* A published allocation is a named object's version now, read-only here. */
	if (gmb__ipc_is_object(&c->ipc, ptr))
		rc = err_fmt(err, -EINVAL,
			     "pointer %p is a named object's version, not an allocation:"
			     " gmb_object_close() it",
			     ptr);
	else
		rc = gmb__allocs_free(&c->mem, ptr, err);
	gmb__op_end(&c->conn);
	return api_done(c, rc, err);
}

GMB_API int gmb_tag_set_mode(gmb_client *c, const char *tag, int mode)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	gmb__op_begin(&c->conn);
	rc = gmb__mem_set_mode(&c->mem, tag, mode, err);
	gmb__op_end(&c->conn);
	return api_done(c, rc, err);
}

/* Pause or resume under op_lock; @err receives the reason. A resume may
 * wait @wait_ms for memory if that is longer than the client's own wait. */
static int api_pause_resume(struct gmb_client *c, int op, const char *tag, uint32_t wait_ms,
			    bool follow, char *err)
{
	bool closing, own_follow;
	uint32_t own;
	int rc;

	gmb__op_begin(&c->conn);
	/* An operator's --follow for this pause only. */
	own_follow = c->mem.ipc_follow;
	c->mem.ipc_follow = own_follow || follow;
	own = c->mem.wait_ms;
	pthread_mutex_lock(&c->conn.lock);
	if (wait_ms > own)
		c->mem.wait_ms = wait_ms;
	pthread_mutex_unlock(&c->conn.lock);
	pthread_mutex_lock(&c->conn.lock);
	closing = c->conn.closing;
	pthread_mutex_unlock(&c->conn.lock);
	if (closing)
		rc = err_fmt(err, -ESHUTDOWN, "the client is closing");
	else if (op == GMB_OP_PAUSE)
		rc = gmb__cycle_pause(&c->mem, tag, err);
	else
		rc = gmb__cycle_resume(&c->mem, tag, err);
	pthread_mutex_lock(&c->conn.lock);
	c->mem.wait_ms = own;
	pthread_mutex_unlock(&c->conn.lock);
	c->mem.ipc_follow = own_follow;
	gmb__op_end(&c->conn);
	return rc;
}

GMB_API int gmb_pause(gmb_client *c, const char *tag)
{
	char err[ERR_MSG_MAX] = "";

	if (!c)
		return -EINVAL;
	return api_done(c, api_pause_resume(c, GMB_OP_PAUSE, tag, 0, false, err), err);
}

GMB_API int gmb_resume(gmb_client *c, const char *tag)
{
	char err[ERR_MSG_MAX] = "";

	if (!c)
		return -EINVAL;
	return api_done(c, api_pause_resume(c, GMB_OP_RESUME, tag, 0, false, err), err);
}

/* Tells gmbd whether a handler is installed; a reconnect's hello says it
 * again, so a lost connection is no failure here. */
static int api_send_control_state(struct gmb_client *c, bool on, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlState req = GMB__CONTROL_STATE__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	int rc;

	req.control = on;
	env.body_case = GMB__ENVELOPE__BODY_CONTROL_STATE;
	env.control_state = &req;
	rc = gmb__request(&c->conn, &env, &rep, err);
	gmb__reply_deinit(&rep);
	return rc == -ENOTCONN ? 0 : rc;
}

GMB_API int gmb_set_control_handler(gmb_client *c, gmb_control_fn fn, void *arg)
{
	char err[ERR_MSG_MAX] = "";
	bool changed;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->conn.lock);
	c->control_fn = fn;
	c->control_arg = fn ? arg : NULL;
	changed = c->conn.control != (fn != NULL);
	c->conn.control = fn != NULL;
	pthread_mutex_unlock(&c->conn.lock);
	if (!changed || (c->conn.flags & GMB_CONNECT_TOOL))
		return 0;
	return api_done(c, api_send_control_state(c, fn != NULL, err), err);
}

/* The handler runs without any library lock held, so it may call gmb_* itself. */
static int api_control_do(struct gmb_client *c, int op, const char *tag, uint32_t wait_ms,
			  bool follow, char *err)
{
	gmb_control_fn fn;
	void *arg;
	int rc;

	pthread_mutex_lock(&c->conn.lock);
	fn = c->control_fn;
	arg = c->control_arg;
	pthread_mutex_unlock(&c->conn.lock);
	if (!fn)
		return err_fmt(err, -EOPNOTSUPP, "no control handler installed");
	if (op != GMB_OP_PAUSE && op != GMB_OP_RESUME)
		return err_fmt(err, -EINVAL, "unknown control operation %d", op);
	rc = fn(arg, op, tag);
	if (rc != 0) {
		rc = rc < 0 ? rc : -ECANCELED;
		return err_fmt(err, rc, "refused by the application (%s)", gmb_strerror(rc));
	}
	return api_pause_resume(c, op, tag, wait_ms, follow, err);
}

/**
 * api_control_run() - the connection's control callback: carry out gmbd's
 * ControlCommand of @job on the worker thread and answer it, on the
 * connection it came on (a gmbd restarted meanwhile never asked). @job
 * stays the caller's.
 */
static void api_control_run(void *arg, const struct gmb__job *job)
{
	struct gmb_client *c = arg;
	const Gmb__ControlCommand *cmd = job->env->control_cmd;
	char err[ERR_MSG_MAX] = "";
	int rc;

	/* An importer asked to follow its owner's pause or resume. */
	if (job->env->body_case == GMB__ENVELOPE__BODY_IPC_FOLLOW) {
		gmb__op_begin(&c->conn);
		rc = gmb__ipc_follow(&c->mem, &c->ipc, job->env->ipc_follow->export_id,
				     job->env->ipc_follow->map, job->env->ipc_follow->drop, err);
		gmb__op_end(&c->conn);
		gmb__send_reply(&c->conn, job->gen, job->env->id, rc, rc < 0 ? err : "");
		return;
	}
	rc = api_control_do(c, (int)cmd->op, cmd->tag && *cmd->tag ? cmd->tag : NULL, cmd->wait_ms,
			    cmd->importers_follow, err);
	gmb__send_reply(&c->conn, job->gen, job->env->id, rc, rc < 0 ? err : "");
}

static int api_poll_wait(struct gmb_client *c, int timeout_ms)
{
	struct timespec until = deadline_in_ms(timeout_ms > 0 ? (uint64_t)timeout_ms : 0);

	/* A reconnect in progress is no reason to return: gmbd may still ask. */
	while (c->conn.handled == 0 && !c->conn.gone && timeout_ms != 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&c->conn.poll_cond, &c->conn.lock);
		else if (pthread_cond_timedwait(&c->conn.poll_cond, &c->conn.lock, &until) ==
			 ETIMEDOUT)
			break;
	}
	if (c->conn.handled > 0)
		return (int)c->conn.handled;
	return c->conn.gone ? -ENOTCONN : 0;
}

GMB_API int gmb_poll(gmb_client *c, int timeout_ms)
{
	char msg[ERR_MSG_MAX];
	int rc;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->conn.lock);
	rc = api_poll_wait(c, timeout_ms);
	if (rc > 0)
		c->conn.handled = 0;
	snprintf(msg, sizeof(msg), "%s",
		 c->conn.lost_msg[0] ? c->conn.lost_msg : "the connection to gmbd is lost");
	pthread_mutex_unlock(&c->conn.lock);
	return api_done(c, rc, msg);
}

GMB_API const char *gmb_strerror(int err)
{
	const char *s;

	if (err == 0)
		return "Success";
	if (err == INT32_MIN)
		return "Unknown error";
	s = strerrordesc_np(err < 0 ? -err : err);
	return s ? s : "Unknown error";
}

GMB_API const char *gmb_last_error(const gmb_client *c)
{
	return c ? c->last_error : api_connect_error;
}

GMB_API uint64_t gmb_client_id(const gmb_client *c)
{
	return c ? c->conn.id : 0;
}

/* A query: one round trip, the last part's body of @want kind or -EPROTO. */
static int api_query(struct gmb_client *c, Gmb__Envelope *env, int want, struct gmb__reply *rep,
		     const Gmb__Envelope **last, char *err)
{
	int rc = gmb__request(&c->conn, env, rep, err);

	if (rc < 0)
		return rc;
	*last = rep->parts[rep->nparts - 1];
	if ((int)(*last)->body_case != want)
		return err_fmt(err, -EPROTO, "gmbd answered with message %d, not %d",
			       (int)(*last)->body_case, want);
	return 0;
}

/* A status reply's parts as one: pointers into the parts, but for the
 * clients whose tags came in several entries (malloc'd copies). */
struct api_status_joined {
	Gmb__StatusReply sr;
	Gmb__ImportInfo **imports; /* of every part, in order */
	Gmb__ObjectInfo **objects; /* likewise */
	Gmb__ClientInfo **clients;
	Gmb__ClientInfo *copies;
	size_t ncopies;
};

static void api_status_unjoin(struct api_status_joined *j)
{
	for (size_t i = 0; i < j->ncopies; i++)
		free(j->copies[i].tags);
	free(j->copies);
	free(j->clients);
	free(j->imports);
	free(j->objects);
}

/* Entry @ci continues @prev (its last client): its tags are added to a copy. */
static int api_status_continue(struct api_status_joined *j, Gmb__ClientInfo **prev,
			       const Gmb__ClientInfo *ci)
{
	Gmb__ClientInfo *c = *prev;
	Gmb__TagInfo **tags;

	if (c < j->copies || c >= j->copies + j->ncopies) {
		c = &j->copies[j->ncopies++];
		*c = **prev;
		c->tags = NULL;
		c->n_tags = 0;
		tags = malloc(((*prev)->n_tags + ci->n_tags + 1) * sizeof(*tags));
		if (!tags)
			return -ENOMEM;
		memcpy(tags, (*prev)->tags, (*prev)->n_tags * sizeof(*tags));
		c->tags = tags;
		c->n_tags = (*prev)->n_tags;
		*prev = c;
	} else {
		tags = realloc(c->tags, (c->n_tags + ci->n_tags + 1) * sizeof(*tags));
		if (!tags)
			return -ENOMEM;
		c->tags = tags;
	}
	memcpy(c->tags + c->n_tags, ci->tags, ci->n_tags * sizeof(*tags));
	c->n_tags += ci->n_tags;
	return 0;
}

/* Joins @rep's StatusReply parts into @j (api_status_unjoin() it, even on failure). */
static int api_status_join(const struct gmb__reply *rep, struct api_status_joined *j, char *err)
{
	size_t n = 0, k = 0, ni = 0, no = 0;
	bool head = false;

	*j = (struct api_status_joined){ .sr = GMB__STATUS_REPLY__INIT };
	for (size_t p = 0; p < rep->nparts; p++)
		if (rep->parts[p]->body_case == GMB__ENVELOPE__BODY_STATUS_REPLY) {
			n += rep->parts[p]->status_reply->n_clients;
			ni += rep->parts[p]->status_reply->n_imports;
			no += rep->parts[p]->status_reply->n_objects;
		}
	j->clients = calloc(n + 1, sizeof(*j->clients));
	j->copies = calloc(n + 1, sizeof(*j->copies));
	j->imports = calloc(ni + 1, sizeof(*j->imports));
	j->objects = calloc(no + 1, sizeof(*j->objects));
	if (!j->clients || !j->copies || !j->imports || !j->objects)
		return err_fmt(err, -ENOMEM, "out of memory reading gmbd's status");
	for (size_t p = 0; p < rep->nparts; p++) {
		const Gmb__StatusReply *sr = rep->parts[p]->status_reply;

		if (rep->parts[p]->body_case != GMB__ENVELOPE__BODY_STATUS_REPLY)
			continue;
		/* The first part carries backend, version and the devices. */
		if (!head) {
			head = true;
			j->sr.backend = sr->backend;
			j->sr.version = sr->version;
			j->sr.n_devices = sr->n_devices;
			j->sr.devices = sr->devices;
			j->sr.n_waiters = sr->n_waiters;
			j->sr.waiters = sr->waiters;
		}
		/* Imports come in a part of their own, the last. */
		for (size_t i = 0; i < sr->n_imports; i++)
			j->imports[j->sr.n_imports++] = sr->imports[i];
		if (sr->imports_total > j->sr.imports_total)
			j->sr.imports_total = sr->imports_total;
		/* And the named objects in one after them. */
		for (size_t i = 0; i < sr->n_objects; i++)
			j->objects[j->sr.n_objects++] = sr->objects[i];
		if (sr->objects_total > j->sr.objects_total)
			j->sr.objects_total = sr->objects_total;
		for (size_t i = 0; i < sr->n_clients; i++) {
			const Gmb__ClientInfo *ci = sr->clients[i];

			if (!ci || !ci->continued) {
				j->clients[k++] = sr->clients[i];
				continue;
			}
			if (k == 0 || !j->clients[k - 1] || j->clients[k - 1]->id != ci->id)
				return err_fmt(err, -EPROTO,
					       "gmbd's status continues client %" PRIu64
					       " out of order",
					       ci->id);
			if (api_status_continue(j, &j->clients[k - 1], ci) < 0)
				return err_fmt(err, -ENOMEM, "out of memory reading gmbd's status");
		}
	}
	j->sr.n_clients = k;
	j->sr.clients = j->clients;
	j->sr.imports = j->imports;
	j->sr.objects = j->objects;
	return 0;
}

/* StatusRequest, then @fmt turns the reply into a malloc'd string in *@out. */
static int api_fmt_json(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__status_to_json(st, out);
}

static int api_fmt_table(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__status_to_table(st, out);
}

static int api_status(struct gmb_client *c, char **out,
		      int (*fmt)(const Gmb__StatusReply *, int, char **), int width,
		      const char *what)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest req = GMB__STATUS_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	struct api_status_joined j = { 0 };
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	if (!out)
		return api_done(c, -EINVAL, "no place for the status");
	*out = NULL;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &req;
	rc = api_query(c, &env, GMB__ENVELOPE__BODY_STATUS_REPLY, &rep, &last, err);
	if (rc == 0)
		rc = api_status_join(&rep, &j, err);
	if (rc == 0) {
		rc = fmt(&j.sr, width, out);
		if (rc < 0)
			err_fmt(err, rc, "formatting gmbd's status as %s: %s", what,
				gmb_strerror(rc));
	}
	api_status_unjoin(&j);
	gmb__reply_deinit(&rep);
	return api_done(c, rc, err);
}

/* The first of @st's devices numbered @index, or NULL. */
static const Gmb__DeviceInfo *api_status_find(const Gmb__StatusReply *st, uint32_t index)
{
	for (size_t i = 0; st && i < st->n_devices; i++)
		if (st->devices[i] && st->devices[i]->index == index)
			return st->devices[i];
	return NULL;
}

int gmb__status_device(struct gmb_client *c, uint32_t index, uint64_t *budget, uint64_t *used)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest req = GMB__STATUS_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__DeviceInfo *d;
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &req;
	rc = api_query(c, &env, GMB__ENVELOPE__BODY_STATUS_REPLY, &rep, &last, err);
	if (rc == 0) {
		/* The devices come in the first part. */
		d = api_status_find(rep.parts[0]->body_case == GMB__ENVELOPE__BODY_STATUS_REPLY ?
					    rep.parts[0]->status_reply :
					    NULL,
				    index);
		rc = d ? 0 : -ENODEV;
		*budget = d ? d->budget_bytes : 0;
		*used = d ? d->used_bytes : 0;
	}
	gmb__reply_deinit(&rep);
	return rc == -ENODEV ? rc : api_done(c, rc, err);
}

GMB_API int gmb_status_json(gmb_client *c, char **json)
{
	return api_status(c, json, api_fmt_json, 0, "JSON");
}

GMB_API int gmb_status_text(gmb_client *c, char **text)
{
	return api_status(c, text, api_fmt_table, 0, "a table");
}

GMB_API int gmb_status_top(gmb_client *c, int width, char **text)
{
	return api_status(c, text, gmb__status_to_top, width, "a screen");
}

static int api_fmt_objects_json(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__objects_to_json(st, out);
}

static int api_fmt_objects_table(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__objects_to_table(st, out);
}

GMB_API int gmb_objects_json(gmb_client *c, char **json)
{
	return api_status(c, json, api_fmt_objects_json, 0, "JSON");
}

GMB_API int gmb_objects_text(gmb_client *c, char **text)
{
	return api_status(c, text, api_fmt_objects_table, 0, "a table");
}

/* Sends @env, which names the request, and ends as api_done() does. */
static int api_call(gmb_client *c, Gmb__Envelope *env)
{
	struct gmb__reply rep = GMB__REPLY_INIT;
	char err[ERR_MSG_MAX] = "";
	int rc = gmb__request(&c->conn, env, &rep, err);

	gmb__reply_deinit(&rep);
	return api_done(c, rc, err);
}

GMB_API int gmb_control(gmb_client *c, const char *target, int op, const char *tag)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlRequest req = GMB__CONTROL_REQUEST__INIT;

	if (!c)
		return -EINVAL;
	if (!target || !*target)
		return api_done(c, -EINVAL, "no target client");
	if (op != GMB_OP_PAUSE && op != GMB_OP_RESUME)
		return api_done(c, -EINVAL, "op must be GMB_OP_PAUSE or GMB_OP_RESUME");
	req.target = (char *)target;
	req.op = (Gmb__Op)op;
	req.tag = (char *)(tag ? tag : "");
	req.wait_ms = op == GMB_OP_RESUME ? api_wait(c) : 0;
	req.importers_follow = op == GMB_OP_PAUSE && c->mem.ipc_follow;
	env.body_case = GMB__ENVELOPE__BODY_CONTROL;
	env.control = &req;
	return api_call(c, &env);
}

GMB_API int gmb_trim(gmb_client *c, int device, uint64_t *released, uint64_t *pending)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__TrimRequest req = GMB__TRIM_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	if (device < -1)
		return api_done(c, -EINVAL, "device must be -1 (all) or an index");
	req.device = device;
	env.body_case = GMB__ENVELOPE__BODY_TRIM;
	env.trim = &req;
	rc = api_query(c, &env, GMB__ENVELOPE__BODY_TRIM_REPLY, &rep, &last, err);
	if (rc == 0 && released)
		*released = last->trim_reply->released_bytes;
	if (rc == 0 && pending)
		*pending = last->trim_reply->pending_bytes;
	gmb__reply_deinit(&rep);
	return api_done(c, rc, err);
}

GMB_API int gmb_set_wait(gmb_client *c, uint32_t ms)
{
	if (!c)
		return -EINVAL;
	gmb__op_begin(&c->conn);
	pthread_mutex_lock(&c->conn.lock);
	c->mem.wait_ms = ms;
	pthread_mutex_unlock(&c->conn.lock);
	gmb__op_end(&c->conn);
	return 0;
}

GMB_API int gmb_set_ipc_keep(gmb_client *c, int on)
{
	if (!c || (on != 0 && on != 1))
		return -EINVAL;
	gmb__op_begin(&c->conn);
	c->mem.ipc_keep = on;
	gmb__op_end(&c->conn);
	return 0;
}

GMB_API int gmb_set_pack(gmb_client *c, int pack)
{
	if (!c || (pack != GMB_PACK_OFF && pack != GMB_PACK_HOOKS && pack != GMB_PACK_ALL))
		return -EINVAL;
	gmb__op_begin(&c->conn);
	c->mem.pack = pack;
	gmb__op_end(&c->conn);
	return 0;
}

GMB_API int gmb_set_ipc_follow(gmb_client *c, int on)
{
	if (!c || (on != 0 && on != 1))
		return -EINVAL;
	gmb__op_begin(&c->conn);
	c->mem.ipc_follow = on;
	gmb__op_end(&c->conn);
	return 0;
}

/* One line per step of @sr, then the total, as a malloc'd string. */
static char *api_switch_report(const Gmb__SwitchReply *sr)
{
	char *text = NULL, b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	for (size_t i = 0; i < sr->n_steps; i++) {
		const Gmb__SwitchStep *st = sr->steps[i];
		char what[WIRE_MAX_NAME + 16];

		if (st->tag && st->tag[0])
			snprintf(what, sizeof(what), "tag '%s'", st->tag);
		else
			snprintf(what, sizeof(what), "every tag");
		fprintf(f, "%s%-6s %s (#%" PRIu64 ") %s: %.3f ms%s%s\n", st->undo ? "undo " : "",
			st->op == GMB__OP__OP_PAUSE ? "pause" : "resume",
			st->client ? st->client : "", st->client_id, what, st->ms,
			st->status ? ": failed: " : "",
			st->status ?
				(st->error && *st->error ? st->error : gmb_strerror(st->status)) :
				"");
	}
	fprintf(f, "total %.3f ms; handed over %s, created %s\n", sr->total_ms,
		size_str(sr->handed_over_bytes, b1), size_str(sr->created_bytes, b2));
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

GMB_API int gmb_switch(gmb_client *c, const char *from, const char *to, const char *const *tags,
		       size_t ntags, char **report)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__SwitchRequest req = GMB__SWITCH_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	if (report)
		*report = NULL;
	if (!from || !*from || !to || !*to)
		return api_done(c, -EINVAL, "a switch needs FROM and TO");
	if (ntags && !tags)
		return api_done(c, -EINVAL, "no tags given for ntags > 0");
	req.from = (char *)from;
	req.to = (char *)to;
	req.n_tags = ntags;
	req.tags = (char **)tags;
	req.wait_ms = api_wait(c);
	env.body_case = GMB__ENVELOPE__BODY_SWITCH_REQ;
	env.switch_req = &req;
	rc = gmb__request(&c->conn, &env, &rep, err);
	last = rep.nparts ? rep.parts[rep.nparts - 1] : NULL;
	if (report && last && last->body_case == GMB__ENVELOPE__BODY_SWITCH_REPLY) {
		*report = api_switch_report(last->switch_reply);
		if (!*report && rc == 0)
			rc = err_fmt(err, -ENOMEM, "out of memory for the switch's report");
	}
	gmb__reply_deinit(&rep);
	return api_done(c, rc, err);
}

GMB_API int gmb_set_priority(gmb_client *c, const char *target, int priority)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PriorityRequest req = GMB__PRIORITY_REQUEST__INIT;

	if (!c)
		return -EINVAL;
	if (!target || !*target)
		return api_done(c, -EINVAL, "no target client");
	req.target = (char *)target;
	req.priority = priority;
	env.body_case = GMB__ENVELOPE__BODY_PRIORITY;
	env.priority = &req;
	return api_call(c, &env);
}

GMB_API int gmb_watch(gmb_client *c)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__WatchRequest req = GMB__WATCH_REQUEST__INIT;

	if (!c)
		return -EINVAL;
	env.body_case = GMB__ENVELOPE__BODY_WATCH;
	env.watch = &req;
	return api_call(c, &env);
}

/* The oldest event, waited for under the lock; NULL on timeout or loss. */
static struct gmb__job *api_watch_take(struct gmb_client *c, int timeout_ms, uint64_t *lost)
{
	struct timespec until = deadline_in_ms(timeout_ms > 0 ? (uint64_t)timeout_ms : 0);
	struct gmb__job *ev;

	while (!c->conn.events && !c->conn.gone && timeout_ms != 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&c->conn.event_cond, &c->conn.lock);
		else if (pthread_cond_timedwait(&c->conn.event_cond, &c->conn.lock, &until) ==
			 ETIMEDOUT)
			break;
	}
	*lost = c->conn.events_lost;
	c->conn.events_lost = 0;
	ev = c->conn.events;
	if (ev) {
		c->conn.events = ev->next;
		if (!c->conn.events)
			c->conn.events_tail = &c->conn.events;
		c->conn.nevents--;
	}
	return ev;
}

GMB_API int gmb_watch_next(gmb_client *c, int timeout_ms, unsigned flags, char **line)
{
	Gmb__WatchEvent lost_ev = GMB__WATCH_EVENT__INIT;
	const Gmb__WatchEvent *we;
	struct gmb__job *ev;
	char msg[ERR_MSG_MAX];
	uint64_t lost;
	bool gone;
	int rc;

	if (!c || !line || (flags & ~(unsigned)GMB_WATCH_JSON))
		return -EINVAL;
	*line = NULL;
	pthread_mutex_lock(&c->conn.lock);
	ev = api_watch_take(c, timeout_ms, &lost);
	gone = c->conn.gone;
	snprintf(msg, sizeof(msg), "%s",
		 c->conn.lost_msg[0] ? c->conn.lost_msg : "the connection to gmbd is lost");
	pthread_mutex_unlock(&c->conn.lock);
	if (lost) {
		/* Said before the next event: the gap is where it happened. */
		char detail[96];

		snprintf(detail, sizeof(detail), "%" PRIu64 " events lost: read too slowly", lost);
		lost_ev.kind = "lost";
		lost_ev.count = lost;
		lost_ev.detail = detail;
		lost_ev.device = -1;
		rc = gmb__watch_format(&lost_ev, flags & GMB_WATCH_JSON, line);
		if (ev) {
			/* Back to the head of the queue, for the next call. */
			pthread_mutex_lock(&c->conn.lock);
			ev->next = c->conn.events;
			if (!c->conn.events)
				c->conn.events_tail = &ev->next;
			c->conn.events = ev;
			c->conn.nevents++;
			pthread_mutex_unlock(&c->conn.lock);
		}
		return rc < 0 ? rc : 1;
	}
	if (!ev)
		return gone ? api_done(c, -ENOTCONN, msg) : 0;
	we = ev->env->watch_event;
	rc = gmb__watch_format(we, flags & GMB_WATCH_JSON, line);
	gmb__envelope__free_unpacked(ev->env, NULL);
	free(ev);
	return rc < 0 ? rc : 1;
}
