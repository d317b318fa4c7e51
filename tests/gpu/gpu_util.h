/*
 * gpu_util.h - helpers shared by the GPU test programs and the bench.
 *
 * Header-only (each program is one .cu file): checked CUDA runtime, driver
 * and libgmb calls, a monotonic clock, reading numbers out of the broker's
 * status JSON, spawning this same binary in another role (posix_spawn of
 * /proc/self/exe: never fork() after CUDA init), and pattern kernels.
 *
 * Every program ends with exactly one line "RESULT: PASS|FAIL|SKIP - detail";
 * tests/gpu/run.sh reads that line and the exit status (0 pass, 1 fail,
 * 77 skip). A failed check prints "FAIL: why" and exits 1 at once.
 */
#ifndef GMB_GPU_UTIL_H
#define GMB_GPU_UTIL_H

#include <cuda.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "include/gmb.h"

extern char **environ;

#define GiB	  (1ULL << 30)
#define MiB	  (1ULL << 20)
#define EXIT_SKIP 77

static const char *g_test_name = "gpu-test";

static inline void gu_set_name(const char *name)
{
	g_test_name = name;
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IOLBF, 0);
}

/* Prints the RESULT line; the caller exits. */
static inline void gu_result(const char *verdict, const char *fmt, ...)
{
	va_list ap;

	fflush(stderr);
	printf("RESULT: %s - ", verdict);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

__attribute__((noreturn, format(printf, 1, 2))) static inline void gu_fail(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	printf("FAIL: [%s pid %d] %s\n", g_test_name, (int)getpid(), msg);
	gu_result("FAIL", "%s", msg);
	exit(1);
}

#define CUDA_CK(call)                                                           \
	do {                                                                    \
		cudaError_t e_ = (call);                                        \
		if (e_ != cudaSuccess)                                          \
			gu_fail("%s:%d %s: %s (%s)", __FILE__, __LINE__, #call, \
				cudaGetErrorName(e_), cudaGetErrorString(e_));  \
	} while (0)

#define CU_CK(call)                                                             \
	do {                                                                    \
		CUresult r_ = (call);                                           \
		if (r_ != CUDA_SUCCESS) {                                       \
			const char *n_ = "?";                                   \
			cuGetErrorName(r_, &n_);                                \
			gu_fail("%s:%d %s: %s", __FILE__, __LINE__, #call, n_); \
		}                                                               \
	} while (0)

/* A libgmb call that must succeed; @c is the client whose message explains it. */
#define GMB_CK(c, call)                                                                  \
	do {                                                                             \
		int g_ = (call);                                                         \
		if (g_ != 0)                                                             \
			gu_fail("%s:%d %s = %d (%s): %s", __FILE__, __LINE__, #call, g_, \
				gmb_strerror(g_), (c) ? gmb_last_error(c) : "");         \
	} while (0)

#define CHECK(cond, ...)                      \
	do {                                  \
		if (!(cond))                  \
			gu_fail(__VA_ARGS__); \
	} while (0)

/*
 * @n fds (at most 64) in one message with one byte over @sock (SCM_RIGHTS);
 * gu_recv_fds(): the fds of the next message into @fds (0 without any, -1 at
 * the end). The bench programs lend fds as gmbd does.
 */
static inline void gu_send_fds(int sock, const int *fds, int n)
{
	char byte = 1, ctl[CMSG_SPACE(sizeof(int) * 64)] = {};
	struct iovec io = { &byte, 1 };
	struct msghdr m = {};
	struct cmsghdr *h;

	m.msg_iov = &io;
	m.msg_iovlen = 1;
	m.msg_control = ctl;
	m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
	h = CMSG_FIRSTHDR(&m);
	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int) * n);
	memcpy(CMSG_DATA(h), fds, sizeof(int) * n);
	CHECK(sendmsg(sock, &m, 0) == 1, "sendmsg: %s", strerror(errno));
}

static inline int gu_recv_fds(int sock, int *fds, int cap)
{
	char byte, ctl[CMSG_SPACE(sizeof(int) * 64)];
	struct iovec io = { &byte, 1 };
	struct msghdr m = {};
	struct cmsghdr *h;
	int n;

	m.msg_iov = &io;
	m.msg_iovlen = 1;
	m.msg_control = ctl;
	m.msg_controllen = sizeof(ctl);
	if (recvmsg(sock, &m, 0) <= 0)
		return -1;
	h = CMSG_FIRSTHDR(&m);
	if (!h)
		return 0;
	n = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
	CHECK(n <= cap, "too many fds");
	memcpy(fds, CMSG_DATA(h), sizeof(int) * n);
	return n;
}

