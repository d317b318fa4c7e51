/*
 * test_save_give.c - a large pause of a PRESERVE tag hands each group of
 * saved allocations back to gmbd while the next group copies
 * (client/lib/mem/save.c), against a real gmbd (host backend): gmbd has
 * the memory back before the pause ends, the bytes come back whole, a pause
 * that fails after handing some back has them lent again and restored (or,
 * with no memory left for them, ends paused), a tag another process may map
 * keeps all of its memory until the pause, and gmbd checks the requests.
 *
 * The client runs in this process with groups of 8 MiB (one allocation
 * each) and its backend goes through a spy (a copy of its ops) that logs
 * the copies to host queued and the chunk handles released, in order, and
 * can fail one copy.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/api/client.h"
#include "common/backend/backend.h"
#include "include/gmb.h"
#include "tests/util.h"

#define MiB  (1ULL << 20)
#define N    6
#define SIZE (8 * MiB)
#define NLOG 64

static struct gmbd_proc gmbd;

static void daemon_start(void)
{
	static const char *const args[] = { "--host-memory", "256MiB",	"--max-chunk", "8MiB",
					    "--log-level",   "warning", NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void daemon_stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(save_give, .init = daemon_start, .fini = daemon_stop, .timeout = 60);

/* The spy on the client's backend. */

struct spy_event {
	char what;    /* 'Q': a copy to host queued, 'R': a chunk handle released */
	uintptr_t va; /* Q: the allocation's address */
	int64_t used; /* Q: gmbd's used bytes on device 0 then (-1: not asked) */
};

static struct {
	const struct backend_ops *real;
	struct backend_ops ops;
	struct spy_event log[NLOG];
	int nlog;
	int nqueued;
	int ask_at;  /* the copy queued as this one (1: the first) asks gmbd for its used bytes */
	int fail_at; /* the copy queued as this one fails */
	gmb_client *obs; /* asks gmbd */
	gmb_client *hog; /* when set, takes every free byte before the copy fails */
	void *hogged;
} spy;

static void spy_log(char what, uintptr_t va, int64_t used)
{
	if (spy.nlog < NLOG)
		spy.log[spy.nlog++] = (struct spy_event){ what, va, used };
}

static int spy_contents_queue(struct backend *b, int dev, enum backend_contents op, void *host,
			      uintptr_t va, uint64_t size)
{
	if (op != BACKEND_TO_HOST)
		return spy.real->contents_queue(b, dev, op, host, va, size);
	spy.nqueued++;
	spy_log('Q', va, spy.nqueued == spy.ask_at ? test_status_i64(spy.obs, "used_bytes") : -1);
	if (spy.nqueued != spy.fail_at)
		return spy.real->contents_queue(b, dev, op, host, va, size);
	if (spy.hog) {
		int64_t avail = test_status_i64(spy.obs, "available_bytes");

		if (avail > 0 && gmb_malloc(spy.hog, &spy.hogged, (size_t)avail, 0, "hog") != 0)
			spy.hogged = NULL;
	}
	return backend_fail(-EIO, "spy: this copy fails");
}

static int spy_chunk_release(struct backend *b, uint64_t handle)
{
	spy_log('R', 0, -1);
	return spy.real->chunk_release(b, handle);
}

/* A client whose backend goes through the spy, handing back 8 MiB groups. */
static gmb_client *spy_connect(const char *name)
{
	gmb_client *c = NULL;

	memset(&spy, 0, sizeof(spy));
	cr_assert(eq(i32, gmb_connect(gmbd.sock, name, &c), 0), "%s", gmb_last_error(NULL));
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "observer", &spy.obs), 0));
	spy.real = c->mem.be->ops;
	spy.ops = *spy.real;
	spy.ops.contents_queue = spy_contents_queue;
	spy.ops.chunk_release = spy_chunk_release;
	c->mem.be->ops = &spy.ops;
	c->mem.give_bytes = SIZE;
	return c;
}

