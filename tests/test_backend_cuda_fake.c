/*
 * test_backend_cuda_fake.c - the cuda backend's own logic against a
 * stand-in driver (tests/fake_cuda.c, soname libcuda.so.1, loaded before
 * the backend opens it): device slots a process cannot see, granularity per
 * device, the relaxed capture mode around every drain, and the access
 * descriptors of peer access. Each Criterion test runs in its own process,
 * so each gets a fresh stand-in.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

#include "common/backend/backend.h"
#include "tests/fake_cuda.h"
#include "tests/util.h"

#define MiB (1ULL << 20)

static void *fake;

static void *fake_sym(const char *name)
{
	void *p = dlsym(fake, name);

	cr_assert(not(eq(ptr, p, NULL)), "libfake_cuda.so lacks %s", name);
	return p;
}

/* POSIX: a void * holds a function pointer (dlsym). */
#define FAKE(fn)                              \
	({                                    \
		__typeof__(&fn) f_;           \
		void *p_ = fake_sym(#fn);     \
		memcpy(&f_, &p_, sizeof(f_)); \
		f_;                           \
	})

/* Loads the stand-in with @n devices of granularities @gran. */
static void fake_load(int n, const uint64_t *gran)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/tests/libfake_cuda.so", test_build_dir());
	fake = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	cr_assert(not(eq(ptr, fake, NULL)), "%s: %s", path, dlerror());
	FAKE(fake_cuda_setup)(n, gran);
}

static struct fake_cuda_stats fake_stats(void)
{
	struct fake_cuda_stats st;

	FAKE(fake_cuda_stats)(&st);
	return st;
}

/* The backend with gmbd's devices in the order of @ordinals (-1: a uuid nobody here has). */
static struct backend *open_order(const int *ordinals, int n)
{
	uint8_t uuids[8][16];
	struct backend *b = NULL;
	int rc;

	for (int i = 0; i < n; i++) {
		if (ordinals[i] >= 0)
			FAKE(fake_cuda_uuid)(ordinals[i], uuids[i]);
		else
			memset(uuids[i], 0xee, sizeof(uuids[i]));
	}
	rc = backend_cuda_open_order((const uint8_t(*)[16])uuids, n, &b);
	cr_assert(eq(i32, rc, 0), "open: %s", backend_last_error());
	return b;
}

Test(backend_cuda_fake, the_stand_in_is_the_driver_the_backend_opens)
{
	static const uint64_t gran[] = { 2 * MiB };
	struct backend *b = NULL;

	fake_load(1, gran);
	cr_assert(eq(i32, backend_cuda_open(&b), 0), "%s", backend_last_error());
	cr_assert(eq(i32, strcmp(b->ops->name, "cuda"), 0));
	cr_assert(eq(i32, b->ndevices, 1));
	cr_assert(eq(i32, strcmp(b->devices[0].name, "fake GPU 0"), 0), "%s", b->devices[0].name);
	backend_close(b);
}

/* Slot 0 is a GPU this process cannot see: its handle would read 0, device 0 here. */
Test(backend_cuda_fake, host_memory_never_uses_an_invisible_slot)
{
	static const uint64_t gran[] = { 2 * MiB, 2 * MiB };
	static const int order[] = { -1, 1 };
	struct fake_cuda_stats st;
	void *p = NULL;

	fake_load(2, gran);
	/* The application has a context on its device 0, which is not gmbd's slot 0. */
	FAKE(fake_cuda_set_active)(0);
	struct backend *b = open_order(order, 2);

	cr_assert(eq(i32, b->devices[0].ordinal, -1));
	cr_assert(eq(i32, b->ops->host_alloc(b, 4096, &p), 0), "%s", backend_last_error());
	st = fake_stats();
	cr_assert(eq(i32, st.retains[0], 0), "retained device 0's context through a hole");
	cr_assert(eq(i32, st.retains[1], 1));
	cr_assert(eq(i32, st.host_alloc_dev, 1), "pinned in device %d's context",
		  st.host_alloc_dev);
	b->ops->host_free(b, p, 4096);
	cr_assert(eq(i32, fake_stats().retains[0], 0));
	backend_close(b);
}

Test(backend_cuda_fake, every_operation_refuses_an_invisible_slot)
{
	static const uint64_t gran[] = { 2 * MiB };
	static const int order[] = { -1, 0 };
	uint64_t h = 0;
	uintptr_t va = 0;
	char buf[16];

	fake_load(1, gran);
	struct backend *b = open_order(order, 2);

	cr_assert(eq(i32, b->ops->sync(b, 0), -ENODEV));
	cr_assert(eq(i32, b->ops->wait(b, 0), -ENODEV));
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, 2 * MiB, &h), -ENODEV));
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, buf, 1ULL << 40, sizeof(buf)), -ENODEV));
	cr_assert(eq(i32, b->ops->va_reserve(b, 2 * MiB, 0, &va), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->set_access(b, 0, va, 2 * MiB), -ENODEV));
	cr_assert(eq(i32, b->ops->set_access_peers(b, 1, 1, va, 2 * MiB), -ENODEV),
		  "an invisible peer is refused");
	cr_assert(eq(i32, fake_stats().retains[0], 0));
	/* The visible slot works. */
	cr_assert(eq(i32, b->ops->sync(b, 1), 0), "%s", backend_last_error());
	cr_assert(eq(i32, fake_stats().sync_dev, 0));
	backend_close(b);
}

