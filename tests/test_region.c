/*
 * test_region.c - regions (client/lib/hook/region.c) and what the hooks
 * build on (client/lib/hook/): the per-thread region stack, $GMB_DEFAULT_TAG,
 * allocation in the current region's tag and mode, ownership and host-copy
 * queries, the memory margin, the process's default client, and PyTorch's
 * entry points, against a real gmbd (host backend).
 *
 * Each test runs in its own process (Criterion's), so the once-per-process
 * state (environment, default client) starts fresh in each.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/util.h"

#define MiB (1024ULL * 1024)

static struct gmbd_proc gmbd;

static void start(void)
{
	static const char *const args[] = { "--host-memory", "64MiB", "--log-level", "warning",
					    NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
	setenv("GMB_SOCKET", gmbd.sock, 1);
	/* These count bytes per allocation; packing is test_pack's. */
	setenv("GMB_PACK", "off", 1);
}

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(region, .timeout = 10);
TestSuite(hook, .init = start, .fini = stop, .timeout = 60);

/* The current region as "tag/mode", "none", or "err=N". */
static const char *current(void)
{
	static __thread char buf[160];
	char tag[130];
	int mode = -1, rc = gmb_region_current(tag, sizeof(tag), &mode);

	if (rc < 0)
		snprintf(buf, sizeof(buf), "err=%d", rc);
	else if (rc == 0)
		snprintf(buf, sizeof(buf), "none");
	else
		snprintf(buf, sizeof(buf), "%s/%d", tag, mode);
	return buf;
}

Test(region, regions_nest_and_the_innermost_decides)
{
	cr_assert(eq(str, (char *)current(), "none"));
	cr_assert(eq(i32, gmb_region_begin("weights", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_region_begin("kv", GMB_MODE_DISCARD), 0));
	cr_assert(eq(str, (char *)current(), "kv/0"));
	cr_assert(eq(i32, gmb_region_begin(NULL, GMB_MODE_DISCARD), 0));
	cr_assert(eq(str, (char *)current(), "none"), "a plain region is outside");
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(str, (char *)current(), "weights/2"));
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(str, (char *)current(), "none"));
}

static void *other_thread(void *arg)
{
	snprintf(arg, 160, "%s", current());
	return NULL;
}

Test(region, another_thread_sees_none_of_this_threads_regions)
{
	char seen[160] = "";
	pthread_t t;

	cr_assert(eq(i32, gmb_region_begin("weights", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, pthread_create(&t, NULL, other_thread, seen), 0));
	pthread_join(t, NULL);
	cr_assert(eq(str, seen, "none"));
	cr_assert(eq(str, (char *)current(), "weights/2"));
}

Test(region, bad_arguments_are_refused_with_a_reason)
{
	char big[200], tag[4];

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	cr_assert(eq(i32, gmb_region_begin("t", 7), -EINVAL));
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "mode"), NULL)));
	cr_assert(eq(i32, gmb_region_begin("", GMB_MODE_ZERO), -EINVAL));
	cr_assert(eq(i32, gmb_region_begin(big, GMB_MODE_ZERO), -ENAMETOOLONG));
	cr_assert(eq(i32, gmb_region_end(), -EINVAL), "nothing to end");
	for (int i = 0; i < GMB_REGION_MAX; i++)
		cr_assert(eq(i32, gmb_region_begin("deep", GMB_MODE_ZERO), 0));
	cr_assert(eq(i32, gmb_region_begin("deep", GMB_MODE_ZERO), -E2BIG));
	cr_assert(eq(i32, gmb_region_current(tag, sizeof(tag), NULL), -ENOBUFS));
	cr_assert(eq(i32, gmb_region_current(NULL, 0, NULL), 1));
}

Test(region, the_default_tag_applies_below_every_region)
{
	setenv("GMB_DEFAULT_TAG", "train", 1);
	cr_assert(eq(str, (char *)current(), "train/2"), "preserve unless told otherwise");
	cr_assert(eq(i32, gmb_region_begin(NULL, GMB_MODE_DISCARD), 0));
	cr_assert(eq(str, (char *)current(), "none"));
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i32, gmb_region_begin("kv", GMB_MODE_ZERO), 0));
	cr_assert(eq(str, (char *)current(), "kv/1"));
}

Test(region, a_bad_default_mode_is_an_error_not_a_guess)
{
	setenv("GMB_DEFAULT_TAG", "train", 1);
	setenv("GMB_DEFAULT_MODE", "keep", 1);
	cr_assert(eq(str, (char *)current(), "err=-22"));
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "GMB_DEFAULT_MODE"), NULL)));
	cr_assert(eq(i32, gmb_region_begin("kv", GMB_MODE_ZERO), 0));
	cr_assert(eq(str, (char *)current(), "kv/1"), "an explicit region still works");
}

/* With gmbd. */

static const char *status(gmb_client *c)
{
	static char buf[1 << 14];
	char *json = NULL;

	cr_assert(eq(i32, gmb_status_json(c, &json), 0));
	snprintf(buf, sizeof(buf), "%s", json);
	free(json);
	return buf;
}

