/*
 * test_switch.c - arbitration against a real gmbd (host backend) and real
 * worker processes: switches with handover (no chunk created or released),
 * a switch failing at each step and rolled back, groups, waiting requests
 * served in order, deadlines, preemption, a waiter killed, and two users.
 *
 * gmbd runs with --pool-keep 0 (what a pause gives back goes to the
 * backend unless a switch hands it over) and 4 MiB chunks in a 64 MiB
 * budget, so that the counters of status tell creates, releases and
 * handovers apart.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/util.h"

#define MiB    (1024ULL * 1024)
#define CAP    65536
#define NOBODY "65534"

static struct gmbd_proc gmbd;
static char out[CAP], err[CAP];

static void start(void)
{
	static const char *const args[] = { "--host-memory",	 "64MiB", "--max-chunk", "4MiB",
					    "--pool-keep",	 "0",	  "--log-level", "info",
					    "--control-timeout", "10",	  NULL };

	cr_assert(eq(i32, gmbd_start_shared(&gmbd, args), 0), "gmbd did not start");
}

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(switch, .init = start, .fini = stop, .timeout = 60);

/* gmbctl -s SOCK ARGS... (NULL-terminated) into out/err; its exit status. */
static int ctl_v(int dummy, ...)
{
	va_list ap;
	int rc;

	va_start(ap, dummy);
	rc = gmbctl_vrun(NULL, gmbd.sock, out, err, CAP, ap);
	va_end(ap);
	return rc;
}

#define ctl(...) ctl_v(0, __VA_ARGS__, (char *)NULL)

/* The status document in out. */
static void status(void)
{
	cr_assert(eq(i32, ctl("status", "--json"), 0), "%s", err);
}

static int64_t dev0(const char *key)
{
	status();
	return json_i64(out, key);
}

/* The state ("active"/"paused") of @client's tag @tag in out; "" if none. */
static const char *tag_state(const char *client, const char *tag)
{
	static char state[16];
	char pat[256];
	const char *p, *next;

	state[0] = '\0';
	snprintf(pat, sizeof(pat), "\"name\":\"%s\",\"pid\"", client);
	p = strstr(out, pat);
	if (!p)
		return state;
	next = strstr(p + 1, ",\"pid\"");
	next = next ? strstr(next + 6, ",\"pid\"") : NULL;
	snprintf(pat, sizeof(pat), "{\"name\":\"%s\",\"device\":", tag);
	p = strstr(p, pat);
	if (!p || (next && p > next))
		return state;
	p = strstr(p, "\"state\":\"");
	if (p)
		sscanf(p + 9, "%15[a-z]", state);
	return state;
}

/* A worker connected as @name after `env` lines (NAME=VALUE, NULL-terminated). */
static void up(struct worker *w, const char *name, const char *handler, ...)
{
	char text[512];
	const char *e;
	va_list ap;

	cr_assert(eq(i32, worker_start(w, gmbd.sock), 0));
	va_start(ap, handler);
	while ((e = va_arg(ap, const char *))) {
		char k[64], v[128];

		cr_assert(eq(i32, sscanf(e, "%63[^=]=%127s", k, v), 2));
		cr_assert(eq(i32, worker_cmd(w, NULL, 0, "env %s %s", k, v), 0));
	}
	va_end(ap);
	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "connect %s", name), 0), "%s", text);
	if (handler)
		cr_assert(eq(i32, worker_cmd(w, NULL, 0, "handler %s", handler), 0));
}

static void w_ok(struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void w_ok(struct worker *w, const char *fmt, ...)
{
	char line[512], text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "%s", line), 0), "%s: %s", line, text);
}

/* A command whose answer comes later (it waits at gmbd). */
static void w_send(struct worker *w, const char *line)
{
	fprintf(w->in, "%s\n", line);
	cr_assert(eq(i32, fflush(w->in), 0));
}

static int w_read(struct worker *w, char *text, size_t cap)
{
	char line[4096], *sp;
	int rc;

	if (!fgets(line, sizeof(line), w->out))
		return -EPIPE;
	rc = (int)strtol(line, &sp, 10);
	snprintf(text, cap, "%s", sp);
	return rc;
}

