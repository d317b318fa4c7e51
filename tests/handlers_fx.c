/*
 * handlers_fx.c - gmbd's layers on a uv loop for tests (handlers_fx.h).
 */
#include "tests/handlers_fx.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/wire.h"

int hfx_start(struct hfx *fx, const struct backend_host_opts *ho, const struct broker_opts *bo,
	      uint64_t control_timeout_ms)
{
	int r;

	r = uv_loop_init(&fx->loop);
	if (r < 0)
		return r;
	r = backend_host_open(ho, &fx->be);
	if (r < 0)
		goto cleanup_loop;
	r = broker_new(fx->be, bo, &fx->br);
	if (r < 0)
		goto cleanup_backend;
	r = handlers_init(&fx->h, &fx->loop, fx->br, control_timeout_ms);
	if (r < 0)
		goto cleanup_broker;
	r = server_start(&fx->loop, -1, &handlers_sess_ops, &fx->h, &fx->srv);
	if (r < 0)
		goto cleanup_handlers;
	return 0;

cleanup_handlers:
	handlers_close(&fx->h);
	uv_run(&fx->loop, UV_RUN_DEFAULT); /* the timers' close callbacks */
cleanup_broker:
	broker_free(fx->br);
cleanup_backend:
	backend_close(fx->be);
cleanup_loop:
	uv_loop_close(&fx->loop);
	return r;
}

void hfx_stop(struct hfx *fx)
{
	server_stop(fx->srv);
	fx->srv = NULL;
	handlers_close(&fx->h);
	uv_run(&fx->loop, UV_RUN_DEFAULT);
}

int hfx_free(struct hfx *fx)
{
	broker_free(fx->br);
	fx->br = NULL;
	backend_close(fx->be);
	fx->be = NULL;
	return uv_loop_close(&fx->loop);
}

int hfx_client(struct hfx *fx, int *fd)
{
	int sv[2], r;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
		return -errno;
	r = server_adopt(fx->srv, sv[1]);
	if (r < 0) {
		close(sv[0]);
		close(sv[1]);
		return r;
	}
	*fd = sv[0];
	return 0;
}

void hfx_spin(struct hfx *fx)
{
	for (int i = 0; i < 4; i++)
		uv_run(&fx->loop, UV_RUN_NOWAIT);
}

uint64_t hfx_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int hfx_recv(struct hfx *fx, int fd, Gmb__Envelope **env, int *fds, int *nfds, int wait_ms)
{
	uint64_t end = hfx_now_ms() + (uint64_t)wait_ms;
	int r;

	*env = NULL;
	*nfds = 0;
	while ((r = wire_recv(fd, env, fds, nfds)) == -EAGAIN) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (hfx_now_ms() >= end)
			return -ETIMEDOUT;
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		poll(&p, 1, 1);
	}
	return r;
}
