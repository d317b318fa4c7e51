/*
 * fuzz_state.c - a restored record under a fuzzer: the input is the packed
 * Gmb__State a previous gmbd left in the fd store (daemon/persist/state.c),
 * restored into a fresh broker over the host backend (2 devices of 32 MiB,
 * 2 MiB granularity) with eight stored chunk fds (ids 1-8: 2 MiB on device
 * 0, 4 MiB on device 1, as their FDNAMEs would say).
 *
 * After each input: the restored broker's counters recomputed; its record
 * encoded, restored into a second broker and encoded again gives the same
 * bytes (a restart of a restart changes nothing); every orphan reclaimed
 * leaves nothing lent; the brokers freed, the process has the fds it had.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/core/broker.h"
#include "daemon/core/object.h"
#include "daemon/core/rejoin.h"
#include "daemon/persist/state.h"
#include "tests/fuzz/fuzz.h"

#define MiB	(1ULL << 20)
#define FS_NFDS 8

static struct state_fd fs_fds[FS_NFDS];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	log_max_level = getenv("GMB_FUZZ_LOG") ? LOG_LVL_DEBUG : LOG_LVL_ERR - 1;
	/* The stored fds live as long as the process, like the manager's. */
	for (int i = 0; i < FS_NFDS; i++) {
		uint64_t size = (i < FS_NFDS / 2 ? 2 : 4) * MiB;
		int fd = memfd_create("gmb-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);

		if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
			fuzz_fail("memfd: %s", strerror(errno));
		fs_fds[i] = (struct state_fd){ .id = (uint64_t)i + 1,
					       .dev = i < FS_NFDS / 2 ? 0 : 1,
					       .size = size,
					       .fd = fd };
	}
	return 0;
}

static struct broker *fs_broker(struct backend *be)
{
	struct broker_opts bo = { .max_chunk = 4 * MiB,
				  .pool_keep = UINT64_MAX,
				  .daemon_uid = geteuid() };
	struct broker *br;

	if (broker_new(be, &bo, &br) < 0)
		fuzz_fail("broker_new");
	return br;
}

static void fs_reclaim_all(struct broker *br)
{
	char err[ERR_MSG_MAX];

	while (br->clients)
		rejoin_reclaim(br, br->clients, "fuzz: not back");
	fuzz_check_broker(br, 1);
	/* Named objects outlive every client: dropped by their owner (root here). */
	while (br->objects && br->objects->objects) {
		struct bobject *o = br->objects->objects;
		struct broker_peer peer = { .pid = 1, .uid = o->uid, .gid = 0 };
		struct bclient *c;
		char name[OBJECT_NAME_MAX + 16];

		if (broker_client_add(br, &peer, "fuzz-dropper", false, false, &c) < 0)
			fuzz_fail("broker_client_add");
		snprintf(name, sizeof(name), "%u/%s", (unsigned)o->uid, o->name);
		if (object_drop(br, c, true, name, 0, err) < 0)
			fuzz_fail("dropping object '%s': %s", name, err);
		broker_client_remove(br, c);
		if (br->objects && br->objects->objects == o)
			fuzz_fail("object '%s' outlived its drop without a reader", name);
	}
	fuzz_check_broker(br, 1);
	for (int d = 0; d < br->ndevices; d++)
		if (br->pools[d].lent_bytes || br->pools[d].pending_bytes)
			fuzz_fail("dev %d: %llu bytes lent after every client was reclaimed", d,
				  (unsigned long long)br->pools[d].lent_bytes);
}

/* Restores @buf into a fresh broker; NULL when the record is refused. */
static struct broker *fs_restore(struct backend *be, const uint8_t *buf, size_t len)
{
	struct broker *br = fs_broker(be);
	struct state_stats stats;

	for (int i = 0; i < FS_NFDS; i++)
		fs_fds[i].used = false;
	if (state_restore(br, buf, len, fs_fds, FS_NFDS, &stats) < 0) {
		fuzz_check_broker(br, 1);
		if (br->nclients || br->chunks.count)
			fuzz_fail("a refused record restored something");
		broker_free(br);
		return NULL;
	}
	fuzz_check_broker(br, 1);
	return br;
}

static void fs_round_trip(struct backend *be, struct broker *br)
{
	uint8_t *one = NULL, *two = NULL;
	size_t len1, len2;
	struct broker *again;

	if (state_encode(br, &one, &len1) < 0)
		fuzz_fail("state_encode of a restored broker");
	again = fs_restore(be, one, len1);
	if (!again)
		fuzz_fail("a record gmbd wrote was refused");
	if (state_encode(again, &two, &len2) < 0)
		fuzz_fail("state_encode of a twice restored broker");
	if (len1 != len2 || memcmp(one, two, len1) != 0)
		fuzz_fail("a restart of a restart changed the record (%zu -> %zu bytes)", len1,
			  len2);
	fs_reclaim_all(again);
	broker_free(again);
	free(one);
	free(two);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct backend_host_opts ho = { .ndevices = 2, .memory = 32 * MiB, .granularity = 2 * MiB };
	int fds_before = fuzz_count_fds();
	struct backend *be;
	struct broker *br;

	if (backend_host_open(&ho, &be) < 0)
		fuzz_fail("backend_host_open");
	br = fs_restore(be, data, size);
	if (br) {
		fs_round_trip(be, br);
		fs_reclaim_all(br);
		broker_free(br);
	}
	backend_close(be);
	if (fuzz_count_fds() != fds_before)
		fuzz_fail("%d fds open after the input, %d before", fuzz_count_fds(), fds_before);
	return 0;
}