/* "{name:TAG,...,state:STATE,mode:MODE" appears in @c's status. */
static void expect_tag(gmb_client *c, const char *tag, const char *state, const char *mode)
{
	char want[256];
	const char *st = status(c);

	snprintf(want, sizeof(want),
		 "{\"name\":\"%s\",\"device\":0,\"state\":\"%s\",\"mode\":\"%s\"", tag, state,
		 mode);
	cr_assert(not(eq(ptr, strstr(st, want), NULL)), "want %s in %s", want, st);
}

Test(hook, an_allocation_takes_the_regions_tag_and_mode)
{
	gmb_client *c;
	void *p, *q;

	cr_assert(eq(i32, gmb_connect(NULL, "explicit", &c), 0));
	cr_assert(eq(i32, gmb_region_begin("z", GMB_MODE_ZERO), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, &p, MiB, 0), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, &q, MiB, 0), 0));
	expect_tag(c, "z", "active", "zero");
	expect_tag(c, "default", "active", "discard");
	cr_assert(eq(i32, gmb_owns(c, p), 1));
	cr_assert(eq(i32, gmb_owns(c, (char *)p + 1), 0), "only allocation addresses");
	cr_assert(eq(i32, gmb_owns(NULL, p), 0), "no default client was made");
	gmb_close(c);
}

Test(hook, a_tags_mode_only_grows_and_zero_against_preserve_is_refused)
{
	gmb_client *c;
	unsigned char *a, *b;

	cr_assert(eq(i32, gmb_connect(NULL, "modes", &c), 0));
	cr_assert(eq(i32, gmb_region_begin("t", GMB_MODE_DISCARD), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, (void **)&a, MiB, 0), 0));
	cr_assert(eq(i32, gmb_region_begin("t", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, (void **)&b, MiB, 0), 0));
	expect_tag(c, "t", "active", "preserve");
	memset(a, 0xa1, MiB);
	memset(b, 0xb2, MiB);
	cr_assert(eq(i32, gmb_pause(c, "t"), 0));
	cr_assert(eq(i32, gmb_resume(c, "t"), 0));
	cr_assert(eq(u8, a[MiB - 1], 0xa1), "the earlier allocation is preserved too");
	cr_assert(eq(u8, b[0], 0xb2));
	cr_assert(eq(i32, gmb_region_begin("t", GMB_MODE_ZERO), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, (void **)&b, MiB, 0), -EINVAL));
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "preserve"), NULL)));
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, (void **)&b, MiB, 0), 0), "discard asks nothing");
	expect_tag(c, "t", "active", "preserve");
	gmb_close(c);
}

Test(hook, a_paused_tag_refuses_and_keeps_its_mode)
{
	gmb_client *c;
	void *p;

	cr_assert(eq(i32, gmb_connect(NULL, "paused", &c), 0));
	cr_assert(eq(i32, gmb_region_begin("t", GMB_MODE_DISCARD), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, &p, MiB, 0), 0));
	cr_assert(eq(i32, gmb_pause(c, "t"), 0));
	cr_assert(eq(i32, gmb_region_begin("t", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, &p, MiB, 0), -EBUSY));
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "paused"), NULL)));
	expect_tag(c, "t", "paused", "discard");
	gmb_close(c);
}

Test(hook, the_host_copy_exists_only_while_a_preserve_tag_is_paused)
{
	gmb_client *c;
	unsigned char *w, *k;
	void *h = (void *)1;

	cr_assert(eq(i32, gmb_connect(NULL, "backup", &c), 0));
	cr_assert(eq(i32, gmb_region_begin("w", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, (void **)&w, 4 * MiB, 0), 0));
	cr_assert(eq(i32, gmb_region_begin("k", GMB_MODE_DISCARD), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, (void **)&k, MiB, 0), 0));
	for (size_t i = 0; i < 4 * MiB; i++)
		w[i] = (unsigned char)(i * 13);
	cr_assert(eq(i32, gmb_host_copy(c, w + 4096, 100, &h), 0));
	cr_assert(eq(ptr, h, NULL), "active: no copy");
	cr_assert(eq(i32, gmb_pause(c, NULL), 0));
	cr_assert(eq(i32, gmb_host_copy(c, w + 4096, 100, &h), 0));
	cr_assert(not(eq(ptr, h, NULL)));
	for (size_t i = 0; i < 100; i++)
		cr_assert(eq(u8, ((unsigned char *)h)[i], (unsigned char)((4096 + i) * 13)));
	cr_assert(eq(i32, gmb_host_copy(c, w + 4 * MiB - 1, 2, &h), -ENOENT), "past the end");
	cr_assert(eq(i32, gmb_host_copy(c, k, 10, &h), -ENODATA), "discard keeps no copy");
	cr_assert(eq(i32, gmb_host_copy(c, &h, 1, &h), -ENOENT));
	cr_assert(eq(i32, gmb_host_copy(NULL, w, 1, &h), -ENOENT), "no default client");
	gmb_close(c);
}

