/*
 * test_spin.c - bounded busy waits (common/spin.c), and that gmbd
 * (--spin-us) and libgmb ($GMB_SPIN_US) spend them where they say and
 * nowhere when told 0: the CPU a process burnt over a few requests is
 * the witness, since spinning changes no reply.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/env.h"
#include "common/err.h"
#include "common/spin.h"
#include "include/gmb.h"
#include "tests/util.h"

#define MS	      1000000ULL
#define MiB	      (1024ULL * 1024)
#define SPIN_TEST_US  40000 /* long enough to show in CPU time, short enough for a test */
#define SPIN_TEST_OPS 8
#define SPIN_TEST_GAP 60 /* ms between operations: past the budget, so each spins in full */

TestSuite(spin, .timeout = 60);

static bool flag_ready(void *arg)
{
	return __atomic_load_n((int *)arg, __ATOMIC_ACQUIRE) != 0;
}

static void *flag_set_later(void *arg)
{
	usleep(20000);
	__atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
	return NULL;
}

Test(spin, returns_once_ready_within_the_budget)
{
	pthread_t th;
	int flag = 0;
	uint64_t t0 = test_now_ns();

	cr_assert(eq(i32, pthread_create(&th, NULL, flag_set_later, &flag), 0));
	cr_expect(spin_until(flag_ready, &flag, 5000 * MS), "the flag was set after 20 ms");
	cr_expect(lt(u64, test_now_ns() - t0, 2000 * MS), "it returned long before the budget");
	pthread_join(th, NULL);
}

Test(spin, gives_up_at_the_budget)
{
	int flag = 0;
	uint64_t t0 = test_now_ns();

	cr_expect(not(spin_until(flag_ready, &flag, 30 * MS)));
	cr_expect(ge(u64, test_now_ns() - t0, 30 * MS), "it spun the whole budget");
	t0 = test_now_ns();
	cr_expect(not(spin_until(flag_ready, &flag, 0)), "a budget of 0 looks once");
	cr_expect(lt(u64, test_now_ns() - t0, 10 * MS));
	flag = 1;
	cr_expect(spin_until(flag_ready, &flag, 0), "ready already: true even with no budget");
}

static void *write_later(void *arg)
{
	usleep(20000);
	if (write(*(int *)arg, "x", 1) != 1)
		return (void *)1;
	return NULL;
}

Test(spin, sees_a_socket_become_readable)
{
	int sv[2];
	pthread_t th;
	void *res;

	cr_assert(eq(i32, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0));
	cr_expect(not(spin_fd_readable(sv[0], 10 * MS)), "nothing to read yet");
	cr_assert(eq(i32, pthread_create(&th, NULL, write_later, &sv[1]), 0));
	cr_expect(spin_fd_readable(sv[0], 5000 * MS));
	pthread_join(th, &res);
	cr_expect(eq(ptr, res, NULL));
	close(sv[1]);
	char c;
	cr_expect(eq(i64, read(sv[0], &c, 1), 1));
	cr_expect(spin_fd_readable(sv[0], 0), "a hang-up counts: the read that follows sees it");
	close(sv[0]);
}

Test(spin, env_uint_takes_numbers_in_range_only)
{
	char err[ERR_MSG_MAX] = "";
	unsigned long us = 7;

	const char *good[][2] = {
		{ "0", "0" }, { "200", "200" }, { "100000", "100000" }, { "", "7" }
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		us = 7;
		setenv("GMB_SPIN_US", good[i][0], 1);
		cr_expect(
			eq(i32, env_uint("GMB_SPIN_US", SPIN_MAX_US, "microseconds", &us, err), 0));
		cr_expect(eq(u64, us, strtoul(good[i][1], NULL, 10)), "\"%s\"", good[i][0]);
	}
	const char *bad[] = { "-1", "100001", "x", "20us", " 5", "1e3", "99999999999999999999" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		us = 7;
		setenv("GMB_SPIN_US", bad[i], 1);
		cr_expect(eq(i32, env_uint("GMB_SPIN_US", SPIN_MAX_US, "microseconds", &us, err),
			     -EINVAL),
			  "\"%s\"", bad[i]);
		cr_expect(eq(u64, us, 7), "\"%s\" left the value alone", bad[i]);
		cr_expect(not(eq(ptr, strstr(err, "GMB_SPIN_US"), NULL)), "%s", err);
	}
	unsetenv("GMB_SPIN_US");
}

