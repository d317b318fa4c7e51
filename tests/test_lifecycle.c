/*
 * test_lifecycle.c - a real gmbd (host backend) and real client processes:
 * fixed addresses over many cycles, the three tag modes, two clients taking
 * turns within one budget, and memory coming back from a killed client.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/util.h"

#define MiB (1024ULL * 1024)

static struct gmbd_proc gmbd;

/* Small sizes: first touch of host memory is slow in CI sandboxes. */
static void start_small(void)
{
	static const char *const args[] = { "--host-memory", "256MiB", "--log-level", "warning",
					    NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(lifecycle, .init = start_small, .fini = stop, .timeout = 60);

/* Reads our own /proc/self/maps: the permissions of the mapping holding @p. */
static void maps_perms(const void *p, char perms[5])
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];

	strcpy(perms, "none");
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char pr[5];

		if (sscanf(line, "%lx-%lx %4s", &lo, &hi, pr) == 3 && (uintptr_t)p >= lo &&
		    (uintptr_t)p < hi) {
			memcpy(perms, pr, 5);
			break;
		}
	}
	if (f)
		fclose(f);
}

static int64_t used_bytes(gmb_client *c)
{
	char *json = NULL;
	int64_t v;

	if (gmb_status_json(c, &json))
		return -1;
	v = json_i64(json, "used_bytes");
	free(json);
	return v;
}

Test(lifecycle, preserve_keeps_address_and_bytes_over_100_cycles)
{
	const size_t size = 6 * MiB + 123;
	gmb_client *c;
	unsigned char *p;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "cycler", &c), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "weights", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, size, 0, "weights"), 0));
	for (size_t i = 0; i < size; i++)
		p[i] = (unsigned char)(i * 7);
	cr_assert(eq(i64, used_bytes(c), (int64_t)(8 * MiB)), "rounded to the granularity");
	for (int round = 0; round < 100; round++) {
		char perms[5];

		cr_assert(eq(i32, gmb_pause(c, "weights"), 0), "pause %d: %s", round,
			  gmb_last_error(c));
		maps_perms(p, perms);
		cr_assert(eq(str, perms, "---p"), "paused range stays reserved, inaccessible");
		cr_assert(eq(i64, used_bytes(c), 0), "paused memory is back in the pool");
		cr_assert(eq(i32, gmb_resume(c, "weights"), 0), "resume %d: %s", round,
			  gmb_last_error(c));
		maps_perms(p, perms);
		cr_assert(eq(str, perms, "rw-s"));
		p[round] = (unsigned char)(round * 7 + 1); /* a write must survive the next cycle */
		for (size_t i = 0; i < size; i++) {
			unsigned char want =
				(unsigned char)(i * 7 + (i <= (size_t)round && i < 100));

			if (p[i] != want) {
				cr_fatal("round %d: byte %zu is %u, want %u", round, i, p[i], want);
			}
		}
	}
	cr_assert(eq(i32, gmb_free(c, p), 0));
	cr_assert(eq(i64, used_bytes(c), 0));
	gmb_close(c);
}

Test(lifecycle, zero_mode_reads_zero_and_discard_mode_is_usable)
{
	gmb_client *c;
	unsigned char *z, *d;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "modes", &c), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "z", GMB_MODE_ZERO), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&z, 4 * MiB, 0, "z"), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&d, 4 * MiB, 0, "kv"), 0));
	memset(z, 0xab, 4 * MiB);
	memset(d, 0xcd, 4 * MiB);
	cr_assert(eq(i32, gmb_pause(c, NULL), 0));
	cr_assert(eq(i32, gmb_pause(c, NULL), 0), "pausing a paused client is a no-op");
	cr_assert(eq(i32, gmb_resume(c, NULL), 0));
	cr_assert(eq(i32, gmb_resume(c, "z"), 0), "resuming an active tag is a no-op");
	for (size_t i = 0; i < 4 * MiB; i++)
		if (z[i]) {
			cr_fatal("zero tag byte %zu is %u", i, z[i]);
		}
	memset(d, 0x11, 4 * MiB);
	cr_assert(eq(u8, d[4 * MiB - 1], 0x11), "discard tag is mapped writable again");
	cr_assert(eq(i32, gmb_tag_set_mode(c, "z", 7), -EINVAL));
	gmb_close(c);
}