static int64_t nwaiters(void)
{
	const char *p;
	int64_t n = 0;

	status();
	p = strstr(out, "\"waiters\":[");
	cr_assert(not(eq(ptr, (void *)p, NULL)), "%s", out);
	for (p = strchr(p, '['); p && (p = strstr(p, "\"client_id\"")); p++)
		n++;
	return n;
}

static int waiters_are(void *arg)
{
	return nwaiters() == *(const int64_t *)arg;
}

/* Until status lists @n waiting requests (gmbd answers each in turn). */
static void await_waiters(int64_t n)
{
	cr_assert(eq(i32, wait_until(waiters_are, &n, 5000), 0), "%s", out);
}

/* ---- handover ---- */

Test(switch, same_user_hands_chunks_over_without_create_or_release)
{
	struct worker a, b;
	int64_t created, released;

	up(&a, "trainer", "accept", NULL);
	up(&b, "rollout", "accept", NULL);
	w_ok(&a, "mode w preserve");
	w_ok(&a, "malloc w %llu", 16 * MiB);
	w_ok(&a, "fill w 171");
	w_ok(&b, "malloc kv %llu", 16 * MiB);
	w_ok(&b, "pause kv");
	created = dev0("chunks_created");
	released = json_i64(out, "chunks_released");
	cr_assert(eq(i64, created, 8), "%s", out);

	cr_assert(eq(i32, ctl("switch", "trainer", "rollout"), 0), "%s", err);
	cr_assert(not(eq(ptr, strstr(out, "handed over 16.0 MiB, created 0 B"), NULL)), "%s", out);
	cr_assert(not(eq(ptr, strstr(out, "pause"), NULL)));
	cr_assert(not(eq(ptr, strstr(out, " ms"), NULL)), "each step has its time: %s", out);
	cr_assert(eq(i64, dev0("chunks_created"), created), "no chunk created: %s", out);
	cr_assert(eq(i64, json_i64(out, "chunks_released"), released), "none released");
	cr_assert(eq(i64, json_i64(out, "chunks_handed_over"), 4));
	cr_assert(eq(str, (char *)tag_state("trainer", "w"), "paused"));
	cr_assert(eq(str, (char *)tag_state("rollout", "kv"), "active"));

	/* And back, with the trainer's bytes. */
	cr_assert(eq(i32, ctl("switch", "rollout", "trainer", "--tags", "w,kv"), 0), "%s", err);
	cr_assert(eq(i64, dev0("chunks_created"), created), "%s", out);
	cr_assert(eq(i64, json_i64(out, "chunks_released"), released));
	w_ok(&a, "check w 171");

	/* What the switch avoided: a plain pause releases, a plain resume creates. */
	cr_assert(eq(i32, ctl("pause", "trainer"), 0), "%s", err);
	cr_assert(eq(i32, ctl("resume", "rollout"), 0), "%s", err);
	cr_assert(gt(i64, dev0("chunks_released"), released), "%s", out);
	cr_assert(gt(i64, json_i64(out, "chunks_created"), created));
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
}

/* ---- failures, each rolled back ---- */

static void pair(struct worker *a, struct worker *b, const char *ha, const char *hb)
{
	up(a, "from", ha, NULL);
	up(b, "to", hb, NULL);
	w_ok(a, "malloc x %llu", 16 * MiB);
	w_ok(b, "malloc y %llu", 16 * MiB);
	w_ok(b, "pause y");
}

static void as_before(void)
{
	status();
	cr_assert(eq(str, (char *)tag_state("from", "x"), "active"), "%s", out);
	cr_assert(eq(str, (char *)tag_state("to", "y"), "paused"), "%s", out);
}

