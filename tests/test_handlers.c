/*
 * test_handlers.c - gmbd's handlers through the real dispatch: each client
 * is the test's end of a socketpair(AF_UNIX, SOCK_SEQPACKET) whose other end
 * is a real session on a real uv loop, over the real broker on the host
 * backend (8 GiB, 2 MiB granularity, 1 GiB chunks). The test plays the
 * client with wire_send()/wire_recv() and turns the loop while it waits.
 * Every test ends with uv_loop_close() == 0 (teardown).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "common/backend/backend.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/proc.h"
#include "daemon/handlers/handlers.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/server.h"
#include "daemon/transport/sess.h"
#include "tests/handlers_fx.h"

#define GiB	(1ULL << 30)
#define MiB	(1ULL << 20)
#define WAIT_MS 5000

/* ---- fixture: loop, backend, broker, handlers, server without listener ---- */

static struct hfx fx;
static uint64_t fx_next_id;

static void fx_start(uint64_t pool_keep)
{
	struct backend_host_opts ho = { .ndevices = 1, .memory = 8 * GiB, .granularity = 2 * MiB };
	struct broker_opts bo = { .max_chunk = 1 * GiB,
				  .pool_keep = pool_keep,
				  .daemon_uid = geteuid() };

	/* GMB_TEST_DEBUG=1 shows every message in and out. */
	log_max_level = getenv("GMB_TEST_DEBUG") ? LOG_LVL_DEBUG : LOG_LVL_WARNING;
	cr_assert(eq(i32, hfx_start(&fx, &ho, &bo, 30000), 0));
	fx_next_id = 0;
}

static void setup(void)
{
	fx_start(UINT64_MAX);
}

static void teardown(void)
{
	hfx_stop(&fx);
	cr_assert(eq(u32, fx.br->nclients, 0));
	cr_assert(eq(i32, hfx_free(&fx), 0));
}

TestSuite(handlers, .init = setup, .fini = teardown, .timeout = 30);

/* A new client: the test keeps one end, a session serves the other. */
static int fx_client(void)
{
	int fd = -1;

	cr_assert(eq(i32, hfx_client(&fx, &fd), 0));
	return fd;
}

/* ---- messages ---- */

struct msg {
	Gmb__Envelope *env;
	int fds[WIRE_MAX_FDS];
	int nfds;
};

static void msg_free(struct msg *m)
{
	wire_close_fds(m->fds, m->nfds);
	m->nfds = 0;
	if (m->env)
		gmb__envelope__free_unpacked(m->env, NULL);
	m->env = NULL;
}

/* Next packet for @fd, turning the loop meanwhile. 0 or -ECONNRESET. */
static int fx_recv(int fd, struct msg *m)
{
	int r = hfx_recv(&fx, fd, &m->env, m->fds, &m->nfds, WAIT_MS);

	cr_assert(r != -ETIMEDOUT, "no packet within %d ms", WAIT_MS);
	cr_assert(r == 0 || r == -ECONNRESET, "wire_recv: %s", strerror(-r));
	return r;
}

/* The session must close: every packet before the end is dropped. */
static void expect_eof(int fd)
{
	struct msg m;

	while (fx_recv(fd, &m) == 0)
		msg_free(&m);
	close(fd);
}

static void expect_no_packet(int fd)
{
	Gmb__Envelope *env = NULL;
	int fds[WIRE_MAX_FDS], nfds = 0;

	hfx_spin(&fx);
	cr_assert(eq(i32, wire_recv(fd, &env, fds, &nfds), -EAGAIN));
}

/* Sends a request with body @bc (every oneof member is a pointer). */
static uint64_t send_req(int fd, Gmb__Envelope__BodyCase bc, void *body)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	uint64_t end = hfx_now_ms() + WAIT_MS;
	int r;

	env.id = ++fx_next_id;
	env.body_case = bc;
	env.hello = body;
	/* A full socket drains as the daemon's loop turns. */
	while ((r = wire_send(fd, &env, NULL, 0)) == -EAGAIN) {
		cr_assert(lt(u64, hfx_now_ms(), end), "socket full for %d ms", WAIT_MS);
		uv_run(&fx.loop, UV_RUN_NOWAIT);
	}
	cr_assert(eq(i32, r, 0), "wire_send: %s", strerror(-r));
	return env.id;
}

static void send_reply(int fd, uint64_t reply_to, int status)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.reply_to = reply_to;
	env.status = status;
	cr_assert(eq(i32, wire_send(fd, &env, NULL, 0), 0));
}

