/*
 * test_fdlimit.c - one user must not exhaust gmbd's chunks and open files.
 * On the host backend every chunk is an open memfd in gmbd: a real gmbd
 * with 4 KiB chunks, real client processes (tests/prog_worker) of two uids.
 * Past a uid's chunk bound a request gets ENOSPC, past gmbd's fd headroom
 * EMFILE, each with a sentence, while the session, the other clients and
 * status go on; a lend whose fds cannot be sent is taken back and refused
 * the same way, every tag a taken-back resume named paused again. Warm free
 * chunks hold fds of gmbd too: a request short of fds sends back as many as
 * it needs, from any device, before it is refused. gmbd's fd count is back
 * where it was at the end.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "tests/util.h"

#define NOBODY "65534"
#define CHUNK  4096

static struct gmbd_proc gmbd;

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly (leak or crash)");
}

TestSuite(fdlimit, .fini = stop, .timeout = 120);

/*
 * gmbd with 4 KiB chunks and the options of @extra (NULL-terminated, may be
 * NULL); @nofile (0: inherited) is its RLIMIT_NOFILE, soft and hard, as a
 * unit's LimitNOFILE= sets it. The test process keeps that limit too (it
 * may not raise a hard limit back), and so do its workers: each test runs
 * in a process of its own.
 */
static void start(rlim_t nofile, const char *const *extra)
{
	const char *args[24] = { "--host-memory", "64MiB",	 "--host-granularity",
				 "4KiB",	  "--max-chunk", "4KiB",
				 "--fdstore-max", "0",		 "--log-level",
				 "info",	  NULL };
	struct rlimit low = { .rlim_cur = nofile, .rlim_max = nofile };
	int n = 10;

	for (; extra && *extra; extra++) {
		cr_assert(lt(i32, n, 23));
		args[n++] = *extra;
	}

	if (nofile)
		cr_assert(eq(i32, setrlimit(RLIMIT_NOFILE, &low), 0));
	cr_assert(eq(i32, gmbd_start_shared(&gmbd, args), 0), "gmbd did not start");
}

/* A worker of @uid (NULL: the test's), connected as @name. */
static void up(struct worker *w, const char *uid, const char *name)
{
	char text[512];

	cr_assert(eq(i32, worker_start(w, gmbd.sock), 0));
	if (uid)
		cr_assert(eq(i32, worker_cmd(w, NULL, 0, "uid %s", uid), 0));
	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "connect %s", name), 0), "%s", text);
}

/* 4 KiB allocations in @tag until one is refused (at most @max): how many
 * were served; the refusal's rc and sentence in *@rc and @text. */
static int fill_until_refused(struct worker *w, const char *tag, int max, int *rc, char *text,
			      size_t cap)
{
	for (int n = 0; n < max; n++) {
		*rc = worker_cmd(w, text, cap, "malloc %s %d", tag, CHUNK);
		if (*rc != 0)
			return n;
	}
	*rc = 0;
	return max;
}

static void w_ok(struct worker *w, const char *cmd)
{
	char text[1024];

	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "%s", cmd), 0), "%s: %s", cmd, text);
}

static int fds_back_to(void *arg)
{
	return proc_count_fds(gmbd.pid) == *(int *)arg;
}

/*
 * gmbd's fds with @w connected, once it answered @w (READY=1 comes just
 * before gmbd closes its notify socket): what they must come back to.
 */
static int fds_with(struct worker *w)
{
	char text[1 << 16];

	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "status"), 0), "%s", text);
	return proc_count_fds(gmbd.pid);
}

static void expect_fds_back(int baseline)
{
	cr_expect(eq(i32, wait_until(fds_back_to, &baseline, 5000), 0),
		  "gmbd holds %d fds, %d before", proc_count_fds(gmbd.pid), baseline);
}

static char json[1 << 16];

/* A worker's status line (the JSON) holds @needle. */
static bool status_has(struct worker *w, const char *needle)
{
	cr_assert(eq(i32, worker_cmd(w, json, sizeof(json), "status"), 0), "%s", json);
	return strstr(json, needle) != NULL;
}

/* Bytes lent on device 0, as status says. */
static int64_t used_bytes(struct worker *w)
{
	cr_assert(eq(i32, worker_cmd(w, json, sizeof(json), "status"), 0), "%s", json);
	return json_i64(json, "used_bytes");
}

