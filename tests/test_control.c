/*
 * test_control.c - control commands through gmbd's real handlers: a tool
 * asks for a pause or resume of a control client by name, the daemon
 * forwards it and answers the tool with the client's reply, its refusal, a
 * timeout or the client's leaving. Also a rejoin's credentials and what
 * status shows of a pause that timed out. Each client is the test's end of
 * a socketpair whose other end is a real session on a real uv loop (the
 * fixture of tests/handlers_msg.h). Every test ends with uv_loop_close() ==
 * 0 (hm_teardown).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/proc.h"
#include "tests/handlers_fx.h"
#include "tests/handlers_msg.h"

TestSuite(handlers, .init = hm_setup, .fini = hm_teardown, .timeout = 30);

/* ---- control forwarding ---- */

Test(handlers, control_is_forwarded_and_answered)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	struct hm_msg cmd;
	uint64_t id;

	hm_alloc_ok(w, 2 * MiB, "kv");
	id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "kv");

	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	cr_assert(eq(i32, cmd.env->body_case, GMB__ENVELOPE__BODY_CONTROL_CMD));
	cr_assert(ne(u64, cmd.env->id, 0));
	cr_assert(eq(i32, cmd.env->control_cmd->op, GMB__OP__OP_PAUSE));
	cr_assert(eq(str, cmd.env->control_cmd->tag, "kv"));
	hm_expect_no_packet(t);
	hm_send_reply(w, cmd.env->id, 0);
	hm_msg_free(&cmd);
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), 0));
	close(w);
	close(t);
}

Test(handlers, control_refusal_reaches_the_operator)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	uint64_t id = hm_send_control(t, "worker", GMB__OP__OP_RESUME, "");
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	char err[ERR_MSG_MAX];
	struct hm_msg cmd;

	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	env.reply_to = cmd.env->id;
	env.status = -EBUSY;
	env.error = "mid-step";
	cr_assert(eq(i32, wire_send(w, &env, NULL, 0), 0));
	hm_msg_free(&cmd);
	cr_assert(eq(i32, hm_status_only(t, id, err, sizeof(err)), -EBUSY));
	cr_assert(not(eq(ptr, strstr(err, "mid-step"), NULL)), "error: %s", err);
	close(w);
	close(t);
}

Test(handlers, control_times_out_and_a_late_reply_is_fine)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	struct hm_msg cmd;
	uint64_t id;

	hm_fx.h.control_timeout_ms = 50;
	id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), -ETIMEDOUT));
	hm_send_reply(w, cmd.env->id, 0);
	hm_msg_free(&cmd);
	/* The worker is still connected and served. */
	hm_alloc_ok(w, 2 * MiB, "kv");
	close(w);
	close(t);
}

Test(handlers, control_target_disconnect_answers_econnreset)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	uint64_t id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	struct hm_msg cmd;

	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	hm_msg_free(&cmd);
	close(w);
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), -ECONNRESET));
	close(t);
}

Test(handlers, control_operator_leaving_is_forgotten)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	struct hm_msg cmd;

	hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	close(t);
	hfx_spin(&hm_fx);
	hm_send_reply(w, cmd.env->id, 0);
	hm_msg_free(&cmd);
	hm_alloc_ok(w, 2 * MiB, "kv");
	close(w);
}

Test(handlers, control_errors)
{
	int w = hm_hello_client("worker", true, false), n = hm_hello_client("plain", false, false);
	int d1 = hm_hello_client("dup", true, false), d2 = hm_hello_client("dup", true, false);
	int t = hm_hello_client("ctl", false, true);
	struct hm_msg cmd;

	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "ghost", 1, ""), NULL, 0), -ENOENT));
	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "plain", 1, ""), NULL, 0),
		     -EOPNOTSUPP));
	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "dup", 1, ""), NULL, 0), -ENOTUNIQ));
	cr_assert(
		eq(i32, hm_status_only(t, hm_send_control(t, "worker", 7, ""), NULL, 0), -EINVAL));
	hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "worker", 2, ""), NULL, 0), -EBUSY));
	hm_msg_free(&cmd);
	close(w);
	close(n);
	close(d1);
	close(d2);
	close(t);
}

Test(handlers, inflight_limit_answers_eagain)
{
	int targets[WIRE_MAX_INFLIGHT + 1];
	int t = hm_hello_client("ctl", false, true);
	char name[32];
	uint64_t last;

	for (int i = 0; i <= WIRE_MAX_INFLIGHT; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		targets[i] = hm_hello_client(name, true, false);
	}
	for (int i = 0; i < WIRE_MAX_INFLIGHT; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		hm_send_control(t, name, GMB__OP__OP_PAUSE, "");
	}
	snprintf(name, sizeof(name), "t%d", WIRE_MAX_INFLIGHT);
	last = hm_send_control(t, name, GMB__OP__OP_PAUSE, "");
	cr_assert(eq(i32, hm_status_only(t, last, NULL, 0), -EAGAIN));
	/* The targets leave without answering: every forward gets ECONNRESET. */
	for (int i = 0; i <= WIRE_MAX_INFLIGHT; i++)
		close(targets[i]);
	for (int i = 0; i < WIRE_MAX_INFLIGHT; i++) {
		struct hm_msg m;

		cr_assert(eq(i32, hm_recv(t, &m), 0));
		cr_assert(eq(i32, m.env->status, -ECONNRESET));
		hm_msg_free(&m);
	}
	close(t);
}

