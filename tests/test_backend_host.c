/*
 * test_backend_host.c - the host backend (common/backend/host.c, host_va.c)
 * keeps the CUDA driver's rules with host memory: chunks share bytes through
 * their fds, every rule violation is refused (and leaves memory as it was),
 * unmap keeps the VA reserved, access needs set_access, and contents helpers
 * move bytes.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/backend/backend.h"

#define G	  (64ULL << 10) /* the test backend's granularity */
#define NDEV	  2
#define DEV_BYTES (16 * G)

static struct backend *b;

static void bh_setup(void)
{
	struct backend_host_opts o = { .ndevices = NDEV, .memory = DEV_BYTES, .granularity = G };

	cr_assert(eq(i32, backend_host_open(&o, &b), 0), "%s", backend_last_error());
}

static void bh_teardown(void)
{
	backend_close(b);
	b = NULL;
}

TestSuite(backend_host, .init = bh_setup, .fini = bh_teardown, .timeout = 30);

static uint64_t chunk(uint64_t size)
{
	uint64_t h = UINT64_MAX;

	cr_assert(eq(i32, b->ops->chunk_create(b, 0, size, &h), 0), "%s", backend_last_error());
	return h;
}

static uintptr_t reserve(uint64_t size)
{
	uintptr_t va = 0;

	cr_assert(eq(i32, b->ops->va_reserve(b, size, 0, &va), 0), "%s", backend_last_error());
	return va;
}

/* Maps @h at @va and grants access. */
static void map_rw(uintptr_t va, uint64_t size, uint64_t h)
{
	cr_assert(eq(i32, b->ops->map(b, va, size, h), 0), "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->set_access(b, 0, va, size), 0), "%s", backend_last_error());
}

static void expect_fill(uintptr_t va, uint64_t size, uint8_t byte)
{
	const uint8_t *p = (const uint8_t *)va;

	for (uint64_t i = 0; i < size; i += 4093)
		cr_assert(eq(u8, p[i], byte), "byte 0x%" PRIx64 " of 0x%" PRIxPTR, i, va);
	cr_assert(eq(u8, p[size - 1], byte));
}

/* Whether any mapping of this process covers @va (PROT_NONE counts). */
static int va_is_taken(uintptr_t va)
{
	void *p = mmap((void *)va, 4096, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

	if (p == MAP_FAILED)
		return errno == EEXIST;
	munmap(p, 4096);
	return 0;
}

/* The /proc/self/maps line of the mapping at @va mentions @what. */
static int maps_line_has(uintptr_t va, const char *what)
{
	char line[512], start[32];
	FILE *f = fopen("/proc/self/maps", "re");
	int found = 0;

	cr_assert(not(eq(ptr, f, NULL)));
	snprintf(start, sizeof(start), "%" PRIxPTR "-", va);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, start, strlen(start)) == 0)
			found = strstr(line, what) != NULL;
	fclose(f);
	return found;
}

Test(backend_host, devices_are_named_and_sized_from_the_options)
{
	cr_assert(eq(str, (char *)b->ops->name, "host"));
	cr_assert(eq(i32, b->ndevices, NDEV));
	cr_assert(eq(str, b->devices[1].name, "host1"));
	cr_assert(eq(u64, b->devices[1].total_bytes, DEV_BYTES));
	cr_assert(eq(u64, b->devices[0].granularity, G));
}

Test(backend_host, bad_options_are_refused)
{
	struct backend_host_opts o = BACKEND_HOST_OPTS_INIT;
	struct backend *x = (struct backend *)1;

	o.granularity = 3 << 12;
	cr_assert(eq(i32, backend_host_open(&o, &x), -EINVAL));
	cr_assert(eq(ptr, x, NULL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "granularity"), NULL)));
	o.granularity = 2048;
	cr_assert(eq(i32, backend_host_open(&o, &x), -EINVAL));
	o = (struct backend_host_opts)BACKEND_HOST_OPTS_INIT;
	o.ndevices = 0;
	cr_assert(eq(i32, backend_host_open(&o, &x), -EINVAL));
	o.ndevices = BACKEND_MAX_DEVICES + 1;
	cr_assert(eq(i32, backend_host_open(&o, &x), -EINVAL));
	cr_assert(eq(i32, backend_host_open(NULL, &x), 0));
	cr_assert(eq(u64, x->devices[0].granularity, 2ULL << 20));
	backend_close(x);
}

