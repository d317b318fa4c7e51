/*
 * slice_probe.cu - whether one chunk can back several allocations, each a
 * mapping of its own at an offset into the chunk, and what that costs.
 *
 * cuMemMap's parameter note says its offset "currently must be zero", so
 * gmbd backs every allocation with chunks of its own, mapped whole; CUDA
 * 13's description of the same call says offset and size are granularity
 * multiples with offset + size inside the allocation. Which one the driver
 * keeps decides whether 16 allocations of 1 GiB could be backed by fewer,
 * larger chunks: one create, export, import and fd a chunk instead of one
 * an allocation.
 *
 * Part one, what the driver accepts: a chunk of 4 GiB (made here, and made
 * in a second process without a context, as gmbd, then imported here)
 * mapped as four 1 GiB slices at offsets 0..3 GiB into four reservations of
 * their own; each slice filled with its own word, then read through a
 * mapping of the whole chunk (the slices must alias the right bytes); one
 * slice unmapped and mapped again while the others stay; the handle
 * released while slices are mapped (the memory must stay). Also 2 MiB
 * slices of a 20 MiB chunk.
 *
 * Part two, what it costs: 16 allocations of 1 GiB (16 reservations)
 * backed by 16 chunks of 1 GiB, 4 of 4 GiB or 1 of 16 GiB; made here (what
 * torch_memory_saver does, one chunk an allocation) or imported from the
 * second process (what a lend is); ms for all 16: the creates or imports
 * (fd closes included), the 16 maps + accesses, the whole, and the 16
 * unmaps + releases after (here the last reference only when made here;
 * the maker's release of its last references in its own column). Medians
 * of 5 rounds, each right after 16 GiB was made and released here (a
 * resume after a pause) and after the GPU idled 300 ms.
 *
 *   slice_probe
 */
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"

#define NALLOC	16
#define ROUNDS	5
#define MAXCH	64

/* A request to the maker: @n chunks of @size; n == 0 ends it. */
struct slice_req {
	int n;
	uint64_t size;
};