/* @a frees tag t and quits; gmbd is back to @baseline fds. */
static void last_free(struct worker *a, int baseline)
{
	w_ok(a, "free t");
	expect_fds_back(baseline);
	cr_assert(eq(i32, worker_quit(a), 0));
}

/*
 * @b's allocation is refused with @err while @a holds tag t, and served
 * once @a frees it; then @a allocates again (one chunk).
 */
static void refused_until_freed(struct worker *a, struct worker *b, int err)
{
	char text[1024];

	cr_assert(eq(i32, worker_cmd(b, text, sizeof(text), "malloc u %d", CHUNK), err), "%s",
		  text);
	w_ok(a, "free t");
	w_ok(b, "malloc u 4096");
	w_ok(a, "malloc t 4096");
}

Test(fdlimit, a_uid_past_its_chunk_bound_gets_enospc_and_others_are_served)
{
	struct worker a, a2, b;
	char text[1024], want[128];
	int rc, baseline;

	start(0, (const char *[]){ "--max-chunks-per-uid", "100", NULL });
	up(&a, NULL, "hog");
	baseline = fds_with(&a);
	cr_assert(eq(i32, fill_until_refused(&a, "t", 200, &rc, text, sizeof(text)), 100));
	cr_assert(eq(i32, rc, -ENOSPC), "%s", text);
	snprintf(want, sizeof(want), "uid %u has 100 chunks lent", (unsigned)getuid());
	cr_assert(not(eq(ptr, strstr(text, want), NULL)), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "--max-chunks-per-uid"), NULL)), "%s", text);

	/* Its session goes on; another uid has a bound of its own. */
	cr_assert(status_has(&a, "\"name\":\"hog\""));
	up(&b, NOBODY, "other");
	cr_assert(eq(i32, fill_until_refused(&b, "t", 200, &rc, text, sizeof(text)), 100));
	cr_assert(eq(i32, rc, -ENOSPC), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "uid " NOBODY " has 100"), NULL)), "%s", text);

	/* The bound is the uid's, over its clients: a second one is served once the first frees. */
	up(&a2, NULL, "second");
	refused_until_freed(&a, &a2, -ENOSPC);
	w_ok(&a, "fill t 7");
	w_ok(&a, "check t 7");
	cr_assert(status_has(&a2, "\"name\":\"other\""));

	cr_assert(eq(i32, worker_quit(&a2), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
	last_free(&a, baseline);
}

Test(fdlimit, a_refused_resume_leaves_the_tag_paused)
{
	struct worker a, a2;
	char text[1024];

	start(0, (const char *[]){ "--max-chunks-per-uid", "12", NULL });
	up(&a, NULL, "sleeper");
	up(&a2, NULL, "grower");
	for (int i = 0; i < 10; i++)
		w_ok(&a, "malloc kv 4096");
	w_ok(&a, "pause kv");
	for (int i = 0; i < 5; i++)
		w_ok(&a2, "malloc g 4096");
	/* 5 + 10 > 12: refused before a chunk is made. */
	cr_assert(eq(i32, worker_cmd(&a, text, sizeof(text), "resume kv"), -ENOSPC), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "--max-chunks-per-uid"), NULL)), "%s", text);
	cr_assert(status_has(&a, "\"state\":\"paused\""));
	w_ok(&a2, "free g");
	w_ok(&a, "resume kv");
	/* Mapped again: a tag libgmb thought active without memory would fault here. */
	w_ok(&a, "fill kv 9");
	w_ok(&a, "check kv 9");
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&a2), 0));
}

/*
 * The default bound is a share of the chunks RLIMIT_NOFILE leaves, smaller
 * for each other uid that holds chunks, with an eighth of them root's
 * alone: two uids at their bound leave chunks to a third uid and to root.
 */
