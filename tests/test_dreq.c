/*
 * test_dreq.c - the contract of gmbd's requests to a client (daemon/
 * handlers/dreq.c), through the real handlers on a real loop: a request's
 * done handler runs exactly once whether the client answers, refuses,
 * lets the deadline pass or goes, or the initiator gives up on it first
 * (an operator that disconnects); a reply that comes after is neither a
 * protocol error nor a second completion; one timer serves deadlines in
 * their order, whoever set them (forwarded controls, switch steps); a
 * preemption the victim leaves unanswered ends when it goes, its mark
 * cleared.
 *
 * "Once" is counted where it shows: the operator's replies (exactly one
 * per request, nothing after) and the EVENT_CONTROL that every forward
 * emits when its request ends (h.on_event).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/wire.h"
#include "daemon/core/event.h"
#include "tests/handlers_fx.h"
#include "tests/handlers_msg.h"

/* The EVENT_CONTROLs emitted: how many, and the last one's facts. */
static struct {
	int n;
	int status;
	char detail[ERR_MSG_MAX];
	char client[WIRE_MAX_NAME + 1];
} ctl_ev;

static void count_control(void *arg, const struct event *ev)
{
	(void)arg;
	if (ev->kind != EVENT_CONTROL)
		return;
	ctl_ev.n++;
	ctl_ev.status = ev->status;
	snprintf(ctl_ev.detail, sizeof(ctl_ev.detail), "%s", ev->detail ? ev->detail : "");
	snprintf(ctl_ev.client, sizeof(ctl_ev.client), "%s", ev->client ? ev->client : "");
}

static void setup(void)
{
	hm_setup();
	memset(&ctl_ev, 0, sizeof(ctl_ev));
	hm_fx.h.on_event = count_control;
}

TestSuite(dreq, .init = setup, .fini = hm_teardown, .timeout = 30);

/* A ControlRequest with a wait (a resume may wait for memory that long). */
static uint64_t send_control_wait(int fd, const char *target, int op, uint32_t wait_ms)
{
	Gmb__ControlRequest c = GMB__CONTROL_REQUEST__INIT;

	c.target = (char *)target;
	c.op = (Gmb__Op)op;
	c.tag = "";
	c.wait_ms = wait_ms;
	return hm_send_req(fd, GMB__ENVELOPE__BODY_CONTROL, &c);
}

/* The ControlCommand @fd gets; its id. */
static uint64_t recv_command(int fd, int op, const char *tag)
{
	struct hm_msg m;
	uint64_t id;

	cr_assert(eq(i32, hm_recv(fd, &m), 0));
	cr_assert(eq(i32, m.env->body_case, GMB__ENVELOPE__BODY_CONTROL_CMD));
	cr_assert(eq(i32, m.env->control_cmd->op, op));
	cr_assert(eq(str, m.env->control_cmd->tag, (char *)tag));
	id = m.env->id;
	hm_msg_free(&m);
	return id;
}

static void send_refusal(int fd, uint64_t reply_to, int status, const char *error)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.reply_to = reply_to;
	env.status = status;
	env.error = (char *)error;
	cr_assert(eq(i32, wire_send(fd, &env, NULL, 0), 0));
}

/* @fd is still a client in good standing: a protocol error would have ended it. */
static void expect_served(int fd)
{
	struct hm_msg m;

	hm_recv_reply(fd,
		      hm_send_req(fd, GMB__ENVELOPE__BODY_STATUS_REQ,
				  &(Gmb__StatusRequest)GMB__STATUS_REQUEST__INIT),
		      &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0));
	hm_msg_free(&m);
}

/* ---- each way a request ends, once ---- */

