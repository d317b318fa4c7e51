/*
 * map_probe.cu - what a chunk costs the process that maps it, by where the
 * chunk was made: in this process (what torch_memory_saver does) or in
 * another one and imported from its fd (what a lend is).
 *
 * For each shape (count x size) it times, per chunk, medians in µs:
 *   local:    cuMemCreate, the first cuMemMap + cuMemSetAccess, the second
 *             (after an unmap), cuMemUnmap, cuMemRelease (the last reference);
 *   imported: a parent process creates and exports (one other exported fd
 *             kept open, as gmbd does); this child imports, closes the fd,
 *             maps and sets access the first time, then again, unmaps and
 *             releases its handle (not the last reference);
 *   imported on 4 threads: the same imports spread over threads (the whole
 *             batch timed, per chunk);
 *   one mapping over several chunks: the first map + access of a range
 *             backed by all the chunks of the shape, per chunk.
 * Driver API only; one device.
 *
 *   map_probe
 */
#include <pthread.h>
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"

#define MAX_N 256

static const struct gu_shape probe_shapes[] = {
	{ "64 x 2 MiB", 64, 2 * MiB },
	{ "64 x 20 MiB", 64, 20 * MiB },
	{ "16 x 1 GiB", 16, GiB },
};
#define NSHAPES (int)(sizeof(probe_shapes) / sizeof(probe_shapes[0]))

/* Reserve one range for @n chunks of @size. */
static CUdeviceptr probe_reserve(uint64_t bytes)
{
	CUdeviceptr va;

	CU_CK(cuMemAddressReserve(&va, bytes, 2 * MiB, 0, 0));
	return va;
}

/* First and second map + access of each handle at its own place; unmap. µs medians. */
static void probe_maps(CUmemGenericAllocationHandle *h, int n, uint64_t size, double *first,
		       double *second, double *unmap)
{
	CUmemAccessDesc acc = gu_rw_access();
	CUdeviceptr va = probe_reserve(size * n);
	double t1[MAX_N], t2[MAX_N], tu[MAX_N];

	for (int i = 0; i < n; i++) {
		double t = gu_now();

		CU_CK(cuMemMap(va + size * i, size, 0, h[i], 0));
		CU_CK(cuMemSetAccess(va + size * i, size, &acc, 1));
		t1[i] = gu_now() - t;
	}
	for (int i = 0; i < n; i++)
		CU_CK(cuMemUnmap(va + size * i, size));
	for (int i = 0; i < n; i++) {
		double t = gu_now();

		CU_CK(cuMemMap(va + size * i, size, 0, h[i], 0));
		CU_CK(cuMemSetAccess(va + size * i, size, &acc, 1));
		t2[i] = gu_now() - t;
	}
	for (int i = 0; i < n; i++) {
		double t = gu_now();

		CU_CK(cuMemUnmap(va + size * i, size));
		tu[i] = gu_now() - t;
	}
	CU_CK(cuMemAddressFree(va, size * n));
	*first = gu_median(t1, n) * 1e6;
	*second = gu_median(t2, n) * 1e6;
	*unmap = gu_median(tu, n) * 1e6;
}

/* All @n handles mapped back to back, one set access: per chunk, µs. */
static double probe_one_range(CUmemGenericAllocationHandle *h, int n, uint64_t size)
{
	CUmemAccessDesc acc = gu_rw_access();
	CUdeviceptr va = probe_reserve(size * n);
	double t = gu_now();

	for (int i = 0; i < n; i++)
		CU_CK(cuMemMap(va + size * i, size, 0, h[i], 0));
	CU_CK(cuMemSetAccess(va, size * n, &acc, 1));
	t = (gu_now() - t) / n * 1e6;
	CU_CK(cuMemUnmap(va, size * n));
	CU_CK(cuMemAddressFree(va, size * n));
	return t;
}

static void probe_local(const struct gu_shape *s)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemGenericAllocationHandle h[MAX_N];
	double tc[MAX_N], tr[MAX_N], first, second, unmap, range;

	for (int i = 0; i < s->n; i++) {
		double t = gu_now();

		CU_CK(cuMemCreate(&h[i], s->size, &prop, 0));
		tc[i] = gu_now() - t;
	}
	probe_maps(h, s->n, s->size, &first, &second, &unmap);
	for (int i = 0; i < s->n; i++) {
		double t = gu_now();

		CU_CK(cuMemRelease(h[i]));
		tr[i] = gu_now() - t;
	}
	/* A new set for the one-range figure (the first map of fresh chunks). */
	for (int i = 0; i < s->n; i++)
		CU_CK(cuMemCreate(&h[i], s->size, &prop, 0));
	range = probe_one_range(h, s->n, s->size);
	for (int i = 0; i < s->n; i++)
		CU_CK(cuMemRelease(h[i]));
	printf("| %-12s | local    | create %7.1f | first map+access %7.1f | again %7.1f | unmap %6.1f"
	       " | release (last) %7.1f | one range %7.1f |\n",
	       s->name, gu_median(tc, s->n) * 1e6, first, second, unmap,
	       gu_median(tr, s->n) * 1e6, range);
}

struct probe_imp {
	int *fds;
	CUmemGenericAllocationHandle *h;
	int from, to;
};