Test(backend_cuda_fake, no_visible_device_is_enodev_not_device_0)
{
	static const uint64_t gran[] = { 2 * MiB };
	static const int order[] = { -1 };
	uintptr_t va;
	void *p = NULL;

	fake_load(1, gran);
	struct backend *b = open_order(order, 1);

	cr_assert(eq(i32, b->ops->host_alloc(b, 4096, &p), -ENODEV));
	cr_assert(eq(i32, b->ops->va_reserve(b, 2 * MiB, 0, &va), -ENODEV));
	cr_assert(eq(i32, fake_stats().retains[0], 0));
	backend_close(b);
}

/* A 2 MiB GPU next to a 4 MiB one: each checked against its own granularity. */
Test(backend_cuda_fake, chunks_are_checked_against_their_own_device)
{
	static const uint64_t gran[] = { 2 * MiB, 4 * MiB };
	struct backend *b = NULL;
	uintptr_t va = 0;
	uint64_t h;

	fake_load(2, gran);
	cr_assert(eq(i32, backend_cuda_open(&b), 0), "%s", backend_last_error());
	cr_assert(eq(u64, b->devices[0].granularity, 2 * MiB));
	cr_assert(eq(u64, b->devices[1].granularity, 4 * MiB));
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, 2 * MiB, &h), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->chunk_create(b, 1, 2 * MiB, &h), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "0x400000"), NULL)), "%s",
		  backend_last_error());
	cr_assert(eq(i32, b->ops->chunk_create(b, 1, 4 * MiB, &h), 0), "%s", backend_last_error());
	/* The two, and each device's kept exported fd's chunk made by the first (cuda.c). */
	cr_assert(eq(i32, fake_stats().creates, 4));
	/* A range for device 0 at its own granularity. */
	cr_assert(eq(i32, b->ops->va_reserve(b, 2 * MiB, 2 * MiB, &va), 0), "%s",
		  backend_last_error());
	cr_assert(eq(i32, b->ops->map(b, va, 2 * MiB, h), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->set_access(b, 0, va, 2 * MiB), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->set_access(b, 1, va, 2 * MiB), -EINVAL),
		  "device 1's access at 2 MiB");
	cr_assert(eq(i32, b->ops->unmap(b, va, 2 * MiB), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->va_free(b, va, 2 * MiB), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->va_reserve(b, 1 * MiB, 0, &va), -EINVAL));
	backend_close(b);
}

static ino_t fd_inode(int fd)
{
	struct stat st;

	cr_assert(eq(i32, fstat(fd, &st), 0));
	return st.st_ino;
}

/*
 * A chunk is exported once, when it is made; each chunk_export is a dup of
 * that fd (closing a dup is cheap, closing an export's last fd is not), and
 * the release closes it: one fd a live chunk, as chunk_fds says.
 */
Test(backend_cuda_fake, a_chunk_is_exported_once_and_lent_as_dups)
{
	static const uint64_t gran[] = { 2 * MiB };
	struct backend *b = NULL;
	int fd1 = -1, fd2 = -1, before;
	uint64_t h;

	fake_load(1, gran);
	cr_assert(eq(i32, backend_cuda_open(&b), 0), "%s", backend_last_error());
	cr_assert(eq(u32, b->ops->chunk_fds, 1));
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, 2 * MiB, &h), 0), "%s", backend_last_error());
	before = fake_stats().exports;
	cr_assert(eq(i32, b->ops->chunk_export(b, h, &fd1), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->chunk_export(b, h, &fd2), 0), "%s", backend_last_error());
	cr_assert(eq(i32, fake_stats().exports, before), "an export of a made chunk is a dup");
	cr_assert(not(eq(i32, fd1, fd2)));
	cr_assert(eq(u64, fd_inode(fd1), fd_inode(fd2)), "both are the chunk's one export");
	close(fd1);
	close(fd2);
	/* The made chunk holds one fd (its export) until its release. */
	before = proc_count_fds(getpid());
	cr_assert(eq(i32, b->ops->chunk_release(b, h), 0), "%s", backend_last_error());
	cr_assert(eq(i32, proc_count_fds(getpid()), before - 1));
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, 2 * MiB, &h), 0), "%s", backend_last_error());
	cr_assert(eq(i32, proc_count_fds(getpid()), before));
	cr_assert(eq(i32, b->ops->chunk_release(b, h), 0), "%s", backend_last_error());
	backend_close(b);
}