Test(dreq, an_answer_completes_once)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	uint64_t id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	uint64_t cmd = recv_command(w, GMB__OP__OP_PAUSE, "");

	hm_expect_no_packet(t);
	cr_assert(eq(i32, ctl_ev.n, 0), "nothing ends before the answer");
	hm_send_reply(w, cmd, 0);
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), 0));
	cr_assert(eq(i32, ctl_ev.n, 1));
	cr_assert(eq(i32, ctl_ev.status, 0));
	hm_expect_no_packet(t);
	cr_assert(eq(i32, ctl_ev.n, 1));
	/* The target is free again: the next control is forwarded, not -EBUSY. */
	id = hm_send_control(t, "worker", GMB__OP__OP_RESUME, "");
	hm_send_reply(w, recv_command(w, GMB__OP__OP_RESUME, ""), 0);
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), 0));
	cr_assert(eq(i32, ctl_ev.n, 2));
	close(w);
	close(t);
}

Test(dreq, a_refusal_completes_once_and_a_positive_status_is_eio)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	char err[ERR_MSG_MAX];
	uint64_t id;

	id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	send_refusal(w, recv_command(w, GMB__OP__OP_PAUSE, ""), -EBUSY, "mid-step");
	cr_assert(eq(i32, hm_status_only(t, id, err, sizeof(err)), -EBUSY));
	cr_assert(eq(str, err, "client 'worker' could not pause every tag: mid-step"));
	cr_assert(eq(i32, ctl_ev.n, 1));
	cr_assert(eq(i32, ctl_ev.status, -EBUSY));
	/* A client's positive status is its bug: a refusal all the same. */
	id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	send_refusal(w, recv_command(w, GMB__OP__OP_PAUSE, ""), 5, "");
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), -EIO));
	cr_assert(eq(i32, ctl_ev.n, 2));
	hm_expect_no_packet(t);
	expect_served(w);
	close(w);
	close(t);
}

Test(dreq, a_timeout_completes_once_and_the_late_answer_is_no_breach)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	uint64_t id, cmd;

	hm_fx.h.control_timeout_ms = 50;
	id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cmd = recv_command(w, GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), -ETIMEDOUT));
	cr_assert(eq(i32, ctl_ev.n, 1));
	cr_assert(eq(i32, ctl_ev.status, -ETIMEDOUT));
	hm_send_reply(w, cmd, 0);
	hfx_spin(&hm_fx);
	hm_expect_no_packet(t);
	cr_assert(eq(i32, ctl_ev.n, 1), "the late answer completed it again");
	expect_served(w);
	/* Answered now, the request is gone: the same id again is a breach. */
	hm_send_reply(w, cmd, 0);
	hm_expect_eof(w);
	close(t);
}

Test(dreq, the_target_going_completes_once)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	char err[ERR_MSG_MAX];
	uint64_t id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");

	recv_command(w, GMB__OP__OP_PAUSE, "");
	close(w);
	cr_assert(eq(i32, hm_status_only(t, id, err, sizeof(err)), -ECONNRESET));
	cr_assert(eq(str, err, "client 'worker' disconnected before it answered"));
	cr_assert(eq(i32, ctl_ev.n, 1));
	cr_assert(eq(i32, ctl_ev.status, -ECONNRESET));
	hm_expect_no_packet(t);
	cr_assert(eq(i32, ctl_ev.n, 1));
	close(t);
}

/* A client that controls itself is target and initiator: going ends it once. */
Test(dreq, a_client_that_is_its_own_target_going_completes_once)
{
	int w = hm_hello_client("worker", true, false);

	hm_send_control(w, "worker", GMB__OP__OP_PAUSE, "");
	recv_command(w, GMB__OP__OP_PAUSE, "");
	close(w);
	hfx_spin(&hm_fx);
	cr_assert(eq(i32, ctl_ev.n, 1));
	cr_assert(eq(i32, ctl_ev.status, -ECONNRESET));
}

/* ---- cancellation: the initiator goes ---- */

