/*
 * budget.cu - scenario 3: a request beyond the budget fails with -ENOMEM and
 * a message naming the holder, and the daemon keeps serving.
 *
 * Runs against a gmbd started with --budget (tests/gpu/run.sh starts a second
 * one with --budget 8GiB on its own socket; GMB_SOCKET points at it). Two
 * clients of this process: "budget-holder" takes 6 GiB, "budget-asker" asks
 * for 4 GiB (-ENOMEM expected, with gmb_last_error() naming the holder), then
 * for 1 GiB (served, written, verified). Then the resume path: the holder
 * pauses, the asker takes 4 GiB more, the holder's resume must fail with
 * -ENOMEM and leave the tag paused; once the asker frees, the resume works
 * and the holder's bytes (PRESERVE) are intact.
 *
 * Env: GMB_BUDGET_GIB (8): the budget the daemon was started with.
 */
#include "tests/gpu/gpu_util.h"

#define HOLD_SEED 0x401d0000ULL
#define ASK_SEED 0xa5c00000ULL

int main(void)
{
	gu_set_name("budget");
	const char *e = getenv("GMB_BUDGET_GIB");
	uint64_t budget = (e && *e ? strtoull(e, NULL, 0) : 8) * GiB;
	uint64_t hold = budget * 3 / 4, ask = budget / 2;
	void *ph = NULL, *pa = NULL, *ps = NULL, *pb = NULL;
	char msg1[1024], msg2[1024];

	gu_cuda_init(0);
	gmb_client *h = gu_connect("budget-holder");
	gmb_client *a = gu_connect("budget-asker");
	struct gu_dev_status st = gu_status(a, 0);
	printf("broker: total %.1f GiB, budget %.2f GiB (expected %.2f), used %.2f GiB\n",
	       gu_gib(st.total), gu_gib(st.budget), gu_gib(budget), gu_gib(st.used));
	CHECK(st.budget == budget, "broker budget is %" PRIu64 " bytes, expected %" PRIu64,
	      st.budget, budget);

	GMB_CK(h, gmb_tag_set_mode(h, "held", GMB_MODE_PRESERVE));
	GMB_CK(h, gmb_malloc(h, &ph, hold, 0, "held"));
	gu_fill(ph, hold, HOLD_SEED, 0);
	CUDA_CK(cudaDeviceSynchronize());

	/* Beyond the budget: -ENOMEM and a message that names the holder. */
	int r = gmb_malloc(a, &pa, ask, 0, "ask");
	snprintf(msg1, sizeof(msg1), "%s", gmb_last_error(a));
	printf("asker: gmb_malloc(%.1f GiB) with %.1f GiB held = %d (%s): \"%s\"\n", gu_gib(ask),
	       gu_gib(hold), r, gmb_strerror(r), msg1);
	CHECK(r == -ENOMEM, "a request beyond the budget returned %d (%s), not -ENOMEM", r,
	      gmb_strerror(r));
	CHECK(msg1[0] != '\0', "-ENOMEM came without a message");
	char pidstr[16];
	snprintf(pidstr, sizeof(pidstr), "%d", (int)getpid());
	CHECK(strstr(msg1, "budget-holder") || strstr(msg1, pidstr),
	      "the -ENOMEM message does not name the holder (budget-holder, pid %s): \"%s\"", pidstr,
	      msg1);

	/* The daemon keeps serving: a request that fits works and the memory is real. */
	GMB_CK(a, gmb_malloc(a, &ps, GiB, 0, "ask"));
	gu_fill(ps, GiB, ASK_SEED, 0);
	CHECK(gu_check(ps, GiB, ASK_SEED) == 0, "the 1 GiB served after -ENOMEM does not hold data");
	printf("asker: 1 GiB after the refusal: served at %p, written and verified\n", ps);

	/* Resume beyond the budget: -ENOMEM, the tag stays paused, later it works. */
	GMB_CK(h, gmb_pause(h, "held"));
	uint64_t more = budget - GiB - hold / 2; /* fits while the holder is paused, not after */
	more = more / (2 * MiB) * (2 * MiB);
	GMB_CK(a, gmb_malloc(a, &pb, more, 0, "ask"));
	r = gmb_resume(h, "held");
	snprintf(msg2, sizeof(msg2), "%s", gmb_last_error(h));
	printf("holder: gmb_resume with the asker holding %.2f GiB = %d (%s): \"%s\"\n",
	       gu_gib(GiB + more), r, gmb_strerror(r), msg2);
	CHECK(r == -ENOMEM, "a resume beyond the budget returned %d (%s), not -ENOMEM", r,
	      gmb_strerror(r));
	CHECK(msg2[0] != '\0', "the resume's -ENOMEM came without a message");
	r = gmb_malloc(h, &pa, 2 * MiB, 0, "held");
	CHECK(r == -EBUSY, "the refused tag is not paused any more (gmb_malloc in it = %d %s)", r,
	      gmb_strerror(r));
	GMB_CK(a, gmb_free(a, pb));
	GMB_CK(h, gmb_resume(h, "held"));
	unsigned long long bad = gu_check(ph, hold, HOLD_SEED);
	CHECK(bad == 0, "%llu wrong words in the holder's preserved tag after the late resume", bad);

	st = gu_status(a, 0);
	printf("broker still serving: used %.2f GiB of %.2f\n", gu_gib(st.used), gu_gib(st.budget));
	gu_print_status(a, "budget");
	GMB_CK(a, gmb_free(a, ps));
	GMB_CK(h, gmb_free(h, ph));
	gmb_close(a);
	gmb_close(h);
	gu_result("PASS",
		  "budget %.0f GiB: %.0f GiB beyond it -> -ENOMEM \"%.200s\"; 1 GiB next served; "
		  "resume beyond it -> -ENOMEM, tag stayed paused, resumed intact later",
		  gu_gib(budget), gu_gib(ask), msg1);
	return 0;
}
