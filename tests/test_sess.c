/*
 * test_sess.c - the transport alone: a server and its sessions over a
 * socketpair, with the test's own struct sess_ops in place of the handlers
 * and no broker. What the layer above sees is exactly what the callbacks
 * report: one open per connection, every packet in order, the fds of a
 * packet asked for at send time, gone once, and the state freed with the
 * session's last reference.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/log.h"
#include "common/wire.h"
#include "daemon/transport/server.h"
#include "daemon/transport/sess.h"
#include "tests/util.h"

#define TS_WAIT_TURNS 200

static struct {
	uv_loop_t loop;
	struct server *srv;
	struct sess *s; /* the last session opened */
	int opened, gone, freed, exports;
	uint64_t ids[8]; /* ids of the packets received, in order */
	int nrecv;
	int data;    /* what open() hands the session */
	bool reply;  /* recv answers each packet */
	int cork_rc; /* what the cork callback returns: < 0 holds the replies */
} ts;

static int ts_open(void *arg, struct sess *s, void **data)
{
	cr_assert(eq(ptr, arg, &ts));
	ts.s = s;
	ts.opened++;
	*data = &ts.data;
	return 0;
}

static void ts_recv(void *arg, struct sess *s, Gmb__Envelope *env)
{
	cr_assert(eq(ptr, s->data, &ts.data));
	if (ts.nrecv < 8)
		ts.ids[ts.nrecv] = env->id;
	ts.nrecv++;
	if (ts.reply) {
		Gmb__Envelope r = GMB__ENVELOPE__INIT;

		r.reply_to = env->id;
		sess_send(s, &r);
	}
	gmb__envelope__free_unpacked(env, NULL);
}

static void ts_gone(void *arg, struct sess *s)
{
	ts.gone++;
}

static void ts_free_data(void *data)
{
	cr_assert(eq(ptr, data, &ts.data));
	ts.freed++;
}

/* One memfd per id, as the backend's chunk_export makes them. */
static int ts_export_fds(void *arg, const uint64_t *ids, size_t n, int *fds)
{
	for (size_t i = 0; i < n; i++) {
		fds[i] = memfd_create("ts", MFD_CLOEXEC);
		cr_assert(ge(i32, fds[i], 0));
	}
	ts.exports++;
	return 0;
}

static int ts_cork(void *arg)
{
	return ts.cork_rc;
}

static const char *ts_body_name(int body_case)
{
	return "test";
}

static const struct sess_ops ts_ops = {
	.open = ts_open,
	.recv = ts_recv,
	.gone = ts_gone,
	.free_data = ts_free_data,
	.export_fds = ts_export_fds,
	.body_name = ts_body_name,
};

static void setup(void)
{
	memset(&ts, 0, sizeof(ts));
	log_max_level = LOG_LVL_WARNING;
	/* The layers' log lines: the test's file, shown if it fails. */
	cr_assert(eq(i32, test_log_stderr("stderr"), 0));
	cr_assert(eq(i32, uv_loop_init(&ts.loop), 0));
	cr_assert(eq(i32, server_start(&ts.loop, -1, &ts_ops, &ts, &ts.srv), 0));
}

static void teardown(void)
{
	server_stop(ts.srv);
	uv_run(&ts.loop, UV_RUN_DEFAULT);
	cr_assert(eq(i32, uv_loop_close(&ts.loop), 0));
}

TestSuite(sess, .init = setup, .fini = teardown, .timeout = 30);

static int ts_client(void)
{
	int sv[2];

	cr_assert(eq(i32, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv),
		     0));
	cr_assert(eq(i32, server_adopt(ts.srv, sv[1]), 0));
	return sv[0];
}

static void ts_send(int fd, uint64_t id)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.id = id;
	cr_assert(eq(i32, wire_send(fd, &env, NULL, 0), 0));
}

static void ts_spin_until(const int *v, int want)
{
	for (int i = 0; i < TS_WAIT_TURNS && *v < want; i++)
		uv_run(&ts.loop, UV_RUN_NOWAIT);
	cr_assert(eq(i32, *v, want));
}

Test(sess, packets_reach_the_layer_above_in_order)
{
	int fd = ts_client();

	cr_assert(eq(i32, ts.opened, 1));
	cr_assert(eq(u32, ts.srv->host.nsessions, 1));
	cr_assert(eq(str, (char *)sess_name(ts.s), "-"), "unnamed until the layer above names it");
	for (uint64_t id = 1; id <= 3; id++)
		ts_send(fd, id);
	ts_spin_until(&ts.nrecv, 3);
	for (int i = 0; i < 3; i++)
		cr_assert(eq(u64, ts.ids[i], (uint64_t)i + 1));
	sess_set_name(ts.s, "worker", 7);
	cr_assert(eq(str, (char *)sess_name(ts.s), "worker"));
	cr_assert(eq(u64, ts.s->client_id, 7));
	close(fd);
	ts_spin_until(&ts.gone, 1);
	cr_assert(eq(u32, ts.srv->host.nsessions, 0));
	ts_spin_until(&ts.freed, 1);
}

