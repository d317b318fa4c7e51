/*
 * unmap_probe.cu - what one driver call costs over several mappings.
 *
 * A pause unmaps every mapping and a resume sets access on each; the driver
 * charges per mapping (GPU-FACTS.md), but it is not known whether one
 * cuMemUnmap / cuMemSetAccess over N back-to-back mappings in one VA range
 * costs N single calls or less. If less, laying a tag's allocations out in
 * one range would cut the pause of many small allocations; this probe
 * measures it. Driver API only, no broker.
 *
 *   unmap_probe [N ...]   (default: 1 16 205 of 20 MiB chunks)
 */
#include "tests/gpu/gpu_util.h"

#define CHUNK (20 * MiB)
#define ROUNDS 5

static CUmemGenericAllocationHandle handles[1024];

static void map_all(CUdeviceptr va, int n, int one_access_call)
{
	CUmemAccessDesc acc = {};

	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = 0;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (int i = 0; i < n; i++)
		CU_CK(cuMemMap(va + (CUdeviceptr)i * CHUNK, CHUNK, 0, handles[i], 0));
	if (one_access_call) {
		CU_CK(cuMemSetAccess(va, (size_t)n * CHUNK, &acc, 1));
		return;
	}
	for (int i = 0; i < n; i++)
		CU_CK(cuMemSetAccess(va + (CUdeviceptr)i * CHUNK, CHUNK, &acc, 1));
}

static double unmap_all(CUdeviceptr va, int n, int one_call)
{
	double t0 = gu_now();

	if (one_call) {
		CU_CK(cuMemUnmap(va, (size_t)n * CHUNK));
	} else {
		for (int i = 0; i < n; i++)
			CU_CK(cuMemUnmap(va + (CUdeviceptr)i * CHUNK, CHUNK));
	}
	return (gu_now() - t0) * 1e3;
}

static double median(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return v[n / 2];
}

static void probe(int n)
{
	CUmemAllocationProp prop = {};
	CUdeviceptr va;
	double split[ROUNDS], whole[ROUNDS], acc_split[ROUNDS], acc_whole[ROUNDS];

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	for (int i = 0; i < n; i++)
		CU_CK(cuMemCreate(&handles[i], CHUNK, &prop, 0));
	CU_CK(cuMemAddressReserve(&va, (size_t)n * CHUNK, 0, 0, 0));
	map_all(va, n, 0); /* warm: the first map of a chunk costs more */
	unmap_all(va, n, 0);
	for (int r = 0; r < ROUNDS; r++) {
		double t0 = gu_now();

		map_all(va, n, 0);
		acc_split[r] = (gu_now() - t0) * 1e3;
		split[r] = unmap_all(va, n, 0);
		t0 = gu_now();
		map_all(va, n, 1);
		acc_whole[r] = (gu_now() - t0) * 1e3;
		whole[r] = unmap_all(va, n, 1);
	}
	printf("| %d x 20 MiB | %.3f | %.3f | %.2fx | %.3f | %.3f | %.2fx |\n", n,
	       median(split, ROUNDS), median(whole, ROUNDS),
	       median(split, ROUNDS) / median(whole, ROUNDS), median(acc_split, ROUNDS),
	       median(acc_whole, ROUNDS), median(acc_split, ROUNDS) / median(acc_whole, ROUNDS));
	CU_CK(cuMemAddressFree(va, (size_t)n * CHUNK));
	for (int i = 0; i < n; i++)
		CU_CK(cuMemRelease(handles[i]));
}

int main(int argc, char **argv)
{
	int sizes[16] = { 1, 16, 205 }, nsizes = 3;
	CUcontext ctx;
	CUdevice dev;

	gu_set_name("unmap_probe");
	if (argc > 1) {
		nsizes = 0;
		for (int i = 1; i < argc && nsizes < 16; i++)
			sizes[nsizes++] = atoi(argv[i]);
	}
	CU_CK(cuInit(0));
	CU_CK(cuDeviceGet(&dev, 0));
	CU_CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU_CK(cuCtxSetCurrent(ctx));
	printf("median of %d, ms: unmap per mapping vs one call over the range; map + access "
	       "per mapping vs map + one access call\n", ROUNDS);
	printf("| mappings | unmap each | unmap once | ratio | map+access each | map+access once | "
	       "ratio |\n|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < nsizes; i++) {
		CHECK(sizes[i] > 0 && sizes[i] <= 1024, "bad count %d", sizes[i]);
		probe(sizes[i]);
	}
	gu_result("PASS", "measured %d shapes", nsizes);
	return 0;
}
