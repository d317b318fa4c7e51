/*
 * test_load.c - 64 clients in one process, 10,000 mixed operations each
 * (tests/loadgen.c: alloc, free, pause, resume, status), against one real
 * gmbd. Every call must succeed, every preserved byte come back, gmbd's fd
 * count return to where it started, nothing lent once the clients left,
 * and gmbd exit cleanly (under ASan: no leak). The plain build runs 2,000
 * operations per client (the full count is the sanitizer build's, where
 * leaks and races would show). GMB_LOAD_OPS and GMB_LOAD_CLIENTS change the
 * counts, GMB_LOAD_SEED the mix.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdlib.h>
#include <time.h>

#include "include/gmb.h"
#include "tests/loadgen.h"
#include "tests/util.h"

#if defined(__SANITIZE_ADDRESS__)
#define LOAD_OPS 10000
#else
#define LOAD_OPS 2000
#endif

static struct gmbd_proc gmbd;

static int fds_at_start;

/* At most as many as at the start: the baseline may still count the
 * probe's session, which gmbd closes on its next loop turn. */
static int fds_back(void *arg)
{
	return proc_count_fds(gmbd.pid) <= fds_at_start;
}

static unsigned env_count(const char *name, unsigned dflt)
{
	const char *v = getenv(name);

	return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

Test(load, sixty_four_clients_of_mixed_operations, .timeout = 300)
{
	/* 64 x 4 x 2 MiB at most, kept warm; trimmed at the end, so that fd
	 * counts compare exactly. */
	static const char *const args[] = { "--host-memory", "1GiB", "--log-level", "err", NULL };
	uint64_t released, pending;
	struct loadgen g = { .clients = env_count("GMB_LOAD_CLIENTS", 64),
			     .ops = env_count("GMB_LOAD_OPS", LOAD_OPS),
			     .seed = env_count("GMB_LOAD_SEED", (unsigned)time(NULL)) };
	struct timespec t0, t1;
	gmb_client *probe;
	char *json = NULL;
	int rc;

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
	g.sock = gmbd.sock;
	/* The baseline once gmbd has served a client: its start is over. */
	cr_assert(eq(i32, gmb_connect_flags(gmbd.sock, "probe", GMB_CONNECT_TOOL, &probe), 0));
	cr_assert(eq(i32, gmb_status_json(probe, &json), 0));
	free(json);
	gmb_close(probe);
	fds_at_start = proc_count_fds(gmbd.pid);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = loadgen_run(&g);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_log_info("load: %u clients x %u operations, seed %u: %llu done in %.1f s, %llu failed",
		    g.clients, g.ops, g.seed, (unsigned long long)g.done,
		    (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
		    (unsigned long long)g.failed);
	cr_expect(eq(i32, rc, 0), "seed %u: %llu calls failed (first: %s), %llu words wrong",
		  g.seed, (unsigned long long)g.failed, g.first_error,
		  (unsigned long long)g.bad_bytes);
	/* Each operation is one call; the clean-up at the end makes more. */
	cr_expect(ge(u64, g.done, (uint64_t)g.clients * g.ops));
	cr_assert(eq(i32, gmb_connect_flags(gmbd.sock, "probe", GMB_CONNECT_TOOL, &probe), 0));
	cr_expect(eq(i32, gmb_trim(probe, -1, &released, &pending), 0), "%s",
		  gmb_last_error(probe));
	cr_expect(eq(u64, pending, 0), "chunks still held by clients that left");
	cr_assert(eq(i32, gmb_status_json(probe, &json), 0));
	cr_expect(eq(i64, json_i64(json, "used_bytes"), 0), "%s", json);
	cr_expect(eq(i64, json_i64(json, "pool_bytes"), 0), "%s", json);
	free(json);
	gmb_close(probe);
	cr_expect(eq(i32, wait_until(fds_back, NULL, 5000), 0), "gmbd has %d fds, %d at start",
		  proc_count_fds(gmbd.pid), fds_at_start);
	cr_expect(eq(i32, test_leak_check(), 0), "this process leaked");
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly (leak or crash)");
}
