/*
 * sd.c - gmbd's systemd glue; see sd.h.
 *
 * Invariants: every sd_* call of gmbd is in this file; the watchdog timer
 * runs on the event loop, so a loop stuck in a callback stops the pings and
 * the manager kills and restarts gmbd (which restores from the fd store).
 */
#include "daemon/system/sd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-login.h>
#include <unistd.h>

#include "common/log.h"

#define SD_BUS_TIMEOUT_USEC (2 * 1000 * 1000) /* a bus that does not answer: unknown */

static void sd_glue_on_watchdog(uv_timer_t *t);
static void sd_glue_on_status(uv_timer_t *t);

static int sd_glue_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* One passed fd: the listener, a stored fd, or something to close. */
static void sd_glue_sort_fd(struct sd_fds *out, int fd, const char *name)
{
	if (sd_is_socket(fd, AF_UNIX, SOCK_SEQPACKET, 1) > 0) {
		if (out->listen_fd < 0 && sd_glue_nonblock(fd) == 0) {
			out->listen_fd = fd;
			return;
		}
		log_warn("closing an extra listening socket passed by the service manager fd=%d"
			 " name=%s",
			 fd, name);
		close(fd);
		return;
	}
	if (sd_is_socket(fd, AF_UNSPEC, 0, -1) > 0) {
		log_warn("closing a socket gmbd cannot serve (not AF_UNIX SOCK_SEQPACKET"
			 " listening) fd=%d name=%s",
			 fd, name);
		close(fd);
		return;
	}
	out->named[out->nnamed].fd = fd;
	snprintf(out->named[out->nnamed].name, SD_FDNAME_MAX, "%s", name);
	out->nnamed++;
}

static void sd_glue_names_free(char **names)
{
	for (int i = 0; names && names[i]; i++)
		free(names[i]);
	free(names);
}

int sd_glue_take_fds(struct sd_fds *out)
{
	char **names = NULL;
	int n;

	*out = (struct sd_fds){ .listen_fd = -1 };
	/* 1: unset LISTEN_*, so nothing gmbd might run inherits them. */
	n = sd_listen_fds_with_names(1, &names);
	if (n <= 0) {
		if (n < 0)
			log_errno(LOG_LVL_WARNING, n,
				  "cannot read the fds passed by the service"
				  " manager");
		return 0;
	}
	out->named = calloc((size_t)n, sizeof(*out->named));
	if (!out->named) {
		for (int i = 0; i < n; i++)
			close(SD_LISTEN_FDS_START + i);
		sd_glue_names_free(names);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++)
		sd_glue_sort_fd(out, SD_LISTEN_FDS_START + i,
				names && names[i] ? names[i] : "unknown");
	sd_glue_names_free(names);
	return 0;
}

void sd_glue_fds_free(struct sd_fds *f)
{
	if (f->listen_fd >= 0)
		close(f->listen_fd);
	for (size_t i = 0; i < f->nnamed; i++)
		if (f->named[i].fd >= 0)
			close(f->named[i].fd);
	free(f->named);
	*f = (struct sd_fds){ .listen_fd = -1 };
}

bool sd_glue_has_manager(void)
{
	const char *e = getenv("NOTIFY_SOCKET");

	return e && *e;
}

void sd_glue_ready(const char *status)
{
	int r = sd_notifyf(0, "READY=1\nSTATUS=%s", status);

	if (r < 0)
		log_warn("sd_notify READY failed err=%d", r);
}

void sd_glue_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

int sd_glue_fdstore(int fd, const char *name)
{
	char msg[32 + SD_FDNAME_MAX];

	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
	return sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
}

int sd_glue_fdstore_remove(const char *name)
{
	return sd_notifyf(0, "FDSTOREREMOVE=1\nFDNAME=%s", name);
}

/* ---- the unit's FileDescriptorStoreMax= ---- */

/* $FDSTORE: a decimal number, nothing else. */
static int sd_glue_fdstore_env(unsigned *max)
{
	const char *e = getenv("FDSTORE");
	unsigned long v;
	char *end;

	if (!e || !*e)
		return -ENOENT;
	errno = 0;
	v = strtoul(e, &end, 10);
	if (errno || *end || e[0] == '-' || v > UINT32_MAX)
		return -EINVAL;
	*max = (unsigned)v;
	return 0;
}

static int sd_glue_bus_u32(sd_bus *bus, const char *path, const char *member, uint32_t *out)
{
	sd_bus_error e = SD_BUS_ERROR_NULL;
	int r;

	r = sd_bus_get_property_trivial(bus, "org.freedesktop.systemd1", path,
					"org.freedesktop.systemd1.Service", member, &e, 'u', out);
	sd_bus_error_free(&e);
	return r;
}