/* The final part of the reply to @id; earlier parts go to @parts (if any). */
static void recv_reply(int fd, uint64_t id, struct msg *last, struct msg *parts, int *nparts)
{
	int n = 0;

	for (;;) {
		cr_assert(eq(i32, fx_recv(fd, last), 0), "connection closed awaiting %llu",
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

static uint64_t send_hello(int fd, uint32_t version, const char *name, bool control, bool tool)
{
	Gmb__Hello h = GMB__HELLO__INIT;

	h.version = version;
	h.name = (char *)name;
	h.control = control;
	h.tool = tool;
	return send_req(fd, GMB__ENVELOPE__BODY_HELLO, &h);
}

/* A client that said hello; returns its socket. */
static int hello_client(const char *name, bool control, bool tool)
{
	int fd = fx_client();
	uint64_t id = send_hello(fd, GMB_PROTOCOL_VERSION, name, control, tool);
	struct msg m;

	recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "hello: %s", m.env->error);
	cr_assert(eq(i32, m.env->body_case, GMB__ENVELOPE__BODY_HELLO_REPLY));
	msg_free(&m);
	return fd;
}

static uint64_t send_alloc(int fd, uint64_t size, const char *tag)
{
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;

	a.size = size;
	a.tag = (char *)tag;
	return send_req(fd, GMB__ENVELOPE__BODY_ALLOC, &a);
}

static uint64_t send_tag_req(int fd, Gmb__Envelope__BodyCase bc, const char *tag)
{
	/* PauseRequest and ResumeRequest have the same layout: one tag. */
	Gmb__PauseRequest p = GMB__PAUSE_REQUEST__INIT;
	Gmb__ResumeRequest r = GMB__RESUME_REQUEST__INIT;

	p.tag = r.tag = (char *)tag;
	return send_req(fd, bc, bc == GMB__ENVELOPE__BODY_PAUSE ? (void *)&p : (void *)&r);
}

static uint64_t send_control(int fd, const char *target, int op, const char *tag)
{
	Gmb__ControlRequest c = GMB__CONTROL_REQUEST__INIT;

	c.target = (char *)target;
	c.op = (Gmb__Op)op;
	c.tag = (char *)tag;
	return send_req(fd, GMB__ENVELOPE__BODY_CONTROL, &c);
}

/* Alloc @size in @tag; fds imported or not, the id of the allocation. */
static uint64_t alloc_ok(int fd, uint64_t size, const char *tag)
{
	uint64_t id = send_alloc(fd, size, tag), alloc_id;
	struct msg last, parts[8];
	int n;

	recv_reply(fd, id, &last, parts, &n);
	cr_assert(eq(i32, last.env->status, 0), "alloc: %s", last.env->error);
	alloc_id = last.env->alloc_reply->lend->alloc_id;
	for (int i = 0; i < n; i++)
		msg_free(&parts[i]);
	msg_free(&last);
	return alloc_id;
}

static int status_only(int fd, uint64_t id, char *err, size_t len)
{
	struct msg m;
	int st;

	recv_reply(fd, id, &m, NULL, NULL);
	st = m.env->status;
	if (err)
		snprintf(err, len, "%s", m.env->error ? m.env->error : "");
	msg_free(&m);
	return st;
}

/* ---- hello ---- */

Test(handlers, hello_first_gets_devices_and_an_id)
{
	int fd = fx_client();
	uint64_t id = send_hello(fd, GMB_PROTOCOL_VERSION, "trainer", false, false);
	const Gmb__HelloReply *hr;
	struct msg m;

	recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0));
	hr = m.env->hello_reply;
	cr_assert(eq(u32, hr->version, GMB_PROTOCOL_VERSION));
	cr_assert(ne(u64, hr->client_id, 0));
	cr_assert(eq(str, hr->backend, "host"));
	cr_assert(eq(sz, hr->n_devices, 1));
	cr_assert(eq(u64, hr->devices[0]->total_bytes, 8 * GiB));
	cr_assert(eq(u64, hr->devices[0]->granularity, 2 * MiB));
	cr_assert(eq(str, fx.br->clients->name, "trainer"));
	cr_assert(eq(ptr, handlers_sess_of(&fx.h, fx.br->clients), server_sessions(fx.srv)));
	msg_free(&m);
	close(fd);
}

Test(handlers, version_mismatch_is_answered_then_closed)
{
	int fd = fx_client();
	uint64_t id = send_hello(fd, 2, "future", false, false);
	struct msg m;

	recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, -EPROTO));
	cr_assert(not(eq(ptr, strstr(m.env->error, "protocol version 2, gmbd speaks 1"), NULL)),
		  "error: %s", m.env->error);
	msg_free(&m);
	expect_eof(fd);
	cr_assert(eq(u32, fx.br->nclients, 0));
}

Test(handlers, empty_name_becomes_pid)
{
	int fd = hello_client("", false, false);
	char want[32];

	snprintf(want, sizeof(want), "pid-%d", (int)getpid());
	cr_assert(eq(str, fx.br->clients->name, want));
	close(fd);
}

Test(handlers, bad_names_are_refused_and_the_session_stays)
{
	char longname[WIRE_MAX_NAME + 2];
	const char *bad[] = { "tab\there", "\xc3\x28", "\xed\xa0\x80", "esc\x1b[31m", longname };
	int fd = fx_client();

	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t id = send_hello(fd, GMB_PROTOCOL_VERSION, bad[i], false, false);

		cr_assert(eq(i32, status_only(fd, id, NULL, 0), -EINVAL), "name %zu", i);
	}
	cr_assert(eq(u32, fx.br->nclients, 0));
	/* UTF-8 is fine. */
	cr_assert(eq(i32, status_only(fd, send_hello(fd, 1, "wörker-ü", 0, 0), NULL, 0), 0));
	cr_assert(eq(u32, fx.br->nclients, 1));
	close(fd);
}

