/*
 * handlers_msg.c - the fixture and the client's messages for the handler
 * tests (see handlers_msg.h).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/backend/backend.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "tests/handlers_fx.h"
#include "tests/handlers_msg.h"
#include "tests/util.h"

struct hfx hm_fx;
uint64_t hm_next_id;

void hm_start(uint64_t pool_keep)
{
	struct backend_host_opts ho = { .ndevices = 1, .memory = 8 * GiB, .granularity = 2 * MiB };
	struct broker_opts bo = { .max_chunk = 1 * GiB,
				  .pool_keep = pool_keep,
				  .daemon_uid = geteuid() };

	/* GMB_TEST_DEBUG=1 shows every message in and out. */
	log_max_level = getenv("GMB_TEST_DEBUG") ? LOG_LVL_DEBUG : LOG_LVL_WARNING;
	/* The layers' log lines: the test's file, shown if it fails. */
	cr_assert(eq(i32, test_log_stderr("stderr"), 0));
	cr_assert(eq(i32, hfx_start(&hm_fx, &ho, &bo, 30000), 0));
	hm_next_id = 0;
}

void hm_setup(void)
{
	hm_start(UINT64_MAX);
}

void hm_teardown(void)
{
	hfx_stop(&hm_fx);
	cr_assert(eq(u32, hm_fx.br->nclients, 0));
	cr_assert(eq(i32, hfx_free(&hm_fx), 0));
}

/* A new client: the test keeps one end, a session serves the other. */
int hm_client(void)
{
	int fd = -1;

	cr_assert(eq(i32, hfx_client(&hm_fx, &fd), 0));
	return fd;
}

void hm_msg_free(struct hm_msg *m)
{
	wire_close_fds(m->fds, m->nfds);
	m->nfds = 0;
	if (m->env)
		gmb__envelope__free_unpacked(m->env, NULL);
	m->env = NULL;
}

/* Next packet for @fd, turning the loop meanwhile. 0 or -ECONNRESET. */
int hm_recv(int fd, struct hm_msg *m)
{
	int r = hfx_recv(&hm_fx, fd, &m->env, m->fds, &m->nfds, HM_WAIT_MS);

	cr_assert(r != -ETIMEDOUT, "no packet within %d ms", HM_WAIT_MS);
	cr_assert(r == 0 || r == -ECONNRESET, "wire_recv: %s", strerror(-r));
	return r;
}

/* The session must close: every packet before the end is dropped. */
void hm_expect_eof(int fd)
{
	struct hm_msg m;

	while (hm_recv(fd, &m) == 0)
		hm_msg_free(&m);
	close(fd);
}

void hm_expect_no_packet(int fd)
{
	Gmb__Envelope *env = NULL;
	int fds[WIRE_MAX_FDS], nfds = 0;

	hfx_spin(&hm_fx);
	cr_assert(eq(i32, wire_recv(fd, &env, fds, &nfds), -EAGAIN));
}

/* Sends a request with body @bc (every oneof member is a pointer). */
uint64_t hm_send_req(int fd, Gmb__Envelope__BodyCase bc, void *body)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	uint64_t end = hfx_now_ms() + HM_WAIT_MS;
	int r;

	env.id = ++hm_next_id;
	env.body_case = bc;
	env.hello = body;
	/* A full socket drains as the daemon's loop turns. */
	while ((r = wire_send(fd, &env, NULL, 0)) == -EAGAIN) {
		cr_assert(lt(u64, hfx_now_ms(), end), "socket full for %d ms", HM_WAIT_MS);
		uv_run(&hm_fx.loop, UV_RUN_NOWAIT);
	}
	cr_assert(eq(i32, r, 0), "wire_send: %s", strerror(-r));
	return env.id;
}

void hm_send_reply(int fd, uint64_t reply_to, int status)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.reply_to = reply_to;
	env.status = status;
	cr_assert(eq(i32, wire_send(fd, &env, NULL, 0), 0));
}