Test(lifecycle, paused_tag_refuses_allocation_and_frees_work)
{
	gmb_client *c;
	void *p, *q;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "pf", &c), 0));
	cr_assert(eq(i32, gmb_malloc(c, &p, 2 * MiB, 0, "t"), 0));
	cr_assert(eq(i32, gmb_pause(c, "t"), 0));
	cr_assert(eq(i32, gmb_malloc(c, &q, 2 * MiB, 0, "t"), -EBUSY));
	cr_assert(eq(i32, gmb_free(c, p), 0), "free of a paused allocation");
	cr_assert(eq(i32, gmb_free(c, p), -EINVAL), "double free is refused");
	cr_assert(eq(i32, gmb_resume(c, "t"), 0));
	cr_assert(eq(i32, gmb_pause(c, "nosuchtag"), -ENOENT));
	cr_assert(eq(i32, gmb_malloc(c, &q, 0, 0, "t"), -EINVAL), "zero size");
	cr_assert(ne(i32, gmb_malloc(c, &q, 1ULL << 50, 0, "t"), 0), "huge size");
	cr_assert(eq(i32, gmb_malloc(c, &q, 2 * MiB, 5, "t"), -ENODEV), "no device 5");
	gmb_close(c);
}

Test(lifecycle, two_clients_alternate_within_one_budget)
{
	struct worker a, b;
	char text[4096], addr_a[64], addr_b[64];

	cr_assert(eq(i32, worker_start(&a, gmbd.sock), 0));
	cr_assert(eq(i32, worker_start(&b, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "connect trainer"), 0));
	cr_assert(eq(i32, worker_cmd(&b, NULL, 0, "connect infer"), 0));
	cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "mode w preserve"), 0));
	cr_assert(eq(i32, worker_cmd(&b, NULL, 0, "mode w preserve"), 0));
	cr_assert(eq(i32, worker_cmd(&a, addr_a, sizeof(addr_a), "malloc w %llu", 160 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "fill w 0xa1"), 0));
	cr_assert(eq(i32, worker_cmd(&b, text, sizeof(text), "malloc w %llu", 160 * MiB), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(text, "trainer"), NULL)), "the refusal names the holder: %s",
		  text);
	cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "pause w"), 0));
	cr_assert(eq(i32, worker_cmd(&b, addr_b, sizeof(addr_b), "malloc w %llu", 160 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&b, NULL, 0, "fill w 0xb2"), 0));
	for (int round = 0; round < 5; round++) {
		cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "resume w"), -ENOMEM),
			  "B holds the budget");
		cr_assert(eq(i32, worker_cmd(&b, NULL, 0, "pause w"), 0));
		cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "resume w"), 0));
		cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "check w 0xa1"), 0), "round %d", round);
		cr_assert(eq(i32, worker_cmd(&a, text, sizeof(text), "addr w"), 0));
		cr_assert(eq(str, text, addr_a), "A's address is fixed");
		cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "pause w"), 0));
		cr_assert(eq(i32, worker_cmd(&b, NULL, 0, "resume w"), 0));
		cr_assert(eq(i32, worker_cmd(&b, NULL, 0, "check w 0xb2"), 0), "round %d", round);
		cr_assert(eq(i32, worker_cmd(&b, text, sizeof(text), "addr w"), 0));
		cr_assert(eq(str, text, addr_b), "B's address is fixed");
	}
	cr_assert(eq(i32, worker_quit(&a), 0));
	cr_assert(eq(i32, worker_quit(&b), 0));
}

struct used_probe {
	gmb_client *c;
	int64_t want;
};

static int used_is(void *arg)
{
	struct used_probe *u = arg;

	return used_bytes(u->c) == u->want;
}

Test(lifecycle, killed_client_memory_returns_within_one_second)
{
	struct worker w;
	struct used_probe probe = { .want = 0 };
	char text[256];

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "observer", &probe.c), 0));
	cr_assert(eq(i32, worker_start(&w, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "connect victim"), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "malloc a %llu", 100 * MiB), 0), "%s",
		  text);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc b %llu", 64 * MiB), 0));
	cr_assert(eq(i64, used_bytes(probe.c), (int64_t)(164 * MiB)));
	worker_kill(&w);
	cr_assert(eq(i32, wait_until(used_is, &probe, 1000), 0), "still lent after 1 s");
	/* And the memory is usable again: the whole budget fits. */
	void *p;

	cr_assert(eq(i32, gmb_malloc(probe.c, &p, 256 * MiB, 0, "all"), 0), "%s",
		  gmb_last_error(probe.c));
	gmb_close(probe.c);
}
