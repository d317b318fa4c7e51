/*
 * test_ipc.c - CUDA IPC on gmbd memory through the preload shim, in real
 * processes: two tests/prog_preload programs (the stand-in runtime,
 * libgmb_preload.so preloaded), an exporter whose memory is gmbd's and an
 * importer, against a real gmbd (host backend). Proves: bytes written by
 * one are read by the other, both ways; handles are deterministic, name
 * the chunk of an interior pointer, open once per allocation and count
 * opens; forged (random, every bit flipped, truncated) and foreign
 * handles; another uid's EPERM naming the owner; an owner that frees or is
 * SIGKILLed while imported; an importer SIGKILLed; a pause of an imported
 * tag refused until the import closes; used memory back to zero after each.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/ipc_fx.h"
#include "tests/util.h"

TestSuite(ipc, .init = ipcfx_start, .fini = ipcfx_stop, .timeout = 60);

Test(ipc, bytes_cross_both_ways_and_opens_are_counted)
{
	struct worker a, b;
	char p[32], q[32], q2[32], h[160], h2[160];

	ipcfx_exporter(&a, 4 * MiB, 0x5a, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_get_handle(&a, p, h2);
	cr_assert(eq(str, h, h2), "the same bytes every time");
	ipcfx_prog(&b, 0);
	ipcfx_run(&b, 0, "gmb");
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "check %s %llu 90", q, 4 * MiB);
	ipcfx_run(&b, 0, "fill %s %llu 51", q, 1 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 51", p, 1 * MiB);
	/* A second open maps nothing new: the same address, one more open. */
	ipcfx_open_handle(&b, h, q2);
	cr_assert(eq(str, q, q2));
	cr_assert(eq(i64, ipcfx_used(&b), (int64_t)(4 * MiB)), "imports are charged nothing");
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&b, 0, "check %s %llu 51", q, 1 * MiB);
	/* Imported: the owner's tag does not pause, and stays mapped. */
	cr_assert(eq(i32, ipcfx_run_rc(&a, "pause %s", "w"), -EBUSY));
	ipcfx_run(&a, 0, "check %s %llu 51", p, 1 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "pause w");
	ipcfx_run(&a, 0, "resume w");
	/* The runtime was never asked, on either side. */
	cr_assert(eq(str, (char *)ipcfx_run(&a, 0, "ipcstats"), "gets=0 opens=0 closes=0"));
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcstats"), "gets=0 opens=0 closes=0"));
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, ipcfx_used(&b), 0));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

/*
 * Packed (the hooks' default): a piece is shared as a piece, at its address,
 * though it is inside the pack's one chunk (the runtime's cudaIpcOpenMemHandle
 * gives the base of the allocation the handle was made from, and PyTorch adds
 * the tensor's offset in it to that).
 */
Test(ipc, a_packed_allocation_crosses_at_its_own_offset, .init = ipcfx_start_big_chunks)
{
	struct worker a, b;
	char p[32], p2[32], q[32], q2[32], h[160];

	ipcfx_exporter_env(&a, 4 * MiB, 0x5a, p, "GMB_PACK=hooks");
	snprintf(p2, sizeof(p2), "%s", ipcfx_run(&a, 0, "malloc %llu", 4 * MiB));
	cr_assert(eq(u64, ipcfx_addr(p2), ipcfx_addr(p) + 4 * MiB), "two pieces of one pack");
	cr_assert(eq(i64, ipcfx_used(&a), (int64_t)(64 * MiB)), "one pack lent, one chunk");
	ipcfx_run(&a, 0, "fill %s %llu 33", p2, 4 * MiB);
	ipcfx_get_handle(&a, p2, h);
	ipcfx_prog(&b, 0);
	ipcfx_run(&b, 0, "gmb");
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "check %s %llu 33", q, 4 * MiB);
	ipcfx_run(&b, 0, "fill %s %llu 68", q, 1 * MiB);
	/* Opened again (one mapping): the same place. */
	ipcfx_open_handle(&b, h, q2);
	cr_assert(eq(str, q, q2));
	ipcfx_run(&b, 0, "ipcclose %s", q2);
	ipcfx_run(&a, 0, "check %s %llu 68", p2, 1 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 90", p, 4 * MiB); /* the other piece untouched */
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "free %s", p);
	ipcfx_run(&a, 0, "free %s", p2);
	cr_assert(eq(i64, ipcfx_used(&b), 0), "the last piece gave the pack back");
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

/*
 * gmbd out of open files as it sends an open's chunk fds: the open is given
 * back and refused with a sentence, the importer's session goes on, and no
 * import is left to hold the owner's tag.
 */
