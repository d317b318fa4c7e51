/*
 * http.h - the smallest HTTP/1.1 server that Prometheus can scrape: GET
 * /metrics on one TCP address, one response per connection, then close.
 */
#ifndef GMB_METRICS_HTTP_H
#define GMB_METRICS_HTTP_H

#include <stddef.h>
#include <uv.h>

/* The body of a scrape: *@out malloc'd (the server frees it). 0 or -errno. */
typedef int (*mhttp_render_cb)(void *arg, char **out, size_t *len);

struct mhttp;

/**
 * mhttp_start() - listen on @addr ("127.0.0.1:9464", "[::1]:0") on @loop.
 * *@out is the caller's until mhttp_stop(); *@port gets the port bound.
 * Return: 0, -EINVAL (not an address), or libuv's error.
 */
int mhttp_start(uv_loop_t *loop, const char *addr, mhttp_render_cb render, void *arg,
		struct mhttp **out, int *port);
/* Stops listening and closes every connection; frees the server once closed. */
void mhttp_stop(struct mhttp *srv);

#endif