Test(switch, a_refused_pause_resumes_from_again)
{
	struct worker a, b;

	pair(&a, &b, "refuse-pause", "accept");
	cr_assert(eq(i32, ctl("switch", "from", "to"), 1));
	cr_assert(not(eq(ptr, strstr(err, "pause of every tag of 'from' failed"), NULL)), "%s",
		  err);
	cr_assert(not(eq(ptr, strstr(err, "both sides are as before"), NULL)), "%s", err);
	as_before();
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
}

Test(switch, a_refused_resume_pauses_to_and_resumes_from)
{
	struct worker a, b;

	pair(&a, &b, "accept", "refuse-resume");
	cr_assert(eq(i32, ctl("switch", "from", "to"), 1));
	cr_assert(not(eq(ptr, strstr(err, "resume of every tag of 'to' failed"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "TO ('to') paused again"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "FROM ('from') resumed again"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(out, "undo resume from"), NULL)), "the rollback's steps: %s",
		  out);
	as_before();
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
}

Test(switch, a_resume_out_of_memory_names_holders_and_rolls_back)
{
	struct worker a, b, c;

	up(&a, "from", "accept", NULL);
	up(&b, "to", "accept", NULL);
	up(&c, "hog", NULL, NULL);
	w_ok(&b, "malloc y %llu", 32 * MiB);
	w_ok(&b, "pause y");
	w_ok(&a, "malloc x %llu", 16 * MiB);
	w_ok(&c, "malloc h %llu", 40 * MiB);
	cr_assert(eq(i32, ctl("switch", "from", "to"), 1));
	cr_assert(not(eq(ptr, strstr(err, "budget"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "hog (pid"), NULL)), "holders named: %s", err);
	cr_assert(not(eq(ptr, strstr(err, "FROM ('from') resumed again"), NULL)), "%s", err);
	as_before();
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
	cr_assert(eq(i32, worker_quit(&c), 0));
}

Test(switch, bad_requests_change_nothing)
{
	struct worker a, b, t;

	pair(&a, &b, "accept", "accept");
	up(&t, "nohandler", NULL, NULL);
	w_ok(&t, "malloc z %llu", 4 * MiB);
	w_ok(&t, "pause z");
	cr_assert(eq(i32, ctl("switch", "from", "to", "--tags", "nope"), 1));
	cr_assert(not(eq(ptr, strstr(err, "none of the tags"), NULL)), "%s", err);
	cr_assert(eq(i32, ctl("switch", "from", "ghost"), 1));
	cr_assert(not(eq(ptr, strstr(err, "no client or group"), NULL)), "%s", err);
	cr_assert(eq(i32, ctl("switch", "from", "from"), 1), "one client on both sides");
	cr_assert(eq(i32, ctl("switch", "from", "to", "--tags", "a,,b"), 2), "usage");
	cr_assert(eq(i32, ctl("switch", "from", "nohandler"), 1), "%s", out);
	cr_assert(not(eq(ptr, strstr(err, "does not accept remote control"), NULL)), "%s", err);
	as_before();
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
	cr_assert(eq(i32, worker_quit(&t), 0));
}

/* ---- groups ---- */

Test(switch, groups_of_three_switch_together)
{
	struct worker tr[3], ro[3];
	char name[32];

	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "train-%d", i);
		up(&tr[i], name, "accept", "GMB_GROUP=trainer", NULL);
		w_ok(&tr[i], "malloc m %llu", 8 * MiB);
		snprintf(name, sizeof(name), "roll-%d", i);
		up(&ro[i], name, "accept", "GMB_GROUP=rollout", "GMB_PRIORITY=3", NULL);
		w_ok(&ro[i], "malloc kv %llu", 8 * MiB);
		w_ok(&ro[i], "pause kv");
	}
	status();
	cr_assert(not(eq(ptr, strstr(out, "\"group\":\"rollout\",\"priority\":3"), NULL)), "%s",
		  out);
	cr_assert(eq(i32, ctl("switch", "trainer", "@rollout"), 0), "%s", err);
	cr_assert(not(eq(ptr, strstr(out, "handed over 24.0 MiB"), NULL)), "%s", out);
	status();
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "train-%d", i);
		cr_assert(eq(str, (char *)tag_state(name, "m"), "paused"), "%s", out);
		snprintf(name, sizeof(name), "roll-%d", i);
		cr_assert(eq(str, (char *)tag_state(name, "kv"), "active"), "%s", out);
	}
	cr_assert(eq(i32, ctl("status"), 0));
	cr_assert(not(eq(ptr, strstr(out, "rollout"), NULL)), "the table shows groups: %s", out);
	for (int i = 0; i < 3; i++) {
		cr_assert(eq(i32, worker_quit(&tr[i]), 0));
		cr_assert(eq(i32, worker_quit(&ro[i]), 0));
	}
}