/* ---- protocol errors ---- */

Test(handlers, request_before_hello_disconnects)
{
	int fd = fx_client();

	send_alloc(fd, 2 * MiB, "kv");
	expect_eof(fd);
}

Test(handlers, second_hello_disconnects)
{
	int fd = hello_client("w", false, false);

	send_hello(fd, GMB_PROTOCOL_VERSION, "w", false, false);
	expect_eof(fd);
	hfx_spin(&fx);
	cr_assert(eq(u32, fx.br->nclients, 0));
}

Test(handlers, garbage_bytes_disconnect)
{
	int fd = hello_client("w", false, false);
	const char junk[] = "\xff\xff\xff\xff\xff\xff\xff\xff garbage";

	cr_assert(eq(i64, send(fd, junk, sizeof(junk), 0), (long)sizeof(junk)));
	expect_eof(fd);
	hfx_spin(&fx);
	cr_assert(eq(u32, fx.br->nclients, 0));
}

static int count_open_fds(void)
{
	struct stat st;
	int n = 0;

	for (int fd = 0; fd < 1024; fd++)
		n += fstat(fd, &st) == 0;
	return n;
}

Test(handlers, fds_from_a_client_disconnect)
{
	int before = count_open_fds();
	int fd = hello_client("w", false, false);
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest sr = GMB__STATUS_REQUEST__INIT;
	uint64_t chunk = 1, size = 4096;
	int mfd = memfd_create("t", MFD_CLOEXEC);

	env.id = 99;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &sr;
	env.n_fd_chunks = env.n_fd_sizes = 1;
	env.fd_chunks = &chunk;
	env.fd_sizes = &size;
	cr_assert(eq(i32, wire_send(fd, &env, &mfd, 1), 0));
	close(mfd);
	expect_eof(fd);
	hfx_spin(&fx);
	cr_assert(eq(u32, fx.br->nclients, 0));
	/* The session's socket and the fd it was sent are closed too. */
	cr_assert(eq(i32, count_open_fds(), before));
}

Test(handlers, reply_to_nothing_disconnects)
{
	int fd = hello_client("w", false, false);

	send_reply(fd, 12345, 0);
	expect_eof(fd);
}

Test(handlers, request_without_id_or_body_disconnects)
{
	int a = hello_client("a", false, false), b = hello_client("b", false, false);
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest sr = GMB__STATUS_REQUEST__INIT;

	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &sr;
	cr_assert(eq(i32, wire_send(a, &env, NULL, 0), 0));
	expect_eof(a);
	/* A daemon-only body from a client. */
	send_req(b, GMB__ENVELOPE__BODY_DROP, &(Gmb__DropRequest)GMB__DROP_REQUEST__INIT);
	expect_eof(b);
}

/* ---- memory requests ---- */

Test(handlers, alloc_sends_fds_then_the_lend)
{
	int fd = hello_client("w", false, false);
	uint64_t id = send_alloc(fd, 3 * GiB, "kv");
	struct msg last, parts[4];
	const Gmb__Lend *l;
	int n;

	recv_reply(fd, id, &last, parts, &n);
	cr_assert(eq(i32, n, 1));
	cr_assert(eq(i32, parts[0].nfds, 3));
	cr_assert(eq(sz, parts[0].env->n_fd_chunks, 3));
	cr_assert(eq(i32, parts[0].env->body_case, GMB__ENVELOPE__BODY__NOT_SET));
	for (int i = 0; i < 3; i++) {
		struct stat st;

		cr_assert(eq(u64, parts[0].env->fd_sizes[i], 1 * GiB));
		cr_assert(eq(i32, fstat(parts[0].fds[i], &st), 0));
		cr_assert(eq(i64, st.st_size, (long)GiB));
	}
	cr_assert(eq(i32, last.env->status, 0));
	cr_assert(eq(i32, last.env->body_case, GMB__ENVELOPE__BODY_ALLOC_REPLY));
	l = last.env->alloc_reply->lend;
	cr_assert(eq(u64, l->size, 3 * GiB));
	cr_assert(eq(sz, l->n_chunk_ids, 3));
	for (int i = 0; i < 3; i++) {
		bool found = false;

		for (int j = 0; j < 3; j++)
			found |= l->chunk_ids[i] == parts[0].env->fd_chunks[j];
		cr_assert(found, "lend chunk %d came without an fd", i);
	}
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 3 * GiB));
	msg_free(&parts[0]);
	msg_free(&last);
	close(fd);
}

Test(handlers, alloc_errors_are_replies)
{
	int fd = hello_client("w", false, false);
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;
	char err[ERR_MSG_MAX];

	a.device = 7;
	a.size = MiB;
	cr_assert(eq(i32,
		     status_only(fd, send_req(fd, GMB__ENVELOPE__BODY_ALLOC, &a), err, sizeof(err)),
		     -ENODEV));
	cr_assert(
		eq(i32, status_only(fd, send_alloc(fd, 9 * GiB, "kv"), err, sizeof(err)), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "budget"), NULL)), "error: %s", err);
	cr_assert(eq(i32, status_only(fd, send_alloc(fd, 0, "kv"), NULL, 0), -EINVAL));
	/* Still connected. */
	alloc_ok(fd, 2 * MiB, "kv");
	close(fd);
}

