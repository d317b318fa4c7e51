/*
 * vmm_bench.cu - gmbd against the single-process way, in one run, on the same
 * shapes; prints tables, gmbd/baseline ratios and the goals of each of
 * gmbd's modes: its default (a pause gives memory to the driver), a warm
 * pool (--pool-keep unlimited) and the switch between two clients.
 *
 * Baseline (what torch_memory_saver does, implemented here with the driver
 * API): every allocation reserves its VA once; pause = drain, [copy to pinned
 * host buffers kept across cycles,] cuMemUnmap + cuMemRelease per
 * allocation; resume = cuMemCreate + cuMemMap + cuMemSetAccess per
 * allocation[, copy back]. gmbd: the same allocations made with
 * gmb_malloc in one tag; pause/resume = gmb_pause/gmb_resume; "default" is
 * the gmbd of $GMB_SOCKET (its defaults), "warm" a second gmbd started with
 * --pool-keep unlimited (--warm-socket PATH, else $GMB_SOCKET_WARM; its
 * rows are left out when neither names one).
 *
 * Parts:
 *   1. pinned copy bandwidth (cuMemcpyDtoH/HtoD of 1 GiB, cuMemAllocHost);
 *   2. shapes 16 x 1 GiB, 205 x 20 MiB, 64 x 1 GiB, modes discard and
 *      preserve, one after another (memory freed and trimmed in between):
 *      the allocation (setup), the first cycle and the median of the next N
 *      cycles; discard on the baseline, the default and the warm gmbd,
 *      preserve on the baseline and the default;
 *   3. cross-process, 64 GiB between two worker processes of one user (one
 *      active at a time), on the default gmbd: the baseline's A release + B
 *      create, gmbd's A pause + B resume (both driven over pipes, timed end
 *      to end here), and gmb_switch() from A to B by this process (A's
 *      memory handed to B: the switch mode);
 *   4. a bandwidth-bound kernel (float4 triad over 1 GiB tensors) over
 *      broker memory vs cuMemAlloc memory, cudaEvent timing, median of 20;
 *   5. gmbd's own GPU memory from nvidia-smi ($GMBD_PID).
 * Then the summary: tables and one PASS/MISS line per goal, grouped by mode
 * (default, warm, switch), and "RESULT:" with how many goals each mode met.
 *
 * Options: --cycles N (5), --cycles-64 N (3, preserve of 64 GiB), --quick
 * (smaller shapes, for a smoke run), --no-preserve-64, --no-xproc,
 * --warm-socket PATH, --first-pause-after S (2: the seconds between a
 * preserve row's fill and its first pause, for both implementations: the
 * application's work in between, in which libgmb makes retained copies),
 * --settle S (1: the seconds before each row's allocation, in which the
 * driver zeroes the memory the previous row gave back).
 * Exit: 0 when it ran (goals may MISS), 1 on an error or wrong bytes.
 */
#include "tests/gpu/gpu_util.h"

#define MAX_CYCLES 32
#define MAX_ROWS 24
#define MAX_GOALS 32
#define XPROC_SWITCHES 7 /* the first is reported separately */

enum impl { IMPL_BASE = 0, IMPL_BROKER = 1, IMPL_WARM = 2, IMPL_N = 3 };
static const char *const impl_name[] = { "baseline", "default", "warm" };

struct shape {
	const char *name;
	int n;
	uint64_t size;
	double warm_pause; /* the warm goal: discard pause <= this x the baseline's */
};

/* One measured (shape, mode, implementation). Times in seconds. */
struct row {
	const char *shape;
	int preserve;
	int impl;
	uint64_t bytes;
	double setup;
	double pause_first, resume_first, pause_med, resume_med;
	int intact; /* preserve: bytes checked after the last resume (1 ok, 0 bad, -1 n/a) */
};

struct goal {
	const char *mode; /* "default", "warm" or "switch" */
	char what[160];
	char value[160];
	int pass;
};

static struct row g_rows[MAX_ROWS];
static int g_nrows;
static struct goal g_goals[MAX_GOALS];
static int g_ngoals;
static gmb_client *g_c;	 /* the default gmbd ($GMB_SOCKET) */
static gmb_client *g_cw; /* the warm gmbd; NULL: its rows are not measured */
static CUdevice g_dev;
static CUstream g_stream;
static double g_d2h_gbs, g_h2d_gbs;
static double g_first_pause_after = 2.0; /* s between a preserve row's fill and its first pause */
/* s before each row's allocation: the driver zeroes what the previous row released, and a
 * create made meanwhile waits for it; without the wait the row after a large one times that. */
static double g_settle = 1.0;

__attribute__((format(printf, 4, 5))) static void goal_add(const char *mode, int pass,
							   const char *what, const char *fmt, ...)
{
	va_list ap;

	if (g_ngoals >= MAX_GOALS)
		return;
	struct goal *g = &g_goals[g_ngoals++];
	g->mode = mode;
	snprintf(g->what, sizeof(g->what), "%s", what);
	va_start(ap, fmt);
	vsnprintf(g->value, sizeof(g->value), fmt, ap);
	va_end(ap);
	g->pass = pass;
}

static double gbs(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : 0.0;
}

/* ---- baseline: the single-process saver ---- */

