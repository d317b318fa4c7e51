/*
 * switch_bench.cu - 64 GiB switched between two clients of one user by
 * `gmbctl switch` (gmb_switch(): FROM's chunks handed straight to TO) against
 * `gmbctl pause` + `gmbctl resume` (gmb_control() twice) through the driver,
 * in one run on one gmbd started with --pool-keep 0 (a pause gives memory
 * back to the driver, so the pair releases and creates).
 *
 * Two workers (role "worker", posix_spawn of this binary) connect with a
 * control handler that agrees, allocate GMB_SWITCH_GIB GiB (64) in 1 GiB
 * allocations of tag "w" and then obey lines on stdin ("fill SEED",
 * "check SEED"), answering one byte on fd 3. This process (the operator,
 * a tool client) then times, alternating A->B and B->A, GMB_SWITCH_ROUNDS
 * (5) switches, then as many pause+resume pairs, reading the device's
 * chunks_created / chunks_released counters of status around each: the
 * switch must create and release nothing, the pair must do both. After the
 * last switch the active worker writes and checks its memory.
 *
 * Prints a table of every step and "ratio: pause+resume / switch"; PASS
 * when the median switch is at least 10x faster (the goal), FAIL otherwise.
 */
#include "tests/gpu/gpu_util.h"

#define GOAL_RATIO 10.0
#define MAX_ROUNDS 32

static int bench_accept(void *arg, int op, const char *tag)
{
	return 0;
}

static int role_worker(int argc, char **argv)
{
	uint64_t n = strtoull(argv[3], NULL, 0);
	void **p = (void **)calloc(n, sizeof(*p));
	char line[128];

	gu_set_name(argv[2]);
	gu_cuda_init(0);
	gmb_client *c = gu_connect(argv[2]);
	GMB_CK(c, gmb_set_control_handler(c, bench_accept, NULL));
	for (uint64_t i = 0; i < n; i++)
		GMB_CK(c, gmb_malloc(c, &p[i], GiB, 0, "w"));
	CUDA_CK(cudaDeviceSynchronize());
	if (write(3, "R", 1) != 1)
		return 2;
	while (fgets(line, sizeof(line), stdin)) {
		uint64_t seed = 0, bad = 0;
		char verb[16] = "";

		if (sscanf(line, "%15s %" SCNu64, verb, &seed) < 1)
			break;
		for (uint64_t i = 0; i < n; i++) {
			if (!strcmp(verb, "fill"))
				gu_fill(p[i], GiB, seed + i, 0);
			else
				bad += gu_check(p[i], GiB, seed + i);
		}
		CUDA_CK(cudaDeviceSynchronize());
		if (write(3, bad ? "B" : "K", 1) != 1)
			return 2;
	}
	gmb_close(c);
	free(p);
	return 0;
}

struct bench_worker {
	const char *name;
	pid_t pid;
	int cmd;   /* its stdin */
	int reply; /* its fd 3 */
};

static void bench_spawn(struct bench_worker *w, const char *name, uint64_t gib, char *self)
{
	int in[2], rep[2];
	char n[32], b;

	snprintf(n, sizeof(n), "%" PRIu64, gib);
	CHECK(pipe2(in, O_CLOEXEC) == 0 && pipe2(rep, O_CLOEXEC) == 0, "pipe2: %s",
	      strerror(errno));
	char *argv[] = { self, (char *)"worker", (char *)name, n, NULL };
	w->name = name;
	w->pid = gu_spawn_self_io(argv, in[0], rep[1]);
	close(in[0]);
	close(rep[1]);
	w->cmd = in[1];
	w->reply = rep[0];
	CHECK(gu_read_byte(w->reply, 600, &b) == 1, "worker %s never got ready", name);
}

static char bench_ask(struct bench_worker *w, const char *line)
{
	char b = 0;

	CHECK(write(w->cmd, line, strlen(line)) == (ssize_t)strlen(line), "write to %s", w->name);
	CHECK(gu_read_byte(w->reply, 600, &b) == 1, "worker %s did not answer '%s'", w->name, line);
	return b;
}

/* The device's counters of status. */
static void bench_counters(gmb_client *c, uint64_t *created, uint64_t *released)
{
	char *json = NULL;

	GMB_CK(c, gmb_status_json(c, &json));
	CHECK(gu_json_dev_u64(json, 0, "chunks_created", created) == 0 &&
		      gu_json_dev_u64(json, 0, "chunks_released", released) == 0,
	      "status lacks chunk counters: %.500s", json);
	free(json);
}

