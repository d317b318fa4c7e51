/*
 * test_watch.c - watchers of gmbd's events through the real handlers and a
 * corked server, as gmbd runs them: each watcher is the test's end of a
 * socketpair whose other end is a real session. The cork callback's result
 * is the test's to set, so it holds the replies (as a state record that is
 * not stored does) and lets them go at will; events are emitted straight
 * into the handlers. Every test ends with uv_loop_close() == 0 (teardown).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/backend/backend.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/handlers/handlers.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/server.h"
#include "daemon/transport/sess.h"
#include "tests/handlers_fx.h"
#include "tests/util.h"

#define WAIT_MS 5000

static struct hfx fx;
static int fx_cork_rc; /* < 0: replies held */

/* Runs as the loop turns (hfx_spin(), hfx_recv()). */
static int fx_cork(void *arg)
{
	return fx_cork_rc;
}

static void setup(void)
{
	struct backend_host_opts ho = { .ndevices = 1,
					.memory = 1ULL << 30,
					.granularity = 2 << 20 };
	struct broker_opts bo = { .max_chunk = 1ULL << 30, .daemon_uid = geteuid() };

	log_max_level = getenv("GMB_TEST_DEBUG") ? LOG_LVL_DEBUG : LOG_LVL_WARNING;
	/* The layers' log lines: the test's file, shown if it fails. */
	cr_assert(eq(i32, test_log_stderr("stderr"), 0));
	cr_assert(eq(i32, hfx_start(&fx, &ho, &bo, 30000), 0));
	fx_cork_rc = 0;
	cr_assert(eq(i32, server_cork(fx.srv, fx_cork, NULL), 0));
}

static void teardown(void)
{
	hfx_stop(&fx);
	cr_assert(eq(i32, hfx_free(&fx), 0));
}

TestSuite(watch, .init = setup, .fini = teardown, .timeout = 30);

/* Next packet for @fd, turning the loop meanwhile: 0 or -ECONNRESET. */
static int fx_recv(int fd, Gmb__Envelope **env)
{
	int fds[WIRE_MAX_FDS], nfds = 0;
	int r = hfx_recv(&fx, fd, env, fds, &nfds, WAIT_MS);

	cr_assert(r != -ETIMEDOUT, "no packet within %d ms", WAIT_MS);
	cr_assert(r == 0 || r == -ECONNRESET, "wire_recv: %s", strerror(-r));
	cr_assert(eq(i32, nfds, 0));
	return r;
}

static void fx_send(int fd, uint64_t id, Gmb__Envelope__BodyCase bc, void *body)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__Envelope *rep = NULL;

	env.id = id;
	env.body_case = bc;
	env.hello = body; /* every oneof member is a pointer */
	cr_assert(eq(i32, wire_send(fd, &env, NULL, 0), 0));
	cr_assert(eq(i32, fx_recv(fd, &rep), 0));
	cr_assert(eq(u64, rep->reply_to, id));
	cr_assert(eq(i32, rep->status, 0), "%s", rep->error ? rep->error : "");
	gmb__envelope__free_unpacked(rep, NULL);
}

/* A watcher (a tool that said hello and watches) that got "subscribed". */
static int fx_watcher(void)
{
	Gmb__Hello h = GMB__HELLO__INIT;
	Gmb__WatchRequest wr = GMB__WATCH_REQUEST__INIT;
	Gmb__Envelope *ev = NULL;
	int fd = -1;

	cr_assert(eq(i32, hfx_client(&fx, &fd), 0));
	h.version = GMB_PROTOCOL_VERSION;
	h.name = "watcher";
	h.tool = true;
	fx_send(fd, 1, GMB__ENVELOPE__BODY_HELLO, &h);
	fx_send(fd, 2, GMB__ENVELOPE__BODY_WATCH, &wr);
	cr_assert(eq(i32, fx_recv(fd, &ev), 0));
	cr_assert(eq(str, ev->watch_event->kind, "subscribed"));
	gmb__envelope__free_unpacked(ev, NULL);
	return fd;
}

/* @n trim events to every watcher. */
static void fx_emit(int n)
{
	for (int i = 0; i < n; i++) {
		struct event ev = EVENT_INIT(EVENT_TRIM);

		ev.actor = "test";
		handlers__emit(&fx.h, &ev);
	}
}