Test(handlers, free_and_disconnect_return_memory)
{
	int fd = hello_client("w", false, false);
	uint64_t a1 = alloc_ok(fd, 2 * GiB, "kv");
	Gmb__FreeRequest fr = GMB__FREE_REQUEST__INIT;

	alloc_ok(fd, 3 * GiB, "w");
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 5 * GiB));
	fr.alloc_id = a1;
	cr_assert(
		eq(i32, status_only(fd, send_req(fd, GMB__ENVELOPE__BODY_FREE, &fr), NULL, 0), 0));
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 3 * GiB));
	cr_assert(eq(i32, status_only(fd, send_req(fd, GMB__ENVELOPE__BODY_FREE, &fr), NULL, 0),
		     -ENOENT));
	close(fd);
	hfx_spin(&fx);
	cr_assert(eq(u32, fx.br->nclients, 0));
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 0));
}

Test(handlers, pause_then_resume_reuses_held_chunks_without_fds)
{
	int fd = hello_client("w", false, false);
	struct msg last, parts[4];
	int n;

	alloc_ok(fd, 2 * GiB, "kv");
	cr_assert(eq(i32,
		     status_only(fd, send_tag_req(fd, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL, 0),
		     0));
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 0));
	recv_reply(fd, send_tag_req(fd, GMB__ENVELOPE__BODY_RESUME, "kv"), &last, parts, &n);
	cr_assert(eq(i32, n, 0), "the client holds the handles: no fds");
	cr_assert(eq(i32, last.env->status, 0));
	cr_assert(eq(i32, last.env->body_case, GMB__ENVELOPE__BODY_RESUME_REPLY));
	cr_assert(eq(sz, last.env->resume_reply->n_lends, 1));
	cr_assert(eq(u64, last.env->resume_reply->lends[0]->size, 2 * GiB));
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 2 * GiB));
	msg_free(&last);
	cr_assert(eq(i32,
		     status_only(fd, send_tag_req(fd, GMB__ENVELOPE__BODY_PAUSE, "nope"), NULL, 0),
		     -ENOENT));
	close(fd);
}

Test(handlers, status_lists_clients_tags_and_pools)
{
	int w = hello_client("worker", true, false), t = hello_client("ctl", false, true);
	Gmb__TagModeRequest tm = GMB__TAG_MODE_REQUEST__INIT;
	const Gmb__StatusReply *sr;
	const Gmb__ClientInfo *ci;
	struct msg m;

	alloc_ok(w, 3 * GiB, "kv");
	tm.tag = "weights";
	tm.mode = GMB__MODE__MODE_PRESERVE;
	cr_assert(eq(i32, status_only(w, send_req(w, GMB__ENVELOPE__BODY_TAG_MODE, &tm), NULL, 0),
		     0));
	recv_reply(t,
		   send_req(t, GMB__ENVELOPE__BODY_STATUS_REQ,
			    &(Gmb__StatusRequest)GMB__STATUS_REQUEST__INIT),
		   &m, NULL, NULL);
	sr = m.env->status_reply;
	cr_assert(eq(str, sr->backend, "host"));
	cr_assert(eq(sz, sr->n_devices, 1));
	cr_assert(eq(u64, sr->devices[0]->used_bytes, 3 * GiB));
	cr_assert(eq(u64, sr->devices[0]->pool_bytes, 3 * GiB));
	cr_assert(eq(sz, sr->n_clients, 1), "the tool is not listed");
	ci = sr->clients[0];
	cr_assert(eq(str, ci->name, "worker"));
	cr_assert(ci->control);
	cr_assert(eq(sz, ci->n_tags, 2));
	cr_assert(eq(str, ci->tags[0]->name, "kv"));
	cr_assert(eq(i32, ci->tags[0]->device, 0));
	cr_assert(eq(u32, ci->tags[0]->allocations, 1));
	cr_assert(eq(u64, ci->tags[0]->bytes, 3 * GiB));
	cr_assert(eq(str, ci->tags[0]->state, "active"));
	cr_assert(eq(str, ci->tags[1]->name, "weights"));
	cr_assert(eq(i32, ci->tags[1]->device, -1));
	cr_assert(eq(i32, ci->tags[1]->mode, GMB__MODE__MODE_PRESERVE));
	msg_free(&m);
	close(w);
	close(t);
}

