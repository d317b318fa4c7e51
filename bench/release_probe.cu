/*
 * release_probe.cu - whether two processes can give memory back to the
 * driver faster than one.
 *
 * A discard pause ends with the last reference of every chunk released, and
 * the driver zeroes a chunk as its last reference goes (0.3-0.5 ms a GiB):
 * that zeroing is most of a pause, in torch_memory_saver's process and in
 * gmbd's. gmbd's chunks have two references, the client's and gmbd's, so
 * the zeroing can be paid in either process. The driver serializes the VMM
 * calls of one process; whether it serializes those of two decides whether
 * a pause can split its last releases between the client and gmbd. Per
 * shape, the chunks touched by a memset and unmapped, then released (ms
 * until every reference is gone, median of 7 rounds, the cases
 * interleaved, the GPU left 0.5 s between rounds):
 *
 *   own:       this process made them and releases every one (the peer);
 *   serial:    a second process without a context made and exported them,
 *              releases its handles first, then this one releases the
 *              last references (gmbd's pause today);
 *   maker last: the same two, this one first, so that the last references
 *              (and the zeroing) are the second process's;
 *   opposite:  both release at once, this one from the first chunk, the
 *              other from the last: each chunk's zeroing is paid by the
 *              second to release it, so the two meet near the middle;
 *   halves:    each side first drops the other's half (not timed), then
 *              both release their own half, every release a last one, at
 *              once.
 *
 *   release_probe
 */
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"

#define NMAX   256
#define ROUNDS 7
#define NCASE  5

enum { OP_END, OP_MAKE, OP_RELEASE };

/* What this process asks of the maker. */
struct probe_msg {
	int op;
	int n;		/* OP_MAKE: chunks */
	uint64_t size;	/* OP_MAKE: bytes each */
	int lo, hi;	/* OP_RELEASE: handles [lo, hi) */
	int reverse;	/* OP_RELEASE: from hi - 1 down */
};

static const char *const case_names[NCASE] = { "own", "serial", "maker last", "opposite",
					       "halves" };

static const struct gu_shape shapes[] = {
	{ "16 x 1 GiB", 16, GiB },
	{ "64 x 1 GiB", 64, GiB },
	{ "205 x 20 MiB", 205, 20 * MiB },
};

/*
 * The second process (no context, as gmbd): makes and exports, keeps each
 * export's fd until the chunk's release and releases when told.
 */