static void *probe_import_run(void *arg)
{
	struct probe_imp *p = (struct probe_imp *)arg;

	for (int i = p->from; i < p->to; i++)
		CU_CK(cuMemImportFromShareableHandle(&p->h[i], (void *)(long)p->fds[i],
						     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	return NULL;
}

/* The child: each shape's fds arrive in one message; it times and prints. */
static __attribute__((noreturn)) void probe_child(int sock, void *unused)
{
	CUcontext ctx;
	CUdevice dev;

	gu_primary_ctx(&ctx, &dev);
	for (int k = 0; k < NSHAPES; k++)
		probe_local(&probe_shapes[k]);
	for (int k = 0; k < NSHAPES; k++) {
		const struct gu_shape *s = &probe_shapes[k];
		CUmemGenericAllocationHandle h[MAX_N];
		int fds[MAX_N], got = 0;
		double ti[MAX_N], tcl[MAX_N], tr[MAX_N], first, second, unmap, range, par;
		struct probe_imp parts[4];
		pthread_t th[4];
		char ack = 1;

		/* Serial imports, then the maps. */
		while (got < s->n) {
			int r = gu_recv_fds(sock, fds + got, MAX_N - got);

			CHECK(r > 0, "the parent's fds");
			got += r;
		}
		for (int i = 0; i < s->n; i++) {
			double t = gu_now();

			CU_CK(cuMemImportFromShareableHandle(&h[i], (void *)(long)fds[i],
							     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
			ti[i] = gu_now() - t;
			t = gu_now();
			close(fds[i]);
			tcl[i] = gu_now() - t;
		}
		probe_maps(h, s->n, s->size, &first, &second, &unmap);
		for (int i = 0; i < s->n; i++) {
			double t = gu_now();

			CU_CK(cuMemRelease(h[i]));
			tr[i] = gu_now() - t;
		}
		CHECK(write(sock, &ack, 1) == 1, "ack");
		/* The same chunks again (the parent sends them twice): threads, one range. */
		got = 0;
		while (got < s->n) {
			int r = gu_recv_fds(sock, fds + got, MAX_N - got);

			CHECK(r > 0, "the parent's fds");
			got += r;
		}
		par = gu_now();
		for (int t = 0; t < 4; t++) {
			parts[t] = (struct probe_imp){ fds, h, s->n * t / 4, s->n * (t + 1) / 4 };
			CHECK(pthread_create(&th[t], NULL, probe_import_run, &parts[t]) == 0,
			      "pthread_create");
		}
		for (int t = 0; t < 4; t++)
			pthread_join(th[t], NULL);
		par = (gu_now() - par) / s->n * 1e6;
		for (int i = 0; i < s->n; i++)
			close(fds[i]);
		range = probe_one_range(h, s->n, s->size);
		for (int i = 0; i < s->n; i++)
			CU_CK(cuMemRelease(h[i]));
		CHECK(write(sock, &ack, 1) == 1, "ack");
		printf("| %-12s | imported | import %7.1f | fd close %7.1f | first map+access %7.1f |"
		       " again %7.1f | unmap %6.1f | release (not last) %6.1f | 4 threads import"
		       " %7.1f | one range %7.1f |\n",
		       s->name, gu_median(ti, s->n) * 1e6, gu_median(tcl, s->n) * 1e6, first,
		       second, unmap, gu_median(tr, s->n) * 1e6, par, range);
	}
	fflush(stdout);
	exit(0);
}

/* The parent: creates and exports each shape twice (one fd kept open). */
static void probe_parent(int sock, pid_t pid)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemGenericAllocationHandle keep;
	int kept;

	CU_CK(cuInit(0));
	CU_CK(cuMemCreate(&keep, 2 * MiB, &prop, 0));
	CU_CK(cuMemExportToShareableHandle(&kept, keep, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CU_CK(cuMemRelease(keep));
	for (int k = 0; k < NSHAPES; k++) {
		const struct gu_shape *s = &probe_shapes[k];
		CUmemGenericAllocationHandle h[MAX_N];
		int fds[MAX_N];
		double te[MAX_N];

		for (int i = 0; i < s->n; i++) {
			double t;

			CU_CK(cuMemCreate(&h[i], s->size, &prop, 0));
			t = gu_now();
			CU_CK(cuMemExportToShareableHandle(&fds[i], h[i],
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			te[i] = gu_now() - t;
		}
		for (int rep = 0; rep < 2; rep++) {
			char ack;

			if (rep)
				for (int i = 0; i < s->n; i++)
					CU_CK(cuMemExportToShareableHandle(
						&fds[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						0));
			for (int i = 0; i < s->n; i += 32)
				gu_send_fds(sock, fds + i, s->n - i < 32 ? s->n - i : 32);
			for (int i = 0; i < s->n; i++)
				close(fds[i]);
			CHECK(read(sock, &ack, 1) == 1, "the child did not answer");
		}
		for (int i = 0; i < s->n; i++)
			CU_CK(cuMemRelease(h[i]));
		printf("| %-12s | parent   | export %7.1f |\n", s->name, gu_median(te, s->n) * 1e6);
		fflush(stdout);
	}
	close(kept);
	CHECK(waitpid(pid, NULL, 0) == pid, "waitpid");
}

int main(void)
{
	int sock;
	pid_t pid;

	gu_set_name("map_probe");
	pid = gu_fork_peer(probe_child, NULL, -1, &sock);
	probe_parent(sock, pid);
	gu_result("PASS", "per-chunk costs of local and imported chunks (table above)");
	return 0;
}
