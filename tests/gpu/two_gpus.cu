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
 * maps its device indexes to gmbd's by uuid); so must one started with
 * CUDA_VISIBLE_DEVICES=GPU-<uuid 1>,GPU-<uuid 0> (both visible, swapped).
 * With one GPU it checks what one allows (CUDA_VISIBLE_DEVICES=GPU-<uuid 0>
 * lands on gmbd's device 0) and reports SKIP (exit 77) for the rest.
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

/*
 * The child of the CUDA_VISIBLE_DEVICES checks: its device 0 must be gmbd's
 * device @want, of @ngmbd. @nvis: how many devices it must see.
 */
static int visible_child(int want, int ngmbd, int nvis)
{
	struct gu_dev_status b[2], a[2];
	int n = 0;
	void *p = NULL;

	gu_set_name("two_gpus-visible");
	CHECK(ngmbd >= 1 && ngmbd <= 2 && want < ngmbd, "gmbd devices %d, want %d", ngmbd, want);
	CUDA_CK(cudaGetDeviceCount(&n));
	CHECK(n == nvis, "CUDA_VISIBLE_DEVICES=%s shows %d devices, want %d",
	      getenv("CUDA_VISIBLE_DEVICES"), n, nvis);
	gu_cuda_init(0);
	CU_CK(cuInit(0));
	gmb_client *c = gu_connect("two-gpus-visible");
	for (int d = 0; d < ngmbd; d++)
		b[d] = gu_status(c, d);
	GMB_CK(c, gmb_tag_set_mode(c, "vis", GMB_MODE_PRESERVE));
	GMB_CK(c, gmb_malloc(c, &p, 1 * GiB, 0, "vis"));
	for (int d = 0; d < ngmbd; d++) {
		a[d] = gu_status(c, d);
		CHECK(d == want ? a[d].used >= b[d].used + 1 * GiB : a[d].used == b[d].used,
		      "CUDA_VISIBLE_DEVICES=%s: device 0 of this process should be gmbd's %d, "
		      "but gmbd's device %d grew %.2f GiB", getenv("CUDA_VISIBLE_DEVICES"), want,
		      d, gu_gib(a[d].used - b[d].used));
	}
	gu_fill(p, 1 * GiB, 0x7e000000ULL, 0);
	CUDA_CK(cudaDeviceSynchronize());
	GMB_CK(c, gmb_pause(c, "vis"));
	GMB_CK(c, gmb_resume(c, "vis"));
	CHECK(gu_check(p, 1 * GiB, 0x7e000000ULL) == 0, "bytes lost across pause/resume");
	GMB_CK(c, gmb_free(c, p));
	gmb_close(c);
	gu_result("PASS", "device 0 of a CUDA_VISIBLE_DEVICES=%s process is gmbd's device %d",
		  getenv("CUDA_VISIBLE_DEVICES"), want);
	return 0;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as CUDA_VISIBLE_DEVICES takes it. */
static void uuid_name(int dev, char out[64])
{
	cudaDeviceProp prop;
	const unsigned char *u;

	CUDA_CK(cudaGetDeviceProperties(&prop, dev));
	u = (const unsigned char *)prop.uuid.bytes;
	snprintf(out, 64,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
		 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
		 u[14], u[15]);
}

/* Runs the visible child under CUDA_VISIBLE_DEVICES=@vis; fails the test if it fails. */
static void run_visible(char *self, const char *vis, int want, int ngmbd, int nvis)
{
	char w[8], g[8], v[8];
	char *vargv[] = { self, (char *)"visible", w, g, v, NULL };

	snprintf(w, sizeof(w), "%d", want);
	snprintf(g, sizeof(g), "%d", ngmbd);
	snprintf(v, sizeof(v), "%d", nvis);
	setenv("CUDA_VISIBLE_DEVICES", vis, 1);
	pid_t pid = gu_spawn_self(vargv, -1);
	unsetenv("CUDA_VISIBLE_DEVICES");
	int rc = gu_wait_child(pid, 120);
	CHECK(rc == 0, "the CUDA_VISIBLE_DEVICES=%s process failed (exit %d)", vis, rc);
}

int main(int argc, char **argv)
{
	if (argc > 4 && strcmp(argv[1], "visible") == 0)
		return visible_child(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	gu_set_name("two_gpus");
	int ndev = 0;
	char tag[16], detail[512] = "", u0[64], u1[64], both[160];
	size_t off = 0;

	CUDA_CK(cudaGetDeviceCount(&ndev));
	if (ndev < 2) {
		CHECK(ndev == 1, "no GPU");
		uuid_name(0, u0);
		run_visible(argv[0], u0, 0, 1, 1);
		gu_result("SKIP", "1 GPU: CUDA_VISIBLE_DEVICES=%s lands on gmbd's device 0; the "
				  "two-device part needs kind nvidia-h200-x2", u0);
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

	run_visible(argv[0], "1", 1, 2, 1);
	uuid_name(0, u0);
	uuid_name(1, u1);
	snprintf(both, sizeof(both), "%s,%s", u1, u0);
	run_visible(argv[0], both, 1, 2, 2);
	gu_result("PASS", "%d GPUs; %s; CUDA_VISIBLE_DEVICES=1 and =GPU-<uuid 1>,GPU-<uuid 0>: "
			  "device 0 is gmbd's 1", ndev, detail);
	return 0;
}
