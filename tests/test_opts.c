/*
 * test_opts.c - gmbd's command line (daemon/service/opts.c): defaults, sizes with
 * every suffix, overflow, bad values and options, and that --help lists
 * every option with its default.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/size.h"
#include "daemon/service/opts.h"

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)
#define GiB (1ULL << 30)
#define TiB (1ULL << 40)

static struct gmbd_opts o;
static char err[OPTS_ERR_MAX];

/* opts_parse() over a NULL-terminated argument list after "gmbd". */
static int parse(const char *first, ...)
{
	char *argv[32] = { "gmbd" };
	int argc = 1;
	va_list ap;

	va_start(ap, first);
	for (const char *a = first; a; a = va_arg(ap, const char *))
		argv[argc++] = (char *)a;
	va_end(ap);
	return opts_parse(&o, argc, argv, err);
}

TestSuite(opts, .timeout = 10);

Test(opts, defaults)
{
	unsetenv("GMB_SOCKET");
	cr_assert(eq(i32, parse(NULL), OPTS_RUN));
	cr_assert(eq(str, (char *)o.socket, "/run/gmbd/gmbd.sock"));
	cr_assert(eq(str, (char *)o.backend, "auto"));
	cr_assert(eq(i32, o.host_devices, 1));
	cr_assert(eq(u64, o.host_memory, 8 * GiB));
	cr_assert(eq(u64, o.host_granularity, 2 * MiB));
	cr_assert(eq(u64, o.max_chunk, 1 * GiB));
	cr_assert(eq(u64, o.pool_keep, 0), "a pause gives memory to the driver by default");
	cr_assert(eq(u64, o.budget, 0));
	cr_assert(not(o.reserve_set));
	/* Not "gmb", the socket's group: using the broker is not controlling others. */
	cr_assert(eq(str, (char *)o.admin_group, "gmb-admin"));
	cr_assert(eq(u32, o.control_timeout, 30));
	cr_assert(eq(i32, o.log_level, LOG_LVL_INFO));
	/* Outside systemd: gmbd's user and group only, not every local user. */
	cr_assert(eq(u32, o.socket_mode, 0660));
	/* A connection that never says hello, or a flood of them, is bounded. */
	cr_assert(eq(u32, o.hello_timeout, 10));
	cr_assert(eq(u32, o.max_conns_per_uid, 256));
	/* A request's next is polled for 200 us before gmbd blocks (spin.h). */
	cr_assert(eq(u32, o.spin_us, 200));
	/* The chunk bound per uid is gmbd's to derive from its open-file limit. */
	cr_assert(not(o.max_chunks_per_uid_set));
	cr_assert(eq(ptr, (void *)o.socket_group, NULL));
}

Test(opts, spin_us_takes_microseconds_up_to_a_tenth_of_a_second)
{
	cr_assert(eq(i32, parse("--spin-us", "0", NULL), OPTS_RUN), "%s", err);
	cr_assert(eq(u32, o.spin_us, 0));
	cr_assert(eq(i32, parse("--spin-us", "100000", NULL), OPTS_RUN), "%s", err);
	cr_assert(eq(u32, o.spin_us, 100000));
}

Test(opts, max_chunks_per_uid_takes_a_number_or_auto)
{
	cr_assert(eq(i32, parse("--max-chunks-per-uid", "500", NULL), OPTS_RUN), "%s", err);
	cr_assert(o.max_chunks_per_uid_set);
	cr_assert(eq(u64, o.max_chunks_per_uid, 500));
	cr_assert(eq(i32, parse("--max-chunks-per-uid", "0", NULL), OPTS_RUN), "%s", err);
	cr_assert(o.max_chunks_per_uid_set, "0 is no bound, not the derived one");
	cr_assert(eq(u64, o.max_chunks_per_uid, 0));
	cr_assert(eq(i32, parse("--max-chunks-per-uid", "9", "--max-chunks-per-uid=auto", NULL),
		     OPTS_RUN),
		  "%s", err);
	cr_assert(not(o.max_chunks_per_uid_set));
}