Test(backend_host, backend_open_picks_by_kind)
{
	struct backend_host_opts o = { .ndevices = 3, .memory = 4 * G, .granularity = G };
	struct backend *x = NULL;

	cr_assert(eq(i32, backend_open("host", &o, &x), 0));
	cr_assert(eq(str, (char *)x->ops->name, "host"));
	cr_assert(eq(i32, x->ndevices, 3));
	backend_close(x);
	cr_assert(eq(i32, backend_open("tpu", &o, &x), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "tpu"), NULL)));
	cr_assert(eq(i32, backend_open("auto", &o, &x), 0));
	/* Without a GPU auto falls back to host and keeps cuda's reason for the log. */
	if (strcmp(x->ops->name, "host") == 0)
		cr_assert(not(eq(ptr, strstr(backend_last_error(), "cuda"), NULL)));
	backend_close(x);
}

Test(backend_host, export_and_import_share_bytes_between_two_mappings)
{
	uint64_t h = chunk(2 * G), h2 = UINT64_MAX;
	uintptr_t va = reserve(4 * G);
	int fd = -1;

	cr_assert(eq(i32, b->ops->chunk_export(b, h, &fd), 0));
	cr_assert(not(eq(i32, fd, (int)h)));
	cr_assert(eq(i32, fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC));
	cr_assert(eq(i32, b->ops->chunk_import(b, fd, 2 * G, &h2), 0));
	/* The importer's fd stays the caller's. */
	cr_assert(ge(i32, fcntl(fd, F_GETFD), 0));
	close(fd);
	map_rw(va, 2 * G, h);
	map_rw(va + 2 * G, 2 * G, h2);
	memset((void *)va, 0x5a, 2 * G);
	expect_fill(va + 2 * G, 2 * G, 0x5a);
	memset((void *)(va + 2 * G), 0xa5, 2 * G);
	expect_fill(va, 2 * G, 0xa5);
}

Test(backend_host, an_exported_fd_shares_bytes_with_a_forked_child)
{
	uint64_t h = chunk(G);
	uintptr_t va = reserve(G);
	int fd = -1, status = -1;
	pid_t pid;

	map_rw(va, G, h);
	memset((void *)va, 0x11, G);
	cr_assert(eq(i32, b->ops->chunk_export(b, h, &fd), 0));
	pid = fork();
	cr_assert(ge(i32, pid, 0));
	if (pid == 0) {
		/* A separate backend, as a client process would have; exit status = verdict. */
		struct backend_host_opts o = { .ndevices = 1, .memory = 4 * G, .granularity = G };
		struct backend *c = NULL;
		uintptr_t cva = 0;
		uint64_t ch = 0;
		int ok = backend_host_open(&o, &c) == 0 &&
			 c->ops->chunk_import(c, fd, G, &ch) == 0 &&
			 c->ops->va_reserve(c, G, 0, &cva) == 0 &&
			 c->ops->map(c, cva, G, ch) == 0 && c->ops->set_access(c, 0, cva, G) == 0 &&
			 ((uint8_t *)cva)[G - 1] == 0x11;

		if (ok)
			memset((void *)cva, 0x22, G);
		_exit(ok ? 0 : 1);
	}
	cr_assert(eq(i32, waitpid(pid, &status, 0), pid));
	cr_assert(eq(i32, WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0));
	expect_fill(va, G, 0x22);
	close(fd);
}

Test(backend_host, fresh_chunks_read_zero_even_after_a_dirty_one_is_released)
{
	uintptr_t va = reserve(2 * G);
	uint64_t h = chunk(2 * G);

	map_rw(va, 2 * G, h);
	expect_fill(va, 2 * G, 0);
	memset((void *)va, 0xff, 2 * G);
	cr_assert(eq(i32, b->ops->unmap(b, va, 2 * G), 0));
	cr_assert(eq(i32, b->ops->chunk_release(b, h), 0));
	map_rw(va, 2 * G, chunk(2 * G));
	expect_fill(va, 2 * G, 0);
}