Test(handlers, trim_releases_free_chunks)
{
	int fd = hello_client("w", false, false), t = hello_client("ctl", false, true);
	Gmb__TrimRequest tr = GMB__TRIM_REQUEST__INIT;
	struct msg m, drop;

	alloc_ok(fd, 2 * GiB, "kv");
	cr_assert(eq(i32,
		     status_only(fd, send_tag_req(fd, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL, 0),
		     0));
	tr.device = -1;
	recv_reply(t, send_req(t, GMB__ENVELOPE__BODY_TRIM, &tr), &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "trim: %s", m.env->error);
	/* The worker still holds the handles: pending until it drops them. */
	cr_assert(eq(u64, m.env->trim_reply->released_bytes, 0));
	cr_assert(eq(u64, m.env->trim_reply->pending_bytes, 2 * GiB));
	msg_free(&m);
	cr_assert(eq(i32, fx_recv(fd, &drop), 0));
	cr_assert(eq(i32, drop.env->body_case, GMB__ENVELOPE__BODY_DROP));
	cr_assert(ne(u64, drop.env->id, 0));
	cr_assert(eq(sz, drop.env->drop->n_chunk_ids, 2));
	send_reply(fd, drop.env->id, 0);
	msg_free(&drop);
	hfx_spin(&fx);
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 0));
	tr.device = 3;
	cr_assert(eq(i32, status_only(t, send_req(t, GMB__ENVELOPE__BODY_TRIM, &tr), NULL, 0),
		     -ENODEV));
	close(fd);
	close(t);
}

/* ---- parked requests ---- */

/* Keep nothing warm: a pause asks the holder to drop its handles. */
static void setup_keep0(void)
{
	fx_start(0);
}

TestSuite(parked, .init = setup_keep0, .fini = teardown, .timeout = 30);

