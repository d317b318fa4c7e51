/*
 * export_probe.cu - what one lend costs the driver, with and without another
 * exported fd open in the exporting process.
 *
 * A lend is what gmbd does for every chunk it hands out: export the chunk as
 * a POSIX fd, send it over a Unix socket, close its copy; the client imports
 * it and closes its own. Driver 580 charges about a millisecond for an
 * export when the process has no other exported fd open, and as much for
 * the close that drops the last one, wherever it happens; the cuda backend
 * keeps one exported fd open per device for that reason (common/backend/
 * cuda.c). This probe measures both ways in one run, the plain way first
 * (the kept fd would hide it): a child process imports and closes, the
 * parent times export, close and the whole round trip. Driver API only.
 *
 *   export_probe [ROUNDS]   (default 128 lends of a 2 MiB chunk each way)
 */
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"

#define MAX_ROUNDS 256

/* The client's side: import, close, tell; prints its medians at the end. */
static __attribute__((noreturn)) void probe_child(int sock, const char *how)
{
	double ti[MAX_ROUNDS], tc[MAX_ROUNDS];
	int n = 0, fd;

	CU_CK(cuInit(0));
	while (gu_recv_fds(sock, &fd, 1) == 1 && n < MAX_ROUNDS) {
		CUmemGenericAllocationHandle h;
		char ack = 1;
		double t = gu_now();

		CU_CK(cuMemImportFromShareableHandle(&h, (void *)(long)fd,
						     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		ti[n] = gu_now() - t;
		t = gu_now();
		close(fd);
		tc[n++] = gu_now() - t;
		CU_CK(cuMemRelease(h));
		CHECK(write(sock, &ack, 1) == 1, "write: %s", strerror(errno));
	}
	printf("| %-34s | client import | %9.1f | client close | %9.1f |\n", how,
	       gu_median(ti, n) * 1e6, gu_median(tc, n) * 1e6);
	exit(0);
}

/* gu_fork_peer()'s child: @arg is how the parent exports (its label). */
static void probe_child_run(int sock, void *arg)
{
	probe_child(sock, (const char *)arg);
}

static const char *probe_how(bool keep)
{
	return keep ? "another exported fd kept open" : "no other exported fd";
}

/* @rounds lends to the child on @sock; medians in µs into @out[3]. */
static void probe_lends(int sock, pid_t pid, int rounds, bool keep, double out[3])
{
	double te[MAX_ROUNDS], tc[MAX_ROUNDS], tr[MAX_ROUNDS];
	CUmemAllocationProp prop = gu_fd_prop();
	int kept = -1;

	if (keep) {
		CUmemGenericAllocationHandle k;

		CU_CK(cuMemCreate(&k, 2 * MiB, &prop, 0));
		CU_CK(cuMemExportToShareableHandle(&kept, k, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						   0));
		CU_CK(cuMemRelease(k));
	}
	for (int i = 0; i < rounds; i++) {
		CUmemGenericAllocationHandle h;
		double t0, t1;
		char ack;
		int fd;

		CU_CK(cuMemCreate(&h, 2 * MiB, &prop, 0));
		t0 = gu_now();
		CU_CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						   0));
		te[i] = gu_now() - t0;
		gu_send_fds(sock, &fd, 1);
		t1 = gu_now();
		close(fd);
		tc[i] = gu_now() - t1;
		CHECK(read(sock, &ack, 1) == 1, "the child did not answer");
		tr[i] = gu_now() - t0;
		CU_CK(cuMemRelease(h));
	}
	close(sock); /* the child prints its line and leaves */
	CHECK(waitpid(pid, NULL, 0) == pid, "waitpid");
	if (kept >= 0)
		close(kept);
	out[0] = gu_median(te, rounds) * 1e6;
	out[1] = gu_median(tc, rounds) * 1e6;
	out[2] = gu_median(tr, rounds) * 1e6;
	printf("| %-34s | gmbd export   | %9.1f | gmbd close   | %9.1f | round trip %9.1f |\n",
	       probe_how(keep), out[0], out[1], out[2]);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 128;
	double plain[3], kept[3];
	int sock[2];
	pid_t pid[2];

	gu_set_name("export_probe");
	CHECK(rounds > 0 && rounds <= MAX_ROUNDS, "rounds: 1..%d", MAX_ROUNDS);
	printf("lend of a 2 MiB chunk across processes, µs, median of %d (each child line, then its parent's "
	       "line)\n",
	       rounds);
	/* Children first: a process forked after cuInit cannot use CUDA. */
	for (int k = 0; k < 2; k++)
		pid[k] = gu_fork_peer(probe_child_run, (void *)probe_how(k), k ? sock[0] : -1,
				      &sock[k]);
	CU_CK(cuInit(0));
	/* The plain way first: the kept fd of the second could hide it. */
	probe_lends(sock[0], pid[0], rounds, false, plain);
	probe_lends(sock[1], pid[1], rounds, true, kept);
	gu_result("PASS",
		  "a lend's round trip %.1f us with another exported fd kept open, %.1f us"
		  " without (%.1fx); export %.1f vs %.1f us",
		  kept[2], plain[2], kept[2] > 0 ? plain[2] / kept[2] : 0.0, kept[0], plain[0]);
	return 0;
}
