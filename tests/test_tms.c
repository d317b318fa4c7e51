/*
 * test_tms.c - what torch_memory_saver's users rely on, against a real
 * gmbd (host backend): allocations that keep their region's mode and backup
 * kind, host copies (pinned, mmap, disk) exact over cycles and freed after
 * resume unless retained, gmb_host_copy(), the TMS_* environment, the tms_*
 * entry points in libgmb, and a pause that gives memory back to the driver
 * (gmbd's default) or keeps it warm (--pool-keep unlimited).
 *
 * Each test runs in its own process (Criterion's), so the once-per-process
 * state (environment, settings, default client) starts fresh in each; each
 * starts its own gmbd, so that gmbd's fds and pool are this test's alone.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/util.h"

#define KiB 1024ULL
#define MiB (1024ULL * 1024)

static struct gmbd_proc gmbd;
static char disk_dir[PATH_MAX];

/* gmbd with a 64 KiB granularity, so sizes need not be MiB multiples; @keep: --pool-keep. */
static void daemon_up(const char *keep)
{
	const char *args[] = { "--host-memory",
			       "512MiB",
			       "--host-granularity",
			       "64KiB",
			       "--max-chunk",
			       "8MiB",
			       "--log-level",
			       "warning",
			       keep ? "--pool-keep" : NULL,
			       keep,
			       NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
	setenv("GMB_SOCKET", gmbd.sock, 1);
	/* These count bytes per allocation; packing is test_pack's. */
	setenv("GMB_PACK", "off", 1);
	snprintf(disk_dir, sizeof(disk_dir), "%s/disk", gmbd.dir);
}

static void start(void)
{
	daemon_up(NULL);
}

static void stop(void)
{
	char cmd[PATH_MAX + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", disk_dir);
	cr_expect(eq(i32, system(cmd), 0));
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(tms, .init = start, .fini = stop, .timeout = 60);
TestSuite(tms_warm, .timeout = 60);

/* One allocation of @size in a region of its own mode and backup; the default client. */
static unsigned char *alloc_ex(const char *tag, int mode, int backup, size_t size)
{
	void *p = NULL;

	cr_assert(eq(i32, gmb_region_begin_ex(tag, mode, backup), 0), "%s",
		  gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_malloc(NULL, &p, size, 0), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_end(), 0));
	return p;
}

static gmb_client *client(void)
{
	gmb_client *c = NULL;

	cr_assert(ge(i32, gmb_default_client(NULL, NULL, &c), 0), "%s", gmb_region_last_error());
	return c;
}

static int64_t status_i64(const char *key)
{
	char *json = NULL;
	int64_t v;

	if (gmb_status_json(client(), &json))
		return -1;
	v = json_i64(json, key);
	free(json);
	return v;
}

/* Private anonymous resident bytes of this process (host copies; not the memfd chunks). */
static int64_t rss_anon(void)
{
	int64_t v = test_rss_anon();

	cr_assert(ge(i64, v, 0), "no RssAnon in /proc/self/status");
	return v;
}

static int count_files(const char *dir, off_t *size)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char path[PATH_MAX * 2];
		struct stat st;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (stat(path, &st) == 0 && size)
			*size = st.st_size;
		n++;
	}
	closedir(d);
	return n;
}

Test(tms, allocations_in_one_tag_keep_their_own_modes)
{
	const size_t n = 3 * MiB + 5 * 64 * KiB;
	unsigned char *keep = alloc_ex("default", GMB_MODE_PRESERVE, GMB_BACKUP_PINNED, n);
	unsigned char *lose = alloc_ex("default", GMB_MODE_DISCARD, GMB_BACKUP_DEFAULT, n);
	unsigned char *mm = alloc_ex("default", GMB_MODE_PRESERVE, GMB_BACKUP_MMAP, n);

	test_fill(keep, n, 1);
	test_fill(lose, n, 2);
	test_fill(mm, n, 3);
	cr_assert(eq(i32, gmb_pause(client(), "default"), 0), "%s", gmb_last_error(client()));
	cr_assert(eq(i32, gmb_resume(client(), "default"), 0), "%s", gmb_last_error(client()));
	cr_assert(test_holds(keep, n, 1), "the preserve allocation keeps its bytes");
	cr_assert(test_holds(mm, n, 3), "the mmap one too");
	cr_assert(not(test_holds(lose, n, 2)), "the discard one in the same tag does not");
}

