/*
 * many_allocs.cu - scenario 4: 2,048 allocations of 2 MiB and 16 of 1 GiB in
 * one PRESERVE tag, paused and resumed 10 times: addresses unchanged, bytes
 * intact.
 *
 * Every allocation gets its own pattern (gu_fill with a per-allocation
 * seed). The pool is trimmed first; while the tag is paused, a scratch tag
 * of the same client allocates the same shape, overwrites it with 0xff and
 * frees it: the pool's free chunks are then the paused tag's, so bytes that
 * survive show that PRESERVE copied them, not that nobody touched them. After
 * each resume a kernel checks every word of every allocation, and each
 * pointer is still device-0 memory.
 *
 * Env: GMB_MANY_SMALL (2048), GMB_MANY_LARGE (16), GMB_MANY_CYCLES (10).
 */
#include "tests/gpu/gpu_util.h"

#define SMALL_BYTES (2 * MiB)
#define LARGE_BYTES GiB
#define SEED(i) (0x3a11c000000ULL + ((uint64_t)(i) << 32))

static int env_int(const char *name, int def)
{
	const char *v = getenv(name);

	return v && *v ? atoi(v) : def;
}

int main(void)
{
	gu_set_name("many_allocs");
	int nsmall = env_int("GMB_MANY_SMALL", 2048);
	int nlarge = env_int("GMB_MANY_LARGE", 16);
	int cycles = env_int("GMB_MANY_CYCLES", 10);
	int n = nsmall + nlarge;
	double tp[64], tr[64];

	CHECK(n > 0 && cycles > 0 && cycles <= 64, "bad GMB_MANY_* settings");
	void **p = (void **)calloc((size_t)n, sizeof(void *));
	void **p0 = (void **)calloc((size_t)n, sizeof(void *));
	void **scr = (void **)calloc((size_t)n, sizeof(void *));
	uint64_t *sz = (uint64_t *)calloc((size_t)n, sizeof(uint64_t));
	CHECK(p && p0 && scr && sz, "out of host memory");

	gu_cuda_init(0);
	gmb_client *c = gu_connect("many-allocs");
	gu_trim_all(c);
	GMB_CK(c, gmb_tag_set_mode(c, "many", GMB_MODE_PRESERVE));
	uint64_t total = 0;
	double t0 = gu_now();
	for (int i = 0; i < n; i++) {
		sz[i] = i < nsmall ? SMALL_BYTES : LARGE_BYTES;
		GMB_CK(c, gmb_malloc(c, &p[i], sz[i], 0, "many"));
		p0[i] = p[i];
		total += sz[i];
	}
	double t_alloc = gu_now() - t0;
	for (int i = 0; i < n; i++)
		gu_fill(p[i], sz[i], SEED(i), 0);
	CUDA_CK(cudaDeviceSynchronize());
	printf("%d x 2 MiB + %d x 1 GiB = %.1f GiB in tag \"many\" (PRESERVE): malloc %.2f s\n",
	       nsmall, nlarge, gu_gib(total), t_alloc);

	for (int r = 0; r < cycles; r++) {
		t0 = gu_now();
		GMB_CK(c, gmb_pause(c, "many"));
		tp[r] = gu_now() - t0;

		/*
		 * Take the freed memory in the same shape (the pool was trimmed
		 * first, so its free chunks are this tag's) and scribble on it.
		 */
		for (int i = 0; i < n; i++) {
			GMB_CK(c, gmb_malloc(c, &scr[i], sz[i], 0, "scratch"));
			gu_set(scr[i], sz[i], ~0ULL, 0);
		}
		CUDA_CK(cudaDeviceSynchronize());
		for (int i = 0; i < n; i++)
			GMB_CK(c, gmb_free(c, scr[i]));

		t0 = gu_now();
		GMB_CK(c, gmb_resume(c, "many"));
		tr[r] = gu_now() - t0;

		unsigned long long bad_total = 0;
		int bad_allocs = 0, first_bad = -1;
		for (int i = 0; i < n; i++) {
			CHECK(p[i] == p0[i], "allocation %d moved", i);
			CHECK(gu_ptr_device(p[i]) == 0, "cycle %d: allocation %d at %p is not "
			      "device-0 memory after resume", r, i, p[i]);
			unsigned long long bad = gu_check(p[i], sz[i], SEED(i));
			if (bad) {
				bad_total += bad;
				bad_allocs++;
				if (first_bad < 0)
					first_bad = i;
			}
		}
		CHECK(bad_total == 0,
		      "cycle %d: %llu wrong words in %d allocations (first: #%d, %s at %p)", r,
		      bad_total, bad_allocs, first_bad,
		      first_bad >= 0 && sz[first_bad] == GiB ? "1 GiB" : "2 MiB",
		      first_bad >= 0 ? p[first_bad] : NULL);
		printf("cycle %d: pause %.1f ms (%.1f GB/s), memory overwritten by another tag, "
		       "resume %.1f ms (%.1f GB/s); %d allocations at the same addresses, every "
		       "word intact\n",
		       r, tp[r] * 1e3, (double)total / tp[r] / 1e9, tr[r] * 1e3,
		       (double)total / tr[r] / 1e9, n);
	}
	gu_print_status(c, "many_allocs");
	t0 = gu_now();
	for (int i = 0; i < n; i++)
		GMB_CK(c, gmb_free(c, p[i]));
	printf("freed %d allocations in %.2f s\n", n, gu_now() - t0);
	gmb_close(c);
	gu_result("PASS",
		  "%d allocations (%.0f GiB, PRESERVE) x %d cycles with the memory overwritten in "
		  "between: addresses unchanged, every word intact; pause %.0f ms / resume %.0f ms "
		  "median",
		  n, gu_gib(total), cycles, gu_median(tp, cycles) * 1e3, gu_median(tr, cycles) * 1e3);
	free(p);
	free(p0);
	free(scr);
	free(sz);
	return 0;
}