static __attribute__((noreturn)) void probe_maker(int sock, void *unused)
{
	CUmemGenericAllocationHandle h[NMAX], kh;
	CUmemAllocationProp prop = gu_fd_prop();
	int fds[NMAX], keep_fd;
	struct probe_msg q;
	CUdevice dev;

	CU_CK(cuInit(0));
	CU_CK(cuDeviceGet(&dev, 0));
	/* As gmbd's cuda backend: one exported fd of a small chunk stays open. */
	CU_CK(cuMemCreate(&kh, 2 * MiB, &prop, 0));
	CU_CK(cuMemExportToShareableHandle(&keep_fd, kh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
					   0));
	CU_CK(cuMemRelease(kh));
	while (read(sock, &q, sizeof(q)) == (ssize_t)sizeof(q) && q.op != OP_END) {
		if (q.op == OP_MAKE) {
			CHECK(q.n <= NMAX, "too many chunks");
			for (int i = 0; i < q.n; i++) {
				CU_CK(cuMemCreate(&h[i], q.size, &prop, 0));
				CU_CK(cuMemExportToShareableHandle(
					&fds[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			}
			for (int i = 0; i < q.n; i += 64)
				gu_send_fds(sock, fds + i, q.n - i < 64 ? q.n - i : 64);
			continue; /* each fd kept until its chunk's release, as gmbd keeps it */
		}
		double t = gu_now();

		for (int k = 0; k < q.hi - q.lo; k++) {
			int i = q.reverse ? q.hi - 1 - k : q.lo + k;

			close(fds[i]);
			CU_CK(cuMemRelease(h[i]));
		}
		t = gu_now() - t;
		CHECK(write(sock, &t, sizeof(t)) == (ssize_t)sizeof(t), "release time");
	}
	close(keep_fd);
	exit(0);
}

static void probe_ask(int sock, struct probe_msg q)
{
	CHECK(write(sock, &q, sizeof(q)) == (ssize_t)sizeof(q), "request");
}

static void probe_wait(int sock)
{
	double t;

	CHECK(read(sock, &t, sizeof(t)) == (ssize_t)sizeof(t), "the maker's release");
}

static void probe_release(CUmemGenericAllocationHandle *h, int lo, int hi)
{
	for (int i = lo; i < hi; i++)
		CU_CK(cuMemRelease(h[i]));
}

/* The shape's chunks, made as case @k makes them, mapped, touched and unmapped. */
static void probe_setup(int sock, int k, const struct gu_shape *s, CUdeviceptr va,
			CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemAccessDesc acc = gu_rw_access();

	if (k == 0) {
		for (int i = 0; i < s->n; i++)
			CU_CK(cuMemCreate(&h[i], s->size, &prop, 0));
	} else {
		probe_ask(sock, (struct probe_msg){ .op = OP_MAKE, .n = s->n, .size = s->size });
		gu_import_fds(sock, s->n, h);
	}
	for (int i = 0; i < s->n; i++)
		CU_CK(cuMemMap(va + s->size * i, s->size, 0, h[i], 0));
	CU_CK(cuMemSetAccess(va, s->size * s->n, &acc, 1));
	CU_CK(cuMemsetD8(va, 0x5a, s->size * s->n));
	CU_CK(cuCtxSynchronize());
	for (int i = 0; i < s->n; i++)
		CU_CK(cuMemUnmap(va + s->size * i, s->size));
}

/* One round of case @k: ms until every reference is gone. */
static double probe_round(int sock, int k, const struct gu_shape *s, CUdeviceptr va)
{
	CUmemGenericAllocationHandle h[NMAX];
	int n = s->n, mid = n / 2;
	double t;

	probe_setup(sock, k, s, va, h);
	if (k == 4) { /* the other's half goes first, untimed: then every release is a last one */
		probe_release(h, mid, n);
		probe_ask(sock, (struct probe_msg){ .op = OP_RELEASE, .lo = 0, .hi = mid });
		probe_wait(sock);
	}
	t = gu_now();
	switch (k) {
	case 0:
		probe_release(h, 0, n);
		break;
	case 1:
		probe_ask(sock, (struct probe_msg){ .op = OP_RELEASE, .lo = 0, .hi = n });
		probe_wait(sock);
		probe_release(h, 0, n);
		break;
	case 2:
		probe_release(h, 0, n);
		probe_ask(sock, (struct probe_msg){ .op = OP_RELEASE, .lo = 0, .hi = n });
		probe_wait(sock);
		break;
	case 3:
		probe_ask(sock, (struct probe_msg){ .op = OP_RELEASE, .lo = 0, .hi = n, .reverse = 1 });
		probe_release(h, 0, n);
		probe_wait(sock);
		break;
	default:
		probe_ask(sock, (struct probe_msg){ .op = OP_RELEASE, .lo = mid, .hi = n });
		probe_release(h, 0, mid);
		probe_wait(sock);
		break;
	}
	return (gu_now() - t) * 1e3;
}

int main(void)
{
	int nshapes = (int)(sizeof(shapes) / sizeof(shapes[0]));
	CUcontext ctx;
	CUdevice dev;
	CUdeviceptr va;
	int sock;
	pid_t pid;

	gu_set_name("release_probe");
	pid = gu_fork_peer(probe_maker, NULL, -1, &sock);
	gu_primary_ctx(&ctx, &dev);
	CU_CK(cuMemAddressReserve(&va, 64 * GiB, GiB, 0, 0));
	printf("| shape |");
	for (int k = 0; k < NCASE; k++)
		printf(" %s (ms) |", case_names[k]);
	printf(" maker last / serial |\n|---|---|---|---|---|---|---|\n");
	for (int si = 0; si < nshapes; si++) {
		double v[NCASE][ROUNDS], med[NCASE];

		/* Cases interleaved round by round, so that a drift of the driver hits all. */
		for (int r = 0; r < ROUNDS; r++)
			for (int k = 0; k < NCASE; k++) {
				v[k][r] = probe_round(sock, k, &shapes[si], va);
				usleep(500 * 1000);
			}
		for (int k = 0; k < NCASE; k++)
			med[k] = gu_median(v[k], ROUNDS);
		printf("| %s |", shapes[si].name);
		for (int k = 0; k < NCASE; k++)
			printf(" %.2f |", med[k]);
		printf(" %.2f |\n", med[2] / med[1]);
		fflush(stdout);
	}
	probe_ask(sock, (struct probe_msg){ .op = OP_END });
	CHECK(waitpid(pid, NULL, 0) == pid, "waitpid");
	CU_CK(cuMemAddressFree(va, 64 * GiB));
	gu_result("PASS", "last releases in one process or split between two (table above)");
	return 0;
}