struct base_set {
	int n;
	uint64_t size;
	int preserve;
	int mapped;
	CUdeviceptr *va;
	CUmemGenericAllocationHandle *h;
	void **host;
};

static CUmemAllocationProp base_prop(void)
{
	CUmemAllocationProp prop;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = (int)g_dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	return prop;
}

static void base_resume(struct base_set *s)
{
	CUmemAllocationProp prop = base_prop();
	CUmemAccessDesc acc;

	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = (int)g_dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (int i = 0; i < s->n; i++) {
		CU_CK(cuMemCreate(&s->h[i], s->size, &prop, 0));
		CU_CK(cuMemMap(s->va[i], s->size, 0, s->h[i], 0));
		CU_CK(cuMemSetAccess(s->va[i], s->size, &acc, 1));
	}
	if (s->preserve && s->mapped >= 0) {
		for (int i = 0; i < s->n; i++)
			CU_CK(cuMemcpyHtoDAsync(s->va[i], s->host[i], s->size, g_stream));
		CU_CK(cuStreamSynchronize(g_stream));
	}
	s->mapped = 1;
}

static void base_pause(struct base_set *s)
{
	CU_CK(cuCtxSynchronize()); /* cuMemUnmap does not wait for kernels */
	if (s->preserve) {
		for (int i = 0; i < s->n; i++)
			CU_CK(cuMemcpyDtoHAsync(s->host[i], s->va[i], s->size, g_stream));
		CU_CK(cuStreamSynchronize(g_stream));
	}
	for (int i = 0; i < s->n; i++) {
		CU_CK(cuMemUnmap(s->va[i], s->size));
		CU_CK(cuMemRelease(s->h[i]));
	}
	s->mapped = 0;
}

static void base_setup(struct base_set *s, int n, uint64_t size, int preserve)
{
	CUmemAllocationProp prop = base_prop();
	size_t gran = 0;

	memset(s, 0, sizeof(*s));
	s->n = n;
	s->size = size;
	s->preserve = preserve;
	s->va = (CUdeviceptr *)calloc((size_t)n, sizeof(*s->va));
	s->h = (CUmemGenericAllocationHandle *)calloc((size_t)n, sizeof(*s->h));
	s->host = (void **)calloc((size_t)n, sizeof(*s->host));
	CHECK(s->va && s->h && s->host, "out of host memory");
	CU_CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CHECK(size % gran == 0, "size %" PRIu64 " is not a multiple of %zu", size, gran);
	for (int i = 0; i < n; i++) {
		CU_CK(cuMemAddressReserve(&s->va[i], size, 0, 0, 0));
		if (preserve)
			CU_CK(cuMemAllocHost(&s->host[i], size));
	}
	s->mapped = -1; /* the first map has nothing to copy back */
	base_resume(s);
}

static void base_teardown(struct base_set *s)
{
	for (int i = 0; i < s->n; i++) {
		if (s->mapped == 1) {
			CU_CK(cuMemUnmap(s->va[i], s->size));
			CU_CK(cuMemRelease(s->h[i]));
		}
		CU_CK(cuMemAddressFree(s->va[i], s->size));
		if (s->host[i])
			CU_CK(cuMemFreeHost(s->host[i]));
	}
	free(s->va);
	free(s->h);
	free(s->host);
}

/* ---- gmbd ---- */

struct brk_set {
	gmb_client *c; /* the gmbd it allocates from (not owned) */
	int n;
	uint64_t size;
	char tag[32];
	void **p;
};

static void brk_setup(struct brk_set *s, gmb_client *c, int n, uint64_t size, int preserve,
		      const char *tag)
{
	s->c = c;
	s->n = n;
	s->size = size;
	snprintf(s->tag, sizeof(s->tag), "%s", tag);
	s->p = (void **)calloc((size_t)n, sizeof(void *));
	CHECK(s->p, "out of host memory");
	GMB_CK(c, gmb_tag_set_mode(c, tag, preserve ? GMB_MODE_PRESERVE : GMB_MODE_DISCARD));
	for (int i = 0; i < n; i++)
		GMB_CK(c, gmb_malloc(c, &s->p[i], size, 0, tag));
}

/* Gives @c's gmbd's free chunks back to the driver (a warm gmbd keeps them otherwise). */
static void trim_pool(gmb_client *c)
{
	uint64_t rel = 0, pend = 0;
	double end = gu_now() + 10;

	do {
		GMB_CK(c, gmb_trim(c, -1, &rel, &pend));
		if (!pend)
			return;
		usleep(2000);
	} while (gu_now() < end);
	printf("warning: gmbd still reports %.2f GiB pending after trim\n", gu_gib(pend));
}

static void brk_teardown(struct brk_set *s)
{
	for (int i = 0; i < s->n; i++)
		GMB_CK(s->c, gmb_free(s->c, s->p[i]));
	free(s->p);
	trim_pool(s->c); /* give the memory back to the driver for the next row */
}

/* ---- part 1: pinned copy bandwidth ---- */

