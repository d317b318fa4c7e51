/*
 * test_observe.c - what gmbd tells people, against a real gmbd and real
 * clients: the CONTROL column, refusals in the log, the log's form, gmbctl's
 * help and hints, the driver's view in status, and gmbctl watch (events,
 * a restart of gmbd, a slow watcher dropped).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/wire.h"
#include "tests/raw_client.h"
#include "tests/util.h"

#define MiB (1024ULL * 1024)
#define CAP 65536

static struct gmbd_proc gmbd;
static char out[CAP], err[CAP];
static char sockdir[64], sock[128];

static void start_with(const char *extra, const char *value)
{
	const char *args[] = { "--host-memory", "256MiB", "--socket", sock, extra, value, NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void start(void)
{
	snprintf(sockdir, sizeof(sockdir), "/tmp/gmbobs.XXXXXX");
	cr_assert(not(eq(ptr, mkdtemp(sockdir), NULL)));
	snprintf(sock, sizeof(sock), "%s/gmbd.sock", sockdir);
	start_with(NULL, NULL);
}

static void stop(void)
{
	if (gmbd.pid > 0)
		cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
	rmdir(sockdir);
}

TestSuite(observe, .init = start, .fini = stop, .timeout = 90);

static int ctl_v(int dummy, ...)
{
	va_list ap;
	int rc;

	va_start(ap, dummy);
	rc = gmbctl_vrun(NULL, NULL, out, err, CAP, ap);
	va_end(ap);
	return rc;
}

#define ctl(...) ctl_v(0, __VA_ARGS__, (char *)NULL)

static bool has(const char *s, const char *needle)
{
	return strstr(s, needle) != NULL;
}

/* gmbd's log has a line with every one of the NULL-terminated needles. */
static int log_has(const char *first, ...)
{
	char line[4096];
	FILE *f = fopen(gmbd.log, "r");
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		const char *n = first;
		va_list ap;

		found = 1;
		va_start(ap, first);
		for (; n; n = va_arg(ap, const char *))
			found &= strstr(line, n) != NULL;
		va_end(ap);
	}
	fclose(f);
	return found;
}

static void worker_up(struct worker *w, const char *name)
{
	char text[512] = "";

	cr_assert(eq(i32, worker_connect(w, sock, name, text, sizeof(text)), 0), "%s", text);
}

/* ---- the CONTROL column and the refusal up front ---- */

Test(observe, control_column_follows_the_handler)
{
	struct worker w;

	worker_up(&w, "ctlw");
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv %llu", 4 * MiB), 0));
	cr_assert(eq(i32, ctl("-s", sock, "status", "--json"), 0), "%s", err);
	cr_expect(not(eq(ptr, strstr(out, "\"control\":false"), NULL)),
		  "no handler yet, status says: %s", out);
	cr_assert(eq(i32, ctl("-s", sock, "pause", "ctlw"), 1));
	cr_expect(not(eq(ptr, strstr(err, "has no control handler"), NULL)), "refusal: %s", err);
	cr_expect(not(eq(ptr, strstr(err, "GMB_CONTROL=accept"), NULL)),
		  "refusal says what to do: %s", err);
	cr_expect(log_has("request refused", "client=gmbctl", "request=control",
			  "reason=no_control", NULL));

	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "handler accept"), 0));
	cr_assert(eq(i32, ctl("-s", sock, "status", "--json"), 0), "%s", err);
	cr_expect(not(eq(ptr, strstr(out, "\"control\":true"), NULL)),
		  "handler installed, status says: %s", out);
	cr_assert(eq(i32, ctl("-s", sock, "status"), 0));
	cr_expect(not(eq(ptr, strstr(out, "yes"), NULL)), "%s", out);
	cr_assert(eq(i32, ctl("pause", "-s", sock, "ctlw", "kv"), 0), "%s", err);
	cr_expect(not(eq(ptr, strstr(out, "paused tag 'kv' of client 'ctlw'"), NULL)),
		  "pause says: %s", out);
	cr_assert(eq(i32, ctl("resume", "ctlw", "--socket", sock), 0), "%s", err);
	cr_expect(not(eq(ptr, strstr(out, "resumed every tag of client 'ctlw'"), NULL)),
		  "resume says: %s", out);
	worker_quit(&w);
}

/* ---- refusals at the default level ---- */

Test(observe, budget_refusal_is_logged)
{
	struct worker w;

	worker_up(&w, "greedy");
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc big %llu", 512 * MiB), -ENOMEM));
	worker_quit(&w);
	cr_expect(log_has("info", "request refused", "client=greedy", "request=alloc",
			  "reason=budget", "status=-12", NULL),
		  "no refusal line in the log");
	/* A terminal or a file gets no journald prefixes. */
	cr_expect(eq(i32, log_has("<6>", NULL), 0));
}

