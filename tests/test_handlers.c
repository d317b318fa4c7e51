/*
 * test_handlers.c - gmbd's handlers through the real dispatch: each client
 * is the test's end of a socketpair(AF_UNIX, SOCK_SEQPACKET) whose other end
 * is a real session on a real uv loop, over the real broker on the host
 * backend (8 GiB, 2 MiB granularity, 1 GiB chunks; tests/handlers_msg.h).
 * The test plays the client with wire_send()/wire_recv() and turns the loop
 * while it waits. Here: hello, protocol errors, memory requests, parked
 * requests, the outgoing queue and accepting; control commands are in
 * test_control.c. Every test ends with uv_loop_close() == 0 (hm_teardown()).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/handlers.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/server.h"
#include "daemon/transport/sess.h"
#include "tests/handlers_fx.h"
#include "tests/handlers_msg.h"

TestSuite(handlers, .init = hm_setup, .fini = hm_teardown, .timeout = 30);

/* ---- hello ---- */

Test(handlers, hello_first_gets_devices_and_an_id)
{
	int fd = hm_client();
	uint64_t id = hm_send_hello(fd, GMB_PROTOCOL_VERSION, "trainer", false, false);
	const Gmb__HelloReply *hr;
	struct hm_msg m;

	hm_recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0));
	hr = m.env->hello_reply;
	cr_assert(eq(u32, hr->version, GMB_PROTOCOL_VERSION));
	cr_assert(ne(u64, hr->client_id, 0));
	cr_assert(eq(str, hr->backend, "host"));
	cr_assert(eq(sz, hr->n_devices, 1));
	cr_assert(eq(u64, hr->devices[0]->total_bytes, 8 * GiB));
	cr_assert(eq(u64, hr->devices[0]->granularity, 2 * MiB));
	cr_assert(eq(str, hm_fx.br->clients->name, "trainer"));
	cr_assert(
		eq(ptr, handlers_sess_of(&hm_fx.h, hm_fx.br->clients), server_sessions(hm_fx.srv)));
	hm_msg_free(&m);
	close(fd);
}

Test(handlers, version_mismatch_is_answered_then_closed)
{
	int fd = hm_client();
	uint64_t id = hm_send_hello(fd, 2, "future", false, false);
	struct hm_msg m;

	hm_recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, -EPROTO));
	cr_assert(not(eq(ptr, strstr(m.env->error, "protocol version 2, gmbd speaks 1"), NULL)),
		  "error: %s", m.env->error);
	hm_msg_free(&m);
	hm_expect_eof(fd);
	cr_assert(eq(u32, hm_fx.br->nclients, 0));
}

Test(handlers, empty_name_becomes_pid)
{
	int fd = hm_hello_client("", false, false);
	char want[32];

	snprintf(want, sizeof(want), "pid-%d", (int)getpid());
	cr_assert(eq(str, hm_fx.br->clients->name, want));
	close(fd);
}

Test(handlers, bad_names_are_refused_and_the_session_stays)
{
	char longname[WIRE_MAX_NAME + 2];
	const char *bad[] = { "tab\there", "\xc3\x28", "\xed\xa0\x80", "esc\x1b[31m", longname };
	int fd = hm_client();

	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t id = hm_send_hello(fd, GMB_PROTOCOL_VERSION, bad[i], false, false);

		cr_assert(eq(i32, hm_status_only(fd, id, NULL, 0), -EINVAL), "name %zu", i);
	}
	cr_assert(eq(u32, hm_fx.br->nclients, 0));
	/* UTF-8 is fine. */
	cr_assert(eq(i32, hm_status_only(fd, hm_send_hello(fd, 1, "wörker-ü", 0, 0), NULL, 0), 0));
	cr_assert(eq(u32, hm_fx.br->nclients, 1));
	close(fd);
}

/* ---- protocol errors ---- */

Test(handlers, request_before_hello_disconnects)
{
	int fd = hm_client();

	hm_send_alloc(fd, 2 * MiB, "kv");
	hm_expect_eof(fd);
}

Test(handlers, second_hello_disconnects)
{
	int fd = hm_hello_client("w", false, false);

	hm_send_hello(fd, GMB_PROTOCOL_VERSION, "w", false, false);
	hm_expect_eof(fd);
	hfx_spin(&hm_fx);
	cr_assert(eq(u32, hm_fx.br->nclients, 0));
}