static inline double gu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double gu_gib(uint64_t n)
{
	return (double)n / (double)GiB;
}

static int gu_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median of @n values; sorts a copy. */
static inline double gu_median(const double *v, int n)
{
	double tmp[256];

	if (n <= 0)
		return 0.0;
	if (n > 256)
		n = 256;
	memcpy(tmp, v, sizeof(double) * (size_t)n);
	qsort(tmp, (size_t)n, sizeof(double), gu_cmp_double);
	return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

/*
 * Status JSON: {"backend":..,"devices":[{"index":0,...,"used_bytes":N,...},..],
 * "clients":[..]}. Device objects hold no nested objects, so a key is looked
 * up between the device's "index" and the next '}'.
 */
static inline int gu_json_dev_u64(const char *json, int dev, const char *key, uint64_t *out)
{
	const char *p = strstr(json, "\"devices\"");
	char want[64], k[80];

	if (!p)
		return -ENOENT;
	snprintf(want, sizeof(want), "\"index\":%d,", dev);
	p = strstr(p, want);
	if (!p)
		return -ENOENT;
	const char *end = strchr(p, '}');
	snprintf(k, sizeof(k), "\"%s\":", key);
	const char *q = strstr(p, k);
	if (!q || (end && q > end))
		return -ENOENT;
	*out = strtoull(q + strlen(k), NULL, 10);
	return 0;
}

struct gu_dev_status {
	uint64_t total, budget, pool, used, free_;
};

/* The broker's view of @dev; fails the test if the broker does not answer. */
static inline struct gu_dev_status gu_status(gmb_client *c, int dev)
{
	struct gu_dev_status s = { 0, 0, 0, 0, 0 };
	char *json = NULL;

	GMB_CK(c, gmb_status_json(c, &json));
	if (gu_json_dev_u64(json, dev, "total_bytes", &s.total) ||
	    gu_json_dev_u64(json, dev, "budget_bytes", &s.budget) ||
	    gu_json_dev_u64(json, dev, "pool_bytes", &s.pool) ||
	    gu_json_dev_u64(json, dev, "used_bytes", &s.used) ||
	    gu_json_dev_u64(json, dev, "free_bytes", &s.free_)) {
		printf("status json: %.2000s\n", json);
		free(json);
		gu_fail("device %d not found in the broker's status JSON", dev);
	}
	free(json);
	return s;
}

/*
 * gu_trim_all() - give every free pool chunk back to the driver; a trim may
 * report bytes pending (clients still dropping handles), so retry for up
 * to 10 s. Return: bytes released.
 */
static inline uint64_t gu_trim_all(gmb_client *c)
{
	uint64_t rel = 0, pend = 0, total = 0;
	double end = gu_now() + 10;

	do {
		GMB_CK(c, gmb_trim(c, -1, &rel, &pend));
		total += rel;
		if (!pend)
			break;
		usleep(1000);
	} while (gu_now() < end);
	if (pend)
		printf("warning: %.2f GiB still pending after 10 s of trims\n",
		       (double)pend / (double)(1ULL << 30));
	return total;
}

static inline void gu_print_status(gmb_client *c, const char *when)
{
	char *text = NULL;

	if (gmb_status_text(c, &text) == 0) {
		printf("--- broker status (%s) ---\n%s", when, text);
		free(text);
	}
}

/*
 * gu_spawn_self_io() - start this binary again with @argv (argv[0] is
 * ignored, replaced by /proc/self/exe). @fd0, when >= 0, becomes the child's
 * stdin; @fd3, when >= 0, its fd 3 (a pipe end to report readiness or
 * replies). stdout/stderr are inherited.
 */
static inline pid_t gu_spawn_self_io(char *const argv[], int fd0, int fd3)
{
	posix_spawn_file_actions_t fa;
	char exe[4096];
	pid_t pid;
	int r, n = 0;
	char *args[32];

	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	CHECK(len > 0, "readlink /proc/self/exe: %s", strerror(errno));
	exe[len] = '\0';
	args[n++] = exe;
	for (int i = 1; argv[i] && n < 31; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	posix_spawn_file_actions_init(&fa);
	if (fd0 >= 0)
		posix_spawn_file_actions_adddup2(&fa, fd0, 0);
	if (fd3 >= 0)
		posix_spawn_file_actions_adddup2(&fa, fd3, 3);
	fflush(stdout);
	fflush(stderr);
	r = posix_spawn(&pid, exe, &fa, NULL, args, environ);
	posix_spawn_file_actions_destroy(&fa);
	CHECK(r == 0, "posix_spawn %s %s: %s", exe, argv[1] ? argv[1] : "", strerror(r));
	return pid;
}

static inline pid_t gu_spawn_self(char *const argv[], int fd3)
{
	return gu_spawn_self_io(argv, -1, fd3);
}

/*
 * gu_wait_child() - wait up to @timeout_s for @pid; SIGKILL it past that.
 * Return: its exit code, 128+signal if killed, -1 on timeout.
 */
static inline int gu_wait_child(pid_t pid, double timeout_s)
{
	double end = gu_now() + timeout_s;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (r < 0)
			return -1;
		if (gu_now() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		usleep(2000);
	}
}

/* Reads one byte from @fd within @timeout_s. Return: 1, 0 on EOF, -1 timeout. */
static inline int gu_read_byte(int fd, double timeout_s, char *b)
{
	struct pollfd p = { fd, POLLIN, 0 };
	int r = poll(&p, 1, (int)(timeout_s * 1000));

	if (r <= 0)
		return -1;
	return read(fd, b, 1) == 1 ? 1 : 0;
}

/*
 * gu_smi_process_mib() - GPU memory of process @pid according to nvidia-smi
 * --query-compute-apps. Appends nvidia-smi's raw lines to @raw.
 * Return: MiB, -1 when the process is not listed (no context), -2 when
 * listed with memory N/A, -3 when nvidia-smi cannot run or fails.
 */
static inline long gu_smi_process_mib(long pid, char *raw, size_t rawlen)
{
	char line[512];
	size_t off = strlen(raw);
	long used = -1;

	FILE *f = popen("nvidia-smi --query-compute-apps=pid,process_name,used_memory "
			"--format=csv,noheader,nounits 2>&1",
			"r");
	if (!f)
		return -3;
	while (fgets(line, sizeof(line), f)) {
		if (off + 1 < rawlen)
			off += (size_t)snprintf(raw + off, rawlen - off, "%s", line);
		if (!strchr(line, ',') || atol(line) != pid)
			continue;
		const char *last = strrchr(line, ',');
		used = strstr(last, "N/A") ? -2 : atol(last + 1);
	}
	return pclose(f) == 0 ? used : -3;
}

/* Makes the primary context of @dev current on this thread. */
/*
 * A second process over a SOCK_SEQPACKET pair, forked before this one
 * touches CUDA (a process forked after cuInit cannot use it): @child runs
 * there with its end and @arg and never returns (@other, when >= 0, is
 * closed there first: an earlier peer's end); *@sock is this side's end.
 */
static inline pid_t gu_fork_peer(void (*child)(int sock, void *arg), void *arg, int other,
				 int *sock)
{
	int sv[2];
	pid_t pid;

	CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0, "socketpair: %s", strerror(errno));
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		if (other >= 0)
			close(other);
		child(sv[1], arg);
		_exit(1);
	}
	close(sv[1]);
	*sock = sv[0];
	return pid;
}