/* CPU time (user + system) of @pid from /proc, in ms; -1 if unreadable. */
static long proc_cpu_ms(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut, st;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* Fields 14 and 15 (utime, stime) follow "(comm) state" and 10 more. */
	p = strrchr(buf, ')');
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

static long self_cpu_ms(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

/*
 * A gmbd spinning @daemon_us, this process's libgmb @client_us; the CPU
 * both burnt over SPIN_TEST_OPS allocate + free pairs, SPIN_TEST_GAP ms apart.
 */
static void cpu_over_ops(const char *daemon_us, const char *client_us, long *daemon_ms,
			 long *client_ms)
{
	const char *const args[] = { "--host-memory", "64MiB",	 "--log-level", "warning",
				     "--spin-us",     daemon_us, NULL };
	struct gmbd_proc d;
	gmb_client *c;
	long d0, c0;
	void *p;

	cr_assert(eq(i32, gmbd_start(&d, args), 0), "gmbd did not start");
	setenv("GMB_SPIN_US", client_us, 1);
	cr_assert(eq(i32, gmb_connect(d.sock, "spinner", &c), 0), "%s", gmb_last_error(NULL));
	usleep(SPIN_TEST_GAP * 1000); /* the hello's spin ends */
	d0 = proc_cpu_ms(d.pid);
	c0 = self_cpu_ms();
	for (int i = 0; i < SPIN_TEST_OPS; i++) {
		cr_assert(eq(i32, gmb_malloc(c, &p, 2 * MiB, 0, "t"), 0), "%s", gmb_last_error(c));
		cr_assert(eq(i32, gmb_free(c, p), 0));
		usleep(SPIN_TEST_GAP * 1000);
	}
	*daemon_ms = proc_cpu_ms(d.pid) - d0;
	*client_ms = self_cpu_ms() - c0;
	gmb_close(c);
	cr_expect(eq(i32, gmbd_stop(&d), 0));
	cr_assert(ge(i64, d0, 0), "gmbd's /proc/PID/stat was readable");
}

/*
 * One side (gmbd, or this process's libgmb) told to spin 40 ms, the other
 * 0, then both 0: over 16 requests the told one burns >= 320 ms of CPU,
 * the other and both at 0 a few ms.
 */
static void spins_only_when_told(bool daemon)
{
	const char *who = daemon ? "gmbd --spin-us" : "GMB_SPIN_US";
	long on[2], off[2]; /* gmbd's, the client's */
	int me = daemon ? 0 : 1;

	cpu_over_ops(daemon ? "40000" : "0", daemon ? "0" : "40000", &on[0], &on[1]);
	cpu_over_ops("0", "0", &off[0], &off[1]);
	cr_expect(ge(i64, on[me], 160), "%s 40000 burnt %ld ms of CPU", who, on[me]);
	cr_expect(lt(i64, on[1 - me], 100), "the other side, at 0, burnt %ld ms", on[1 - me]);
	cr_expect(lt(i64, off[me], 100), "%s 0 burnt %ld ms of CPU", who, off[me]);
}

Test(spin, gmbd_spins_after_each_request_only_when_told)
{
	spins_only_when_told(true);
}

/* The reader polls after each reply: GMB_SPIN_US's budget, or nothing at 0. */
Test(spin, libgmb_spins_after_each_reply_only_when_told)
{
	spins_only_when_told(false);
}

Test(spin, a_bad_spin_value_fails_the_connect_and_says_which)
{
	const char *const args[] = { "--host-memory", "64MiB", "--log-level", "warning", NULL };
	struct gmbd_proc d;
	gmb_client *c = NULL;

	cr_assert(eq(i32, gmbd_start(&d, args), 0), "gmbd did not start");
	setenv("GMB_SPIN_US", "lots", 1);
	cr_expect(eq(i32, gmb_connect(d.sock, "spinner", &c), -EINVAL));
	cr_expect(eq(ptr, c, NULL));
	cr_expect(not(eq(ptr, strstr(gmb_last_error(NULL), "GMB_SPIN_US"), NULL)), "%s",
		  gmb_last_error(NULL));
	setenv("GMB_SPIN_US", "100001", 1);
	cr_expect(eq(i32, gmb_connect(d.sock, "spinner", &c), -EINVAL));
	unsetenv("GMB_SPIN_US");
	cr_expect(eq(i32, gmbd_stop(&d), 0));
}
