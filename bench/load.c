/*
 * load.c - gmbd under load (make bench-load): CLIENTS libgmb clients in
 * one process, OPS mixed operations each (tests/loadgen.c: alloc, free,
 * pause, resume, status), against a real gmbd on the host backend; while
 * they run, status is asked for every 20 ms both through gmb_status_json()
 * on a tool connection and by running gmbctl status. Prints a table:
 * operations per second and the latency percentiles of each.
 *
 *   load [CLIENTS [OPS]]      default 64 clients x 2000 operations
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "include/gmb.h"
#include "tests/loadgen.h"
#include "tests/util.h"

#define LOAD_MAX_SAMPLES 100000
#define LOAD_PERIOD_MS	 20

struct load_samples {
	double ms[LOAD_MAX_SAMPLES];
	unsigned n, failed;
};

static struct {
	const char *sock;
	volatile int stop;
	struct load_samples api, ctl;
} ld;

static double load_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void load_add(struct load_samples *s, double ms, int ok)
{
	if (!ok)
		s->failed++;
	else if (s->n < LOAD_MAX_SAMPLES)
		s->ms[s->n++] = ms;
}

static void *load_sampler(void *arg)
{
	char gmbctl[256];
	gmb_client *t;
	struct timespec period = { 0, LOAD_PERIOD_MS * 1000000L };

	snprintf(gmbctl, sizeof(gmbctl), "%s/gmbctl", test_build_dir());
	if (gmb_connect_flags(ld.sock, "bench-status", GMB_CONNECT_TOOL, &t) < 0)
		return NULL;
	while (!ld.stop) {
		char *argv[] = { gmbctl, "-s", (char *)ld.sock, "status", NULL };
		char *json = NULL;
		double t0 = load_now_ms();
		int rc = gmb_status_json(t, &json);

		load_add(&ld.api, load_now_ms() - t0, rc == 0);
		free(json);
		t0 = load_now_ms();
		rc = run_capture(argv, NULL, NULL, NULL, 0);
		load_add(&ld.ctl, load_now_ms() - t0, rc == 0);
		nanosleep(&period, NULL);
	}
	gmb_close(t);
	return NULL;
}

static int load_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double load_pct(struct load_samples *s, double p)
{
	size_t i;

	if (s->n == 0)
		return 0;
	i = (size_t)(p * (double)(s->n - 1) + 0.5);
	return s->ms[i];
}

static void load_row(const char *what, struct load_samples *s)
{
	qsort(s->ms, s->n, sizeof(s->ms[0]), load_cmp);
	printf("| %-22s | %7u | %6u | %8.2f | %8.2f | %8.2f |\n", what, s->n, s->failed,
	       load_pct(s, 0.5), load_pct(s, 0.99), s->n ? s->ms[s->n - 1] : 0.0);
}

int main(int argc, char **argv)
{
	static const char *const args[] = { "--host-memory", "1GiB", "--log-level", "err", NULL };
	struct loadgen g = { .clients = argc > 1 ? (unsigned)atoi(argv[1]) : 64,
			     .ops = argc > 2 ? (unsigned)atoi(argv[2]) : 2000,
			     .seed = (unsigned)time(NULL) };
	struct gmbd_proc gmbd;
	pthread_t sampler;
	double t0, secs;
	int rc;

	if (gmbd_start(&gmbd, args) < 0) {
		fprintf(stderr, "load: gmbd did not start\n");
		return 1;
	}
	ld.sock = g.sock = gmbd.sock;
	pthread_create(&sampler, NULL, load_sampler, NULL);
	t0 = load_now_ms();
	rc = loadgen_run(&g);
	secs = (load_now_ms() - t0) / 1e3;
	ld.stop = 1;
	pthread_join(sampler, NULL);
	gmbd_stop(&gmbd);
	printf("load: %u clients x %u operations (seed %u), host backend, %s build\n\n", g.clients,
	       g.ops, g.seed, test_build_dir());
	printf("| %-22s | %7s | %6s | %8s |\n", "load", "ops", "failed", "ops/s");
	printf("|------------------------|---------|--------|----------|\n");
	printf("| %-22s | %7llu | %6llu | %8.0f |\n\n", "mixed operations",
	       (unsigned long long)g.done, (unsigned long long)g.failed, (double)g.done / secs);
	printf("| %-22s | %7s | %6s | %8s | %8s | %8s |\n", "status during the load", "samples",
	       "failed", "p50 ms", "p99 ms", "max ms");
	printf("|------------------------|---------|--------|----------|----------|----------|\n");
	load_row("gmb_status_json()", &ld.api);
	load_row("gmbctl status", &ld.ctl);
	if (rc < 0)
		fprintf(stderr, "load: %s\n", g.first_error);
	return rc < 0 ? 1 : 0;
}