Test(backend_host, chunk_create_refuses_bad_sizes_and_devices)
{
	uint64_t h = 12345;

	cr_assert(eq(i32, b->ops->chunk_create(b, 0, 0, &h), -EINVAL));
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, G / 2, &h), -EINVAL));
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, G + 4096, &h), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "granularity"), NULL)));
	cr_assert(eq(i32, b->ops->chunk_create(b, NDEV, G, &h), -EINVAL));
	cr_assert(eq(i32, b->ops->chunk_create(b, -1, G, &h), -EINVAL));
	cr_assert(eq(u64, h, 12345));
}

Test(backend_host, chunk_create_stops_at_the_device_total_per_device)
{
	uint64_t h = 0, big = chunk(DEV_BYTES - G);

	cr_assert(eq(i32, b->ops->chunk_create(b, 0, 2 * G, &h), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "host0"), NULL)));
	/* The other device has its own memory. */
	cr_assert(eq(i32, b->ops->chunk_create(b, 1, 2 * G, &h), 0));
	cr_assert(eq(i32, b->ops->chunk_release(b, big), 0));
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, 2 * G, &h), 0));
}

Test(backend_host, release_closes_the_handle_and_unknown_handles_are_refused)
{
	uint64_t h = chunk(G);
	uintptr_t va = reserve(G);
	int fd = -1;

	cr_assert(eq(i32, b->ops->chunk_release(b, h), 0));
	cr_assert(eq(i32, fcntl((int)h, F_GETFD), -1));
	cr_assert(eq(i32, errno, EBADF));
	cr_assert(eq(i32, b->ops->chunk_release(b, h), -EINVAL));
	cr_assert(eq(i32, b->ops->chunk_export(b, h, &fd), -EINVAL));
	cr_assert(eq(i32, b->ops->map(b, va, G, h), -EINVAL));
	/* An fd that is open but not a chunk of this backend is no handle either. */
	cr_assert(eq(i32, b->ops->map(b, va, G, STDERR_FILENO), -EINVAL));
	cr_assert(eq(i32, fd, -1));
}

Test(backend_host, import_checks_the_size_and_the_kind_of_fd)
{
	uint64_t h = chunk(2 * G), h2 = 777;
	int fd = -1, pipefd[2];

	cr_assert(eq(i32, b->ops->chunk_export(b, h, &fd), 0));
	cr_assert(eq(i32, b->ops->chunk_import(b, fd, G, &h2), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "0x20000"), NULL)));
	cr_assert(eq(i32, b->ops->chunk_import(b, fd, 3 * G, &h2), -EINVAL));
	cr_assert(eq(u64, h2, 777));
	cr_assert(ge(i32, fcntl(fd, F_GETFD), 0));
	cr_assert(eq(i32, pipe(pipefd), 0));
	cr_assert(eq(i32, b->ops->chunk_import(b, pipefd[0], G, &h2), -EINVAL));
	cr_assert(eq(i32, b->ops->chunk_import(b, -1, G, &h2), -EBADF));
	close(pipefd[0]);
	close(pipefd[1]);
	close(fd);
}

Test(backend_host, a_chunk_cannot_be_resized_by_whoever_holds_its_fd)
{
	uint64_t h = chunk(G);
	int fd = -1;

	cr_assert(eq(i32, b->ops->chunk_export(b, h, &fd), 0));
	cr_assert(eq(i32, ftruncate(fd, G / 2), -1));
	cr_assert(eq(i32, errno, EPERM));
	cr_assert(eq(i64, lseek(fd, 0, SEEK_END), (long)G));
	close(fd);
}

Test(backend_host, va_reserve_aligns_and_checks)
{
	uintptr_t va = 0;

	cr_assert(eq(i32, b->ops->va_reserve(b, 3 * G, 1ULL << 30, &va), 0));
	cr_assert(eq(u64, va % (1ULL << 30), 0));
	cr_assert(eq(i32, va_is_taken(va), 1));
	cr_assert(eq(i32, va_is_taken(va + 3 * G), 0));
	cr_assert(eq(i32, b->ops->va_reserve(b, 3 * G, 3 * G, &va), -EINVAL));
	cr_assert(eq(i32, b->ops->va_reserve(b, G + 4096, 0, &va), -EINVAL));
	cr_assert(eq(i32, b->ops->va_reserve(b, 0, 0, &va), -EINVAL));
}