static void measure_pinned(void)
{
	CUdeviceptr d;
	void *h;
	double t[5];
	const uint64_t sz = GiB;

	CU_CK(cuMemAlloc(&d, sz));
	double t0 = gu_now();
	CU_CK(cuMemAllocHost(&h, sz));
	double t_pin = gu_now() - t0;
	CU_CK(cuMemsetD8(d, 0x11, sz));
	CU_CK(cuMemcpyDtoH(h, d, sz)); /* warm-up, touches the host pages */
	for (int i = 0; i < 5; i++) {
		t0 = gu_now();
		CU_CK(cuMemcpyDtoH(h, d, sz));
		t[i] = gu_now() - t0;
	}
	g_d2h_gbs = gbs(sz, gu_median(t, 5));
	CU_CK(cuMemcpyHtoD(d, h, sz));
	for (int i = 0; i < 5; i++) {
		t0 = gu_now();
		CU_CK(cuMemcpyHtoD(d, h, sz));
		t[i] = gu_now() - t0;
	}
	g_h2d_gbs = gbs(sz, gu_median(t, 5));
	CU_CK(cuMemFreeHost(h));
	CU_CK(cuMemFree(d));
	printf("pinned copy bandwidth (1 GiB, cuMemAllocHost took %.2f s): D2H %.1f GB/s, H2D "
	       "%.1f GB/s\n",
	       t_pin, g_d2h_gbs, g_h2d_gbs);
}

/* ---- part 2: shapes x modes ---- */

static void fill_all(void **p, int n, uint64_t size, uint64_t seed)
{
	for (int i = 0; i < n; i++)
		gu_fill(p[i], size, seed + ((uint64_t)i << 32), 0);
	CUDA_CK(cudaDeviceSynchronize());
}

static int check_all(void **p, int n, uint64_t size, uint64_t seed)
{
	for (int i = 0; i < n; i++)
		if (gu_check(p[i], size, seed + ((uint64_t)i << 32)))
			return 0;
	return 1;
}

static void run_shape(const struct shape *sh, int preserve, int impl, int cycles)
{
	double tp[MAX_CYCLES + 1], tr[MAX_CYCLES + 1];
	struct base_set bs;
	struct brk_set ks;
	void **ptrs;
	char tag[32];
	uint64_t seed = 0xbe0c0000000ULL + (uint64_t)g_nrows * 0x1000;

	CHECK(g_nrows < MAX_ROWS, "too many rows");
	usleep((useconds_t)(g_settle * 1e6));
	struct row *r = &g_rows[g_nrows++];
	memset(r, 0, sizeof(*r));
	r->shape = sh->name;
	r->preserve = preserve;
	r->impl = impl;
	r->bytes = (uint64_t)sh->n * sh->size;
	r->intact = -1;

	double t0 = gu_now();
	if (impl == IMPL_BASE) {
		base_setup(&bs, sh->n, sh->size, preserve);
		ptrs = (void **)bs.va;
	} else {
		snprintf(tag, sizeof(tag), "b%d", g_nrows);
		brk_setup(&ks, impl == IMPL_WARM ? g_cw : g_c, sh->n, sh->size, preserve, tag);
		ptrs = ks.p;
	}
	r->setup = gu_now() - t0;
	if (preserve) {
		fill_all(ptrs, sh->n, sh->size, seed);
		/* An application computes between its allocations and its first
		 * pause; libgmb makes retained copies in that time (both impls wait). */
		CU_CK(cuCtxSynchronize());
		usleep((useconds_t)(g_first_pause_after * 1e6));
	}

	for (int k = 0; k <= cycles; k++) {
		t0 = gu_now();
		if (impl == IMPL_BASE)
			base_pause(&bs);
		else
			GMB_CK(ks.c, gmb_pause(ks.c, ks.tag));
		double t1 = gu_now();
		if (impl == IMPL_BASE)
			base_resume(&bs);
		else
			GMB_CK(ks.c, gmb_resume(ks.c, ks.tag));
		double t2 = gu_now();
		tp[k] = t1 - t0;
		tr[k] = t2 - t1;
	}
	r->pause_first = tp[0];
	r->resume_first = tr[0];
	r->pause_med = gu_median(tp + 1, cycles);
	r->resume_med = gu_median(tr + 1, cycles);
	if (preserve)
		r->intact = check_all(ptrs, sh->n, sh->size, seed);

	if (impl == IMPL_BASE)
		base_teardown(&bs);
	else
		brk_teardown(&ks);
	printf("%-13s %-8s %-8s setup %9.2f ms | pause first %8.2f ms median %8.2f ms | resume "
	       "first %8.2f ms median %8.2f ms%s\n",
	       sh->name, preserve ? "preserve" : "discard", impl_name[impl], r->setup * 1e3,
	       r->pause_first * 1e3, r->pause_med * 1e3, r->resume_first * 1e3,
	       r->resume_med * 1e3,
	       r->intact == 0 ? "  BYTES WRONG" : r->intact == 1 ? "  bytes intact" : "");
	printf("  every cycle, pause/resume ms:");
	for (int k = 0; k <= cycles; k++)
		printf(" %.2f/%.2f", tp[k] * 1e3, tr[k] * 1e3);
	printf("\n");
}

/* ---- part 3: cross-process switch ---- */

struct xworker {
	pid_t pid;
	int in;  /* we write commands */
	int out; /* we read "ok" lines */
	char name[8];
};

/* A worker agrees to every pause and resume of a switch (it runs no kernels). */
static int xw_accept(void *arg, int op, const char *tag)
{
	return 0;
}

