/*
 * peer_access.cu - an allocation on device 0 with access for device 1
 * (gmb_malloc_peers) is read and written by kernels on device 1, before and
 * after a pause/resume (PRESERVE), and the driver's view of the access
 * (cuMemGetAccess) says read-write for both devices on every mapping, while
 * an allocation without peers stays the owner's alone.
 *
 * With one GPU it runs what one device allows (the owner named as its own
 * peer, access and bytes across a pause, a peer that is no device refused)
 * and reports SKIP for the two-device part; also SKIP when devices 0 and 1
 * cannot reach each other's memory (cudaDeviceCanAccessPeer).
 */
#include "tests/gpu/gpu_util.h"

#define SIZE (256 * MiB)

/* The access @dev has to @p, as the driver reports it. */
static unsigned long long access_of(const void *p, int dev)
{
	CUmemLocation loc = { CU_MEM_LOCATION_TYPE_DEVICE, dev };
	unsigned long long flags = 0;

	CU_CK(cuMemGetAccess(&flags, &loc, (CUdeviceptr)p));
	return flags;
}

/* Device @dev writes seed @seed over @p, device @other checks it. */
static void write_on_check_on(void *p, int dev, int other, uint64_t seed)
{
	CUDA_CK(cudaSetDevice(dev));
	gu_fill(p, SIZE, seed, 0);
	CUDA_CK(cudaDeviceSynchronize());
	CUDA_CK(cudaSetDevice(other));
	unsigned long long bad = gu_check(p, SIZE, seed);
	CHECK(bad == 0, "device %d wrote seed 0x%llx, device %d read %llu wrong words", dev,
	      (unsigned long long)seed, other, bad);
}

static int one_device(gmb_client *c)
{
	void *p = NULL, *q = NULL;

	GMB_CK(c, gmb_malloc_peers(c, &p, SIZE, 0, "peer", 1ULL << 0));
	CHECK(access_of(p, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "owner access %llu",
	      access_of(p, 0));
	write_on_check_on(p, 0, 0, 0x9e000001ULL);
	GMB_CK(c, gmb_pause(c, "peer"));
	GMB_CK(c, gmb_resume(c, "peer"));
	CUDA_CK(cudaSetDevice(0));
	CHECK(gu_check(p, SIZE, 0x9e000001ULL) == 0, "bytes lost across pause/resume");
	CHECK(access_of(p, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "owner access after resume");
	int rc = gmb_malloc_peers(c, &q, SIZE, 0, "peer", 1ULL << 1);
	CHECK(rc == -ENODEV, "a peer that is no device: %d (%s)", rc, gmb_last_error(c));
	GMB_CK(c, gmb_free(c, p));
	gmb_close(c);
	gu_result("SKIP", "1 GPU: the one-device path passed (owner as its own peer, access and "
			  "bytes across pause/resume, peer 1 refused -ENODEV); the peer part needs "
			  "two GPUs (kind nvidia-h200-x2)");
	return EXIT_SKIP;
}

int main(void)
{
	int ndev = 0, can = 0;
	void *p = NULL, *own = NULL;

	gu_set_name("peer_access");
	CUDA_CK(cudaGetDeviceCount(&ndev));
	for (int d = 0; d < ndev && d < 2; d++)
		gu_cuda_init(d);
	CU_CK(cuInit(0));
	gmb_client *c = gu_connect("peer-access");
	GMB_CK(c, gmb_tag_set_mode(c, "peer", GMB_MODE_PRESERVE));
	if (ndev < 2)
		return one_device(c);
	CUDA_CK(cudaDeviceCanAccessPeer(&can, 1, 0));
	if (!can) {
		gmb_close(c);
		gu_result("SKIP", "device 1 cannot access device 0's memory (cudaDeviceCanAccessPeer)");
		return EXIT_SKIP;
	}

	CUDA_CK(cudaSetDevice(0));
	GMB_CK(c, gmb_malloc_peers(c, &p, SIZE, 0, "peer", 1ULL << 1));
	GMB_CK(c, gmb_malloc(c, &own, 2 * MiB, 0, "peer"));
	CHECK(gu_ptr_device(p) == 0, "the allocation is on device %d, not 0", gu_ptr_device(p));
	for (int round = 0; round < 3; round++) {
		uint64_t seed = 0x9e100000ULL + (uint64_t)round * 2;

		CHECK(access_of(p, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE &&
			      access_of(p, 1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
		      "round %d: access dev0 %llu dev1 %llu", round, access_of(p, 0), access_of(p, 1));
		CHECK(access_of(own, 1) == CU_MEM_ACCESS_FLAGS_PROT_NONE,
		      "round %d: an allocation without peers is open to device 1 (%llu)", round,
		      access_of(own, 1));
		write_on_check_on(p, 1, 0, seed);     /* the peer writes, the owner reads */
		write_on_check_on(p, 0, 1, seed + 1); /* the owner writes, the peer reads */
		GMB_CK(c, gmb_pause(c, "peer"));
		GMB_CK(c, gmb_resume(c, "peer"));
		CUDA_CK(cudaSetDevice(1));
		unsigned long long bad = gu_check(p, SIZE, seed + 1);
		CHECK(bad == 0, "round %d: device 1 read %llu wrong words after pause/resume", round,
		      bad);
	}
	GMB_CK(c, gmb_free(c, own));
	GMB_CK(c, gmb_free(c, p));
	gu_print_status(c, "peer_access");
	gmb_close(c);
	gu_result("PASS", "%d GPUs: 256 MiB on device 0 with access for device 1, written and read "
			  "by kernels on both, 3 pause/resume rounds (PRESERVE), access read-write "
			  "for both on every mapping and none for device 1 without peers", ndev);
	return 0;
}
