/*
 * main.c - gmbd: parse the options, take the fds the service manager passed
 * (listening socket, fd store), open the backend, start the broker (restored
 * from the fd store after a restart), serve, say READY=1 and run the loop
 * until SIGINT or SIGTERM. Then take it all down in reverse: stop
 * accepting, disconnect every client, free the broker, close the backend,
 * remove the socket file (unless the manager owns it).
 *
 * SIGTERM under systemd with an fd store is usually a restart: the record
 * and the chunk fds are frozen for the next gmbd first (persist_handover()),
 * so that the teardown returns nothing anyone could notice. Without an fd
 * store, clients are told (Bye) that their memory goes with this gmbd.
 *
 * Exit status: 0 after a signal, 1 when gmbd cannot start (one log line
 * says why), 2 for a bad option (one line on stderr, then a hint).
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <inttypes.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "common/backend/backend.h"
#include "common/log.h"
#include "common/size.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/lend.h"
#include "daemon/core/walk.h"
#include "daemon/handlers/handlers.h"
#include "daemon/metrics/http.h"
#include "daemon/metrics/metrics.h"
#include "daemon/service/opts.h"
#include "daemon/persist/persist.h"
#include "daemon/system/sd.h"
#include "daemon/transport/server.h"
#include "include/gmb.h"

/* Chunks a limit must leave room for past what gmbd keeps free, or it does not start. */
#define GMBD_MIN_CHUNKS 16

struct gmbd {
	const struct gmbd_opts *opts;
	uv_loop_t loop;
	struct sd_fds fds; /* what the service manager passed */
	bool activated;	   /* the listening socket is the manager's */
	struct backend *backend;
	struct persist *persist;
	struct broker *broker;
	struct handlers handlers;
	struct server *server;
	struct metrics metrics;
	struct mhttp *mhttp; /* --metrics-listen; NULL: off */
	struct sd_glue sd;
	uv_signal_t sigint, sigterm;
	bool stopping;
	bool held; /* the state record is not stored: replies wait */
};

static int gmbd_run(const struct gmbd_opts *o);
static int gmbd_open_backend(struct gmbd *g);
static void gmbd_log_backend(const struct gmbd *g);
static int gmbd_check_sizes(const struct gmbd *g, uint64_t reserve);
static int gmbd_open_broker(struct gmbd *g);
static int gmbd_restore(struct gmbd *g);
static int gmbd_admin_group(const char *name, gid_t *gid);
static int gmbd_socket_access(const struct gmbd_opts *o, const char *path);
static int gmbd_serve(struct gmbd *g);
static int gmbd_listen(struct gmbd *g, int *fd);
static void gmbd_on_changed(void *arg);
static int gmbd_flush(void *arg);
static void gmbd_status(void *arg, char *buf, size_t len);
static int gmbd_make_one_dir(const char *dir);
static int gmbd_make_dir(const char *path);
static int gmbd_signals(struct gmbd *g);
static uint64_t gmbd_nofile(void);
static int gmbd_fd_budget(struct gmbd *g, uint64_t limit);
static void gmbd_unserve(struct gmbd *g);
static int gmbd_metrics_start(struct gmbd *g);
static void gmbd_on_signal(uv_signal_t *sig, int signum);

int main(int argc, char **argv)
{
	struct gmbd_opts o;
	char err[OPTS_ERR_MAX];
	int r;

	r = opts_parse(&o, argc, argv, err);
	if (r < 0) {
		fprintf(stderr, "gmbd: %s\nTry 'gmbd --help'.\n", err);
		opts_deinit(&o);
		return 2;
	}
	if (r == OPTS_HELP)
		opts_print_help(stdout);
	else if (r == OPTS_VERSION)
		printf("gmbd %s\n", GMB_VERSION);
	if (r != OPTS_RUN) {
		opts_deinit(&o);
		return 0;
	}
	log_max_level = o.log_level;
	log_init();
	/* A client that vanishes mid-send is an error return, not a death; so
	 * is a state record past the file size limit (EFBIG, replies held). */
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN);
	r = gmbd_run(&o);
	opts_deinit(&o);
	return r < 0 ? 1 : 0;
}