/* @cycles pauses and resumes of one allocation of @backup, new bytes each time. */
static void cycle_exact(int backup, size_t n, int cycles)
{
	unsigned char *p = alloc_ex("w", GMB_MODE_PRESERVE, backup, n);

	for (int i = 0; i < cycles; i++) {
		test_fill(p, n, 10 + (unsigned)i);
		cr_assert(eq(i32, gmb_pause(client(), "w"), 0), "%s", gmb_last_error(client()));
		cr_assert(eq(i32, gmb_resume(client(), "w"), 0), "%s", gmb_last_error(client()));
		cr_assert(test_holds(p, n, 10 + (unsigned)i), "cycle %d of kind %d: bytes differ",
			  i, backup);
	}
	cr_assert(eq(i32, gmb_free(client(), p), 0));
}

Test(tms, every_backup_kind_is_exact_over_cycles_with_uneven_tails)
{
	/* Past two 64 MiB ring pieces and past three 1 MiB disk pieces, neither a multiple. */
	const size_t big = 130 * MiB + 3 * 64 * KiB, odd = 3 * MiB + 7 * 64 * KiB;

	setenv("TMS_DISK_BACKUP_CHUNK_MB", "1", 1);
	cr_assert(eq(i32, gmb_set_disk_dir(disk_dir), 0), "%s", gmb_region_last_error());
	for (int retain = 0; retain <= 1; retain++) {
		cr_assert(eq(i32, gmb_set_retain_host_copy(retain), 0));
		cycle_exact(GMB_BACKUP_PINNED, big, 2);
		cycle_exact(GMB_BACKUP_MMAP, big, 2);
		cycle_exact(GMB_BACKUP_DISK, odd, 3);
		cycle_exact(GMB_BACKUP_PINNED, 64 * KiB, 2);
	}
	cr_assert(eq(i32, count_files(disk_dir, NULL), 0), "freeing removed every disk copy");
}

Test(tms, without_retain_a_copy_is_freed_after_resume)
{
	const size_t n = 48 * MiB;
	unsigned char *pin = alloc_ex("a", GMB_MODE_PRESERVE, GMB_BACKUP_PINNED, n);
	unsigned char *mm = alloc_ex("b", GMB_MODE_PRESERVE, GMB_BACKUP_MMAP, n);
	unsigned char *dk = alloc_ex("c", GMB_MODE_PRESERVE, GMB_BACKUP_DISK, 5 * MiB);
	int64_t before, paused;
	off_t fsize = 0;
	void *h = NULL;

	cr_assert(eq(i32, gmb_get_retain_host_copy(), 1), "libgmb's default keeps copies");
	cr_assert(not(tms_get_retain_cpu_backup()), "the peer's entry points: off by default");
	cr_assert(eq(i32, gmb_get_retain_host_copy(), 0), "and so for the process");
	test_fill(pin, n, 4);
	cr_assert(eq(i32, gmb_pause(client(), "a"), 0));
	cr_assert(eq(i32, gmb_host_copy(NULL, pin, n, &h), 0));
	cr_assert(not(eq(ptr, h, NULL)), "paused: the copy is there");
	cr_assert(test_holds(h, n, 4));
	cr_assert(eq(i32, gmb_resume(client(), "a"), 0));
	cr_assert(eq(i32, gmb_host_copy(NULL, pin, n, &h), 0));
	cr_assert(eq(ptr, h, NULL), "resumed without retain: no copy any more");

	test_fill(mm, n, 5);
	before = rss_anon();
	cr_assert(eq(i32, gmb_pause(client(), "b"), 0));
	paused = rss_anon();
	cr_assert(ge(i64, paused - before, (int64_t)(n * 3 / 4)), "the mmap copy is resident: %lld",
		  (long long)(paused - before));
	cr_assert(eq(i32, gmb_resume(client(), "b"), 0));
	cr_assert(ge(i64, paused - rss_anon(), (int64_t)(n * 3 / 4)),
		  "and its pages are given back");
	cr_assert(test_holds(mm, n, 5));

	cr_assert(eq(i32, gmb_set_disk_dir(disk_dir), 0));
	cr_assert(eq(i32, gmb_pause(client(), "c"), 0));
	cr_assert(eq(i32, count_files(disk_dir, &fsize), 1), "one file per allocation");
	cr_assert(eq(i64, (int64_t)fsize, (int64_t)(5 * MiB)));
	cr_assert(eq(i32, gmb_resume(client(), "c"), 0));
	cr_assert(eq(i32, count_files(disk_dir, NULL), 0), "the file is removed after resume");
	(void)dk;
}