/* Its answers: the create + export, then the release, each in ms. */
static __attribute__((noreturn)) void slice_maker(int sock, void *unused)
{
	CUmemAllocationProp prop = gu_fd_prop();
	struct slice_req rq;
	CUdevice dev;
	char ack;

	(void)unused;
	CU_CK(cuInit(0));
	CU_CK(cuDeviceGet(&dev, 0));
	while (read(sock, &rq, sizeof(rq)) == (ssize_t)sizeof(rq) && rq.n > 0) {
		CUmemGenericAllocationHandle h[MAXCH];
		int fds[MAXCH];
		double t, made, gone;

		CHECK(rq.n <= MAXCH, "too many chunks");
		t = gu_now();
		for (int i = 0; i < rq.n; i++) {
			CU_CK(cuMemCreate(&h[i], rq.size, &prop, 0));
			CU_CK(cuMemExportToShareableHandle(&fds[i], h[i],
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		}
		made = (gu_now() - t) * 1e3;
		gu_send_fds(sock, fds, rq.n);
		for (int i = 0; i < rq.n; i++)
			close(fds[i]);
		CHECK(read(sock, &ack, 1) == 1, "the importer did not answer");
		t = gu_now();
		for (int i = 0; i < rq.n; i++)
			CU_CK(cuMemRelease(h[i]));
		gone = (gu_now() - t) * 1e3;
		CHECK(write(sock, &made, sizeof(made)) == (ssize_t)sizeof(made), "made");
		CHECK(write(sock, &gone, sizeof(gone)) == (ssize_t)sizeof(gone), "gone");
	}
	exit(0);
}

/* @n chunks of @size from the maker, imported (fds closed). */
static void slice_import(int sock, int n, uint64_t size, CUmemGenericAllocationHandle *h)
{
	struct slice_req rq = { n, size };

	CHECK(write(sock, &rq, sizeof(rq)) == (ssize_t)sizeof(rq), "request");
	gu_import_fds(sock, n, h);
}

/* The maker may release; its create and release ms. */
static void slice_import_done(int sock, double *made, double *gone)
{
	char ack = 1;

	CHECK(write(sock, &ack, 1) == 1, "ack");
	CHECK(read(sock, made, sizeof(*made)) == (ssize_t)sizeof(*made), "the maker's create");
	CHECK(read(sock, gone, sizeof(*gone)) == (ssize_t)sizeof(*gone), "the maker's release");
}

/* Part one. */

static uint32_t slice_word(CUdeviceptr p)
{
	uint32_t w = 0;

	CU_CK(cuMemcpyDtoH(&w, p, sizeof(w)));
	return w;
}

/*
 * @nsl slices of @slice bytes of @h (one chunk of nsl * slice bytes): maps
 * each into a reservation of its own, checks the aliasing, the unmap of one,
 * and (when @release) that memory outlives its handle. 0 when all held, else
 * the first refused call's CUresult, and what failed in @what.
 */
static int slice_check(CUmemGenericAllocationHandle h, int nsl, uint64_t slice, bool release,
		       const char **what)
{
	CUmemAccessDesc acc = gu_rw_access();
	CUdeviceptr r[16], whole;
	uint64_t bytes = slice * (uint64_t)nsl;
	bool held = true;
	CUresult rc;
	int bad = 0;

	CHECK(nsl <= 16, "too many slices");
	CU_CK(cuMemAddressReserve(&whole, bytes, 2 * MiB, 0, 0));
	for (int i = 0; i < nsl; i++)
		CU_CK(cuMemAddressReserve(&r[i], slice, 2 * MiB, 0, 0));
	for (int i = 0; i < nsl; i++) {
		rc = cuMemMap(r[i], slice, slice * (uint64_t)i, h, 0);
		if (rc != CUDA_SUCCESS) {
			*what = i ? "cuMemMap at a non-zero offset" : "cuMemMap of the first slice";
			for (int j = 0; j < i; j++)
				CU_CK(cuMemUnmap(r[j], slice));
			bad = (int)rc;
			goto out;
		}
		CU_CK(cuMemSetAccess(r[i], slice, &acc, 1));
		CU_CK(cuMemsetD32(r[i], 0x5100u + (unsigned)i, slice / 4));
	}
	CU_CK(cuCtxSynchronize());
	CU_CK(cuMemMap(whole, bytes, 0, h, 0));
	CU_CK(cuMemSetAccess(whole, bytes, &acc, 1));
	for (int i = 0; i < nsl && !bad; i++)
		if (slice_word(whole + slice * i) != 0x5100u + (unsigned)i ||
		    slice_word(whole + slice * (i + 1) - 4) != 0x5100u + (unsigned)i) {
			*what = "a slice's bytes read through the whole chunk";
			bad = -1;
		}
	/* One slice goes and comes back; the others and its bytes stay. */
	CU_CK(cuMemUnmap(r[1], slice));
	if (!bad && (slice_word(r[0]) != 0x5100u || slice_word(r[2]) != 0x5102u)) {
		*what = "the neighbours of an unmapped slice";
		bad = -1;
	}
	CU_CK(cuMemMap(r[1], slice, slice, h, 0));
	CU_CK(cuMemSetAccess(r[1], slice, &acc, 1));
	if (!bad && slice_word(r[1]) != 0x5101u) {
		*what = "a slice mapped again";
		bad = -1;
	}
	CU_CK(cuMemUnmap(whole, bytes));
	if (release) {
		CU_CK(cuMemRelease(h));
		held = false;
		if (!bad && slice_word(r[nsl - 1]) != 0x5100u + (unsigned)(nsl - 1)) {
			*what = "a slice after its handle was released";
			bad = -1;
		}
	}
	for (int i = 0; i < nsl; i++)
		CU_CK(cuMemUnmap(r[i], slice));
out:
	for (int i = 0; i < nsl; i++)
		CU_CK(cuMemAddressFree(r[i], slice));
	CU_CK(cuMemAddressFree(whole, bytes));
	if (held && release)
		CU_CK(cuMemRelease(h)); /* a refused map left it ours */
	return bad;
}

static void slice_report(const char *name, int bad, const char *what, int *failed)
{
	if (bad == 0)
		printf("| %s | accepted: slices alias the chunk, unmap one alone, outlive the handle |\n",
		       name);
	else if (bad > 0)
		printf("| %s | refused: %s returned CUresult %d |\n", name, what, bad);
	else
		printf("| %s | WRONG: %s |\n", name, what);
	if (bad)
		(*failed)++;
}

static int slice_part_one(int sock)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemGenericAllocationHandle h;
	const char *what = "";
	double made, gone;
	int failed = 0, bad;

	printf("| chunk | offsets |\n|---|---|\n");
	CU_CK(cuMemCreate(&h, 4 * GiB, &prop, 0));
	bad = slice_check(h, 4, GiB, true, &what);
	slice_report("4 GiB made here, 4 slices of 1 GiB", bad, what, &failed);
	slice_import(sock, 1, 4 * GiB, &h);
	bad = slice_check(h, 4, GiB, true, &what);
	slice_import_done(sock, &made, &gone);
	slice_report("4 GiB imported (made by a process without a context), 4 slices of 1 GiB",
		     bad, what, &failed);
	CU_CK(cuMemCreate(&h, 20 * MiB, &prop, 0));
	bad = slice_check(h, 10, 2 * MiB, true, &what);
	slice_report("20 MiB made here, 10 slices of 2 MiB", bad, what, &failed);
	return failed;
}

/* Part two. */

struct slice_way {
	const char *name;
	int nchunks;  /* backing the 16 allocations */
	bool imported;
};

static const struct slice_way slice_ways[] = {
	{ "made here, 16 chunks of 1 GiB (torch_memory_saver)", 16, false },
	{ "made here, 4 chunks of 4 GiB", 4, false },
	{ "made here, 1 chunk of 16 GiB", 1, false },
	{ "imported, 16 chunks of 1 GiB (a lend today)", 16, true },
	{ "imported, 4 chunks of 4 GiB", 4, true },
	{ "imported, 1 chunk of 16 GiB", 1, true },
};
#define NWAYS (int)(sizeof(slice_ways) / sizeof(slice_ways[0]))

struct slice_times {
	double make, map, whole, unmap, maker_make, maker_release;
};

/* 16 GiB made and released here: a resume right after a pause finds it just released. */
static void slice_churn(void)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemGenericAllocationHandle h[NALLOC];

	for (int i = 0; i < NALLOC; i++)
		CU_CK(cuMemCreate(&h[i], GiB, &prop, 0));
	for (int i = 0; i < NALLOC; i++)
		CU_CK(cuMemRelease(h[i]));
}

