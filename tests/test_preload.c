/*
 * test_preload.c - the LD_PRELOAD shim (libgmb_preload.so) in real
 * processes: tests/prog_preload, linked against the stand-in runtime
 * libfake_cudart.so, preloaded with the shim, against a real gmbd (host
 * backend, two devices). The stand-in counts what reaches it, so each test
 * sees which side served an allocation or a free. Also: the shim carries no
 * dependency on CUDA's libraries, and PyTorch's entry points route the same
 * way without the shim.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/util.h"

#define MiB (1024ULL * 1024)

static struct gmbd_proc gmbd;
static char build[PATH_MAX];

static void start(void)
{
	static const char *const args[] = {
		"--host-devices", "2", "--host-memory", "64MiB", "--log-level", "warning", NULL
	};

	cr_assert(not(eq(ptr, realpath(test_build_dir(), build), NULL)));
	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(preload, .init = start, .fini = stop, .timeout = 60);

/* The child's environment: ours, plus the broker, the libraries and @extra. */
static void prog_env(bool preload, const char *const *extra)
{
	test_shim_env(build, gmbd.sock, preload);
	for (; extra && *extra; extra++)
		putenv((char *)*extra);
}

struct prog_args {
	bool preload;
	const char *const *extra;
};

static void prog_setup(void *arg)
{
	const struct prog_args *a = arg;

	prog_env(a->preload, a->extra);
}

static void prog_start(struct worker *w, bool preload, const char *const *extra)
{
	struct prog_args a = { .preload = preload, .extra = extra };
	char bin[PATH_MAX + 32];

	snprintf(bin, sizeof(bin), "%s/tests/prog_preload", build);
	cr_assert(eq(i32, worker_spawn(w, bin, prog_setup, &a), 0));
}

/* Sends @cmd, asserts its status is @want; returns the rest of the answer. */
static const char *run(struct worker *w, int want, const char *cmd)
{
	static char text[1 << 15];
	int rc = worker_cmd(w, text, sizeof(text), "%s", cmd);

	cr_assert(eq(i32, rc, want), "\"%s\" answered %d (%s), want %d", cmd, rc, text, want);
	return text;
}

static const char *runf(struct worker *w, int want, const char *fmt, const char *arg)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), fmt, arg);
	return run(w, want, cmd);
}

/* "malloc SIZE" (or another allocating verb) that must succeed: the pointer. */
static void alloc(struct worker *w, const char *cmd, char ptr[32])
{
	snprintf(ptr, 32, "%s", run(w, 0, cmd));
	cr_assert(strcmp(ptr, "(nil)") != 0, "\"%s\" gave no pointer", cmd);
}

static void expect_stats(struct worker *w, const char *want)
{
	cr_assert(eq(str, (char *)run(w, 0, "stats"), (char *)want));
}

static bool owns(struct worker *w, const char *ptr)
{
	return strcmp(runf(w, 0, "owns %s", ptr), "1") == 0;
}

static int64_t used_on(struct worker *w, int dev)
{
	char key[32];

	snprintf(key, sizeof(key), "{\"index\":%d,", dev);
	return json_i64_after(run(w, 0, "status"), key, "used_bytes");
}

static void quit(struct worker *w)
{
	cr_assert(eq(i32, worker_quit(w), 0), "prog_preload did not exit cleanly");
}

Test(preload, shim_needs_no_cuda_library_and_exports_only_the_overrides)
{
	char path[PATH_MAX + 32], out[8192], err[1024];
	char *argv[] = { "/usr/bin/readelf", "-d", path, NULL };
	void *h;

	snprintf(path, sizeof(path), "%s/libgmb_preload.so", build);
	cr_assert(eq(i32, run_capture(argv, NULL, out, err, sizeof(out)), 0), "readelf: %s", err);
	cr_assert(not(eq(ptr, strstr(out, "(NEEDED)"), NULL)), "readelf printed no NEEDED: %s",
		  out);
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		if (!strstr(line, "(NEEDED)"))
			continue;
		for (const char *bad = "cuda\0gmb\0protobuf\0"; *bad; bad += strlen(bad) + 1)
			cr_assert(eq(ptr, strstr(line, bad), NULL), "libgmb_preload.so: %s", line);
	}
	/* Loadable in a process without any CUDA library, as a preload must be. */
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	cr_assert(not(eq(ptr, h, NULL)), "dlopen: %s", dlerror());
	cr_assert(not(eq(ptr, dlsym(h, "cudaMalloc"), NULL)));
	cr_assert(not(eq(ptr, dlsym(h, "cudaFreeAsync"), NULL)));
	for (const char *n = "cuIpcGetMemHandle\0cuIpcOpenMemHandle\0cuIpcOpenMemHandle_v2\0"
			     "cuIpcCloseMemHandle\0cuGetProcAddress\0cuGetProcAddress_v2\0"
			     "cudaGetDriverEntryPoint\0cudaGetDriverEntryPointByVersion\0";
	     *n; n += strlen(n) + 1)
		cr_assert(not(eq(ptr, dlsym(h, n), NULL)), "the driver's IPC calls: %s", n);
	cr_assert(eq(ptr, dlsym(h, "cuCtxGetDevice"), NULL), "only what it overrides");
	cr_assert(not(eq(ptr, dlsym(h, "tms_pause"), NULL)), "torch_memory_saver's entry points");
	cr_assert(not(eq(ptr, dlsym(h, "set_memory_margin_bytes"), NULL)));
	cr_assert(eq(ptr, dlsym(h, "shim_gmb"), NULL), "internals stay hidden");
	dlclose(h);
}

