/*
 * graph_survival.cu - scenario 1: a captured CUDA graph replays after resume.
 *
 * Process A allocates a "weights" tag (PRESERVE) and a "kv" tag (DISCARD)
 * through libgmb, fills the weights with known data, and captures one CUDA
 * graph on a non-default stream: a memset of a small result buffer (in kv),
 * a kernel kv[i] = f(weights[i % nw], i), and an integer reduction of kv
 * into the result (sum, xor, popcount: deterministic, so results compare bit
 * for bit). It replays the graph once and keeps the result.
 *
 * Each round: A pauses both tags; process B (this binary, role "B", started
 * with posix_spawn) allocates through the broker more than would fit beside
 * A's tags (possible only because A's memory went back), overwrites all of
 * it with a kernel, checks every word, frees it and exits 0. A resumes and
 * replays the SAME cudaGraphExec_t, never recaptured: the result must match
 * the first one bit for bit, the weights must be intact, and the pointers
 * must still be device memory on device 0.
 *
 * Env: GMB_GS_ROUNDS (10), GMB_GS_WEIGHTS_GIB (4), GMB_GS_KV_GIB (40).
 */
#include "tests/gpu/gpu_util.h"

#define WEIGHTS_SEED 0x5eed0001ULL
#define B_SEED 0xb0b0b0b0ULL
#define B_PIECE (8 * GiB)
#define B_MAX_PIECES 64
#define B_MARGIN (3 * GiB) /* left for contexts and the driver's own use */

struct gs_result {
	unsigned long long sum, xr, ones, pad;
};

__global__ static void gs_derive(const uint64_t *w, size_t nw, uint64_t *kv, size_t nkv)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nkv; i += stride)
		kv[i] = gu_mix64(w[i % nw] ^ (i * 0x9e3779b97f4a7c15ULL));
}

__global__ static void gs_reduce(const uint64_t *kv, size_t nkv, struct gs_result *res)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	unsigned long long sum = 0, xr = 0, ones = 0;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nkv; i += stride) {
		sum += kv[i];
		xr ^= kv[i];
		ones += __popcll(kv[i]);
	}
	atomicAdd(&res->sum, sum);
	atomicXor(&res->xr, xr);
	atomicAdd(&res->ones, ones);
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : def;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Process B: take most of the GPU through the broker, use it, give it back. */
static int role_b(int argc, char **argv)
{
	void *p[B_MAX_PIECES];
	uint64_t sz[B_MAX_PIECES];
	size_t drv_free = 0, drv_total = 0;
	int n = 0;

	gu_set_name("graph_survival/B");
	CHECK(argc >= 4, "usage: B A_BYTES ROUND");
	uint64_t a_bytes = strtoull(argv[2], NULL, 0);
	int round = atoi(argv[3]);

	gu_cuda_init(0);
	gmb_client *c = gu_connect("gs-B");
	struct gu_dev_status st = gu_status(c, 0);
	CUDA_CK(cudaMemGetInfo(&drv_free, &drv_total));
	uint64_t budget = st.budget ? st.budget : st.total;
	uint64_t by_budget = budget > st.used ? budget - st.used : 0;
	uint64_t by_driver = (uint64_t)drv_free + (st.pool > st.used ? st.pool - st.used : 0);
	uint64_t want = min_u64(by_budget, by_driver);
	want = want > B_MARGIN ? (want - B_MARGIN) / (2 * MiB) * (2 * MiB) : 0;

	printf("B round %d: broker total %.1f GiB budget %.1f used %.1f pool %.1f; driver free "
	       "%.1f GiB; taking %.1f GiB beside A's paused %.1f GiB\n",
	       round, gu_gib(st.total), gu_gib(budget), gu_gib(st.used), gu_gib(st.pool),
	       gu_gib(drv_free), gu_gib(want), gu_gib(a_bytes));
	CHECK(want + a_bytes > drv_total,
	      "B can take only %.1f GiB: with A's %.1f GiB that fits on the %.1f GiB device, so "
	      "the test would not prove that A's memory went back",
	      gu_gib(want), gu_gib(a_bytes), gu_gib(drv_total));

	double t0 = gu_now();
	for (uint64_t left = want; left && n < B_MAX_PIECES; n++) {
		sz[n] = min_u64(left, B_PIECE);
		GMB_CK(c, gmb_malloc(c, &p[n], sz[n], 0, "b"));
		left -= sz[n];
	}
	double t_alloc = gu_now() - t0;
	for (int i = 0; i < n; i++)
		gu_fill(p[i], sz[i], B_SEED + (uint64_t)i * 0x100000000ULL, 0);
	CUDA_CK(cudaDeviceSynchronize());
	for (int i = 0; i < n; i++) {
		unsigned long long bad = gu_check(p[i], sz[i], B_SEED + (uint64_t)i * 0x100000000ULL);
		CHECK(bad == 0, "B: %llu wrong words in piece %d (%.1f GiB at %p)", bad, i,
		      gu_gib(sz[i]), p[i]);
	}
	for (int i = 0; i < n; i++)
		GMB_CK(c, gmb_free(c, p[i]));
	gmb_close(c);
	printf("B round %d: allocated %.1f GiB in %d allocations in %.3f s, wrote and verified "
	       "every word, freed\n",
	       round, gu_gib(want), n, t_alloc);
	return 0;
}

