/*
 * lend_probe.cu - does a lend of fresh chunks gain from streaming, that is,
 * from the importer importing and mapping chunk i while the process that
 * makes them creates chunk i + 1?
 *
 * The driver serializes the VMM calls of one process; whether it also
 * serializes two processes' calls decides whether gmbd should send each
 * fresh chunk's fd as soon as it is made. Per shape (count x size), the
 * whole resume is timed in the importer, from its request to the last
 * cuMemSetAccess, medians over rounds (ms):
 *
 *   local:  create + map + access of every chunk in the importer itself
 *           (torch_memory_saver's resume);
 *   serial: the maker (a second process with no context, as gmbd) creates
 *           and exports every chunk, then sends all fds in one message; the
 *           importer imports, closes, maps and sets access of each;
 *   stream: the maker sends each chunk's fd as soon as it is exported;
 *   batch4: the same four chunks a message.
 *
 * Also the maker's own create + export time of the serial variant (what a
 * stream would hide) and the importer's time from the first fd to the end.
 * The variants take turns within a round. After each, both processes
 * release their handles and the importer waits SETTLE_MS before the next:
 * the driver zeroes released memory, and what is made and mapped meanwhile
 * can wait for it (without the wait, a variant timed the previous one's
 * release).
 * Driver API only; one device.
 *
 *   lend_probe [ROUNDS [SETTLE_MS]]    (default 7, 300)
 */
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"

#define MAX_N	 64
#define NVARIANT 4

static const struct gu_shape probe_shapes[] = {
	{ "16 x 1 GiB", 16, GiB },
	{ "20 x 256 MiB", 20, 256 * MiB },
	{ "64 x 20 MiB", 64, 20 * MiB },
};
#define NSHAPES (int)(sizeof(probe_shapes) / sizeof(probe_shapes[0]))

/* Fds a message: the whole lend, one, four. */
static const char *const variant_names[NVARIANT] = { "local", "serial", "stream", "batch4" };
static const int variant_batch[NVARIANT] = { 0, MAX_N, 1, 4 };

/* What the importer asks: shape k, fds per message. */
struct probe_req {
	int shape, batch;
};