Test(preload, outside_a_region_the_runtime_serves)
{
	struct worker w;
	char p[32];

	prog_start(&w, true, NULL);
	cr_assert(eq(str, (char *)run(&w, 0, "shim"), GMB_VERSION), "the shim is preloaded");
	run(&w, 0, "gmb");
	alloc(&w, "malloc 1048576", p);
	cr_assert(not(owns(&w, p)));
	runf(&w, 0, "free %s", p);
	expect_stats(&w, "mallocs=1 frees=1 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	run(&w, 0, "free 0");
	quit(&w);
}

Test(preload, a_region_allocation_comes_from_gmbd_on_the_current_device)
{
	struct worker w;
	char p[32], cmd[128];

	prog_start(&w, true, NULL);
	run(&w, 0, "gmb");
	run(&w, 0, "region w preserve");
	run(&w, 0, "device 1");
	alloc(&w, "malloc 3000000", p);
	cr_assert(owns(&w, p));
	cr_assert(not(eq(ptr,
			 strstr(run(&w, 0, "status"),
				"{\"name\":\"w\",\"device\":1,"
				"\"state\":\"active\",\"mode\":\"preserve\",\"allocations\":1,"
				"\"bytes\":4194304}"),
			 NULL)),
		  "tag w on device 1, preserve");
	snprintf(cmd, sizeof(cmd), "fill %s 3000000 0x5a", p);
	run(&w, 0, cmd);
	run(&w, 0, "pause w");
	cr_assert(eq(i64, used_on(&w, 1), 0), "paused memory went back to gmbd");
	run(&w, 0, "resume w");
	snprintf(cmd, sizeof(cmd), "check %s 3000000 0x5a", p);
	run(&w, 0, cmd);
	/*
	 * Freed outside the region: ownership decides. The runtime is not asked
	 * to drain: gmb_free drains the device, once (test_client_cycle.c).
	 */
	run(&w, 0, "end");
	runf(&w, 0, "free %s", p);
	expect_stats(&w, "mallocs=0 frees=0 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	cr_assert(eq(i64, used_on(&w, 1), 0));
	quit(&w);
}

Test(preload, a_foreign_pointer_is_freed_by_the_runtime_inside_a_region)
{
	struct worker w;
	char p[32];

	prog_start(&w, true, NULL);
	alloc(&w, "malloc 4096", p);
	run(&w, 0, "gmb");
	run(&w, 0, "region w discard");
	runf(&w, 0, "free %s", p);
	run(&w, 0, "free 0");
	expect_stats(&w, "mallocs=1 frees=1 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	quit(&w);
}

Test(preload, other_threads_stay_outside_this_threads_region)
{
	struct worker w;
	char p[32];

	prog_start(&w, true, NULL);
	run(&w, 0, "gmb");
	run(&w, 0, "region w discard");
	run(&w, 0, "thread 1048576");
	expect_stats(&w, "mallocs=1 frees=1 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	alloc(&w, "malloc 1048576", p);
	cr_assert(owns(&w, p), "while this thread's own allocation is gmbd's");
	quit(&w);
}

Test(preload, regions_nest_and_a_plain_region_opts_out)
{
	struct worker w;
	char a[32], b[32], plain[32];
	const char *st;

	prog_start(&w, true, NULL);
	run(&w, 0, "gmb");
	run(&w, 0, "region a discard");
	run(&w, 0, "region b zero");
	alloc(&w, "malloc 2097152", b);
	run(&w, 0, "end");
	alloc(&w, "malloc 2097152", a);
	run(&w, 0, "region - discard");
	alloc(&w, "malloc 2097152", plain);
	run(&w, 0, "end");
	cr_assert(owns(&w, a) && owns(&w, b) && !owns(&w, plain));
	st = run(&w, 0, "status");
	cr_assert(not(eq(ptr,
			 strstr(st, "{\"name\":\"b\",\"device\":0,\"state\":\"active\","
				    "\"mode\":\"zero\",\"allocations\":1"),
			 NULL)),
		  "%s", st);
	cr_assert(not(eq(ptr,
			 strstr(st, "{\"name\":\"a\",\"device\":0,\"state\":\"active\","
				    "\"mode\":\"discard\",\"allocations\":1"),
			 NULL)),
		  "%s", st);
	expect_stats(&w, "mallocs=1 frees=0 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	run(&w, 0, "end");
	run(&w, -EINVAL, "end");
	quit(&w);
}

Test(preload, the_default_tag_takes_every_allocation_of_the_process)
{
	static const char *const env[] = { "GMB_DEFAULT_TAG=train", "GMB_CLIENT_NAME=trainer",
					   NULL };
	struct worker w;
	char p[32];
	const char *st;

	prog_start(&w, true, env);
	/* Nobody loaded libgmb: the shim does, at the first allocation. */
	alloc(&w, "malloc 2097152", p);
	run(&w, 0, "thread 1048576");
	expect_stats(&w, "mallocs=0 frees=0 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	run(&w, 0, "gmb");
	cr_assert(owns(&w, p), "Python's dlopen finds the shim's copy of libgmb");
	st = run(&w, 0, "status");
	cr_assert(not(eq(ptr, strstr(st, "\"name\":\"trainer\""), NULL)), "%s", st);
	cr_assert(not(eq(ptr,
			 strstr(st, "{\"name\":\"train\",\"device\":0,\"state\":\"active\","
				    "\"mode\":\"preserve\",\"allocations\":1"),
			 NULL)),
		  "%s", st);
	quit(&w);
}

Test(preload, gmbd_out_of_memory_is_cudaErrorMemoryAllocation)
{
	struct worker w;
	char p[32];

	prog_start(&w, true, NULL);
	run(&w, 0, "gmb");
	run(&w, 0, "region w discard");
	run(&w, cudaErrorMemoryAllocation, "malloc 134217728");
	cr_assert(not(eq(ptr, strstr(run(&w, 0, "error"), "budget"), NULL)), "the reason is kept");
	run(&w, 0, "end");
	alloc(&w, "malloc 1048576", p);
	quit(&w);
}

Test(preload, without_gmbd_a_region_allocation_fails_and_the_process_lives)
{
	static const char *const env[] = { "GMB_SOCKET=/nonexistent/gmbd.sock", NULL };
	struct worker w;
	char p[32];

	prog_start(&w, true, env);
	run(&w, 0, "gmb");
	run(&w, 0, "region w discard");
	run(&w, cudaErrorDevicesUnavailable, "malloc 1048576");
	cr_assert(not(eq(ptr, strstr(run(&w, 0, "error"), "no gmbd"), NULL)));
	run(&w, 0, "end");
	alloc(&w, "malloc 1048576", p);
	quit(&w);
}

Test(preload, a_paused_tag_refuses_with_cudaErrorNotPermitted)
{
	struct worker w;
	char p[32];

	prog_start(&w, true, NULL);
	run(&w, 0, "gmb");
	run(&w, 0, "region w discard");
	alloc(&w, "malloc 1048576", p);
	run(&w, 0, "pause w");
	run(&w, cudaErrorNotPermitted, "malloc 1048576");
	run(&w, 0, "resume w");
	alloc(&w, "malloc 1048576", p);
	quit(&w);
}

Test(preload, async_allocations_follow_regions_unless_the_stream_captures)
{
	struct worker w;
	char b[32], captured[32];

	prog_start(&w, true, NULL);
	run(&w, 0, "gmb");
	run(&w, 0, "region w discard");
	alloc(&w, "amalloc 1048576", b);
	cr_assert(owns(&w, b));
	run(&w, 0, "capture 1");
	alloc(&w, "amalloc 1048576", captured);
	cr_assert(not(owns(&w, captured)), "a capture records the runtime's allocation");
	runf(&w, cudaErrorStreamCaptureUnsupported, "afree %s", b);
	run(&w, 0, "capture 0");
	runf(&w, 0, "afree %s", b);
	runf(&w, 0, "afree %s", captured);
	expect_stats(&w, "mallocs=0 frees=0 bad_frees=0 syncs=0 amallocs=1 afrees=1");
	cr_assert(eq(i64, used_on(&w, 0), 0));
	quit(&w);
}

Test(preload, torch_entry_points_route_by_region_without_the_shim)
{
	struct worker w;
	char rt[32], gm[32];

	prog_start(&w, false, NULL);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "shim"), -ENOENT), "no shim here");
	run(&w, 0, "gmb");
	alloc(&w, "tmalloc 1048576 0", rt);
	run(&w, 0, "region w discard");
	alloc(&w, "tmalloc 3000000 1", gm);
	cr_assert(owns(&w, gm) && !owns(&w, rt));
	cr_assert(eq(i64, used_on(&w, 1), (int64_t)(4 * MiB)), "on the device PyTorch named");
	run(&w, 0, "end");
	runf(&w, 0, "tfree %s", gm);
	runf(&w, 0, "tfree %s", rt);
	expect_stats(&w, "mallocs=1 frees=1 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	cr_assert(eq(i64, used_on(&w, 1), 0));
	quit(&w);
}

Test(preload, a_default_tag_without_libgmb_fails_the_allocation_loudly)
{
	static const char *const env[] = { "GMB_DEFAULT_TAG=t", "GMB_LIB=/nonexistent/libgmb.so",
					   NULL };
	struct worker w;

	prog_start(&w, true, env);
	run(&w, cudaErrorInitializationError, "malloc 1048576");
	cr_assert(not(eq(ptr, strstr(run(&w, 0, "error"), "/nonexistent/libgmb.so"), NULL)));
	expect_stats(&w, "mallocs=0 frees=0 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	quit(&w);
}

Test(preload, tms_init_enable_makes_the_process_one_region_through_the_shims_entry_points)
{
	static const char *const env[] = { "TMS_INIT_ENABLE=1", "TMS_INIT_ENABLE_CPU_BACKUP=1",
					   "GMB_CLIENT_NAME=tmsjob", NULL };
	struct worker w;
	char p[32], q[32], cmd[96];

	prog_start(&w, true, env);
	/* Nobody loaded libgmb and no region was opened: the shim loads it at the first malloc. */
	alloc(&w, "malloc 6912", p);
	expect_stats(&w, "mallocs=0 frees=0 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	snprintf(cmd, sizeof(cmd), "fill %s 6912 7", p);
	run(&w, 0, cmd);
	cr_assert(eq(str, (char *)run(&w, 0, "tms get tag"), "default"));
	cr_assert(eq(str, (char *)run(&w, 0, "tms get interesting"), "1"));
	cr_assert(eq(str, (char *)run(&w, 0, "tms get cpu"), "1"));
	run(&w, 0, "tms pause -");
	cr_assert(strcmp(runf(&w, 0, "tms copy %s 6912", p), "(nil)") != 0, "a copy while paused");
	run(&w, 0, "tms resume -");
	snprintf(cmd, sizeof(cmd), "check %s 6912 7", p);
	run(&w, 0, cmd);
	cr_assert(eq(str, (char *)runf(&w, 0, "tms copy %s 16", p), "(nil)"), "resumed: no copy");
	/* A discard allocation next to it, a pause, a free while paused (torch's pool teardown). */
	run(&w, 0, "tms set cpu 0");
	cr_assert(eq(str, (char *)run(&w, 0, "tms get cpu"), "0"));
	alloc(&w, "malloc 4096", q);
	run(&w, 0, "tms pause -");
	cr_assert(eq(str, (char *)runf(&w, 0, "tms copy %s 16", q), "(nil)"), "discard: none");
	cr_assert(strcmp(runf(&w, 0, "tms copy %s 16", p), "(nil)") != 0, "p keeps its own mode");
	runf(&w, 0, "free %s", p);
	run(&w, 0, "tms resume -");
	runf(&w, 0, "free %s", q);
	run(&w, 0, "tms set interesting 0");
	cr_assert(eq(str, (char *)run(&w, 0, "tms get interesting"), "0"));
	alloc(&w, "malloc 4096", p);
	/* The frees of gmbd memory drained through libgmb, not the runtime: no sync here. */
	expect_stats(&w, "mallocs=1 frees=0 bad_frees=0 syncs=0 amallocs=0 afrees=0");
	quit(&w);
}

Test(preload, tms_entry_points_without_gmbd_fail_without_exiting)
{
	static const char *const env[] = { "GMB_SOCKET=/nonexistent/gmbd.sock", NULL };
	struct worker w;

	prog_start(&w, true, env);
	cr_assert(eq(str, (char *)run(&w, 0, "tms get tag"), "default"));
	run(&w, 0, "tms pause -"); /* no default client: nothing to pause */
	run(&w, 0, "tms set interesting 1");
	run(&w, cudaErrorDevicesUnavailable, "malloc 4096"); /* no gmbd: the process lives */
	quit(&w);
}