Test(tms, with_retain_the_copy_stays_at_the_same_address)
{
	const size_t n = 2 * MiB + 64 * KiB;
	unsigned char *p = alloc_ex("r", GMB_MODE_PRESERVE, GMB_BACKUP_PINNED, n);
	unsigned char *d = alloc_ex("r", GMB_MODE_PRESERVE, GMB_BACKUP_DISK, n);
	void *h1 = NULL, *h2 = NULL, *h3 = NULL;
	off_t fsize = 0;

	cr_assert(eq(i32, gmb_set_retain_host_copy(1), 0));
	cr_assert(eq(i32, gmb_get_retain_host_copy(), 1));
	cr_assert(eq(i32, gmb_set_retain_host_copy(2), -EINVAL));
	cr_assert(eq(i32, gmb_set_disk_dir(disk_dir), 0));
	test_fill(p, n, 6);
	cr_assert(eq(i32, gmb_pause(client(), "r"), 0));
	cr_assert(eq(i32, gmb_host_copy(NULL, p + 100, 10, &h1), 0));
	cr_assert(eq(i32, gmb_resume(client(), "r"), 0));
	cr_assert(eq(i32, gmb_host_copy(NULL, p + 100, 10, &h2), 0));
	cr_assert(eq(ptr, h2, h1), "active and retained: the same copy");
	test_fill(p, n, 7);
	cr_assert(eq(i32, gmb_pause(client(), "r"), 0));
	cr_assert(eq(i32, gmb_host_copy(NULL, p + 100, 10, &h3), 0));
	cr_assert(eq(ptr, h3, h1), "the next pause rewrites it in place");
	cr_assert(test_holds((unsigned char *)h3 - 100, n, 7));
	cr_assert(eq(i32, count_files(disk_dir, &fsize), 1));
	cr_assert(eq(i32, gmb_resume(client(), "r"), 0));
	cr_assert(eq(i32, count_files(disk_dir, &fsize), 1), "a retained disk copy stays");
	cr_assert(eq(i64, (int64_t)fsize, (int64_t)n), "and does not grow");
	cr_assert(eq(i32, gmb_free(client(), d), 0));
	cr_assert(eq(i32, count_files(disk_dir, NULL), 0), "freeing removes it");
	cr_assert(test_holds(p, n, 7));
}

