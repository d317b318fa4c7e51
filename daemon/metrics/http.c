/*
 * http.c - GET /metrics over TCP with libuv (http.h).
 *
 * A connection may send at most MHTTP_MAX_REQ bytes of request head and has
 * MHTTP_TIMEOUT_MS to finish it; at most MHTTP_MAX_CONNS are open at once
 * (more are closed at accept). The response carries Content-Length and
 * Connection: close, and the connection closes after it is written. Only the
 * request line is read: GET (or HEAD) /metrics is 200, another path 404,
 * another method 405. Nothing a scraper sends can make gmbd block.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/metrics/http.h"

#define MHTTP_MAX_REQ	 8192
#define MHTTP_MAX_CONNS	 16
#define MHTTP_TIMEOUT_MS 5000
#define MHTTP_CTYPE	 "text/plain; version=0.0.4; charset=utf-8"

struct mhttp_conn;

struct mhttp {
	uv_tcp_t tcp; /* the listener; frees the server on close */
	mhttp_render_cb render;
	void *arg;
	struct mhttp_conn *conns;
	unsigned nconns;
	bool stopping;
};

struct mhttp_conn {
	uv_tcp_t tcp; /* frees the connection on close */
	uv_timer_t timer;
	uv_write_t wr;
	struct mhttp *srv;
	char req[MHTTP_MAX_REQ];
	size_t nreq;
	char *resp; /* owned while written */
	bool responded, closing;
	int pending_closes;
	struct mhttp_conn *prev, *next;
};

static void mhttp_on_conn(uv_stream_t *server, int status);
static void mhttp_conn_close(struct mhttp_conn *c);

static int mhttp_parse_addr(const char *addr, struct sockaddr_storage *ss)
{
	char host[64];
	const char *colon = strrchr(addr, ':');
	size_t n;
	int port;

	if (!colon || colon == addr)
		return -EINVAL;
	n = (size_t)(colon - addr);
	port = atoi(colon + 1);
	if (addr[0] == '[') {
		if (n < 2 || addr[n - 1] != ']' || n - 2 >= sizeof(host))
			return -EINVAL;
		memcpy(host, addr + 1, n - 2);
		host[n - 2] = '\0';
		return uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss);
	}
	if (n >= sizeof(host))
		return -EINVAL;
	memcpy(host, addr, n);
	host[n] = '\0';
	return uv_ip4_addr(host, port, (struct sockaddr_in *)ss);
}

int mhttp_start(uv_loop_t *loop, const char *addr, mhttp_render_cb render, void *arg,
		struct mhttp **out, int *port)
{
	struct sockaddr_storage ss = { 0 };
	int len = sizeof(ss);
	struct mhttp *srv;
	int r;

	r = mhttp_parse_addr(addr, &ss);
	if (r < 0)
		return r;
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	*srv = (struct mhttp){ .render = render, .arg = arg };
	r = uv_tcp_init(loop, &srv->tcp);
	if (r < 0) {
		free(srv);
		return r;
	}
	srv->tcp.data = srv;
	r = uv_tcp_bind(&srv->tcp, (const struct sockaddr *)&ss, 0);
	if (r == 0)
		r = uv_listen((uv_stream_t *)&srv->tcp, 16, mhttp_on_conn);
	if (r == 0)
		r = uv_tcp_getsockname(&srv->tcp, (struct sockaddr *)&ss, &len);
	if (r < 0) {
		srv->stopping = true;
		mhttp_stop(srv);
		return r;
	}
	*port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) :
					   ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*out = srv;
	return 0;
}

static void mhttp_on_srv_closed(uv_handle_t *h)
{
	free(h->data);
}

void mhttp_stop(struct mhttp *srv)
{
	if (!srv)
		return;
	srv->stopping = true;
	while (srv->conns)
		mhttp_conn_close(srv->conns);
	uv_close((uv_handle_t *)&srv->tcp, mhttp_on_srv_closed);
}

/* ---- a connection ---- */

static void mhttp_on_conn_closed(uv_handle_t *h)
{
	struct mhttp_conn *c = h->data;

	if (--c->pending_closes == 0) {
		free(c->resp);
		free(c);
	}
}

static void mhttp_conn_close(struct mhttp_conn *c)
{
	struct mhttp *srv = c->srv;

	if (c->closing)
		return;
	c->closing = true;
	if (c->prev)
		c->prev->next = c->next;
	else
		srv->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	srv->nconns--;
	c->pending_closes = 2;
	uv_close((uv_handle_t *)&c->timer, mhttp_on_conn_closed);
	uv_close((uv_handle_t *)&c->tcp, mhttp_on_conn_closed);
}

