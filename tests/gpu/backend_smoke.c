/*
 * backend_smoke.c - proves the cuda backend on a real GPU, through the
 * backend interface only (plus backend_cuda_mem_info): chunks made in this
 * process and exported as fds are imported, mapped, written and read back in
 * a child; this process then sees the same bytes through its own mappings;
 * unmap keeps the VA, and a fresh chunk mapped there reads zero; everything
 * released goes back to the driver.
 *
 * Build (on the GPU machine; no Criterion, no libcuda at link time):
 *   gcc -std=gnu11 -O2 -D_GNU_SOURCE -I. -I/usr/local/cuda/include \
 *       tests/gpu/backend_smoke.c common/backend/*.c common/err.c \
 *       common/idmap.c common/log.c \
 *       -o build/backend_smoke -ldl -lpthread
 * Run: build/backend_smoke. One PASS/FAIL/INFO line per check; exit status
 * 0 when every check passed, 1 otherwise.
 *
 * The child is forked before this process touches CUDA (a child forked
 * after cuInit cannot use CUDA) and gets the fds over a socketpair with
 * SCM_RIGHTS, as a client gets them from gmbd.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/backend/cuda.h"

#define SMOKE_DEV	0
#define SMOKE_TIMEOUT_S 300
#define SMOKE_MIB	((uint64_t)1 << 20)
/* Memory still in use after every release: page tables, the stream. */
#define SMOKE_SLACK	(128 * SMOKE_MIB)

enum {
	SMOKE_A,
	SMOKE_B,
	SMOKE_N
};

/* What the parent sends with the two fds. */
struct smoke_msg {
	uint64_t size[SMOKE_N];
};

static int smoke_failures;
static const char *smoke_who = "parent";

/* Reporting. */

static void smoke_vreport(bool ok, int rc, const char *fmt, va_list ap)
{
	char what[256];

	vsnprintf(what, sizeof(what), fmt, ap);
	if (ok) {
		printf("PASS %s: %s\n", smoke_who, what);
		return;
	}
	smoke_failures++;
	if (rc)
		printf("FAIL %s: %s: rc=%d (%s): %s\n", smoke_who, what, rc, strerror(-rc),
		       backend_last_error());
	else
		printf("FAIL %s: %s\n", smoke_who, what);
}

static bool __attribute__((format(printf, 2, 3))) smoke_ok(int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	smoke_vreport(rc == 0, rc, fmt, ap);
	va_end(ap);
	return rc == 0;
}

static bool __attribute__((format(printf, 2, 3))) smoke_true(bool ok, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	smoke_vreport(ok, 0, fmt, ap);
	va_end(ap);
	return ok;
}