/* The driver initialised and device 0's primary context current (the driver API alone). */
static inline void gu_primary_ctx(CUcontext *ctx, CUdevice *dev)
{
	CU_CK(cuInit(0));
	CU_CK(cuDeviceGet(dev, 0));
	CU_CK(cuDevicePrimaryCtxRetain(ctx, *dev));
	CU_CK(cuCtxSetCurrent(*ctx));
}

/* A probe's shape: @n chunks of @size bytes. */
struct gu_shape {
	const char *name;
	int n;
	uint64_t size;
};

/* The next @n fds from @sock (a peer's lend), each imported into @h[i] and closed. */
static inline void gu_import_fds(int sock, int n, CUmemGenericAllocationHandle *h)
{
	int fds[256], got = 0;

	CHECK(n <= 256, "too many fds");
	while (got < n) {
		int r = gu_recv_fds(sock, fds + got, n - got);

		CHECK(r > 0, "the maker's fds");
		got += r;
	}
	for (int i = 0; i < n; i++) {
		CU_CK(cuMemImportFromShareableHandle(&h[i], (void *)(long)fds[i],
						     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		close(fds[i]);
	}
}

/* A pinned allocation on device 0, exportable as a POSIX fd: what gmbd's chunks are. */
static inline CUmemAllocationProp gu_fd_prop(void)
{
	CUmemAllocationProp p = {};

	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = 0;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	return p;
}

/* Read-write access for device 0. */
static inline CUmemAccessDesc gu_rw_access(void)
{
	CUmemAccessDesc a = {};

	a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.location.id = 0;
	a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return a;
}

static inline void gu_cuda_init(int dev)
{
	CUDA_CK(cudaSetDevice(dev));
	CUDA_CK(cudaFree(0));
}

static inline gmb_client *gu_connect(const char *name)
{
	gmb_client *c = NULL;
	int r = gmb_connect(NULL, name, &c);

	CHECK(r == 0, "gmb_connect(%s) on %s: %d %s", name,
	      getenv("GMB_SOCKET") ? getenv("GMB_SOCKET") : "(default)", r, gmb_strerror(r));
	return c;
}

/* ---- kernels ---- */

__host__ __device__ static inline uint64_t gu_mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

/* p[i] = mix(seed, i): every word differs, so a moved or lost page shows. */
__global__ static void gu_fill_kernel(uint64_t *p, size_t n, uint64_t seed)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		p[i] = gu_mix64(seed + i);
}

/* Counts words of p that are not mix(seed, i). */
__global__ static void gu_check_kernel(const uint64_t *p, size_t n, uint64_t seed,
				       unsigned long long *bad)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	unsigned long long nbad = 0;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		nbad += p[i] != gu_mix64(seed + i);
	if (nbad)
		atomicAdd(bad, nbad);
}