/* Worker side: commands on stdin, one reply line per command on fd 3. */
static int role_xworker(int argc, char **argv)
{
	char line[64];
	int broker = strcmp(argv[2], "broker") == 0;
	int n = atoi(argv[3]);
	uint64_t size = strtoull(argv[4], NULL, 0);
	struct base_set bs;
	struct brk_set ks;
	FILE *rep = fdopen(3, "w");

	gu_set_name(broker ? "xworker/broker" : "xworker/baseline");
	CHECK(rep, "fd 3: %s", strerror(errno));
	gu_cuda_init(0);
	CU_CK(cuCtxGetDevice(&g_dev));
	CU_CK(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING));
	memset(&bs, 0, sizeof(bs));
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\n")] = '\0';
		if (strcmp(line, "setup") == 0 && broker) {
			g_c = gu_connect(argv[5]);
			GMB_CK(g_c, gmb_set_control_handler(g_c, xw_accept, NULL));
			brk_setup(&ks, g_c, n, size, 0, "x");
		} else if (strcmp(line, "setup") == 0) {
			base_setup(&bs, n, size, 0); /* VAs reserved once, memory mapped */
		} else if (strcmp(line, "pause") == 0) {
			if (broker)
				GMB_CK(g_c, gmb_pause(g_c, "x"));
			else
				base_pause(&bs);
		} else if (strcmp(line, "resume") == 0) {
			if (broker)
				GMB_CK(g_c, gmb_resume(g_c, "x"));
			else
				base_resume(&bs);
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			gu_fail("unknown command \"%s\"", line);
		}
		fprintf(rep, "ok\n");
		fflush(rep);
	}
	if (broker)
		gmb_close(g_c); /* the broker takes the memory back */
	else
		base_teardown(&bs);
	fprintf(rep, "bye\n");
	fclose(rep);
	return 0;
}

static struct xworker xw_start(const char *kind, int n, uint64_t size, const char *name)
{
	struct xworker w;
	int cin[2], cout[2];
	char nb[16], sb[32], nm[32];

	CHECK(pipe2(cin, O_CLOEXEC) == 0 && pipe2(cout, O_CLOEXEC) == 0, "pipe2: %s",
	      strerror(errno));
	snprintf(nb, sizeof(nb), "%d", n);
	snprintf(sb, sizeof(sb), "%" PRIu64, size);
	snprintf(nm, sizeof(nm), "xproc-%s", name);
	char *av[] = { (char *)"vmm_bench", (char *)"xworker", (char *)kind, nb, sb, nm, NULL };
	w.pid = gu_spawn_self_io(av, cin[0], cout[1]);
	close(cin[0]);
	close(cout[1]);
	w.in = cin[1];
	w.out = cout[0];
	snprintf(w.name, sizeof(w.name), "%s", name);
	return w;
}

/* Sends @cmd and waits for "ok". Return: seconds it took. */
static double xw_cmd(struct xworker *w, const char *cmd)
{
	char buf[64];
	size_t len = 0;
	double t0 = gu_now();

	CHECK(write(w->in, cmd, strlen(cmd)) == (ssize_t)strlen(cmd) && write(w->in, "\n", 1) == 1,
	      "worker %s: write: %s", w->name, strerror(errno));
	while (len < sizeof(buf) - 1) {
		char ch;
		int r = gu_read_byte(w->out, 300, &ch);
		CHECK(r == 1, "worker %s: no reply to \"%s\" (%s)", w->name, cmd,
		      r == 0 ? "it exited" : "timeout");
		if (ch == '\n')
			break;
		buf[len++] = ch;
	}
	buf[len] = '\0';
	CHECK(strcmp(buf, "ok") == 0, "worker %s: \"%s\" -> \"%s\"", w->name, cmd, buf);
	return gu_now() - t0;
}

static void xw_stop(struct xworker *w)
{
	if (write(w->in, "quit\n", 5) != 5)
		printf("worker %s: quit: %s\n", w->name, strerror(errno));
	close(w->in);
	int rc = gu_wait_child(w->pid, 120);
	close(w->out);
	CHECK(rc == 0, "worker %s exited with %d", w->name, rc);
}

/*
 * Both workers hold a 64 GiB tag (gmbd) or 64 reserved VAs (baseline); one
 * is active. @kind "baseline" and "broker": a switch = the active one
 * pauses, then the other resumes (commands over the pipes). "switch": the
 * workers are gmbd's and this process asks gmbd for gmb_switch() from the
 * active one to the other, which hands the memory over within one user.
 * Return: the median switch time; *first gets the first switch, *half_p
 * and *half_r the medians of the pause and the resume (0 for "switch":
 * gmbd's report of the last switch, printed here, has its steps).
 */