Test(parked, alloc_completes_after_the_drop_ack)
{
	int a = hello_client("a", false, false), b = hello_client("b", false, false);
	struct msg drop, last, parts[4];
	uint64_t id;
	int n;

	alloc_ok(a, 6 * GiB, "kv");
	cr_assert(eq(i32, status_only(a, send_tag_req(a, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL, 0),
		     0));
	cr_assert(eq(i32, fx_recv(a, &drop), 0));
	cr_assert(eq(i32, drop.env->body_case, GMB__ENVELOPE__BODY_DROP));
	id = send_alloc(b, 6 * GiB, "kv");
	expect_no_packet(b);
	cr_assert(eq(u32, hconn_of(handlers_sess_of(&fx.h, fx.br->clients->next))->inflight, 1));
	send_reply(a, drop.env->id, 0);
	msg_free(&drop);
	recv_reply(b, id, &last, parts, &n);
	cr_assert(eq(i32, last.env->status, 0), "alloc: %s", last.env->error);
	cr_assert(eq(u64, last.env->alloc_reply->lend->size, 6 * GiB));
	for (int i = 0; i < n; i++)
		msg_free(&parts[i]);
	msg_free(&last);
	close(a);
	close(b);
}

Test(parked, alloc_fails_with_enomem_at_its_deadline)
{
	int a = hello_client("a", false, false), b = hello_client("b", false, false);
	char err[ERR_MSG_MAX];
	struct msg drop;

	fx.h.park_timeout_ms = 100;
	alloc_ok(a, 6 * GiB, "kv");
	cr_assert(eq(i32, status_only(a, send_tag_req(a, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL, 0),
		     0));
	cr_assert(eq(i32, fx_recv(a, &drop), 0));
	msg_free(&drop); /* never answered */
	cr_assert(eq(i32, status_only(b, send_alloc(b, 6 * GiB, "kv"), err, sizeof(err)), -ENOMEM));
	/* The time said is the time waited: the deadline, or a loaded machine's bit more. */
	const char *said = strstr(err, "still waiting after ");
	unsigned waited = 0;
	cr_assert(said && sscanf(said, "still waiting after %u ms", &waited) == 1, "error: %s",
		  err);
	cr_assert(waited >= 100 && waited < 5000, "waited %u ms: %s", waited, err);
	cr_assert(eq(u32, hconn_of(handlers_sess_of(&fx.h, fx.br->clients->next))->inflight, 0));
	close(a);
	close(b);
}

Test(parked, alloc_completes_when_the_holder_disconnects)
{
	int a = hello_client("a", false, false), b = hello_client("b", false, false);
	struct msg drop, last, parts[4];
	uint64_t id;
	int n;

	alloc_ok(a, 6 * GiB, "kv");
	cr_assert(eq(i32, status_only(a, send_tag_req(a, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL, 0),
		     0));
	cr_assert(eq(i32, fx_recv(a, &drop), 0));
	msg_free(&drop);
	id = send_alloc(b, 6 * GiB, "kv");
	expect_no_packet(b);
	close(a);
	recv_reply(b, id, &last, parts, &n);
	cr_assert(eq(i32, last.env->status, 0), "alloc: %s", last.env->error);
	for (int i = 0; i < n; i++)
		msg_free(&parts[i]);
	msg_free(&last);
	close(b);
}

Test(parked, resume_splits_fds_and_lends_into_parts)
{
	int a = hello_client("a", false, false);
	size_t nallocs = 1200, fds = 0, lends = 0, fd_parts = 0, lend_parts = 0;
	struct msg m;
	uint64_t id;
	bool more;

	for (size_t i = 0; i < nallocs; i++)
		alloc_ok(a, 2 * MiB, "kv");
	cr_assert(eq(i32, status_only(a, send_tag_req(a, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL, 0),
		     0));
	/* Nothing kept warm: the handles must go, then the chunks. */
	cr_assert(eq(i32, fx_recv(a, &m), 0));
	cr_assert(eq(sz, m.env->drop->n_chunk_ids, nallocs));
	send_reply(a, m.env->id, 0);
	msg_free(&m);
	hfx_spin(&fx);
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 0));
	id = send_tag_req(a, GMB__ENVELOPE__BODY_RESUME, "kv");
	do {
		cr_assert(eq(i32, fx_recv(a, &m), 0));
		cr_assert(eq(u64, m.env->reply_to, id));
		cr_assert(le(sz, gmb__envelope__get_packed_size(m.env), WIRE_MAX_MSG / 2));
		if (m.nfds) {
			cr_assert(eq(i32, lend_parts, 0), "fds come before every lend");
			cr_assert(le(i32, m.nfds, WIRE_MAX_FDS));
			cr_assert(m.env->more);
			fds += (size_t)m.nfds;
			fd_parts++;
		} else {
			cr_assert(eq(i32, m.env->body_case, GMB__ENVELOPE__BODY_RESUME_REPLY));
			lends += m.env->resume_reply->n_lends;
			lend_parts++;
		}
		more = m.env->more;
		msg_free(&m); /* closes this part's fds at once */
	} while (more);
	cr_assert(eq(sz, fds, nallocs));
	cr_assert(eq(sz, fd_parts, (nallocs + WIRE_MAX_FDS - 1) / WIRE_MAX_FDS));
	cr_assert(eq(sz, lends, nallocs));
	cr_assert(ge(sz, lend_parts, 2));
	close(a);
}

/* ---- outgoing queue ---- */

Test(handlers, replies_queue_while_the_client_does_not_read)
{
	int t = hello_client("ctl", false, true);
	uint64_t first = 0, last = 0;
	struct msg m;

	/* Far more small replies than a socket buffer holds. */
	for (int i = 0; i < 1000; i++) {
		last = send_req(t, GMB__ENVELOPE__BODY_STATUS_REQ,
				&(Gmb__StatusRequest)GMB__STATUS_REQUEST__INIT);
		first = first ? first : last;
	}
	hfx_spin(&fx);
	cr_assert(gt(u32, server_sessions(fx.srv)->out_count, 0), "nothing was queued");
	for (uint64_t id = first; id <= last; id++) {
		cr_assert(eq(i32, fx_recv(t, &m), 0));
		cr_assert(eq(u64, m.env->reply_to, id), "replies keep their order");
		msg_free(&m);
	}
	hfx_spin(&fx);
	cr_assert(eq(u32, server_sessions(fx.srv)->out_count, 0));
	cr_assert(eq(i32, server_sessions(fx.srv)->poll_events, UV_READABLE));
	close(t);
}

Test(handlers, a_client_that_never_reads_is_dropped)
{
	int t = hello_client("ctl", false, true);
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest sr = GMB__STATUS_REQUEST__INIT;
	uint64_t end = hfx_now_ms() + WAIT_MS;
	int r = 0;

	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &sr;
	for (int i = 0; i < 2 * SESS_OUT_MAX_PACKETS && fx.br->nclients; i++) {
		env.id = ++fx_next_id;
		while ((r = wire_send(t, &env, NULL, 0)) == -EAGAIN && hfx_now_ms() < end)
			uv_run(&fx.loop, UV_RUN_NOWAIT);
		if (r < 0)
			break;
		if ((i & 63) == 0)
			uv_run(&fx.loop, UV_RUN_NOWAIT);
	}
	hfx_spin(&fx);
	cr_assert(eq(u32, fx.br->nclients, 0), "still connected (last send: %d)", r);
	expect_eof(t);
}

/* ---- accepting ---- */

/* Turns the loop until @pred holds (WAIT_MS at most). */
static void spin_until(bool (*pred)(struct server *), struct server *srv)
{
	uint64_t end = hfx_now_ms() + WAIT_MS;

	while (!pred(srv)) {
		cr_assert(lt(u64, hfx_now_ms(), end), "condition not met within %d ms", WAIT_MS);
		uv_run(&fx.loop, UV_RUN_NOWAIT);
		poll(NULL, 0, 1);
	}
}

static bool srv_paused(struct server *srv)
{
	return srv->emfile_paused;
}

static bool srv_has_session(struct server *srv)
{
	return srv->host.nsessions == 1;
}

Test(handlers, accept_pauses_on_emfile_and_resumes)
{
	char dir[] = "/tmp/gmbd-test-XXXXXX", path[64];
	struct rlimit old, low;
	struct server *srv;
	struct msg m;
	int lfd, cfd, spare;

	cr_assert(not(eq(ptr, mkdtemp(dir), NULL)));
	snprintf(path, sizeof(path), "%s/gmbd.sock", dir);
	cr_assert(eq(i32, wire_listen(path, &lfd), 0));
	cr_assert(eq(i32, server_start(&fx.loop, lfd, &handlers_sess_ops, &fx.h, &srv), 0));
	cr_assert(eq(i32, wire_connect(path, &cfd), 0));
	/* No fd number left below the limit: accept4() says EMFILE. */
	spare = dup(0);
	cr_assert(ge(i32, spare, 0));
	close(spare);
	cr_assert(eq(i32, getrlimit(RLIMIT_NOFILE, &old), 0));
	low = old;
	low.rlim_cur = (rlim_t)spare;
	cr_assert(eq(i32, setrlimit(RLIMIT_NOFILE, &low), 0));
	spin_until(srv_paused, srv);
	cr_assert(eq(u32, srv->host.nsessions, 0));
	cr_assert(eq(i32, setrlimit(RLIMIT_NOFILE, &old), 0));
	spin_until(srv_has_session, srv);
	cr_assert(not(srv->emfile_paused));
	cr_assert(eq(i32, fcntl(cfd, F_SETFL, O_NONBLOCK), 0));
	recv_reply(cfd, send_hello(cfd, GMB_PROTOCOL_VERSION, "late", false, false), &m, NULL,
		   NULL);
	cr_assert(eq(i32, m.env->status, 0));
	msg_free(&m);
	close(cfd);
	server_stop(srv);
	unlink(path);
	rmdir(dir);
}

/* ---- control forwarding ---- */

Test(handlers, control_is_forwarded_and_answered)
{
	int w = hello_client("worker", true, false), t = hello_client("ctl", false, true);
	uint64_t id = send_control(t, "worker", GMB__OP__OP_PAUSE, "kv");
	struct msg cmd;

	cr_assert(eq(i32, fx_recv(w, &cmd), 0));
	cr_assert(eq(i32, cmd.env->body_case, GMB__ENVELOPE__BODY_CONTROL_CMD));
	cr_assert(ne(u64, cmd.env->id, 0));
	cr_assert(eq(i32, cmd.env->control_cmd->op, GMB__OP__OP_PAUSE));
	cr_assert(eq(str, cmd.env->control_cmd->tag, "kv"));
	expect_no_packet(t);
	send_reply(w, cmd.env->id, 0);
	msg_free(&cmd);
	cr_assert(eq(i32, status_only(t, id, NULL, 0), 0));
	close(w);
	close(t);
}

Test(handlers, control_refusal_reaches_the_operator)
{
	int w = hello_client("worker", true, false), t = hello_client("ctl", false, true);
	uint64_t id = send_control(t, "worker", GMB__OP__OP_RESUME, "");
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	char err[ERR_MSG_MAX];
	struct msg cmd;

	cr_assert(eq(i32, fx_recv(w, &cmd), 0));
	env.reply_to = cmd.env->id;
	env.status = -EBUSY;
	env.error = "mid-step";
	cr_assert(eq(i32, wire_send(w, &env, NULL, 0), 0));
	msg_free(&cmd);
	cr_assert(eq(i32, status_only(t, id, err, sizeof(err)), -EBUSY));
	cr_assert(not(eq(ptr, strstr(err, "mid-step"), NULL)), "error: %s", err);
	close(w);
	close(t);
}

Test(handlers, control_times_out_and_a_late_reply_is_fine)
{
	int w = hello_client("worker", true, false), t = hello_client("ctl", false, true);
	struct msg cmd;
	uint64_t id;

	fx.h.control_timeout_ms = 50;
	id = send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, fx_recv(w, &cmd), 0));
	cr_assert(eq(i32, status_only(t, id, NULL, 0), -ETIMEDOUT));
	send_reply(w, cmd.env->id, 0);
	msg_free(&cmd);
	/* The worker is still connected and served. */
	alloc_ok(w, 2 * MiB, "kv");
	close(w);
	close(t);
}