/* The next event's kind (and count) on @fd; "" once it is closed. */
static void fx_next(int fd, char *kind, size_t len, uint64_t *count)
{
	Gmb__Envelope *ev = NULL;

	*kind = '\0';
	if (fx_recv(fd, &ev) < 0)
		return;
	cr_assert(eq(i32, ev->body_case, GMB__ENVELOPE__BODY_WATCH_EVENT));
	snprintf(kind, len, "%s", ev->watch_event->kind);
	*count = ev->watch_event->count;
	gmb__envelope__free_unpacked(ev, NULL);
}

Test(watch, a_watcher_full_while_held_is_counted_then_told_and_served)
{
	int fd = fx_watcher(), got = 0, extra = 100;
	uint64_t count = 0;
	char kind[32];

	fx_cork_rc = -EFBIG;
	hfx_spin(&fx);
	cr_assert(fx.srv->host.held);
	fx_emit(HANDLERS_WATCH_MAX_PACKETS + extra);
	hfx_spin(&fx);
	cr_assert(eq(sz, fx.h.nwatchers, 1), "dropped while replies are held");
	cr_assert(le(u32, fx.h.watchers[0]->out_count, HANDLERS_WATCH_MAX_PACKETS));
	cr_assert(eq(u64, hconn_of(fx.h.watchers[0])->watch_missed, (uint64_t)extra));
	/* Nothing else comes: the end of the hold alone brings the count. */
	fx_cork_rc = 0;
	for (fx_next(fd, kind, sizeof(kind), &count); !strcmp(kind, "trim");
	     fx_next(fd, kind, sizeof(kind), &count))
		got++;
	cr_assert(eq(str, kind, "missed"));
	cr_assert(eq(i32, got, HANDLERS_WATCH_MAX_PACKETS));
	cr_assert(eq(u64, count, (uint64_t)extra));
	/* Then events as before. */
	fx_emit(1);
	fx_next(fd, kind, sizeof(kind), &count);
	cr_assert(eq(str, kind, "trim"));
	cr_assert(eq(u64, count, 0));
	cr_assert(eq(sz, fx.h.nwatchers, 1));
	close(fd);
}

/* Caught up with the hold, a watcher that falls behind is dropped as ever. */
Test(watch, a_watcher_full_outside_a_hold_is_dropped)
{
	int fd = fx_watcher(), got = 0;
	uint64_t count = 0;
	char kind[32], last[32] = "";

	fx_emit(HANDLERS_WATCH_MAX_PACKETS + 1);
	cr_assert(eq(sz, fx.h.nwatchers, 0), "not dropped");
	for (fx_next(fd, kind, sizeof(kind), &count); *kind;
	     fx_next(fd, kind, sizeof(kind), &count)) {
		snprintf(last, sizeof(last), "%s", kind);
		got++;
	}
	cr_assert(eq(str, last, "dropped"));
	cr_assert(eq(i32, got, HANDLERS_WATCH_MAX_PACKETS + 1));
	close(fd);
}

/* Held again before it caught up: one count for both holds. */
Test(watch, a_second_hold_before_the_count_left_adds_to_it)
{
	int fd = fx_watcher(), got = 0;
	uint64_t count = 0;
	char kind[32];

	fx_cork_rc = -EFBIG;
	hfx_spin(&fx);
	fx_emit(HANDLERS_WATCH_MAX_PACKETS + 3);
	/* The hold ends, but the queue has no room yet: counted still. */
	fx_cork_rc = 0;
	hfx_spin(&fx);
	cr_assert(not(fx.srv->host.held));
	cr_assert(gt(u32, fx.h.watchers[0]->out_count, HANDLERS_WATCH_ROOM_PACKETS));
	fx_emit(2);
	fx_cork_rc = -EFBIG;
	hfx_spin(&fx);
	fx_emit(5);
	fx_cork_rc = 0;
	for (fx_next(fd, kind, sizeof(kind), &count); !strcmp(kind, "trim");
	     fx_next(fd, kind, sizeof(kind), &count))
		got++;
	cr_assert(eq(str, kind, "missed"));
	cr_assert(eq(u64, (uint64_t)got + count, (uint64_t)HANDLERS_WATCH_MAX_PACKETS + 10));
	close(fd);
}