static double xproc_run(const char *kind, int n, uint64_t size, double *first, double *half_p,
			double *half_r)
{
	double t[XPROC_SWITCHES], tp[XPROC_SWITCHES], tr[XPROC_SWITCHES];
	int sw = strcmp(kind, "switch") == 0;
	const char *wkind = sw ? "broker" : kind;
	struct xworker w[2] = { xw_start(wkind, n, size, sw ? "sA" : "A"),
				xw_start(wkind, n, size, sw ? "sB" : "B") };
	gmb_client *op = NULL; /* the operator of "switch", a tool client; owned here */
	char *report = NULL;   /* gmbd's steps of the last switch; owned here */

	if (sw)
		GMB_CK(op, gmb_connect_flags(NULL, "vmm-bench-switch", GMB_CONNECT_TOOL, &op));
	/*
	 * Never both at once, as in RL: A allocates and pauses, B allocates
	 * and pauses, A resumes.
	 */
	xw_cmd(&w[0], "setup");
	xw_cmd(&w[0], "pause");
	xw_cmd(&w[1], "setup");
	xw_cmd(&w[1], "pause");
	xw_cmd(&w[0], "resume");
	int active = 0;
	for (int k = 0; k < XPROC_SWITCHES; k++) {
		double t0 = gu_now();
		if (sw) {
			char from[32], to[32];

			snprintf(from, sizeof(from), "xproc-%s", w[active].name);
			snprintf(to, sizeof(to), "xproc-%s", w[1 - active].name);
			free(report);
			report = NULL;
			int rc = gmb_switch(op, from, to, NULL, 0, &report);
			CHECK(rc == 0, "gmb_switch %s -> %s = %d (%s): %s\n%s", from, to, rc,
			      gmb_strerror(rc), gmb_last_error(op), report ? report : "");
			tp[k] = tr[k] = 0;
		} else {
			tp[k] = xw_cmd(&w[active], "pause");
			tr[k] = xw_cmd(&w[1 - active], "resume");
		}
		t[k] = gu_now() - t0;
		active = 1 - active;
	}
	if (sw) {
		printf("gmbd's report of the last switch:\n%s", report ? report : "(none)\n");
		free(report);
		gmb_close(op);
	}
	xw_stop(&w[0]);
	xw_stop(&w[1]);
	*first = t[0];
	*half_p = gu_median(tp + 1, XPROC_SWITCHES - 1);
	*half_r = gu_median(tr + 1, XPROC_SWITCHES - 1);
	return gu_median(t + 1, XPROC_SWITCHES - 1);
}

/* ---- part 4: bandwidth-bound kernel ---- */

__global__ static void triad(float4 *a, const float4 *b, const float4 *c, size_t n, float s)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		float4 x = b[i], y = c[i];
		a[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
	}
}

static double triad_gbs(void *a, void *b, void *c, uint64_t bytes)
{
	cudaEvent_t e0, e1;
	double t[20];
	size_t n = bytes / sizeof(float4);
	int sms = 0;

	CUDA_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	CUDA_CK(cudaMemset(b, 0, bytes));
	CUDA_CK(cudaMemset(c, 0, bytes));
	CUDA_CK(cudaEventCreate(&e0));
	CUDA_CK(cudaEventCreate(&e1));
	for (int i = 0; i < 23; i++) {
		CUDA_CK(cudaEventRecord(e0, 0));
		triad<<<sms * 8, 256>>>((float4 *)a, (const float4 *)b, (const float4 *)c, n, 3.0f);
		CUDA_CK(cudaGetLastError());
		CUDA_CK(cudaEventRecord(e1, 0));
		CUDA_CK(cudaEventSynchronize(e1));
		float ms = 0;
		CUDA_CK(cudaEventElapsedTime(&ms, e0, e1));
		if (i >= 3)
			t[i - 3] = ms * 1e-3;
	}
	CUDA_CK(cudaEventDestroy(e0));
	CUDA_CK(cudaEventDestroy(e1));
	return gbs(3 * bytes, gu_median(t, 20));
}

/* ---- summary ---- */

#define NMODES 3
static const char *const mode_name[NMODES] = { "default", "warm", "switch" };

/* The cross-process figures, seconds (all 0 with --no-xproc). */
struct xproc_res {
	int gib;		 /* the size switched; 0: not run */
	double base, base_first; /* baseline: A release + B create */
	double brk, brk_first;	 /* default gmbd: A pause + B resume */
	double sw, sw_first;	 /* gmb_switch() A -> B on the default gmbd */
};

static const struct row *find_row(const char *shape, int preserve, int impl)
{
	for (int i = 0; i < g_nrows; i++)
		if (g_rows[i].shape == shape && g_rows[i].preserve == preserve &&
		    g_rows[i].impl == impl)
			return &g_rows[i];
	return NULL;
}