Test(handlers, control_target_disconnect_answers_econnreset)
{
	int w = hello_client("worker", true, false), t = hello_client("ctl", false, true);
	uint64_t id = send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	struct msg cmd;

	cr_assert(eq(i32, fx_recv(w, &cmd), 0));
	msg_free(&cmd);
	close(w);
	cr_assert(eq(i32, status_only(t, id, NULL, 0), -ECONNRESET));
	close(t);
}

Test(handlers, control_operator_leaving_is_forgotten)
{
	int w = hello_client("worker", true, false), t = hello_client("ctl", false, true);
	struct msg cmd;

	send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, fx_recv(w, &cmd), 0));
	close(t);
	hfx_spin(&fx);
	send_reply(w, cmd.env->id, 0);
	msg_free(&cmd);
	alloc_ok(w, 2 * MiB, "kv");
	close(w);
}

Test(handlers, control_errors)
{
	int w = hello_client("worker", true, false), n = hello_client("plain", false, false);
	int d1 = hello_client("dup", true, false), d2 = hello_client("dup", true, false);
	int t = hello_client("ctl", false, true);
	struct msg cmd;

	cr_assert(eq(i32, status_only(t, send_control(t, "ghost", 1, ""), NULL, 0), -ENOENT));
	cr_assert(eq(i32, status_only(t, send_control(t, "plain", 1, ""), NULL, 0), -EOPNOTSUPP));
	cr_assert(eq(i32, status_only(t, send_control(t, "dup", 1, ""), NULL, 0), -ENOTUNIQ));
	cr_assert(eq(i32, status_only(t, send_control(t, "worker", 7, ""), NULL, 0), -EINVAL));
	send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, fx_recv(w, &cmd), 0));
	cr_assert(eq(i32, status_only(t, send_control(t, "worker", 2, ""), NULL, 0), -EBUSY));
	msg_free(&cmd);
	close(w);
	close(n);
	close(d1);
	close(d2);
	close(t);
}