/* ---- the log's form ---- */

static void log_capture(const char *journal, char *buf, size_t cap)
{
	char path[] = "/tmp/gmblog.XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	struct stat st;
	char js[64];
	ssize_t n;

	cr_assert(fd >= 0 && saved >= 0);
	fstat(fd, &st);
	snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)(journal ? st.st_ino : st.st_ino + 1));
	setenv("JOURNAL_STREAM", js, 1);
	dup2(fd, 2);
	log_init();
	log_write(LOG_LVL_INFO, "client gone client=%s", "x");
	dup2(saved, 2);
	close(saved);
	unsetenv("JOURNAL_STREAM");
	n = pread(fd, buf, cap - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
	unlink(path);
}

Test(observe, journald_prefix_only_on_its_stream)
{
	char buf[512];

	log_capture("journal", buf, sizeof(buf));
	cr_expect(eq(str, buf, "<6>client gone client=x\n"));
	log_capture(NULL, buf, sizeof(buf));
	cr_expect(eq(i32, has(buf, "<6>"), 0), "%s", buf);
	cr_expect(not(eq(ptr, strstr(buf, " info    client gone client=x\n"), NULL)), "%s", buf);
}

Test(observe, log_quote_values)
{
	char b[64];

	cr_expect(eq(str, (char *)log_quote("kv", b, sizeof(b)), "kv"));
	cr_expect(eq(str, (char *)log_quote("every tag", b, sizeof(b)), "\"every tag\""));
	cr_expect(eq(str, (char *)log_quote("a\"b\\c", b, sizeof(b)), "\"a\\\"b\\\\c\""));
	cr_expect(eq(str, (char *)log_quote("", b, sizeof(b)), "\"\""));
}

/* ---- gmbctl ---- */

Test(observe, gmbctl_help_and_hints)
{
	char missing[200];

	cr_assert(eq(i32, ctl("help"), 0));
	cr_expect(has(out, "watch [--json]") && has(out, "top"), "%s", out);
	cr_assert(eq(i32, ctl("help", "pause"), 0));
	cr_expect(not(eq(ptr, strstr(out, "Usage: gmbctl [OPTIONS] pause CLIENT [TAG]"), NULL)),
		  "%s", out);
	cr_expect(eq(i32, ctl("help", "nosuch"), 2));
	snprintf(missing, sizeof(missing), "%s/none.sock", sockdir);
	cr_assert(eq(i32, ctl("status", "-s", missing), 1));
	cr_expect(has(err, "hint: is gmbd running?") && has(err, "GMB_SOCKET"), "%s", err);
}

/* ---- the driver's view ---- */

Test(observe, status_shows_the_driver_view)
{
	struct worker w;

	gmbd_stop(&gmbd);
	start_with("--host-used-outside", "64MiB");
	worker_up(&w, "dv");
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv %llu", 8 * MiB), 0));
	cr_assert(eq(i32, ctl("-s", sock, "status", "--json"), 0), "%s", err);
	cr_expect(eq(i64, json_i64(out, "outside_bytes"), 64 * MiB));
	cr_expect(eq(i64, json_i64_after(out, "\"driver\"", "used_bytes"), 72 * MiB));
	cr_expect(eq(i64, json_i64(out, "lent_bytes"), 8 * MiB));
	cr_expect(eq(i64, json_i64(out, "available_bytes"), 248 * MiB));
	/* Old names stay. */
	cr_expect(eq(i64, json_i64(out, "used_bytes"), 8 * MiB));
	cr_assert(eq(i32, ctl("-s", sock, "status"), 0));
	cr_expect(has(out, "OUTSIDE") && has(out, "IDLE") && has(out, "AVAIL") &&
			  !has(out, " FREE"),
		  "%s", out);
	worker_quit(&w);
}

/* ---- watch ---- */

struct child {
	pid_t pid;
	int out; /* its stdout */
	char buf[CAP];
	size_t len;
};

static void child_start(struct child *c, char *const argv[])
{
	int p[2];

	cr_assert(pipe(p) == 0);
	c->len = 0;
	c->pid = fork();
	cr_assert(c->pid >= 0);
	if (c->pid == 0) {
		dup2(p[1], 1);
		close(p[0]);
		close(p[1]);
		execv(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	c->out = p[0];
}

/* Reads until @needle is in what came so far (@ms at most). */
static int child_wait(struct child *c, const char *needle, int ms)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct pollfd pf = { .fd = c->out, .events = POLLIN };
		long spent;
		ssize_t n;

		c->buf[c->len] = '\0';
		if (strstr(c->buf, needle))
			return 0;
		clock_gettime(CLOCK_MONOTONIC, &t);
		spent = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (spent >= ms || poll(&pf, 1, (int)(ms - spent)) <= 0)
			return -ETIMEDOUT;
		n = read(c->out, c->buf + c->len, sizeof(c->buf) - 1 - c->len);
		if (n <= 0)
			return -EPIPE;
		c->len += (size_t)n;
	}
}

