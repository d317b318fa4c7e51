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
 * --region TAG (implies --load-gmb) times inside a region ($GMB_SOCKET):
 * the shim's allocations are packed by default (GMB_PACK=hooks), so most
 * calls take or give back a piece of a pack and only a new pack, or a
 * pack's last piece freed, is a gmbd request. Prints one line:
 *   "malloc_ns=M free_ns=F direct_malloc_ns=DM direct_free_ns=DF
 *    added_malloc_ns=AM added_free_ns=AF iters=N size=S mode=..."
 * where M and F are the medians over 7 runs of the mean per call through
 * the symbol the program links (the shim's when it is preloaded), DM and
 * DF the same calls made straight into the runtime's own functions
 * (looked up in the runtime's handle, so the shim is not in the way), in
 * batches that alternate with the first ones in the same process, and AM,
 * AF the medians of the runs' differences: what the shim adds, measured
 * against a baseline in the same process (separate processes differ by
 * more than the shim costs: the runtime's own cost moves run to run).
 */
#define _GNU_SOURCE /* dladdr, RTLD_DEFAULT */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_BATCH 64
#define BENCH_RUNS  7

typedef cudaError_t (*bench_malloc_fn)(void **, size_t);
typedef cudaError_t (*bench_free_fn)(void *);

/* The calls timed: through the linked symbols, or the runtime's own. */
struct bench_calls {
	bench_malloc_fn malloc;
	bench_free_fn free;
};

/* The runtime's own cudaMalloc/cudaFree, found through its handle. */
static int bench_direct(struct bench_calls *d)
{
	void *any = dlsym(RTLD_DEFAULT, "cudaGetDevice");
	Dl_info info;
	void *h, *m, *f;

	/* cudaGetDevice is not interposed: it names the runtime's file. */
	if (!any || !dladdr(any, &info) || !info.dli_fname)
		return -1;
	h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return -1;
	m = dlsym(h, "cudaMalloc");
	f = dlsym(h, "cudaFree");
	if (!m || !f)
		return -1;
	memcpy(&d->malloc, &m, sizeof(m));
	memcpy(&d->free, &f, sizeof(f));
	return 0;
}

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

/* One batch of @n calls of each through @c; ns spent into @tm, @tf. */
static int bench_batch(const struct bench_calls *c, int n, size_t size, double *tm, double *tf)
{
	void *p[BENCH_BATCH];
	double t0 = bench_now_ns(), t1, t2;

	for (int i = 0; i < n; i++) {
		cudaError_t r = c->malloc(&p[i], size);

		if (r != cudaSuccess) {
			fprintf(stderr, "cudaMalloc: error %d\n", (int)r);
			return -1;
		}
	}
	t1 = bench_now_ns();
	for (int i = 0; i < n; i++) {
		if (c->free(p[i]) != cudaSuccess) {
			fprintf(stderr, "cudaFree failed\n");
			return -1;
		}
	}
	t2 = bench_now_ns();
	*tm += t1 - t0;
	*tf += t2 - t1;
	return 0;
}

/*
 * One run: @iters calls of each through @linked and, when @direct, as many
 * straight into the runtime, batch for batch; mean ns per call into
 * @m/@f (linked) and @dm/@df (direct).
 */
static int bench_run(const struct bench_calls *linked, const struct bench_calls *direct, long iters,
		     size_t size, double *m, double *f, double *dm, double *df)
{
	double tm = 0, tf = 0, dtm = 0, dtf = 0;
	long done = 0;

	while (done < iters) {
		int n = iters - done < BENCH_BATCH ? (int)(iters - done) : BENCH_BATCH;

		if (bench_batch(linked, n, size, &tm, &tf) < 0 ||
		    (direct && bench_batch(direct, n, size, &dtm, &dtf) < 0))
			return -1;
		done += n;
	}
	*m = tm / (double)iters;
	*f = tf / (double)iters;
	*dm = dtm / (double)iters;
	*df = dtf / (double)iters;
	return 0;
}

static double bench_median(double *v)
{
	qsort(v, BENCH_RUNS, sizeof(v[0]), bench_cmp);
	return v[BENCH_RUNS / 2];
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
	double ms[BENCH_RUNS], fs[BENCH_RUNS], dms[BENCH_RUNS], dfs[BENCH_RUNS];
	double am[BENCH_RUNS], af[BENCH_RUNS];
	struct bench_calls linked = { cudaMalloc, cudaFree }, direct;
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
	/* Inside a region the runtime's own calls would not be gmbd's: no baseline. */
	bool with_direct = !tag;
	if (with_direct && bench_direct(&direct) < 0) {
		fprintf(stderr, "the runtime's own cudaMalloc/cudaFree not found: %s\n", dlerror());
		return 1;
	}
	for (int r = 0; r < BENCH_RUNS; r++) {
		if (bench_run(&linked, with_direct ? &direct : NULL, iters, size, &ms[r], &fs[r],
			      &dms[r], &dfs[r]) < 0)
			return 1;
		am[r] = ms[r] - dms[r];
		af[r] = fs[r] - dfs[r];
	}
	printf("malloc_ns=%.1f free_ns=%.1f", bench_median(ms), bench_median(fs));
	if (with_direct)
		printf(" direct_malloc_ns=%.1f direct_free_ns=%.1f added_malloc_ns=%.1f"
		       " added_free_ns=%.1f",
		       bench_median(dms), bench_median(dfs), bench_median(am), bench_median(af));
	printf(" iters=%ld size=%zu mode=%s\n", iters, size, mode);
	return 0;
}