static void __attribute__((format(printf, 1, 2))) smoke_info(const char *fmt, ...)
{
	va_list ap;

	printf("INFO %s: ", smoke_who);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

static double smoke_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Patterns: word i of a chunk written with @seed; seed 0 is all zeros. */

static uint64_t smoke_word(uint64_t seed, uint64_t i)
{
	uint64_t x = (seed << 48) ^ (i * 0x9e3779b97f4a7c15ULL);

	return seed ? x ^ (x >> 29) : 0;
}

static void smoke_fill(void *buf, uint64_t size, uint64_t seed)
{
	uint64_t *w = buf;

	for (uint64_t i = 0; i < size / 8; i++)
		w[i] = smoke_word(seed, i);
}

static bool smoke_verify(const void *buf, uint64_t size, uint64_t seed, const char *what)
{
	const uint64_t *w = buf;

	for (uint64_t i = 0; i < size / 8; i++)
		if (w[i] != smoke_word(seed, i))
			return smoke_true(false,
					  "%s: word %" PRIu64 " is 0x%016" PRIx64
					  ", want 0x%016" PRIx64,
					  what, i, w[i], smoke_word(seed, i));
	return smoke_true(true, "%s: %" PRIu64 " MiB as expected", what, size / SMOKE_MIB);
}

/* fds over the socketpair. */

union smoke_ctl {
	struct cmsghdr h;
	char buf[CMSG_SPACE(SMOKE_N * sizeof(int))];
};

static int smoke_send_fds(int sock, const int *fds, const struct smoke_msg *m)
{
	struct iovec iov = { .iov_base = (void *)m, .iov_len = sizeof(*m) };
	union smoke_ctl ctl;
	struct msghdr msg = { .msg_iov = &iov,
			      .msg_iovlen = 1,
			      .msg_control = ctl.buf,
			      .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *c;

	memset(&ctl, 0, sizeof(ctl));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(SMOKE_N * sizeof(int));
	memcpy(CMSG_DATA(c), fds, SMOKE_N * sizeof(int));
	return sendmsg(sock, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -errno;
}

static int smoke_recv_fds(int sock, int *fds, struct smoke_msg *m)
{
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	union smoke_ctl ctl;
	struct msghdr msg = { .msg_iov = &iov,
			      .msg_iovlen = 1,
			      .msg_control = ctl.buf,
			      .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *c;
	ssize_t n;

	n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	if (n == 0)
		return -ENOENT; /* the parent gave up before sharing */
	c = CMSG_FIRSTHDR(&msg);
	if (n != (ssize_t)sizeof(*m) || (msg.msg_flags & MSG_CTRUNC) || !c ||
	    c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(SMOKE_N * sizeof(int)))
		return -EPROTO;
	memcpy(fds, CMSG_DATA(c), SMOKE_N * sizeof(int));
	return 0;
}

/* Shared steps. */

/* Reserves one VA range for the chunks and maps them back to back, one set_access. */
static int smoke_map_all(struct backend *b, const uint64_t *h, const uint64_t *size, uintptr_t *va)
{
	uint64_t total = size[SMOKE_A] + size[SMOKE_B];

	if (!smoke_ok(b->ops->va_reserve(b, total, 0, va), "va_reserve %" PRIu64 " MiB",
		      total / SMOKE_MIB))
		return -1;
	if (!smoke_ok(b->ops->map(b, *va, size[SMOKE_A], h[SMOKE_A]), "map chunk A") ||
	    !smoke_ok(b->ops->map(b, *va + size[SMOKE_A], size[SMOKE_B], h[SMOKE_B]),
		      "map chunk B right after A") ||
	    !smoke_ok(b->ops->set_access(b, SMOKE_DEV, *va, total),
		      "set_access over both mappings in one call"))
		return -1;
	return 0;
}

/* Unmaps [va, va+total) in one call, or mapping by mapping if the driver refuses. */
static void smoke_unmap_all(struct backend *b, uintptr_t va, const uint64_t *size)
{
	uint64_t total = size[SMOKE_A] + size[SMOKE_B];
	int rc = b->ops->unmap(b, va, total);

	/* The host backend allows this; the driver must too, or the host is too lenient. */
	if (smoke_ok(rc, "unmap of two back-to-back mappings in one call"))
		return;
	smoke_ok(b->ops->unmap(b, va, size[SMOKE_A]), "unmap chunk A alone");
	smoke_ok(b->ops->unmap(b, va + size[SMOKE_A], size[SMOKE_B]), "unmap chunk B alone");
}

static double smoke_copy(struct backend *b, bool to_host, void *buf, uintptr_t va, uint64_t size)
{
	double t = smoke_now();
	int rc = to_host ? b->ops->copy_to_host(b, SMOKE_DEV, buf, va, size) :
			   b->ops->copy_from_host(b, SMOKE_DEV, va, buf, size);

	if (!smoke_ok(rc, "%s %" PRIu64 " MiB", to_host ? "copy_to_host" : "copy_from_host",
		      size / SMOKE_MIB))
		return -1;
	return (double)size / (smoke_now() - t) / 1e9;
}

/* The child: a client. */

static void smoke_child_probe_reimport(struct backend *b, int fd, uint64_t size, uint64_t h)
{
	uint64_t again;

	if (!smoke_ok(b->ops->chunk_import(b, fd, size, &again), "second import of one fd"))
		return;
	smoke_info("a second import of one fd gives %s handle (0x%" PRIx64 " then 0x%" PRIx64 ")",
		   again == h ? "the same" : "another", h, again);
	smoke_ok(b->ops->chunk_release(b, again), "release the second import");
}

static void smoke_child_rw(struct backend *b, uintptr_t va, const uint64_t *size)
{
	uint64_t total = size[SMOKE_A] + size[SMOKE_B];
	char *buf = NULL;

	if (!smoke_ok(b->ops->host_alloc(b, total, (void **)&buf), "host_alloc (pinned)"))
		return;
	smoke_fill(buf, size[SMOKE_A], 1);
	smoke_fill(buf + size[SMOKE_A], size[SMOKE_B], 2);
	if (smoke_copy(b, false, buf, va, total) > 0) {
		memset(buf, 0xee, total);
		if (smoke_copy(b, true, buf, va, total) > 0) {
			smoke_verify(buf, size[SMOKE_A], 1, "chunk A read back");
			smoke_verify(buf + size[SMOKE_A], size[SMOKE_B], 2, "chunk B read back");
		}
	}
	b->ops->host_free(b, buf, total);
}

static void smoke_child_use(struct backend *b, int *fds, const struct smoke_msg *m)
{
	uint64_t h[SMOKE_N] = { 0 };
	uintptr_t va = 0;
	int i;

	for (i = 0; i < SMOKE_N; i++)
		if (!smoke_ok(b->ops->chunk_import(b, fds[i], m->size[i], &h[i]),
			      "import chunk %c from fd %d", 'A' + i, fds[i]))
			break;
	if (i == SMOKE_N)
		smoke_child_probe_reimport(b, fds[SMOKE_A], m->size[SMOKE_A], h[SMOKE_A]);
	/* The fds stay ours after import: close them, as a client does at once. */
	for (int j = 0; j < SMOKE_N; j++)
		close(fds[j]);
	if (i == SMOKE_N && smoke_map_all(b, h, m->size, &va) == 0)
		smoke_child_rw(b, va, m->size);
	if (va) {
		smoke_unmap_all(b, va, m->size);
		smoke_ok(b->ops->va_free(b, va, m->size[SMOKE_A] + m->size[SMOKE_B]), "va_free");
	}
	for (int j = 0; j < i; j++)
		smoke_ok(b->ops->chunk_release(b, h[j]), "release imported chunk %c", 'A' + j);
}

static int smoke_child(int sock)
{
	struct backend *b = NULL;
	struct smoke_msg m;
	int fds[SMOKE_N], rc;

	smoke_who = "child";
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	rc = smoke_recv_fds(sock, fds, &m);
	close(sock);
	if (rc == -ENOENT)
		return 2;
	if (!smoke_ok(rc, "receive the chunk fds"))
		return 1;
	if (smoke_ok(backend_open("cuda", NULL, &b), "backend_open(\"cuda\")"))
		smoke_child_use(b, fds, &m);
	else
		for (int j = 0; j < SMOKE_N; j++)
			close(fds[j]);
	backend_close(b);
	return smoke_failures ? 1 : 0;
}

/* The parent: the daemon, then a second client of the same chunks. */

static void smoke_devices(struct backend *b)
{
	for (int i = 0; i < b->ndevices; i++)
		smoke_info("device %d: %s, %" PRIu64 " MiB, granularity %" PRIu64 " KiB", i,
			   b->devices[i].name, b->devices[i].total_bytes / SMOKE_MIB,
			   b->devices[i].granularity >> 10);
}

static bool smoke_fd_cloexec(int fd)
{
	int flags = fcntl(fd, F_GETFD);

	return flags >= 0 && (flags & FD_CLOEXEC);
}

/* Creates chunk @i and exports it; *h stays 0 when there is no chunk. */
static int smoke_make(struct backend *b, int i, uint64_t size, uint64_t *h, int *fd)
{
	int rc = b->ops->chunk_create(b, SMOKE_DEV, size, h);

	if (!smoke_ok(rc, "chunk_create %c: %" PRIu64 " MiB", 'A' + i, size / SMOKE_MIB))
		return rc;
	rc = b->ops->chunk_export(b, *h, fd);
	if (!smoke_ok(rc, "chunk_export %c", 'A' + i))
		return rc;
	smoke_true(smoke_fd_cloexec(*fd), "exported fd %d is CLOEXEC", *fd);
	return 0;
}

/* Creates A and B, sends their fds to the child, and waits for its verdict. */
static int smoke_share(struct backend *b, int sock, pid_t pid, uint64_t *h,
		       const struct smoke_msg *m)
{
	int fds[SMOKE_N] = { -1, -1 }, status = 0, rc = 0;

	for (int i = 0; i < SMOKE_N && rc == 0; i++)
		rc = smoke_make(b, i, m->size[i], &h[i], &fds[i]);
	if (rc == 0) {
		rc = smoke_send_fds(sock, fds, m);
		smoke_ok(rc, "send the fds over SCM_RIGHTS");
	}
	/* Sent or not, our fds are ours to close: the child got its own. */
	for (int i = 0; i < SMOKE_N; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	close(sock); /* unsent: the child sees EOF and leaves */
	if (waitpid(pid, &status, 0) < 0) {
		smoke_true(false, "waitpid: %s", strerror(errno));
		return -ECHILD;
	}
	if (rc == 0)
		smoke_true(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exited %s %d",
			   WIFEXITED(status) ? "with status" : "on signal",
			   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	return rc;
}

/* Maps A and B here and checks the child's bytes; reuses B's VA for a new chunk C. */
static void smoke_view(struct backend *b, const uint64_t *h, const uint64_t *size, char *buf,
		       uintptr_t va)
{
	uint64_t total = size[SMOKE_A] + size[SMOKE_B], hc = 0;
	uintptr_t vb = va + size[SMOKE_A];
	double gbs;

	gbs = smoke_copy(b, true, buf, va, total);
	if (gbs > 0) {
		smoke_info("copy_to_host: %.1f GB/s", gbs);
		smoke_verify(buf, size[SMOKE_A], 1, "chunk A holds the child's bytes");
		smoke_verify(buf + size[SMOKE_A], size[SMOKE_B], 2,
			     "chunk B holds the child's bytes");
	}
	if (!smoke_ok(b->ops->unmap(b, vb, size[SMOKE_B]), "unmap chunk B alone (VA kept)") ||
	    !smoke_ok(b->ops->chunk_create(b, SMOKE_DEV, size[SMOKE_B], &hc), "chunk_create C") ||
	    !smoke_ok(b->ops->map(b, vb, size[SMOKE_B], hc), "map chunk C at B's old VA") ||
	    !smoke_ok(b->ops->set_access(b, SMOKE_DEV, vb, size[SMOKE_B]), "set_access C"))
		goto out;
	if (smoke_copy(b, true, buf, vb, size[SMOKE_B]) > 0)
		smoke_verify(buf, size[SMOKE_B], 0, "fresh chunk C reads zero");
	smoke_fill(buf, size[SMOKE_B], 3);
	gbs = smoke_copy(b, false, buf, vb, size[SMOKE_B]);
	if (gbs > 0)
		smoke_info("copy_from_host: %.1f GB/s", gbs);
	memset(buf, 0, size[SMOKE_B]);
	if (gbs > 0 && smoke_copy(b, true, buf, vb, size[SMOKE_B]) > 0)
		smoke_verify(buf, size[SMOKE_B], 3, "chunk C read back");
	if (smoke_copy(b, true, buf, va, size[SMOKE_A]) > 0)
		smoke_verify(buf, size[SMOKE_A], 1, "chunk A intact after B's unmap");
	/* A mapping holds the memory after its handle goes (cuMemRelease). */
	if (smoke_ok(b->ops->chunk_release(b, hc), "release chunk C while mapped")) {
		hc = 0;
		if (smoke_copy(b, true, buf, vb, size[SMOKE_B]) > 0)
			smoke_verify(buf, size[SMOKE_B], 3, "chunk C still readable");
	}
out:
	if (hc)
		smoke_ok(b->ops->chunk_release(b, hc), "release chunk C");
}

/* The driver's rules, as the host backend enforces them; false if A lost its mapping. */
static bool smoke_rules(struct backend *b, const uint64_t *h, const uint64_t *size, uintptr_t va)
{
	uint64_t gran = b->devices[SMOKE_DEV].granularity, odd;
	bool a_whole = true;
	int rc;

	rc = b->ops->map(b, va, size[SMOKE_A], h[SMOKE_A]);
	smoke_true(rc < 0, "map over a mapped range is refused: rc=%d %s", rc,
		   rc ? backend_last_error() : "");
	if (size[SMOKE_A] > gran) {
		rc = b->ops->unmap(b, va, gran);
		a_whole = smoke_true(rc < 0, "unmap of part of a mapping is refused: rc=%d %s", rc,
				     rc ? backend_last_error() : "");
	}
	rc = b->ops->chunk_create(b, SMOKE_DEV, gran + 4096, &odd);
	smoke_true(rc == -EINVAL, "chunk_create off the granularity is -EINVAL: rc=%d", rc);
	if (rc == 0)
		b->ops->chunk_release(b, odd);
	return a_whole;
}

static void smoke_contents(struct backend *b, char *buf, uintptr_t va, uint64_t size)
{
	smoke_ok(b->ops->sync(b, SMOKE_DEV), "sync");
	if (!smoke_ok(b->ops->zero(b, SMOKE_DEV, va, size), "zero chunk A"))
		return;
	memset(buf, 0xee, size);
	if (smoke_copy(b, true, buf, va, size) > 0)
		smoke_verify(buf, size, 0, "chunk A reads zero after zero()");
}

/* Undocumented driver behaviour the design may care about: reported, not judged. */
static void smoke_probe_va_free_mapped(struct backend *b)
{
	uint64_t gran = b->devices[SMOKE_DEV].granularity, h;
	uintptr_t va;
	int rc;

	if (b->ops->va_reserve(b, gran, 0, &va) < 0)
		return;
	if (b->ops->chunk_create(b, SMOKE_DEV, gran, &h) == 0) {
		if (b->ops->map(b, va, gran, h) == 0) {
			rc = b->ops->va_free(b, va, gran);
			smoke_info("va_free of a mapped range: rc=%d %s (host backend: -EBUSY)", rc,
				   rc ? backend_last_error() : "");
			if (rc == 0) {
				b->ops->chunk_release(b, h);
				return;
			}
			b->ops->unmap(b, va, gran);
		}
		b->ops->chunk_release(b, h);
	}
	b->ops->va_free(b, va, gran);
}

static void smoke_parent_use(struct backend *b, uint64_t *h, const uint64_t *size)
{
	uint64_t total = size[SMOKE_A] + size[SMOKE_B];
	uintptr_t va = 0;
	char *buf = NULL;
	double t = smoke_now();

	if (!smoke_ok(b->ops->host_alloc(b, total, (void **)&buf), "host_alloc (pinned)"))
		return;
	smoke_info("host_alloc of %" PRIu64 " MiB pinned took %.0f ms", total / SMOKE_MIB,
		   (smoke_now() - t) * 1e3);
	if (smoke_map_all(b, h, size, &va) == 0) {
		smoke_view(b, h, size, buf, va);
		/* Touching a hole would fault the GPU context: skip if A was cut. */
		if (smoke_rules(b, h, size, va))
			smoke_contents(b, buf, va, size[SMOKE_A]);
	}
	if (va) {
		/* A and C now, back to back. */
		smoke_unmap_all(b, va, size);
		smoke_ok(b->ops->va_free(b, va, total), "va_free");
	}
	b->ops->host_free(b, buf, total);
}

static void smoke_parent(int sock, pid_t pid)
{
	struct smoke_msg m = { { 64 * SMOKE_MIB, 1024 * SMOKE_MIB } };
	uint64_t h[SMOKE_N] = { 0 }, free0 = 0, free1 = 0, total = 0;
	struct backend *b = NULL;

	if (!smoke_ok(backend_open("cuda", NULL, &b), "backend_open(\"cuda\")")) {
		close(sock); /* the child sees EOF and leaves */
		waitpid(pid, NULL, 0);
		return;
	}
	smoke_devices(b);
	for (int i = 0; i < SMOKE_N; i++)
		m.size[i] = backend_round_up(m.size[i], b->devices[SMOKE_DEV].granularity);
	smoke_ok(backend_cuda_mem_info(b, SMOKE_DEV, &free0, &total), "mem_info before");
	if (smoke_share(b, sock, pid, h, &m) == 0)
		smoke_parent_use(b, h, m.size);
	for (int i = 0; i < SMOKE_N; i++)
		if (h[i])
			smoke_ok(b->ops->chunk_release(b, h[i]), "release chunk %c", 'A' + i);
	if (smoke_ok(backend_cuda_mem_info(b, SMOKE_DEV, &free1, &total), "mem_info after")) {
		smoke_info("free before %" PRIu64 " MiB, after %" PRIu64 " MiB, total %" PRIu64
			   " MiB",
			   free0 / SMOKE_MIB, free1 / SMOKE_MIB, total / SMOKE_MIB);
		smoke_true(free1 + SMOKE_SLACK >= free0, "released memory is back with the driver");
	}
	smoke_probe_va_free_mapped(b);
	backend_close(b);
}

int main(void)
{
	int sv[2];
	pid_t pid;

	/* Line-buffered and empty before fork: neither process repeats the other's lines. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(SMOKE_TIMEOUT_S);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		printf("FAIL parent: socketpair: %s\n", strerror(errno));
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		printf("FAIL parent: fork: %s\n", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		int rc;

		close(sv[0]);
		rc = smoke_child(sv[1]);
		fflush(stdout);
		_exit(rc);
	}
	close(sv[1]);
	smoke_parent(sv[0], pid);
	printf("%s backend_smoke: %d failure(s)\n", smoke_failures ? "FAIL" : "PASS",
	       smoke_failures);
	return smoke_failures ? 1 : 0;
}
