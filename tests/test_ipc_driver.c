/*
 * test_ipc_driver.c - the CUDA driver's IPC calls (cuIpcGetMemHandle,
 * cuIpcOpenMemHandle and its _v2, cuIpcCloseMemHandle) through the preload
 * shim, in real processes: tests/prog_preload over the stand-in runtime
 * (tests/fake_cudart.c) and the stand-in driver it loads locally as
 * libcudart loads libcuda (tests/fake_cuda.c), or globally as a program
 * linked against libcuda has it ("driver"), with libgmb_preload.so
 * preloaded, against a real gmbd (host backend, one device). Proves: gmbd
 * memory shared both ways through the driver's names, the runtime's and
 * the driver's handles the same bytes; every other pointer, handle and
 * flag reaching the stand-in driver unchanged, without loading libgmb;
 * forged gmbd handles refused mapping nothing; the current context's
 * device given access; cuGetProcAddress(_v2) and
 * cudaGetDriverEntryPoint(ByVersion) answering the three names with the
 * shim's functions and every other with the driver's; the functions a
 * lookup hands out serving gmbd memory and passing the rest to the driver
 * when the program does not link it, at the ABI the shim calls.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/ipc_fx.h"
#include "tests/util.h"

/* The hex of gmbd's magic ("GMBIPC") and of the stand-in driver's ("FAKECU"). */
#define GMB_MAGIC_HEX  "474d42495043"
#define FAKE_MAGIC_HEX "46414b454355"

TestSuite(ipc_driver, .init = ipcfx_start, .fini = ipcfx_stop, .timeout = 60);

/* A prog_preload under the shim (tests/ipc_fx.h); @linked: it has the driver
 * in its global scope. */
static void prog_start(struct worker *w, bool linked)
{
	char text[256];

	ipcfx_prog(w, 0);
	if (linked)
		cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "driver"), 0), "%s", text);
}

static void expect(struct worker *w, const char *cmd, const char *want)
{
	cr_assert(eq(str, (char *)ipcfx_run(w, 0, "%s", cmd), (char *)want), "\"%s\"", cmd);
}

/* cuIpcGetMemHandle of @ptr through @route, which must be gmbd's handle. */
static void get_handle(struct worker *w, const char *ptr, const char *route, char h[160])
{
	snprintf(h, 160, "%s", ipcfx_run(w, 0, "cuget %s %s", ptr, route));
	cr_assert(eq(sz, strlen(h), 128));
	cr_assert(eq(i32, strncmp(h, GMB_MAGIC_HEX, 12), 0), "gmbd's magic: %s", h);
}

static void open_handle(struct worker *w, const char *h, const char *route, char q[32])
{
	snprintf(q, 32, "%s", ipcfx_run(w, 0, "cuopen %s %s", h, route));
	cr_assert(strcmp(q, "(nil)") != 0);
}

