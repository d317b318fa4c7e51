/*
 * reclaim.cu - scenario 2: the memory of a client killed with SIGKILL
 * comes back within one second.
 *
 * The watcher (this process) trims the broker's pool so that the baseline
 * is "nothing lent, nothing pooled", then starts a victim (role "victim",
 * posix_spawn) that allocates 16 GiB through libgmb, writes it and reports
 * ready on fd 3. The watcher kills it with SIGKILL and measures, from the
 * kill:
 *   - until the broker's used_bytes (gmb_status_json(): the document that
 *     `gmbctl status --json` prints) is back at the baseline;
 *   - until, after gmb_trim() (the pool keeps warm chunks otherwise),
 *     cudaMemGetInfo() shows the memory free at the driver again.
 * Both must be within one second.
 *
 * Env: GMB_RECLAIM_GIB (16).
 */
#include "tests/gpu/gpu_util.h"

#define VICTIM_SEED 0xdead0000ULL
#define LIMIT_S 1.0
#define DRIVER_TOLERANCE (64 * MiB) /* the driver's own small allocations move */

static int role_victim(int argc, char **argv)
{
	uint64_t bytes = strtoull(argv[2], NULL, 0);
	uint64_t n = bytes / GiB;
	void *p;

	gu_set_name("reclaim/victim");
	gu_cuda_init(0);
	gmb_client *c = gu_connect("reclaim-victim");
	for (uint64_t i = 0; i < n; i++) {
		GMB_CK(c, gmb_malloc(c, &p, GiB, 0, "victim"));
		gu_fill(p, GiB, VICTIM_SEED + i, 0);
	}
	CUDA_CK(cudaDeviceSynchronize());
	printf("victim pid %d: holds %" PRIu64 " GiB through the broker, waiting for SIGKILL\n",
	       (int)getpid(), n);
	if (write(3, "R", 1) != 1)
		return 2;
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "victim") == 0)
		return role_victim(argc, argv);
	gu_set_name("reclaim");

	const char *e = getenv("GMB_RECLAIM_GIB");
	uint64_t bytes = (e && *e ? strtoull(e, NULL, 0) : 16) * GiB;
	size_t free0, free1, free2, total;
	int fds[2];
	char buf[32], b;

	gu_cuda_init(0);
	gmb_client *c = gu_connect("reclaim-watch");
	gu_trim_all(c);
	struct gu_dev_status s0 = gu_status(c, 0);
	CUDA_CK(cudaMemGetInfo(&free0, &total));
	printf("baseline: broker used %.2f GiB pool %.2f GiB; driver free %.2f GiB of %.2f\n",
	       gu_gib(s0.used), gu_gib(s0.pool), gu_gib(free0), gu_gib(total));

	CHECK(pipe2(fds, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno));
	snprintf(buf, sizeof(buf), "%" PRIu64, bytes);
	char *vargv[] = { argv[0], (char *)"victim", buf, NULL };
	pid_t pid = gu_spawn_self(vargv, fds[1]);
	close(fds[1]);
	int r = gu_read_byte(fds[0], 180, &b);
	if (r != 1) {
		kill(pid, SIGKILL);
		gu_fail("victim never got ready (read %d, exit %d)", r, gu_wait_child(pid, 10));
	}
	struct gu_dev_status s1 = gu_status(c, 0);
	CUDA_CK(cudaMemGetInfo(&free1, &total));
	printf("victim holds: broker used %.2f GiB; driver free %.2f GiB\n", gu_gib(s1.used),
	       gu_gib(free1));
	CHECK(s1.used >= s0.used + bytes, "broker used_bytes grew by %.2f GiB, victim holds %.2f",
	      gu_gib(s1.used - s0.used), gu_gib(bytes));

	double t0 = gu_now();
	CHECK(kill(pid, SIGKILL) == 0, "kill: %s", strerror(errno));
	double t_used = -1, t_free = -1;
	struct gu_dev_status s2 = s1;
	while (gu_now() - t0 < 10) {
		s2 = gu_status(c, 0);
		if (s2.used <= s0.used) {
			t_used = gu_now() - t0;
			break;
		}
		usleep(2000);
	}
	int rc = gu_wait_child(pid, 10);
	CHECK(rc == 128 + SIGKILL, "victim ended with %d, not SIGKILL", rc);
	CHECK(t_used >= 0, "broker used_bytes still %.2f GiB 10 s after the kill (baseline %.2f)",
	      gu_gib(s2.used), gu_gib(s0.used));

	uint64_t released = 0;
	free2 = 0;
	while (gu_now() - t0 < 10) {
		released += gu_trim_all(c);
		CUDA_CK(cudaMemGetInfo(&free2, &total));
		if (free2 + DRIVER_TOLERANCE >= free0) {
			t_free = gu_now() - t0;
			break;
		}
		usleep(2000);
	}
	printf("after kill: broker used back at %.2f GiB after %.0f ms; trim released %.2f GiB; "
	       "driver free %.2f GiB after %.0f ms\n",
	       gu_gib(s2.used), t_used * 1e3, gu_gib(released), gu_gib(free2), t_free * 1e3);
	gu_print_status(c, "after reclaim");
	gmb_close(c);
	CHECK(t_free >= 0, "driver free %.2f GiB 10 s after the kill, %.2f before the victim",
	      gu_gib(free2), gu_gib(free0));
	if (t_used > LIMIT_S || t_free > LIMIT_S)
		gu_fail("%.0f GiB back in the broker after %.0f ms and at the driver after %.0f ms "
			"(limit %.0f ms)",
			gu_gib(bytes), t_used * 1e3, t_free * 1e3, LIMIT_S * 1e3);
	gu_result("PASS",
		  "%.0f GiB of a SIGKILLed client: broker used_bytes back in %.0f ms, driver free "
		  "(after trim) in %.0f ms",
		  gu_gib(bytes), t_used * 1e3, t_free * 1e3);
	return 0;
}