/* The property of the service this process is the main process of. */
static int sd_glue_fdstore_bus(unsigned *max, const char **how)
{
	char *unit = NULL, *path = NULL;
	sd_bus *bus = NULL;
	uint32_t pid = 0, v = 0;
	size_t len;
	int r;

	r = sd_pid_get_unit(0, &unit);
	len = r < 0 ? 0 : strlen(unit);
	if (len < 8 || strcmp(unit + len - 8, ".service") != 0) {
		*how = "gmbd does not run in a service unit";
		r = -ENOENT;
		goto free_unit;
	}
	r = sd_bus_path_encode("/org/freedesktop/systemd1/unit", unit, &path);
	if (r < 0)
		goto free_unit;
	*how = "the system bus does not answer";
	r = sd_bus_open_system(&bus);
	if (r < 0)
		goto free_path;
	sd_bus_set_method_call_timeout(bus, SD_BUS_TIMEOUT_USEC);
	r = sd_glue_bus_u32(bus, path, "MainPID", &pid);
	if (r == 0 && pid != (uint32_t)getpid()) {
		*how = "gmbd is not its unit's main process";
		r = -ESRCH;
	}
	if (r >= 0)
		r = sd_glue_bus_u32(bus, path, "FileDescriptorStoreMax", &v);
	if (r >= 0) {
		*max = v;
		*how = "the unit's property";
		r = 0;
	}
	sd_bus_flush_close_unref(bus);
free_path:
	free(path);
free_unit:
	free(unit);
	return r;
}

int sd_glue_fdstore_limit(unsigned *max, const char **how)
{
	int r = sd_glue_fdstore_env(max);

	if (r == 0) {
		*how = "$FDSTORE";
		return 0;
	}
	if (r == -EINVAL) {
		*how = "$FDSTORE is not a number";
		return r;
	}
	return sd_glue_fdstore_bus(max, how);
}

/* ---- watchdog and status on the loop ---- */

int sd_glue_start(struct sd_glue *g, uv_loop_t *loop, sd_status_fn fn, void *arg)
{
	uint64_t usec = 0;
	int r;

	g->status_fn = fn;
	g->status_arg = arg;
	/* Timer init cannot fail; both are closed by sd_glue_stop(). */
	uv_timer_init(loop, &g->watchdog);
	uv_timer_init(loop, &g->status_timer);
	g->watchdog.data = g->status_timer.data = g;
	g->started = true;
	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return 0;
	g->watchdog_usec = usec;
	/* Half the interval, as sd_watchdog_enabled(3) asks; at least 1 ms. */
	r = uv_timer_start(&g->watchdog, sd_glue_on_watchdog, 0, usec / 2000 ? usec / 2000 : 1);
	if (r < 0)
		return r;
	log_info("watchdog armed interval_ms=%llu", (unsigned long long)(usec / 1000));
	return 0;
}

static void sd_glue_on_watchdog(uv_timer_t *t)
{
	sd_notify(0, "WATCHDOG=1");
}

const char *sd_glue_status_now(struct sd_glue *g)
{
	g->status_fn(g->status_arg, g->status, sizeof(g->status));
	g->status_sent_ms = g->started ? uv_now(g->status_timer.loop) : 0;
	return g->status;
}

void sd_glue_changed(struct sd_glue *g)
{
	uint64_t now, due;

	if (!g->started || uv_is_active((uv_handle_t *)&g->status_timer))
		return;
	now = uv_now(g->status_timer.loop);
	due = g->status_sent_ms + SD_STATUS_MIN_MS;
	uv_timer_start(&g->status_timer, sd_glue_on_status, due > now ? due - now : 0, 0);
}

static void sd_glue_on_status(uv_timer_t *t)
{
	struct sd_glue *g = t->data;
	char line[sizeof(g->status)];

	g->status_fn(g->status_arg, line, sizeof(line));
	g->status_sent_ms = uv_now(t->loop);
	if (strcmp(line, g->status) == 0)
		return;
	memcpy(g->status, line, sizeof(line));
	sd_notifyf(0, "STATUS=%s", g->status);
}

void sd_glue_stop(struct sd_glue *g)
{
	if (!g->started)
		return;
	g->started = false;
	uv_close((uv_handle_t *)&g->watchdog, NULL);
	uv_close((uv_handle_t *)&g->status_timer, NULL);
}