static int gmbd_run(const struct gmbd_opts *o)
{
	struct gmbd g = { .opts = o };
	uint64_t nofile = gmbd_nofile();
	int r, rc;

	r = uv_loop_init(&g.loop);
	if (r < 0) {
		log_err("cannot start the event loop err=\"%s\"", uv_strerror(r));
		return r;
	}
	if (o->config)
		log_info("configuration read path=%s", o->config);
	r = sd_glue_take_fds(&g.fds);
	if (r < 0)
		goto err_loop;
	r = gmbd_open_backend(&g);
	if (r < 0)
		goto err_fds;
	r = persist_new(g.backend, o->fdstore_max, &g.persist);
	if (r < 0)
		goto err_backend;
	r = gmbd_open_broker(&g);
	if (r < 0)
		goto err_persist;
	r = gmbd_restore(&g);
	if (r < 0)
		goto err_broker;
	r = gmbd_serve(&g);
	if (r < 0)
		goto err_broker;
	r = gmbd_fd_budget(&g, nofile);
	if (r < 0) {
		/* Nothing was served: what was restored stays for the next gmbd. */
		g.handlers.handover = true;
		gmbd_unserve(&g);
		goto err_broker;
	}
	log_info("gmbd ready version=%s socket=%s activated=%d", GMB_VERSION, o->socket,
		 g.activated ? 1 : 0);
	sd_glue_ready(sd_glue_status_now(&g.sd));
	uv_run(&g.loop, UV_RUN_DEFAULT);
	if (!g.activated && unlink(o->socket) < 0 && errno != ENOENT)
		log_errno(LOG_LVL_WARNING, -errno, "cannot remove the socket path=%s", o->socket);
	log_info("gmbd stopped");
err_broker:
	/* What the fd store holds is the next gmbd's, whatever happened here. */
	persist_freeze(g.persist);
	broker_free(g.broker);
err_persist:
	persist_free(g.persist);
err_backend:
	backend_close(g.backend);
err_fds:
	sd_glue_fds_free(&g.fds);
err_loop:
	/* Handles closed on the way down still need their close callbacks. */
	uv_run(&g.loop, UV_RUN_DEFAULT);
	rc = uv_loop_close(&g.loop);
	if (rc < 0) {
		log_err("event loop still busy at exit err=\"%s\"", uv_strerror(rc));
		r = r < 0 ? r : rc;
	}
	return r;
}

static int gmbd_open_backend(struct gmbd *g)
{
	const struct gmbd_opts *o = g->opts;
	struct backend_host_opts host = { .ndevices = o->host_devices,
					  .memory = o->host_memory,
					  .granularity = o->host_granularity,
					  .outside = o->host_outside };
	int r;

	r = backend_open(o->backend, &host, &g->backend);
	if (r < 0) {
		log_err("cannot open the %s backend err=\"%s\" reason=\"%s\"", o->backend,
			strerror(-r), backend_last_error());
		return r;
	}
	/* After a fallback, backend_open() keeps cuda's reason for us; said
	 * before the line that shows its outcome. */
	if (strcmp(o->backend, "auto") == 0 && strcmp(g->backend->ops->name, "host") == 0)
		log_notice("no usable CUDA driver or GPU, using host memory reason=\"%s\"",
			   backend_last_error());
	gmbd_log_backend(g);
	return 0;
}

static void gmbd_log_backend(const struct gmbd *g)
{
	const struct backend *b = g->backend;
	uint64_t total = 0;
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];

	for (int d = 0; d < b->ndevices; d++)
		total += b->devices[d].total_bytes;
	log_info("backend ready backend=%s devices=%d total=%s granularity=%s", b->ops->name,
		 b->ndevices, size_str(total, b1), size_str(b->devices[0].granularity, b2));
}

/* Sizes that only make sense once the devices are known. */
static int gmbd_check_sizes(const struct gmbd *g, uint64_t reserve)
{
	const struct backend *b = g->backend;
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];

	for (int d = 0; d < b->ndevices; d++) {
		const struct backend_device *dev = &b->devices[d];

		if (g->opts->max_chunk < dev->granularity) {
			log_err("--max-chunk %s is smaller than device %d's granularity %s",
				size_str(g->opts->max_chunk, b1), d,
				size_str(dev->granularity, b2));
			return -EINVAL;
		}
		if (!g->opts->budget && reserve >= dev->total_bytes) {
			log_err("--reserve %s leaves no memory on device %d (total %s)",
				size_str(reserve, b1), d, size_str(dev->total_bytes, b2));
			return -EINVAL;
		}
	}
	return 0;
}