Test(hook, the_memory_margin_refuses_what_would_leave_too_little)
{
	gmb_client *c;
	void *p;

	cr_assert(eq(i32, gmb_connect(NULL, "margin", &c), 0));
	gmb_set_memory_margin(40 * MiB);
	cr_assert(eq(i32, gmb_region_malloc(c, &p, 16 * MiB, 0), 0), "64 - 16 leaves 48");
	cr_assert(eq(i32, gmb_region_malloc(c, &p, 16 * MiB, 0), -ENOMEM), "would leave 32");
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "margin"), NULL)));
	gmb_set_memory_margin(0);
	cr_assert(eq(i32, gmb_region_malloc(c, &p, 16 * MiB, 0), 0));
	gmb_close(c);
}

Test(hook, the_default_client_is_made_once_from_the_environment)
{
	gmb_client *d, *again, *ctl;
	void *p;

	setenv("GMB_CLIENT_NAME", "dflt", 1);
	setenv("GMB_CONTROL", "accept", 1);
	cr_assert(eq(i32, gmb_default_client(NULL, NULL, &d), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_default_client("/elsewhere", "other", &again), 1));
	cr_assert(eq(ptr, again, d));
	cr_assert(eq(i32, gmb_region_begin("kv", GMB_MODE_DISCARD), 0));
	cr_assert(eq(i32, gmb_region_malloc(NULL, &p, MiB, 0), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_owns(NULL, p), 1));
	/* GMB_CONTROL=accept: an operator can pause it. */
	cr_assert(eq(i32, gmb_connect_flags(NULL, "op", GMB_CONNECT_TOOL, &ctl), 0));
	cr_assert(eq(i32, gmb_control(ctl, "dflt", GMB_OP_PAUSE, NULL), 0), "%s",
		  gmb_last_error(ctl));
	expect_tag(ctl, "kv", "paused", "discard");
	gmb_close(ctl);
}

Test(hook, a_forked_child_makes_its_own_default_client)
{
	gmb_client *d, *ctl;
	int st = 0;
	pid_t pid;

	setenv("GMB_CLIENT_NAME", "parent", 1);
	cr_assert(eq(i32, gmb_default_client(NULL, NULL, &d), 0));
	pid = fork();
	if (pid == 0) {
		gmb_client *mine;

		setenv("GMB_CLIENT_NAME", "child", 1);
		_exit(gmb_default_client(NULL, NULL, &mine) == 0 && mine != d ? 0 : 1);
	}
	cr_assert(eq(i32, (int)waitpid(pid, &st, 0), (int)pid));
	cr_assert(eq(i32, WEXITSTATUS(st), 0), "the child connected anew");
	cr_assert(eq(i32, gmb_connect_flags(NULL, "op", GMB_CONNECT_TOOL, &ctl), 0));
	cr_assert(not(eq(ptr, strstr(status(d), "\"name\":\"parent\""), NULL)),
		  "the parent's lives");
	gmb_close(ctl);
}

Test(hook, the_default_client_reports_why_it_cannot_connect)
{
	gmb_client *d = (gmb_client *)1;

	setenv("GMB_SOCKET", "/nonexistent/gmbd.sock", 1);
	cr_assert(eq(i32, gmb_default_client(NULL, NULL, &d), -ENOENT));
	cr_assert(eq(ptr, d, NULL));
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "no gmbd"), NULL)), "%s",
		  gmb_region_last_error());
	setenv("GMB_SOCKET", gmbd.sock, 1);
	setenv("GMB_CONTROL", "maybe", 1);
	cr_assert(eq(i32, gmb_default_client(NULL, NULL, &d), -EINVAL));
	unsetenv("GMB_CONTROL");
	cr_assert(eq(i32, gmb_default_client(NULL, NULL, &d), 0), "a later call retries");
}

Test(hook, torch_entry_points_allocate_in_regions_only)
{
	gmb_client *ctl;
	void *p;

	cr_assert(eq(i32, gmb_region_begin("torch", GMB_MODE_DISCARD), 0));
	p = gmb_torch_malloc(3000000, 0, NULL);
	cr_assert(not(eq(ptr, p, NULL)), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_owns(NULL, p), 1));
	cr_assert(eq(ptr, gmb_torch_malloc(0, 0, NULL), NULL));
	cr_assert(eq(i32, gmb_region_end(), 0));
	/* This test process has no CUDA runtime to hand the call to. */
	cr_assert(eq(ptr, gmb_torch_malloc(4096, 0, NULL), NULL));
	cr_assert(not(eq(ptr, strstr(gmb_region_last_error(), "cudaMalloc"), NULL)));
	gmb_torch_free(p, 3000000, 0, NULL);
	cr_assert(eq(i32, gmb_owns(NULL, p), 0));
	cr_assert(eq(i32, gmb_connect_flags(NULL, "op", GMB_CONNECT_TOOL, &ctl), 0));
	cr_assert(eq(i64, json_i64(status(ctl), "used_bytes"), 0), "freed at gmbd");
	gmb_close(ctl);
}

Test(hook, the_library_knows_its_own_file)
{
	const char *p = gmb_library_path();

	cr_assert(eq(chr, p[0], '/'), "an absolute path: %s", p);
	cr_assert(eq(i32, access(p, R_OK), 0));
}
