/*
 * uid_isolation.cu - scenario 7: a client running as another Unix user never
 * reads the bytes of the first one.
 *
 * Root (this process) writes a pattern into 16 GiB that it frees and 16 GiB
 * that it pauses (DISCARD): with a warm pool, 32 GiB of root's bytes now sit
 * in the broker's free chunks. A child (role "child", posix_spawn) drops to
 * uid/gid 65534 before it touches CUDA, connects, and:
 *   - allocates 1 GiB: a broker that served it from the pool as is would
 *     hand it root's bytes;
 *   - allocates most of what is left of the GPU, which needs root's chunks
 *     back through the driver (which zeroes them);
 * and counts non-zero words in both: every word must be zero. It then
 * writes its own pattern and exits. Root resumes its paused tag and must
 * find none of the child's pattern in it (the other direction).
 *
 * Needs root (setuid) and a socket that uid 65534 can reach: run.sh makes
 * the socket's folder 0711 and the socket 0666.
 */
#include "tests/gpu/gpu_util.h"

#include <grp.h>

#define ROOT_PAT 0xa5a5a5a5a5a5a5a5ULL
#define CHILD_PAT 0x5a5a5a5a5a5a5a5aULL
#define NOBODY 65534
#define DIRTY_EACH (16 * GiB)
#define PIECE (8 * GiB)
#define MARGIN (3 * GiB)

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Allocates @bytes in @tag in pieces; returns how many words were not zero. */
static unsigned long long child_take(gmb_client *c, uint64_t bytes, const char *tag,
				     unsigned long long *root_words, void **p, int *n)
{
	unsigned long long nonzero = 0;

	for (uint64_t left = bytes; left; (*n)++) {
		uint64_t sz = min_u64(left, PIECE);
		GMB_CK(c, gmb_malloc(c, &p[*n], sz, 0, tag));
		nonzero += gu_count(p[*n], sz, 0, 0);
		*root_words += gu_count(p[*n], sz, ROOT_PAT, 1);
		gu_set(p[*n], sz, CHILD_PAT, 0);
		left -= sz;
	}
	CUDA_CK(cudaDeviceSynchronize());
	return nonzero;
}

static int role_child(int argc, char **argv)
{
	void *p[64];
	int n = 0;
	unsigned long long rw1 = 0, rw2 = 0;

	gu_set_name("uid_isolation/child");
	CHECK(argc >= 4, "usage: child SMALL BIG");
	uint64_t small = strtoull(argv[2], NULL, 0), big = strtoull(argv[3], NULL, 0);
	CHECK(setgroups(0, NULL) == 0 && setgid(NOBODY) == 0 && setuid(NOBODY) == 0,
	      "cannot drop to uid %d: %s", NOBODY, strerror(errno));
	CHECK(getuid() == NOBODY && geteuid() == NOBODY, "still uid %d", (int)geteuid());
	setenv("HOME", "/tmp", 1);

	gu_cuda_init(0);
	gmb_client *c = gu_connect("uid-nobody");
	unsigned long long nz1 = child_take(c, small, "probe", &rw1, p, &n);
	printf("uid %d: %.1f GiB (the warm pool's first pick): %llu non-zero words, %llu words "
	       "of root's pattern\n",
	       (int)getuid(), gu_gib(small), nz1, rw1);
	unsigned long long nz2 = child_take(c, big, "big", &rw2, p, &n);
	printf("uid %d: %.1f GiB more (needs root's chunks back through the driver): %llu "
	       "non-zero words, %llu words of root's pattern\n",
	       (int)getuid(), gu_gib(big), nz2, rw2);
	gu_print_status(c, "uid 65534 holding its memory");
	for (int i = 0; i < n; i++)
		GMB_CK(c, gmb_free(c, p[i]));
	gmb_close(c);
	CHECK(nz1 + nz2 == 0, "uid %d read %llu non-zero words (%llu of root's pattern) in memory "
	      "the broker just lent it", NOBODY, nz1 + nz2, rw1 + rw2);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "child") == 0)
		return role_child(argc, argv);
	gu_set_name("uid_isolation");

	void *p[64];
	int nfree = (int)(DIRTY_EACH / GiB);
	size_t drv_free, drv_total;
	char sbuf[32], bbuf[32];

	if (geteuid() != 0) {
		gu_result("SKIP", "needs root to start a client as uid %d", NOBODY);
		return EXIT_SKIP;
	}
	gu_cuda_init(0);
	gmb_client *c = gu_connect("uid-root");
	gu_trim_all(c); /* the pool's free chunks will be root's dirty ones only */
	for (int i = 0; i < nfree; i++) {
		GMB_CK(c, gmb_malloc(c, &p[i], GiB, 0, "secret-free"));
		gu_set(p[i], GiB, ROOT_PAT, 0);
	}
	void *paused = NULL;
	GMB_CK(c, gmb_malloc(c, &paused, DIRTY_EACH, 0, "secret-paused"));
	gu_set(paused, DIRTY_EACH, ROOT_PAT, 0);
	CUDA_CK(cudaDeviceSynchronize());
	for (int i = 0; i < nfree; i++)
		GMB_CK(c, gmb_free(c, p[i]));
	GMB_CK(c, gmb_pause(c, "secret-paused"));

	struct gu_dev_status st = gu_status(c, 0);
	CUDA_CK(cudaMemGetInfo(&drv_free, &drv_total));
	uint64_t budget = st.budget ? st.budget : st.total;
	uint64_t avail = min_u64(budget > st.used ? budget - st.used : 0,
				 drv_free + (st.pool > st.used ? st.pool - st.used : 0));
	uint64_t small = GiB;
	uint64_t big = avail > small + MARGIN ? (avail - small - MARGIN) / GiB * GiB : 0;
	printf("root wrote %.0f GiB of 0x%016llx, freed half, paused half; broker pool %.1f GiB "
	       "(used %.1f); the child will ask for %.0f + %.0f GiB\n",
	       gu_gib(2 * DIRTY_EACH), ROOT_PAT, gu_gib(st.pool), gu_gib(st.used), gu_gib(small),
	       gu_gib(big));
	CHECK(big > 2 * DIRTY_EACH, "only %.1f GiB left for the child: not enough to need root's "
	      "memory", gu_gib(big));

	snprintf(sbuf, sizeof(sbuf), "%" PRIu64, small);
	snprintf(bbuf, sizeof(bbuf), "%" PRIu64, big);
	char *cargv[] = { argv[0], (char *)"child", sbuf, bbuf, NULL };
	pid_t pid = gu_spawn_self(cargv, -1);
	int rc = gu_wait_child(pid, 300);
	CHECK(rc == 0, "the uid %d client failed (exit %d%s)", NOBODY, rc,
	      rc < 0 ? ", timed out" : "");

	int r = gmb_resume(c, "secret-paused");
	CHECK(r == 0, "root's resume after the uid %d client left: %d %s: %s", NOBODY, r,
	      gmb_strerror(r), gmb_last_error(c));
	unsigned long long theirs = gu_count(paused, DIRTY_EACH, CHILD_PAT, 1);
	CHECK(theirs == 0, "root's resumed tag holds %llu words of uid %d's pattern", theirs, NOBODY);
	GMB_CK(c, gmb_free(c, paused));
	gmb_close(c);
	gu_result("PASS",
		  "uid %d read only zeros in %.0f GiB lent after root left %.0f GiB of its bytes in "
		  "the pool; root's resumed tag held none of uid %d's bytes",
		  NOBODY, gu_gib(small + big), gu_gib(2 * DIRTY_EACH), NOBODY);
	return 0;
}