static void spy_close(gmb_client *c)
{
	gmb_close(c);
	gmb_close(spy.obs);
	if (spy.hog)
		gmb_close(spy.hog);
}

/* N PRESERVE allocations of @tag, allocation i filled with seed i + 1. */
static void alloc_all(gmb_client *c, const char *tag, unsigned char **p)
{
	cr_assert(eq(i32, gmb_tag_set_mode(c, tag, GMB_MODE_PRESERVE), 0), "%s", gmb_last_error(c));
	for (int i = 0; i < N; i++) {
		cr_assert(eq(i32, gmb_malloc(c, (void **)&p[i], SIZE, 0, tag), 0), "%s",
			  gmb_last_error(c));
		test_fill(p[i], SIZE, (unsigned)i + 1);
	}
}

static bool all_hold(unsigned char **p, int from, int to)
{
	for (int i = from; i < to; i++)
		if (!test_holds(p[i], SIZE, (unsigned)i + 1))
			return false;
	return true;
}

/* The index in the log of the @k-th copy queued (1: the first); -1 if none. */
static int log_queued(int k)
{
	for (int i = 0; i < spy.nlog; i++)
		if (spy.log[i].what == 'Q' && --k == 0)
			return i;
	return -1;
}

/* The allocation of p[] whose copy was queued @k-th. */
static int log_alloc(unsigned char **p, int k)
{
	int at = log_queued(k);

	for (int i = 0; at >= 0 && i < N; i++)
		if ((uintptr_t)p[i] == spy.log[at].va)
			return i;
	cr_assert(false, "no copy was queued %d-th", k);
	return -1;
}

/* Handles released before log entry @at. */
static int log_released_before(int at)
{
	int n = 0;

	for (int i = 0; i < at; i++)
		n += spy.log[i].what == 'R';
	return n;
}

/* "active" or "paused": the state of @c's... any client's tag @tag, as gmbd lists it. */
static void tag_state(const char *tag, char *out, size_t cap)
{
	char *json = NULL, key[64], *at;

	out[0] = '\0';
	cr_assert(eq(i32, gmb_status_json(spy.obs, &json), 0));
	snprintf(key, sizeof(key), "{\"name\":\"%s\"", tag);
	at = strstr(json, key);
	at = at ? strstr(at, "\"state\":\"") : NULL;
	if (at)
		snprintf(out, cap, "%.6s", at + strlen("\"state\":\""));
	free(json);
}

/* Resume "w": every byte back; then both clients close. */
static void resume_holds_close(gmb_client *c, unsigned char **p)
{
	cr_assert(eq(i32, gmb_resume(c, "w"), 0), "%s", gmb_last_error(c));
	cr_assert(all_hold(p, 0, N));
	spy_close(c);
}

