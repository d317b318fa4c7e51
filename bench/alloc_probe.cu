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
 *            unset).
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
#include "tests/gpu/gpu_util.h"

#define MAX_N	   64
#define MAX_ROUNDS 16
#define CYCLES	   3 /* pause + resume per round and way */

static const struct gu_shape probe_shapes[] = {
	{ "16 x 1 GiB", 16, GiB },
	{ "64 x 20 MiB", 64, 20 * MiB },
};
#define NSHAPES (int)(sizeof(probe_shapes) / sizeof(probe_shapes[0]))

enum way { WAY_LOCAL, WAY_GMBD, WAY_NOPOLL, NWAYS };
static const char *const way_names[NWAYS] = { "local", "gmbd", "gmbd, no poll" };

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

static void probe_print(const struct gu_shape *sh, struct way_res *res, int nways)
{
	double each[NWAYS], whole[NWAYS], resume[NWAYS];

	for (int w = 0; w < nways; w++) {
		each[w] = gu_median(res[w].each, res[w].neach) * 1e3;
		whole[w] = gu_median(res[w].whole, res[w].nrounds) * 1e3;
		resume[w] = gu_median(res[w].resume, res[w].nresume) * 1e3;
	}
	for (int w = 0; w < nways; w++)
		printf("| %s | %s | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
		       w ? "" : sh->name, way_names[w], each[w], each[0] / each[w],
		       gu_median(res[w].first, res[w].nrounds) * 1e3, whole[w], resume[w],
		       resume[0] / resume[w]);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 5;
	int settle_ms = argc > 2 ? atoi(argv[2]) : 1000;
	const char *nospin = getenv("GMB_SOCKET_NOSPIN");
	int nways = nospin && *nospin ? NWAYS : WAY_NOPOLL;
	static struct way_res res[NSHAPES][NWAYS];
	gmb_client *c[NWAYS] = { NULL };
	CUcontext ctx;
	CUdevice dev;

	gu_set_name("alloc_probe");
	CHECK(rounds >= 1 && rounds <= MAX_ROUNDS, "ROUNDS is 1 to %d", MAX_ROUNDS);
	CHECK(settle_ms >= 0, "SETTLE_MS is a number of milliseconds");
	gu_primary_ctx(&ctx, &dev);
	c[WAY_GMBD] = probe_connect(getenv("GMB_SOCKET"), NULL);
	if (nways == NWAYS)
		c[WAY_NOPOLL] = probe_connect(nospin, "0");
	for (int s = 0; s < NSHAPES; s++)
		for (int r = 0; r < rounds; r++)
			for (int k = 0; k < nways; k++) {
				int w = (k + r) % nways;

				usleep((useconds_t)settle_ms * 1000);
				if (w == WAY_LOCAL)
					local_round(&probe_shapes[s], &res[s][w]);
				else
					gmbd_round(c[w], &probe_shapes[s], &res[s][w]);
			}
	printf("alloc_probe: %d rounds, the GPU idle %d ms before each way; ms\n\n", rounds,
	       settle_ms);
	printf("| shape | way | an allocation | ratio | a round's first | whole shape | resume "
	       "| ratio |\n|---|---|---|---|---|---|---|---|\n");
	for (int s = 0; s < NSHAPES; s++)
		probe_print(&probe_shapes[s], res[s], nways);
	for (int w = WAY_GMBD; w < nways; w++)
		gmb_close(c[w]);
	gu_result("PASS", "%d rounds%s", rounds, nways == NWAYS ? "" : " (no $GMB_SOCKET_NOSPIN)");
	return 0;
}