static void mhttp_on_timeout(uv_timer_t *t)
{
	mhttp_conn_close(t->data);
}

static void mhttp_on_written(uv_write_t *wr, int status)
{
	mhttp_conn_close(wr->data);
}

/* Sends one response; the connection closes once it is written. */
static void mhttp_respond(struct mhttp_conn *c, int code, const char *reason, const char *body,
			  size_t len, bool head)
{
	uv_buf_t buf;
	int n;

	c->responded = true;
	uv_read_stop((uv_stream_t *)&c->tcp);
	n = snprintf(NULL, 0,
		     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
		     "Connection: close\r\n\r\n",
		     code, reason, code == 200 ? MHTTP_CTYPE : "text/plain; charset=utf-8", len);
	c->resp = malloc((size_t)n + 1 + (head ? 0 : len));
	if (!c->resp) {
		mhttp_conn_close(c);
		return;
	}
	snprintf(c->resp, (size_t)n + 1,
		 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
		 "Connection: close\r\n\r\n",
		 code, reason, code == 200 ? MHTTP_CTYPE : "text/plain; charset=utf-8", len);
	if (!head)
		memcpy(c->resp + n, body, len);
	buf = uv_buf_init(c->resp, (unsigned)((size_t)n + (head ? 0 : len)));
	c->wr.data = c;
	if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, mhttp_on_written) < 0)
		mhttp_conn_close(c);
}

/* The request line is complete in c->req: answer it. */
static void mhttp_answer(struct mhttp_conn *c)
{
	static const char not_found[] = "not found: gmbd serves /metrics\n";
	static const char bad_method[] = "only GET /metrics\n";
	bool get = strncmp(c->req, "GET ", 4) == 0, head = strncmp(c->req, "HEAD ", 5) == 0;
	const char *path = c->req + (get ? 4 : 5);
	char *body = NULL;
	size_t len = 0;

	if (!get && !head) {
		mhttp_respond(c, 405, "Method Not Allowed", bad_method, sizeof(bad_method) - 1,
			      false);
		return;
	}
	if (strncmp(path, "/metrics", 8) != 0 || (path[8] != ' ' && path[8] != '?')) {
		mhttp_respond(c, 404, "Not Found", not_found, sizeof(not_found) - 1, head);
		return;
	}
	if (c->srv->render(c->srv->arg, &body, &len) < 0) {
		mhttp_respond(c, 500, "Internal Server Error", "out of memory\n", 14, head);
		return;
	}
	mhttp_respond(c, 200, "OK", body, len, head);
	free(body);
}

static void mhttp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct mhttp_conn *c = h->data;

	*buf = uv_buf_init(c->req + c->nreq, (unsigned)(sizeof(c->req) - 1 - c->nreq));
}

static void mhttp_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct mhttp_conn *c = s->data;

	if (n < 0) {
		mhttp_conn_close(c);
		return;
	}
	c->nreq += (size_t)n;
	c->req[c->nreq] = '\0';
	/* The head ends with an empty line. */
	if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n"))
		mhttp_answer(c);
	else if (c->nreq >= sizeof(c->req) - 1)
		mhttp_respond(c, 431, "Request Header Fields Too Large", "", 0, false);
}

static void mhttp_on_conn(uv_stream_t *server, int status)
{
	struct mhttp *srv = server->data;
	struct mhttp_conn *c;

	if (status < 0 || srv->stopping)
		return;
	c = calloc(1, sizeof(*c));
	if (!c || uv_tcp_init(server->loop, &c->tcp) < 0) {
		free(c);
		return;
	}
	c->srv = srv;
	c->tcp.data = c;
	uv_timer_init(server->loop, &c->timer);
	c->timer.data = c;
	c->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = c;
	srv->conns = c;
	srv->nconns++;
	if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0 || srv->nconns > MHTTP_MAX_CONNS) {
		mhttp_conn_close(c);
		return;
	}
	uv_timer_start(&c->timer, mhttp_on_timeout, MHTTP_TIMEOUT_MS, 0);
	if (uv_read_start((uv_stream_t *)&c->tcp, mhttp_alloc, mhttp_on_read) < 0)
		mhttp_conn_close(c);
}
