/*
 * gpu_restart.cu - the client side of restart without loss on a real GPU,
 * driven by tests/gpu/gpu_restart.py (which plays systemd for a gmbd
 * on the cuda backend and kills it with SIGKILL).
 *
 * Allocates SIZE GiB in a PRESERVE tag and 1 GiB in a DISCARD tag, writes a
 * pattern with a kernel, pauses the second, says "READY <ptr>" and waits
 * for "go" on stdin: meanwhile gmbd is killed and started again. Then the
 * pattern must still be there at the same address (libgmb reconnected and
 * re-announced by itself; the mapping was never touched), and the memory
 * must still cycle: pause/resume of the preserved tag keeps its bytes, the
 * paused one resumes. Prints one "RESULT:" line.
 */
#include "tests/gpu/gpu_util.h"

#define SEED 0x5eed0001ULL

int main(int argc, char **argv)
{
	uint64_t size = (argc > 1 ? strtoull(argv[1], NULL, 0) : 4) * GiB;
	unsigned long long bad;
	char line[64], *json = NULL;
	void *p = NULL, *q = NULL;
	gmb_client *c;
	double t0;

	gu_set_name("gpu_restart");
	gu_cuda_init(0);
	c = gu_connect("gpu-restart");
	GMB_CK(c, gmb_tag_set_mode(c, "weights", GMB_MODE_PRESERVE));
	GMB_CK(c, gmb_malloc(c, &p, size, 0, "weights"));
	GMB_CK(c, gmb_malloc(c, &q, 1 * GiB, 0, "kv"));
	gu_fill(p, size, SEED, 0);
	gu_fill(q, 1 * GiB, SEED + 1, 0);
	CUDA_CK(cudaDeviceSynchronize());
	GMB_CK(c, gmb_pause(c, "kv"));
	printf("READY %p\n", p);
	if (!fgets(line, sizeof(line), stdin))
		gu_fail("the harness went away");

	/* The first request after the restart waits for libgmb to be back. */
	t0 = gu_now();
	GMB_CK(c, gmb_status_json(c, &json));
	free(json);
	printf("status answered %.3f s after 'go'\n", gu_now() - t0);
	bad = gu_check(p, size, SEED);
	CHECK(bad == 0, "%llu words of the preserved tag changed across the restart", bad);
	GMB_CK(c, gmb_pause(c, "weights"));
	GMB_CK(c, gmb_resume(c, "weights"));
	bad = gu_check(p, size, SEED);
	CHECK(bad == 0, "%llu words changed over a pause/resume after the restart", bad);
	GMB_CK(c, gmb_resume(c, "kv"));
	gu_fill(q, 1 * GiB, SEED + 2, 0);
	bad = gu_check(q, 1 * GiB, SEED + 2);
	CHECK(bad == 0, "the resumed tag is not usable: %llu bad words", bad);
	gmb_close(c);
	gu_result("PASS", "%.0f GiB kept bytes and address across SIGKILL of gmbd; tags cycle after",
		  gu_gib(size));
	return 0;
}