Test(backend_host, partial_unmap_is_refused_and_the_mapping_survives)
{
	uintptr_t va = reserve(6 * G);

	map_rw(va, 2 * G, chunk(2 * G));
	map_rw(va + 2 * G, 2 * G, chunk(2 * G));
	memset((void *)va, 0x33, 4 * G);
	cr_assert(eq(i32, b->ops->unmap(b, va, G), -EINVAL));
	cr_assert(eq(i32, b->ops->unmap(b, va + G, G), -EINVAL));
	cr_assert(eq(i32, b->ops->unmap(b, va + G, 2 * G), -EINVAL));
	/* Past the last mapping into unmapped VA. */
	cr_assert(eq(i32, b->ops->unmap(b, va, 6 * G), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "unmap"), NULL)));
	expect_fill(va, 4 * G, 0x33);
	/* Several whole mappings back to back go in one call. */
	cr_assert(eq(i32, b->ops->unmap(b, va, 4 * G), 0));
	cr_assert(eq(i32, b->ops->unmap(b, va, 2 * G), -EINVAL));
}

Test(backend_host, map_at_an_unaligned_address_is_refused)
{
	uintptr_t va = reserve(3 * G);
	uint64_t h = chunk(G);

	cr_assert(eq(i32, b->ops->map(b, va + 4096, G, h), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "granularity"), NULL)));
	cr_assert(eq(i32, maps_line_has(va + 4096, "gmb-chunk"), 0));
	map_rw(va + G, G, h);
	cr_assert(eq(i32, maps_line_has(va + G, "gmb-chunk"), 1));
}

Test(backend_host, map_of_a_chunk_over_a_smaller_or_larger_range_is_refused)
{
	uintptr_t va = reserve(4 * G);
	uint64_t h = chunk(2 * G);

	cr_assert(eq(i32, b->ops->map(b, va, G, h), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "chunk's size 0x20000"), NULL)));
	cr_assert(eq(i32, b->ops->map(b, va, 4 * G, h), -EINVAL));
	cr_assert(eq(i32, maps_line_has(va, "gmb-chunk"), 0));
	cr_assert(eq(i32, b->ops->map(b, va, 2 * G, h), 0));
}

Test(backend_host, map_outside_a_reservation_is_refused_and_touches_nothing)
{
	uintptr_t va = reserve(2 * G);
	uint64_t h = chunk(2 * G);
	void *mem = NULL;
	uintptr_t own;

	/* Straddling the reservation's end. */
	cr_assert(eq(i32, b->ops->map(b, va + G, 2 * G, h), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "reservation"), NULL)));
	/* Memory of the process that the backend did not reserve stays as it was. */
	cr_assert(eq(i32, b->ops->host_alloc(b, 4 * G, &mem), 0));
	own = ((uintptr_t)mem + G - 1) & ~(uintptr_t)(G - 1);
	memset((void *)own, 0x44, 2 * G);
	cr_assert(eq(i32, b->ops->map(b, own, 2 * G, h), -EINVAL));
	expect_fill(own, 2 * G, 0x44);
	b->ops->host_free(b, mem, 4 * G);
}

Test(backend_host, double_map_is_refused_and_the_first_mapping_stays)
{
	uintptr_t va = reserve(3 * G);
	uint64_t a = chunk(2 * G), c = chunk(2 * G);

	map_rw(va, 2 * G, a);
	memset((void *)va, 0x55, 2 * G);
	cr_assert(eq(i32, b->ops->map(b, va, 2 * G, c), -EINVAL));
	cr_assert(eq(i32, b->ops->map(b, va + G, 2 * G, c), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "overlaps"), NULL)));
	cr_assert(eq(i32, b->ops->map(b, va, 2 * G, a), -EINVAL));
	expect_fill(va, 2 * G, 0x55);
}

Test(backend_host, access_before_set_access_faults, .signal = SIGSEGV)
{
	uintptr_t va = reserve(G);
	uint64_t h = chunk(G);

	cr_assert(eq(i32, b->ops->map(b, va, G, h), 0));
	/* Under AddressSanitizer its own handler would turn the fault into an abort. */
	signal(SIGSEGV, SIG_DFL);
	(void)*(volatile uint8_t *)va;
}

