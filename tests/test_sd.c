/*
 * test_sd.c - gmbd as a systemd service, without systemd as PID 1: started
 * by systemd-socket-activate(1) on a SOCK_SEQPACKET socket with
 * NOTIFY_SOCKET pointing at the test's fake manager (tests/fake_sd.c), it must
 * serve on the passed socket, say READY=1 before its first answer, keep
 * sending WATCHDOG=1, show its clients in STATUS= and say STOPPING=1; a
 * passed socket of another kind is refused. And its configuration file:
 * every option settable, the command line winning, errors naming the line,
 * and the shipped sample (deploy/gmbd.conf) valid and complete.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/wire.h"
#include "daemon/service/opts.h"
#include "include/gmb.h"
#include "tests/util.h"

#define MiB		(1024ULL * 1024)
#define WAIT_MS		10000
#define SOCKET_ACTIVATE "/usr/bin/systemd-socket-activate"

static struct sd_gmbd fx;

static void setup(void)
{
	cr_assert(eq(i32, sd_gmbd_open(&fx, "/tmp/gmbsd.XXXXXX", false), 0));
}

static void teardown(void)
{
	sd_gmbd_close(&fx, SIGKILL);
}

TestSuite(sd, .init = setup, .fini = teardown, .timeout = 60);

/*
 * systemd-socket-activate listens, then execs gmbd at the first connection
 * (so gmbd's pid is its pid). Returns once it said it listens, reading its
 * stderr: the pipe is the readiness signal, no sleep.
 */
