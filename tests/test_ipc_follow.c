/*
 * test_ipc_follow.c - who may open gmbd memory, and importers that follow
 * their owner's pause, in real processes (tests/ipc_fx.h: a real gmbd on
 * the host backend, tests/prog_preload programs under the preload shim).
 * Proves: a grant lets another uid open, a revoke stops new opens and
 * keeps open ones, $GMB_IPC_GRANT grants every shared allocation; with
 * $GMB_IPC_FOLLOW=1 or `gmbctl pause --follow` a pause of an imported tag
 * completes (the memory back to the pool), the importer's import is listed
 * unmapped, and after the owner's resume the importer reads the preserved
 * bytes at the same address; an open while paused is refused and works
 * after; an importer that cannot follow (stopped) leaves the pause failing
 * with EBUSY naming it, the tag active and both sides working; a killed
 * follower is dropped.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/ipc_fx.h"

TestSuite(ipc_follow, .init = ipcfx_start, .fini = ipcfx_stop, .timeout = 60);

/* 800: cudaErrorNotPermitted (another uid, or the owner's tag paused). */
#define NOT_PERMITTED 800

Test(ipc_follow, a_grant_lets_another_uid_open_and_a_revoke_stops_new_opens)
{
	struct worker a, b, c;
	char p[32], q[32], h[160], text[1024];

	ipcfx_exporter(&a, 4 * MiB, 0x21, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_run(&a, 0, "ipcgrant %s 65534", p);
	ipcfx_prog(&b, 65534);
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "check %s %llu 33", q, 4 * MiB);
	ipcfx_run(&b, 0, "fill %s %llu 7", q, 1 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 7", p, 1 * MiB);
	/* Revoked: a new process of that uid may not open; the open import stays. */
	ipcfx_run(&a, 0, "ipcrevoke %s 65534", p);
	ipcfx_prog(&c, 65534);
	ipcfx_run(&c, 0, "gmb");
	cr_assert(eq(i32, worker_cmd(&c, text, sizeof(text), "ipcopen %s", h), NOT_PERMITTED), "%s",
		  text);
	snprintf(text, sizeof(text), "%s", ipcfx_run(&c, 0, "error"));
	cr_assert(not(eq(ptr, strstr(text, "which did not grant uid 65534"), NULL)), "%s", text);
	ipcfx_run(&b, 0, "check %s %llu 7", q, 1 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	/* The owner's own uid needs no grant; a pointer not its own is not gmbd's to grant. */
	cr_assert(eq(i32, ipcfx_run_rc(&a, "ipcgrant %s 0", p), -EINVAL));
	cr_assert(eq(i32, ipcfx_run_rc(&a, "ipcgrant %s 65534", "0x1000"), -ENXIO));
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, ipcfx_used(&a), 0));
	ipcfx_quit(&c);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc_follow, GMB_IPC_GRANT_grants_every_allocation_the_owner_shares)
{
	struct worker a, b;
	char p[32], p2[32], q[32], h[160];

	ipcfx_exporter_env(&a, 2 * MiB, 0x31, p, "GMB_IPC_GRANT=65533,65534");
	snprintf(p2, sizeof(p2), "%s", ipcfx_run(&a, 0, "malloc %llu", 2 * MiB));
	ipcfx_run(&a, 0, "fill %s %llu 50", p2, 2 * MiB);
	ipcfx_prog(&b, 65534);
	ipcfx_get_handle(&a, p, h);
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "check %s %llu 49", q, 2 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_get_handle(&a, p2, h);
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "check %s %llu 50", q, 2 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

/* The import rows of gmbctl status --json, from "imports". */
static const char *imports_of(char *out, size_t cap)
{
	char *at;

	ipcfx_ctl_status(true, out, cap);
	at = strstr(out, "\"imports\":");
	cr_assert(not(eq(ptr, at, NULL)), "%s", out);
	return at;
}

Test(ipc_follow, importers_follow_a_pause_and_read_the_bytes_at_the_same_address_after)
{
	static char out[1 << 16];
	struct worker a, b;
	char p[32], q[32], q2[32], h[160];

	ipcfx_exporter_mode(&a, 6 * MiB, 0x5a, p, "preserve", "GMB_IPC_FOLLOW=1");
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "fill %s %llu 51", q, 1 * MiB);
	/* The pause completes: the importer unmapped, the chunks are back. */
	ipcfx_run(&a, 0, "pause w");
	cr_assert(eq(i64, ipcfx_used(&a), 0), "paused: nothing lent, nothing pinned");
	cr_assert(not(eq(ptr,
			 strstr(imports_of(out, sizeof(out)), "\"opens\":1,"
							      "\"owner_freed\":false,"
							      "\"mapped\":false,"),
			 NULL)),
		  "%s", out);
	ipcfx_ctl_status(false, out, sizeof(out));
	cr_assert(not(eq(ptr, strstr(out, "live     paused\n"), NULL)), "%s", out);
	/* An open meanwhile is refused, as of a paused owner. */
	cr_assert(eq(i32, ipcfx_run_rc(&b, "ipcopen %s", h), NOT_PERMITTED));
	/* Resumed: mapped again at the same address, the owner's bytes back. */
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&b, 0, "check %s %llu 51", q, 1 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 51", p, 1 * MiB);
	cr_assert(not(eq(ptr, strstr(imports_of(out, sizeof(out)), "\"mapped\":true,"), NULL)),
		  "%s", out);
	ipcfx_open_handle(&b, h, q2);
	cr_assert(eq(str, q, q2), "the same import, the same address");
	ipcfx_run(&b, 0, "fill %s %llu 52", q, 6 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 52", p, 6 * MiB);
	/* A second cycle, then the importer closes while it follows. */
	ipcfx_run(&a, 0, "pause w");
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&a, 0, "check %s %llu 52", p, 6 * MiB);
	cr_assert(not(eq(ptr, strstr(imports_of(out, sizeof(out)), "\"imports\":[]"), NULL)), "%s",
		  out);
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, ipcfx_used(&a), 0));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc_follow, gmbctl_pause_follow_takes_the_importers_along)
{
	static char out[1 << 16];
	struct worker a, b;
	char p[32], q[32], h[160], target[32];

	ipcfx_exporter_mode(&a, 4 * MiB, 0x44, p, "preserve", "GMB_CONTROL=accept");
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	snprintf(target, sizeof(target), "%d", (int)a.pid);
	{
		const char *const plain[] = { "pause", target, "w", NULL };
		const char *const follow[] = { "pause", target, "w", "--follow", NULL };
		const char *const resume[] = { "resume", target, "w", NULL };

		/* Without --follow the importer keeps the tag active. */
		cr_assert(eq(i32, ipcfx_ctl(out, sizeof(out), plain), 1), "%s", out);
		cr_assert(not(eq(ptr, strstr(out + sizeof(out) / 2, "has allocation"), NULL)), "%s",
			  out + sizeof(out) / 2);
		cr_assert(eq(i32, ipcfx_ctl(out, sizeof(out), follow), 0), "%s", out);
		cr_assert(eq(i64, ipcfx_used(&a), 0));
		cr_assert(eq(i32, ipcfx_ctl(out, sizeof(out), resume), 0), "%s", out);
	}
	ipcfx_run(&b, 0, "check %s %llu 68", q, 4 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

static int log_has(void *needle)
{
	static char log[1 << 17];

	ipcfx_log(log, sizeof(log));
	return strstr(log, needle) != NULL;
}

/* gmbd lists the (one) import mapped. */
static int mapped_again(void *arg)
{
	static char out[1 << 16];

	(void)arg;
	ipcfx_ctl_status(true, out, sizeof(out));
	return strstr(out, "\"mapped\":true,") != NULL;
}

Test(ipc_follow, an_importer_that_cannot_follow_leaves_the_tag_active)
{
	static const char *const args[] = {
		"--host-devices",    "1", "--host-memory", "64MiB", "--max-chunk", "2MiB",
		"--control-timeout", "1", "--log-level",   "info",  NULL
	};
	static char log[1 << 17];
	struct worker a, b;
	char p[32], q[32], h[160];
	struct timespec t0;

	cr_assert(eq(i32, gmbd_stop(&ipcfx_gmbd), 0));
	cr_assert(eq(i32, gmbd_start_shared(&ipcfx_gmbd, args), 0));
	ipcfx_exporter_mode(&a, 4 * MiB, 0x3c, p, "preserve", "GMB_IPC_FOLLOW=1");
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	cr_assert(eq(i32, kill(b.pid, SIGSTOP), 0));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert(eq(i32, ipcfx_run_rc(&a, "pause %s", "w"), -EBUSY));
	cr_assert(ge(dbl, ipcfx_ms_since(&t0), 950.0), "it asked, within --control-timeout");
	ipcfx_log(log, sizeof(log));
	cr_assert(not(eq(ptr, strstr(log, "did not follow: client 'prog_preload-"), NULL)),
		  "the importer is named");
	cr_assert(not(eq(ptr, strstr(log, "did not unmap"), NULL)), "and why");
	/* Active and mapped; the importer, woken, unmaps late: gmbd has it map again. */
	ipcfx_run(&a, 0, "check %s %llu 60", p, 4 * MiB);
	ipcfx_run(&a, 0, "fill %s %llu 61", p, 1 * MiB);
	cr_assert(eq(i32, kill(b.pid, SIGCONT), 0));
	cr_assert(eq(i32, wait_until(log_has, "import unmapped late, asked to map again", 5000), 0),
		  "the late unmap was seen");
	cr_assert(eq(i32, wait_until(mapped_again, NULL, 5000), 0),
		  "the late unmap was followed by a map");
	ipcfx_run(&b, 0, "check %s %llu 61", q, 1 * MiB);
	cr_assert(eq(i64, ipcfx_used(&a), (int64_t)(4 * MiB)));
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "pause w");
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&a, 0, "check %s %llu 61", p, 1 * MiB);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

/* An owner (a) of 4 MiB of byte 0x3c, with @env, and two importers: b, and c stopped. */
struct followers {
	struct worker a, b, c;
	char p[32], q[32], r[32], h[160];
};

static void followers_up(struct followers *f, const char *env)
{
	static const char *const args[] = {
		"--host-devices",    "1", "--host-memory", "64MiB", "--max-chunk", "2MiB",
		"--control-timeout", "1", "--log-level",   "info",  NULL
	};

	cr_assert(eq(i32, gmbd_stop(&ipcfx_gmbd), 0));
	cr_assert(eq(i32, gmbd_start_shared(&ipcfx_gmbd, args), 0));
	ipcfx_exporter_mode(&f->a, 4 * MiB, 0x3c, f->p, "preserve", env);
	ipcfx_get_handle(&f->a, f->p, f->h);
	ipcfx_prog(&f->b, 0);
	ipcfx_open_handle(&f->b, f->h, f->q);
	ipcfx_prog(&f->c, 0);
	ipcfx_open_handle(&f->c, f->h, f->r);
	cr_assert(eq(i32, kill(f->c.pid, SIGSTOP), 0));
}

static void followers_down(struct followers *f)
{
	ipcfx_quit(&f->c);
	ipcfx_quit(&f->b);
	ipcfx_quit(&f->a);
}

/*
 * Two importers, one stopped: the pause is refused, and by the time the
 * owner hears so the one that followed is mapped again (it reads its
 * pointer at once), as the owner is.
 */
Test(ipc_follow, a_refused_pause_answers_once_the_importers_that_followed_map_again)
{
	struct followers f;

	followers_up(&f, "GMB_IPC_FOLLOW=1");
	cr_assert(eq(i32, ipcfx_run_rc(&f.a, "pause %s", "w"), -EBUSY));
	/* No wait: the refusal came after b's map. An unmapped import faults. */
	ipcfx_run(&f.b, 0, "check %s %llu 60", f.q, 4 * MiB);
	ipcfx_run(&f.a, 0, "check %s %llu 60", f.p, 4 * MiB);
	/* Woken, the stopped one unmaps late and is asked to map again (the
	 * test above); it closes here. */
	cr_assert(eq(i32, kill(f.c.pid, SIGCONT), 0));
	cr_assert(eq(i32, wait_until(log_has, "import unmapped late, asked to map again", 5000), 0),
		  "the stopped importer's late unmap was seen");
	ipcfx_run(&f.b, 0, "ipcclose %s", f.q);
	ipcfx_run(&f.c, 0, "ipcclose %s", f.r);
	ipcfx_run(&f.a, 0, "pause w");
	ipcfx_run(&f.a, 0, "resume w");
	ipcfx_run(&f.a, 0, "check %s %llu 60", f.p, 4 * MiB);
	followers_down(&f);
}

/* The same when the pause then waited for the stopped one, in vain. */
Test(ipc_follow, a_pause_whose_wait_expires_answers_once_the_importers_that_followed_map_again)
{
	struct followers f;
	struct timespec t0;

	/* The wait is the client's, less the second the round took: 500 ms. */
	followers_up(&f, "GMB_IPC_FOLLOW=1 GMB_WAIT_MS=1500");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert(eq(i32, ipcfx_run_rc(&f.a, "pause %s", "w"), -EBUSY));
	cr_assert(ge(dbl, ipcfx_ms_since(&t0), 1450.0), "it waited GMB_WAIT_MS");
	cr_assert(eq(i32, wait_until(log_has, "wait for importers expired", 1000), 0),
		  "the refusal came from the expired wait");
	ipcfx_run(&f.b, 0, "check %s %llu 60", f.q, 4 * MiB);
	ipcfx_run(&f.a, 0, "check %s %llu 60", f.p, 4 * MiB);
	cr_assert(eq(i32, kill(f.c.pid, SIGCONT), 0));
	followers_down(&f);
}

Test(ipc_follow, a_killed_follower_is_dropped_and_the_resume_goes_on)
{
	static char out[1 << 16];
	struct worker a, b, c;
	char p[32], q[32], r[32], h[160], want[64];

	ipcfx_exporter_mode(&a, 4 * MiB, 0x12, p, "preserve", "GMB_IPC_FOLLOW=1");
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_prog(&c, 0);
	ipcfx_open_handle(&b, h, q);
	ipcfx_open_handle(&c, h, r);
	ipcfx_run(&a, 0, "pause w");
	worker_kill(&b);
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&c, 0, "check %s %llu 18", r, 4 * MiB);
	snprintf(want, sizeof(want), "\"importer_pid\":%d,", (int)b.pid);
	cr_assert(eq(ptr, strstr(imports_of(out, sizeof(out)), want), NULL), "%s", out);
	snprintf(want, sizeof(want), "\"importer_pid\":%d,", (int)c.pid);
	cr_assert(not(eq(ptr, strstr(out, want), NULL)), "%s", out);
	ipcfx_run(&c, 0, "ipcclose %s", r);
	cr_assert(not(eq(ptr, strstr(imports_of(out, sizeof(out)), "\"imports\":[]"), NULL)), "%s",
		  out);
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, ipcfx_used(&a), 0));
	ipcfx_quit(&c);
	ipcfx_quit(&a);
}