Test(backend_host, contents_helpers_refuse_a_mapping_without_access)
{
	uintptr_t va = reserve(2 * G);
	uint8_t buf[16];

	cr_assert(eq(i32, b->ops->map(b, va, 2 * G, chunk(2 * G)), 0));
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, buf, va, sizeof(buf)), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "set_access"), NULL)));
	cr_assert(eq(i32, b->ops->zero(b, 0, va, G), -EINVAL));
	/* set_access of part of a mapping is refused, so there is still no access. */
	cr_assert(eq(i32, b->ops->set_access(b, 0, va, G), -EINVAL));
	cr_assert(eq(i32, b->ops->copy_from_host(b, 0, va, buf, sizeof(buf)), -EINVAL));
	cr_assert(eq(i32, b->ops->set_access(b, NDEV, va, 2 * G), -EINVAL));
	cr_assert(eq(i32, b->ops->set_access(b, 0, va, 2 * G), 0));
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, buf, va, sizeof(buf)), 0));
}

/* A child that writes one byte at @va: how it ended (a wait status). */
static int write_in_child(uintptr_t va)
{
	int st = 0;
	pid_t pid = fork();

	cr_assert(ge(i32, pid, 0));
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL); /* the fault kills, whatever a sanitizer installed */
		*(volatile uint8_t *)va = 0x5a;
		_exit(0);
	}
	cr_assert(eq(i32, waitpid(pid, &st, 0), pid));
	return st;
}

Test(backend_host, set_access_ro_reads_and_a_write_faults)
{
	uintptr_t va = reserve(2 * G), other = reserve(2 * G);
	uint64_t h = chunk(2 * G);
	uint8_t buf[16];
	int st;

	map_rw(other, 2 * G, h);
	memset((void *)other, 0x3c, 2 * G);
	cr_assert(eq(i32, b->ops->map(b, va, 2 * G, h), 0));
	cr_assert(eq(i32, b->ops->set_access_ro(b, NDEV, va, 2 * G), -EINVAL));
	cr_assert(eq(i32, b->ops->set_access_ro(b, 0, va, G), -EINVAL), "part of a mapping");
	cr_assert(eq(i32, b->ops->set_access_ro(b, 0, va, 2 * G), 0), "%s", backend_last_error());
	expect_fill(va, 2 * G, 0x3c);
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, buf, va, sizeof(buf)), 0));
	cr_assert(eq(u8, buf[0], 0x3c));
	/* The device's own writes are refused too, as the driver refuses them. */
	cr_assert(eq(i32, b->ops->copy_from_host(b, 0, va, buf, sizeof(buf)), -EACCES));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "read-only"), NULL)));
	cr_assert(eq(i32, b->ops->zero(b, 0, va, G), -EACCES));
	st = write_in_child(va);
	cr_assert(eq(int, WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, 1), "wait status 0x%x", st);
	/* The read-write mapping of the same chunk still writes. */
	st = write_in_child(other);
	cr_assert(eq(i32, st, 0), "wait status 0x%x", st);
	/* set_access makes it writable again. */
	cr_assert(eq(i32, b->ops->set_access(b, 0, va, 2 * G), 0));
	cr_assert(eq(i32, b->ops->zero(b, 0, va, G), 0));
	expect_fill(other, G, 0);
}

Test(backend_host, unmap_keeps_the_va_reserved_and_a_new_chunk_maps_there)
{
	uintptr_t va = reserve(G), other = reserve(G);
	uint64_t a = chunk(G), c = chunk(G);

	map_rw(va, G, a);
	memset((void *)va, 0xaa, G);
	map_rw(other, G, c);
	memset((void *)other, 0xcc, G);
	cr_assert(eq(i32, b->ops->unmap(b, other, G), 0));
	cr_assert(eq(i32, b->ops->unmap(b, va, G), 0));
	/* Still reserved, and no longer holding the chunk's memory. */
	cr_assert(eq(i32, va_is_taken(va), 1));
	cr_assert(eq(i32, maps_line_has(va, "gmb-chunk"), 0));
	cr_assert(eq(i32, b->ops->map(b, va, G, c), 0));
	cr_assert(eq(i32, maps_line_has(va, "gmb-chunk"), 1));
	cr_assert(eq(i32, b->ops->set_access(b, 0, va, G), 0));
	expect_fill(va, G, 0xcc);
	/* The first chunk kept its bytes while unmapped. */
	map_rw(other, G, a);
	expect_fill(other, G, 0xaa);
}