Test(opts, socket_mode_and_group)
{
	cr_assert(eq(i32, parse("--socket-mode", "0600", "--socket-group", "users", NULL),
		     OPTS_RUN),
		  "%s", err);
	cr_assert(eq(u32, o.socket_mode, 0600));
	cr_assert(eq(str, (char *)o.socket_group, "users"));
	cr_assert(eq(i32, parse("--socket-mode=666", NULL), OPTS_RUN), "%s", err);
	cr_assert(eq(u32, o.socket_mode, 0666));
}

Test(opts, socket_default_follows_the_environment)
{
	setenv("GMB_SOCKET", "/tmp/x/gmbd.sock", 1);
	cr_assert(eq(i32, parse(NULL), OPTS_RUN));
	cr_assert(eq(str, (char *)o.socket, "/tmp/x/gmbd.sock"));
	cr_assert(eq(i32, parse("--socket", "/a/b.sock", NULL), OPTS_RUN));
	cr_assert(eq(str, (char *)o.socket, "/a/b.sock"));
	unsetenv("GMB_SOCKET");
}

Test(opts, every_option_is_stored)
{
	cr_assert(eq(i32,
		     parse("--backend=host", "--host-devices", "4", "--host-memory=16G",
			   "--host-granularity", "4MiB", "--max-chunk=512M", "--pool-keep=0",
			   "--budget", "6GiB", "--reserve", "0", "--admin-group", "wheel",
			   "--control-timeout", "5", "--log-level", "debug", NULL),
		     OPTS_RUN),
		  "%s", err);
	cr_assert(eq(str, (char *)o.backend, "host"));
	cr_assert(eq(i32, o.host_devices, 4));
	cr_assert(eq(u64, o.host_memory, 16 * GiB));
	cr_assert(eq(u64, o.host_granularity, 4 * MiB));
	cr_assert(eq(u64, o.max_chunk, 512 * MiB));
	cr_assert(eq(u64, o.pool_keep, 0));
	cr_assert(eq(u64, o.budget, 6 * GiB));
	cr_assert(o.reserve_set);
	cr_assert(eq(u64, o.reserve, 0));
	cr_assert(eq(str, (char *)o.admin_group, "wheel"));
	cr_assert(eq(u32, o.control_timeout, 5));
	cr_assert(eq(i32, o.log_level, LOG_LVL_DEBUG));
	cr_assert(eq(i32, parse("--pool-keep", "unlimited", NULL), OPTS_RUN));
	cr_assert(eq(u64, o.pool_keep, UINT64_MAX));
}

Test(opts, size_suffixes)
{
	static const struct {
		const char *text;
		uint64_t bytes;
	} ok[] = {
		{ "0", 0 },
		{ "4096", 4096 },
		{ "1K", KiB },
		{ "1KiB", KiB },
		{ "3M", 3 * MiB },
		{ "3MiB", 3 * MiB },
		{ "8G", 8 * GiB },
		{ "8GiB", 8 * GiB },
		{ "2T", 2 * TiB },
		{ "2TiB", 2 * TiB },
		{ "5g", 5 * GiB },
		{ "7mib", 7 * MiB },
		{ "18446744073709551615", UINT64_MAX },
		{ "16777215T", 16777215 * TiB },
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 1;

		cr_assert(eq(i32, size_parse(ok[i].text, &v), 0), "%s", ok[i].text);
		cr_assert(eq(u64, v, ok[i].bytes), "%s", ok[i].text);
	}
}

