/*
 * test_pack.c - packing (client/lib/mem/pack.c) against a real gmbd (host
 * backend): small allocations share one of gmbd's, keep their addresses
 * and bytes across pause and resume, give the pack back with their last
 * piece, and fall back to a pack of their own size past the budget without
 * waiting; what is not packed by default, and misuse refused.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "include/gmb.h"
#include "tests/util.h"

#define MiB (1ULL << 20)

static struct gmbd_proc gmbd;

static void daemon_start_with(const char *memory, const char *max_chunk)
{
	const char *const args[] = { "--host-memory", memory,	 "--max-chunk", max_chunk,
				     "--log-level",   "warning", NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void daemon_start(void)
{
	daemon_start_with("1GiB", "256MiB");
}

static void daemon_start_small(void)
{
	daemon_start_with("80MiB", "256MiB");
}

static void daemon_start_small_chunks(void)
{
	daemon_start_with("1GiB", "8MiB");
}

static void daemon_stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(pack, .init = daemon_start, .fini = daemon_stop, .timeout = 60);

static gmb_client *connect_pack(const char *name, int pack)
{
	gmb_client *c = NULL;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, name, &c), 0), "%s", gmb_last_error(NULL));
	cr_assert(eq(i32, gmb_set_pack(c, pack), 0));
	return c;
}

/* gmbd's used bytes on device 0, and the client's allocations as gmbd counts them. */
static int64_t used_bytes(gmb_client *c)
{
	char *json = NULL;
	int64_t v;

	cr_assert(eq(i32, gmb_status_json(c, &json), 0), "%s", gmb_last_error(c));
	v = json_i64(json, "used_bytes");
	free(json);
	return v;
}