/* Pause "w" keeping every handle until the last copy is queued. */
static void pause_in_one_step(gmb_client *c)
{
	cr_assert(eq(i32, gmb_pause(c, "w"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, log_released_before(log_queued(N)), 0),
		  "a handle went before the last copy");
}

Test(save_give, each_saved_group_goes_back_while_the_next_copies)
{
	gmb_client *c = spy_connect("giver");
	unsigned char *p[N];
	int64_t used_before;

	alloc_all(c, "w", p);
	used_before = test_status_i64(spy.obs, "used_bytes");
	cr_assert(ge(i64, used_before, (int64_t)(N * SIZE)));
	spy.ask_at = N;
	cr_assert(eq(i32, gmb_pause(c, "w"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, spy.nqueued, N), "one copy each");
	for (int k = 2; k <= N; k++) {
		int q = log_queued(k);

		cr_assert(eq(i32, log_released_before(q), k - 2),
			  "when copy %d was queued, %d handles had gone, not %d", k,
			  log_released_before(q), k - 2);
	}
	cr_assert(le(i64, spy.log[log_queued(spy.ask_at)].used,
		     used_before - (int64_t)((N - 2) * SIZE)),
		  "gmbd had %lld bytes of %lld when the last copy began",
		  (long long)spy.log[log_queued(spy.ask_at)].used, (long long)used_before);
	cr_assert(eq(i32, log_released_before(spy.nlog), N),
		  "every handle went by the pause's end");
	cr_assert(
		le(i64, test_status_i64(spy.obs, "used_bytes"), used_before - (int64_t)(N * SIZE)));
	for (int round = 0; round < 3; round++) {
		if (round)
			cr_assert(eq(i32, gmb_pause(c, "w"), 0), "%s", gmb_last_error(c));
		cr_assert(eq(i32, gmb_resume(c, "w"), 0), "%s", gmb_last_error(c));
		cr_assert(all_hold(p, 0, N), "round %d: the bytes came back", round);
	}
	spy_close(c);
}

Test(save_give, a_small_pause_keeps_its_memory_until_it_ends)
{
	gmb_client *c = spy_connect("small");
	unsigned char *p[N];

	alloc_all(c, "w", p);
	c->mem.give_bytes = N * SIZE; /* one group: nothing to overlap */
	pause_in_one_step(c);
	resume_holds_close(c, p);
}

Test(save_give, a_pause_that_fails_after_giving_back_lends_again_and_restores)
{
	gmb_client *c = spy_connect("failer");
	unsigned char *p[N];
	char state[8];
	int64_t used;

	alloc_all(c, "w", p);
	used = test_status_i64(spy.obs, "used_bytes");
	spy.fail_at = 5;
	cr_assert(eq(i32, gmb_pause(c, "w"), -EIO));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(c), "this copy fails"), NULL)), "%s",
		  gmb_last_error(c));
	cr_assert(eq(i32, log_released_before(log_queued(5)), 3),
		  "three allocations were handed back before the copy failed");
	cr_assert(all_hold(p, 0, N), "every byte where it was");
	tag_state("w", state, sizeof(state));
	cr_assert(eq(str, state, "active"));
	cr_assert(eq(i64, test_status_i64(spy.obs, "used_bytes"), used), "gmbd lends it all again");
	spy.fail_at = 0;
	cr_assert(eq(i32, gmb_pause(c, "w"), 0), "%s", gmb_last_error(c));
	resume_holds_close(c, p);
}

Test(save_give, with_no_memory_to_lend_again_the_failed_pause_ends_paused)
{
	gmb_client *c = spy_connect("stuck");
	unsigned char *p[N];
	char state[8];

	alloc_all(c, "w", p);
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "hog", &spy.hog), 0));
	spy.fail_at = 5;
	cr_assert(eq(i32, gmb_pause(c, "w"), -EIO));
	cr_assert(not(eq(ptr, spy.hogged, NULL)), "the hog took the free memory");
	tag_state("w", state, sizeof(state));
	cr_assert(eq(str, state, "paused"), "never active with memory unmapped");
	cr_assert(eq(i32, gmb_resume(c, "w"), -ENOMEM));
	cr_assert(eq(i32, gmb_free(spy.hog, spy.hogged), 0));
	spy.fail_at = 0;
	cr_assert(eq(i32, gmb_resume(c, "w"), 0), "%s", gmb_last_error(c));
	for (int k = 1; k <= 4; k++)
		cr_assert(all_hold(p, log_alloc(p, k), log_alloc(p, k) + 1),
			  "copy %d was saved and came back", k);
	for (int i = 0; i < N; i++) {
		bool saved = false;

		for (int k = 1; k <= 4; k++)
			saved |= log_alloc(p, k) == i;
		for (size_t j = 0; !saved && j < SIZE; j += 4096)
			cr_assert(eq(u8, p[i][j], 0), "allocation %d was never saved: zero-filled",
				  i);
	}
	spy_close(c);
}

Test(save_give, a_tag_another_process_may_map_keeps_its_memory_until_the_pause)
{
	gmb_client *c = spy_connect("sharer");
	unsigned char *p[N], handle[64];

	alloc_all(c, "w", p);
	cr_assert(eq(i32, gmb_ipc_get_handle(c, p[1], handle), 0), "%s", gmb_last_error(c));
	pause_in_one_step(c);
	resume_holds_close(c, p);
}

