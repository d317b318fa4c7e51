/*
 * test_metrics.c - gmbd's Prometheus metrics against a real gmbd and real
 * clients: the exposition text read with curl (families, label escaping,
 * counters, histograms), and a real Prometheus server (Debian's
 * prometheus package) that scrapes gmbd and answers a query for a metric.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/util.h"

#define MiB (1024ULL * 1024)
#define CAP (1 << 20)

static struct gmbd_proc gmbd;
static char out[CAP], err[4096];
static int port;

static void start(void)
{
	static const char *const args[] = { "--host-memory", "256MiB", "--metrics-listen",
					    "127.0.0.1:0", NULL };
	char line[1024];
	FILE *f;

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
	f = fopen(gmbd.log, "r");
	cr_assert(not(eq(ptr, f, NULL)));
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "metrics served");

		if (p && (p = strstr(p, " port=")))
			port = atoi(p + 6);
	}
	fclose(f);
	cr_assert(gt(i32, port, 0), "no port in gmbd's log");
}

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(metrics, .init = start, .fini = stop, .timeout = 90);

static bool has(const char *s, const char *needle)
{
	return strstr(s, needle) != NULL;
}

/* curl -s URL into out; its exit status. */
static int curl(const char *url)
{
	char *argv[] = { "/usr/bin/curl", "-s", "-S", "--max-time", "5", (char *)url, NULL };

	return run_capture(argv, NULL, out, err, CAP);
}

static int scrape(void)
{
	char url[128];

	snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", port);
	return curl(url);
}

Test(metrics, exposition_text)
{
	struct worker w;
	char text[256];

	cr_assert(eq(i32, worker_start(&w, gmbd.sock), 0));
	/* A name a label value must escape. */
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "connect w\"x\\y"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "mode kv preserve"), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv %llu", 4 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "pause kv"), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc big %llu", 512 * MiB), -ENOMEM));
	cr_assert(eq(i32, scrape(), 0), "%s", err);
	cr_expect(has(out, "# HELP gmbd_device_budget_bytes ") &&
			  has(out, "# TYPE gmbd_device_budget_bytes gauge\n"),
		  "%s", out);
	cr_expect(has(out, "gmbd_device_budget_bytes{device=\"0\",name=\"host0\"} 268435456\n"));
	cr_expect(has(out, "gmbd_device_outside_bytes{device=\"0\",name=\"host0\"} 0\n"), "%s",
		  out);
	cr_expect(
		has(out,
		    "gmbd_tag_bytes{client=\"w\\\"x\\\\y\",client_id=\"1\",tag=\"kv\"} 4194304\n"),
		"%s", out);
	cr_expect(
		has(out, "gmbd_tag_paused{client=\"w\\\"x\\\\y\",client_id=\"1\",tag=\"kv\"} 1\n"));
	cr_expect(has(out, "gmbd_pauses_total 1\n"));
	cr_expect(has(out, "# TYPE gmbd_imports_total counter\ngmbd_imports_total 0\n"), "%s", out);
	cr_expect(has(out, "gmbd_import_closes_total 0\n"), "%s", out);
	cr_expect(has(out, "gmbd_refusals_total{reason=\"budget\"} 1\n"));
	cr_expect(has(out, "gmbd_host_copy_bytes_total{direction=\"to_host\"} 4194304\n"), "%s",
		  out);
	cr_expect(has(out, "# TYPE gmbd_pause_duration_seconds histogram\n"));
	cr_expect(has(out, "gmbd_pause_duration_seconds_bucket{le=\"+Inf\"} 1\n"));
	cr_expect(has(out, "gmbd_pause_duration_seconds_count 1\n"));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "resume kv"), 0));
	cr_assert(eq(i32, scrape(), 0), "%s", err);
	cr_expect(has(out, "gmbd_resumes_total 1\n"));
	cr_expect(has(out, "gmbd_host_copy_bytes_total{direction=\"from_host\"} 4194304\n"), "%s",
		  out);
	worker_quit(&w);

	/* Another path is a 404, and gmbd keeps serving. */
	snprintf(text, sizeof(text), "http://127.0.0.1:%d/other", port);
	cr_expect(eq(i32, curl(text), 0));
	cr_expect(has(out, "not found"), "%s", out);
	cr_expect(eq(i32, scrape(), 0));
}

/* A free TCP port on 127.0.0.1 (bound, read, closed). */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), p;

	cr_assert(fd >= 0);
	cr_assert(eq(i32, bind(fd, (struct sockaddr *)&a, sizeof(a)), 0));
	getsockname(fd, (struct sockaddr *)&a, &len);
	p = ntohs(a.sin_port);
	close(fd);
	return p;
}

