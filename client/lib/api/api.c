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
	gmb__cycle_close(&c->mem);
	gmb__op_end(&c->conn);
	gmb__conn_stop(&c->conn);
	gmb__mem_deinit(&c->mem);
	close(c->conn.sock);
	api_client_free(c);
}

GMB_API int gmb_malloc(gmb_client *c, void **ptr, size_t size, int device, const char *tag)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	gmb__op_begin(&c->conn);
	rc = gmb__mem_malloc(&c->mem, ptr, size, device, tag, err);
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
	rc = gmb__mem_free(&c->mem, ptr, err);
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

/* Pause or resume under op_lock; @err receives the reason. */
static int api_pause_resume(struct gmb_client *c, int op, const char *tag, char *err)
{
	bool closing;
	int rc;

	gmb__op_begin(&c->conn);
	pthread_mutex_lock(&c->conn.lock);
	closing = c->conn.closing;
	pthread_mutex_unlock(&c->conn.lock);
	if (closing)
		rc = err_fmt(err, -ESHUTDOWN, "the client is closing");
	else if (op == GMB_OP_PAUSE)
		rc = gmb__cycle_pause(&c->mem, tag, err);
	else
		rc = gmb__cycle_resume(&c->mem, tag, err);
	gmb__op_end(&c->conn);
	return rc;
}

GMB_API int gmb_pause(gmb_client *c, const char *tag)
{
	char err[ERR_MSG_MAX] = "";

	if (!c)
		return -EINVAL;
	return api_done(c, api_pause_resume(c, GMB_OP_PAUSE, tag, err), err);
}

GMB_API int gmb_resume(gmb_client *c, const char *tag)
{
	char err[ERR_MSG_MAX] = "";

	if (!c)
		return -EINVAL;
	return api_done(c, api_pause_resume(c, GMB_OP_RESUME, tag, err), err);
}

GMB_API int gmb_set_control_handler(gmb_client *c, gmb_control_fn fn, void *arg)
{
	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->conn.lock);
	c->control_fn = fn;
	c->control_arg = fn ? arg : NULL;
	pthread_mutex_unlock(&c->conn.lock);
	return 0;
}

/* The handler runs without any library lock held, so it may call gmb_* itself. */
static int api_control_do(struct gmb_client *c, int op, const char *tag, char *err)
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
	return api_pause_resume(c, op, tag, err);
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

	rc = api_control_do(c, (int)cmd->op, cmd->tag && *cmd->tag ? cmd->tag : NULL, err);
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
	snprintf(msg, sizeof(msg), "%s", c->conn.lost_msg[0] ? c->conn.lost_msg
		 : "the connection to gmbd is lost");
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
	size_t n = 0, k = 0;
	bool head = false;

	*j = (struct api_status_joined){ .sr = GMB__STATUS_REPLY__INIT };
	for (size_t p = 0; p < rep->nparts; p++)
		if (rep->parts[p]->body_case == GMB__ENVELOPE__BODY_STATUS_REPLY)
			n += rep->parts[p]->status_reply->n_clients;
	j->clients = calloc(n + 1, sizeof(*j->clients));
	j->copies = calloc(n + 1, sizeof(*j->copies));
	if (!j->clients || !j->copies)
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
		}
		for (size_t i = 0; i < sr->n_clients; i++) {
			const Gmb__ClientInfo *ci = sr->clients[i];

			if (!ci || !ci->continued) {
				j->clients[k++] = sr->clients[i];
				continue;
			}
			if (k == 0 || !j->clients[k - 1] || j->clients[k - 1]->id != ci->id)
				return err_fmt(err, -EPROTO, "gmbd's status continues client %" PRIu64
					       " out of order", ci->id);
			if (api_status_continue(j, &j->clients[k - 1], ci) < 0)
				return err_fmt(err, -ENOMEM, "out of memory reading gmbd's status");
		}
	}
	j->sr.n_clients = k;
	j->sr.clients = j->clients;
	return 0;
}

/* StatusRequest, then @fmt turns the reply into a malloc'd string in *@out. */
static int api_status(struct gmb_client *c, char **out,
		      int (*fmt)(const Gmb__StatusReply *, char **), const char *what)
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
		rc = fmt(&j.sr, out);
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
		d = api_status_find(rep.parts[0]->body_case == GMB__ENVELOPE__BODY_STATUS_REPLY
				    ? rep.parts[0]->status_reply : NULL, index);
		rc = d ? 0 : -ENODEV;
		*budget = d ? d->budget_bytes : 0;
		*used = d ? d->used_bytes : 0;
	}
	gmb__reply_deinit(&rep);
	return rc == -ENODEV ? rc : api_done(c, rc, err);
}

GMB_API int gmb_status_json(gmb_client *c, char **json)
{
	return api_status(c, json, gmb__status_to_json, "JSON");
}

GMB_API int gmb_status_text(gmb_client *c, char **text)
{
	return api_status(c, text, gmb__status_to_table, "a table");
}

GMB_API int gmb_control(gmb_client *c, const char *target, int op, const char *tag)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlRequest req = GMB__CONTROL_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	if (!target || !*target)
		return api_done(c, -EINVAL, "no target client");
	if (op != GMB_OP_PAUSE && op != GMB_OP_RESUME)
		return api_done(c, -EINVAL, "op must be GMB_OP_PAUSE or GMB_OP_RESUME");
	req.target = (char *)target;
	req.op = (Gmb__Op)op;
	req.tag = (char *)(tag ? tag : "");
	env.body_case = GMB__ENVELOPE__BODY_CONTROL;
	env.control = &req;
	rc = gmb__request(&c->conn, &env, &rep, err);
	gmb__reply_deinit(&rep);
	return api_done(c, rc, err);
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