/* The peer's suite counts a backup file per disk-backed allocation: packing must not merge them. */
Test(tms, disk_backed_allocations_are_not_packed_each_has_its_file)
{
	unsigned char *d1, *d2, *p1, *p2;

	unsetenv("GMB_PACK"); /* the default: the hooks pack */
	cr_assert(eq(i32, gmb_set_disk_dir(disk_dir), 0));
	d1 = alloc_ex("k", GMB_MODE_PRESERVE, GMB_BACKUP_DISK, 1 * MiB);
	d2 = alloc_ex("k", GMB_MODE_PRESERVE, GMB_BACKUP_DISK, 1 * MiB);
	p1 = alloc_ex("k", GMB_MODE_PRESERVE, GMB_BACKUP_PINNED, 1 * MiB);
	p2 = alloc_ex("k", GMB_MODE_PRESERVE, GMB_BACKUP_PINNED, 1 * MiB);
	cr_assert(eq(ptr, p2, p1 + MiB), "pinned-backed ones are packed, back to back");
	test_fill(d1, MiB, 21);
	test_fill(d2, MiB, 22);
	test_fill(p1, MiB, 23);
	cr_assert(eq(i32, gmb_pause(client(), "k"), 0), "%s", gmb_last_error(client()));
	cr_assert(eq(i32, count_files(disk_dir, NULL), 2), "one file per disk-backed allocation");
	cr_assert(eq(i32, gmb_resume(client(), "k"), 0), "%s", gmb_last_error(client()));
	cr_assert(test_holds(d1, MiB, 21) && test_holds(d2, MiB, 22) && test_holds(p1, MiB, 23));
	(void)p2;
}

Test(tms, host_copy_answers_per_kind_and_state)
{
	unsigned char *pin = alloc_ex("h", GMB_MODE_PRESERVE, GMB_BACKUP_PINNED, 1 * MiB);
	unsigned char *dk = alloc_ex("h", GMB_MODE_PRESERVE, GMB_BACKUP_DISK, 1 * MiB);
	unsigned char *dis = alloc_ex("h", GMB_MODE_DISCARD, GMB_BACKUP_DEFAULT, 1 * MiB);
	void *h = (void *)1;
	int x;

	cr_assert(eq(i32, gmb_set_disk_dir(disk_dir), 0));
	cr_assert(eq(i32, gmb_host_copy(NULL, pin, 10, &h), 0));
	cr_assert(eq(ptr, h, NULL), "active without a copy");
	cr_assert(eq(i32, gmb_pause(client(), "h"), 0));
	cr_assert(eq(i32, gmb_host_copy(NULL, pin + 10, 10, &h), 0));
	cr_assert(not(eq(ptr, h, NULL)));
	cr_assert(eq(i32, gmb_host_copy(NULL, dk, 10, &h), 0));
	cr_assert(eq(ptr, h, NULL), "a disk copy has no address");
	cr_assert(eq(i32, gmb_host_copy(NULL, dis, 10, &h), -ENODATA), "discard keeps nothing");
	cr_assert(eq(i32, gmb_host_copy(NULL, &x, 1, &h), -ENOENT));
	cr_assert(eq(i32, gmb_free(client(), pin), 0), "a paused allocation frees, copy and all");
	cr_assert(eq(i32, gmb_host_copy(NULL, pin, 1, &h), -ENOENT));
	cr_assert(eq(i32, gmb_resume(client(), "h"), 0));
}