static int gmbd_open_broker(struct gmbd *g)
{
	const struct gmbd_opts *o = g->opts;
	bool cuda = strcmp(g->backend->ops->name, "cuda") == 0;
	struct broker_opts bo = {
		.max_chunk = o->max_chunk,
		.pool_keep = o->pool_keep,
		.budget = o->budget,
		.reserve = o->reserve_set ? o->reserve :
			   cuda		  ? OPTS_RESERVE_CUDA :
					    0,
		.daemon_uid = geteuid(),
		.hooks = persist_hooks(g->persist),
		.object_hooks = persist_object_hooks(g->persist),
	};
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];
	int r;

	r = gmbd_check_sizes(g, bo.reserve);
	if (r < 0)
		return r;
	bo.have_admin_gid = gmbd_admin_group(o->admin_group, &bo.admin_gid) == 0;
	r = broker_new(g->backend, &bo, &g->broker);
	if (r < 0) {
		log_errno(LOG_LVL_ERR, r, "cannot start the broker");
		return r;
	}
	for (int d = 0; d < g->broker->ndevices; d++)
		log_info("device ready device=%d name=\"%s\" budget=%s max_chunk=%s", d,
			 g->backend->devices[d].name, size_str(g->broker->pools[d].budget, b1),
			 size_str(g->broker->pools[d].max_chunk, b2));
	return 0;
}

/* The previous gmbd's chunks and clients, from the fds the manager passed. */
static int gmbd_restore(struct gmbd *g)
{
	struct state_stats st;
	char b[SIZE_STR_MAX];
	int r;

	r = persist_restore(g->persist, g->broker, g->fds.named, g->fds.nnamed, &st);
	if (r < 0) {
		log_errno(LOG_LVL_ERR, r, "cannot take over the fd store");
		return r;
	}
	if (st.clients || st.chunks || st.lost)
		log_notice("restored after a restart clients=%u chunks=%u bytes=%s lost_chunks=%u",
			   st.clients, st.chunks, size_str(st.bytes, b), st.lost);
	if (st.lost)
		log_warn("the record names chunks the service manager did not hand back; it closes"
			 " fds stored past the unit's FileDescriptorStoreMax= unannounced: make it"
			 " equal --fdstore-max lost_chunks=%u fdstore_max=%u",
			 st.lost, g->opts->fdstore_max);
	return 0;
}

/* 0 with *@gid, or -ENOENT (said once: only root, gmbd's user and each
 * client's own user may then control it). */
static int gmbd_admin_group(const char *name, gid_t *gid)
{
	struct group grp, *res = NULL;
	char buf[4096];
	int r;

	r = getgrnam_r(name, &grp, buf, sizeof(buf), &res);
	if (r == 0 && res) {
		*gid = res->gr_gid;
		log_info("admin group group=%s gid=%u", name, (unsigned)res->gr_gid);
		return 0;
	}
	if (r != 0)
		log_errno(LOG_LVL_WARNING, -r,
			  "cannot look up the admin group, so no group may"
			  " control other users' clients group=%s",
			  name);
	else
		log_notice("admin group does not exist, so no group may control other users'"
			   " clients (root, gmbd's user and each client's own user still may)"
			   " group=%s",
			   name);
	return -ENOENT;
}

static int gmbd_serve(struct gmbd *g)
{
	int fd = -1;
	int r;

	r = gmbd_listen(g, &fd);
	if (r < 0)
		return r;
	r = handlers_init(&g->handlers, &g->loop, g->broker,
			  (uint64_t)g->opts->control_timeout * 1000);
	if (r < 0)
		goto err_close_fd;
	g->handlers.hello_timeout_ms = (uint64_t)g->opts->hello_timeout * 1000;
	g->handlers.max_conns_per_uid = g->opts->max_conns_per_uid;
	g->handlers.changed = gmbd_on_changed;
	g->handlers.changed_arg = g;
	metrics_init(&g->metrics, g->broker);
	g->handlers.on_event = metrics_on_event;
	g->handlers.event_arg = &g->metrics;
	r = server_start(&g->loop, fd, &handlers_sess_ops, &g->handlers, &g->server);
	fd = -1; /* the server's, even on failure */
	if (r < 0)
		goto err_handlers;
	r = server_spin(g->server, g->opts->spin_us);
	/* With a manager to keep fds, replies wait for the record each turn. */
	if (r == 0 && persist_enabled(g->persist))
		r = server_cork(g->server, gmbd_flush, g);
	if (r == 0)
		r = sd_glue_start(&g->sd, &g->loop, gmbd_status, g);
	if (r == 0)
		r = gmbd_metrics_start(g);
	if (r == 0)
		r = gmbd_signals(g);
	if (r < 0)
		goto err_server;
	handlers_orphans_start(&g->handlers, (uint64_t)g->opts->rejoin_grace * 1000);
	return 0;

err_server:
	mhttp_stop(g->mhttp);
	g->mhttp = NULL;
	sd_glue_stop(&g->sd);
	server_stop(g->server);
err_handlers:
	handlers_close(&g->handlers);
err_close_fd:
	if (fd >= 0)
		close(fd);
	if (!g->activated)
		unlink(g->opts->socket);
	log_err("cannot serve err=\"%s\"", uv_strerror(r));
	return r;
}