/* A request with alloc_ids straight to gmbd (a give-back lets go of the
 * handles when @released): its status, gmbd's sentence in @err (may be NULL). */
static int send_ids_err(gmb_client *c, bool resume, bool released, uint64_t *ids, size_t n,
			char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PauseRequest pr = GMB__PAUSE_REQUEST__INIT;
	Gmb__ResumeRequest rr = GMB__RESUME_REQUEST__INIT;
	struct gmb__reply rep;
	int rc;

	if (resume) {
		rr.alloc_ids = ids;
		rr.n_alloc_ids = n;
		env.body_case = GMB__ENVELOPE__BODY_RESUME;
		env.resume = &rr;
	} else {
		pr.alloc_ids = ids;
		pr.n_alloc_ids = n;
		pr.handles_released = released;
		env.body_case = GMB__ENVELOPE__BODY_PAUSE;
		env.pause = &pr;
	}
	rc = gmb__request(c->mem.conn, &env, &rep, err);
	gmb__reply_deinit(&rep);
	return rc;
}

static int send_ids(gmb_client *c, bool resume, uint64_t *ids, size_t n)
{
	return send_ids_err(c, resume, false, ids, n, NULL);
}

Test(save_give, gmbd_refuses_ids_it_cannot_act_on)
{
	gmb_client *c = spy_connect("checks");
	unsigned char *p[N];
	uint64_t id, ids[2], none = 1u << 30;

	alloc_all(c, "w", p);
	id = c->mem.tags->allocs->id;
	ids[0] = ids[1] = id;
	cr_assert(eq(i32, send_ids(c, false, &none, 1), -ENOENT), "give back: no such allocation");
	cr_assert(eq(i32, send_ids(c, true, &none, 1), -ENOENT), "lend again: no such allocation");
	cr_assert(eq(i32, send_ids(c, true, ids, 2), -EINVAL), "lend again: named twice");
	cr_assert(eq(i32, send_ids(c, true, &id, 1), 0), "lend again: lent already, a no-op");
	cr_assert(eq(i32, gmb_pause(c, "w"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, send_ids(c, false, &id, 1), 0), "give back: lends nothing, a no-op");
	cr_assert(eq(i32, send_ids(c, true, &id, 1), -EBUSY), "lend again: of a paused tag");
	resume_holds_close(c, p);
}

Test(save_give, a_lend_again_whose_fds_cannot_be_sent_leaves_the_tag_active)
{
	gmb_client *c = spy_connect("nofds");
	unsigned char *p[N];
	char err[512], state[8];
	struct rlimit old;
	uint64_t id;
	long room;

	alloc_all(c, "w", p);
	id = c->mem.tags->allocs->id;
	/* Given back with its handles, as a pause would; gmbd releases it. */
	cr_assert(eq(i32, send_ids_err(c, false, true, &id, 1, NULL), 0));
	/* Room for the new chunk's memfd, none for the fd to send. */
	room = test_fd_room(gmbd.pid, 1);
	cr_assert(ge(i64, room, 0), "gmbd's fd table is full");
	cr_assert(eq(i32, test_set_nofile(gmbd.pid, (rlim_t)room, &old), 0));
	cr_assert(eq(i32, send_ids_err(c, true, false, &id, 1, err), -EMFILE), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "the allocations stay given back"), NULL)), "%s", err);
	cr_assert(eq(i32, test_set_nofile(gmbd.pid, old.rlim_cur, NULL), 0));
	tag_state("w", state, sizeof(state));
	cr_assert(eq(str, state, "active"), "the other allocations are still lent");
	cr_assert(eq(i64, test_status_i64(spy.obs, "used_bytes"), (int64_t)((N - 1) * SIZE)),
		  "the undelivered lend is not counted");
	cr_assert(eq(i32, send_ids(c, true, &id, 1), 0), "lent again once the fds can go");
	cr_assert(eq(i64, test_status_i64(spy.obs, "used_bytes"), (int64_t)(N * SIZE)));
	spy_close(c);
}
