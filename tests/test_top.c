/*
 * test_top.c - gmbctl top in a real terminal: tmux runs it against a real
 * gmbd with real clients (send-keys, capture-pane); the screen shows them,
 * fits 80 columns, follows a pause made by gmbctl, and q quits.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/util.h"

#define MiB (1024ULL * 1024)
#define CAP 65536

static struct gmbd_proc gmbd;
static char out[CAP], err[CAP], tsock[300];

static void start(void)
{
	static const char *const args[] = { "--host-memory", "1GiB", NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
	snprintf(tsock, sizeof(tsock), "%s/tmux.sock", gmbd.dir);
}

static void stop(void)
{
	char *kill_argv[] = { "/usr/bin/tmux", "-S", tsock, "kill-server", NULL };

	run_capture(kill_argv, NULL, NULL, NULL, 0);
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(top, .init = start, .fini = stop, .timeout = 60);

static int tmux(const char *a1, const char *a2, const char *a3, const char *a4)
{
	char *argv[] = { "/usr/bin/tmux", "-S",	      tsock,	  (char *)a1,
			 (char *)a2,	  (char *)a3, (char *)a4, NULL };

	return run_capture(argv, NULL, out, err, CAP);
}

/* The pane's text, until it holds @needle (10 s at most). */
static int screen_wait(const char *needle)
{
	for (int i = 0; i < 200; i++) {
		struct timespec ts = { 0, 50 * 1000 * 1000 };

		if (tmux("capture-pane", "-p", "-t", "top") == 0 && strstr(out, needle))
			return 0;
		nanosleep(&ts, NULL);
	}
	return -ETIMEDOUT;
}

Test(top, shows_clients_and_follows_a_pause)
{
	struct worker w1, w2;
	char cmd[1024], ctl[512];
	char *pause_argv[] = { ctl, "-s", gmbd.sock, "pause", "trainer", "kv", NULL };

	if (access("/usr/bin/tmux", X_OK) != 0)
		cr_skip_test("tmux is not installed (make deps)");
	snprintf(ctl, sizeof(ctl), "%s/gmbctl", test_build_dir());
	cr_assert(eq(i32, worker_start(&w1, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w1, NULL, 0, "connect trainer"), 0));
	cr_assert(eq(i32, worker_cmd(&w1, NULL, 0, "handler accept"), 0));
	cr_assert(eq(i32, worker_cmd(&w1, NULL, 0, "malloc kv %llu", 64 * MiB), 0));
	cr_assert(eq(i32, worker_start(&w2, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w2, NULL, 0, "connect server"), 0));
	cr_assert(eq(i32, worker_cmd(&w2, NULL, 0, "malloc weights %llu", 128 * MiB), 0));

	snprintf(cmd, sizeof(cmd), "exec %s -s %s top", ctl, gmbd.sock);
	cr_assert(eq(i32,
		     run_capture((char *[]){ "/usr/bin/tmux", "-S", tsock, "new-session", "-d",
					     "-s", "top", "-x", "80", "-y", "24", cmd, NULL },
				 NULL, out, err, CAP),
		     0),
		  "tmux: %s", err);
	cr_assert(eq(i32, screen_wait("weights"), 0), "screen: %s", out);
	cr_expect(not(eq(ptr, strstr(out, "trainer"), NULL)), "%s", out);
	cr_expect(not(eq(ptr, strstr(out, "host0"), NULL)), "%s", out);
	cr_expect(not(eq(ptr, strstr(out, "lent 192.0 MiB"), NULL)), "%s", out);
	for (char *l = out; *l;) {
		char *nl = strchr(l, '\n');
		size_t n = nl ? (size_t)(nl - l) : strlen(l);

		cr_expect(le(sz, n, 80), "a line over 80 columns: %.*s", (int)n, l);
		if (!nl)
			break;
		l = nl + 1;
	}

	cr_assert(eq(i32, run_capture(pause_argv, NULL, NULL, err, CAP), 0), "pause: %s", err);
	cr_expect(eq(i32, screen_wait("paused 64.0 MiB"), 0), "screen: %s", out);
	cr_expect(not(eq(ptr, strstr(out, "paused   64.0 MiB"), NULL)), "the tag's row: %s", out);

	tmux("send-keys", "-t", "top", "q");
	/* q ends gmbctl, and with it the session. */
	for (int i = 0; i < 100 && tmux("has-session", "-t", "top", NULL) == 0; i++) {
		struct timespec ts = { 0, 50 * 1000 * 1000 };

		nanosleep(&ts, NULL);
	}
	cr_expect(not(eq(i32, tmux("has-session", "-t", "top", NULL), 0)), "top did not quit on q");
	worker_quit(&w1);
	worker_quit(&w2);
}