__global__ static void gu_set_kernel(uint64_t *p, size_t n, uint64_t v)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		p[i] = v;
}

/* Counts words equal to @v (equal = 1) or different from @v (equal = 0). */
__global__ static void gu_count_kernel(const uint64_t *p, size_t n, uint64_t v, int equal,
				       unsigned long long *cnt)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	unsigned long long k = 0;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		k += equal ? (p[i] == v) : (p[i] != v);
	if (k)
		atomicAdd(cnt, k);
}

#define GU_GRID	 1056 /* 8 blocks per SM of the H200's 132 */
#define GU_BLOCK 256

/* A counter in ordinary (non-broker) memory of the current device. */
static unsigned long long *g_counter[64];

static inline unsigned long long *gu_counter(void)
{
	int dev = 0;

	CUDA_CK(cudaGetDevice(&dev));
	CHECK(dev >= 0 && dev < 64, "device %d", dev);
	if (!g_counter[dev])
		CUDA_CK(cudaMalloc((void **)&g_counter[dev], sizeof(unsigned long long)));
	return g_counter[dev];
}

static inline void gu_fill(void *p, uint64_t bytes, uint64_t seed, cudaStream_t s)
{
	gu_fill_kernel<<<GU_GRID, GU_BLOCK, 0, s>>>((uint64_t *)p, bytes / 8, seed);
	CUDA_CK(cudaGetLastError());
}

static inline void gu_set(void *p, uint64_t bytes, uint64_t v, cudaStream_t s)
{
	gu_set_kernel<<<GU_GRID, GU_BLOCK, 0, s>>>((uint64_t *)p, bytes / 8, v);
	CUDA_CK(cudaGetLastError());
}

/* Number of wrong words in [p, p + bytes) against gu_fill(seed). Synchronizes. */
static inline unsigned long long gu_check(const void *p, uint64_t bytes, uint64_t seed)
{
	unsigned long long h = 0, *d = gu_counter();

	CUDA_CK(cudaMemset(d, 0, sizeof(*d)));
	gu_check_kernel<<<GU_GRID, GU_BLOCK>>>((const uint64_t *)p, bytes / 8, seed, d);
	CUDA_CK(cudaGetLastError());
	CUDA_CK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
	return h;
}

/* Number of words equal (or, with equal = 0, not equal) to @v. Synchronizes. */
static inline unsigned long long gu_count(const void *p, uint64_t bytes, uint64_t v, int equal)
{
	unsigned long long h = 0, *d = gu_counter();

	CUDA_CK(cudaMemset(d, 0, sizeof(*d)));
	gu_count_kernel<<<GU_GRID, GU_BLOCK>>>((const uint64_t *)p, bytes / 8, v, equal, d);
	CUDA_CK(cudaGetLastError());
	CUDA_CK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
	return h;
}

/* The device that backs @p according to the runtime (-1 if not device memory). */
static inline int gu_ptr_device(const void *p)
{
	cudaPointerAttributes a;

	CUDA_CK(cudaPointerGetAttributes(&a, p));
	return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

#endif