Test(fdlimit, two_uids_at_their_default_bound_leave_chunks_to_a_third_and_root)
{
	struct worker a, b, c, r;
	char text[1024];
	int rc, na, nb, nc, nr, baseline;

	start(1024, NULL);
	up(&r, NULL, "root");
	baseline = fds_with(&r);
	up(&a, NOBODY, "first");
	na = fill_until_refused(&a, "t", 1024, &rc, text, sizeof(text));
	cr_assert(eq(i32, rc, -ENOSPC), "after %d: %s", na, text);
	cr_assert(not(eq(ptr, strstr(text, "--max-chunks-per-uid"), NULL)), "%s", text);
	cr_assert(gt(i32, na, 100), "a bound of %d chunks is too tight for 1,024 fds", na);
	cr_assert(lt(i32, na, 512), "one uid got %d of 1,024 fds", na);
	up(&b, "65533", "second");
	nb = fill_until_refused(&b, "t", 1024, &rc, text, sizeof(text));
	cr_assert(eq(i32, rc, -ENOSPC), "after %d: %s", nb, text);
	cr_assert(gt(i32, nb, 50), "the second uid got %d chunks, the first %d", nb, na);

	/* Both at their bound: a third uid still gets chunks, and root too. */
	up(&c, "65532", "third");
	nc = fill_until_refused(&c, "t", 1024, &rc, text, sizeof(text));
	cr_assert(gt(i32, nc, 16), "a third uid got %d chunks after %d and %d: %s", nc, na, nb,
		  text);
	nr = fill_until_refused(&r, "t", 1024, &rc, text, sizeof(text));
	cr_assert(gt(i32, nr, 16), "root got %d chunks after %d, %d and %d: %s", nr, na, nb, nc,
		  text);
	cr_assert(status_has(&r, "\"name\":\"third\""));
	/* The README quotes these. */
	cr_log_info("chunks at the bound: first uid %d, second %d, third %d, then root %d", na, nb,
		    nc, nr);
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
	cr_assert(eq(i32, worker_quit(&c), 0));
	last_free(&r, baseline);
}

Test(fdlimit, past_the_fd_headroom_a_request_gets_emfile_and_gmbd_keeps_its_spare_fds)
{
	struct worker a, b;
	char text[1024];
	int rc, n, baseline;

	/* No bound per uid: the fd headroom alone. */
	start(400, (const char *[]){ "--max-chunks-per-uid", "0", NULL });
	up(&a, NULL, "hog");
	baseline = fds_with(&a);
	n = fill_until_refused(&a, "t", 400, &rc, text, sizeof(text));
	cr_assert(eq(i32, rc, -EMFILE), "after %d: %s", n, text);
	cr_assert(gt(i32, n, 0));
	cr_assert(not(eq(ptr, strstr(text, "RLIMIT_NOFILE"), NULL)), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "LimitNOFILE"), NULL)), "%s", text);
	/* One batch of chunk fds to send, and room to accept, still free. */
	cr_assert(le(i32, proc_count_fds(gmbd.pid) + 253, 400), "gmbd holds %d fds",
		  proc_count_fds(gmbd.pid));

	/* Another client still connects and sees the status; its alloc waits
	 * for the first to free, then is served. */
	up(&b, NOBODY, "late");
	cr_assert(status_has(&b, "\"name\":\"hog\""));
	refused_until_freed(&a, &b, -EMFILE);
	cr_assert(eq(i32, worker_quit(&b), 0));
	last_free(&a, baseline);
}

/* Device @dev's figure @key in status (idle_bytes, chunks_released, ...). */
static int64_t dev_figure(struct worker *w, int dev, const char *key)
{
	char at[32];

	snprintf(at, sizeof(at), "{\"index\":%d,", dev);
	cr_assert(eq(i32, worker_cmd(w, json, sizeof(json), "status"), 0), "%s", json);
	cr_assert(not(eq(ptr, strstr(json, at), NULL)), "no device %d: %s", dev, json);
	return json_i64_after(json, at, key);
}

/*
 * Warm free chunks are open memfds of gmbd that belong to nobody: a request
 * short of fds gets them back, as many as it needs and no more, before it
 * is refused. Here they are of another uid, so they cannot serve it.
 */