/* ---- waiting ---- */

/* A holder of the whole 64 MiB budget in tags h1..h4 of 16 MiB. */
static void holder(struct worker *h)
{
	up(h, "holder", NULL, NULL);
	for (int i = 1; i <= 4; i++)
		w_ok(h, "malloc h%d %llu", i, 16 * MiB);
}

/* @a (named @na) asks for 32 MiB, then @b (@nb) for 16 MiB; both in line, in that order. */
static void queue_two(struct worker *a, const char *na, struct worker *b, const char *nb)
{
	char line[128];

	up(a, na, NULL, NULL);
	up(b, nb, NULL, NULL);
	w_ok(a, "wait 20000");
	w_ok(b, "wait 20000");
	snprintf(line, sizeof(line), "malloc a %llu", 32 * MiB);
	w_send(a, line);
	await_waiters(1);
	snprintf(line, sizeof(line), "malloc b %llu", 16 * MiB);
	w_send(b, line);
	await_waiters(2);
}

Test(switch, waits_are_served_in_order)
{
	struct worker h, w1, w2;
	char text[1024];

	holder(&h);
	queue_two(&w1, "first", &w2, "second");
	cr_assert(lt(ptr, strstr(out, "\"client\":\"first\""),
		     strstr(out, "\"client\":\"second\"")),
		  "first come first: %s", out);
	cr_assert(eq(i32, ctl("status"), 0));
	cr_assert(not(eq(ptr, strstr(out, "WAITING"), NULL)), "%s", out);

	/* 16 MiB back: enough for the second, but the first is in line before it. */
	w_ok(&h, "free h1");
	cr_assert(eq(i64, nwaiters(), 2), "%s", out);
	w_ok(&h, "free h2");
	cr_assert(eq(i32, w_read(&w1, text, sizeof(text)), 0), "%s", text);
	cr_assert(eq(i64, nwaiters(), 1), "%s", out);
	w_ok(&h, "free h3");
	cr_assert(eq(i32, w_read(&w2, text, sizeof(text)), 0), "%s", text);
	cr_assert(eq(i64, nwaiters(), 0), "%s", out);
	cr_assert(eq(i32, worker_quit(&h), 0));
	cr_assert(eq(i32, worker_quit(&w1), 0));
	cr_assert(eq(i32, worker_quit(&w2), 0));
}

Test(switch, a_wait_fails_at_its_deadline_naming_the_holders)
{
	struct worker h, w;
	char text[1024];

	holder(&h);
	up(&w, "late", "accept", NULL);
	w_ok(&w, "wait 300");
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "malloc a %llu", 16 * MiB), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(text, "holder (pid"), NULL)), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "waited"), NULL)), "%s", text);
	cr_assert(eq(i64, nwaiters(), 0), "%s", out);
	/* A resume waits the same way, through gmbctl resume --wait. */
	w_ok(&h, "free h4");
	w_ok(&w, "malloc r %llu", 16 * MiB);
	w_ok(&w, "pause r");
	w_ok(&h, "malloc h4 %llu", 16 * MiB);
	cr_assert(eq(i32, ctl("resume", "late", "--wait", "0.3"), 1), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "waited"), NULL)), "%s", err);
	cr_assert(eq(i32, worker_quit(&h), 0));
	cr_assert(eq(i32, worker_quit(&w), 0));
}

