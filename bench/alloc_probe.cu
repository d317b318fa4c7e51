/*
 * alloc_probe.cu - what one allocation, and one resume, costs: made in the
 * process (what torch_memory_saver does) or lent by gmbd, with and without
 * the polling that spares a blocked thread's wake-up (common/spin.h).
 *
 * Three ways, per shape (count x size), in turns within each round:
 *   local:   cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess
 *            per allocation; resume = create + map + access per allocation
 *            after unmap + release;
 *   gmbd:    gmb_malloc per allocation in a tag of gmbd's default; resume =
 *            gmb_resume of the tag after gmb_pause ($GMB_SOCKET, a gmbd
 *            started with its defaults: --spin-us 200, $GMB_SPIN_US unset);
 *   no poll: the same on $GMB_SOCKET_NOSPIN, a gmbd started with --spin-us
 *            0, this client connected with GMB_SPIN_US=0 (left out when
 *            unset);
 *   adopted: what gmbd would cost if clients made their own chunks and
 *            gmbd took a reference afterwards (a design gmbd does not
 *            have): per allocation a round trip to a holder process
 *            without a context (gmbd's leave to take the bytes), then
 *            reserve + create + map + access here, the chunk exported and
 *            its fd sent to the holder, which imports it while this
 *            process goes on; a pause unmaps and releases here and waits
 *            for the holder to release the last references (the memory
 *            at the driver when pause returns); a resume asks leave once,
 *            then creates, maps, exports and sends each. Both sides poll
 *            SPIN_US before blocking, as gmbd and libgmb do.
 * Before each way the GPU is left idle SETTLE_MS, so that no way's
 * allocation meets the previous one's release being scrubbed. Printed per
 * way: the median of an allocation (every allocation of every round but
 * each round's first, which pays the driver's first create after the idle
 * time, the same for all three: shown apart), the whole shape's allocation,
 * and the median resume of the shape, in ms. Ratios are local / way (above
 * 1: the way is faster). Driver API and libgmb only; one device.
 *
 *   alloc_probe [ROUNDS [SETTLE_MS]]    (default 5, 1000)
 */
#include <poll.h>
#include <sched.h>
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"

#define MAX_N	   64
#define MAX_ROUNDS 16
#define CYCLES	   3   /* pause + resume per round and way */
#define SPIN_US	   200 /* what gmbd's --spin-us and libgmb's $GMB_SPIN_US default to */

static const struct gu_shape probe_shapes[] = {
	{ "16 x 1 GiB", 16, GiB },
	{ "64 x 20 MiB", 64, 20 * MiB },
};
#define NSHAPES (int)(sizeof(probe_shapes) / sizeof(probe_shapes[0]))

enum way { WAY_LOCAL, WAY_GMBD, WAY_NOPOLL, WAY_ADOPTED, NWAYS };
static const char *const way_names[NWAYS] = { "local", "gmbd", "gmbd, no poll",
					      "made here, adopted (not gmbd's design)" };

/* One way's samples over the rounds, in seconds. */
struct way_res {
	double each[MAX_ROUNDS * MAX_N]; /* allocations but a round's first */
	double first[MAX_ROUNDS];	 /* a round's first allocation */
	double whole[MAX_ROUNDS];	 /* the shape's allocation */
	double resume[MAX_ROUNDS * CYCLES];
	int neach, nrounds, nresume;
};

/* Allocation @i of a round took @t s: a round's first is kept apart. */
static void probe_note(struct way_res *r, int i, double t)
{
	if (i == 0)
		r->first[r->nrounds] = t;
	else
		r->each[r->neach++] = t;
}

static void local_round(const struct gu_shape *sh, struct way_res *r)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemAccessDesc acc = gu_rw_access();
	CUmemGenericAllocationHandle h[MAX_N];
	CUdeviceptr va[MAX_N];
	double t0 = gu_now();

	for (int i = 0; i < sh->n; i++) {
		double t = gu_now();

		CU_CK(cuMemAddressReserve(&va[i], sh->size, 0, 0, 0));
		CU_CK(cuMemCreate(&h[i], sh->size, &prop, 0));
		CU_CK(cuMemMap(va[i], sh->size, 0, h[i], 0));
		CU_CK(cuMemSetAccess(va[i], sh->size, &acc, 1));
		probe_note(r, i, gu_now() - t);
	}
	r->whole[r->nrounds++] = gu_now() - t0;
	for (int k = 0; k < CYCLES; k++) {
		double t;

		for (int i = 0; i < sh->n; i++) {
			CU_CK(cuMemUnmap(va[i], sh->size));
			CU_CK(cuMemRelease(h[i]));
		}
		t = gu_now();
		for (int i = 0; i < sh->n; i++) {
			CU_CK(cuMemCreate(&h[i], sh->size, &prop, 0));
			CU_CK(cuMemMap(va[i], sh->size, 0, h[i], 0));
			CU_CK(cuMemSetAccess(va[i], sh->size, &acc, 1));
		}
		r->resume[r->nresume++] = gu_now() - t;
	}
	for (int i = 0; i < sh->n; i++) {
		CU_CK(cuMemUnmap(va[i], sh->size));
		CU_CK(cuMemRelease(h[i]));
		CU_CK(cuMemAddressFree(va[i], sh->size));
	}
}