static void child_stop(struct child *c)
{
	kill(c->pid, SIGTERM);
	waitpid(c->pid, NULL, 0);
	close(c->out);
}

Test(observe, watch_prints_events_and_survives_a_restart)
{
	static struct child c;
	struct worker w;
	char bin[256];
	char *argv[] = { bin, "-s", sock, "watch", "--json", NULL };

	snprintf(bin, sizeof(bin), "%s/gmbctl", test_build_dir());
	child_start(&c, argv);
	cr_assert(eq(i32, child_wait(&c, "\"kind\":\"subscribed\"", 10000), 0), "%s", c.buf);
	worker_up(&w, "watched");
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "mode kv preserve"), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv %llu", 4 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "pause kv"), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "resume kv"), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc big %llu", 512 * MiB), -ENOMEM));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "free kv"), 0));
	worker_quit(&w);
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"connected\",", 5000), 0), "%s", c.buf);
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"alloc\",", 5000), 0));
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"pause\",", 5000), 0));
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"resume\",", 5000), 0));
	cr_expect(eq(i32, child_wait(&c, "\"reason\":\"budget\"", 5000), 0));
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"free\",", 5000), 0));
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"gone\",", 5000), 0), "%s", c.buf);
	cr_expect(not(eq(ptr, strstr(c.buf, "\"client\":\"watched\""), NULL)));
	cr_expect(not(eq(ptr, strstr(c.buf, "\"bytes\":4194304"), NULL)));

	/* gmbd goes and comes back on the same socket. */
	cr_assert(eq(i32, gmbd_stop(&gmbd), 0));
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"gmbd_gone\"", 5000), 0), "%s", c.buf);
	/* gmbd's sentence as it said it, no "gmbd stopped: " before it again. */
	cr_expect(eq(i32, child_wait(&c, "\"detail\":\"gmbd stopped and kept no state\"", 5000), 0),
		  "%s", c.buf);
	cr_expect(eq(ptr, strstr(c.buf, "gmbd stopped: gmbd stopped"), NULL), "%s", c.buf);
	start_with(NULL, NULL);
	cr_expect(eq(i32, child_wait(&c, "\"kind\":\"restart\"", 10000), 0), "%s", c.buf);
	child_stop(&c);
	/* One object per line. */
	for (char *l = c.buf; *l; l = strchr(l, '\n') + 1) {
		cr_expect(l[0] == '{', "line: %.80s", l);
		if (!strchr(l, '\n'))
			break;
	}
}

/* A raw subscriber that never reads: gmbd drops it with a last event. */
Test(observe, slow_watcher_is_dropped)
{
	Gmb__Envelope env, *rep = NULL;
	Gmb__Hello hello;
	Gmb__WatchRequest wr = GMB__WATCH_REQUEST__INIT;
	int fd = -1, fds[WIRE_MAX_FDS], nfds = 0, events = 0, r;
	struct worker w;
	char last[32] = "";

	cr_assert(eq(i32, wire_connect(sock, &fd), 0));
	raw_client_hello_env(&env, &hello, "slow");
	hello.tool = true;
	cr_assert(eq(i32, wire_send(fd, &env, NULL, 0), 0));
	cr_assert(eq(i32, wire_recv(fd, &rep, fds, &nfds), 0));
	gmb__envelope__free_unpacked(rep, NULL);
	env.id = 2;
	env.body_case = GMB__ENVELOPE__BODY_WATCH;
	env.watch = &wr;
	cr_assert(eq(i32, wire_send(fd, &env, NULL, 0), 0));

	worker_up(&w, "busy");
	for (int i = 0; i < 3000; i++)
		cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc big %llu", 512 * MiB), -ENOMEM));
	/* gmbd kept serving everyone else. */
	cr_assert(eq(i32, ctl("-s", sock, "status"), 0), "%s", err);
	worker_quit(&w);
	while ((r = wire_recv(fd, &rep, fds, &nfds)) == 0) {
		if (rep->body_case == GMB__ENVELOPE__BODY_WATCH_EVENT) {
			events++;
			snprintf(last, sizeof(last), "%s", rep->watch_event->kind);
		}
		gmb__envelope__free_unpacked(rep, NULL);
	}
	close(fd);
	cr_expect(eq(str, last, "dropped"), "last of %d events: %s", events, last);
	cr_expect(lt(i32, events, 3000));
	cr_expect(log_has("watcher fell behind", NULL));
}