static struct gs_result gs_replay(cudaGraphExec_t exec, cudaStream_t s, struct gs_result *res)
{
	struct gs_result h;

	CUDA_CK(cudaGraphLaunch(exec, s));
	CUDA_CK(cudaStreamSynchronize(s));
	CUDA_CK(cudaMemcpy(&h, res, sizeof(h), cudaMemcpyDeviceToHost));
	return h;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "B") == 0)
		return role_b(argc, argv);
	gu_set_name("graph_survival");

	int rounds = (int)env_u64("GMB_GS_ROUNDS", 10);
	uint64_t wbytes = env_u64("GMB_GS_WEIGHTS_GIB", 4) * GiB;
	uint64_t kvbytes = env_u64("GMB_GS_KV_GIB", 40) * GiB;
	uint64_t resbytes = 2 * MiB;
	void *w = NULL, *kv = NULL, *res = NULL;
	double tp[64], tr[64];

	CHECK(rounds > 0 && rounds <= 64, "GMB_GS_ROUNDS must be 1..64");
	gu_cuda_init(0);
	gmb_client *c = gu_connect("gs-A");
	GMB_CK(c, gmb_tag_set_mode(c, "weights", GMB_MODE_PRESERVE));
	GMB_CK(c, gmb_tag_set_mode(c, "kv", GMB_MODE_DISCARD));
	double t0 = gu_now();
	GMB_CK(c, gmb_malloc(c, &w, wbytes, 0, "weights"));
	double t_wmalloc = gu_now() - t0;
	GMB_CK(c, gmb_malloc(c, &kv, kvbytes, 0, "kv"));
	GMB_CK(c, gmb_malloc(c, &res, resbytes, 0, "kv"));
	printf("A: weights %.1f GiB at %p (PRESERVE, malloc %.2f s incl. pinned staging), kv %.1f "
	       "GiB at %p, result at %p (DISCARD)\n",
	       gu_gib(wbytes), w, t_wmalloc, gu_gib(kvbytes), kv, res);
	void *const w0 = w, *const kv0 = kv, *const res0 = res;

	gu_fill(w, wbytes, WEIGHTS_SEED, 0);
	CUDA_CK(cudaDeviceSynchronize());

	cudaStream_t s;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	CUDA_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CUDA_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	CUDA_CK(cudaMemsetAsync(res, 0, sizeof(struct gs_result), s));
	gs_derive<<<GU_GRID, GU_BLOCK, 0, s>>>((const uint64_t *)w, wbytes / 8, (uint64_t *)kv,
						kvbytes / 8);
	CUDA_CK(cudaGetLastError());
	gs_reduce<<<GU_GRID, GU_BLOCK, 0, s>>>((const uint64_t *)kv, kvbytes / 8,
						(struct gs_result *)res);
	CUDA_CK(cudaGetLastError());
	CUDA_CK(cudaStreamEndCapture(s, &graph));
	CUDA_CK(cudaGraphInstantiate(&exec, graph, 0));

	struct gs_result ref = gs_replay(exec, s, (struct gs_result *)res);
	struct gs_result again = gs_replay(exec, s, (struct gs_result *)res);
	CHECK(memcmp(&ref, &again, sizeof(ref)) == 0, "two replays before any pause differ");
	printf("A: graph captured once (exec %p); result sum=%016llx xor=%016llx ones=%llu\n",
	       (void *)exec, ref.sum, ref.xr, ref.ones);

	char abuf[32], rbuf[16];
	snprintf(abuf, sizeof(abuf), "%" PRIu64, wbytes + kvbytes + resbytes);
	for (int r = 0; r < rounds; r++) {
		struct gu_dev_status before = gu_status(c, 0);
		t0 = gu_now();
		GMB_CK(c, gmb_pause(c, "weights"));
		GMB_CK(c, gmb_pause(c, "kv"));
		tp[r] = gu_now() - t0;
		struct gu_dev_status paused = gu_status(c, 0);
		CHECK(before.used >= paused.used &&
			  before.used - paused.used >= wbytes + kvbytes + resbytes,
		      "round %d: broker used_bytes fell by only %.2f GiB on pause (A holds %.2f GiB)",
		      r, gu_gib(before.used - paused.used), gu_gib(wbytes + kvbytes + resbytes));

		snprintf(rbuf, sizeof(rbuf), "%d", r);
		char *bargv[] = { argv[0], (char *)"B", abuf, rbuf, NULL };
		pid_t pid = gu_spawn_self(bargv, -1);
		int rc = gu_wait_child(pid, 240);
		CHECK(rc == 0, "round %d: process B failed (exit %d%s)", r, rc,
		      rc < 0 ? ", timed out" : "");

		t0 = gu_now();
		GMB_CK(c, gmb_resume(c, "weights"));
		GMB_CK(c, gmb_resume(c, "kv"));
		tr[r] = gu_now() - t0;

		CHECK(w == w0 && kv == kv0 && res == res0, "pointers changed");
		CHECK(gu_ptr_device(w) == 0 && gu_ptr_device(kv) == 0 && gu_ptr_device(res) == 0,
		      "round %d: resumed pointers are not device-0 memory", r);
		unsigned long long bad = gu_check(w, wbytes, WEIGHTS_SEED);
		CHECK(bad == 0, "round %d: %llu wrong words in the preserved weights", r, bad);
		struct gs_result got = gs_replay(exec, s, (struct gs_result *)res);
		CHECK(memcmp(&ref, &got, sizeof(ref)) == 0,
		      "round %d: replay of the same graph gave sum=%016llx xor=%016llx ones=%llu, "
		      "expected sum=%016llx xor=%016llx ones=%llu",
		      r, got.sum, got.xr, got.ones, ref.sum, ref.xr, ref.ones);
		printf("A round %d: pause %.1f ms, B ok, resume %.1f ms, same exec replayed: result "
		       "bit-identical, weights intact, pointers %p %p %p unchanged\n",
		       r, tp[r] * 1e3, tr[r] * 1e3, w, kv, res);
	}
	gu_print_status(c, "A after the last round");

	CUDA_CK(cudaGraphExecDestroy(exec));
	CUDA_CK(cudaGraphDestroy(graph));
	CUDA_CK(cudaStreamDestroy(s));
	GMB_CK(c, gmb_free(c, res));
	GMB_CK(c, gmb_free(c, kv));
	GMB_CK(c, gmb_free(c, w));
	gmb_close(c);
	gu_result("PASS",
		  "%d rounds, one graph exec replayed bit-identically; A %.0f GiB paused while B "
		  "used most of the GPU; pause %.1f ms / resume %.1f ms median (weights %.0f GiB "
		  "preserved)",
		  rounds, gu_gib(wbytes + kvbytes), gu_median(tp, rounds) * 1e3,
		  gu_median(tr, rounds) * 1e3, gu_gib(wbytes));
	return 0;
}
