/*
 * ipc_probe.cu - where the time of an IPC open and close of gmbd memory
 * goes: libgmb's gmb_ipc_open / gmb_ipc_close of a 1 GiB allocation of
 * another process, next to the driver calls such an open is made of, each
 * timed alone in the importing process, and one bare round trip to gmbd.
 *
 *   ipc_probe [ROUNDS]   (default 20; medians; gmbd on $GMB_SOCKET)
 *
 * The parent allocates 1 GiB through gmbd and exports it; a child (this
 * program again, --child) connects, then per round: gmb_ipc_open and
 * gmb_ipc_close of the handle; one round trip that does next to nothing
 * (the mode of a tag set to what it is); and, on a chunk of
 * its own made with cuMemCreate, the driver's export to an fd, import from
 * it, close of the fd, address reserve, map, set access, device sync,
 * unmap, release and address free. Prints one table; measures, asserts
 * nothing about speed.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "tests/gpu/gpu_util.h"

#define MAX_ROUNDS 200
#define SIZE	   GiB

enum probe_step {
	P_OPEN,
	P_CLOSE,
	P_RTT,
	P_EXPORT,
	P_IMPORT,
	P_FDCLOSE,
	P_RESERVE,
	P_MAP,
	P_ACCESS,
	P_SYNC,
	P_UNMAP,
	P_RELEASE,
	P_FREE,
	P_N
};

/* In enum probe_step's order. */
static const char *const probe_names[P_N] = {
	"gmb_ipc_open (1 GiB, 1 chunk)",
	"gmb_ipc_close",
	"a round trip to gmbd (a tag's mode set again)",
	"cuMemExportToShareableHandle",
	"cuMemImportFromShareableHandle",
	"close() of the imported fd",
	"cuMemAddressReserve 1 GiB",
	"cuMemMap",
	"cuMemSetAccess 1 GiB",
	"cuCtxSynchronize (idle)",
	"cuMemUnmap",
	"cuMemRelease (an imported handle)",
	"cuMemAddressFree",
};

static double t_us(double t0)
{
	return (gu_now() - t0) * 1e6;
}

/* The driver's share of an open and a close, on a chunk of this process's own. */
static void probe_driver(double v[P_N][MAX_ROUNDS], int i, CUmemGenericAllocationHandle own,
			 size_t gran)
{
	CUmemGenericAllocationHandle imp;
	CUmemAccessDesc acc = {};
	CUdeviceptr va;
	double t0;
	int fd = -1;

	t0 = gu_now();
	CU_CK(cuMemExportToShareableHandle(&fd, own, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	v[P_EXPORT][i] = t_us(t0);
	t0 = gu_now();
	CU_CK(cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd,
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	v[P_IMPORT][i] = t_us(t0);
	t0 = gu_now();
	close(fd);
	v[P_FDCLOSE][i] = t_us(t0);
	t0 = gu_now();
	CU_CK(cuMemAddressReserve(&va, SIZE, gran, 0, 0));
	v[P_RESERVE][i] = t_us(t0);
	t0 = gu_now();
	CU_CK(cuMemMap(va, SIZE, 0, imp, 0));
	v[P_MAP][i] = t_us(t0);
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = 0;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	t0 = gu_now();
	CU_CK(cuMemSetAccess(va, SIZE, &acc, 1));
	v[P_ACCESS][i] = t_us(t0);
	t0 = gu_now();
	CU_CK(cuCtxSynchronize());
	v[P_SYNC][i] = t_us(t0);
	t0 = gu_now();
	CU_CK(cuMemUnmap(va, SIZE));
	v[P_UNMAP][i] = t_us(t0);
	t0 = gu_now();
	CU_CK(cuMemRelease(imp));
	v[P_RELEASE][i] = t_us(t0);
	t0 = gu_now();
	CU_CK(cuMemAddressFree(va, SIZE));
	v[P_FREE][i] = t_us(t0);
}

static int probe_child(const char *hex, int rounds)
{
	static double v[P_N][MAX_ROUNDS];
	unsigned char h[GMB_IPC_HANDLE_SIZE];
	CUmemAllocationProp prop = {};
	CUmemGenericAllocationHandle own;
	gmb_client *c;
	size_t gran = 0;
	void *p;

	for (int i = 0; i < GMB_IPC_HANDLE_SIZE; i++)
		CHECK(sscanf(hex + 2 * i, "%2hhx", &h[i]) == 1, "bad handle text");
	gu_cuda_init(0);
	c = gu_connect("ipc-probe-child");
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CU_CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CU_CK(cuMemCreate(&own, SIZE, &prop, 0));
	for (int i = 0; i < rounds; i++) {
		double t0 = gu_now();

		GMB_CK(c, gmb_ipc_open(c, h, 0, &p));
		v[P_OPEN][i] = t_us(t0);
		t0 = gu_now();
		GMB_CK(c, gmb_ipc_close(c, p));
		v[P_CLOSE][i] = t_us(t0);
		t0 = gu_now();
		GMB_CK(c, gmb_tag_set_mode(c, "rtt", GMB_MODE_DISCARD));
		v[P_RTT][i] = t_us(t0);
		probe_driver(v, i, own, gran);
	}
	CU_CK(cuMemRelease(own));
	printf("| step | median us |\n|---|---|\n");
	for (int s = 0; s < P_N; s++)
		printf("| %s | %.1f |\n", probe_names[s], gu_median(v[s], rounds));
	gmb_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	char hex[2 * GMB_IPC_HANDLE_SIZE + 1], rounds_s[16];
	unsigned char h[GMB_IPC_HANDLE_SIZE];
	int rounds = 20, st = 0;
	gmb_client *c;
	pid_t pid;
	void *p;

	gu_set_name("ipc_probe");
	if (argc == 4 && !strcmp(argv[1], "--child"))
		return probe_child(argv[2], atoi(argv[3]));
	if (argc > 1)
		rounds = atoi(argv[1]);
	CHECK(rounds > 0 && rounds <= MAX_ROUNDS, "rounds: 1 to %d", MAX_ROUNDS);
	gu_cuda_init(0);
	c = gu_connect("ipc-probe");
	GMB_CK(c, gmb_malloc(c, &p, SIZE, 0, "probe"));
	GMB_CK(c, gmb_ipc_get_handle(c, p, h));
	for (int i = 0; i < GMB_IPC_HANDLE_SIZE; i++)
		snprintf(hex + 2 * i, 3, "%02x", h[i]);
	snprintf(rounds_s, sizeof(rounds_s), "%d", rounds);
	{
		char *const args[] = { argv[0], (char *)"--child", hex, rounds_s, NULL };

		pid = gu_spawn_self(args, -1);
	}
	st = gu_wait_child(pid, 120);
	GMB_CK(c, gmb_free(c, p));
	gmb_close(c);
	if (st != 0)
		gu_result("FAIL", "the importing child exited %d", st);
	else
		gu_result("PASS", "%d rounds of a 1 GiB open and close, and their parts (table above)",
			  rounds);
	return st ? 1 : 0;
}
