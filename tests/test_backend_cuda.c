/*
 * test_backend_cuda.c - the CUDA backend where there is no GPU: one build
 * of gmbd runs here, `--backend cuda` fails with one clear line, `auto`
 * falls back to host memory and says why. With the toolkit's stub
 * libcuda (which loads but answers CUDA_ERROR_STUB_LIBRARY), the whole
 * dlopen + cuGetProcAddress path runs up to cuInit.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "tests/util.h"

#define CAP  8192
#define STUB "/usr/local/cuda/lib64/stubs/libcuda.so"

static char out[CAP], err[CAP];

static int lines(const char *s)
{
	int n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static int gmbd_run(const char *backend, const char *const env[])
{
	char bin[256];
	char *argv[] = { bin, "--backend", (char *)backend, "--socket", "/tmp/gmb-cuda-test.sock",
			 NULL };

	snprintf(bin, sizeof(bin), "%s/gmbd", test_build_dir());
	return run_capture(argv, env, out, err, CAP);
}

Test(backend_cuda, open_without_a_driver_is_enodev_with_a_reason)
{
	struct backend *b = NULL;
	int rc = backend_cuda_open(&b);

	if (rc == 0) {
		backend_close(b);
		cr_skip_test("a CUDA driver answers on this machine");
	}
	cr_assert(eq(i32, rc, -ENODEV));
	cr_assert(not(eq(ptr, strstr(backend_last_error(), "cuda backend"), NULL)), "%s",
		  backend_last_error());
}

Test(backend_cuda, gmbd_backend_cuda_exits_1_with_one_line)
{
	struct backend *b = NULL;

	if (backend_cuda_open(&b) == 0) {
		backend_close(b);
		cr_skip_test("a CUDA driver answers on this machine");
	}
	cr_assert(eq(i32, gmbd_run("cuda", NULL), 1));
	cr_assert(eq(i32, lines(err), 1), "one line: %s", err);
	cr_assert(not(eq(ptr, strstr(err, "cuda"), NULL)), "%s", err);
	cr_assert(eq(sz, strlen(out), 0));
}

Test(backend_cuda, stub_driver_fails_at_cuinit)
{
	char dir[] = "/tmp/gmbstub.XXXXXX", link[300], env[320];
	const char *envp[] = { env, NULL };

	if (access(STUB, R_OK))
		cr_skip_test("no CUDA toolkit stub library at " STUB);
	cr_assert(not(eq(ptr, mkdtemp(dir), NULL)));
	snprintf(link, sizeof(link), "%s/libcuda.so.1", dir);
	cr_assert(eq(i32, symlink(STUB, link), 0));
	snprintf(env, sizeof(env), "LD_LIBRARY_PATH=%s", dir);
	cr_assert(eq(i32, gmbd_run("cuda", envp), 1));
	cr_assert(eq(i32, lines(err), 1), "one line: %s", err);
	cr_assert(not(eq(ptr, strstr(err, "cuInit"), NULL)), "the driver's own failure: %s", err);
	unlink(link);
	rmdir(dir);
}

Test(backend_cuda, auto_falls_back_to_host_and_says_so)
{
	static const char *const args[] = { "--backend", "auto", NULL };
	struct gmbd_proc d;
	struct backend *b = NULL;

	if (backend_cuda_open(&b) == 0) {
		backend_close(b);
		cr_skip_test("a CUDA driver answers on this machine");
	}
	/* gmbd_start passes --backend host first; the later --backend auto wins. */
	char *log = NULL;
	size_t len = 0;
	FILE *f;

	cr_assert(eq(i32, gmbd_start(&d, args), 0), "auto must start without a GPU");
	f = fopen(d.log, "r");
	cr_assert(not(eq(ptr, f, NULL)));
	cr_assert(gt(i64, getdelim(&log, &len, 0, f), 0));
	fclose(f);
	cr_assert(not(eq(ptr, strstr(log, "backend=host"), NULL)), "%s", log);
	cr_assert(not(eq(ptr, strstr(log, "cuda"), NULL)), "the reason is given: %s", log);
	free(log);
	cr_assert(eq(i32, gmbd_stop(&d), 0));
}