Test(switch, a_killed_waiter_leaves_the_queue)
{
	struct worker h, w, w2;
	char text[1024];

	holder(&h);
	queue_two(&w, "doomed", &w2, "patient");
	worker_kill(&w);
	await_waiters(1);
	cr_assert(not(eq(ptr, strstr(out, "\"client\":\"patient\""), NULL)));
	/* Nobody dead blocks the line: 16 MiB back serve the one behind. */
	w_ok(&h, "free h1");
	cr_assert(eq(i32, w_read(&w2, text, sizeof(text)), 0), "%s", text);
	cr_assert(eq(i32, worker_quit(&h), 0));
	cr_assert(eq(i32, worker_quit(&w2), 0));
}

/* ---- priorities and preemption ---- */

static bool log_has(const char *needle)
{
	static char buf[1 << 20];
	FILE *f = fopen(gmbd.log, "r");
	size_t n;

	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return strstr(buf, needle) != NULL;
}

Test(switch, a_low_priority_preemptible_client_is_paused_for_a_high_one)
{
	struct worker lo, keep, hi;
	char text[1024];

	up(&lo, "batch", "accept", "GMB_PRIORITY=0", "GMB_PREEMPTIBLE=1", NULL);
	up(&keep, "steady", "accept", "GMB_PRIORITY=0", NULL);
	up(&hi, "serving", NULL, "GMB_PRIORITY=10", NULL);
	w_ok(&lo, "malloc b %llu", 48 * MiB);
	w_ok(&keep, "malloc s %llu", 16 * MiB);
	w_ok(&hi, "wait 10000");
	cr_assert(eq(i32, worker_cmd(&hi, text, sizeof(text), "malloc q %llu", 32 * MiB), 0), "%s",
		  text);
	status();
	cr_assert(eq(str, (char *)tag_state("batch", "b"), "paused"), "%s", out);
	cr_assert(eq(str, (char *)tag_state("steady", "s"), "active"), "not preemptible");
	cr_assert(log_has("client preempted client=batch"), "logged");
	cr_assert(log_has("for=serving"), "logged for whom");

	/* gmbctl priority changes the order of what waits. */
	cr_assert(eq(i32, ctl("priority", "steady", "5"), 0), "%s", err);
	status();
	cr_assert(not(eq(ptr, strstr(out, "\"name\":\"steady\""), NULL)));
	cr_assert(eq(i64, json_i64_after(out, "\"name\":\"steady\"", "priority"), 5), "%s", out);
	cr_assert(eq(i32, ctl("priority", "ghost", "5"), 1));
	cr_assert(eq(i32, worker_quit(&lo), 0));
	cr_assert(eq(i32, worker_quit(&keep), 0));
	cr_assert(eq(i32, worker_quit(&hi), 0));
}

/* ---- two users ---- */

Test(switch, two_users_go_through_the_backend)
{
	struct worker a, b;
	char text[512];
	int64_t created;

	up(&a, "rootjob", "accept", NULL);
	w_ok(&a, "malloc x %llu", 32 * MiB);
	cr_assert(eq(i32, worker_start(&b, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&b, NULL, 0, "uid " NOBODY), 0));
	cr_assert(eq(i32, worker_cmd(&b, text, sizeof(text), "connect nobodyjob"), 0), "%s", text);
	w_ok(&b, "handler accept");
	w_ok(&b, "malloc y %llu", 32 * MiB);
	w_ok(&b, "fill y 7");
	w_ok(&b, "pause y");
	created = dev0("chunks_created");
	cr_assert(eq(i32, ctl("switch", "rootjob", "nobodyjob"), 0), "%s", err);
	cr_assert(not(eq(ptr, strstr(out, "handed over 0 B, created 32.0 MiB"), NULL)), "%s", out);
	cr_assert(eq(i64, dev0("chunks_created"), created + 8), "%s", out);
	cr_assert(eq(i64, json_i64(out, "chunks_handed_over"), 0));
	cr_assert(eq(str, (char *)tag_state("rootjob", "x"), "paused"));
	cr_assert(eq(str, (char *)tag_state("nobodyjob", "y"), "active"));
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
}