int main(int argc, char **argv)
{
	if (argc > 3 && strcmp(argv[1], "worker") == 0)
		return role_worker(argc, argv);
	gu_set_name("switch_bench");

	const char *e = getenv("GMB_SWITCH_GIB");
	uint64_t gib = e && *e ? strtoull(e, NULL, 0) : 64;
	e = getenv("GMB_SWITCH_ROUNDS");
	int rounds = e && *e ? atoi(e) : 5;
	double t_sw[MAX_ROUNDS], t_pr[MAX_ROUNDS], t_p[MAX_ROUNDS], t_r[MAX_ROUNDS];
	struct bench_worker w[2];
	uint64_t c0, r0, c1, r1;
	gmb_client *op = NULL;
	char *report = NULL;

	CHECK(rounds > 0 && rounds <= MAX_ROUNDS, "GMB_SWITCH_ROUNDS must be 1..%d", MAX_ROUNDS);
	GMB_CK(op, gmb_connect_flags(NULL, "switch-bench", GMB_CONNECT_TOOL, &op));
	struct gu_dev_status s = gu_status(op, 0);
	if (s.budget < gib * GiB + GiB) {
		gu_result("SKIP", "budget %.1f GiB is too small for %" PRIu64 " GiB", gu_gib(s.budget),
			  gib);
		return EXIT_SKIP;
	}
	/* A first, paused; then B; B paused, A resumed: one side active at a time. */
	bench_spawn(&w[0], "bench-a", gib, argv[0]);
	GMB_CK(op, gmb_control(op, "bench-a", GMB_OP_PAUSE, NULL));
	bench_spawn(&w[1], "bench-b", gib, argv[0]);
	GMB_CK(op, gmb_control(op, "bench-b", GMB_OP_PAUSE, NULL));
	GMB_CK(op, gmb_control(op, "bench-a", GMB_OP_RESUME, NULL));

	printf("%-6s %-22s %12s %9s %9s\n", "round", "step", "ms", "created", "released");
	for (int i = 0; i < rounds; i++) {
		struct bench_worker *from = &w[i % 2], *to = &w[1 - i % 2];

		bench_counters(op, &c0, &r0);
		double t0 = gu_now();
		int rc = gmb_switch(op, from->name, to->name, NULL, 0, &report);
		t_sw[i] = (gu_now() - t0) * 1e3;
		CHECK(rc == 0, "switch %s -> %s: %s\n%s", from->name, to->name, gmb_last_error(op),
		      report ? report : "");
		bench_counters(op, &c1, &r1);
		printf("%-6d switch %-15s %12.2f %9" PRIu64 " %9" PRIu64 "\n", i,
		       i % 2 ? "b->a" : "a->b", t_sw[i], c1 - c0, r1 - r0);
		printf("%s", report);
		free(report);
		report = NULL;
		CHECK(c1 == c0 && r1 == r0, "a switch within one user created %" PRIu64
		      " and released %" PRIu64 " chunks", c1 - c0, r1 - r0);
	}
	/* The memory works after the switches: the active one writes and reads it. */
	struct bench_worker *act = &w[rounds % 2];
	CHECK(bench_ask(act, "fill 77\n") == 'K', "fill on %s", act->name);
	CHECK(bench_ask(act, "check 77\n") == 'K', "%s read back other bytes after the switches",
	      act->name);

	for (int i = 0; i < rounds; i++) {
		struct bench_worker *from = &w[(rounds + i) % 2], *to = &w[(rounds + i + 1) % 2];

		bench_counters(op, &c0, &r0);
		double t0 = gu_now();
		GMB_CK(op, gmb_control(op, from->name, GMB_OP_PAUSE, NULL));
		double t1 = gu_now();
		GMB_CK(op, gmb_control(op, to->name, GMB_OP_RESUME, NULL));
		double t2 = gu_now();
		t_p[i] = (t1 - t0) * 1e3;
		t_r[i] = (t2 - t1) * 1e3;
		t_pr[i] = (t2 - t0) * 1e3;
		bench_counters(op, &c1, &r1);
		printf("%-6d pause+resume %-9s %12.2f %9" PRIu64 " %9" PRIu64
		       "   (pause %.2f, resume %.2f)\n",
		       i, from == &w[0] ? "a->b" : "b->a", t_pr[i], c1 - c0, r1 - r0, t_p[i],
		       t_r[i]);
		CHECK(c1 > c0 && r1 > r0, "pause+resume did not go through the driver (created %"
		      PRIu64 ", released %" PRIu64 "): is gmbd running with --pool-keep 0?",
		      c1 - c0, r1 - r0);
	}
	double sw = gu_median(t_sw, rounds), pr = gu_median(t_pr, rounds);
	double ratio = sw > 0 ? pr / sw : 0;
	printf("median: switch %.2f ms, pause %.2f + resume %.2f = %.2f ms; ratio: pause+resume /"
	       " switch = %.1fx (goal >= %.0fx)\n",
	       sw, gu_median(t_p, rounds), gu_median(t_r, rounds), pr, ratio, GOAL_RATIO);
	for (int i = 0; i < 2; i++) {
		close(w[i].cmd);
		gu_wait_child(w[i].pid, 60);
	}
	gu_print_status(op, "after the bench");
	gmb_close(op);
	if (ratio < GOAL_RATIO)
		gu_fail("%" PRIu64 " GiB: switch %.2f ms, pause+resume %.2f ms: %.1fx, under the goal"
			" of %.0fx", gib, sw, pr, ratio, GOAL_RATIO);
	gu_result("PASS", "%" PRIu64 " GiB between two clients of one user: switch %.2f ms, pause +"
		  " resume through the driver %.2f ms: %.1fx faster (goal >= %.0fx)",
		  gib, sw, pr, ratio, GOAL_RATIO);
	return 0;
}
