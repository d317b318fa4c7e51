/*
 * preload_bench.c - what the LD_PRELOAD shim adds to cudaMalloc and
 * cudaFree, in ns per call. Linked against a CUDA runtime (the real
 * libcudart.so, or tests/fake_cudart.c's stand-in where there is no GPU);
 * bench/preload_bench.sh runs it with and without the shim and compares.
 *
 *   preload_bench [--iters N] [--size BYTES] [--load-gmb] [--region TAG]
 *
 * --load-gmb dlopens $GMB_LIB (as Python's gmb module does) before timing:
 * the shim then asks libgmb for the thread's region on every call.
 * --region TAG (implies --load-gmb) times inside a region: every call is a
 * gmbd allocation or free ($GMB_SOCKET). Prints one line:
 *   "malloc_ns=M free_ns=F iters=N size=S mode=plain|loaded|region"
 * where M and F are the medians over 7 runs of the mean per call.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_BATCH 64
#define BENCH_RUNS  7

static double bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int bench_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* One run: @iters calls of each, in batches; mean ns per call into @m, @f. */
static int bench_run(long iters, size_t size, double *m, double *f)
{
	void *p[BENCH_BATCH];
	double tm = 0, tf = 0;
	long done = 0;

	while (done < iters) {
		int n = iters - done < BENCH_BATCH ? (int)(iters - done) : BENCH_BATCH;
		double t0 = bench_now_ns(), t1, t2;

		for (int i = 0; i < n; i++) {
			cudaError_t r = cudaMalloc(&p[i], size);

			if (r != cudaSuccess) {
				fprintf(stderr, "cudaMalloc: error %d\n", (int)r);
				return -1;
			}
		}
		t1 = bench_now_ns();
		for (int i = 0; i < n; i++) {
			if (cudaFree(p[i]) != cudaSuccess) {
				fprintf(stderr, "cudaFree failed\n");
				return -1;
			}
		}
		t2 = bench_now_ns();
		tm += t1 - t0;
		tf += t2 - t1;
		done += n;
	}
	*m = tm / (double)iters;
	*f = tf / (double)iters;
	return 0;
}

/* libgmb as Python loads it, and a region begun on this thread when @tag. */
static int bench_gmb(const char *tag)
{
	const char *path = getenv("GMB_LIB");
	int (*begin)(const char *, int);
	void *h, *sym;

	h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", path ? path : "(GMB_LIB unset)", dlerror());
		return -1;
	}
	if (!tag)
		return 0;
	sym = dlsym(h, "gmb_region_begin");
	if (!sym)
		return -1;
	memcpy(&begin, &sym, sizeof(begin));
	return begin(tag, 0) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	long iters = 200000;
	size_t size = 1 << 20;
	const char *tag = NULL, *mode = "plain";
	double ms[BENCH_RUNS], fs[BENCH_RUNS];
	void *warm;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atol(argv[++i]);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			size = (size_t)atoll(argv[++i]);
		else if (!strcmp(argv[i], "--load-gmb"))
			mode = "loaded";
		else if (!strcmp(argv[i], "--region") && i + 1 < argc)
			tag = argv[++i], mode = "region";
		else {
			fprintf(stderr,
				"usage: %s [--iters N] [--size BYTES] [--load-gmb] "
				"[--region TAG]\n",
				argv[0]);
			return 2;
		}
	}
	if (iters <= 0)
		return 2;
	/* The runtime's own start (a context on a GPU) is not what is measured. */
	if (cudaMalloc(&warm, size) != cudaSuccess || cudaFree(warm) != cudaSuccess) {
		fprintf(stderr, "the CUDA runtime does not allocate\n");
		return 1;
	}
	if (strcmp(mode, "plain") && bench_gmb(tag) < 0)
		return 1;
	for (int r = 0; r < BENCH_RUNS; r++)
		if (bench_run(iters, size, &ms[r], &fs[r]) < 0)
			return 1;
	qsort(ms, BENCH_RUNS, sizeof(ms[0]), bench_cmp);
	qsort(fs, BENCH_RUNS, sizeof(fs[0]), bench_cmp);
	printf("malloc_ns=%.1f free_ns=%.1f iters=%ld size=%zu mode=%s\n", ms[BENCH_RUNS / 2],
	       fs[BENCH_RUNS / 2], iters, size, mode);
	return 0;
}