Test(tms, the_environment_sets_the_base_region_and_the_defaults)
{
	char tag[64], dir[PATH_MAX];
	int mode = -1, backup = -9;
	unsigned char *p = NULL;

	setenv("TMS_INIT_ENABLE", "true", 1);
	setenv("TMS_INIT_ENABLE_CPU_BACKUP", "YES", 1);
	setenv("TMS_INIT_CPU_BACKUP_BACKEND", "mmap", 1);
	setenv("TMS_RETAIN_CPU_BACKUP", "1", 1);
	setenv("TMS_DISK_BACKUP_DIR", disk_dir, 1);
	cr_assert(eq(i32, gmb_region_current_ex(tag, sizeof(tag), &mode, &backup), 1));
	cr_assert(eq(str, tag, "default"));
	cr_assert(eq(i32, mode, GMB_MODE_PRESERVE));
	cr_assert(eq(i32, backup, GMB_BACKUP_MMAP));
	cr_assert(eq(i32, gmb_get_default_backup(), GMB_BACKUP_MMAP));
	cr_assert(eq(i32, gmb_get_retain_host_copy(), 1));
	cr_assert(eq(i32, gmb_get_disk_dir(dir, sizeof(dir)), 0));
	cr_assert(eq(str, dir, disk_dir));
	cr_assert(eq(i32, gmb_get_disk_dir(dir, 3), -ENOBUFS));
	/* No region opened: the whole thread is one from the first allocation. */
	cr_assert(eq(i32, gmb_region_malloc(NULL, (void **)&p, 1 * MiB, 0), 0), "%s",
		  gmb_region_last_error());
	test_fill(p, 1 * MiB, 8);
	cr_assert(eq(i32, tms_pause(NULL), 0));
	cr_assert(eq(i32, tms_resume(NULL), 0));
	cr_assert(test_holds(p, 1 * MiB, 8));
	cr_assert(eq(i32, gmb_region_begin(NULL, GMB_MODE_DISCARD), 0));
	cr_assert(eq(i32, gmb_region_current(NULL, 0, NULL), 0), "a plain region opts out");
	cr_assert(eq(i32, gmb_region_end(), 0));
}

Test(tms, a_bad_backend_variable_fails_region_allocations_with_a_reason)
{
	void *p = NULL;

	setenv("TMS_INIT_CPU_BACKUP_BACKEND", "cuda-magic", 1);
	cr_assert(eq(i32, gmb_get_default_backup(), -EINVAL));
	cr_assert(eq(i32, gmb_region_begin_ex("t", GMB_MODE_PRESERVE, GMB_BACKUP_DEFAULT), 0));
	cr_assert(eq(i32, gmb_region_malloc(NULL, &p, 1 * MiB, 0), -EINVAL));
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "cuda-magic"), NULL)), "%s",
		  gmb_region_last_error());
	cr_assert(eq(i32, gmb_set_default_backup(GMB_BACKUP_DISK), -EINVAL), "pinned or mmap only");
	cr_assert(eq(i32, gmb_set_default_backup(GMB_BACKUP_PINNED), 0));
	cr_assert(eq(i32, gmb_region_malloc(NULL, &p, 1 * MiB, 0), 0), "%s",
		  gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i32, gmb_region_begin_ex("t", GMB_MODE_PRESERVE, 7), -EINVAL));
}