/* The final part of the reply to @id; earlier parts go to @parts (if any). */
void hm_recv_reply(int fd, uint64_t id, struct hm_msg *last, struct hm_msg *parts, int *nparts)
{
	int n = 0;

	for (;;) {
		cr_assert(eq(i32, hm_recv(fd, last), 0), "connection closed awaiting %llu",
			  (unsigned long long)id);
		cr_assert(eq(u64, last->env->reply_to, id));
		if (!last->env->more)
			break;
		cr_assert(not(eq(ptr, parts, NULL)), "unexpected part");
		parts[n++] = *last;
	}
	if (nparts)
		*nparts = n;
}

uint64_t hm_send_hello(int fd, uint32_t version, const char *name, bool control, bool tool)
{
	Gmb__Hello h = GMB__HELLO__INIT;

	h.version = version;
	h.name = (char *)name;
	h.control = control;
	h.tool = tool;
	return hm_send_req(fd, GMB__ENVELOPE__BODY_HELLO, &h);
}

/* A client that said hello; returns its socket. */
int hm_hello_client(const char *name, bool control, bool tool)
{
	int fd = hm_client();
	uint64_t id = hm_send_hello(fd, GMB_PROTOCOL_VERSION, name, control, tool);
	struct hm_msg m;

	hm_recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "hello: %s", m.env->error);
	cr_assert(eq(i32, m.env->body_case, GMB__ENVELOPE__BODY_HELLO_REPLY));
	hm_msg_free(&m);
	return fd;
}

uint64_t hm_send_alloc(int fd, uint64_t size, const char *tag)
{
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;

	a.size = size;
	a.tag = (char *)tag;
	return hm_send_req(fd, GMB__ENVELOPE__BODY_ALLOC, &a);
}

uint64_t hm_send_tag_req(int fd, Gmb__Envelope__BodyCase bc, const char *tag)
{
	/* PauseRequest and ResumeRequest have the same layout: one tag. */
	Gmb__PauseRequest p = GMB__PAUSE_REQUEST__INIT;
	Gmb__ResumeRequest r = GMB__RESUME_REQUEST__INIT;

	p.tag = r.tag = (char *)tag;
	return hm_send_req(fd, bc, bc == GMB__ENVELOPE__BODY_PAUSE ? (void *)&p : (void *)&r);
}

uint64_t hm_send_control(int fd, const char *target, int op, const char *tag)
{
	Gmb__ControlRequest c = GMB__CONTROL_REQUEST__INIT;

	c.target = (char *)target;
	c.op = (Gmb__Op)op;
	c.tag = (char *)tag;
	return hm_send_req(fd, GMB__ENVELOPE__BODY_CONTROL, &c);
}

/* Alloc @size in @tag; fds imported or not, the id of the allocation. */
uint64_t hm_alloc_ok(int fd, uint64_t size, const char *tag)
{
	uint64_t id = hm_send_alloc(fd, size, tag), alloc_id;
	struct hm_msg last, parts[8];
	int n;

	hm_recv_reply(fd, id, &last, parts, &n);
	cr_assert(eq(i32, last.env->status, 0), "alloc: %s", last.env->error);
	alloc_id = last.env->alloc_reply->lend->alloc_id;
	for (int i = 0; i < n; i++)
		hm_msg_free(&parts[i]);
	hm_msg_free(&last);
	return alloc_id;
}

int hm_status_only(int fd, uint64_t id, char *err, size_t len)
{
	struct hm_msg m;
	int st;

	hm_recv_reply(fd, id, &m, NULL, NULL);
	st = m.env->status;
	if (err)
		snprintf(err, len, "%s", m.env->error ? m.env->error : "");
	hm_msg_free(&m);
	return st;
}

void hm_expect_first_tag_state(int fd, const char *want)
{
	const Gmb__StatusReply *sr;
	struct hm_msg m;

	hm_recv_reply(fd,
		      hm_send_req(fd, GMB__ENVELOPE__BODY_STATUS_REQ,
				  &(Gmb__StatusRequest)GMB__STATUS_REQUEST__INIT),
		      &m, NULL, NULL);
	sr = m.env->status_reply;
	cr_assert(ge(sz, sr->n_clients, 1));
	cr_assert(ge(sz, sr->clients[0]->n_tags, 1));
	cr_assert(eq(str, sr->clients[0]->tags[0]->state, (char *)want));
	hm_msg_free(&m);
}
