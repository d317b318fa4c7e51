/*
 * pause_resume.c - a worker's life with gmbd: allocate in two tags, pause
 * (memory back to gmbd), resume at the same addresses.
 *
 * Build and run against the build tree, with gmbd running
 * (make run, or gmbd --backend host on a socket of your own):
 *     cc -Iinclude examples/pause_resume.c -Lbuild -lgmb -o pause_resume
 *     GMB_SOCKET=run/gmbd.sock LD_LIBRARY_PATH=build ./pause_resume
 * or against an installed libgmb:
 *     cc pause_resume.c $(pkg-config --cflags --libs gmb) -o pause_resume
 *
 * The sizes fit the host backend's default device (8 GiB). Exit status 0
 * on success, 1 with the reason on stderr otherwise.
 */
#include <stdio.h>
#include <stdlib.h>

#include <gmb.h>

#define MiB (1ULL << 20)

/* Says what failed and why: gmbd's sentence when there is one. */
static int fail(gmb_client *c, const char *what, int err)
{
	const char *why = c ? gmb_last_error(c) : "";

	fprintf(stderr, "pause_resume: %s: %s%s%s\n", what, gmb_strerror(err), *why ? ": " : "",
		why);
	return err;
}

/* Allocates, pauses and resumes; every allocation is freed by gmb_close. */
static int run(gmb_client *c)
{
	void *weights, *kv;
	char *status;
	int r;

	/* PRESERVE: the bytes are copied to host memory on pause and back on resume. */
	r = gmb_tag_set_mode(c, "weights", GMB_MODE_PRESERVE);
	if (r < 0)
		return fail(c, "gmb_tag_set_mode weights", r);
	r = gmb_malloc(c, &weights, 256 * MiB, 0, "weights");
	if (r < 0)
		return fail(c, "gmb_malloc weights", r);
	/* The default mode, DISCARD: a KV cache need not survive a pause. */
	r = gmb_malloc(c, &kv, 1024 * MiB, 0, "kv");
	if (r < 0)
		return fail(c, "gmb_malloc kv", r);
	/* ... use weights and kv on device 0, capture CUDA graphs over them ... */

	r = gmb_pause(c, NULL); /* every tag: the memory goes back to gmbd */
	if (r < 0)
		return fail(c, "gmb_pause", r);
	r = gmb_status_text(c, &status); /* what `gmbctl status` prints */
	if (r < 0)
		return fail(c, "gmb_status_text", r);
	printf("paused:\n%s", status);
	free(status);

	/* ... another process uses the GPU ... */
	/* The pointers stay valid while paused: only the memory behind them goes. */
	r = gmb_resume(c, NULL); /* mapped again at the same addresses, the weights' bytes back */
	if (r < 0)
		return fail(c, "gmb_resume", r);
	printf("resumed: weights at %p, kv at %p\n", weights, kv);

	r = gmb_free(c, kv);
	if (r < 0)
		return fail(c, "gmb_free kv", r);
	r = gmb_free(c, weights);
	if (r < 0)
		return fail(c, "gmb_free weights", r);
	return 0;
}

int main(void)
{
	gmb_client *c = NULL;
	int r;

	/* NULL: $GMB_SOCKET, else /run/gmbd/gmbd.sock. */
	r = gmb_connect(NULL, "pause-resume-example", &c);
	if (r < 0) {
		fail(NULL, "cannot connect to gmbd (is it running? $GMB_SOCKET?)", r);
		return 1;
	}
	r = run(c);
	gmb_close(c);
	return r < 0 ? 1 : 0;
}