Test(handlers, garbage_bytes_disconnect)
{
	int fd = hm_hello_client("w", false, false);
	const char junk[] = "\xff\xff\xff\xff\xff\xff\xff\xff garbage";

	cr_assert(eq(i64, send(fd, junk, sizeof(junk), 0), (long)sizeof(junk)));
	hm_expect_eof(fd);
	hfx_spin(&hm_fx);
	cr_assert(eq(u32, hm_fx.br->nclients, 0));
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
	int fd = hm_hello_client("w", false, false);
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
	hm_expect_eof(fd);
	hfx_spin(&hm_fx);
	cr_assert(eq(u32, hm_fx.br->nclients, 0));
	/* The session's socket and the fd it was sent are closed too. */
	cr_assert(eq(i32, count_open_fds(), before));
}

Test(handlers, reply_to_nothing_disconnects)
{
	int fd = hm_hello_client("w", false, false);

	hm_send_reply(fd, 12345, 0);
	hm_expect_eof(fd);
}

Test(handlers, request_without_id_or_body_disconnects)
{
	int a = hm_hello_client("a", false, false), b = hm_hello_client("b", false, false);
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest sr = GMB__STATUS_REQUEST__INIT;

	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &sr;
	cr_assert(eq(i32, wire_send(a, &env, NULL, 0), 0));
	hm_expect_eof(a);
	/* A daemon-only body from a client. */
	hm_send_req(b, GMB__ENVELOPE__BODY_DROP, &(Gmb__DropRequest)GMB__DROP_REQUEST__INIT);
	hm_expect_eof(b);
}

/* ---- memory requests ---- */

Test(handlers, alloc_sends_fds_then_the_lend)
{
	int fd = hm_hello_client("w", false, false);
	uint64_t id = hm_send_alloc(fd, 3 * GiB, "kv");
	struct hm_msg last, parts[4];
	const Gmb__Lend *l;
	int n;

	hm_recv_reply(fd, id, &last, parts, &n);
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
	cr_assert(eq(u64, hm_fx.br->pools[0].lent_bytes, 3 * GiB));
	hm_msg_free(&parts[0]);
	hm_msg_free(&last);
	close(fd);
}

Test(handlers, alloc_errors_are_replies)
{
	int fd = hm_hello_client("w", false, false);
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;
	char err[ERR_MSG_MAX];

	a.device = 7;
	a.size = MiB;
	cr_assert(eq(i32,
		     hm_status_only(fd, hm_send_req(fd, GMB__ENVELOPE__BODY_ALLOC, &a), err,
				    sizeof(err)),
		     -ENODEV));
	cr_assert(eq(i32, hm_status_only(fd, hm_send_alloc(fd, 9 * GiB, "kv"), err, sizeof(err)),
		     -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "budget"), NULL)), "error: %s", err);
	cr_assert(eq(i32, hm_status_only(fd, hm_send_alloc(fd, 0, "kv"), NULL, 0), -EINVAL));
	/* Still connected. */
	hm_alloc_ok(fd, 2 * MiB, "kv");
	close(fd);
}

Test(handlers, free_and_disconnect_return_memory)
{
	int fd = hm_hello_client("w", false, false);
	uint64_t a1 = hm_alloc_ok(fd, 2 * GiB, "kv");
	Gmb__FreeRequest fr = GMB__FREE_REQUEST__INIT;

	hm_alloc_ok(fd, 3 * GiB, "w");
	cr_assert(eq(u64, hm_fx.br->pools[0].lent_bytes, 5 * GiB));
	fr.alloc_id = a1;
	cr_assert(eq(i32,
		     hm_status_only(fd, hm_send_req(fd, GMB__ENVELOPE__BODY_FREE, &fr), NULL, 0),
		     0));
	cr_assert(eq(u64, hm_fx.br->pools[0].lent_bytes, 3 * GiB));
	cr_assert(eq(i32,
		     hm_status_only(fd, hm_send_req(fd, GMB__ENVELOPE__BODY_FREE, &fr), NULL, 0),
		     -ENOENT));
	close(fd);
	hfx_spin(&hm_fx);
	cr_assert(eq(u32, hm_fx.br->nclients, 0));
	cr_assert(eq(u64, hm_fx.br->pools[0].lent_bytes, 0));
}