/* The adopted way. The holder's requests, one byte each; fds ride alone. */
enum { HOLD_END, HOLD_LEAVE, HOLD_RELEASE };

/* Polls @fd for SPIN_US, yielding, then blocks: gmbd's and libgmb's way of waiting. */
static void probe_wait_readable(int fd)
{
	struct pollfd p = { fd, POLLIN, 0 };
	double until = gu_now() + SPIN_US * 1e-6;

	while (poll(&p, 1, 0) == 0 && gu_now() < until)
		sched_yield();
	CHECK(poll(&p, 1, -1) == 1, "poll: %s", strerror(errno));
}

/* The next packet from @sock: its byte in *@rq, its fd (if any) in *@fd; -1 at the end. */
static int probe_recv(int sock, char *rq, int *fd)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec io = { rq, 1 };
	struct msghdr m = {};
	struct cmsghdr *h;

	m.msg_iov = &io;
	m.msg_iovlen = 1;
	m.msg_control = ctl;
	m.msg_controllen = sizeof(ctl);
	if (recvmsg(sock, &m, 0) <= 0)
		return -1;
	h = CMSG_FIRSTHDR(&m);
	if (!h || h->cmsg_type != SCM_RIGHTS)
		return 0;
	CHECK(h->cmsg_len == CMSG_LEN(sizeof(int)), "one fd a packet");
	memcpy(fd, CMSG_DATA(h), sizeof(int));
	return 1;
}