Test(fdlimit, warm_free_chunks_give_their_fds_to_a_request_short_of_them)
{
	struct worker a, b;
	char text[1024];
	int rc, n, m, half;
	int64_t released;

	start(400,
	      (const char *[]){ "--max-chunks-per-uid", "0", "--pool-keep", "unlimited", NULL });
	up(&a, NULL, "warmer");
	n = fill_until_refused(&a, "t", 400, &rc, text, sizeof(text));
	cr_assert(eq(i32, rc, -EMFILE), "after %d: %s", n, text);
	w_ok(&a, "free t");
	cr_assert(eq(i64, dev_figure(&a, 0, "idle_bytes"), (int64_t)n * CHUNK), "%s", json);
	released = dev_figure(&a, 0, "chunks_released");

	up(&b, NOBODY, "other");
	half = n / 2;
	cr_assert(eq(i32, fill_until_refused(&b, "t", half, &rc, text, sizeof(text)), half),
		  "rc %d: %s", rc, text);
	/* Only as many as it needed went back. */
	cr_assert(eq(i64, dev_figure(&b, 0, "chunks_released"), released + half), "%s", json);
	cr_assert(eq(i64, dev_figure(&b, 0, "idle_bytes"), (int64_t)(n - half) * CHUNK), "%s",
		  json);
	/* The rest once the warm pool is empty; then the headroom says no. */
	m = fill_until_refused(&b, "t", 400, &rc, text, sizeof(text));
	cr_assert(eq(i32, rc, -EMFILE), "after %d: %s", m, text);
	cr_assert(eq(i32, half + m, n), "the other uid got %d chunks, the first %d", half + m, n);
	cr_assert(eq(i64, dev_figure(&b, 0, "idle_bytes"), 0), "%s", json);
	w_ok(&b, "fill t 4");
	w_ok(&b, "check t 4");
	cr_assert(eq(i32, worker_quit(&b), 0));
	cr_assert(eq(i32, worker_quit(&a), 0));
}

/* Warm chunks of another device hold gmbd's fds as well: they go too. */
Test(fdlimit, warm_chunks_of_another_device_give_their_fds_too)
{
	struct worker a;
	char text[1024];
	int rc, n, m;

	start(400, (const char *[]){ "--max-chunks-per-uid", "0", "--pool-keep", "unlimited",
				     "--host-devices", "2", NULL });
	up(&a, NULL, "warmer");
	for (n = 0; n < 400; n++)
		if ((rc = worker_cmd(&a, text, sizeof(text), "malloc t %d 1", CHUNK)) != 0)
			break;
	cr_assert(eq(i32, rc, -EMFILE), "after %d: %s", n, text);
	w_ok(&a, "free t");
	cr_assert(eq(i64, dev_figure(&a, 1, "idle_bytes"), (int64_t)n * CHUNK), "%s", json);
	m = fill_until_refused(&a, "u", 400, &rc, text, sizeof(text));
	cr_assert(eq(i32, rc, -EMFILE), "after %d: %s", m, text);
	cr_assert(eq(i32, m, n), "device 0 got %d chunks, device 1 had %d", m, n);
	cr_assert(eq(i64, dev_figure(&a, 1, "idle_bytes"), 0), "%s", json);
	cr_assert(eq(i64, dev_figure(&a, 1, "chunks_released"), n), "%s", json);
	w_ok(&a, "fill u 6");
	w_ok(&a, "check u 6");
	cr_assert(eq(i32, worker_quit(&a), 0));
}

/* ---- fds that cannot be sent ---- */

/* The fd number below which gmbd has room for exactly @k new fds. */
static rlim_t gmbd_room_for(int k)
{
	long n = test_fd_room(gmbd.pid, k);

	cr_assert(ge(i64, n, 0), "gmbd's fd table is full");
	return (rlim_t)n;
}

/* gmbd's open-file limit now, behind its back: what it read at start no longer holds. */
static void gmbd_nofile(rlim_t cur, struct rlimit *old)
{
	cr_assert(eq(i32, test_set_nofile(gmbd.pid, cur, old), 0));
}

