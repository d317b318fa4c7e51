/*
 * testlog.c - each test's own log files, shown for a failing test only.
 *
 * What a test's gmbd writes to stderr (util.c's gmbd_start() and the fake
 * service manager's gmbd), and what a test captures from it, goes to
 * $GMB_BUILD_DIR/tests/logs/PROGRAM/SUITE.TEST.WHAT.log rather than to the
 * terminal, so that a passing run prints Criterion's lines alone. The
 * runner's report hooks empty PROGRAM's folder before the first test and
 * print the tail of every file of a test that failed, crashed or timed out,
 * just before Criterion's [FAIL] line; the whole files stay for reading.
 *
 * Linked into the Criterion test programs only (not into bench/, which links
 * util.c without Criterion): util.c finds testlog_path() through a weak
 * declaration and keeps its logs in the test's temporary folder without it.
 * `make check` searches the folders for sanitizer reports, which fail the
 * run whether or not the test that started that gmbd failed.
 */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/util.h"

#define TESTLOG_TAIL 80 /* lines of each file shown for a failed test */

/* The test program's file name: the same in the runner and its workers
 * (whose program_invocation_name BoxFort changes). */
static const char *testlog_program(void)
{
	static char exe[256];
	ssize_t n;

	if (!exe[0]) {
		n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		exe[n > 0 ? n : 0] = '\0';
	}
	return strrchr(exe, '/') ? strrchr(exe, '/') + 1 : "tests";
}

/* $GMB_BUILD_DIR/tests/logs/PROGRAM into @buf; made when @make. */
static int testlog_dir(char *buf, size_t cap, bool make)
{
	int n = snprintf(buf, cap, "%s/tests/logs", test_build_dir());

	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	if (make && mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	n = snprintf(buf, cap, "%s/tests/logs/%s", test_build_dir(), testlog_program());
	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	if (make && mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int testlog_path(const char *what, char *buf, size_t cap)
{
	char dir[256];
	int rc, n;

	if (!criterion_current_test || !criterion_current_suite)
		return -ESRCH; /* not inside a test's worker */
	rc = testlog_dir(dir, sizeof(dir), true);
	if (rc < 0)
		return rc;
	n = snprintf(buf, cap, "%s/%s.%s.%s.log", dir, criterion_current_suite->name,
		     criterion_current_test->name, what);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* The last TESTLOG_TAIL lines of @path on stderr, under a header. */
static void testlog_show(const char *path)
{
	static char *ring[TESTLOG_TAIL];
	char *line = NULL;
	size_t len = 0, n = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return;
	while (getline(&line, &len, f) >= 0) {
		free(ring[n % TESTLOG_TAIL]);
		ring[n++ % TESTLOG_TAIL] = line;
		line = NULL;
		len = 0;
	}
	free(line);
	fclose(f);
	if (n == 0)
		return;
	fprintf(stderr, "---- %s: %s%zu lines ----\n", path, n > TESTLOG_TAIL ? "the last of " : "",
		n);
	for (size_t i = n > TESTLOG_TAIL ? n - TESTLOG_TAIL : 0; i < n; i++) {
		fputs(ring[i % TESTLOG_TAIL], stderr);
		free(ring[i % TESTLOG_TAIL]);
		ring[i % TESTLOG_TAIL] = NULL;
	}
	fprintf(stderr, "---- end of %s ----\n", path);
}

/* Every file of the test @t (SUITE.TEST.*.log), in name order. */
static void testlog_show_test(const struct criterion_test *t)
{
	char dir[256], prefix[512], path[1024];
	struct dirent **names;
	int n;

	if (testlog_dir(dir, sizeof(dir), false) < 0)
		return;
	snprintf(prefix, sizeof(prefix), "%s.%s.", t->category, t->name);
	n = scandir(dir, &names, NULL, alphasort);
	for (int i = 0; i < n; i++) {
		if (strncmp(names[i]->d_name, prefix, strlen(prefix)) == 0) {
			snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
			testlog_show(path);
		}
		free(names[i]);
	}
	if (n >= 0)
		free(names);
}

/* Before the first test: no file of an earlier run is taken for this one's. */
ReportHook(PRE_ALL)(struct criterion_test_set *set)
{
	char dir[256], path[1024];
	struct dirent *e;
	DIR *d;

	if (testlog_dir(dir, sizeof(dir), false) < 0 || !(d = opendir(dir)))
		return;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
	closedir(d);
}

/* A failure or a time-out ends here; a crash only reaches TEST_CRASH. */
ReportHook(POST_TEST)(struct criterion_test_stats *st)
{
	if (st->test_status == CR_STATUS_FAILED || st->crashed || st->timed_out)
		testlog_show_test(st->test);
}

ReportHook(TEST_CRASH)(struct criterion_test_stats *st)
{
	testlog_show_test(st->test);
}