/* A decimal fraction where it comes to whole bytes; never a fraction of one. */
Test(opts, size_decimal_fractions)
{
	static const struct {
		const char *text;
		uint64_t bytes;
	} ok[] = {
		{ "1.5GiB", 3 * GiB / 2 },
		{ "1.5G", 3 * GiB / 2 },
		{ "0.5K", 512 },
		{ "2.25MiB", 9 * MiB / 4 },
		{ "1.0", 1 },
		{ "0.125T", TiB / 8 },
		{ "1.000000000000000000G", GiB },
	};
	static const char *const partial[] = { "1.5", "0.1K", "1.3K", "0.0000001G" };
	uint64_t v;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = 1;
		cr_assert(eq(i32, size_parse(ok[i].text, &v), 0), "%s", ok[i].text);
		cr_assert(eq(u64, v, ok[i].bytes), "%s", ok[i].text);
	}
	for (size_t i = 0; i < sizeof(partial) / sizeof(partial[0]); i++)
		cr_assert(eq(i32, size_parse(partial[i], &v), -EDOM), "%s", partial[i]);
	cr_assert(eq(i32, size_parse("16777215.5T", &v), 0));
	cr_assert(eq(u64, v, 16777215 * TiB + TiB / 2));
	cr_assert(eq(i32, size_parse("16777216.5T", &v), -ERANGE));
	cr_assert(eq(i32, size_parse("1.0000000000000000000G", &v), -EINVAL), "19 decimals");

	cr_assert(eq(i32, parse("--host-memory", "1.5GiB", NULL), OPTS_RUN), "%s", err);
	cr_assert(eq(u64, o.host_memory, 3 * GiB / 2));
	cr_assert(eq(i32, parse("--host-memory", "1.3K", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "'1.3K' is not a whole number of bytes"), NULL)), "%s",
		  err);
}

/* Quoted as the user wrote it (not as 0xbb8), with what would do. */
Test(opts, a_granularity_that_is_no_power_of_two_is_quoted_as_written)
{
	cr_assert(eq(i32, parse("--host-granularity", "3000", NULL), -EINVAL));
	cr_assert(
		not(eq(ptr, strstr(err, "--host-granularity: '3000' is not a power of two"), NULL)),
		"%s", err);
	cr_assert(eq(ptr, strstr(err, "0x"), NULL), "%s", err);
	cr_assert(eq(i32, parse("--host-granularity", "6KiB", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "'6KiB'"), NULL)), "%s", err);
	cr_assert(eq(i32, parse("--host-granularity", "64KiB", NULL), OPTS_RUN), "%s", err);
	cr_assert(eq(u64, o.host_granularity, 64 * KiB));
}

Test(opts, size_overflow_and_junk)
{
	static const char *const too_big[] = { "18446744073709551616", "16777216T", "17179869184G",
					       "99999999999999999999999" };
	static const char *const junk[] = { "",	   "G",	     "-1",   "+1",  " 1",  "1 ",
					    "1GB", "1Gi",    "0x10", "1KK", "ten", "1.",
					    ".5G", "1.5.0G", "1,5G", "1e3" };
	uint64_t v;

	for (size_t i = 0; i < sizeof(too_big) / sizeof(too_big[0]); i++)
		cr_assert(eq(i32, size_parse(too_big[i], &v), -ERANGE), "%s", too_big[i]);
	for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++)
		cr_assert(eq(i32, size_parse(junk[i], &v), -EINVAL), "'%s'", junk[i]);
	cr_assert(eq(i32, parse("--budget", "16777216T", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "too large"), NULL)), "%s", err);
}

Test(opts, bad_values_name_the_option)
{
	static const char *const bad[][2] = {
		{ "--backend", "gpu" },
		{ "--host-devices", "0" },
		{ "--host-devices", "65" },
		{ "--host-devices", "2x" },
		{ "--host-memory", "0" },
		{ "--host-granularity", "0" },
		{ "--max-chunk", "1.3K" },
		{ "--budget", "0" },
		{ "--reserve", "-2G" },
		{ "--control-timeout", "0" },
		{ "--control-timeout", "86401" },
		{ "--log-level", "chatty" },
		{ "--socket", "" },
		{ "--admin-group", "" },
		{ "--socket-mode", "0888" },
		{ "--socket-mode", "01777" },
		{ "--socket-mode", "0066" },
		{ "--socket-mode", "" },
		{ "--socket-mode", "-1" },
		{ "--socket-group", "" },
		{ "--hello-timeout", "3601" },
		{ "--spin-us", "100001" },
		{ "--spin-us", "-1" },
		{ "--spin-us", "1ms" },
		{ "--max-connections-per-uid", "x" },
		{ "--max-chunks-per-uid", "-1" },
		{ "--max-chunks-per-uid", "many" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert(eq(i32, parse(bad[i][0], bad[i][1], NULL), -EINVAL), "%s %s", bad[i][0],
			  bad[i][1]);
		cr_assert(not(eq(ptr, strstr(err, bad[i][0]), NULL)), "'%s' does not name %s", err,
			  bad[i][0]);
	}
}

Test(opts, socket_path_must_fit_sun_path)
{
	char path[200];

	memset(path, 'a', sizeof(path) - 1);
	path[0] = '/';
	path[sizeof(path) - 1] = '\0';
	cr_assert(eq(i32, parse("--socket", path, NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "longer than"), NULL)), "%s", err);
}