/* The maker: creates, exports and sends as asked; its create + export time goes back. */
static __attribute__((noreturn)) void probe_maker(int sock, void *unused)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemGenericAllocationHandle keep;
	int kept;
	struct probe_req rq;

	CU_CK(cuInit(0));
	/* One exported fd kept open all along, as gmbd's kept exports are. */
	CU_CK(cuMemCreate(&keep, 2 * MiB, &prop, 0));
	CU_CK(cuMemExportToShareableHandle(&kept, keep, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	while (read(sock, &rq, sizeof(rq)) == (ssize_t)sizeof(rq)) {
		const struct gu_shape *s = &probe_shapes[rq.shape];
		CUmemGenericAllocationHandle h[MAX_N];
		int fds[MAX_N], sent = 0;
		double t = gu_now(), made;
		char ack;

		for (int i = 0; i < s->n; i++) {
			CU_CK(cuMemCreate(&h[i], s->size, &prop, 0));
			CU_CK(cuMemExportToShareableHandle(&fds[i], h[i],
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			if (i + 1 - sent == rq.batch || i + 1 == s->n) {
				gu_send_fds(sock, fds + sent, i + 1 - sent);
				sent = i + 1;
			}
		}
		made = gu_now() - t;
		CHECK(write(sock, &made, sizeof(made)) == (ssize_t)sizeof(made), "made");
		CHECK(read(sock, &ack, 1) == 1, "the importer did not answer");
		for (int i = 0; i < s->n; i++) {
			close(fds[i]);
			CU_CK(cuMemRelease(h[i]));
		}
		CHECK(write(sock, &ack, 1) == 1, "released");
	}
	close(kept);
	CU_CK(cuMemRelease(keep));
	exit(0);
}

/* One resume of @s in the importer by @variant; *@first: ms from the first fd on. */
static double probe_resume(int sock, int k, int variant, CUdeviceptr va, int settle_ms,
			   double *first, double *made)
{
	const struct gu_shape *s = &probe_shapes[k];
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemAccessDesc acc = gu_rw_access();
	CUmemGenericAllocationHandle h[MAX_N];
	struct probe_req rq = { k, variant_batch[variant] };
	double t0 = gu_now(), t1 = 0, end;
	int got = 0;
	char ack = 1;

	*first = *made = 0;
	if (variant == 0) {
		for (int i = 0; i < s->n; i++) {
			CU_CK(cuMemCreate(&h[i], s->size, &prop, 0));
			CU_CK(cuMemMap(va + s->size * i, s->size, 0, h[i], 0));
			CU_CK(cuMemSetAccess(va + s->size * i, s->size, &acc, 1));
		}
		end = gu_now();
	} else {
		CHECK(write(sock, &rq, sizeof(rq)) == (ssize_t)sizeof(rq), "request");
		while (got < s->n) {
			int fds[MAX_N], r = gu_recv_fds(sock, fds, MAX_N);

			CHECK(r > 0, "the maker's fds");
			if (got == 0)
				t1 = gu_now();
			for (int j = 0; j < r; j++, got++) {
				CU_CK(cuMemImportFromShareableHandle(
					&h[got], (void *)(long)fds[j],
					CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
				close(fds[j]);
				CU_CK(cuMemMap(va + s->size * got, s->size, 0, h[got], 0));
				CU_CK(cuMemSetAccess(va + s->size * got, s->size, &acc, 1));
			}
		}
		end = gu_now();
		CHECK(read(sock, made, sizeof(*made)) == (ssize_t)sizeof(*made), "maker's time");
		*first = (end - t1) * 1e3;
		*made *= 1e3;
	}
	for (int i = 0; i < s->n; i++) {
		CU_CK(cuMemUnmap(va + s->size * i, s->size));
		CU_CK(cuMemRelease(h[i]));
	}
	if (variant != 0) {
		CHECK(write(sock, &ack, 1) == 1, "ack");
		CHECK(read(sock, &ack, 1) == 1, "the maker did not release");
	}
	usleep((useconds_t)settle_ms * 1000);
	return (end - t0) * 1e3;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 7, settle_ms = argc > 2 ? atoi(argv[2]) : 300, sock;
	CUcontext ctx;
	CUdevice dev;
	pid_t pid;

	gu_set_name("lend_probe");
	CHECK(rounds >= 1 && rounds <= 64, "ROUNDS is 1 to 64");
	CHECK(settle_ms >= 0 && settle_ms <= 10000, "SETTLE_MS is 0 to 10000");
	pid = gu_fork_peer(probe_maker, NULL, -1, &sock);
	gu_primary_ctx(&ctx, &dev);
	printf("settle %d ms between lends, median of %d rounds\n", settle_ms, rounds);
	printf("| shape | variant | resume (ms) | from the first fd (ms) | maker's create + export"
	       " (ms) |\n|---|---|---|---|---|\n");
	for (int k = 0; k < NSHAPES; k++) {
		const struct gu_shape *s = &probe_shapes[k];
		double tot[NVARIANT][64], fst[NVARIANT][64], mk[NVARIANT][64];
		CUdeviceptr va;

		CU_CK(cuMemAddressReserve(&va, s->size * s->n, 2 * MiB, 0, 0));
		/* One warm-up round, not counted. */
		for (int v = 0; v < NVARIANT; v++)
			probe_resume(sock, k, v, va, settle_ms, &fst[v][0], &mk[v][0]);
		for (int r = 0; r < rounds; r++)
			for (int v = 0; v < NVARIANT; v++)
				tot[v][r] = probe_resume(sock, k, v, va, settle_ms, &fst[v][r],
							 &mk[v][r]);
		CU_CK(cuMemAddressFree(va, s->size * s->n));
		for (int v = 0; v < NVARIANT; v++)
			printf("| %s | %s | %.3f | %.3f | %.3f |\n", s->name, variant_names[v],
			       gu_median(tot[v], rounds), gu_median(fst[v], rounds),
			       gu_median(mk[v], rounds));
	}
	close(sock);
	CHECK(waitpid(pid, NULL, 0) == pid, "waitpid");
	gu_result("PASS", "whole-lend times by how the fds are sent (table above)");
	return 0;
}