/* ---- the target's tags: checked in gmbd ---- */

/* A TagModeRequest: the tag exists from then on, without any allocation. */
static void set_mode(int fd, const char *tag)
{
	Gmb__TagModeRequest tm = GMB__TAG_MODE_REQUEST__INIT;

	tm.tag = (char *)tag;
	tm.mode = GMB__MODE__MODE_PRESERVE;
	cr_assert(
		eq(i32,
		   hm_status_only(fd, hm_send_req(fd, GMB__ENVELOPE__BODY_TAG_MODE, &tm), NULL, 0),
		   0));
}

/* Forwarded: the target gets the command, answers, the operator hears 0. */
static void expect_forwarded(int t, int w, int op, const char *tag)
{
	uint64_t id = hm_send_control(t, "worker", op, tag);
	struct hm_msg cmd;

	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	cr_assert(eq(i32, cmd.env->body_case, GMB__ENVELOPE__BODY_CONTROL_CMD));
	cr_assert(eq(str, cmd.env->control_cmd->tag, (char *)tag));
	hm_send_reply(w, cmd.env->id, 0);
	hm_msg_free(&cmd);
	cr_assert(eq(i32, hm_status_only(t, id, NULL, 0), 0));
}

/* Refused by gmbd with @want: the target never hears of it. */
static void expect_refused(int t, int w, const char *tag, int rc, const char *want)
{
	char err[ERR_MSG_MAX];

	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "worker", 1, tag), err, sizeof(err)),
		     rc));
	cr_assert(eq(str, err, (char *)want));
	hm_expect_no_packet(w);
}

Test(handlers, an_unknown_tag_is_refused_in_gmbd_naming_the_tags_the_client_has)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);

	/* No tags yet: every tag is fine (nothing to do), a named one is not. */
	expect_forwarded(t, w, GMB__OP__OP_PAUSE, "");
	expect_refused(t, w, "kv", -ENOENT, "client 'worker' has no tag 'kv': it has no tags yet");
	hm_alloc_ok(w, 2 * MiB, "kv");
	set_mode(w, "weights");
	expect_refused(t, w, "nosuchtag", -ENOENT,
		       "client 'worker' has no tag 'nosuchtag'; its tags: 'kv', 'weights'");
	/* "*" is a name on the wire, not every tag (that is ""). */
	expect_refused(t, w, "*", -ENOENT,
		       "client 'worker' has no tag '*'; its tags: 'kv', 'weights'");
	expect_forwarded(t, w, GMB__OP__OP_PAUSE, "kv");
	expect_forwarded(t, w, GMB__OP__OP_PAUSE, "weights"); /* a tag without allocations */
	expect_forwarded(t, w, GMB__OP__OP_RESUME, "");
	close(w);
	close(t);
}

/* The tags are told only once the client may be controlled at all. */
Test(handlers, an_unknown_tag_of_a_client_without_control_says_nothing_of_its_tags)
{
	int w = hm_hello_client("worker", false, false), t = hm_hello_client("ctl", false, true);
	char err[ERR_MSG_MAX];

	hm_alloc_ok(w, 2 * MiB, "secret");
	cr_assert(eq(i32,
		     hm_status_only(t, hm_send_control(t, "worker", 1, "nosuchtag"), err,
				    sizeof(err)),
		     -EOPNOTSUPP));
	cr_assert(eq(ptr, strstr(err, "secret"), NULL), "%s", err);
	close(w);
	close(t);
}

/* ---- choosing a client: one sentence for none, several, not connected ---- */