Test(backend_host, va_free_needs_a_whole_unmapped_reservation)
{
	uintptr_t va = reserve(2 * G);
	uint64_t h = chunk(G);

	map_rw(va + G, G, h);
	cr_assert(eq(i32, b->ops->va_free(b, va, 2 * G), -EBUSY));
	cr_assert(eq(i32, b->ops->va_free(b, va, G), -EINVAL));
	cr_assert(eq(i32, b->ops->unmap(b, va + G, G), 0));
	cr_assert(eq(i32, b->ops->va_free(b, va, 2 * G), 0));
	cr_assert(eq(i32, va_is_taken(va), 0));
	cr_assert(eq(i32, va_is_taken(va + G), 0));
	cr_assert(eq(i32, b->ops->va_free(b, va, 2 * G), -EINVAL));
	cr_assert(eq(i32, b->ops->map(b, va, G, h), -EINVAL));
}

Test(backend_host, copy_helpers_move_bytes_across_chunk_boundaries)
{
	uintptr_t va = reserve(4 * G);
	size_t len = 2 * G, off = G / 2;
	uint8_t *src = malloc(len), *dst = calloc(1, len);

	map_rw(va, 2 * G, chunk(2 * G));
	map_rw(va + 2 * G, 2 * G, chunk(2 * G));
	for (size_t i = 0; i < len; i++)
		src[i] = (uint8_t)(i * 7 + 3);
	cr_assert(eq(i32, b->ops->copy_from_host(b, 0, va + off, src, len), 0));
	cr_assert(eq(i32, memcmp((void *)(va + off), src, len), 0));
	cr_assert(eq(i32, b->ops->copy_to_host(b, 1, dst, va + off, len), 0));
	cr_assert(eq(i32, memcmp(dst, src, len), 0));
	cr_assert(eq(i32, b->ops->zero(b, 0, va + G, 2 * G), 0));
	expect_fill(va + G, 2 * G, 0);
	cr_assert(eq(u8, *(uint8_t *)(va + G - 1), src[G / 2 - 1]));
	cr_assert(eq(i32, b->ops->sync(b, 0), 0));
	cr_assert(eq(i32, b->ops->sync(b, NDEV), -EINVAL));
	free(src);
	free(dst);
}

Test(backend_host, copy_helpers_refuse_unmapped_ranges_and_leave_buffers_alone)
{
	uintptr_t va = reserve(3 * G);
	uint8_t *dst = malloc(2 * G);

	map_rw(va, G, chunk(G));
	memset(dst, 0x77, 2 * G);
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, dst, va, 2 * G), -EINVAL));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "not mapped"), NULL)));
	cr_assert(eq(u8, dst[0], 0x77));
	cr_assert(eq(i32, b->ops->zero(b, 0, va + G, G), -EINVAL));
	cr_assert(eq(i32, b->ops->copy_from_host(b, 0, va + 2 * G, dst, 1), -EINVAL));
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, NULL, va, 1), -EINVAL));
	free(dst);
}

Test(backend_host, host_alloc_gives_writable_memory)
{
	void *p = NULL;

	cr_assert(eq(i32, b->ops->host_alloc(b, 3 * G, &p), 0));
	memset(p, 0x12, 3 * G);
	cr_assert(eq(u8, ((uint8_t *)p)[3 * G - 1], 0x12));
	b->ops->host_free(b, p, 3 * G);
	cr_assert(eq(i32, b->ops->host_alloc(b, 0, &p), -EINVAL));
}

/* Each thread cycles its own reservation through map/access/write/unmap. */
static void *bh_churn(void *arg)
{
	uintptr_t va = 0;
	uint64_t h = 0;
	long bad = 0;

	(void)arg;
	bad += b->ops->va_reserve(b, 2 * G, 0, &va) != 0;
	for (int i = 0; i < 300 && !bad; i++) {
		bad += b->ops->chunk_create(b, i & 1, G, &h) != 0;
		bad += b->ops->map(b, va + (i & 1) * G, G, h) != 0;
		bad += b->ops->set_access(b, 0, va + (i & 1) * G, G) != 0;
		bad += b->ops->zero(b, 0, va + (i & 1) * G, G) != 0;
		bad += b->ops->unmap(b, va + (i & 1) * G, G) != 0;
		bad += b->ops->chunk_release(b, h) != 0;
	}
	bad += b->ops->va_free(b, va, 2 * G) != 0;
	return (void *)bad;
}