Test(ipc_driver, driver_calls_share_gmbd_memory_across_processes)
{
	struct worker a, b;
	char p[32], q[32], q2[32], h[160], rt[160];

	ipcfx_exporter(&a, 4 * MiB, 0x5a, p);
	ipcfx_run(&a, 0, "driver");
	get_handle(&a, p, "sym", h);
	snprintf(rt, sizeof(rt), "%s", ipcfx_run(&a, 0, "ipcget %s", p));
	cr_assert(eq(str, h, rt), "the driver's handle is the runtime's");
	prog_start(&b, true);
	open_handle(&b, h, "sym", q);
	ipcfx_run(&b, 0, "check %s %llu 90", q, 4 * MiB);
	ipcfx_run(&b, 0, "fill %s %llu 51", q, 1 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 51", p, 1 * MiB);
	/* The old ABI's symbol and the runtime's open: the same mapping, counted. */
	open_handle(&b, h, "v1", q2);
	cr_assert(eq(str, q, q2));
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "ipcopen %s", h), q));
	ipcfx_run(&b, 0, "gmb");
	cr_assert(eq(i64, ipcfx_used(&b), (int64_t)(4 * MiB)), "imports are charged nothing");
	/* Imported: the owner's tag does not pause until the third close. */
	ipcfx_run(&a, -EBUSY, "pause w");
	ipcfx_run(&b, 0, "cuclose %s sym", q);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&b, 0, "check %s %llu 51", q, 1 * MiB);
	ipcfx_run(&a, -EBUSY, "pause w");
	ipcfx_run(&b, 0, "cuclose %s sym", q);
	ipcfx_run(&a, 0, "pause w");
	ipcfx_run(&a, 0, "resume w");
	/* Neither the driver nor the runtime was asked for any of it. */
	expect(&a, "drvstats",
	       "gets=0 opens=0 opens_v1=0 closes=0 flags=0 ctx=0 ctx_v2=0 lookups=0 ep=0 epv=0");
	expect(&b, "drvstats",
	       "gets=0 opens=0 opens_v1=0 closes=0 flags=0 ctx=2 ctx_v2=0 lookups=0 ep=0 epv=0");
	expect(&a, "ipcstats", "gets=0 opens=0 closes=0");
	expect(&b, "ipcstats", "gets=0 opens=0 closes=0");
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, ipcfx_used(&b), 0));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc_driver, other_pointers_and_handles_reach_the_driver_unchanged)
{
	struct worker a, b;
	char plain[32], h[160], want[160], q[32], mine[32];
	unsigned long long addr;

	prog_start(&a, true);
	snprintf(plain, sizeof(plain), "%s", ipcfx_run(&a, 0, "malloc 4096"));
	snprintf(h, sizeof(h), "%s", ipcfx_run(&a, 0, "cuget %s sym", plain));
	/* The stand-in's handle: its magic, then the address it was given. */
	addr = strtoull(plain, NULL, 0);
	snprintf(want, sizeof(want), "%s0000", FAKE_MAGIC_HEX);
	for (int i = 0; i < 8; i++)
		snprintf(want + 16 + 2 * i, 3, "%02x", (unsigned)(addr >> (8 * i)) & 0xff);
	cr_assert(eq(int, strncmp(h, want, 32), 0), "%s, want %s...", h, want);
	ipcfx_run(&a, CUDA_ERROR_INVALID_VALUE, "cuget 0 sym");
	expect(&a, "loaded", "0");

	prog_start(&b, true);
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "cuopen %s sym", h), plain),
		  "the handle unchanged");
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "cuopen %s v1", h), plain));
	ipcfx_run(&b, 0, "cuclose %s sym", plain);
	ipcfx_run(&b, CUDA_ERROR_INVALID_VALUE, "cuclose 0 sym");
	/* Each call once, to its own symbol, with the caller's flags (LAZY_ENABLE_PEER_ACCESS). */
	expect(&b, "drvstats",
	       "gets=0 opens=1 opens_v1=1 closes=2 flags=1 ctx=0 ctx_v2=0 lookups=0 ep=0 epv=0");
	expect(&b, "loaded", "0");

	/* With libgmb loaded and gmbd memory in the process: still the driver's. */
	ipcfx_run(&b, 0, "gmb");
	ipcfx_run(&b, 0, "region w discard");
	snprintf(mine, sizeof(mine), "%s", ipcfx_run(&b, 0, "malloc 4096"));
	ipcfx_run(&b, 0, "end");
	snprintf(q, sizeof(q), "%s", ipcfx_run(&b, 0, "malloc 4096"));
	cr_assert(eq(int, strncmp(ipcfx_run(&b, 0, "cuget %s sym", q), FAKE_MAGIC_HEX, 12), 0));
	cr_assert(eq(str, (char *)ipcfx_run(&b, 0, "cuopen %s sym", h), plain));
	ipcfx_run(&b, 0, "cuclose %s sym", plain);
	expect(&b, "drvstats",
	       "gets=1 opens=2 opens_v1=1 closes=3 flags=1 ctx=0 ctx_v2=0 lookups=0 ep=0 epv=0");
	expect(&a, "drvstats",
	       "gets=2 opens=0 opens_v1=0 closes=0 flags=0 ctx=0 ctx_v2=0 lookups=0 ep=0 epv=0");
	ipcfx_run(&b, 0, "free %s", mine);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc_driver, forged_gmbd_handles_are_invalid_handles_and_map_nothing)
{
	struct worker a, b;
	char p[32], h[160], f[160];

	ipcfx_exporter(&a, 2 * MiB, 0x22, p);
	get_handle(&a, p, "sym", h);
	prog_start(&b, true);
	srand(11);
	for (int i = 0; i < 32; i++) {
		for (int j = 16; j < 128; j++)
			f[j] = "0123456789abcdef"[rand() % 16];
		memcpy(f, h, 16); /* gmbd's magic and version: reaches gmbd */
		f[128] = 0;
		ipcfx_run(&b, CUDA_ERROR_INVALID_HANDLE, "cuopen %s sym", f);
	}
	/* Truncated: the rest zero. */
	snprintf(f, sizeof(f), "%.100s", h);
	ipcfx_run(&b, CUDA_ERROR_INVALID_HANDLE, "cuopen %s v1", f);
	/* A flipped bit of the magic makes a handle the driver's: it says invalid too. */
	for (int bit = 0; bit < 48; bit++) {
		int byte = bit / 8, v;

		snprintf(f, sizeof(f), "%s", h);
		sscanf(f + 2 * byte, "%2x", &v);
		snprintf(f + 2 * byte, 3, "%02x", v ^ (1 << (bit % 8)));
		f[2 * byte + 2] = h[2 * byte + 2];
		ipcfx_run(&b, CUDA_ERROR_INVALID_HANDLE, "cuopen %s sym", f);
	}
	/* Only those 48 reached the driver. */
	expect(&b, "drvstats",
	       "gets=0 opens=48 opens_v1=0 closes=0 flags=1 ctx=33 ctx_v2=0 lookups=0 ep=0 epv=0");
	ipcfx_run(&b, 0, "gmb");
	cr_assert(eq(i64, ipcfx_used(&b), (int64_t)(2 * MiB)), "nothing was imported");
	cr_assert(not(eq(ptr, strstr(ipcfx_run(&b, 0, "error"), "names no"), NULL)),
		  "the reason is kept");
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

Test(ipc_driver, the_current_contexts_device_gets_access)
{
	struct worker a, b;
	char p[32], q[32], h[160];

	ipcfx_exporter(&a, 2 * MiB, 0x33, p);
	get_handle(&a, p, "sym", h);
	prog_start(&b, true);
	/* The runtime's current device is none of gmbd's; the driver call does not ask it. */
	ipcfx_run(&b, 0, "device 1");
	ipcfx_run(&b, 0, "ctx 1");
	ipcfx_run(&b, CUDA_ERROR_INVALID_DEVICE, "cuopen %s sym", h);
	ipcfx_run(&b, 0, "gmb");
	cr_assert(
		not(eq(ptr, strstr(ipcfx_run(&b, 0, "error"), "device 1 of this process"), NULL)));
	ipcfx_run(&b, 0, "ctx -1");
	ipcfx_run(&b, CUDA_ERROR_INVALID_CONTEXT, "cuopen %s sym", h);
	ipcfx_run(&b, 0, "ctx 0");
	open_handle(&b, h, "sym", q);
	ipcfx_run(&b, 0, "check %s %llu 51", q, 2 * MiB);
	/* The runtime's open asks the runtime's device: 1, none of gmbd's. */
	ipcfx_run(&b, cudaErrorInvalidDevice, "ipcopen %s", h);
	ipcfx_run(&b, 0, "cuclose %s sym", q);
	expect(&b, "drvstats",
	       "gets=0 opens=0 opens_v1=0 closes=0 flags=0 ctx=3 ctx_v2=0 lookups=0 ep=0 epv=0");
	cr_assert(eq(i64, ipcfx_used(&b), (int64_t)(2 * MiB)));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

/* lookup @route of @name at @version answers @want ("<status> <where>"). */
static void expect_lookup(struct worker *w, const char *route, const char *name, int version,
			  int rc, const char *want)
{
	const char *got = ipcfx_run(w, rc, "lookup %s %s %d", route, name, version);

	cr_assert(eq(str, (char *)got, (char *)want), "lookup %s %s %d", route, name, version);
}

Test(ipc_driver, lookups_answer_the_ipc_names_with_the_shim_and_others_with_the_driver)
{
	static const struct {
		const char *route;
		int version;
		const char *ok; /* the status written on success: gpa1 has none */
	} routes[] = { { "gpa", CUDA_VERSION, "0" },
		       { "gpa1", 11030, "7" },
		       { "ep", 13000, "0" },
		       { "epv", CUDA_VERSION, "0" } };
	struct worker w;
	char want[128];

	prog_start(&w, true);
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		const char *r = routes[i].route, *ok = routes[i].ok;
		int v = routes[i].version;

		snprintf(want, sizeof(want), "%s shim:cuIpcGetMemHandle", ok);
		expect_lookup(&w, r, "cuIpcGetMemHandle", v, 0, want);
		snprintf(want, sizeof(want), "%s shim:cuIpcOpenMemHandle_v2", ok);
		expect_lookup(&w, r, "cuIpcOpenMemHandle", v, 0, want);
		snprintf(want, sizeof(want), "%s shim:cuIpcCloseMemHandle", ok);
		expect_lookup(&w, r, "cuIpcCloseMemHandle", v, 0, want);
		snprintf(want, sizeof(want), "%s real", ok);
		expect_lookup(&w, r, "cuCtxGetDevice", v, 0, want);
		expect_lookup(&w, r, "cuGetProcAddress", v, 0, want);
		snprintf(want, sizeof(want), "%s null", strcmp(ok, "7") ? "1" : "7");
		expect_lookup(&w, r, "cuNoSuchCall", v, 500, want);
	}
	/* Whatever version is asked, the open's _v2 ABI (the driver's would be the old one). */
	expect_lookup(&w, "gpa", "cuIpcOpenMemHandle", 10000, 0, "0 shim:cuIpcOpenMemHandle_v2");
	expect_lookup(&w, "epv", "cuIpcOpenMemHandle", 4010, 0, "0 shim:cuIpcOpenMemHandle_v2");
	expect_lookup(&w, "gpa", "cuCtxGetDevice", 2000, 0, "0 real");
	/* Only the other names were asked of the driver (through the runtime for ep, epv). */
	expect(&w, "drvstats",
	       "gets=0 opens=0 opens_v1=0 closes=0 flags=0 ctx=0 ctx_v2=0 lookups=13 ep=3 epv=3");
	/* A CUDA 11 runtime's lookup has no status argument: nothing is written there. */
	ipcfx_run(&w, 0, "rtversion 11080");
	expect_lookup(&w, "ep", "cuIpcGetMemHandle", 11080, 0, "7 shim:cuIpcGetMemHandle");
	expect_lookup(&w, "ep", "cuCtxGetDevice", 11080, 0, "7 real");
	ipcfx_quit(&w);
}

Test(ipc_driver, functions_from_a_lookup_work_without_the_driver_in_the_global_scope)
{
	struct worker a, b;
	char p[32], q[32], h[160], plain[32];

	ipcfx_exporter(&a, 4 * MiB, 0x5a, p);
	get_handle(&a, p, "ep", h);
	cr_assert(eq(str, h, (char *)ipcfx_run(&a, 0, "ipcget %s", p)));
	prog_start(&b, false);
	open_handle(&b, h, "ep", q);
	ipcfx_run(&b, 0, "check %s %llu 90", q, 4 * MiB);
	ipcfx_run(&b, 0, "fill %s %llu 7", q, 4 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 7", p, 4 * MiB);
	ipcfx_run(&b, 0, "cuclose %s epv", q);
	/* The current device from the runtime's lookup by version, at ABI 2000. */
	expect(&b, "drvstats",
	       "gets=0 opens=0 opens_v1=0 closes=0 flags=0 ctx=1 ctx_v2=0 lookups=1 ep=0 epv=1");
	/* Not gmbd's: to the driver's function, which the runtime's lookup gives. */
	snprintf(plain, sizeof(plain), "%s", ipcfx_run(&b, 0, "malloc 4096"));
	cr_assert(eq(int, strncmp(ipcfx_run(&b, 0, "cuget %s ep", plain), FAKE_MAGIC_HEX, 12), 0));
	expect(&b, "drvstats",
	       "gets=1 opens=0 opens_v1=0 closes=0 flags=0 ctx=1 ctx_v2=0 lookups=2 ep=0 epv=2");
	ipcfx_quit(&b);

	/* A runtime before 12.5 has no lookup by version: its own version picks the ABI. */
	prog_start(&b, false);
	ipcfx_run(&b, 0, "byversion 0");
	ipcfx_run(&b, 0, "rtversion 12040");
	open_handle(&b, h, "ep", q);
	ipcfx_run(&b, 0, "cuclose %s ep", q);
	expect(&b, "drvstats",
	       "gets=0 opens=0 opens_v1=0 closes=0 flags=0 ctx=1 ctx_v2=0 lookups=1 ep=1 epv=1");
	ipcfx_quit(&b);
	/* ... which from 13.0 on is cuCtxGetDevice's other ABI: not called, the open fails. */
	prog_start(&b, false);
	ipcfx_run(&b, 0, "byversion 0");
	ipcfx_run(&b, CUDA_ERROR_NOT_INITIALIZED, "cuopen %s ep", h);
	expect(&b, "drvstats",
	       "gets=0 opens=0 opens_v1=0 closes=0 flags=0 ctx=0 ctx_v2=0 lookups=0 ep=0 epv=1");
	ipcfx_quit(&b);
	ipcfx_run(&a, 0, "free %s", p);
	ipcfx_quit(&a);
}