Test(opts, bad_options)
{
	cr_assert(eq(i32, parse("--frobnicate", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "--frobnicate"), NULL)), "%s", err);
	cr_assert(eq(i32, parse("-x", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "'x'"), NULL)), "%s", err);
	cr_assert(eq(i32, parse("--budget", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "needs an argument"), NULL)), "%s", err);
	cr_assert(eq(i32, parse("--help=yes", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "takes no argument"), NULL)), "%s", err);
	cr_assert(eq(i32, parse("--host", "1", NULL), -EINVAL), "ambiguous prefix");
	cr_assert(eq(i32, parse("extra", NULL), -EINVAL));
	cr_assert(not(eq(ptr, strstr(err, "extra"), NULL)), "%s", err);
}

Test(opts, help_and_version)
{
	cr_assert(eq(i32, parse("--help", NULL), OPTS_HELP));
	cr_assert(eq(i32, parse("-h", NULL), OPTS_HELP));
	cr_assert(eq(i32, parse("--version", NULL), OPTS_VERSION));
	cr_assert(eq(i32, parse("-V", NULL), OPTS_VERSION));
	/* Parsing again after a failure starts over. */
	cr_assert(eq(i32, parse("--bogus", NULL), -EINVAL));
	cr_assert(eq(i32, parse("--max-chunk", "2G", NULL), OPTS_RUN));
	cr_assert(eq(u64, o.max_chunk, 2 * GiB));
}

Test(opts, help_lists_every_option_and_its_default)
{
	static const char *const want[] = {
		"--socket=PATH",
		"/run/gmbd/gmbd.sock",
		"--backend=auto|cuda|host",
		"--host-devices=N",
		"--host-memory=BYTES",
		"(default: 8GiB)",
		"--host-granularity=BYTES",
		"(default: 2MiB)",
		"--max-chunk=BYTES",
		"(default: 1GiB)",
		"--pool-keep=BYTES|unlimited",
		"0: a pause gives memory to the driver",
		"--budget=BYTES",
		"minus --reserve",
		"--reserve=BYTES",
		"2GiB on cuda, 0 on host",
		"--admin-group=NAME",
		"(default: gmb-admin)",
		"--control-timeout=SECONDS",
		"(default: 30)",
		"--log-level=LEVEL",
		"(default: info)",
		"--max-chunks-per-uid=N|auto",
		"(default: auto (from RLIMIT_NOFILE))",
		"-h, --help",
		"-V, --version",
	};
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	opts_print_help(f);
	fclose(f);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert(not(eq(ptr, strstr(text, want[i]), NULL)), "help lacks '%s'", want[i]);
	for (char *line = text; *line;) {
		char *nl = strchr(line, '\n');
		size_t n = nl ? (size_t)(nl - line) : strlen(line);

		cr_assert(le(sz, n, 80), "help line over 80 columns: %.*s", (int)n, line);
		line += n + (nl != NULL);
	}
	free(text);
}

/* gmbd's log lines write sizes with common/size.h, as gmbctl does. */
Test(opts, size_format)
{
	char b[SIZE_STR_MAX];

	cr_assert(eq(str, (char *)size_str(0, b), "0 B"));
	cr_assert(eq(str, (char *)size_str(1023, b), "1023 B"));
	cr_assert(eq(str, (char *)size_str(2 * MiB, b), "2.0 MiB"));
	cr_assert(eq(str, (char *)size_str(8 * GiB, b), "8.0 GiB"));
	cr_assert(eq(str, (char *)size_str(3 * GiB / 2, b), "1.5 GiB"));
	cr_assert(eq(str, (char *)size_str(UINT64_MAX, b), "16.0 EiB"));
}
