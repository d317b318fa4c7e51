/*
 * torch_baseline.c - the create-per-allocation baseline of the RL switch
 * (tests/gpu/torch_rl.py): what torch_memory_saver does, with the CUDA
 * driver API, on the allocations gmbd's status reported for each side.
 *
 *   torch_baseline SPEC ROUNDS
 *
 * SPEC has one line per tag: "SIDE MODE COUNT BYTES" (SIDE A or B, MODE
 * discard|zero|preserve): COUNT allocations of BYTES/COUNT each (rounded up
 * to the granularity), each with its own reserved address range. Side A
 * starts mapped, side B paused. A round is: pause A, resume B, pause B,
 * resume A, where pause = drain, copy preserve allocations to pinned host
 * buffers (made once, kept), then cuMemUnmap + cuMemRelease per allocation;
 * resume = cuMemCreate + cuMemMap + cuMemSetAccess per allocation, then the
 * copies back. Prints one line per round and "BASELINE median pause_A=..
 * resume_B=.. pause_B=.. resume_A=.." in milliseconds. Exit 0, or 1 on a
 * driver error (printed).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ALLOCS 65536
#define MAX_ROUNDS 64

struct alloc {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle h;
	void *host;
	int side; /* 0 = A, 1 = B */
};

static struct alloc allocs[MAX_ALLOCS];
static int nallocs;
static CUdevice dev;
static size_t gran;

#define CK(call)                                                                \
	do {                                                                    \
		CUresult r_ = (call);                                           \
		if (r_ != CUDA_SUCCESS) {                                       \
			const char *n_ = "?";                                   \
			cuGetErrorName(r_, &n_);                                \
			fprintf(stderr, "torch_baseline: %s: %s\n", #call, n_); \
			return 1;                                               \
		}                                                               \
	} while (0)

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static CUmemAllocationProp prop(void)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = (int)dev;
	return p;
}

static int map_one(struct alloc *a)
{
	CUmemAllocationProp p = prop();
	CUmemAccessDesc acc;

	memset(&acc, 0, sizeof(acc));
	acc.location = p.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CK(cuMemCreate(&a->h, a->size, &p, 0));
	CK(cuMemMap(a->va, a->size, 0, a->h, 0));
	CK(cuMemSetAccess(a->va, a->size, &acc, 1));
	return 0;
}

static int pause_side(int side)
{
	CK(cuCtxSynchronize());
	for (int i = 0; i < nallocs; i++) {
		struct alloc *a = &allocs[i];

		if (a->side != side)
			continue;
		if (a->host)
			CK(cuMemcpyDtoH(a->host, a->va, a->size));
		CK(cuMemUnmap(a->va, a->size));
		CK(cuMemRelease(a->h));
	}
	return 0;
}

static int resume_side(int side)
{
	for (int i = 0; i < nallocs; i++) {
		struct alloc *a = &allocs[i];

		if (a->side != side)
			continue;
		if (map_one(a))
			return 1;
		if (a->host)
			CK(cuMemcpyHtoD(a->va, a->host, a->size));
	}
	return 0;
}

static int add_tag(int side, int preserve, long count, size_t bytes)
{
	size_t each = (bytes / (size_t)count + gran - 1) / gran * gran;

	for (long i = 0; i < count; i++) {
		struct alloc *a = &allocs[nallocs];

		if (nallocs == MAX_ALLOCS) {
			fprintf(stderr, "torch_baseline: more than %d allocations\n", MAX_ALLOCS);
			return 1;
		}
		a->side = side;
		a->size = each;
		CK(cuMemAddressReserve(&a->va, each, 0, 0, 0));
		/* Pinned host copies are made once and kept, as gmbd does. */
		if (preserve)
			CK(cuMemAllocHost(&a->host, each));
		nallocs++;
		if (side == 0 && map_one(a))
			return 1;
	}
	return 0;
}

static int read_spec(const char *path)
{
	char side[8], mode[32];
	long count;
	size_t bytes;
	FILE *f = fopen(path, "r");

	if (!f) {
		perror(path);
		return 1;
	}
	while (fscanf(f, "%7s %31s %ld %zu", side, mode, &count, &bytes) == 4) {
		if (count <= 0 || bytes == 0)
			continue;
		if (add_tag(side[0] == 'B', strcmp(mode, "preserve") == 0, count, bytes)) {
			fclose(f);
			return 1;
		}
	}
	fclose(f);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[n / 2];
}

int main(int argc, char **argv)
{
	double t[4][MAX_ROUNDS];
	int rounds = argc > 2 ? atoi(argv[2]) : 5;
	CUmemAllocationProp p;
	CUcontext ctx;

	if (argc < 2 || rounds < 1 || rounds > MAX_ROUNDS) {
		fprintf(stderr, "usage: torch_baseline SPEC [ROUNDS (1..%d)]\n", MAX_ROUNDS);
		return 2;
	}
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	p = prop();
	CK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	if (read_spec(argv[1]))
		return 1;
	for (int r = 0; r < rounds; r++) {
		static const int order[4][2] = { { 0, 0 }, { 1, 1 }, { 0, 1 }, { 1, 0 } };

		for (int k = 0; k < 4; k++) {
			double t0 = now_ms();
			int rc = order[k][0] ? resume_side(order[k][1]) : pause_side(order[k][1]);

			if (rc)
				return 1;
			CK(cuCtxSynchronize());
			t[k][r] = now_ms() - t0;
		}
		printf("BASELINE round=%d pause_A=%.2f resume_B=%.2f pause_B=%.2f resume_A=%.2f\n",
		       r, t[0][r], t[1][r], t[2][r], t[3][r]);
	}
	printf("BASELINE median pause_A=%.2f resume_B=%.2f pause_B=%.2f resume_A=%.2f\n",
	       median(t[0], rounds), median(t[1], rounds), median(t[2], rounds),
	       median(t[3], rounds));
	printf("BASELINE allocations=%d\n", nallocs);
	return 0;
}