static void print_summary(const struct shape *shapes, int nshapes, const struct xproc_res *x,
			  double bw_base, double bw_brk, long smi, int cycles, int cycles64)
{
	printf("\n==== SUMMARY (vmm_bench) ====\n");
	printf("pinned copy bandwidth: D2H %.1f GB/s, H2D %.1f GB/s (1 GiB, cuMemAllocHost)\n\n",
	       g_d2h_gbs, g_h2d_gbs);
	printf("setup (the allocation), pause and resume, ms (first cycle, then median of %d; %d "
	       "for 64 GiB preserve); default: gmbd as started, a pause gives memory to the "
	       "driver; warm: gmbd --pool-keep unlimited; ratio: impl / baseline (below 1: "
	       "faster):\n",
	       cycles, cycles64);
	printf("| shape | mode | impl | setup | pause | ratio | resume | ratio |\n"
	       "|---|---|---|---|---|---|---|---|\n");
	for (int s = 0; s < nshapes; s++)
		for (int m = 0; m < 2; m++) {
			const struct row *b = find_row(shapes[s].name, m, IMPL_BASE);
			if (!b)
				continue;
			for (int i = 0; i < IMPL_N; i++) {
				const struct row *r = find_row(shapes[s].name, m, i);
				if (!r)
					continue;
				printf("| %s | %s | %s | %.2f | %.2f (first %.2f) | %.2fx | %.2f "
				       "(first %.2f) | %.2fx |\n",
				       shapes[s].name, m ? "preserve" : "discard", impl_name[i],
				       r->setup * 1e3, r->pause_med * 1e3, r->pause_first * 1e3,
				       r->pause_med / b->pause_med, r->resume_med * 1e3,
				       r->resume_first * 1e3, r->resume_med / b->resume_med);
			}
		}
	printf("\npreserve throughput, GB/s (%% of pinned D2H for pause, H2D for resume):\n");
	printf("| shape | impl | pause first | pause median | resume first | resume median | "
	       "bytes |\n|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < g_nrows; i++) {
		const struct row *r = &g_rows[i];
		if (!r->preserve)
			continue;
		printf("| %s | %s | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f (%.0f%%) | "
		       "%s |\n",
		       r->shape, impl_name[r->impl], gbs(r->bytes, r->pause_first),
		       100 * gbs(r->bytes, r->pause_first) / g_d2h_gbs, gbs(r->bytes, r->pause_med),
		       100 * gbs(r->bytes, r->pause_med) / g_d2h_gbs,
		       gbs(r->bytes, r->resume_first),
		       100 * gbs(r->bytes, r->resume_first) / g_h2d_gbs,
		       gbs(r->bytes, r->resume_med), 100 * gbs(r->bytes, r->resume_med) / g_h2d_gbs,
		       r->intact ? "intact" : "WRONG");
	}
	if (x->gib) {
		printf("\ncross-process, %d GiB from process A to B (one user), ms (median of %d, "
		       "first):\n| how | time | baseline / this |\n|---|---|---|\n",
		       x->gib, XPROC_SWITCHES - 1);
		printf("| baseline: A release + B create | %.2f (first %.2f) | 1.00x |\n",
		       x->base * 1e3, x->base_first * 1e3);
		printf("| default gmbd: A pause + B resume, through the driver (no goal) | %.2f "
		       "(first %.2f) | %.2fx |\n",
		       x->brk * 1e3, x->brk_first * 1e3, x->base / x->brk);
		printf("| switch: gmb_switch() A -> B, default gmbd | %.2f (first %.2f) | %.2fx |\n",
		       x->sw * 1e3, x->sw_first * 1e3, x->base / x->sw);
	}
	printf("triad over 3 x 1 GiB: cuMemAlloc %.0f GB/s, default gmbd %.0f GB/s (%.1f%%)\n",
	       bw_base, bw_brk, 100 * bw_brk / bw_base);
	if (smi == -1)
		printf("gmbd GPU memory: not listed by nvidia-smi (no context): 0 MiB\n");
	else
		printf("gmbd GPU memory: %ld MiB per nvidia-smi%s\n", smi,
		       smi < 0 ? " (unknown)" : "");

	/* The goals of each mode, default first; one clause per mode for RESULT. */
	char clause[NMODES][128];
	int miss = 0;
	printf("\ngoals, by mode:\n| mode | goal | measured | result |\n|---|---|---|---|\n");
	for (int m = 0; m < NMODES; m++) {
		int n = 0, met = 0;
		for (int i = 0; i < g_ngoals; i++) {
			const struct goal *g = &g_goals[i];
			if (strcmp(g->mode, mode_name[m]) != 0)
				continue;
			printf("| %s | %s | %s | %s |\n", g->mode, g->what, g->value,
			       g->pass ? "PASS" : "MISS");
			n++;
			met += g->pass;
		}
		miss += n - met;
		if (n)
			snprintf(clause[m], sizeof(clause[m]), "%s %d of %d goals met",
				 mode_name[m], met, n);
		else
			snprintf(clause[m], sizeof(clause[m]), "%s not measured (%s)", mode_name[m],
				 m == 1 ? "no warm gmbd: --warm-socket or $GMB_SOCKET_WARM" :
					  "--no-xproc");
	}
	printf("\n");
	gu_result(miss ? "MISS" : "PASS", "%s; %s; %s%s", clause[0], clause[1], clause[2],
		  miss ? " (see the goals table)" : "");
}