Test(dreq, an_operator_leaving_cancels_its_forward_once)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	uint64_t cmd, id2, cmd2;
	int t2;

	hm_alloc_ok(w, 2 * MiB, "kv");
	hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cmd = recv_command(w, GMB__OP__OP_PAUSE, "");
	close(t);
	hfx_spin(&hm_fx);
	/* Cancelled at once, not at the deadline (30 s) nor at the answer. */
	cr_assert(eq(i32, ctl_ev.n, 1));
	cr_assert(eq(i32, ctl_ev.status, -ECANCELED));
	cr_assert(eq(str, ctl_ev.detail,
		     "the operator disconnected before client 'worker' answered"));
	/* The command is still with the client: status says so. */
	t2 = hm_hello_client("ctl2", false, true);
	hm_expect_first_tag_state(t2, "pausing");
	/* The target is free for another operator meanwhile. */
	id2 = hm_send_control(t2, "worker", GMB__OP__OP_RESUME, "");
	cmd2 = recv_command(w, GMB__OP__OP_RESUME, "");
	/* The cancelled request's answer: no breach, no second completion. */
	hm_send_reply(w, cmd, 0);
	hfx_spin(&hm_fx);
	cr_assert(eq(i32, ctl_ev.n, 1));
	hm_expect_first_tag_state(t2, "active");
	hm_send_reply(w, cmd2, 0);
	cr_assert(eq(i32, hm_status_only(t2, id2, NULL, 0), 0));
	cr_assert(eq(i32, ctl_ev.n, 2));
	expect_served(w);
	close(w);
	close(t2);
}

/* Every forward of a leaving operator is cancelled, to as many targets. */
Test(dreq, an_operator_leaving_cancels_every_forward_it_waits_on)
{
	int t = hm_hello_client("ctl", false, true), w[3];
	uint64_t cmd[3];
	char name[16];

	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "w%d", i);
		w[i] = hm_hello_client(name, true, false);
		hm_send_control(t, name, GMB__OP__OP_PAUSE, "");
		cmd[i] = recv_command(w[i], GMB__OP__OP_PAUSE, "");
	}
	close(t);
	hfx_spin(&hm_fx);
	cr_assert(eq(i32, ctl_ev.n, 3));
	cr_assert(eq(i32, ctl_ev.status, -ECANCELED));
	for (int i = 0; i < 3; i++) {
		hm_send_reply(w[i], cmd[i], 0);
		expect_served(w[i]);
		close(w[i]);
	}
	cr_assert(eq(i32, ctl_ev.n, 3));
}

/* ---- one timer, deadlines in their order ---- */

Test(dreq, deadlines_end_in_their_order_not_in_the_order_sent)
{
	int t = hm_hello_client("ctl", false, true);
	int a = hm_hello_client("a", true, false), b = hm_hello_client("b", true, false);
	int c = hm_hello_client("c", true, false);
	uint64_t ra, rb, rc, ca, cb, cc;
	struct hm_msg m;

	hm_fx.h.control_timeout_ms = 100;
	/* a: a resume that may wait 300 ms more; b: a pause, due first; c: answered. */
	ra = send_control_wait(t, "a", GMB__OP__OP_RESUME, 300);
	rb = hm_send_control(t, "b", GMB__OP__OP_PAUSE, "");
	rc = hm_send_control(t, "c", GMB__OP__OP_PAUSE, "");
	ca = recv_command(a, GMB__OP__OP_RESUME, "");
	cb = recv_command(b, GMB__OP__OP_PAUSE, "");
	cc = recv_command(c, GMB__OP__OP_PAUSE, "");
	hm_send_reply(c, cc, 0);
	cr_assert(eq(i32, hm_recv(t, &m), 0));
	cr_assert(eq(u64, m.env->reply_to, rc), "the answer first");
	cr_assert(eq(i32, m.env->status, 0));
	hm_msg_free(&m);
	cr_assert(eq(i32, hm_recv(t, &m), 0));
	cr_assert(eq(u64, m.env->reply_to, rb), "b's deadline is the earlier");
	cr_assert(eq(i32, m.env->status, -ETIMEDOUT));
	hm_msg_free(&m);
	hm_expect_no_packet(t); /* a's wait is not over yet */
	cr_assert(eq(i32, hm_recv(t, &m), 0));
	cr_assert(eq(u64, m.env->reply_to, ra));
	cr_assert(eq(i32, m.env->status, -ETIMEDOUT));
	hm_msg_free(&m);
	cr_assert(eq(i32, ctl_ev.n, 3));
	hm_send_reply(a, ca, 0);
	hm_send_reply(b, cb, 0);
	expect_served(a);
	expect_served(b);
	close(a);
	close(b);
	close(c);
	close(t);
}

