/*
 * scrub_probe.cu - what a cuMemCreate costs right after memory was given
 * back to the driver, by which process gave it back.
 *
 * The driver zeroes memory when its last reference goes. A pause releases
 * 1 GiB chunks and the resume creates them again, so when (and in which
 * process) that zeroing is paid decides where a pause's cost shows: in the
 * pause, or in the next create. For 16 x 1 GiB, per case:
 *
 *   own:     this process (a primary context) creates, maps, unmaps and
 *            releases the chunks: the last reference is its own;
 *   gmbd:    a second process without a context (as gmbd) creates and
 *            exports them, this one imports, maps, unmaps and releases its
 *            handles first, then the second releases the last reference;
 *   gmbd+ctx: the same with a primary context retained in the second one.
 *
 * Then, after a wait of 0, 50, 200 or 1000 ms, this process creates 16 x
 * 1 GiB again: the table has the release of the last references (ms, all
 * 16) and each create batch (ms). A second table has how fast 16 GiB
 * from pinned host memory is then copied into the new chunks (GB/s), and
 * a second time into the same ones: a resume of a preserved tag copies
 * into memory created right after its pause released it. Between
 * measurements everything is released and left 1.5 s. Driver API only;
 * one device.
 *
 *   scrub_probe
 */
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"

#define N	16
#define NDELAY	4
#define NCASE	3

static const int delays_ms[NDELAY] = { 0, 50, 200, 1000 };
static const char *const case_names[NCASE] = { "own", "gmbd", "gmbd+ctx" };

/* The second process: per request byte (1: no context, 2: with one), make,
 * send, wait, release; the release's time goes back. 0 ends it. */
static __attribute__((noreturn)) void probe_maker(int sock, void *unused)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUcontext ctx = NULL;
	CUdevice dev;
	char rq, ack;

	CU_CK(cuInit(0));
	CU_CK(cuDeviceGet(&dev, 0));
	while (read(sock, &rq, 1) == 1 && rq != 0) {
		CUmemGenericAllocationHandle h[N];
		int fds[N];
		double t;

		if (rq == 2 && !ctx)
			CU_CK(cuDevicePrimaryCtxRetain(&ctx, dev));
		for (int i = 0; i < N; i++) {
			CU_CK(cuMemCreate(&h[i], GiB, &prop, 0));
			CU_CK(cuMemExportToShareableHandle(&fds[i], h[i],
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		}
		gu_send_fds(sock, fds, N);
		for (int i = 0; i < N; i++)
			close(fds[i]);
		CHECK(read(sock, &ack, 1) == 1, "the importer did not answer");
		t = gu_now();
		for (int i = 0; i < N; i++)
			CU_CK(cuMemRelease(h[i]));
		t = gu_now() - t;
		CHECK(write(sock, &t, sizeof(t)) == (ssize_t)sizeof(t), "release time");
	}
	if (ctx)
		CU_CK(cuDevicePrimaryCtxRelease(dev));
	exit(0);
}

static void map_all(CUdeviceptr va, CUmemGenericAllocationHandle *h)
{
	CUmemAccessDesc acc = gu_rw_access();

	for (int i = 0; i < N; i++) {
		CU_CK(cuMemMap(va + GiB * i, GiB, 0, h[i], 0));
		CU_CK(cuMemSetAccess(va + GiB * i, GiB, &acc, 1));
	}
}

static void unmap_all(CUdeviceptr va)
{
	for (int i = 0; i < N; i++)
		CU_CK(cuMemUnmap(va + GiB * i, GiB));
}

/* One case: the chunks used and given back as the case says; the last release's ms. */
static double probe_give_back(int sock, int kase, CUdeviceptr va)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemGenericAllocationHandle h[N];
	double t;

	if (kase == 0) {
		for (int i = 0; i < N; i++)
			CU_CK(cuMemCreate(&h[i], GiB, &prop, 0));
		map_all(va, h);
		unmap_all(va);
		t = gu_now();
		for (int i = 0; i < N; i++)
			CU_CK(cuMemRelease(h[i]));
		return (gu_now() - t) * 1e3;
	}
	char rq = (char)kase, ack = 1;

	CHECK(write(sock, &rq, 1) == 1, "request");
	gu_import_fds(sock, N, h);
	map_all(va, h);
	unmap_all(va);
	for (int i = 0; i < N; i++)
		CU_CK(cuMemRelease(h[i]));
	CHECK(write(sock, &ack, 1) == 1, "ack");
	CHECK(read(sock, &t, sizeof(t)) == (ssize_t)sizeof(t), "the maker's release");
	return t * 1e3;
}

int main(void)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUcontext ctx;
	CUdevice dev;
	CUdeviceptr va;
	int sock;
	pid_t pid;
	char end = 0;
	double gbs[NCASE][NDELAY][2];
	void *host;

	gu_set_name("scrub_probe");
	pid = gu_fork_peer(probe_maker, NULL, -1, &sock);
	gu_primary_ctx(&ctx, &dev);
	CU_CK(cuMemAddressReserve(&va, GiB * N, 2 * MiB, 0, 0));
	CU_CK(cuMemAllocHost(&host, GiB));
	memset(host, 0x5a, GiB);
	printf("| last reference released by | release of 16 x 1 GiB (ms) |");
	for (int d = 0; d < NDELAY; d++)
		printf(" create 16 x 1 GiB %d ms later (ms) |", delays_ms[d]);
	printf("\n|---|---|---|---|---|---|\n");
	for (int k = 0; k < NCASE; k++) {
		double rel[NDELAY], cre[NDELAY];

		for (int d = 0; d < NDELAY; d++) {
			CUmemGenericAllocationHandle h[N];
			double t;

			rel[d] = probe_give_back(sock, k, va);
			usleep((useconds_t)delays_ms[d] * 1000);
			t = gu_now();
			for (int i = 0; i < N; i++)
				CU_CK(cuMemCreate(&h[i], GiB, &prop, 0));
			cre[d] = (gu_now() - t) * 1e3;
			map_all(va, h);
			for (int r = 0; r < 2; r++) {
				t = gu_now();
				for (int i = 0; i < N; i++)
					CU_CK(cuMemcpyHtoD(va + GiB * i, host, GiB));
				gbs[k][d][r] = (double)(GiB * N) / (gu_now() - t) / 1e9;
			}
			unmap_all(va);
			for (int i = 0; i < N; i++)
				CU_CK(cuMemRelease(h[i]));
			usleep(1500 * 1000);
		}
		printf("| %s | %.2f |", case_names[k], gu_median(rel, NDELAY));
		for (int d = 0; d < NDELAY; d++)
			printf(" %.2f |", cre[d]);
		printf("\n");
	}
	printf("\n| last reference released by |");
	for (int d = 0; d < NDELAY; d++)
		printf(" H2D into them, created %d ms later (GB/s): first, again |", delays_ms[d]);
	printf("\n|---|---|---|---|---|\n");
	for (int k = 0; k < NCASE; k++) {
		printf("| %s |", case_names[k]);
		for (int d = 0; d < NDELAY; d++)
			printf(" %.1f, %.1f |", gbs[k][d][0], gbs[k][d][1]);
		printf("\n");
	}
	CU_CK(cuMemFreeHost(host));
	CHECK(write(sock, &end, 1) == 1, "end");
	CHECK(waitpid(pid, NULL, 0) == pid, "waitpid");
	CU_CK(cuMemAddressFree(va, GiB * N));
	gu_result("PASS", "creates after a release, by who released (table above)");
	return 0;
}
