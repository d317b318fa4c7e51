/*
 * two_gpus.cu - scenario 5: on a machine with two or more GPUs, memory asked
 * for on device d lands on device d.
 *
 * For device 0 and device 1: gmb_malloc 4 GiB on that device; the runtime
 * (cudaPointerGetAttributes) and the driver (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
 * both say the memory is on that device; the broker's used_bytes grows on
 * that device only; the driver's free memory drops on that device; a kernel
 * on that device writes and checks it, also after a pause/resume (PRESERVE).
 * Then a process started with CUDA_VISIBLE_DEVICES=1 calls that GPU its
 * device 0: its gmb_malloc on device 0 must land on gmbd's device 1 (libgmb
 * maps its device indexes to gmbd's by uuid).
 * Skips (exit 77) with fewer than two GPUs.
 */
#include "tests/gpu/gpu_util.h"

#define SIZE (4 * GiB)

static uint64_t dev_free(int dev)
{
	size_t f, t;

	CUDA_CK(cudaSetDevice(dev));
	CUDA_CK(cudaMemGetInfo(&f, &t));
	return f;
}

/* The child of the CUDA_VISIBLE_DEVICES=1 check: its device 0 is gmbd's device 1. */
static int visible_child(void)
{
	int n = 0;
	void *p = NULL;

	gu_set_name("two_gpus-visible");
	CUDA_CK(cudaGetDeviceCount(&n));
	CHECK(n == 1, "CUDA_VISIBLE_DEVICES=1 shows %d devices", n);
	gu_cuda_init(0);
	CU_CK(cuInit(0));
	gmb_client *c = gu_connect("two-gpus-visible");
	struct gu_dev_status b0 = gu_status(c, 0), b1 = gu_status(c, 1);

	GMB_CK(c, gmb_tag_set_mode(c, "vis", GMB_MODE_PRESERVE));
	GMB_CK(c, gmb_malloc(c, &p, 1 * GiB, 0, "vis"));
	struct gu_dev_status a0 = gu_status(c, 0), a1 = gu_status(c, 1);
	CHECK(a1.used >= b1.used + 1 * GiB && a0.used == b0.used,
	      "this process's device 0 went to gmbd's device %s (dev0 +%.2f GiB, dev1 +%.2f GiB)",
	      a1.used > b1.used ? "1" : "0", gu_gib(a0.used - b0.used), gu_gib(a1.used - b1.used));
	gu_fill(p, 1 * GiB, 0x7e000000ULL, 0);
	CUDA_CK(cudaDeviceSynchronize());
	GMB_CK(c, gmb_pause(c, "vis"));
	GMB_CK(c, gmb_resume(c, "vis"));
	CHECK(gu_check(p, 1 * GiB, 0x7e000000ULL) == 0, "bytes lost across pause/resume");
	GMB_CK(c, gmb_free(c, p));
	gmb_close(c);
	gu_result("PASS", "device 0 of a CUDA_VISIBLE_DEVICES=1 process is gmbd's device 1");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "visible") == 0)
		return visible_child();
	gu_set_name("two_gpus");
	int ndev = 0;
	char tag[16], detail[512] = "";
	size_t off = 0;

	CUDA_CK(cudaGetDeviceCount(&ndev));
	if (ndev < 2) {
		gu_result("SKIP", "%d GPU(s) on this machine; run on kind nvidia-h200-x2", ndev);
		return EXIT_SKIP;
	}
	for (int d = 0; d < 2; d++)
		gu_cuda_init(d);
	CU_CK(cuInit(0));
	gmb_client *c = gu_connect("two-gpus");
	gu_trim_all(c); /* so that new chunks show in the driver's free memory */

	for (int d = 0; d < 2; d++) {
		int other = 1 - d;
		void *p = NULL;
		struct gu_dev_status b_d = gu_status(c, d), b_o = gu_status(c, other);
		uint64_t f_d = dev_free(d);

		snprintf(tag, sizeof(tag), "dev%d", d);
		GMB_CK(c, gmb_tag_set_mode(c, tag, GMB_MODE_PRESERVE));
		CUDA_CK(cudaSetDevice(d));
		GMB_CK(c, gmb_malloc(c, &p, SIZE, d, tag));

		int rt = gu_ptr_device(p);
		int ord = -1;
		CU_CK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					    (CUdeviceptr)p));
		struct gu_dev_status a_d = gu_status(c, d), a_o = gu_status(c, other);
		uint64_t f_d2 = dev_free(d);
		printf("device %d: %p: runtime says device %d, driver ordinal %d; broker used on "
		       "dev%d +%.2f GiB, on dev%d +%.2f GiB; driver free on dev%d %.2f -> %.2f GiB\n",
		       d, p, rt, ord, d, gu_gib(a_d.used - b_d.used), other,
		       gu_gib(a_o.used - b_o.used), d, gu_gib(f_d), gu_gib(f_d2));
		CHECK(rt == d && ord == d, "memory asked for on device %d is on device %d/%d", d, rt,
		      ord);
		CHECK(f_d >= f_d2 + SIZE - 256 * MiB,
		      "driver free memory of device %d fell by only %.2f GiB for %.0f GiB", d,
		      gu_gib(f_d - f_d2), gu_gib(SIZE));
		CHECK(a_d.used >= b_d.used + SIZE && a_o.used == b_o.used,
		      "broker accounting: device %d grew %.2f GiB, device %d grew %.2f GiB", d,
		      gu_gib(a_d.used - b_d.used), other, gu_gib(a_o.used - b_o.used));

		CUDA_CK(cudaSetDevice(d));
		gu_fill(p, SIZE, 0x2d000000ULL + (uint64_t)d, 0);
		CUDA_CK(cudaDeviceSynchronize());
		unsigned long long bad = gu_check(p, SIZE, 0x2d000000ULL + (uint64_t)d);
		CHECK(bad == 0, "kernel on device %d: %llu wrong words", d, bad);
		GMB_CK(c, gmb_pause(c, tag));
		GMB_CK(c, gmb_resume(c, tag));
		CUDA_CK(cudaSetDevice(d));
		CHECK(gu_ptr_device(p) == d, "after resume %p is not on device %d", p, d);
		bad = gu_check(p, SIZE, 0x2d000000ULL + (uint64_t)d);
		CHECK(bad == 0, "device %d after pause/resume: %llu wrong words", d, bad);
		off += (size_t)snprintf(detail + off, sizeof(detail) - off,
					"%sdev%d: runtime %d driver %d, kernel ok, resume ok", d ? "; " : "",
					d, rt, ord);
		GMB_CK(c, gmb_free(c, p));
	}
	gu_print_status(c, "two_gpus");
	gmb_close(c);

	char *vargv[] = { argv[0], (char *)"visible", NULL };
	setenv("CUDA_VISIBLE_DEVICES", "1", 1);
	pid_t pid = gu_spawn_self(vargv, -1);
	unsetenv("CUDA_VISIBLE_DEVICES");
	int rc = gu_wait_child(pid, 120);
	CHECK(rc == 0, "the CUDA_VISIBLE_DEVICES=1 process failed (exit %d)", rc);
	gu_result("PASS", "%d GPUs; %s; CUDA_VISIBLE_DEVICES=1: device 0 is gmbd's 1", ndev,
		  detail);
	return 0;
}