Test(ipc, an_open_whose_fds_cannot_be_sent_is_given_back)
{
	struct worker a, b;
	char p[32], q[32], h[160];
	struct rlimit old;
	long room;

	ipcfx_exporter(&a, 4 * MiB, 0x5a, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_run(&b, 0, "gmb");
	ipcfx_run(&b, 0, "status"); /* connected before gmbd is short of fds */
	room = test_fd_room(ipcfx_gmbd.pid, 0);
	cr_assert(ge(i64, room, 0));
	cr_assert(eq(i32, test_set_nofile(ipcfx_gmbd.pid, (rlim_t)room, &old), 0));
	cr_assert(not(eq(i32, ipcfx_run_rc(&b, "ipcopen %s", h), 0)), "no fd to send");
	cr_assert(eq(i32, test_set_nofile(ipcfx_gmbd.pid, old.rlim_cur, NULL), 0));
	cr_assert(not(eq(ptr, strstr(ipcfx_run(&b, 0, "error"), "gave the open back"), NULL)), "%s",
		  ipcfx_run(&b, 0, "error"));
	cr_assert(not(eq(ptr, strstr(ipcfx_run(&b, 0, "status"), "\"imports_total\":0,"), NULL)),
		  "nothing imported");
	ipcfx_run(&a, 0, "pause w"); /* no importer holds it */
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&a, 0, "fill %s %llu 90", p, 4 * MiB);
	ipcfx_open_handle(&b, h, q); /* the same session, fds again */
	ipcfx_run(&b, 0, "check %s %llu 90", q, 4 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "free %s", p);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, an_interior_pointer_names_its_chunk_and_maps_the_allocation_once)
{
	struct worker a, b;
	char p[32], q[32], q2[32], h[160], h2[160], ptr[32];

	ipcfx_exporter(&a, 6 * MiB, 0x11, p); /* three chunks of 2 MiB */
	snprintf(ptr, sizeof(ptr), "%#llx", (unsigned long long)(ipcfx_addr(p) + 3 * MiB));
	ipcfx_run(&a, 0, "fill %s %llu 34", ptr, 1 * MiB);
	ipcfx_get_handle(&a, p, h);
	ipcfx_get_handle(&a, ptr, h2);
	cr_assert(not(eq(str, h, h2)), "another chunk, another range offset");
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h2, q2);
	ipcfx_open_handle(&b, h, q);
	cr_assert(eq(u64, ipcfx_addr(q2) - ipcfx_addr(q), 2 * MiB),
		  "the chunk's start, in one mapping");
	snprintf(ptr, sizeof(ptr), "%#llx", (unsigned long long)(ipcfx_addr(q) + 3 * MiB));
	ipcfx_run(&b, 0, "check %s %llu 34", ptr, 1 * MiB);
	ipcfx_run(&b, 0, "check %s %llu 17", q, 3 * MiB);
	/* Re-exported from the import: the owner's handle. */
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcget %s", q2), h2));
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&b, 0, "ipcclose %s", q2);
	/* Closed: the pointer is nobody's here now, so the runtime gets it. */
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcstats"), "gets=0 opens=0 closes=0"));
	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcstats"), "gets=0 opens=0 closes=1"));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, forged_and_foreign_handles_map_nothing)
{
	struct worker a, b;
	char p[32], h[160], f[160], plain[32];
	char log[1 << 16];
	FILE *lf;
	size_t n;

	ipcfx_exporter(&a, 2 * MiB, 0x22, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	srand(7);
	for (int i = 0; i < 64; i++) {
		for (int j = 0; j < 128; j++)
			f[j] = "0123456789abcdef"[rand() % 16];
		f[128] = 0;
		memcpy(f, h, 16); /* gmbd's magic and version: reaches gmbd */
		cr_assert(eq(i32, ipcfx_run_rc(&b, "ipcopen %s", f), INVALID_HANDLE), "%s", f);
	}
	for (int bit = 0; bit < 512; bit++) {
		int byte = bit / 8, v;

		snprintf(f, sizeof(f), "%s", h);
		sscanf(f + 2 * byte, "%2x", &v);
		v ^= 1 << (bit % 8);
		snprintf(f + 2 * byte, 3, "%02x", v);
		f[2 * byte + 2] = h[2 * byte + 2];
		/* A flipped magic is no longer gmbd's: the runtime refuses it, also 400. */
		cr_assert(eq(i32, ipcfx_run_rc(&b, "ipcopen %s", f), INVALID_HANDLE), "bit %d",
			  bit);
	}
	/* Truncated: the rest zero. */
	snprintf(f, sizeof(f), "%.100s", h);
	cr_assert(eq(i32, ipcfx_run_rc(&b, "ipcopen %s", f), INVALID_HANDLE));
	/* A handle of the runtime's own goes to the runtime. */
	ipcfx_run(&a, 0, "end");
	snprintf(plain, sizeof(plain), "%s", ipcfx_run(&a, 0, "malloc 4096"));
	snprintf(f, sizeof(f), "%s", ipcfx_run(&a, 0, "ipcget %s", plain));
	cr_assert(eq(str, (char *)ipcfx_run(&a, 0, "ipcstats"), "gets=1 opens=0 closes=0"));
	ipcfx_run(&b, 0, "ipcopen %s", f);
	/* It and the 48 handles whose magic a flipped bit broke: no more. */
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcstats"), "gets=0 opens=49 closes=0"));
	/* The forged opens of gmbd handles each got a sentence in gmbd's log. */
	lf = fopen(ipcfx_gmbd.log, "r");
	cr_assert(not(eq(ptr, lf, NULL)));
	n = fread(log, 1, sizeof(log) - 1, lf);
	log[n] = 0;
	fclose(lf);
	cr_assert(not(eq(ptr, strstr(log, "the handle names no export of this gmbd"), NULL)));
	ipcfx_run(&b, 0, "gmb");
	cr_assert(eq(i64, ipcfx_used(&b), (int64_t)(2 * MiB)), "nothing was imported");
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, another_uid_gets_eperm_naming_the_owner)
{
	struct worker a, b;
	char p[32], h[160], text[1024];

	ipcfx_exporter(&a, 2 * MiB, 0x22, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 65534);
	ipcfx_run(&b, 0, "gmb");
	cr_assert(eq(i32, worker_cmd(&b, text, sizeof(text), "ipcopen %s", h), 800),
		  "cudaErrorNotPermitted: %s", text);
	snprintf(text, sizeof(text), "%s", ipcfx_run(&b, 0, "error"));
	cr_assert(not(eq(ptr, strstr(text, "belongs to client"), NULL)), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "uid 0)"), NULL)), "%s", text);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, an_owner_that_frees_keeps_the_memory_until_the_last_close)
{
	struct worker a, b;
	char p[32], q[32], h[160];

	ipcfx_exporter(&a, 4 * MiB, 0x44, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_run(&b, 0, "gmb");
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&a, 0, "free %s", p);
	ipcfx_run(&b, 0, "check %s %llu 68", q, 4 * MiB);
	cr_assert(eq(i64, ipcfx_used(&b), (int64_t)(4 * MiB)), "kept for the importer");
	/* Stale now for new opens, in another process. */
	ipcfx_quit(&a);
	ipcfx_prog(&a, 0);
	cr_assert(eq(i32, ipcfx_run_rc(&a, "ipcopen %s", h), INVALID_HANDLE));
	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(eq(i64, ipcfx_used(&b), 0), "back at the last close");
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, an_owner_killed_while_imported_leaves_the_importer_working)
{
	struct worker a, b;
	char p[32], q[32], h[160];

	ipcfx_exporter(&a, 4 * MiB, 0x66, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_run(&b, 0, "gmb");
	ipcfx_open_handle(&b, h, q);
	worker_kill(&a);
	ipcfx_run(&b, 0, "check %s %llu 102", q, 4 * MiB);
	ipcfx_run(&b, 0, "fill %s %llu 7", q, 4 * MiB);
	ipcfx_run(&b, 0, "check %s %llu 7", q, 4 * MiB);
	cr_assert(eq(i64, ipcfx_used(&b), (int64_t)(4 * MiB)));
	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(eq(i64, ipcfx_used(&b), 0));
	ipcfx_quit(&b);
}

static struct worker *pause_w;

static int pause_ok(void *arg)
{
	(void)arg;
	return ipcfx_run_rc(pause_w, "pause %s", "w") == 0;
}

Test(ipc, a_killed_importer_is_dropped_within_a_second)
{
	struct worker a, b;
	char p[32], q[32], h[160];
	struct timespec t0, t1;
	double ms;

	ipcfx_exporter(&a, 4 * MiB, 0x66, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	ipcfx_open_handle(&b, h, q);
	cr_assert(eq(i32, ipcfx_run_rc(&a, "pause %s", "w"), -EBUSY));
	worker_kill(&b);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pause_w = &a;
	cr_assert(eq(i32, wait_until(pause_ok, NULL, 1000), 0), "the import outlived its process");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	cr_assert(lt(dbl, ms, 1000.0));
	cr_assert(eq(i64, ipcfx_used(&a), 0), "paused: nothing lent");
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, ipcfx_used(&a), 0));
	ipcfx_quit(&a);
}

