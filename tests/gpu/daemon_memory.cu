/*
 * daemon_memory.cu - scenario 6: gmbd holds no CUDA context, so its own GPU
 * memory stays at the few MiB of cuInit (goal: <= 4 MiB) while clients hold
 * memory through it.
 *
 * This client holds 8 GiB (written by a kernel) while it asks nvidia-smi
 * for every compute process's GPU memory and looks for gmbd's pid
 * ($GMBD_PID, set by tests/gpu/run.sh). A process with no context is not
 * listed at all: that counts as 0 MiB (PASS). The raw nvidia-smi lines are
 * printed either way.
 */
#include "tests/gpu/gpu_util.h"

#define HOLD (8 * GiB)
#define LIMIT_MIB 4

int main(void)
{
	gu_set_name("daemon_memory");
	const char *pidenv = getenv("GMBD_PID");
	char raw[8192] = "";
	void *p = NULL;

	CHECK(pidenv && *pidenv, "GMBD_PID is not set");
	long gpid = atol(pidenv);
	gu_cuda_init(0);
	gmb_client *c = gu_connect("daemon-memory");
	GMB_CK(c, gmb_malloc(c, &p, HOLD, 0, "hold"));
	gu_fill(p, HOLD, 0x6d6d0000ULL, 0);
	CUDA_CK(cudaDeviceSynchronize());
	struct gu_dev_status st = gu_status(c, 0);
	long used = gu_smi_process_mib(gpid, raw, sizeof(raw));
	printf("nvidia-smi --query-compute-apps=pid,process_name,used_memory (MiB); gmbd is pid "
	       "%ld; the broker lends %.1f GiB:\n%s",
	       gpid, gu_gib(st.used), raw);
	GMB_CK(c, gmb_free(c, p));
	gmb_close(c);

	if (used == -3) {
		gu_result("SKIP", "nvidia-smi could not run or failed: %.200s", raw);
		return EXIT_SKIP;
	}
	if (used == -2) {
		gu_result("SKIP", "nvidia-smi lists gmbd (pid %ld) with memory N/A", gpid);
		return EXIT_SKIP;
	}
	if (used == -1) {
		gu_result("PASS",
			  "gmbd (pid %ld) is not among nvidia-smi's compute apps while %.0f GiB are "
			  "lent: no context, 0 MiB",
			  gpid, gu_gib(st.used));
		return 0;
	}
	CHECK(used <= LIMIT_MIB, "gmbd (pid %ld) uses %ld MiB of GPU memory (limit %d MiB)", gpid,
	      used, LIMIT_MIB);
	gu_result("PASS", "gmbd (pid %ld) uses %ld MiB of GPU memory (limit %d) while %.0f GiB are "
		  "lent", gpid, used, LIMIT_MIB, gu_gib(st.used));
	return 0;
}