/* The holder (as gmbd without a context): answers leave, adopts fds, releases all on asking. */
static __attribute__((noreturn)) void probe_holder(int sock, void *unused)
{
	CUmemGenericAllocationHandle h[MAX_N];
	int n = 0;

	(void)unused;
	CU_CK(cuInit(0));
	for (;;) {
		int fd = -1, got;
		char rq = HOLD_END, ack = 1;

		probe_wait_readable(sock);
		got = probe_recv(sock, &rq, &fd);
		if (got == 1) {
			CHECK(n < MAX_N, "too many chunks");
			CU_CK(cuMemImportFromShareableHandle(
				&h[n++], (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
			close(fd);
			continue;
		}
		if (got < 0 || rq == HOLD_END)
			exit(0);
		if (rq == HOLD_RELEASE) {
			for (int i = 0; i < n; i++)
				CU_CK(cuMemRelease(h[i]));
			n = 0;
		}
		CHECK(write(sock, &ack, 1) == 1, "the holder's answer");
	}
}

/* A request to the holder and its answer. */
static void probe_hold_ask(int sock, char rq)
{
	char ack;

	CHECK(write(sock, &rq, 1) == 1, "a request to the holder");
	probe_wait_readable(sock);
	CHECK(read(sock, &ack, 1) == 1, "the holder's answer");
}

/* Create, map and access @va's chunk here, then hand an exported fd to the holder. */
static void probe_make_and_hand(int sock, CUdeviceptr va, uint64_t size,
				CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop = gu_fd_prop();
	CUmemAccessDesc acc = gu_rw_access();
	int fd;

	CU_CK(cuMemCreate(h, size, &prop, 0));
	CU_CK(cuMemMap(va, size, 0, *h, 0));
	CU_CK(cuMemSetAccess(va, size, &acc, 1));
	CU_CK(cuMemExportToShareableHandle(&fd, *h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	gu_send_fds(sock, &fd, 1);
	close(fd);
}

static void adopted_round(int sock, const struct gu_shape *sh, struct way_res *r)
{
	CUmemGenericAllocationHandle h[MAX_N];
	CUdeviceptr va[MAX_N];
	double t0 = gu_now();

	for (int i = 0; i < sh->n; i++) {
		double t = gu_now();

		probe_hold_ask(sock, HOLD_LEAVE);
		CU_CK(cuMemAddressReserve(&va[i], sh->size, 0, 0, 0));
		probe_make_and_hand(sock, va[i], sh->size, &h[i]);
		probe_note(r, i, gu_now() - t);
	}
	r->whole[r->nrounds++] = gu_now() - t0;
	for (int k = 0; k < CYCLES; k++) {
		double t;

		for (int i = 0; i < sh->n; i++) {
			CU_CK(cuMemUnmap(va[i], sh->size));
			CU_CK(cuMemRelease(h[i]));
		}
		probe_hold_ask(sock, HOLD_RELEASE);
		t = gu_now();
		probe_hold_ask(sock, HOLD_LEAVE);
		for (int i = 0; i < sh->n; i++)
			probe_make_and_hand(sock, va[i], sh->size, &h[i]);
		r->resume[r->nresume++] = gu_now() - t;
	}
	for (int i = 0; i < sh->n; i++) {
		CU_CK(cuMemUnmap(va[i], sh->size));
		CU_CK(cuMemRelease(h[i]));
		CU_CK(cuMemAddressFree(va[i], sh->size));
	}
	probe_hold_ask(sock, HOLD_RELEASE);
}

static void gmbd_round(gmb_client *c, const struct gu_shape *sh, struct way_res *r)
{
	void *p[MAX_N];
	double t0 = gu_now();

	for (int i = 0; i < sh->n; i++) {
		double t = gu_now();

		GMB_CK(c, gmb_malloc(c, &p[i], sh->size, 0, "probe"));
		probe_note(r, i, gu_now() - t);
	}
	r->whole[r->nrounds++] = gu_now() - t0;
	for (int k = 0; k < CYCLES; k++) {
		double t;

		GMB_CK(c, gmb_pause(c, "probe"));
		t = gu_now();
		GMB_CK(c, gmb_resume(c, "probe"));
		r->resume[r->nresume++] = gu_now() - t;
	}
	for (int i = 0; i < sh->n; i++)
		GMB_CK(c, gmb_free(c, p[i]));
}

/* A client of the gmbd on @sock, its libgmb polling $GMB_SPIN_US=@spin (NULL: default). */
static gmb_client *probe_connect(const char *sock, const char *spin)
{
	gmb_client *c = NULL;
	int r;

	if (spin)
		setenv("GMB_SPIN_US", spin, 1);
	else
		unsetenv("GMB_SPIN_US");
	r = gmb_connect(sock, "alloc_probe", &c);
	CHECK(r == 0, "gmb_connect(%s): %d %s", sock, r, gmb_last_error(NULL));
	unsetenv("GMB_SPIN_US");
	return c;
}

static void probe_print(const struct gu_shape *sh, struct way_res *res, const enum way *ways,
			int nways)
{
	double each[NWAYS], resume[NWAYS];

	for (int k = 0; k < nways; k++) {
		enum way w = ways[k];

		each[w] = gu_median(res[w].each, res[w].neach) * 1e3;
		resume[w] = gu_median(res[w].resume, res[w].nresume) * 1e3;
	}
	for (int k = 0; k < nways; k++) {
		enum way w = ways[k];

		printf("| %s | %s | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", k ? "" : sh->name,
		       way_names[w], each[w], each[WAY_LOCAL] / each[w],
		       gu_median(res[w].first, res[w].nrounds) * 1e3,
		       gu_median(res[w].whole, res[w].nrounds) * 1e3, resume[w],
		       resume[WAY_LOCAL] / resume[w]);
	}
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 5;
	int settle_ms = argc > 2 ? atoi(argv[2]) : 1000;
	const char *nospin = getenv("GMB_SOCKET_NOSPIN");
	bool have_nospin = nospin && *nospin;
	static struct way_res res[NSHAPES][NWAYS];
	gmb_client *c[NWAYS] = { NULL };
	enum way ways[NWAYS];
	int nways = 0, hold, status;
	char end = HOLD_END;
	CUcontext ctx;
	CUdevice dev;
	pid_t holder;

	gu_set_name("alloc_probe");
	CHECK(rounds >= 1 && rounds <= MAX_ROUNDS, "ROUNDS is 1 to %d", MAX_ROUNDS);
	CHECK(settle_ms >= 0, "SETTLE_MS is a number of milliseconds");
	for (int w = 0; w < NWAYS; w++)
		if (w != WAY_NOPOLL || have_nospin)
			ways[nways++] = (enum way)w;
	holder = gu_fork_peer(probe_holder, NULL, -1, &hold);
	gu_primary_ctx(&ctx, &dev);
	c[WAY_GMBD] = probe_connect(getenv("GMB_SOCKET"), NULL);
	if (have_nospin)
		c[WAY_NOPOLL] = probe_connect(nospin, "0");
	for (int s = 0; s < NSHAPES; s++)
		for (int r = 0; r < rounds; r++)
			for (int k = 0; k < nways; k++) {
				enum way w = ways[(k + r) % nways];

				usleep((useconds_t)settle_ms * 1000);
				if (w == WAY_LOCAL)
					local_round(&probe_shapes[s], &res[s][w]);
				else if (w == WAY_ADOPTED)
					adopted_round(hold, &probe_shapes[s], &res[s][w]);
				else
					gmbd_round(c[w], &probe_shapes[s], &res[s][w]);
			}
	CHECK(write(hold, &end, 1) == 1, "the holder's end");
	CHECK(waitpid(holder, &status, 0) == holder && WIFEXITED(status) &&
		      WEXITSTATUS(status) == 0,
	      "the holder failed");
	printf("alloc_probe: %d rounds, the GPU idle %d ms before each way; ms\n\n", rounds,
	       settle_ms);
	printf("| shape | way | an allocation | ratio | a round's first | whole shape | resume "
	       "| ratio |\n|---|---|---|---|---|---|---|---|\n");
	for (int s = 0; s < NSHAPES; s++)
		probe_print(&probe_shapes[s], res[s], ways, nways);
	for (int w = 0; w < NWAYS; w++)
		if (c[w])
			gmb_close(c[w]);
	gu_result("PASS", "%d rounds%s", rounds, have_nospin ? "" : " (no $GMB_SOCKET_NOSPIN)");
	return 0;
}