/* The manager's listening socket, else one of our own at --socket. */
static int gmbd_listen(struct gmbd *g, int *fd)
{
	const char *path = g->opts->socket;
	mode_t old;
	int r;

	if (g->fds.listen_fd >= 0) {
		*fd = g->fds.listen_fd;
		g->fds.listen_fd = -1;
		g->activated = true;
		return 0;
	}
	r = gmbd_make_dir(path);
	if (r < 0)
		return r;
	/* Owner only until the mode and group are set: nobody slips in before. */
	old = umask(0177);
	r = wire_listen(path, fd);
	umask(old);
	if (r < 0) {
		if (r == -EADDRINUSE)
			log_err("another gmbd is listening path=%s", path);
		else
			log_errno(LOG_LVL_ERR, r, "cannot listen path=%s", path);
		return r;
	}
	r = gmbd_socket_access(g->opts, path);
	if (r < 0) {
		close(*fd);
		*fd = -1;
		unlink(path);
	}
	return r;
}

/*
 * Who may connect at all: --socket-group and --socket-mode (0660 by default,
 * so only gmbd's user and the group; what each client may do is then decided
 * per uid). A group that cannot be set is fatal: the socket would admit
 * other users than the operator meant.
 */
static int gmbd_socket_access(const struct gmbd_opts *o, const char *path)
{
	struct group grp, *res = NULL;
	char buf[4096];
	int r;

	if (o->socket_group) {
		r = getgrnam_r(o->socket_group, &grp, buf, sizeof(buf), &res);
		if (r != 0) {
			log_errno(LOG_LVL_ERR, -r, "cannot look up the socket group group=%s",
				  o->socket_group);
			return -r;
		}
		/* Not found is no errno ("No such file or directory" misled). */
		if (!res) {
			log_err("no such group: the socket group does not exist (groupadd it, or"
				" name another with --socket-group) group=%s",
				o->socket_group);
			return -ENOENT;
		}
		if (chown(path, (uid_t)-1, res->gr_gid) < 0) {
			r = -errno;
			log_errno(LOG_LVL_ERR, r,
				  "cannot give the socket to its group path=%s group=%s", path,
				  o->socket_group);
			return r;
		}
	}
	if (chmod(path, (mode_t)o->socket_mode) < 0) {
		r = -errno;
		log_errno(LOG_LVL_ERR, r, "cannot set the socket's mode path=%s mode=%04o", path,
			  o->socket_mode);
		return r;
	}
	log_info("socket access path=%s mode=%04o group=%s", path, o->socket_mode,
		 o->socket_group ? o->socket_group : "(gmbd's)");
	return 0;
}

static void gmbd_on_changed(void *arg)
{
	struct gmbd *g = arg;

	persist_changed(g->persist);
	sd_glue_changed(&g->sd);
}

/* The server's cork callback: the record, and STATUS= when it is held. */
static int gmbd_flush(void *arg)
{
	struct gmbd *g = arg;
	int r = persist_flush(g->persist);
	bool held = persist_failing(g->persist);

	if (held != g->held) {
		g->held = held;
		sd_glue_changed(&g->sd);
	}
	return r;
}

static int gmbd_count_client(void *arg, const struct bclient *c)
{
	(void)c;
	(*(uint32_t *)arg)++;
	return 0;
}