static void socket_activate(const char *const *gmbd_args)
{
	char bin[256], e1[320], e2[64], line[512];
	const char *argv[32];
	int err[2], n = 0;
	FILE *f;

	cr_assert(eq(i32, access(SOCKET_ACTIVATE, X_OK), 0), "%s is missing (make deps)",
		  SOCKET_ACTIVATE);
	snprintf(bin, sizeof(bin), "%s/gmbd", test_build_dir());
	snprintf(e1, sizeof(e1), "NOTIFY_SOCKET=%s", fx.notify);
	snprintf(e2, sizeof(e2), "WATCHDOG_USEC=%d", 200000);
	argv[n++] = SOCKET_ACTIVATE;
	argv[n++] = "--seqpacket";
	argv[n++] = "-l";
	argv[n++] = fx.gmbd.sock;
	argv[n++] = "-E";
	argv[n++] = e1;
	argv[n++] = "-E";
	argv[n++] = e2;
	argv[n++] = bin;
	for (; *gmbd_args; gmbd_args++)
		argv[n++] = *gmbd_args;
	argv[n] = NULL;
	cr_assert(eq(i32, pipe2(err, O_CLOEXEC), 0));
	fx.gmbd.pid = fork();
	if (fx.gmbd.pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(err[1], 2);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(err[1]);
	f = fdopen(err[0], "r");
	while (fgets(line, sizeof(line), f) && !strstr(line, "Listening on"))
		;
	cr_assert(not(eq(ptr, strstr(line, "Listening on"), NULL)), "no 'Listening on': %s", line);
	/* gmbd logs to the same pipe: drain it from a child of ours, never
	 * block it, into the fixture's log file (shown if the test fails). */
	if (fork() == 0) {
		FILE *log = fopen(fx.gmbd.log, "a");

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		while (fgets(line, sizeof(line), f))
			fputs(line, log ? log : stderr);
		_exit(0);
	}
	fclose(f);
}

Test(sd, socket_activation_ready_watchdog_status_stopping)
{
	static const char *const args[] = {
		"--backend",   "host",	   "--host-memory",
		"64MiB",       "--socket", "/nonexistent/never-bound.sock",
		"--log-level", "notice",   NULL
	};
	struct worker w;
	char out[256];

	socket_activate(args);
	cr_assert(eq(u32, fx.sd.ready, 0), "READY=1 before anyone connected");
	/* The first connection starts gmbd; its answer comes after READY=1. */
	cr_assert(eq(i32, worker_start(&w, fx.gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w, out, sizeof(out), "connect engine"), 0), "%s", out);
	cr_assert(eq(i32, fake_sd_sync(&fx.sd), 0));
	cr_assert(eq(u32, fx.sd.ready, 1), "READY=1 did not come before the first answer");
	cr_assert(eq(i32, access("/nonexistent/never-bound.sock", F_OK), -1),
		  "gmbd bound --socket instead of using the passed one");

	cr_assert(eq(i32, fake_sd_wait_count(&fx.sd, &fx.sd.watchdog, 5, WAIT_MS), 0),
		  "WATCHDOG=1 does not keep coming");
	cr_assert(eq(i32, worker_cmd(&w, out, sizeof(out), "malloc t 4194304"), 0), "%s", out);
	cr_assert(eq(i32, fake_sd_wait_status(&fx.sd, "1 client, 4.0 MiB lent", WAIT_MS), 0),
		  "STATUS= says: %s", fx.sd.status);
	cr_assert(eq(i32, worker_cmd(&w, out, sizeof(out), "free t"), 0), "%s", out);
	cr_assert(eq(i32, fake_sd_wait_status(&fx.sd, "1 client, 0 B lent", WAIT_MS), 0),
		  "STATUS= says: %s", fx.sd.status);
	cr_assert(eq(i32, worker_quit(&w), 0));
	cr_assert(eq(i32, fake_sd_wait_status(&fx.sd, "0 clients", WAIT_MS), 0), "STATUS= says: %s",
		  fx.sd.status);

	kill(fx.gmbd.pid, SIGTERM);
	cr_assert(eq(i32, gmbd_wait(&fx.gmbd), 0), "gmbd did not exit cleanly");
	cr_assert(eq(i32, fake_sd_sync(&fx.sd), 0));
	cr_assert(eq(u32, fx.sd.stopping, 1), "no STOPPING=1");
}

Test(sd, a_passed_socket_of_another_kind_is_refused)
{
	static const char *const args[] = { "--log-level", "err", NULL };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct sd_pass pass;
	gmb_client *c;
	int fd;

	/* A stream socket where a SOCK_SEQPACKET listener belongs. */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(lt(i32, snprintf(sa.sun_path, sizeof(sa.sun_path), "%.80s/stream.sock", fx.dir),
		     (int)sizeof(sa.sun_path)));
	cr_assert(eq(i32, bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0));
	cr_assert(eq(i32, listen(fd, 4), 0));
	pass = (struct sd_pass){ .fd = fd, .name = "gmbd.socket" };
	cr_assert(eq(i32, gmbd_spawn(&fx.gmbd, fx.notify, &pass, 1, args), 0));
	cr_assert(eq(i32, fake_sd_wait_count(&fx.sd, &fx.sd.ready, 1, WAIT_MS), 0));
	/* It bound its own socket at --socket instead. */
	cr_assert(eq(i32, gmb_connect(fx.gmbd.sock, "probe", &c), 0));
	gmb_close(c);
	close(fd);
}

/* ---- the configuration file ---- */

static char conf_err[OPTS_ERR_MAX];

/* opts_parse() of "gmbd" plus a NULL-terminated list. */
static int parse(struct gmbd_opts *o, const char *first, ...)
{
	char *argv[32] = { "gmbd" };
	int argc = 1;
	va_list ap;

	va_start(ap, first);
	for (const char *a = first; a; a = va_arg(ap, const char *))
		argv[argc++] = (char *)a;
	va_end(ap);
	return opts_parse(o, argc, argv, conf_err);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	cr_assert(not(eq(ptr, f, NULL)));
	fputs(text, f);
	fclose(f);
}

TestSuite(conf, .init = setup, .fini = teardown, .timeout = 30);

Test(conf, every_option_is_settable_and_the_command_line_wins)
{
	char path[320];
	struct gmbd_opts o;

	snprintf(path, sizeof(path), "%s/gmbd.conf", fx.dir);
	write_file(path, "# a comment\n\n"
			 "socket = /run/x/gmbd.sock\n"
			 "backend = host\n"
			 "host-devices = 3\n"
			 "  host-memory =  96MiB  \n"
			 "host-granularity = 64KiB\n"
			 "max-chunk = \"8MiB\"\n"
			 "pool-keep = 32MiB\n"
			 "budget = 48MiB\n"
			 "reserve = 1MiB\n"
			 "admin-group = wheel\n"
			 "control-timeout = 7\n"
			 "log-level = debug\n"
			 "fdstore-max = 99\n"
			 "rejoin-grace = 5\n");
	cr_assert(eq(i32,
		     parse(&o, "--config", path, "--log-level", "err", "--host-devices", "2", NULL),
		     OPTS_RUN),
		  "%s", conf_err);
	cr_assert(eq(str, (char *)o.config, path));
	cr_assert(eq(str, (char *)o.socket, "/run/x/gmbd.sock"));
	cr_assert(eq(str, (char *)o.backend, "host"));
	cr_assert(eq(i32, o.host_devices, 2), "the command line wins");
	cr_assert(eq(u64, o.host_memory, 96 * MiB));
	cr_assert(eq(u64, o.host_granularity, 64 * 1024));
	cr_assert(eq(u64, o.max_chunk, 8 * MiB));
	cr_assert(eq(u64, o.pool_keep, 32 * MiB));
	cr_assert(eq(u64, o.budget, 48 * MiB));
	cr_assert(eq(u64, o.reserve, 1 * MiB));
	cr_assert(o.reserve_set);
	cr_assert(eq(str, (char *)o.admin_group, "wheel"));
	cr_assert(eq(u32, o.control_timeout, 7));
	cr_assert(eq(i32, o.log_level, LOG_LVL_ERR), "the command line wins");
	cr_assert(eq(u32, o.fdstore_max, 99));
	cr_assert(eq(u32, o.rejoin_grace, 5));
	opts_deinit(&o);
}

Test(conf, errors_name_the_file_and_line)
{
	char path[320];
	struct gmbd_opts o;

	snprintf(path, sizeof(path), "%s/bad.conf", fx.dir);
	write_file(path, "backend = host\nno-such-option = 1\n");
	cr_assert(lt(i32, parse(&o, "--config", path, NULL), 0));
	cr_assert(not(eq(ptr, strstr(conf_err, "bad.conf:2:"), NULL)), "%s", conf_err);
	cr_assert(not(eq(ptr, strstr(conf_err, "no-such-option"), NULL)), "%s", conf_err);
	write_file(path, "host-memory = lots\n");
	cr_assert(lt(i32, parse(&o, "--config", path, NULL), 0));
	cr_assert(not(eq(ptr, strstr(conf_err, "bad.conf:1: --host-memory"), NULL)), "%s",
		  conf_err);
	write_file(path, "backend host\n");
	cr_assert(lt(i32, parse(&o, "--config", path, NULL), 0));
	cr_assert(not(eq(ptr, strstr(conf_err, "name = value"), NULL)), "%s", conf_err);
	write_file(path, "config = /etc/other.conf\n");
	cr_assert(lt(i32, parse(&o, "--config", path, NULL), 0), "config in the file");
	write_file(path, "help = 1\n");
	cr_assert(lt(i32, parse(&o, "--config", path, NULL), 0), "help in the file");
}

Test(conf, a_missing_explicit_file_is_an_error_unless_help)
{
	char out[4096] = "", err[4096] = "", bin[256];
	struct gmbd_opts o;
	char *argv[] = { bin, "--config", "/nonexistent/gmbd.conf", NULL };

	cr_assert(eq(i32, parse(&o, "--config", "/nonexistent/gmbd.conf", NULL), -ENOENT));
	cr_assert(not(eq(ptr, strstr(conf_err, "/nonexistent/gmbd.conf"), NULL)), "%s", conf_err);
	cr_assert(
		eq(i32, parse(&o, "--conf", "/nonexistent/gmbd.conf", "--help", NULL), OPTS_HELP));
	snprintf(bin, sizeof(bin), "%s/gmbd", test_build_dir());
	cr_assert(eq(i32, run_capture(argv, NULL, out, err, sizeof(out)), 2));
	cr_assert(not(eq(ptr, strstr(err, "/nonexistent/gmbd.conf"), NULL)), "%s", err);
}

Test(conf, help_mentions_the_configuration_file)
{
	char out[16384] = "", bin[256];
	char *argv[] = { bin, "--help", NULL };

	snprintf(bin, sizeof(bin), "%s/gmbd", test_build_dir());
	cr_assert(eq(i32, run_capture(argv, NULL, out, NULL, sizeof(out)), 0));
	cr_assert(not(eq(ptr, strstr(out, "/etc/gmbd/gmbd.conf"), NULL)), "%s", out);
	cr_assert(not(eq(ptr, strstr(out, "--config=PATH"), NULL)), "%s", out);
	cr_assert(not(eq(ptr, strstr(out, "--fdstore-max=N"), NULL)), "%s", out);
	cr_assert(not(eq(ptr, strstr(out, "--rejoin-grace=SECONDS"), NULL)), "%s", out);
}

/* Every "# name = value" line of the sample, uncommented, is a valid setting. */
Test(conf, the_shipped_sample_documents_every_option_with_valid_values)
{
	static const char *const names[] = { "socket",
					     "socket-mode",
					     "socket-group",
					     "backend",
					     "host-devices",
					     "host-memory",
					     "host-granularity",
					     "max-chunk",
					     "pool-keep",
					     "budget",
					     "reserve",
					     "admin-group",
					     "control-timeout",
					     "log-level",
					     "fdstore-max",
					     "rejoin-grace",
					     "hello-timeout",
					     "max-connections-per-uid",
					     "max-chunks-per-uid" };
	char line[512], path[320], key[64];
	FILE *f = fopen("deploy/gmbd.conf", "r");
	struct gmbd_opts o;
	unsigned seen = 0;

	cr_assert(not(eq(ptr, f, NULL)), "deploy/gmbd.conf is missing");
	snprintf(path, sizeof(path), "%s/one.conf", fx.dir);
	cr_assert(eq(i32, parse(&o, "--config", "deploy/gmbd.conf", NULL), OPTS_RUN), "%s",
		  conf_err);
	opts_deinit(&o);
	while (fgets(line, sizeof(line), f)) {
		int end = 0;

		/* "# name = value": a name, blanks, then '=' right away. */
		if (sscanf(line, "# %63[a-z-] %n", key, &end) != 1 || !end || line[end] != '=')
			continue;
		write_file(path, line + 1);
		cr_assert(eq(i32, parse(&o, "--config", path, NULL), OPTS_RUN), "%s: %s", line,
			  conf_err);
		opts_deinit(&o);
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (strcmp(key, names[i]) == 0)
				seen |= 1u << i;
	}
	fclose(f);
	cr_assert(eq(u32, seen, (1u << (sizeof(names) / sizeof(names[0]))) - 1),
		  "options missing from the sample: mask %x", seen);
}