Test(handlers, pause_then_resume_reuses_held_chunks_without_fds)
{
	int fd = hm_hello_client("w", false, false);
	struct hm_msg last, parts[4];
	int n;

	hm_alloc_ok(fd, 2 * GiB, "kv");
	cr_assert(eq(i32,
		     hm_status_only(fd, hm_send_tag_req(fd, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL,
				    0),
		     0));
	cr_assert(eq(u64, hm_fx.br->pools[0].lent_bytes, 0));
	hm_recv_reply(fd, hm_send_tag_req(fd, GMB__ENVELOPE__BODY_RESUME, "kv"), &last, parts, &n);
	cr_assert(eq(i32, n, 0), "the client holds the handles: no fds");
	cr_assert(eq(i32, last.env->status, 0));
	cr_assert(eq(i32, last.env->body_case, GMB__ENVELOPE__BODY_RESUME_REPLY));
	cr_assert(eq(sz, last.env->resume_reply->n_lends, 1));
	cr_assert(eq(u64, last.env->resume_reply->lends[0]->size, 2 * GiB));
	cr_assert(eq(u64, hm_fx.br->pools[0].lent_bytes, 2 * GiB));
	hm_msg_free(&last);
	cr_assert(eq(i32,
		     hm_status_only(fd, hm_send_tag_req(fd, GMB__ENVELOPE__BODY_PAUSE, "nope"),
				    NULL, 0),
		     -ENOENT));
	close(fd);
}

Test(handlers, status_lists_clients_tags_and_pools)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	Gmb__TagModeRequest tm = GMB__TAG_MODE_REQUEST__INIT;
	const Gmb__StatusReply *sr;
	const Gmb__ClientInfo *ci;
	struct hm_msg m;

	hm_alloc_ok(w, 3 * GiB, "kv");
	tm.tag = "weights";
	tm.mode = GMB__MODE__MODE_PRESERVE;
	cr_assert(eq(i32,
		     hm_status_only(w, hm_send_req(w, GMB__ENVELOPE__BODY_TAG_MODE, &tm), NULL, 0),
		     0));
	hm_recv_reply(t,
		      hm_send_req(t, GMB__ENVELOPE__BODY_STATUS_REQ,
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
	hm_msg_free(&m);
	close(w);
	close(t);
}

Test(handlers, trim_releases_free_chunks)
{
	int fd = hm_hello_client("w", false, false), t = hm_hello_client("ctl", false, true);
	Gmb__TrimRequest tr = GMB__TRIM_REQUEST__INIT;
	struct hm_msg m, drop;

	hm_alloc_ok(fd, 2 * GiB, "kv");
	cr_assert(eq(i32,
		     hm_status_only(fd, hm_send_tag_req(fd, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL,
				    0),
		     0));
	tr.device = -1;
	hm_recv_reply(t, hm_send_req(t, GMB__ENVELOPE__BODY_TRIM, &tr), &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "trim: %s", m.env->error);
	/* The worker still holds the handles: pending until it drops them. */
	cr_assert(eq(u64, m.env->trim_reply->released_bytes, 0));
	cr_assert(eq(u64, m.env->trim_reply->pending_bytes, 2 * GiB));
	hm_msg_free(&m);
	cr_assert(eq(i32, hm_recv(fd, &drop), 0));
	cr_assert(eq(i32, drop.env->body_case, GMB__ENVELOPE__BODY_DROP));
	cr_assert(ne(u64, drop.env->id, 0));
	cr_assert(eq(sz, drop.env->drop->n_chunk_ids, 2));
	hm_send_reply(fd, drop.env->id, 0);
	hm_msg_free(&drop);
	hfx_spin(&hm_fx);
	cr_assert(eq(u64, hm_fx.br->pools[0].held_bytes, 0));
	tr.device = 3;
	cr_assert(eq(i32, hm_status_only(t, hm_send_req(t, GMB__ENVELOPE__BODY_TRIM, &tr), NULL, 0),
		     -ENODEV));
	close(fd);
	close(t);
}

/* ---- parked requests ---- */

/* Keep nothing warm: a pause asks the holder to drop its handles. */
static void setup_keep0(void)
{
	hm_start(0);
}

TestSuite(parked, .init = setup_keep0, .fini = hm_teardown, .timeout = 30);

/* Pauses @fd's tag "kv" (nothing kept warm: gmbd then asks for its handles). */
static void parked_pause(int fd)
{
	cr_assert(eq(i32,
		     hm_status_only(fd, hm_send_tag_req(fd, GMB__ENVELOPE__BODY_PAUSE, "kv"), NULL,
				    0),
		     0));
}

/* A holds 6 GiB of "kv" and pauses it: the drop gmbd sends A lands in *@drop. */
static void parked_holder(int a, struct hm_msg *drop)
{
	hm_alloc_ok(a, 6 * GiB, "kv");
	parked_pause(a);
	cr_assert(eq(i32, hm_recv(a, drop), 0));
}

Test(parked, alloc_completes_after_the_drop_ack)
{
	int a = hm_hello_client("a", false, false), b = hm_hello_client("b", false, false);
	struct hm_msg drop, last, parts[4];
	uint64_t id;
	int n;

	parked_holder(a, &drop);
	cr_assert(eq(i32, drop.env->body_case, GMB__ENVELOPE__BODY_DROP));
	id = hm_send_alloc(b, 6 * GiB, "kv");
	hm_expect_no_packet(b);
	cr_assert(eq(u32, hconn_of(handlers_sess_of(&hm_fx.h, hm_fx.br->clients->next))->inflight,
		     1));
	hm_send_reply(a, drop.env->id, 0);
	hm_msg_free(&drop);
	hm_recv_reply(b, id, &last, parts, &n);
	cr_assert(eq(i32, last.env->status, 0), "alloc: %s", last.env->error);
	cr_assert(eq(u64, last.env->alloc_reply->lend->size, 6 * GiB));
	for (int i = 0; i < n; i++)
		hm_msg_free(&parts[i]);
	hm_msg_free(&last);
	close(a);
	close(b);
}

Test(parked, alloc_fails_with_enomem_at_its_deadline)
{
	int a = hm_hello_client("a", false, false), b = hm_hello_client("b", false, false);
	char err[ERR_MSG_MAX];
	struct hm_msg drop;

	hm_fx.h.park_timeout_ms = 100;
	parked_holder(a, &drop);
	hm_msg_free(&drop); /* never answered */
	cr_assert(eq(i32, hm_status_only(b, hm_send_alloc(b, 6 * GiB, "kv"), err, sizeof(err)),
		     -ENOMEM));
	/* The time said is the time waited: the deadline, or a loaded machine's bit more. */
	const char *said = strstr(err, "still waiting after ");
	unsigned waited = 0;
	cr_assert(said && sscanf(said, "still waiting after %u ms", &waited) == 1, "error: %s",
		  err);
	cr_assert(waited >= 100 && waited < 5000, "waited %u ms: %s", waited, err);
	cr_assert(eq(u32, hconn_of(handlers_sess_of(&hm_fx.h, hm_fx.br->clients->next))->inflight,
		     0));
	close(a);
	close(b);
}

Test(parked, alloc_completes_when_the_holder_disconnects)
{
	int a = hm_hello_client("a", false, false), b = hm_hello_client("b", false, false);
	struct hm_msg drop, last, parts[4];
	uint64_t id;
	int n;

	parked_holder(a, &drop);
	hm_msg_free(&drop);
	id = hm_send_alloc(b, 6 * GiB, "kv");
	hm_expect_no_packet(b);
	close(a);
	hm_recv_reply(b, id, &last, parts, &n);
	cr_assert(eq(i32, last.env->status, 0), "alloc: %s", last.env->error);
	for (int i = 0; i < n; i++)
		hm_msg_free(&parts[i]);
	hm_msg_free(&last);
	close(b);
}

Test(parked, resume_splits_fds_and_lends_into_parts)
{
	int a = hm_hello_client("a", false, false);
	size_t nallocs = 1200, fds = 0, lends = 0, fd_parts = 0, lend_parts = 0;
	struct hm_msg m;
	uint64_t id;
	bool more;

	for (size_t i = 0; i < nallocs; i++)
		hm_alloc_ok(a, 2 * MiB, "kv");
	parked_pause(a);
	/* Nothing kept warm: the handles must go, then the chunks. */
	cr_assert(eq(i32, hm_recv(a, &m), 0));
	cr_assert(eq(sz, m.env->drop->n_chunk_ids, nallocs));
	hm_send_reply(a, m.env->id, 0);
	hm_msg_free(&m);
	hfx_spin(&hm_fx);
	cr_assert(eq(u64, hm_fx.br->pools[0].held_bytes, 0));
	id = hm_send_tag_req(a, GMB__ENVELOPE__BODY_RESUME, "kv");
	do {
		cr_assert(eq(i32, hm_recv(a, &m), 0));
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
		hm_msg_free(&m); /* closes this part's fds at once */
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
	int t = hm_hello_client("ctl", false, true);
	uint64_t first = 0, last = 0;
	struct hm_msg m;

	/* Far more small replies than a socket buffer holds. */
	for (int i = 0; i < 1000; i++) {
		last = hm_send_req(t, GMB__ENVELOPE__BODY_STATUS_REQ,
				   &(Gmb__StatusRequest)GMB__STATUS_REQUEST__INIT);
		first = first ? first : last;
	}
	hfx_spin(&hm_fx);
	cr_assert(gt(u32, server_sessions(hm_fx.srv)->out_count, 0), "nothing was queued");
	for (uint64_t id = first; id <= last; id++) {
		cr_assert(eq(i32, hm_recv(t, &m), 0));
		cr_assert(eq(u64, m.env->reply_to, id), "replies keep their order");
		hm_msg_free(&m);
	}
	hfx_spin(&hm_fx);
	cr_assert(eq(u32, server_sessions(hm_fx.srv)->out_count, 0));
	cr_assert(eq(i32, server_sessions(hm_fx.srv)->poll_events, UV_READABLE));
	close(t);
}

Test(handlers, a_client_that_never_reads_is_dropped)
{
	int t = hm_hello_client("ctl", false, true);
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest sr = GMB__STATUS_REQUEST__INIT;
	uint64_t end = hfx_now_ms() + HM_WAIT_MS;
	int r = 0;

	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &sr;
	for (int i = 0; i < 2 * SESS_OUT_MAX_PACKETS && hm_fx.br->nclients; i++) {
		env.id = ++hm_next_id;
		while ((r = wire_send(t, &env, NULL, 0)) == -EAGAIN && hfx_now_ms() < end)
			uv_run(&hm_fx.loop, UV_RUN_NOWAIT);
		if (r < 0)
			break;
		if ((i & 63) == 0)
			uv_run(&hm_fx.loop, UV_RUN_NOWAIT);
	}
	hfx_spin(&hm_fx);
	cr_assert(eq(u32, hm_fx.br->nclients, 0), "still connected (last send: %d)", r);
	hm_expect_eof(t);
}

/* ---- accepting ---- */

/* Turns the loop until @pred holds (HM_WAIT_MS at most). */
static void spin_until(bool (*pred)(struct server *), struct server *srv)
{
	uint64_t end = hfx_now_ms() + HM_WAIT_MS;

	while (!pred(srv)) {
		cr_assert(lt(u64, hfx_now_ms(), end), "condition not met within %d ms", HM_WAIT_MS);
		uv_run(&hm_fx.loop, UV_RUN_NOWAIT);
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
	struct hm_msg m;
	int lfd, cfd, spare;

	cr_assert(not(eq(ptr, mkdtemp(dir), NULL)));
	snprintf(path, sizeof(path), "%s/gmbd.sock", dir);
	cr_assert(eq(i32, wire_listen(path, &lfd), 0));
	cr_assert(eq(i32, server_start(&hm_fx.loop, lfd, &handlers_sess_ops, &hm_fx.h, &srv), 0));
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
	hm_recv_reply(cfd, hm_send_hello(cfd, GMB_PROTOCOL_VERSION, "late", false, false), &m, NULL,
		      NULL);
	cr_assert(eq(i32, m.env->status, 0));
	hm_msg_free(&m);
	close(cfd);
	server_stop(srv);
	unlink(path);
	rmdir(dir);
}