/* A switch's step times out on the same timer; its rollback follows, and
 * the step's late answer is no breach. */
Test(dreq, a_switch_step_times_out_and_rolls_back)
{
	int t = hm_hello_client("ctl", false, true);
	int a = hm_hello_client("from", true, false), b = hm_hello_client("to", true, false);
	Gmb__SwitchRequest sr = GMB__SWITCH_REQUEST__INIT;
	uint64_t id, pause, undo;
	struct hm_msg m;

	hm_alloc_ok(a, 2 * MiB, "kv");
	hm_alloc_ok(b, 2 * MiB, "kv");
	hm_recv_reply(b, hm_send_tag_req(b, GMB__ENVELOPE__BODY_PAUSE, "kv"), &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0));
	hm_msg_free(&m);
	hm_fx.h.control_timeout_ms = 50;
	sr.from = "from";
	sr.to = "to";
	id = hm_send_req(t, GMB__ENVELOPE__BODY_SWITCH_REQ, &sr);
	pause = recv_command(a, GMB__OP__OP_PAUSE, "");
	/* No answer: at the deadline FROM is resumed again, TO never asked. */
	undo = recv_command(a, GMB__OP__OP_RESUME, "kv");
	hm_send_reply(a, pause, 0);
	hm_send_reply(a, undo, 0);
	hm_recv_reply(t, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, -ETIMEDOUT));
	cr_assert(not(eq(ptr, strstr(m.env->error, "no answer within"), NULL)), "%s", m.env->error);
	cr_assert(not(eq(ptr, strstr(m.env->error, "both sides are as before"), NULL)), "%s",
		  m.env->error);
	hm_msg_free(&m);
	hm_expect_no_packet(b);
	expect_served(a);
	close(a);
	close(b);
	close(t);
}

/* ---- preemption: its request ends when the victim goes, too ---- */

static int hello_arb(const char *name, int priority, bool preemptible)
{
	Gmb__Hello h = GMB__HELLO__INIT;
	int fd = hm_client();
	struct hm_msg m;

	h.version = GMB_PROTOCOL_VERSION;
	h.name = (char *)name;
	h.control = true;
	h.priority = priority;
	h.preemptible = preemptible;
	hm_recv_reply(fd, hm_send_req(fd, GMB__ENVELOPE__BODY_HELLO, &h), &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "hello: %s", m.env->error);
	hm_msg_free(&m);
	return fd;
}

static struct bclient *client_named(const char *name)
{
	for (struct bclient *c = hm_fx.br->clients; c; c = c->next)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

/* A victim kept as an orphan must be preemptible again once it is back. */
Test(dreq, a_preempted_client_that_goes_unanswered_loses_its_mark)
{
	int v = hello_arb("batch", 0, true), s = hello_arb("serve", 10, false);
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;
	struct bclient *c;

	hm_alloc_ok(v, 8 * GiB, "kv");
	a.size = 1 * GiB;
	a.tag = "kv";
	a.wait_ms = 5000;
	hm_send_req(s, GMB__ENVELOPE__BODY_ALLOC, &a);
	recv_command(v, GMB__OP__OP_PAUSE, "");
	c = client_named("batch");
	cr_assert(ne(u64, c->preempt_for, 0), "asked to pause for serve");
	close(s);
	/* gmbd ends the session (a reply to nothing) while the process lives:
	 * the client is kept as an orphan, its preemption unanswered. */
	hm_send_reply(v, 99999, 0);
	hm_expect_eof(v);
	c = client_named("batch");
	cr_assert(not(eq(ptr, c, NULL)));
	cr_assert(c->orphan);
	cr_assert(eq(u64, c->preempt_for, 0), "still marked: never preempted again");
	broker_client_remove(hm_fx.br, c);
}