static void add_goals(const struct shape *shapes, int nshapes, const struct xproc_res *x,
		      double bw_base, double bw_brk, long smi)
{
	char what[160];

	/* default: a pause gives the memory to the driver, as the baseline's does. */
	for (int s = 0; s < nshapes; s++) {
		const struct row *b = find_row(shapes[s].name, 0, IMPL_BASE);
		const struct row *k = find_row(shapes[s].name, 0, IMPL_BROKER);
		if (!b || !k)
			continue;
		double rp = k->pause_med / b->pause_med, rr = k->resume_med / b->resume_med;
		snprintf(what, sizeof(what), "discard, %s: pause <= 1.0x baseline", shapes[s].name);
		goal_add("default", rp <= 1.0, what, "%.3fx (%.2f vs %.2f ms)", rp,
			 k->pause_med * 1e3, b->pause_med * 1e3);
		snprintf(what, sizeof(what), "discard, %s: resume <= 1.0x baseline",
			 shapes[s].name);
		goal_add("default", rr <= 1.0, what, "%.3fx (%.2f vs %.2f ms)", rr,
			 k->resume_med * 1e3, b->resume_med * 1e3);
	}
	for (int s = 0; s < nshapes; s++) {
		const struct row *k = find_row(shapes[s].name, 1, IMPL_BROKER);
		if (!k)
			continue;
		double p = 100 * gbs(k->bytes, k->pause_first > k->pause_med ? k->pause_first
									       : k->pause_med) /
			   g_d2h_gbs;
		double r = 100 * gbs(k->bytes, k->resume_first > k->resume_med ? k->resume_first
										 : k->resume_med) /
			   g_h2d_gbs;
		snprintf(what, sizeof(what),
			 "preserve, %s: >= 90%% of pinned bandwidth, first cycle included",
			 shapes[s].name);
		goal_add("default", p >= 90 && r >= 90 && k->intact == 1, what,
			 "pause %.0f%%, resume %.0f%% (worst of first/median)%s", p, r,
			 k->intact == 1 ? "" : ", BYTES WRONG");
	}
	goal_add("default", bw_brk >= 0.95 * bw_base,
		 "triad kernel over gmbd's memory: >= 95% of cuMemAlloc",
		 "%.1f%% (%.0f vs %.0f GB/s)", 100 * bw_brk / bw_base, bw_brk, bw_base);
	if (smi == -1)
		goal_add("default", 1, "gmbd's own GPU memory <= 4 MiB",
			 "not listed by nvidia-smi: 0 MiB");
	else
		goal_add("default", smi >= 0 && smi <= 4, "gmbd's own GPU memory <= 4 MiB",
			 "%ld MiB%s", smi, smi < 0 ? " (nvidia-smi gave no number)" : "");

	/* warm: a pause keeps the chunks in gmbd, a resume maps them again. */
	for (int s = 0; s < nshapes; s++) {
		const struct row *b = find_row(shapes[s].name, 0, IMPL_BASE);
		const struct row *k = find_row(shapes[s].name, 0, IMPL_WARM);
		if (!b || !k)
			continue;
		double rp = k->pause_med / b->pause_med, rr = k->resume_med / b->resume_med;
		snprintf(what, sizeof(what), "discard, %s: pause <= %.2fx baseline", shapes[s].name,
			 shapes[s].warm_pause);
		goal_add("warm", rp <= shapes[s].warm_pause, what, "%.3fx (%.2f vs %.2f ms)", rp,
			 k->pause_med * 1e3, b->pause_med * 1e3);
		snprintf(what, sizeof(what), "discard, %s: resume <= 1.0x baseline",
			 shapes[s].name);
		goal_add("warm", rr <= 1.0, what, "%.3fx (%.2f vs %.2f ms)", rr,
			 k->resume_med * 1e3, b->resume_med * 1e3);
	}

	/* switch: A's memory handed to B, no release, zeroing or create. */
	if (x->gib) {
		snprintf(what, sizeof(what),
			 "cross-process switch, %d GiB: >= 10x faster than the baseline's release "
			 "+ create",
			 x->gib);
		goal_add("switch", x->base / x->sw >= 10.0, what, "%.2fx (%.2f vs %.2f ms)",
			 x->base / x->sw, x->sw * 1e3, x->base * 1e3);
	}
}

