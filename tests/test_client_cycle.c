/*
 * test_client_cycle.c - libgmb's pause, resume and free against a real
 * gmbd (host backend, two simulated devices): how often they drain a device
 * (each drain waits for the application's whole queue on a GPU: once per
 * operation and device is enough), and allocations with access for peers.
 * The client runs in this process, so the host backend's drain counter is
 * the client's own.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <string.h>

#include "common/backend/backend.h"
#include "include/gmb.h"
#include "tests/util.h"

#define MiB (1ULL << 20)

static struct gmbd_proc gmbd;

static void daemon_start(void)
{
	static const char *const args[] = { "--host-devices", "2",	     "--host-memory",
					    "64MiB",	      "--max-chunk", "4MiB",
					    "--log-level",    "warning",     NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void daemon_stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(client_cycle, .init = daemon_start, .fini = daemon_stop, .timeout = 60);

static gmb_client *connect_as(const char *name)
{
	gmb_client *c = NULL;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, name, &c), 0), "%s", gmb_last_error(NULL));
	return c;
}

/* Drains made by @call. */
#define SYNCS(call)                                                             \
	({                                                                      \
		uint64_t n_ = backend_host_sync_count();                        \
		int rc_ = (call);                                               \
		cr_assert(eq(i32, rc_, 0), "%s: %s", #call, gmb_last_error(c)); \
		backend_host_sync_count() - n_;                                 \
	})

Test(client_cycle, a_pause_drains_each_device_once_whatever_the_modes)
{
	gmb_client *c = connect_as("syncs");
	void *d0, *d1, *p0;

	cr_assert(eq(i32, gmb_malloc(c, &d0, 4 * MiB, 0, "d"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, &d1, 4 * MiB, 1, "d"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(u64, SYNCS(gmb_pause(c, "d")), 2), "discard only, two devices");
	cr_assert(eq(u64, SYNCS(gmb_resume(c, "d")), 2));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "p", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_malloc(c, &p0, 4 * MiB, 0, "p"), 0), "%s", gmb_last_error(c));
	memset(p0, 0x3c, 4 * MiB);
	cr_assert(eq(u64, SYNCS(gmb_pause(c, "p")), 1), "a preserved tag: copies are waited for, "
							"not drained again");
	cr_assert(eq(u64, SYNCS(gmb_resume(c, "p")), 1));
	cr_assert(eq(i32, ((unsigned char *)p0)[4 * MiB - 1], 0x3c));
	cr_assert(eq(u64, SYNCS(gmb_pause(c, NULL)), 2), "everything, two devices");
	cr_assert(eq(u64, SYNCS(gmb_pause(c, NULL)), 0), "nothing active: nothing to drain");
	cr_assert(eq(u64, SYNCS(gmb_resume(c, NULL)), 2));
	gmb_close(c);
}

Test(client_cycle, a_free_drains_once_and_a_paused_one_not_at_all)
{
	gmb_client *c = connect_as("free-syncs");
	void *a, *b;

	cr_assert(eq(i32, gmb_malloc(c, &a, 4 * MiB, 1, "f"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, &b, 4 * MiB, 1, "g"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(u64, SYNCS(gmb_free(c, a)), 1));
	cr_assert(eq(i32, gmb_pause(c, "g"), 0));
	cr_assert(eq(u64, SYNCS(gmb_free(c, b)), 0), "unmapped already");
	gmb_close(c);
}

Test(client_cycle, peers_get_access_now_and_after_every_resume)
{
	gmb_client *c = connect_as("peers");
	unsigned char *p, buf[64];
	void *q;

	cr_assert(eq(i32, gmb_tag_set_mode(c, "kv", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_malloc_peers(c, (void **)&p, 6 * MiB, 0, "kv", 1ULL << 1), 0), "%s",
		  gmb_last_error(c));
	memset(p, 0x5e, 6 * MiB);
	for (int round = 0; round < 3; round++) {
		cr_assert(eq(i32, gmb_pause(c, "kv"), 0), "%s", gmb_last_error(c));
		cr_assert(eq(i32, gmb_resume(c, "kv"), 0), "%s", gmb_last_error(c));
		cr_assert(eq(i32, p[6 * MiB - 1], 0x5e), "round %d", round);
		p[round] = (unsigned char)round;
	}
	/* The owner's own bit is no peer; peers that are no device are refused. */
	cr_assert(eq(i32, gmb_malloc_peers(c, &q, MiB, 1, "kv", 1ULL << 1), 0), "%s",
		  gmb_last_error(c));
	cr_assert(eq(i32, gmb_free(c, q), 0));
	cr_assert(eq(i32, gmb_malloc_peers(c, &q, MiB, 0, "kv", 1ULL << 2), -ENODEV));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(c), "peer device 2"), NULL)), "%s",
		  gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc_peers(c, &q, MiB, 0, "kv", 1ULL << 63), -ENODEV));
	memcpy(buf, p, sizeof(buf));
	cr_assert(eq(i32, buf[0], 0));
	cr_assert(eq(i32, gmb_free(c, p), 0));
	gmb_close(c);
}