Test(fdlimit, an_alloc_whose_fd_cannot_be_sent_is_refused_and_taken_back)
{
	struct worker a;
	struct rlimit old;
	char text[1024];
	int baseline;

	/* Warm chunks: the next alloc reuses one and only has to send its fd. */
	start(0, (const char *[]){ "--pool-keep", "unlimited", NULL });
	up(&a, NULL, "w");
	baseline = fds_with(&a);
	w_ok(&a, "malloc t 4096");
	w_ok(&a, "free t");
	gmbd_nofile(gmbd_room_for(0), &old);
	cr_assert(eq(i32, worker_cmd(&a, text, sizeof(text), "malloc t %d", CHUNK), -EMFILE), "%s",
		  text);
	cr_assert(not(eq(ptr, strstr(text, "could not send its chunk fds"), NULL)), "%s", text);
	cr_assert(eq(i64, used_bytes(&a), 0), "the refused lend is still counted: %s", json);
	gmbd_nofile(old.rlim_cur, NULL);
	w_ok(&a, "malloc t 4096");
	w_ok(&a, "fill t 3");
	w_ok(&a, "check t 3");
	w_ok(&a, "free t");
	/* The warm chunk stays: one memfd over the start. */
	expect_fds_back(baseline + 1);
	cr_assert(eq(i32, worker_quit(&a), 0));
}

Test(fdlimit, a_resume_whose_fds_cannot_be_sent_leaves_the_tag_paused)
{
	struct worker a;
	struct rlimit old;
	char text[1024];
	int baseline;

	start(0, NULL);
	up(&a, NULL, "w");
	baseline = fds_with(&a);
	w_ok(&a, "malloc kv 4096");
	w_ok(&a, "pause kv");
	/* Room for the new chunk's memfd, none for the fd to send. */
	gmbd_nofile(gmbd_room_for(1), &old);
	cr_assert(eq(i32, worker_cmd(&a, text, sizeof(text), "resume kv"), -EMFILE), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "could not send its chunk fds"), NULL)), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "the tags stay paused"), NULL)), "%s", text);
	cr_assert(status_has(&a, "\"state\":\"paused\""));
	cr_assert(eq(i64, used_bytes(&a), 0), "the refused lend is still counted: %s", json);
	gmbd_nofile(old.rlim_cur, NULL);
	w_ok(&a, "resume kv");
	w_ok(&a, "fill kv 5");
	w_ok(&a, "check kv 5");
	w_ok(&a, "free kv");
	expect_fds_back(baseline);
	cr_assert(eq(i32, worker_quit(&a), 0));
}

/* Whether status shows tag @tag in @state ("active", "paused"). */
static bool tag_state(struct worker *w, const char *tag, const char *state)
{
	const char *at, *st;
	char want[128];

	snprintf(want, sizeof(want), "\"name\":\"%s\",", tag);
	cr_assert(eq(i32, worker_cmd(w, json, sizeof(json), "status"), 0), "%s", json);
	at = strstr(json, want);
	cr_assert(not(eq(ptr, (void *)at, NULL)), "no tag %s: %s", tag, json);
	st = strstr(at, "\"state\":");
	snprintf(want, sizeof(want), "\"state\":\"%s\"", state);
	return st && strncmp(st, want, strlen(want)) == 0;
}

/* A resume of every tag names the tags without memory too: taken back, they are paused again. */
Test(fdlimit, a_taken_back_resume_of_every_tag_leaves_every_tag_paused)
{
	struct worker a;
	struct rlimit old;
	char text[1024];

	start(0, NULL);
	up(&a, NULL, "w");
	w_ok(&a, "malloc kv 4096");
	w_ok(&a, "mode empty zero");
	w_ok(&a, "pause *");
	cr_assert(tag_state(&a, "empty", "paused"), "%s", json);
	gmbd_nofile(gmbd_room_for(1), &old);
	cr_assert(eq(i32, worker_cmd(&a, text, sizeof(text), "resume *"), -EMFILE), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "the tags stay paused"), NULL)), "%s", text);
	gmbd_nofile(old.rlim_cur, NULL);
	cr_assert(tag_state(&a, "kv", "paused"), "%s", json);
	cr_assert(tag_state(&a, "empty", "paused"), "gmbd has the empty tag active: %s", json);
	/* libgmb agrees: paused there too. */
	cr_assert(eq(i32, worker_cmd(&a, text, sizeof(text), "malloc empty 4096"), -EBUSY), "%s",
		  text);
	w_ok(&a, "resume *");
	cr_assert(tag_state(&a, "empty", "active"), "%s", json);
	cr_assert(tag_state(&a, "kv", "active"), "%s", json);
	w_ok(&a, "malloc empty 4096");
	w_ok(&a, "fill kv 5");
	w_ok(&a, "check kv 5");
	cr_assert(eq(i32, worker_quit(&a), 0));
}