Test(backend_host, concurrent_threads_keep_the_tables_consistent)
{
	pthread_t t[8];
	void *bad;
	uint64_t h = 0;

	for (int i = 0; i < 8; i++)
		cr_assert(eq(i32, pthread_create(&t[i], NULL, bh_churn, NULL), 0));
	for (int i = 0; i < 8; i++) {
		cr_assert(eq(i32, pthread_join(t[i], &bad), 0));
		cr_assert(eq(ptr, bad, NULL), "%s", backend_last_error());
	}
	/* Every chunk was released: the whole device is available again. */
	cr_assert(eq(i32, b->ops->chunk_create(b, 0, DEV_BYTES, &h), 0));
	cr_assert(eq(i32, b->ops->chunk_create(b, 1, DEV_BYTES, &h), 0));
}

Test(backend_host, queued_contents_are_done_by_wait)
{
	uintptr_t va = reserve(2 * G);
	uint8_t *src = malloc(G), *dst = calloc(1, G);

	map_rw(va, 2 * G, chunk(2 * G));
	memset(src, 0x5c, G);
	cr_assert(eq(i32, b->ops->contents_queue(b, 0, BACKEND_FROM_HOST, src, va, G), 0));
	cr_assert(eq(i32, b->ops->contents_queue(b, 0, BACKEND_ZERO, NULL, va + G, G), 0));
	cr_assert(eq(i32, b->ops->contents_queue(b, 0, BACKEND_TO_HOST, dst, va, G), 0));
	cr_assert(eq(i32, b->ops->wait(b, 0), 0));
	cr_assert(eq(i32, memcmp(dst, src, G), 0));
	expect_fill(va + G, G, 0);
	cr_assert(eq(i32, b->ops->contents_queue(b, 0, (enum backend_contents)9, dst, va, G),
		     -EINVAL));
	cr_assert(eq(i32, b->ops->contents_queue(b, 0, BACKEND_TO_HOST, dst, va + 2 * G, G),
		     -EINVAL),
		  "outside any mapping");
	cr_assert(eq(i32, b->ops->wait(b, NDEV), -EINVAL));
	free(src);
	free(dst);
}

Test(backend_host, peer_access_checks_each_peer_and_grants_access)
{
	uintptr_t va = reserve(2 * G);
	uint8_t buf[16];

	cr_assert(eq(i32, b->ops->map(b, va, 2 * G, chunk(2 * G)), 0));
	cr_assert(eq(i32, b->ops->set_access_peers(b, 0, 1ULL << NDEV, va, 2 * G), -EINVAL),
		  "a peer that is no device");
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "peer"), NULL)), "%s",
		  backend_last_error());
	cr_assert(eq(i32, b->ops->copy_to_host(b, 0, buf, va, sizeof(buf)), -EINVAL),
		  "a refused peer grants nothing");
	cr_assert(eq(i32, b->ops->set_access_peers(b, 0, 1ULL << 1 | 1ULL << 0, va, 2 * G), 0),
		  "%s", backend_last_error());
	cr_assert(eq(i32, b->ops->copy_to_host(b, 1, buf, va, sizeof(buf)), 0));
	expect_fill(va, 2 * G, 0);
}

Test(backend_host, sync_is_counted)
{
	uint64_t n = backend_host_sync_count();

	cr_assert(eq(i32, b->ops->sync(b, 1), 0));
	cr_assert(eq(i32, b->ops->sync(b, NDEV), -EINVAL));
	cr_assert(eq(u64, backend_host_sync_count(), n + 2));
}

/* cuMemHostRegister refuses a read-only mapping; so must the host backend. */
Test(backend_host, host_register_refuses_a_read_only_mapping)
{
	size_t size = 4 * (size_t)sysconf(_SC_PAGESIZE);
	void *rw = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *ro = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	cr_assert(rw != MAP_FAILED && ro != MAP_FAILED);
	cr_expect(eq(i32, b->ops->host_register(b, rw, size), 0), "%s", backend_last_error());
	b->ops->host_unregister(b, rw, size);
	cr_expect(eq(i32, b->ops->host_register(b, ro, size), -EINVAL));
	cr_expect(strstr(backend_last_error(), "writable") != NULL, "%s", backend_last_error());
	/* Half writable: the second half made read-only. */
	cr_assert(eq(i32, mprotect((char *)rw + size / 2, size / 2, PROT_READ), 0));
	cr_expect(eq(i32, b->ops->host_register(b, rw, size), -EINVAL));
	munmap(rw, size);
	munmap(ro, size);
}
