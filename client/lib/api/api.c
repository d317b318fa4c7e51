/*
 * api.c - the exported functions of include/gmb.h that act on this client
 * itself: connect and close, malloc and free, a tag's mode, pause and
 * resume, the control handler and gmb_poll(), the settings (wait, IPC,
 * packing) and the errors (gmb_strerror(), gmb_last_error()).
 *
 * Each public call checks its arguments, runs the internal operation under
 * the right lock and, on failure, copies the operation's message into the
 * client's last_error under the state lock (gmb__api_done(), query.c's too).
 * Operations that change memory (malloc, free, mode, pause, resume) hold
 * op_lock, which the worker thread also takes to carry out gmbd's
 * ControlCommands, so a remote pause never interleaves with the
 * application's own calls. Queries (status, control of another client,
 * trim, switch, priority, watch) only make a round trip and take no
 * op_lock, so a gmb_control() aimed at this very client cannot deadlock:
 * they live apart, in query.c.
 *
 * While gmbd is away (a restart), every call that needs it waits for the
 * library to reconnect, at most $GMB_RECONNECT_TIMEOUT seconds (default
 * 30; 0: not at all), then fails with -ENOTCONN and says so in
 * gmb_last_error(). Memory stays mapped and usable meanwhile.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/api/client.h"
#include "client/lib/conn/reconnect.h"
#include "common/deadline.h"
#include "common/env.h"

/* gmb_connect() fails before there is a client to hold the reason: the
 * calling thread keeps it, for gmb_last_error(NULL). */
static __thread char api_connect_error[ERR_MSG_MAX];

int gmb__api_done(struct gmb_client *c, int rc, const char *err)
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
	gmb__allocs_drop_all(&c->mem);
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
	gmb__allocs_drop_all(&c->mem);
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
	return gmb__api_done(c, rc, err);
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
	return gmb__api_done(c, rc, err);
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
	return gmb__api_done(c, rc, err);
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
	return gmb__api_done(c, api_pause_resume(c, GMB_OP_PAUSE, tag, 0, false, err), err);
}

GMB_API int gmb_resume(gmb_client *c, const char *tag)
{
	char err[ERR_MSG_MAX] = "";

	if (!c)
		return -EINVAL;
	return gmb__api_done(c, api_pause_resume(c, GMB_OP_RESUME, tag, 0, false, err), err);
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
	return gmb__api_done(c, api_send_control_state(c, fn != NULL, err), err);
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
	return gmb__api_done(c, rc, msg);
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