Test(sess, fds_are_asked_for_when_the_packet_leaves)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT, *got = NULL;
	uint64_t ids[2] = { 11, 12 }, sizes[2] = { 4096, 4096 };
	int fd = ts_client(), fds[WIRE_MAX_FDS], nfds = 0;

	env.reply_to = 1;
	env.n_fd_chunks = env.n_fd_sizes = 2;
	env.fd_chunks = ids;
	env.fd_sizes = sizes;
	cr_assert(eq(i32, sess_send(ts.s, &env), 0));
	cr_assert(eq(i32, ts.exports, 1));
	cr_assert(eq(i32, wire_recv(fd, &got, fds, &nfds), 0));
	cr_assert(eq(i32, nfds, 2));
	cr_assert(eq(u64, got->fd_chunks[1], 12));
	wire_close_fds(fds, nfds);
	gmb__envelope__free_unpacked(got, NULL);
	close(fd);
	ts_spin_until(&ts.gone, 1);
}

Test(sess, a_reference_keeps_the_state_past_the_disconnect)
{
	int fd = ts_client();
	struct sess *s = sess_ref(ts.s);

	close(fd);
	ts_spin_until(&ts.gone, 1);
	for (int i = 0; i < 8; i++)
		uv_run(&ts.loop, UV_RUN_NOWAIT);
	cr_assert(eq(i32, ts.freed, 0), "freed while a reference is held");
	cr_assert(eq(ptr, s->data, &ts.data));
	sess_unref(s);
	cr_assert(eq(i32, ts.freed, 1));
}

/*
 * Sends packets with ids from *@next on, turning the loop between, until
 * the session is no longer read (3 turns read nothing) or the send fails.
 * Return: the last send's error (-EAGAIN: the socket is full).
 */
static int ts_send_until_not_read(int fd, uint64_t *next)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	int idle = 0, r;

	while (idle < 3) {
		int before = ts.nrecv;

		for (;;) {
			env.id = *next;
			r = wire_send(fd, &env, NULL, 0);
			if (r < 0)
				break;
			if (++*next > 4 * SESS_OUT_MAX_PACKETS)
				return 0;
		}
		if (r != -EAGAIN)
			return r;
		uv_run(&ts.loop, UV_RUN_NOWAIT);
		idle = ts.nrecv == before ? idle + 1 : 0;
	}
	return -EAGAIN;
}

Test(sess, held_replies_stop_reading_a_full_queue_until_they_leave)
{
	uint64_t next = 1;
	int fd, r, turns = 0;

	cr_assert(eq(i32, server_cork(ts.srv, ts_cork, &ts), 0));
	ts.cork_rc = -EFBIG;
	ts.reply = true;
	fd = ts_client();
	r = ts_send_until_not_read(fd, &next);
	cr_assert(eq(i32, r, -EAGAIN), "the client's send failed: %s", strerror(-r));
	cr_assert(eq(i32, ts.nrecv, SESS_HOLD_MAX_PACKETS), "read %d packets", ts.nrecv);
	cr_assert(eq(u32, ts.s->out_count, SESS_HOLD_MAX_PACKETS));
	cr_assert(eq(i32, ts.s->state, SESS_OPEN));
	cr_assert(eq(i32, ts.s->poll_events, 0), "still polled while held and full");
	cr_assert(eq(i32, ts.gone, 0));

	/* The hold ends: every packet sent is read and answered, in order. */
	ts.cork_rc = 0;
	for (uint64_t want = 1; want < next;) {
		Gmb__Envelope *got = NULL;
		int fds[WIRE_MAX_FDS], nfds = 0;

		r = wire_recv(fd, &got, fds, &nfds);
		if (r == -EAGAIN) {
			cr_assert(lt(i32, turns++, 100 * TS_WAIT_TURNS),
				  "reply %" PRIu64 " never came", want);
			uv_run(&ts.loop, UV_RUN_NOWAIT);
			continue;
		}
		cr_assert(eq(i32, r, 0));
		cr_assert(eq(u64, got->reply_to, want++));
		gmb__envelope__free_unpacked(got, NULL);
	}
	cr_assert(eq(i32, ts.nrecv, (int)next - 1));
	cr_assert(eq(u32, ts.s->out_count, 0));
	cr_assert(eq(i32, ts.s->poll_events, UV_READABLE));
	close(fd);
	ts_spin_until(&ts.gone, 1);
}

/* Nothing held: a client that does not read is not paused but let go. */
Test(sess, a_client_that_never_reads_meets_the_limit_when_nothing_is_held)
{
	uint64_t next = 1;
	int fd, r;

	struct sess *s;

	cr_assert(eq(i32, server_cork(ts.srv, ts_cork, &ts), 0));
	ts.reply = true;
	fd = ts_client();
	s = sess_ref(ts.s); /* to look at it once it is gone */
	r = ts_send_until_not_read(fd, &next);
	cr_assert(not(eq(i32, r, 0)), "still read after %" PRIu64 " packets", next);
	ts_spin_until(&ts.gone, 1);
	cr_assert(s->doomed, "gmbd did not end it for its queue");
	cr_assert(gt(i32, ts.nrecv, SESS_OUT_MAX_PACKETS));
	sess_unref(s);
	close(fd);
}