/* "2 clients, 1.5GiB lent of 2.0GiB held on 1 device (host)[, 1 rejoining]" */
static void gmbd_status(void *arg, char *buf, size_t len)
{
	const struct gmbd *g = arg;
	static const struct walk_ops count = { .client = gmbd_count_client };
	const struct broker *br = g->broker;
	uint64_t lent = 0, held = 0;
	uint32_t clients = 0, orphans = broker_orphans(br);
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];
	int n;

	walk_tree(br, &count, &clients);
	for (int d = 0; d < br->ndevices; d++) {
		lent += br->pools[d].lent_bytes;
		held += br->pools[d].held_bytes;
	}
	n = snprintf(buf, len, "%u client%s, %s lent of %s held on %d device%s (%s)", clients,
		     clients == 1 ? "" : "s", size_str(lent, b1), size_str(held, b2), br->ndevices,
		     br->ndevices == 1 ? "" : "s", g->backend->ops->name);
	if (orphans && n > 0 && (size_t)n < len)
		n += snprintf(buf + n, len - (size_t)n, ", %u restored client%s not back yet",
			      orphans, orphans == 1 ? "" : "s");
	if (g->held && n > 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n,
			 ", replies held: the state record is not stored");
}

/*
 * One folder of the socket's path, 0755 if gmbd makes it: whatever the
 * umask, since the socket's group must pass through it (a umask of 077
 * would make it 0700, and the socket's own mode would say nothing true).
 */
static int gmbd_make_one_dir(const char *dir)
{
	int r;

	if (mkdir(dir, 0755) < 0) {
		if (errno == EEXIST)
			return 0;
		r = -errno;
		log_errno(LOG_LVL_ERR, r, "cannot create the socket's directory path=%s", dir);
		return r;
	}
	if (chmod(dir, 0755) < 0) {
		r = -errno;
		log_errno(LOG_LVL_ERR, r, "cannot set the mode of the socket's directory path=%s",
			  dir);
		return r;
	}
	log_info("socket directory created path=%s mode=0755", dir);
	return 0;
}

/* mkdir -p of the socket's directory, 0755 for what it creates. */
static int gmbd_make_dir(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;
	int r;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	for (char *p = dir + 1;; p++) {
		char c = *p;

		if (c != '/' && c != '\0')
			continue;
		*p = '\0';
		r = gmbd_make_one_dir(dir);
		if (r < 0)
			return r;
		*p = c;
		if (c == '\0')
			return 0;
	}
}

static int gmbd_signals(struct gmbd *g)
{
	int r;

	uv_signal_init(&g->loop, &g->sigint);
	uv_signal_init(&g->loop, &g->sigterm);
	g->sigint.data = g->sigterm.data = g;
	r = uv_signal_start(&g->sigint, gmbd_on_signal, SIGINT);
	if (r == 0)
		r = uv_signal_start(&g->sigterm, gmbd_on_signal, SIGTERM);
	if (r < 0) {
		uv_close((uv_handle_t *)&g->sigint, NULL);
		uv_close((uv_handle_t *)&g->sigterm, NULL);
	}
	return r;
}

static void gmbd_on_signal(uv_signal_t *sig, int signum)
{
	struct gmbd *g = sig->data;

	if (g->stopping)
		return;
	g->stopping = true;
	sd_glue_stopping();
	if (persist_handover(g->persist)) {
		log_info("shutting down, clients will rejoin the next gmbd signal=%s clients=%u",
			 signum == SIGINT ? "SIGINT" : "SIGTERM", g->broker->nclients);
		g->handlers.handover = true;
	} else {
		log_info("shutting down signal=%s clients=%u",
			 signum == SIGINT ? "SIGINT" : "SIGTERM", g->broker->nclients);
		handlers_goodbye(&g->handlers, g->server, "gmbd stopped and kept no state");
	}
	gmbd_unserve(g);
}

/* Stops serving: what gmbd_serve() started, closed. */
static void gmbd_unserve(struct gmbd *g)
{
	mhttp_stop(g->mhttp);
	g->mhttp = NULL;
	sd_glue_stop(&g->sd);
	server_stop(g->server);
	g->server = NULL;
	handlers_close(&g->handlers);
	/* With the signal handles closed, a second signal kills at once. */
	uv_close((uv_handle_t *)&g->sigint, NULL);
	uv_close((uv_handle_t *)&g->sigterm, NULL);
}

static int gmbd_metrics_render(void *arg, char **out, size_t *len)
{
	const struct gmbd *g = arg;

	return metrics_render(&g->metrics, out, len);
}