Test(ipc, a_pause_that_may_wait_waits_for_the_importers_to_close)
{
	struct worker a, b;
	char p[32], q[32], h[160];

	ipcfx_exporter_env(&a, 4 * MiB, 0x3c, p, "GMB_WAIT_MS=20000");
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_run(&b, 0, "gmb");
	ipcfx_open_handle(&b, h, q);
	fprintf(a.in, "pause w\n");
	cr_assert(not(ipcfx_answered(&a, 300)), "the pause waits while the import is open");
	ipcfx_run(&b, 0, "check %s %llu 60", q, 4 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(ipcfx_answered(&a, 5000), "the pause goes on once the importer closed");
	cr_assert(eq(i32, ipcfx_answer(&a), 0));
	cr_assert(eq(i64, ipcfx_used(&b), 0), "paused: the memory is back");
	ipcfx_run(&a, 0, "resume w");
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, a_pause_that_waits_too_long_fails_and_the_tag_stays_active)
{
	struct worker a, b;
	char p[32], q[32], h[160], log[1 << 16];
	struct timespec t0;
	size_t n;
	FILE *lf;

	ipcfx_exporter_env(&a, 4 * MiB, 0x3c, p, "GMB_WAIT_MS=300");
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert(eq(i32, ipcfx_run_rc(&a, "pause %s", "w"), -EBUSY));
	cr_assert(ge(dbl, ipcfx_ms_since(&t0), 290.0), "it waited its 300 ms first");
	/* Active and mapped again, the bytes there, on both sides. */
	ipcfx_run(&a, 0, "check %s %llu 60", p, 4 * MiB);
	ipcfx_run(&a, 0, "fill %s %llu 61", p, 1 * MiB);
	ipcfx_run(&b, 0, "check %s %llu 61", q, 1 * MiB);
	lf = fopen(ipcfx_gmbd.log, "r");
	cr_assert(not(eq(ptr, lf, NULL)));
	n = fread(log, 1, sizeof(log) - 1, lf);
	log[n] = 0;
	fclose(lf);
	cr_assert(not(eq(ptr, strstr(log, "has allocation"), NULL)), "the importer is named");
	cr_assert(not(eq(ptr, strstr(log, "waited 3"), NULL)), "and how long it waited");
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "pause w");
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, an_import_of_more_chunks_than_one_packet_carries)
{
	static const char *const args[] = { "--host-devices",
					    "1",
					    "--host-memory",
					    "64MiB",
					    "--host-granularity",
					    "64KiB",
					    "--max-chunk",
					    "64KiB",
					    "--log-level",
					    "warning",
					    NULL };
	struct worker a, b;
	char p[32], q[32], h[160], tail[32];
	const size_t size = 300 * 64 * 1024; /* 300 chunks: two parts of fds */

	cr_assert(eq(i32, gmbd_stop(&ipcfx_gmbd), 0));
	cr_assert(eq(i32, gmbd_start_shared(&ipcfx_gmbd, args), 0));
	ipcfx_exporter(&a, size, 0x0f, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_run(&b, 0, "gmb");
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "check %s %zu 15", q, size);
	snprintf(tail, sizeof(tail), "%#llx", (unsigned long long)(ipcfx_addr(q) + size - 65536));
	ipcfx_run(&b, 0, "fill %s 65536 9", tail);
	snprintf(tail, sizeof(tail), "%#llx", (unsigned long long)(ipcfx_addr(p) + size - 65536));
	ipcfx_run(&a, 0, "check %s 65536 9", tail);
	/* An imported pointer is not the runtime's to free, nor gmbd's: the runtime says no. */
	cr_assert(eq(i32, ipcfx_run_rc(&b, "free %s", q), (int)cudaErrorInvalidValue));
	ipcfx_run(&b, 0, "check %s 65536 15", q);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, ipcfx_used(&b), 0));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