/* The one import's row in gmbctl status --json has @needle. */
static int import_row_has(void *needle)
{
	static char out[1 << 16];

	ipcfx_ctl_status(true, out, sizeof(out));
	return strstr(out, needle) != NULL;
}

Test(ipc_follow, GMB_IPC_KEEP_keeps_a_closed_import_mapped_for_the_next_open)
{
	static char out[1 << 16];
	struct worker a, b;
	char p[32], q[32], q2[32], h[160];

	ipcfx_exporter_mode(&a, 4 * MiB, 0x4b, p, "preserve", NULL);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog_env(&b, 0, "GMB_IPC_KEEP=1");
	ipcfx_run(&b, 0, "gmb");
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	/* Closed, kept: listed idle, still pinned. */
	cr_assert(import_row_has("\"mapped\":true,\"idle\":true}"), "the import is not idle");
	cr_assert(eq(i64, ipcfx_used(&a), (int64_t)(4 * MiB)));
	ipcfx_ctl_status(false, out, sizeof(out));
	cr_assert(not(eq(ptr, strstr(out, "live     idle\n"), NULL)), "%s", out);
	/* Opened again: the same mapping, the bytes, nothing of the runtime's. */
	ipcfx_open_handle(&b, h, q2);
	cr_assert(eq(str, q, q2));
	cr_assert(import_row_has("\"idle\":false}"));
	ipcfx_run(&b, 0, "check %s %llu 75", q2, 4 * MiB);
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcstats"), "gets=0 opens=0 closes=0"));
	/* A close of a closed import is not gmbd's: it goes to the runtime. */
	ipcfx_run(&b, 0, "ipcclose %s", q2);
	ipcfx_run(&b, 0, "ipcclose %s", q2);
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcstats"), "gets=0 opens=0 closes=1"));
	/* The owner's pause asks for the idle import back: no wait, no follow needed. */
	ipcfx_run(&a, 0, "pause w");
	cr_assert(import_row_has("\"imports\":[],"), "the idle import was not given back");
	ipcfx_run(&a, 0, "resume w");
	/* After it went, an open maps anew. */
	ipcfx_open_handle(&b, h, q2);
	ipcfx_run(&b, 0, "check %s %llu 75", q2, 4 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q2);
	/* The owner frees: the idle import is asked back, the memory returns. */
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i32, wait_until(import_row_has, "\"imports\":[],", 2000), 0),
		  "the freed allocation's idle import stayed");
	cr_assert(eq(i64, ipcfx_used(&a), 0));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc_follow, a_waiting_pause_goes_on_once_the_import_closes_idle)
{
	struct worker a, b;
	char p[32], q[32], h[160];

	ipcfx_exporter_env(&a, 4 * MiB, 0x3c, p, "GMB_WAIT_MS=20000");
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog_env(&b, 0, "GMB_IPC_KEEP=1");
	ipcfx_open_handle(&b, h, q);
	fprintf(a.in, "pause w\n");
	cr_assert(not(ipcfx_answered(&a, 300)), "the pause waits while the import is open");
	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(ipcfx_answered(&a, 5000), "the idle import was asked back and the pause went on");
	cr_assert(eq(i32, ipcfx_answer(&a), 0));
	cr_assert(import_row_has("\"imports\":[],"));
	ipcfx_run(&a, 0, "resume w");
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}