Test(tms, the_entry_points_edit_and_report_the_base_region)
{
	unsigned char *p = NULL, *q = NULL;
	int mode = -1, backup = -9;
	char tag[64];

	cr_assert(not(tms_get_interesting_region()), "no TMS_INIT_ENABLE: off");
	cr_assert(eq(str, (char *)tms_get_current_tag(), "default"));
	tms_set_current_tag("weights");
	tms_set_interesting_region(true);
	tms_set_enable_cpu_backup(true);
	tms_set_cpu_backup_backend("mmap");
	cr_assert(tms_get_interesting_region());
	cr_assert(eq(str, (char *)tms_get_current_tag(), "weights"));
	cr_assert(tms_get_enable_cpu_backup());
	cr_assert(eq(str, (char *)tms_get_cpu_backup_backend(), "mmap"));
	cr_assert(not(tms_get_enable_disk_backup()));
	cr_assert(eq(i32, gmb_region_current_ex(tag, sizeof(tag), &mode, &backup), 1));
	cr_assert(eq(i32, backup, GMB_BACKUP_MMAP));
	p = tms_torch_malloc(1 * MiB, 0, NULL);
	cr_assert(not(eq(ptr, p, NULL)), "%s", gmb_region_last_error());
	test_fill(p, 1 * MiB, 9);
	/* A region of the drop-in's own is what the getters report while open. */
	cr_assert(eq(i32, gmb_region_begin_ex("kv", GMB_MODE_PRESERVE, GMB_BACKUP_DISK), 0));
	cr_assert(eq(str, (char *)tms_get_current_tag(), "kv"));
	cr_assert(tms_get_enable_disk_backup());
	cr_assert(not(tms_get_enable_cpu_backup()));
	cr_assert(eq(i32, gmb_region_end(), 0));
	tms_set_enable_cpu_backup(false);
	q = tms_torch_malloc(1 * MiB, 0, NULL);
	test_fill(q, 1 * MiB, 10);
	cr_assert(eq(i32, tms_pause("weights"), 0));
	cr_assert(not(eq(ptr, tms_get_cpu_backup_pointer(p, 16), NULL)), "mmap copy while paused");
	cr_assert(eq(ptr, tms_get_cpu_backup_pointer(q, 16), NULL), "the discard one has none");
	cr_assert(eq(i32, tms_pause("nosuchtag"), 0), "an unknown tag is no failure");
	cr_assert(eq(i32, tms_resume("weights"), 0));
	cr_assert(test_holds(p, 1 * MiB, 9));
	cr_assert(not(tms_get_retain_cpu_backup()));
	tms_set_retain_cpu_backup(true);
	cr_assert(tms_get_retain_cpu_backup());
	set_memory_margin_bytes(1ULL << 40);
	cr_assert(eq(ptr, tms_torch_malloc(1 * MiB, 0, NULL), NULL), "the margin applies");
	set_memory_margin_bytes(0);
	tms_torch_free(p, 1 * MiB, 0, NULL);
	tms_torch_free(q, 1 * MiB, 0, NULL);
	cr_assert(eq(i64, status_i64("used_bytes"), 0));
	tms_set_interesting_region(false);
	cr_assert(not(tms_get_interesting_region()));
}

/* gmbd's pool and open fds while a client pauses: what its memory comes to. */
static void pause_and_measure(int64_t *pool_paused, int *fds_drop, int *my_fds_drop)
{
	const size_t n = 24 * MiB;
	unsigned char *p = alloc_ex("kv", GMB_MODE_PRESERVE, GMB_BACKUP_PINNED, n);
	int fds, mine;

	test_fill(p, n, 11);
	fds = proc_count_fds(gmbd.pid);
	mine = proc_count_fds(getpid());
	cr_assert(eq(i32, gmb_pause(client(), "kv"), 0), "%s", gmb_last_error(client()));
	/* At once: a drop gmbd would send after its reply must not have had its round trip. */
	*fds_drop = fds - proc_count_fds(gmbd.pid);
	*my_fds_drop = mine - proc_count_fds(getpid());
	*pool_paused = status_i64("pool_bytes");
	cr_assert(eq(i32, gmb_resume(client(), "kv"), 0), "%s", gmb_last_error(client()));
	cr_assert(test_holds(p, n, 11), "bytes back on new chunks");
	cr_assert(eq(i64, status_i64("pool_bytes"), (int64_t)n));
}

Test(tms, a_pause_gives_its_chunks_back_to_the_driver_by_default)
{
	int64_t pool;
	int gmbd_drop, my_drop;

	pause_and_measure(&pool, &gmbd_drop, &my_drop);
	cr_assert(eq(i64, pool, 0), "nothing stays in gmbd's pool when pause returns");
	cr_assert(eq(i32, gmbd_drop, 3), "gmbd closed the three 8 MiB chunks' memfds");
	cr_assert(eq(i32, my_drop, 3), "and so did this client");
}

Test(tms_warm, pool_keep_unlimited_keeps_chunks_and_handles_warm)
{
	int64_t pool;
	int gmbd_drop, my_drop;

	daemon_up("unlimited");
	pause_and_measure(&pool, &gmbd_drop, &my_drop);
	cr_assert(eq(i64, pool, (int64_t)(24 * MiB)), "the paused chunks stay in the pool");
	cr_assert(eq(i32, gmbd_drop, 0));
	cr_assert(eq(i32, my_drop, 0), "the client keeps its handles for the resume");
	stop();
}