/* gmbctl watch --json, read until a needle shows (test_observe does the same). */
struct watcher {
	pid_t pid;
	int out;
	char buf[1 << 16];
	size_t len;
};

static void watch_start(struct watcher *c)
{
	char bin[PATH_MAX + 16];
	int p[2];

	snprintf(bin, sizeof(bin), "%s/gmbctl", ipcfx_build);
	cr_assert(pipe(p) == 0);
	c->len = 0;
	c->pid = fork();
	cr_assert(c->pid >= 0);
	if (c->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(p[1], 1);
		close(p[0]);
		close(p[1]);
		execl(bin, bin, "-s", ipcfx_gmbd.sock, "watch", "--json", (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	c->out = p[0];
}

static int watch_wait(struct watcher *c, const char *needle, int ms)
{
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct pollfd pf = { .fd = c->out, .events = POLLIN };
		double spent;
		ssize_t n;

		c->buf[c->len] = '\0';
		if (strstr(c->buf, needle))
			return 0;
		spent = ipcfx_ms_since(&t0);
		if (spent >= ms || poll(&pf, 1, ms - (int)spent) <= 0)
			return -ETIMEDOUT;
		n = read(c->out, c->buf + c->len, sizeof(c->buf) - 1 - c->len);
		if (n <= 0)
			return -EPIPE;
		c->len += (size_t)n;
	}
}

Test(ipc, watch_shows_who_imported_whose_allocation)
{
	struct watcher c;
	struct worker a, b;
	char p[32], q[32], h[160];

	watch_start(&c);
	cr_assert(eq(i32, watch_wait(&c, "\"kind\":\"subscribed\"", 10000), 0), "%s", c.buf);
	ipcfx_exporter(&a, 2 * MiB, 0x01, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(eq(i32, watch_wait(&c, "\"kind\":\"import\",", 5000), 0), "%s", c.buf);
	cr_assert(eq(i32, watch_wait(&c, "\"kind\":\"import_close\",", 5000), 0), "%s", c.buf);
	cr_assert(eq(i32,
		     watch_wait(&c, "\"detail\":\"allocation 1 of client 'prog_preload-", 5000), 0),
		  "%s", c.buf);
	cr_assert(eq(i32, watch_wait(&c, "\"bytes\":2097152", 5000), 0), "%s", c.buf);
	kill(c.pid, SIGTERM);
	waitpid(c.pid, NULL, 0);
	close(c.out);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, status_shows_who_imported_whose_allocation)
{
	static char out[1 << 16];
	struct worker a, b;
	char p[32], q[32], h[160], want[256];

	ipcfx_exporter(&a, 4 * MiB, 0x01, p);
	ipcfx_get_handle(&a, p, h);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	ipcfx_ctl_status(true, out, sizeof(out));
	snprintf(want, sizeof(want),
		 "\"importer_pid\":%d,\"owner_id\":1,\"owner\":\"prog_preload-%d\"", (int)b.pid,
		 (int)a.pid);
	cr_assert(not(eq(ptr, strstr(out, want), NULL)), "%s", out);
	cr_assert(
		not(eq(ptr,
		       strstr(out,
			      "\"alloc_id\":1,\"device\":0,\"bytes\":4194304,\"opens\":1,"
			      "\"owner_freed\":false,\"mapped\":true,\"idle\":false}],\"imports_total\":1,"),
		       NULL)),
		"%s", out);
	/* The owner frees: the import is kept, and says so. */
	ipcfx_run(&a, 0, "free %s", p);
	ipcfx_ctl_status(false, out, sizeof(out));
	cr_assert(not(eq(ptr, strstr(out, "IMPORTED BY"), NULL)), "%s", out);
	snprintf(want, sizeof(want), "#1 prog_preload-%d", (int)a.pid);
	cr_assert(not(eq(ptr, strstr(out, want), NULL)), "%s", out);
	cr_assert(not(eq(ptr, strstr(out, "4.0 MiB      1  freed    yes\n"), NULL)), "%s", out);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_ctl_status(true, out, sizeof(out));
	cr_assert(not(eq(ptr, strstr(out, "\"imports\":[],\"imports_total\":0,"), NULL)), "%s",
		  out);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc, a_closed_imports_range_serves_the_next_import_of_its_size)
{
	struct worker a, b;
	char p[32], p2[32], q[32], q2[32], h[160], h2[160];

	ipcfx_exporter(&a, 4 * MiB, 0x19, p);
	snprintf(p2, sizeof(p2), "%s", ipcfx_run(&a, 0, "malloc %llu", 4 * MiB));
	ipcfx_run(&a, 0, "fill %s %llu 20", p2, 4 * MiB);
	ipcfx_get_handle(&a, p, h);
	ipcfx_get_handle(&a, p2, h2);
	ipcfx_prog(&b, 0);
	ipcfx_open_handle(&b, h, q);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	/* Another allocation of the same size: mapped where the last one was. */
	ipcfx_open_handle(&b, h2, q2);
	cr_assert(eq(str, q, q2), "the range was kept for it");
	ipcfx_run(&b, 0, "check %s %llu 20", q2, 4 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q2);
	ipcfx_open_handle(&b, h, q2);
	ipcfx_run(&b, 0, "check %s %llu 25", q2, 4 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q2);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}