Test(handlers, inflight_limit_answers_eagain)
{
	int targets[WIRE_MAX_INFLIGHT + 1];
	int t = hello_client("ctl", false, true);
	char name[32];
	uint64_t last;

	for (int i = 0; i <= WIRE_MAX_INFLIGHT; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		targets[i] = hello_client(name, true, false);
	}
	for (int i = 0; i < WIRE_MAX_INFLIGHT; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		send_control(t, name, GMB__OP__OP_PAUSE, "");
	}
	snprintf(name, sizeof(name), "t%d", WIRE_MAX_INFLIGHT);
	last = send_control(t, name, GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, status_only(t, last, NULL, 0), -EAGAIN));
	/* The targets leave without answering: every forward gets ECONNRESET. */
	for (int i = 0; i <= WIRE_MAX_INFLIGHT; i++)
		close(targets[i]);
	for (int i = 0; i < WIRE_MAX_INFLIGHT; i++) {
		struct msg m;

		cr_assert(eq(i32, fx_recv(t, &m), 0));
		cr_assert(eq(i32, m.env->status, -ECONNRESET));
		msg_free(&m);
	}
	close(t);
}

/* ---- a rejoin's credentials ---- */

/* The record's gid and groups are the old process's: the new session's win. */
Test(handlers, a_rejoin_takes_the_new_session_s_groups)
{
	static gid_t stale[] = { 4242, 4243 };
	struct broker_peer peer = { .pid = getpid(),
				    .uid = getuid(),
				    .gid = 4242,
				    .groups = stale,
				    .ngroups = 2,
				    .start_time = proc_start_time(getpid(), NULL) };
	Gmb__Hello h = GMB__HELLO__INIT;
	Gmb__RejoinRequest rj = GMB__REJOIN_REQUEST__INIT;
	static gid_t now[NGROUPS_MAX];
	int n = getgroups(NGROUPS_MAX, now), fd;
	struct bclient *c;
	struct msg m;
	uint64_t id;

	cr_assert(ge(i32, n, 0));
	cr_assert(eq(i32, broker_restore_client(fx.br, &peer, 77, "back", true, &c), 0));
	fd = fx_client();
	h.version = GMB_PROTOCOL_VERSION;
	h.name = "back";
	h.control = true;
	h.rejoin_id = 77;
	id = send_req(fd, GMB__ENVELOPE__BODY_HELLO, &h);
	recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "rejoin hello: %s", m.env->error);
	msg_free(&m);
	cr_assert(eq(u32, (unsigned)c->gid, (unsigned)getgid()), "the record's gid stayed");
	cr_assert(eq(i32, c->ngroups, n), "the record's groups stayed");
	for (int i = 0; i < c->ngroups; i++)
		cr_assert(not(eq(u32, (unsigned)c->groups[i], 4243)));
	rj.last = true;
	id = send_req(fd, GMB__ENVELOPE__BODY_REJOIN, &rj);
	recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "rejoin: %s", m.env->error);
	msg_free(&m);
	close(fd);
}

/* ---- a remote pause that timed out ---- */

/* The state status gives @fd's first client's first tag. */
static void expect_first_tag_state(int fd, const char *want)
{
	const Gmb__StatusReply *sr;
	struct msg m;

	recv_reply(fd,
		   send_req(fd, GMB__ENVELOPE__BODY_STATUS_REQ,
			    &(Gmb__StatusRequest)GMB__STATUS_REQUEST__INIT),
		   &m, NULL, NULL);
	sr = m.env->status_reply;
	cr_assert(eq(sz, sr->n_clients, 1));
	cr_assert(ge(sz, sr->clients[0]->n_tags, 1));
	cr_assert(eq(str, sr->clients[0]->tags[0]->state, (char *)want));
	msg_free(&m);
}

/* The command is with the client: the operator and status say it may still happen. */
Test(handlers, a_timed_out_pause_is_shown_pausing_until_answered)
{
	int w = hello_client("worker", true, false), t = hello_client("ctl", false, true);
	char err[ERR_MSG_MAX];
	struct msg cmd;
	uint64_t id;

	alloc_ok(w, 2 * MiB, "kv");
	fx.h.control_timeout_ms = 50;
	id = send_control(t, "worker", GMB__OP__OP_PAUSE, "kv");
	cr_assert(eq(i32, fx_recv(w, &cmd), 0));
	cr_assert(eq(i32, status_only(t, id, err, sizeof(err)), -ETIMEDOUT));
	cr_assert(not(eq(ptr, strstr(err, "may still carry it out"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "\"pausing\""), NULL)), "%s", err);
	expect_first_tag_state(t, "pausing");
	send_reply(w, cmd.env->id, 0);
	msg_free(&cmd);
	hfx_spin(&fx); /* the late reply first: it is on another socket */
	expect_first_tag_state(t, "active");
	close(w);
	close(t);
}
