/*
 * main.c - gmbd: parse the options, open the backend, start the broker and
 * the server, run the loop until SIGINT or SIGTERM, then take it all down
 * in reverse: stop accepting, disconnect every client (their memory goes
 * back to the pools), free the broker (the pools go back to the driver),
 * close the backend, remove the socket file.
 *
 * Exit status: 0 after a signal, 1 when gmbd cannot start (one log line
 * says why), 2 for a bad option (one line on stderr, then a hint).
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "common/backend.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/broker.h"
#include "daemon/handlers.h"
#include "daemon/opts.h"
#include "daemon/sd.h"
#include "daemon/server.h"
#include "include/gmb.h"

struct gmbd {
	const struct gmbd_opts *opts;
	uv_loop_t loop;
	struct backend *backend;
	struct broker *broker;
	struct handlers handlers;
	struct server *server;
	uv_signal_t sigint, sigterm;
	bool stopping;
};

static int gmbd_run(const struct gmbd_opts *o);
static int gmbd_open_backend(struct gmbd *g);
static void gmbd_log_backend(const struct gmbd *g);
static int gmbd_check_sizes(const struct gmbd *g, uint64_t reserve);
static int gmbd_open_broker(struct gmbd *g);
static int gmbd_admin_group(const char *name, gid_t *gid);
static int gmbd_serve(struct gmbd *g);
static int gmbd_make_dir(const char *path);
static int gmbd_signals(struct gmbd *g);
static void gmbd_on_signal(uv_signal_t *sig, int signum);

int main(int argc, char **argv)
{
	struct gmbd_opts o;
	char err[OPTS_ERR_MAX];
	int r;

	r = opts_parse(&o, argc, argv, err);
	if (r < 0) {
		fprintf(stderr, "gmbd: %s\nTry 'gmbd --help'.\n", err);
		return 2;
	}
	if (r == OPTS_HELP) {
		opts_print_help(stdout);
		return 0;
	}
	if (r == OPTS_VERSION) {
		printf("gmbd %s\n", GMB_VERSION);
		return 0;
	}
	log_max_level = o.log_level;
	/* A client that vanishes mid-send is an error return, not a death. */
	signal(SIGPIPE, SIG_IGN);
	return gmbd_run(&o) < 0 ? 1 : 0;
}

static int gmbd_run(const struct gmbd_opts *o)
{
	struct gmbd g = { .opts = o };
	int r, rc;

	r = uv_loop_init(&g.loop);
	if (r < 0) {
		log_err("cannot start the event loop err=\"%s\"", uv_strerror(r));
		return r;
	}
	r = gmbd_open_backend(&g);
	if (r < 0)
		goto err_loop;
	r = gmbd_open_broker(&g);
	if (r < 0)
		goto err_backend;
	r = gmbd_serve(&g);
	if (r < 0)
		goto err_broker;
	log_info("gmbd ready version=%s socket=%s", GMB_VERSION, o->socket);
	sd_glue_ready("serving");
	uv_run(&g.loop, UV_RUN_DEFAULT);
	if (unlink(o->socket) < 0 && errno != ENOENT)
		log_errno(LOG_LVL_WARNING, -errno, "cannot remove the socket path=%s", o->socket);
	log_info("gmbd stopped");
err_broker:
	broker_free(g.broker);
err_backend:
	backend_close(g.backend);
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
	struct backend_host_opts host = { .ndevices = o->host_devices, .memory = o->host_memory,
					  .granularity = o->host_granularity };
	int r;

	r = backend_open(o->backend, &host, &g->backend);
	if (r < 0) {
		log_err("cannot open the %s backend err=\"%s\" reason=\"%s\"", o->backend,
			strerror(-r), backend_last_error());
		return r;
	}
	gmbd_log_backend(g);
	/* After a fallback, backend_open() keeps cuda's reason for us. */
	if (strcmp(o->backend, "auto") == 0 && strcmp(g->backend->ops->name, "host") == 0)
		log_notice("no usable CUDA driver or GPU, using host memory reason=\"%s\"",
			   backend_last_error());
	return 0;
}