Test(metrics, prometheus_scrapes_gmbd)
{
	char cfg[512], data[512], listen[64], url[256], cfgtext[512], logp[512];
	struct worker w;
	int prom_port, found = 0;
	pid_t prom;
	FILE *f;

	if (access("/usr/bin/prometheus", X_OK) != 0)
		cr_skip_test("the prometheus package is not installed (make deps)");
	snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", gmbd.dir);
	snprintf(data, sizeof(data), "%s/tsdb", gmbd.dir);
	snprintf(logp, sizeof(logp), "%s/prometheus.log", gmbd.dir);
	snprintf(cfgtext, sizeof(cfgtext),
		 "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
		 "scrape_configs:\n  - job_name: gmbd\n    static_configs:\n"
		 "      - targets: ['127.0.0.1:%d']\n",
		 port);
	f = fopen(cfg, "w");
	cr_assert(not(eq(ptr, f, NULL)));
	fputs(cfgtext, f);
	fclose(f);
	prom_port = free_port();
	snprintf(listen, sizeof(listen), "--web.listen-address=127.0.0.1:%d", prom_port);

	cr_assert(eq(i32, worker_start(&w, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "connect scraped"), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv %llu", 4 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "pause kv"), 0));

	prom = fork();
	cr_assert(prom >= 0);
	if (prom == 0) {
		char cf[600], st[600];
		FILE *lf = freopen(logp, "w", stderr);

		(void)lf;
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		snprintf(cf, sizeof(cf), "--config.file=%s", cfg);
		snprintf(st, sizeof(st), "--storage.tsdb.path=%s", data);
		execl("/usr/bin/prometheus", "prometheus", cf, st, listen, (char *)NULL);
		_exit(127);
	}
	snprintf(
		url, sizeof(url),
		"http://127.0.0.1:%d/api/v1/query?query=gmbd_pauses_total%%7Bjob%%3D%%22gmbd%%22%%7D",
		prom_port);
	/* Bounded: Prometheus starts, scrapes within a second or two. */
	for (int i = 0; i < 300 && !found; i++) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };

		if (curl(url) == 0 && has(out, "\"status\":\"success\"") && has(out, "\"1\"]"))
			found = 1;
		else
			nanosleep(&ts, NULL);
	}
	kill(prom, SIGTERM);
	waitpid(prom, NULL, 0);
	worker_quit(&w);
	cr_expect(eq(i32, found, 1), "Prometheus never answered gmbd_pauses_total 1: %s", out);
	cr_expect(has(out, "\"__name__\":\"gmbd_pauses_total\""), "%s", out);
}

Test(metrics, named_objects)
{
	struct worker w, p;
	char text[256], want[256];

	cr_assert(eq(i32, scrape(), 0), "%s", err);
	cr_expect(has(out, "# TYPE gmbd_objects gauge\ngmbd_objects 0\n"), "%s", out);
	cr_expect(has(out, "# TYPE gmbd_object_bytes gauge\n# HELP gmbd_object_versions "), "%s",
		  out);
	cr_expect(eq(ptr, strstr(out, "gmbd_object_bytes{"), NULL), "%s", out);
	cr_expect(has(out, "gmbd_object_publishes_total 0\n"), "%s", out);
	cr_expect(has(out, "gmbd_object_pauses_total 0\n"), "%s", out);

	cr_assert(eq(i32, worker_start(&w, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "connect pub"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv %llu", 4 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv2 %llu", 2 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "publish kv weights"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "publish kv2 weights"), 0), "%s",
		  text);
	cr_assert(eq(i32, scrape(), 0), "%s", err);
	cr_expect(has(out, "gmbd_objects 1\n"), "%s", out);
	snprintf(want, sizeof(want), "gmbd_object_bytes{uid=\"%u\",name=\"weights\"} 6291456\n",
		 (unsigned)getuid());
	cr_expect(has(out, want), "%s", out);
	snprintf(want, sizeof(want), "gmbd_object_versions{uid=\"%u\",name=\"weights\"} 2\n",
		 (unsigned)getuid());
	cr_expect(has(out, want), "%s", out);
	/* The publisher keeps each of its versions open. */
	snprintf(want, sizeof(want), "gmbd_object_readers{uid=\"%u\",name=\"weights\"} 2\n",
		 (unsigned)getuid());
	cr_expect(has(out, want), "%s", out);
	cr_expect(has(out, "gmbd_object_publishes_total 2\n"), "%s", out);
	cr_expect(has(out, "gmbd_object_drops_total 0\n"), "%s", out);
	snprintf(want, sizeof(want), "gmbd_object_paused{uid=\"%u\",name=\"weights\"} 0\n",
		 (unsigned)getuid());
	cr_expect(has(out, want), "%s", out);
	cr_expect(has(out, "# TYPE gmbd_object_paused gauge\n"), "%s", out);

	/* Paused by another process of the uid; the publisher, reading both
	 * versions, follows. */
	cr_assert(eq(i32, worker_start(&p, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&p, text, sizeof(text), "connect pauser"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&p, text, sizeof(text), "object_pause weights"), 0), "%s",
		  text);
	cr_assert(eq(i32, scrape(), 0), "%s", err);
	snprintf(want, sizeof(want), "gmbd_object_paused{uid=\"%u\",name=\"weights\"} 1\n",
		 (unsigned)getuid());
	cr_expect(has(out, want), "%s", out);
	cr_assert(eq(i32, worker_cmd(&p, text, sizeof(text), "object_resume weights"), 0), "%s",
		  text);
	cr_assert(eq(i32, scrape(), 0), "%s", err);
	cr_expect(has(out, "gmbd_object_pauses_total 1\n"), "%s", out);
	cr_expect(has(out, "gmbd_object_resumes_total 1\n"), "%s", out);
	snprintf(want, sizeof(want), "gmbd_object_paused{uid=\"%u\",name=\"weights\"} 0\n",
		 (unsigned)getuid());
	cr_expect(has(out, want), "%s", out);
	worker_quit(&p);
	worker_quit(&w);
}