/* --metrics-listen: HTTP on that address; a bad one stops gmbd at start. */
static int gmbd_metrics_start(struct gmbd *g)
{
	const char *addr = g->opts->metrics_listen;
	int port = 0;
	int r;

	if (!addr)
		return 0;
	r = mhttp_start(&g->loop, addr, gmbd_metrics_render, g, &g->mhttp, &port);
	if (r < 0) {
		log_err("cannot serve metrics listen=%s err=\"%s\"", addr,
			r == -EINVAL ? "not an IP address and port" : uv_strerror(r));
		return r;
	}
	log_info("metrics served listen=%s port=%d path=/metrics", addr, port);
	return 0;
}

/*
 * gmbd's open-file limit: the soft one raised to the hard one (libuv polls
 * with epoll, so the 1,024 kept for select() buys nothing, and on the host
 * backend every chunk is an open fd). 0 when there is no limit to keep to.
 */
static uint64_t gmbd_nofile(void)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	was = rl.rlim_cur;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			rl.rlim_cur = was;
		else
			log_info("open-file limit raised to the hard limit from=%" PRIu64
				 " to=%" PRIu64,
				 (uint64_t)was, (uint64_t)rl.rlim_cur);
	}
	return rl.rlim_cur == RLIM_INFINITY ? 0 : (uint64_t)rl.rlim_cur;
}

/* Open fds now, -errno; the directory's own fd is not counted. */
static int gmbd_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;
}

/*
 * What the broker keeps to (broker.h): the limit, the fds gmbd holds but
 * chunk fds, counted once now that it serves (connections are counted as
 * they come), and for --max-chunks-per-uid auto the chunks the uids share
 * past those and the fds kept free: an eighth is root's alone, the rest
 * shared out as broker_uid_bound() says. A limit that leaves fewer than
 * GMBD_MIN_CHUNKS chunks past what gmbd keeps free would serve nobody, so
 * gmbd does not start under it and says the limit it needs.
 * Return: 0 or -EMFILE (said).
 */
static int gmbd_fd_budget(struct gmbd *g, uint64_t limit)
{
	struct broker *br = g->broker;
	uint64_t chunk_fds = broker_chunk_fds(br), kept = BROKER_FD_SPARE + BROKER_FD_CONN_ROOM;
	uint64_t per = br->backend->ops->chunk_fds, chunks;
	int n = gmbd_count_fds();

	/* Without a count there is nothing to keep to: the kernel says EMFILE. */
	br->fds_base = n >= 0 && (uint64_t)n > chunk_fds ? (uint64_t)n - chunk_fds : 0;
	br->opts.fd_limit = n >= 0 ? limit : 0;
	if (g->opts->max_chunks_per_uid_set)
		br->opts.max_chunks_per_uid = g->opts->max_chunks_per_uid;
	if (br->opts.fd_limit) {
		uint64_t need = br->fds_base + kept + GMBD_MIN_CHUNKS * per;

		if (limit < need) {
			log_err("the open files limit is too low to serve: gmbd holds %" PRIu64
				" and keeps %" PRIu64 " free (a batch of chunk fds to send, a"
				" margin, %d connections), and needs room for %d chunks besides:"
				" raise LimitNOFILE= (ulimit -n) to at least %" PRIu64
				" limit=%" PRIu64 " needed=%" PRIu64,
				br->fds_base, kept, BROKER_FD_CONN_ROOM, GMBD_MIN_CHUNKS, need,
				limit, need);
			return -EMFILE;
		}
		/* A backend whose chunks hold no fd of gmbd's still shares them out. */
		chunks = (limit - br->fds_base - kept) / (per ? per : 1);
		br->opts.root_chunks = chunks / 8;
		if (!g->opts->max_chunks_per_uid_set)
			br->opts.chunk_share = chunks - br->opts.root_chunks;
	}
	log_info("open files limit=%" PRIu64 " open=%" PRIu64 " chunk_fds=%" PRIu64
		 " kept_free=%" PRIu64 " max_chunks_per_uid=%" PRIu64 " shared_chunks=%" PRIu64
		 " root_chunks=%" PRIu64,
		 br->opts.fd_limit, br->fds_base, chunk_fds, kept, br->opts.max_chunks_per_uid,
		 br->opts.chunk_share, br->opts.root_chunks);
	/* Restored chunks were not checked against a bound set only now. */
	lend_warn_uid_bounds(br);
	return 0;
}