static void gmbd_log_backend(const struct gmbd *g)
{
	const struct backend *b = g->backend;
	uint64_t total = 0;
	char b1[24], b2[24];

	for (int d = 0; d < b->ndevices; d++)
		total += b->devices[d].total_bytes;
	log_info("backend ready backend=%s devices=%d total=%s granularity=%s", b->ops->name,
		 b->ndevices, opts_size_format(total, b1, sizeof(b1)),
		 opts_size_format(b->devices[0].granularity, b2, sizeof(b2)));
}

/* Sizes that only make sense once the devices are known. */
static int gmbd_check_sizes(const struct gmbd *g, uint64_t reserve)
{
	const struct backend *b = g->backend;
	char b1[24], b2[24];

	for (int d = 0; d < b->ndevices; d++) {
		const struct backend_device *dev = &b->devices[d];

		if (g->opts->max_chunk < dev->granularity) {
			log_err("--max-chunk %s is smaller than device %d's granularity %s",
				opts_size_format(g->opts->max_chunk, b1, sizeof(b1)), d,
				opts_size_format(dev->granularity, b2, sizeof(b2)));
			return -EINVAL;
		}
		if (!g->opts->budget && reserve >= dev->total_bytes) {
			log_err("--reserve %s leaves no memory on device %d (total %s)",
				opts_size_format(reserve, b1, sizeof(b1)), d,
				opts_size_format(dev->total_bytes, b2, sizeof(b2)));
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
		.reserve = o->reserve_set ? o->reserve : cuda ? OPTS_RESERVE_CUDA : 0,
		.daemon_uid = geteuid(),
	};
	char b1[24], b2[24];
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
			 g->backend->devices[d].name,
			 opts_size_format(g->broker->pools[d].budget, b1, sizeof(b1)),
			 opts_size_format(g->broker->pools[d].max_chunk, b2, sizeof(b2)));
	return 0;
}

/* 0 with *@gid, or -ENOENT (said once: the rule is simply off). */
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
		log_errno(LOG_LVL_WARNING, -r, "cannot look up the admin group, rule off group=%s",
			  name);
	else
		log_notice("admin group does not exist, rule off group=%s", name);
	return -ENOENT;
}

static int gmbd_serve(struct gmbd *g)
{
	const char *path = g->opts->socket;
	int fd = -1;
	int r;

	r = gmbd_make_dir(path);
	if (r < 0)
		return r;
	r = wire_listen(path, &fd);
	if (r < 0) {
		if (r == -EADDRINUSE)
			log_err("another gmbd is listening path=%s", path);
		else
			log_errno(LOG_LVL_ERR, r, "cannot listen path=%s", path);
		return r;
	}
	/* Any user may connect: what each may do is decided per uid. */
	if (chmod(path, 0666) < 0)
		log_errno(LOG_LVL_WARNING, -errno, "cannot make the socket 0666 path=%s", path);
	r = handlers_init(&g->handlers, &g->loop, g->broker,
			  (uint64_t)g->opts->control_timeout * 1000);
	if (r < 0)
		goto err_close_fd;
	r = server_start(&g->loop, fd, &g->handlers, &g->server);
	fd = -1; /* the server's, even on failure */
	if (r < 0)
		goto err_handlers;
	r = gmbd_signals(g);
	if (r < 0)
		goto err_server;
	return 0;

err_server:
	server_stop(g->server);
err_handlers:
	handlers_close(&g->handlers);
err_close_fd:
	if (fd >= 0)
		close(fd);
	unlink(path);
	log_err("cannot serve err=\"%s\"", uv_strerror(r));
	return r;
}

/* mkdir -p of the socket's directory, 0755 for what it creates. */
static int gmbd_make_dir(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;

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
		if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
			int r = -errno;

			log_errno(LOG_LVL_ERR, r, "cannot create the socket's directory path=%s", dir);
			return r;
		}
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
	log_info("shutting down signal=%s clients=%u", signum == SIGINT ? "SIGINT" : "SIGTERM",
		 g->broker->nclients);
	sd_glue_stopping();
	server_stop(g->server);
	g->server = NULL;
	handlers_close(&g->handlers);
	/* With the signal handles closed, a second signal kills at once. */
	uv_close((uv_handle_t *)&g->sigint, NULL);
	uv_close((uv_handle_t *)&g->sigterm, NULL);
}
