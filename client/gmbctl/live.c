/*
 * live.c - gmbctl's live commands: watch (gmbd's events, one line each)
 * and top (a screen refreshed every second). Both outlive gmbd: when it
 * goes they say so, try again every CTL_RETRY_MS and go on once it is
 * back (watch prints a "restart" line; top shows the new gmbd).
 *
 * Like the rest of gmbctl they use the public libgmb API only.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client/gmbctl/ctl.h"
#include "include/gmb.h"

#define CTL_RETRY_MS	  200
#define CTL_TOP_PERIOD_MS 1000

static volatile sig_atomic_t ctl_stop;

static void ctl_on_signal(int sig)
{
	ctl_stop = 1;
}

/* SIGINT/SIGTERM end the loop (no SA_RESTART: a blocked poll returns). */
static void ctl_catch_signals(void)
{
	struct sigaction sa = { .sa_handler = ctl_on_signal };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

static void ctl_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- watch ---- */

/* A JSON string of @s: quote, backslash and control bytes escaped. */
static void ctl_json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20 || *s == 0x7f)
			printf("\\u%04x", (unsigned char)*s);
		else
			putchar(*s);
	}
	putchar('"');
}

/* gmbctl's own event ("gmbd_gone", "restart"), in the stream's format. */
static void ctl_watch_note(bool json, const char *kind, const char *detail)
{
	struct timespec ts;
	struct tm tm;
	char t[16];

	clock_gettime(CLOCK_REALTIME, &ts);
	if (json) {
		printf("{\"kind\":\"%s\",\"time_ns\":%" PRIu64 ",\"detail\":", kind,
		       (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
		ctl_json_str(detail);
		printf("}\n");
	} else {
		localtime_r(&ts.tv_sec, &tm);
		strftime(t, sizeof(t), "%H:%M:%S", &tm);
		printf("%s.%03ld %s: ", t, ts.tv_nsec / 1000000, kind);
		ctl_put_safe_to(stdout, detail);
		putchar('\n');
	}
	fflush(stdout);
}

/* Connected and subscribed, or (unless @quiet) a reason on stderr. */
static int ctl_watch_open(const struct ctl_args *a, bool quiet, gmb_client **out)
{
	gmb_client *c = NULL;
	int r = ctl_connect("watch", a->socket, quiet, &c);

	if (r < 0)
		return r;
	r = gmb_watch(c);
	if (r < 0) {
		if (!quiet) {
			fputs(CTL_NAME ": watch: ", stderr);
			ctl_put_safe_to(stderr, gmb_last_error(c));
			fputc('\n', stderr);
		}
		gmb_close(c);
		return r;
	}
	*out = c;
	return 0;
}

int ctl_watch(gmb_client *unused, const struct ctl_args *a)
{
	unsigned flags = a->json ? GMB_WATCH_JSON : 0;
	gmb_client *c = NULL;
	char *line;
	int r;

	/* No signal handler: SIGINT and SIGTERM end watch at once (a wait
	 * for the next event is not interrupted by a handler). */
	r = ctl_watch_open(a, false, &c);
	while (r >= 0 && !ctl_stop) {
		r = gmb_watch_next(c, -1, flags, &line);
		if (r == 1) {
			puts(line);
			free(line);
			if (fflush(stdout) != 0)
				r = -EPIPE;
			continue;
		}
		if (r != -ENOTCONN)
			break;
		ctl_watch_note(a->json, "gmbd_gone", gmb_last_error(c));
		gmb_close(c);
		c = NULL;
		while (!ctl_stop && ctl_watch_open(a, true, &c) < 0)
			ctl_sleep_ms(CTL_RETRY_MS);
		if (c)
			ctl_watch_note(a->json, "restart", "gmbd is back; watching again");
		r = 0;
	}
	if (r < 0 && r != -EPIPE && r != -EINTR && c) {
		fputs(CTL_NAME ": watch: ", stderr);
		ctl_put_safe_to(stderr, gmb_last_error(c));
		fputc('\n', stderr);
	}
	gmb_close(c);
	return r;
}

/* ---- top ---- */

struct ctl_term {
	bool tty;
	struct termios saved;
};

static void ctl_term_enter(struct ctl_term *t)
{
	struct termios raw;

	t->tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &t->saved) == 0;
	if (t->tty) {
		raw = t->saved;
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 1;
		raw.c_cc[VTIME] = 0;
		tcsetattr(STDIN_FILENO, TCSANOW, &raw);
	}
	/* The alternate screen, cursor hidden: the shell's screen comes back. */
	fputs("\033[?1049h\033[?25l", stdout);
}

static void ctl_term_leave(struct ctl_term *t)
{
	fputs("\033[?25h\033[?1049l", stdout);
	fflush(stdout);
	if (t->tty)
		tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
}

static int ctl_top_width(void)
{
	struct winsize ws;

	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	return 80;
}

/* One frame: the screen, or why there is none. */
static void ctl_top_frame(gmb_client **c, const struct ctl_args *a)
{
	char *text = NULL;
	int r = -ENOTCONN;

	if (!*c)
		ctl_connect("top", a->socket, true, c);
	if (*c)
		r = gmb_status_top(*c, ctl_top_width(), &text);
	fputs("\033[H\033[2J", stdout);
	if (r == 0) {
		fputs(text, stdout);
	} else {
		printf("gmbd is not reachable (%s); trying again every second.\nq quits.\n",
		       *c ? gmb_last_error(*c) : gmb_strerror(r));
		gmb_close(*c);
		*c = NULL;
	}
	free(text);
	fflush(stdout);
}

/* Waits out one period; true when the user asked to quit. */
static bool ctl_top_wait(bool *stdin_open)
{
	struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
	char ch;

	if (poll(&p, *stdin_open ? 1 : 0, CTL_TOP_PERIOD_MS) <= 0)
		return ctl_stop;
	if (read(STDIN_FILENO, &ch, 1) != 1) {
		*stdin_open = false;
		return ctl_stop;
	}
	return ch == 'q' || ch == 'Q' || ctl_stop;
}

int ctl_top(gmb_client *unused, const struct ctl_args *a)
{
	struct ctl_term term;
	gmb_client *c = NULL;
	bool stdin_open = true;
	int r;

	r = ctl_connect("top", a->socket, false, &c);
	if (r < 0)
		return r;
	ctl_catch_signals();
	ctl_term_enter(&term);
	do
		ctl_top_frame(&c, a);
	while (!ctl_top_wait(&stdin_open));
	ctl_term_leave(&term);
	gmb_close(c);
	return 0;
}