/* The smallest granularity is of the visible devices only. */
Test(backend_cuda_fake, an_invisible_slot_has_no_say_in_the_granularity)
{
	static const uint64_t gran[] = { 2 * MiB, 4 * MiB };
	static const int order[] = { 1, -1 };
	uintptr_t va;

	fake_load(2, gran);
	struct backend *b = open_order(order, 2);

	cr_assert(eq(i32, b->ops->va_reserve(b, 2 * MiB, 0, &va), -EINVAL),
		  "only the 4 MiB device is visible");
	cr_assert(eq(i32, b->ops->va_reserve(b, 4 * MiB, 0, &va), 0), "%s", backend_last_error());
	backend_close(b);
}

/* Default mode is GLOBAL: a drain in it would invalidate another thread's capture. */
Test(backend_cuda_fake, every_drain_runs_in_the_relaxed_capture_mode)
{
	static const uint64_t gran[] = { 2 * MiB };
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;
	struct fake_cuda_stats st;
	struct backend *b = NULL;
	char buf[64];

	fake_load(1, gran);
	cr_assert(eq(i32, backend_cuda_open(&b), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->sync(b, 0), 0), "%s", backend_last_error());
	st = fake_stats();
	cr_assert(eq(i32, st.ctx_syncs, 1));
	cr_assert(eq(i32, st.sync_mode, CU_STREAM_CAPTURE_MODE_RELAXED),
		  "cuCtxSynchronize in mode %d", st.sync_mode);
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, buf, 1ULL << 40, sizeof(buf)), 0), "%s",
		  backend_last_error());
	st = fake_stats();
	cr_assert(eq(i32, st.copy_mode, CU_STREAM_CAPTURE_MODE_RELAXED));
	cr_assert(eq(i32, st.sync_mode, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamSynchronize");
	cr_assert(eq(i32, b->ops->contents_queue(b, 0, BACKEND_ZERO, NULL, 1ULL << 40, 64), 0));
	cr_assert(eq(i32, b->ops->wait(b, 0), 0), "%s", backend_last_error());
	st = fake_stats();
	cr_assert(eq(i32, st.stream_syncs, 2));
	cr_assert(eq(i32, st.sync_mode, CU_STREAM_CAPTURE_MODE_RELAXED), "wait()");
	/* And the thread's own mode comes back. */
	FAKE(cuThreadExchangeStreamCaptureMode)(&m);
	cr_assert(eq(i32, m, CU_STREAM_CAPTURE_MODE_GLOBAL));
	backend_close(b);
}

/* gmbd's device 0 is this process's ordinal 1, and the other way round. */
Test(backend_cuda_fake, peer_access_is_one_call_with_a_descriptor_per_device)
{
	static const uint64_t gran[] = { 2 * MiB, 2 * MiB, 2 * MiB };
	static const int order[] = { 1, 0, 2 };
	struct fake_cuda_stats st;
	uintptr_t va = 0;

	fake_load(3, gran);
	struct backend *b = open_order(order, 3);

	cr_assert(eq(i32, b->ops->va_reserve(b, 2 * MiB, 0, &va), 0));
	cr_assert(eq(i32, b->ops->set_access_peers(b, 0, 1ULL << 1 | 1ULL << 2, va, 2 * MiB), 0),
		  "%s", backend_last_error());
	st = fake_stats();
	cr_assert(eq(i32, st.access_calls, 1));
	cr_assert(eq(i32, st.access_n, 3));
	cr_assert(eq(i32, st.access_ids[0], 1), "in device order, by ordinal");
	cr_assert(eq(i32, st.access_ids[1], 0));
	cr_assert(eq(i32, st.access_ids[2], 2));
	cr_assert(eq(i32, st.access_mode, CU_STREAM_CAPTURE_MODE_RELAXED));
	/* The owner's own bit adds nothing; no peers is one descriptor. */
	cr_assert(eq(i32, b->ops->set_access_peers(b, 1, 1ULL << 1, va, 2 * MiB), 0));
	st = fake_stats();
	cr_assert(eq(i32, st.access_n, 1));
	cr_assert(eq(i32, st.access_ids[0], 0));
	cr_assert(eq(i32, b->ops->set_access(b, 2, va, 2 * MiB), 0));
	cr_assert(eq(i32, fake_stats().access_n, 1));
	/* A peer beyond the devices is refused before the driver is asked. */
	cr_assert(eq(i32, b->ops->set_access_peers(b, 0, 1ULL << 5, va, 2 * MiB), -EINVAL));
	cr_assert(eq(i32, fake_stats().access_calls, 3));
	backend_close(b);
}