static void slice_round(int sock, const struct slice_way *w, const CUdeviceptr *va,
			struct slice_times *t)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemAccessDesc acc = gu_rw_access();
	CUmemGenericAllocationHandle h[NALLOC];
	uint64_t csize = GiB * (NALLOC / w->nchunks);
	int per = NALLOC / w->nchunks;
	double t0, t1, t2, t3;

	t0 = gu_now();
	if (w->imported) {
		slice_import(sock, w->nchunks, csize, h);
	} else {
		for (int c = 0; c < w->nchunks; c++)
			CU_CK(cuMemCreate(&h[c], csize, &prop, 0));
	}
	t1 = gu_now();
	for (int i = 0; i < NALLOC; i++) {
		CU_CK(cuMemMap(va[i], GiB, GiB * (uint64_t)(i % per), h[i / per], 0));
		CU_CK(cuMemSetAccess(va[i], GiB, &acc, 1));
	}
	t2 = gu_now();
	for (int i = 0; i < NALLOC; i++)
		CU_CK(cuMemUnmap(va[i], GiB));
	for (int c = 0; c < w->nchunks; c++)
		CU_CK(cuMemRelease(h[c]));
	t3 = gu_now();
	t->make = (t1 - t0) * 1e3;
	t->map = (t2 - t1) * 1e3;
	t->whole = (t2 - t0) * 1e3;
	t->unmap = (t3 - t2) * 1e3;
	t->maker_make = t->maker_release = 0;
	if (w->imported)
		slice_import_done(sock, &t->maker_make, &t->maker_release);
}

static void slice_part_two(int sock)
{
	static const char *const regimes[2] = { "right after 16 GiB was released here",
						"after 300 ms idle" };
	CUdeviceptr va[NALLOC];

	for (int i = 0; i < NALLOC; i++)
		CU_CK(cuMemAddressReserve(&va[i], GiB, 2 * MiB, 0, 0));
	printf("\n| 16 allocations of 1 GiB | regime | creates or imports | maps + accesses | "
	       "whole | unmaps + releases | the maker's create + export | the maker's release |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	for (int w = 0; w < NWAYS; w++) {
		for (int g = 0; g < 2; g++) {
			double v[6][ROUNDS];

			for (int r = 0; r < ROUNDS; r++) {
				struct slice_times t;

				if (g == 0)
					slice_churn();
				else
					usleep(300 * 1000);
				slice_round(sock, &slice_ways[w], va, &t);
				v[0][r] = t.make;
				v[1][r] = t.map;
				v[2][r] = t.whole;
				v[3][r] = t.unmap;
				v[4][r] = t.maker_make;
				v[5][r] = t.maker_release;
				usleep(200 * 1000);
			}
			printf("| %s | %s |", g ? "" : slice_ways[w].name, regimes[g]);
			for (int k = 0; k < 6; k++) {
				if (k >= 4 && !slice_ways[w].imported)
					printf(" - |");
				else
					printf(" %.2f |", gu_median(v[k], ROUNDS));
			}
			printf("\n");
		}
	}
	for (int i = 0; i < NALLOC; i++)
		CU_CK(cuMemAddressFree(va[i], GiB));
}

int main(void)
{
	struct slice_req end = { 0, 0 };
	CUcontext ctx;
	CUdevice dev;
	int sock, failed;
	pid_t pid;

	gu_set_name("slice_probe");
	pid = gu_fork_peer(slice_maker, NULL, -1, &sock);
	gu_primary_ctx(&ctx, &dev);
	failed = slice_part_one(sock);
	if (failed == 0)
		slice_part_two(sock);
	CHECK(write(sock, &end, sizeof(end)) == (ssize_t)sizeof(end), "end");
	CHECK(waitpid(pid, NULL, 0) == pid, "waitpid");
	if (failed)
		gu_result("PASS", "the driver does not map chunks at an offset here (table above)");
	else
		gu_result("PASS", "slices at offsets work; their costs in the table above");
	return 0;
}