Test(handlers, a_client_is_chosen_with_one_sentence_for_none_and_for_several)
{
	int d1 = hm_hello_client("dup", true, false), d2 = hm_hello_client("dup", true, false);
	int t = hm_hello_client("ctl", false, true);
	Gmb__PriorityRequest pr = GMB__PRIORITY_REQUEST__INIT;
	char err[ERR_MSG_MAX], want[ERR_MSG_MAX], pid[16];
	int n;

	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "ghost", 1, ""), err, sizeof(err)),
		     -ENOENT));
	cr_assert(eq(str, err, "no client matches 'ghost'"));
	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "dup", 1, ""), err, sizeof(err)),
		     -ENOTUNIQ));
	n = snprintf(want, sizeof(want), "2 clients are named 'dup' (#");
	cr_assert(eq(i32, strncmp(err, want, (size_t)n), 0), "%s", err);
	snprintf(want, sizeof(want), " pid %d): name one by id (#N) or pid", (int)getpid());
	cr_assert(not(eq(ptr, strstr(err, want), NULL)), "%s", err);
	/* A priority (and a switch) may name a group too: the same sentences say so. */
	pr.target = "dup";
	cr_assert(eq(i32,
		     hm_status_only(t, hm_send_req(t, GMB__ENVELOPE__BODY_PRIORITY, &pr), err,
				    sizeof(err)),
		     -ENOTUNIQ));
	cr_assert(not(eq(ptr, strstr(err, "or pid, or give them a group"), NULL)), "%s", err);
	pr.target = "ghost";
	cr_assert(eq(i32,
		     hm_status_only(t, hm_send_req(t, GMB__ENVELOPE__BODY_PRIORITY, &pr), err,
				    sizeof(err)),
		     -ENOENT));
	cr_assert(eq(str, err, "no client or group matches 'ghost'"));
	/* Every client here is one process: its pid names them all. */
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, pid, 1, ""), err, sizeof(err)),
		     -ENOTUNIQ));
	snprintf(want, sizeof(want), "2 clients have pid %s (#", pid);
	cr_assert(eq(i32, strncmp(err, want, strlen(want)), 0), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "'dup'): name one by id (#N)"), NULL)), "%s", err);
	close(d1);
	close(d2);
	close(t);
}

/* A client that matches but has no session now (an orphan) is not "none". */
Test(handlers, a_client_that_is_not_connected_is_said_to_be_so)
{
	struct broker_peer peer = { .pid = getpid(), .uid = getuid(), .gid = getgid() };
	int t = hm_hello_client("ctl", false, true);
	Gmb__SwitchRequest sr = GMB__SWITCH_REQUEST__INIT;
	char err[ERR_MSG_MAX];
	struct bclient *c;

	cr_assert(eq(i32, broker_restore_client(hm_fx.br, &peer, 77, "back", true, &c), 0));
	cr_assert(eq(i32, hm_status_only(t, hm_send_control(t, "back", 1, ""), err, sizeof(err)),
		     -ENOENT));
	cr_assert(eq(str, err,
		     "client 'back' (#77) is not connected now; it may be reconnecting to gmbd"));
	/* A switch that names it says the same, not that it refuses control. */
	sr.from = "back";
	sr.to = "ctl";
	cr_assert(eq(i32,
		     hm_status_only(t, hm_send_req(t, GMB__ENVELOPE__BODY_SWITCH_REQ, &sr), err,
				    sizeof(err)),
		     -ENOENT));
	cr_assert(eq(str, err,
		     "client 'back' (#77) is not connected now; it may be reconnecting to gmbd"));
	broker_client_remove(hm_fx.br, c);
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
	struct hm_msg m;
	uint64_t id;

	cr_assert(ge(i32, n, 0));
	cr_assert(eq(i32, broker_restore_client(hm_fx.br, &peer, 77, "back", true, &c), 0));
	fd = hm_client();
	h.version = GMB_PROTOCOL_VERSION;
	h.name = "back";
	h.control = true;
	h.rejoin_id = 77;
	id = hm_send_req(fd, GMB__ENVELOPE__BODY_HELLO, &h);
	hm_recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "rejoin hello: %s", m.env->error);
	hm_msg_free(&m);
	cr_assert(eq(u32, (unsigned)c->gid, (unsigned)getgid()), "the record's gid stayed");
	cr_assert(eq(i32, c->ngroups, n), "the record's groups stayed");
	for (int i = 0; i < c->ngroups; i++)
		cr_assert(not(eq(u32, (unsigned)c->groups[i], 4243)));
	rj.last = true;
	id = hm_send_req(fd, GMB__ENVELOPE__BODY_REJOIN, &rj);
	hm_recv_reply(fd, id, &m, NULL, NULL);
	cr_assert(eq(i32, m.env->status, 0), "rejoin: %s", m.env->error);
	hm_msg_free(&m);
	close(fd);
}

/* ---- a remote pause that timed out ---- */

/* The command is with the client: the operator and status say it may still happen. */
Test(handlers, a_timed_out_pause_is_shown_pausing_until_answered)
{
	int w = hm_hello_client("worker", true, false), t = hm_hello_client("ctl", false, true);
	char err[ERR_MSG_MAX];
	struct hm_msg cmd;
	uint64_t id;

	hm_alloc_ok(w, 2 * MiB, "kv");
	hm_fx.h.control_timeout_ms = 50;
	id = hm_send_control(t, "worker", GMB__OP__OP_PAUSE, "kv");
	cr_assert(eq(i32, hm_recv(w, &cmd), 0));
	cr_assert(eq(i32, hm_status_only(t, id, err, sizeof(err)), -ETIMEDOUT));
	cr_assert(not(eq(ptr, strstr(err, "may still carry it out"), NULL)), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "\"pausing\""), NULL)), "%s", err);
	hm_expect_first_tag_state(t, "pausing");
	hm_send_reply(w, cmd.env->id, 0);
	hm_msg_free(&cmd);
	hfx_spin(&hm_fx); /* the late reply first: it is on another socket */
	hm_expect_first_tag_state(t, "active");
	close(w);
	close(t);
}