Test(pack, small_allocations_share_one_of_gmbds_and_keep_addresses_and_bytes)
{
	gmb_client *c = connect_pack("pack", GMB_PACK_ALL);
	unsigned char *p[10];

	cr_assert(eq(i32, gmb_tag_set_mode(c, "t", GMB_MODE_PRESERVE), 0));
	for (int i = 0; i < 10; i++) {
		cr_assert(eq(i32, gmb_malloc(c, (void **)&p[i], 2 * MiB, 0, "t"), 0), "%s",
			  gmb_last_error(c));
		memset(p[i], 0x40 + i, 2 * MiB);
		cr_assert(gmb_owns(c, p[i]));
	}
	for (int i = 1; i < 10; i++)
		cr_assert(eq(ptr, p[i], p[i - 1] + 2 * MiB), "pieces back to back in one pack");
	cr_assert(eq(i64, used_bytes(c), (int64_t)(64 * MiB)), "one 64 MiB pack lent");
	cr_assert(eq(i32, gmb_pause(c, "t"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i64, used_bytes(c), 0));
	cr_assert(eq(i32, gmb_resume(c, "t"), 0), "%s", gmb_last_error(c));
	for (int i = 0; i < 10; i++)
		cr_assert(p[i][0] == 0x40 + i && p[i][2 * MiB - 1] == 0x40 + i,
			  "piece %d's bytes after resume", i);
	for (int i = 0; i < 10; i++)
		cr_assert(eq(i32, gmb_free(c, p[i]), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i64, used_bytes(c), 0), "the last piece gave the pack back");
	gmb_close(c);
}

Test(pack, a_freed_piece_leaves_room_the_next_one_takes)
{
	gmb_client *c = connect_pack("room", GMB_PACK_ALL);
	void *a, *b, *d, *e;

	cr_assert(eq(i32, gmb_malloc(c, &a, 4 * MiB, 0, "r"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, &b, 4 * MiB, 0, "r"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_free(c, a), 0), "%s", gmb_last_error(c));
	cr_assert(not(gmb_owns(c, a)), "a freed piece is no allocation");
	cr_assert(eq(i64, used_bytes(c), (int64_t)(64 * MiB)), "b keeps the pack");
	cr_assert(eq(i32, gmb_malloc(c, &d, 2 * MiB, 0, "r"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(ptr, d, a), "the first gap that fits");
	cr_assert(eq(i32, gmb_malloc(c, &e, 4 * MiB, 0, "r"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(ptr, e, (char *)b + 4 * MiB), "too big for the 2 MiB left before b");
	cr_assert(eq(i32, gmb_free(c, b), 0));
	cr_assert(eq(i32, gmb_free(c, d), 0));
	cr_assert(eq(i32, gmb_free(c, e), 0));
	cr_assert(eq(i64, used_bytes(c), 0));
	gmb_close(c);
}

Test(pack, packs_grow_with_the_tag_and_stop_at_their_bound)
{
	gmb_client *c = connect_pack("grow", GMB_PACK_ALL);
	void *p[64];
	int n = 0;

	/* 20 MiB pieces, as PyTorch's segments: packs of whole pieces, 3 in 60 MiB,
	 * 3 in 60, 6 in 120, then 12 in 240 (256 at most). */
	for (; n < 40; n++)
		cr_assert(eq(i32, gmb_malloc(c, &p[n], 20 * MiB, 0, "g"), 0), "%s",
			  gmb_last_error(c));
	cr_assert(eq(i64, used_bytes(c), (int64_t)((60 + 60 + 120 + 3 * 240) * MiB)),
		  "40 x 20 MiB in six packs");
	for (int i = 0; i < n; i++)
		cr_assert(eq(i32, gmb_free(c, p[i]), 0));
	cr_assert(eq(i64, used_bytes(c), 0));
	gmb_close(c);
}

Test(pack, plain_allocations_are_not_packed_by_default_the_hooks_are)
{
	gmb_client *c = NULL;
	void *a, *b, *h1, *h2;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, "dflt", &c), 0), "%s", gmb_last_error(NULL));
	cr_assert(eq(i32, gmb_malloc(c, &a, 2 * MiB, 0, "d"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, &b, 2 * MiB, 0, "d"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i64, used_bytes(c), (int64_t)(4 * MiB)), "gmb_malloc: what was asked");
	cr_assert(eq(i32, gmb_region_begin("h", GMB_MODE_DISCARD), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, &h1, 2 * MiB, 0), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_malloc(c, &h2, 2 * MiB, 0), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(ptr, h2, (char *)h1 + 2 * MiB), "the hooks' allocations are packed");
	cr_assert(eq(i64, used_bytes(c), (int64_t)(68 * MiB)));
	cr_assert(eq(i32, gmb_set_pack(c, GMB_PACK_OFF), 0));
	cr_assert(eq(i32, gmb_region_begin("h", GMB_MODE_DISCARD), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, &a, 2 * MiB, 0), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i64, used_bytes(c), (int64_t)(70 * MiB)), "off: not even the hooks'");
	cr_assert(eq(i32, gmb_set_pack(c, 3), -EINVAL));
	gmb_close(c);
}

/* Named objects' buffers come from gmb_malloc_peers(): exact, so publishable. */
Test(pack, gmb_malloc_peers_is_never_packed_and_publishes)
{
	gmb_client *c = connect_pack("peers", GMB_PACK_ALL);
	void *a, *b;

	cr_assert(eq(i32, gmb_malloc_peers(c, &a, 2 * MiB, 0, "o", 0), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc_peers(c, &b, 2 * MiB, 0, "o", 0), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i64, used_bytes(c), (int64_t)(4 * MiB)), "what was asked, even under ALL");
	memset(a, 0x5c, 2 * MiB);
	cr_assert(eq(i32, gmb_object_publish(c, "peers-obj", a, NULL, 0, NULL), 0), "%s",
		  gmb_last_error(c));
	cr_assert(eq(i32, gmb_object_close(c, a), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_object_drop(c, "peers-obj", 0), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_free(c, b), 0));
	gmb_close(c);
}

Test(pack, a_pack_is_never_the_applications_pointer)
{
	gmb_client *c = connect_pack("misuse", GMB_PACK_ALL);
	void *a, *b, *base;

	cr_assert(eq(i32, gmb_malloc(c, &a, 2 * MiB, 0, "m"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, &b, 2 * MiB, 0, "m"), 0), "%s", gmb_last_error(c));
	base = a; /* the pack's base too */
	cr_assert(eq(i32, gmb_object_publish(c, "x", b, NULL, 0, NULL), -EINVAL),
		  "a piece cannot be given away");
	cr_assert(not(eq(ptr, strstr(gmb_last_error(c), "shares a mapping"), NULL)), "%s",
		  gmb_last_error(c));
	cr_assert(eq(i32, gmb_free(c, a), 0));
	cr_assert(eq(i32, gmb_free(c, base), -EINVAL), "the pack's base once its piece is gone");
	cr_assert(not(gmb_owns(c, base)));
	memset(b, 0x11, 2 * MiB); /* b still mapped: the pack lives */
	cr_assert(eq(i32, gmb_free(c, b), 0));
	cr_assert(eq(i32, gmb_free(c, b), -EINVAL), "twice");
	gmb_close(c);
}

Test(pack, a_malformed_GMB_PACK_refuses_the_connect)
{
	gmb_client *c = NULL;

	setenv("GMB_PACK", "sometimes", 1);
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "env", &c), -EINVAL));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(NULL), "GMB_PACK"), NULL)), "%s",
		  gmb_last_error(NULL));
	setenv("GMB_PACK", "all", 1);
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "env", &c), 0), "%s", gmb_last_error(NULL));
	unsetenv("GMB_PACK");
	void *a, *b;
	cr_assert(eq(i32, gmb_malloc(c, &a, 2 * MiB, 0, "e"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, &b, 2 * MiB, 0, "e"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(ptr, b, (char *)a + 2 * MiB), "GMB_PACK=all packs gmb_malloc's");
	gmb_close(c);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 80 MiB: a second 64 MiB pack does not fit, a 2 MiB one does, at once. */
Test(pack, past_the_budget_a_piece_gets_a_pack_of_its_size_without_waiting,
     .init = daemon_start_small)
{
	gmb_client *c = connect_pack("budget", GMB_PACK_ALL);
	void *big[4], *p;
	double t;

	cr_assert(eq(i32, gmb_set_wait(c, 5000), 0));
	for (int i = 0; i < 4; i++) /* the first pack, full */
		cr_assert(eq(i32, gmb_malloc(c, &big[i], 16 * MiB, 0, "b"), 0), "%s",
			  gmb_last_error(c));
	cr_assert(eq(i64, used_bytes(c), (int64_t)(64 * MiB)));
	t = now_s();
	cr_assert(eq(i32, gmb_malloc(c, &p, 2 * MiB, 0, "b"), 0), "%s", gmb_last_error(c));
	cr_assert(lt(dbl, now_s() - t, 2.0), "the bigger pack was not waited for");
	cr_assert(eq(i64, used_bytes(c), (int64_t)(66 * MiB)), "a pack of the piece's size");
	memset(p, 0x22, 2 * MiB);
	cr_assert(eq(i32, gmb_free(c, p), 0));
	for (int i = 0; i < 4; i++)
		cr_assert(eq(i32, gmb_free(c, big[i]), 0));
	cr_assert(eq(i64, used_bytes(c), 0));
	gmb_close(c);
}

/* A pack is one chunk: bounded by gmbd's --max-chunk, and not made where two pieces do not fit. */
Test(pack, packs_are_one_chunk_at_most, .init = daemon_start_small_chunks)
{
	gmb_client *c = connect_pack("chunks", GMB_PACK_ALL);
	void *p[5], *big;

	for (int i = 0; i < 5; i++)
		cr_assert(eq(i32, gmb_malloc(c, &p[i], 2 * MiB, 0, "k"), 0), "%s",
			  gmb_last_error(c));
	cr_assert(eq(ptr, p[3], (char *)p[0] + 6 * MiB), "four in the first 8 MiB pack");
	cr_assert(eq(i64, used_bytes(c), (int64_t)(16 * MiB)), "two packs of 8 MiB");
	cr_assert(eq(i32, gmb_malloc(c, &big, 6 * MiB, 0, "k"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i64, used_bytes(c), (int64_t)(22 * MiB)), "6 MiB: two would not fit a chunk");
	cr_assert(eq(i32, gmb_free(c, big), 0));
	for (int i = 0; i < 5; i++)
		cr_assert(eq(i32, gmb_free(c, p[i]), 0));
	cr_assert(eq(i64, used_bytes(c), 0));
	gmb_close(c);
}