int main(int argc, char **argv)
{
	if (argc > 5 && strcmp(argv[1], "xworker") == 0)
		return role_xworker(argc, argv);
	gu_set_name("vmm_bench");

	int cycles = 5, cycles64 = 3, quick = 0, no_p64 = 0, no_xproc = 0;
	const char *warm = getenv("GMB_SOCKET_WARM");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--cycles") == 0 && i + 1 < argc)
			cycles = atoi(argv[++i]);
		else if (strcmp(argv[i], "--cycles-64") == 0 && i + 1 < argc)
			cycles64 = atoi(argv[++i]);
		else if (strcmp(argv[i], "--quick") == 0)
			quick = 1;
		else if (strcmp(argv[i], "--no-preserve-64") == 0)
			no_p64 = 1;
		else if (strcmp(argv[i], "--no-xproc") == 0)
			no_xproc = 1;
		else if (strcmp(argv[i], "--first-pause-after") == 0 && i + 1 < argc)
			g_first_pause_after = atof(argv[++i]);
		else if (strcmp(argv[i], "--settle") == 0 && i + 1 < argc)
			g_settle = atof(argv[++i]);
		else if (strcmp(argv[i], "--warm-socket") == 0 && i + 1 < argc)
			warm = argv[++i];
		else
			gu_fail("unknown option %s (--cycles N, --cycles-64 N, --quick, "
				"--no-preserve-64, --no-xproc, --warm-socket PATH, "
				"--first-pause-after S, --settle S)",
				argv[i]);
	}
	CHECK(cycles >= 1 && cycles <= MAX_CYCLES && cycles64 >= 1 && cycles64 <= MAX_CYCLES,
	      "cycles must be 1..%d", MAX_CYCLES);
	CHECK(g_settle >= 0 && g_settle <= 60 && g_first_pause_after >= 0 && g_first_pause_after <= 600,
	      "--settle is 0..60 s, --first-pause-after 0..600 s");

	/* The warm goal for pauses: 1 GiB allocations 0.10x, 20 MiB ones 0.20x. */
	struct shape full[] = { { "16 x 1 GiB", 16, GiB, 0.10 },
				{ "205 x 20 MiB", 205, 20 * MiB, 0.20 },
				{ "64 x 1 GiB", 64, GiB, 0.10 } };
	struct shape small[] = { { "4 x 1 GiB", 4, GiB, 0.10 },
				 { "51 x 20 MiB", 51, 20 * MiB, 0.20 },
				 { "8 x 1 GiB", 8, GiB, 0.10 } };
	struct shape *shapes = quick ? small : full;
	const int nshapes = 3;
	uint64_t xbytes = quick ? 8 * GiB : 64 * GiB;

	gu_cuda_init(0);
	CU_CK(cuCtxGetDevice(&g_dev));
	CU_CK(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING));
	g_c = gu_connect("vmm-bench");
	trim_pool(g_c);
	if (warm && *warm) {
		int r = gmb_connect(warm, "vmm-bench-warm", &g_cw);
		CHECK(r == 0, "gmb_connect(vmm-bench-warm) on %s: %d %s", warm, r, gmb_strerror(r));
		trim_pool(g_cw);
	}
	printf("vmm_bench: %s shapes, %d measured cycles after one first cycle (%d for 64 GiB "
	       "preserve); warm gmbd: %s\n",
	       quick ? "quick" : "full", cycles, cycles64,
	       g_cw ? warm : "none (no --warm-socket, no $GMB_SOCKET_WARM)");

	measure_pinned();
	for (int s = 0; s < nshapes; s++)
		for (int m = 0; m < 2; m++) {
			int big = shapes[s].n * shapes[s].size >= 32 * GiB;
			if (m && big && no_p64)
				continue;
			int cyc = m && big ? cycles64 : cycles;
			run_shape(&shapes[s], m, IMPL_BASE, cyc);
			run_shape(&shapes[s], m, IMPL_BROKER, cyc);
			if (!m && g_cw)
				run_shape(&shapes[s], m, IMPL_WARM, cyc);
		}
	for (int i = 0; i < g_nrows; i++)
		CHECK(g_rows[i].intact != 0, "%s %s preserve: bytes wrong after resume",
		      g_rows[i].shape, impl_name[g_rows[i].impl]);
	if (g_cw) {
		gmb_close(g_cw); /* its rows are done; it holds nothing (trimmed) */
		g_cw = NULL;
	}

	struct xproc_res x;
	double hp, hr;
	memset(&x, 0, sizeof(x));
	if (!no_xproc) {
		int n = (int)(xbytes / GiB);
		trim_pool(g_c);
		x.base = xproc_run("baseline", n, GiB, &x.base_first, &hp, &hr);
		printf("cross-process baseline: switch %.2f ms median (A release %.2f + B create "
		       "%.2f), first %.2f ms\n",
		       x.base * 1e3, hp * 1e3, hr * 1e3, x.base_first * 1e3);
		x.brk = xproc_run("broker", n, GiB, &x.brk_first, &hp, &hr);
		printf("cross-process default:  switch %.2f ms median (A pause %.2f + B resume "
		       "%.2f), first %.2f ms\n",
		       x.brk * 1e3, hp * 1e3, hr * 1e3, x.brk_first * 1e3);
		trim_pool(g_c);
		x.sw = xproc_run("switch", n, GiB, &x.sw_first, &hp, &hr);
		printf("cross-process switch:   %.2f ms median (gmb_switch A -> B), first %.2f ms\n",
		       x.sw * 1e3, x.sw_first * 1e3);
		trim_pool(g_c);
		x.gib = n;
	}

	/* Kernel speed over gmbd's memory vs cuMemAlloc; gmbd's memory meanwhile. */
	const uint64_t tb = GiB;
	CUdeviceptr d[3];
	void *k[3];
	for (int i = 0; i < 3; i++)
		CU_CK(cuMemAlloc(&d[i], tb));
	double bw_base = triad_gbs((void *)d[0], (void *)d[1], (void *)d[2], tb);
	for (int i = 0; i < 3; i++)
		CU_CK(cuMemFree(d[i]));
	for (int i = 0; i < 3; i++)
		GMB_CK(g_c, gmb_malloc(g_c, &k[i], tb, 0, "triad"));
	double bw_brk = triad_gbs(k[0], k[1], k[2], tb);
	printf("triad 3 x 1 GiB: cuMemAlloc %.0f GB/s, default gmbd %.0f GB/s\n", bw_base, bw_brk);

	long smi = -3;
	char raw[8192] = "";
	const char *gp = getenv("GMBD_PID");
	if (gp && *gp) {
		smi = gu_smi_process_mib(atol(gp), raw, sizeof(raw));
		printf("nvidia-smi compute apps while gmbd lends 3 GiB (gmbd pid %s):\n%s", gp,
		       raw);
	} else {
		printf("GMBD_PID not set: gmbd's GPU memory not measured\n");
	}
	for (int i = 0; i < 3; i++)
		GMB_CK(g_c, gmb_free(g_c, k[i]));
	trim_pool(g_c);
	gmb_close(g_c);

	add_goals(shapes, nshapes, &x, bw_base, bw_brk, smi);
	print_summary(shapes, nshapes, &x, bw_base, bw_brk, smi, cycles, cycles64);
	return 0;
}
