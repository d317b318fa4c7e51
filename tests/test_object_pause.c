/*
 * test_object_pause.c - gmb_object_pause() and gmb_object_resume()
 * against a real gmbd (host backend, tests/ipc_fx.c's, with a short
 * --control-timeout): a pause unmaps every reader's version (a touch
 * faults), gives the object's GPU memory back and keeps its bytes on the
 * host; a resume maps them again at the same pointers, read-only (zeros
 * after a discarding pause); a reader that does not follow fails the pause
 * and the others map again; one killed while paused does not stop the
 * resume. Also: paused opens and publishes are -EBUSY, another uid's
 * object is -EPERM (root may), a drop of a paused object lets go of its
 * host copy.
 *
 * Readers are processes with a client of their own, driven over a pair
 * of pipes (struct rd), fresh execs of this program (ipcfx_child(): a fork
 * alone could hang on a lock a thread of the test's clients held), as are
 * the clients run as another uid; a touch of a reader's (or the
 * publisher's) pointer is made in a process forked from it, whose wait
 * status says whether it faulted: a plain fork, as it needs the mapping,
 * that calls nothing that could take a lock.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/ipc_fx.h"

#define OBJ_SIZE (4 * MiB)

/* The fixture's gmbd, but a reader that does not follow fails a pause in 1 s. */
static void op_start(void)
{
	static const char *const args[] = {
		"--host-devices",    "1", "--host-memory", "64MiB", "--max-chunk", "2MiB",
		"--control-timeout", "1", "--log-level",   "info",  NULL
	};

	cr_assert(not(eq(ptr, realpath(test_build_dir(), ipcfx_build), NULL)));
	cr_assert(eq(i32, gmbd_start_shared(&ipcfx_gmbd, args), 0), "gmbd did not start");
}

/* A reader a test stopped: killed at the end whatever the test's fate, so
 * that it never holds the output pipe of whoever runs the tests. */
static pid_t op_stopped = -1;

static void op_stop(void)
{
	if (op_stopped > 0)
		kill(op_stopped, SIGKILL);
	op_stopped = -1;
	ipcfx_stop();
}

TestSuite(object_pause, .init = op_start, .fini = op_stop, .timeout = 60);

static gmb_client *op_connect(const char *name)
{
	gmb_client *c = NULL;

	cr_assert(eq(i32, gmb_connect(ipcfx_gmbd.sock, name, &c), 0), "%s", gmb_last_error(NULL));
	return c;
}

/* Publishes OBJ_SIZE bytes of @byte as @name; the publisher's read-only pointer. */
static void *op_publish(gmb_client *c, const char *name, int byte)
{
	uint64_t v = 0;
	void *p = NULL;

	cr_assert(eq(i32, gmb_malloc(c, &p, OBJ_SIZE, 0, "obj"), 0), "%s", gmb_last_error(c));
	memset(p, byte, OBJ_SIZE);
	cr_assert(eq(i32, gmb_object_publish(c, name, p, NULL, 0, &v), 0), "%s", gmb_last_error(c));
	return p;
}

static bool op_all(const void *p, size_t size, int byte)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < size; i++)
		if (b[i] != (uint8_t)byte)
			return false;
	return true;
}

/* The wait status of a process forked here that reads (@write: writes) @p. */
static int op_touch(void *p, bool write)
{
	int st = 0;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL); /* the fault kills, whatever a sanitizer installed */
		signal(SIGBUS, SIG_DFL);
		if (write)
			*(volatile uint8_t *)p = 1;
		else
			(void)*(volatile uint8_t *)p;
		_exit(0);
	}
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return st;
}

static bool op_faulted(int st)
{
	return WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
}

/* A reader process: its pid, its pipes (commands in, answers out), its pointer. */
struct rd {
	pid_t pid;
	int cmd, ans;
	void *p;
};

struct rd_msg {
	char op; /* 'c' check every byte is arg, 'r' touch read, 'w' touch write, 'q' quit */
	int arg;
};

/* The reader's side (@arg: "CMD ANS NAME", its pipes' fds by number):
 * opens NAME's latest, answers commands until 'q' or EOF. */
static int rd_main(const char *arg)
{
	gmb_client *c = NULL;
	struct rd_msg m;
	char cname[32], name[96];
	int64_t r[2] = { 0, 0 };
	void *p = NULL;
	int cmd = -1, ans = -1;

	if (sscanf(arg, "%d %d %95s", &cmd, &ans, name) != 3)
		return 3;
	snprintf(cname, sizeof(cname), "reader-%d", (int)getpid());
	r[0] = gmb_connect(ipcfx_gmbd.sock, cname, &c);
	if (r[0] == 0)
		r[0] = gmb_object_open(c, name, 0, &p, NULL, NULL, 0);
	r[1] = (int64_t)(uintptr_t)p;
	if (write(ans, r, sizeof(r)) != sizeof(r) || r[0] != 0)
		return 1;
	while (read(cmd, &m, sizeof(m)) == sizeof(m)) {
		int64_t a = -1;

		if (m.op == 'c')
			a = op_all(p, OBJ_SIZE, m.arg);
		else if (m.op == 'r' || m.op == 'w')
			a = op_touch(p, m.op == 'w');
		else if (m.op == 'q')
			a = gmb_object_close(c, p);
		if (write(ans, &a, sizeof(a)) != sizeof(a))
			return 2;
		if (m.op == 'q')
			break;
	}
	gmb_close(c);
	return 0;
}

static void rd_start(struct rd *r, const char *name)
{
	int cmd[2], ans[2];
	int64_t got[2];
	char arg[128];

	/* Every end close-on-exec (ours are closed in the reader, as are other
	 * readers' ones), but the reader's own two. */
	cr_assert(eq(i32, pipe2(cmd, O_CLOEXEC), 0));
	cr_assert(eq(i32, pipe2(ans, O_CLOEXEC), 0));
	cr_assert(eq(i32, fcntl(cmd[0], F_SETFD, 0), 0));
	cr_assert(eq(i32, fcntl(ans[1], F_SETFD, 0), 0));
	snprintf(arg, sizeof(arg), "%d %d %s", cmd[0], ans[1], name);
	r->pid = ipcfx_child_start("reader", arg);
	close(cmd[0]);
	close(ans[1]);
	r->cmd = cmd[1];
	r->ans = ans[0];
	cr_assert(eq(sz, (size_t)read(r->ans, got, sizeof(got)), sizeof(got)), "the reader died");
	cr_assert(eq(i64, got[0], 0), "the reader's open: %s", strerror((int)-got[0]));
	r->p = (void *)(uintptr_t)got[1];
}

static int64_t rd_ask(struct rd *r, char op, int arg)
{
	struct rd_msg m = { .op = op, .arg = arg };
	int64_t a = 0;

	cr_assert(eq(sz, (size_t)write(r->cmd, &m, sizeof(m)), sizeof(m)));
	cr_assert(eq(sz, (size_t)read(r->ans, &a, sizeof(a)), sizeof(a)), "reader %d died",
		  (int)r->pid);
	return a;
}

/* The reader's own pointer reads @byte everywhere. */
static void rd_expect_bytes(struct rd *r, int byte)
{
	cr_assert(eq(i64, rd_ask(r, 'c', byte), 1), "reader %d: not every byte is 0x%x",
		  (int)r->pid, byte);
}

/* A touch of the reader's pointer faults (@fault) or not. */
static void rd_expect_touch(struct rd *r, bool write, bool fault)
{
	int st = (int)rd_ask(r, write ? 'w' : 'r', 0);

	cr_assert(eq(int, op_faulted(st), fault), "reader %d's %s: wait status 0x%x", (int)r->pid,
		  write ? "write" : "read", st);
	if (!fault)
		cr_assert(eq(int, st, 0));
}

static void rd_quit(struct rd *r)
{
	int st = 0;

	cr_assert(eq(i64, rd_ask(r, 'q', 0), 0), "reader %d's close", (int)r->pid);
	close(r->cmd);
	close(r->ans);
	cr_assert(eq(i32, waitpid(r->pid, &st, 0), r->pid));
	cr_assert(eq(i32, st, 0), "reader %d: wait status 0x%x", (int)r->pid, st);
}

static void rd_kill(struct rd *r)
{
	kill(r->pid, SIGKILL);
	waitpid(r->pid, NULL, 0);
	close(r->cmd);
	close(r->ans);
}

/* gmbd's status document (malloc'd). */
static char *op_status(gmb_client *c)
{
	char *json = NULL;

	cr_assert(eq(i32, gmb_status_json(c, &json), 0), "%s", gmb_last_error(c));
	return json;
}

/* Bytes lent on device 0. */
static int64_t op_lent(gmb_client *c)
{
	char *json = op_status(c);
	int64_t n = json_i64_after(json, "{\"index\":0,", "used_bytes");

	free(json);
	cr_assert(ge(i64, n, 0));
	return n;
}

/* Whether the status shows object @name with @field ("paused", "discarded") true. */
static bool op_flag(gmb_client *c, const char *name, const char *field)
{
	char *json = op_status(c), at[96], want[48];
	const char *o, *end;
	bool on;

	snprintf(at, sizeof(at), "{\"name\":\"%s\",", name);
	snprintf(want, sizeof(want), "\"%s\":true", field);
	o = strstr(json, at);
	cr_assert(not(eq(ptr, (void *)o, NULL)), "no object %s in %s", name, json);
	end = strstr(o, "\"versions\"");
	on = strstr(o, want) && (!end || strstr(o, want) < end);
	free(json);
	return on;
}

/* Whether gmbd no longer lists a client named @arg (one that exited, once gmbd saw it go). */
static gmb_client *op_gone_c;

static int op_client_gone(void *arg)
{
	char *json = op_status(op_gone_c), at[64];
	bool gone;

	snprintf(at, sizeof(at), "\"name\":\"%s\"", (const char *)arg);
	gone = !strstr(json, at);
	free(json);
	return gone;
}

Test(object_pause, pause_unmaps_every_reader_and_resume_maps_the_same_pointers_read_only)
{
	gmb_client *a = op_connect("publisher");
	uint8_t *p = op_publish(a, "w", 0x5a);
	struct rd r1, r2;
	int64_t lent;
	void *q = NULL;

	rd_start(&r1, "w");
	rd_start(&r2, "w");
	rd_expect_bytes(&r1, 0x5a);
	rd_expect_touch(&r2, false, false);
	lent = op_lent(a);
	cr_assert(not(op_flag(a, "w", "paused")));

	cr_assert(eq(i32, gmb_object_pause(a, "w", 0), 0), "%s", gmb_last_error(a));
	/* Every reader unmapped, the publisher's own open too; the memory went back. */
	rd_expect_touch(&r1, false, true);
	rd_expect_touch(&r2, false, true);
	cr_assert(eq(int, op_faulted(op_touch(p, false)), 1), "the publisher's pointer");
	cr_assert(eq(int, op_flag(a, "w", "paused"), 1));
	cr_assert(not(op_flag(a, "w", "discarded")));
	cr_assert(eq(i64, op_lent(a), lent - (int64_t)OBJ_SIZE));
	/* Opens wait for the resume; a pause again is nothing to do. */
	cr_assert(eq(i32, gmb_object_open(a, "w", 0, &q, NULL, NULL, 0), -EBUSY));
	cr_assert(eq(i32, gmb_object_pause(a, "w", 0), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_pause(a, "w", 1), 0), "already paused, kept as it is");
	cr_assert(not(op_flag(a, "w", "discarded")));

	cr_assert(eq(i32, gmb_object_resume(a, "w"), 0), "%s", gmb_last_error(a));
	/* Mapped again before the resume returned: the same pointers, the same bytes. */
	rd_expect_bytes(&r1, 0x5a);
	rd_expect_bytes(&r2, 0x5a);
	cr_assert(eq(int, op_all(p, OBJ_SIZE, 0x5a), 1), "the publisher's pointer");
	rd_expect_touch(&r1, true, true);
	cr_assert(eq(int, op_faulted(op_touch(p, true)), 1), "still read-only");
	rd_expect_bytes(&r1, 0x5a);
	cr_assert(not(op_flag(a, "w", "paused")));
	cr_assert(eq(i64, op_lent(a), lent));
	cr_assert(eq(i32, gmb_object_resume(a, "w"), 0), "already active");
	/* Opens work again and find the one mapping. */
	cr_assert(eq(i32, gmb_object_open(a, "w", 0, &q, NULL, NULL, 0), 0), "%s",
		  gmb_last_error(a));
	cr_assert(eq(ptr, q, p));
	cr_assert(eq(i32, gmb_object_close(a, q), 0));

	rd_quit(&r1);
	rd_quit(&r2);
	cr_assert(eq(i32, gmb_object_close(a, p), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_drop(a, "w", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

Test(object_pause, a_discarding_pause_resumes_to_zeros)
{
	gmb_client *a = op_connect("publisher");
	uint8_t *p = op_publish(a, "z", 0x77);
	struct rd r;

	rd_start(&r, "z");
	cr_assert(eq(i32, gmb_object_pause(a, "z", 1), 0), "%s", gmb_last_error(a));
	rd_expect_touch(&r, false, true);
	cr_assert(eq(int, op_flag(a, "z", "paused"), 1));
	cr_assert(eq(int, op_flag(a, "z", "discarded"), 1));
	cr_assert(eq(i32, gmb_object_resume(a, "z"), 0), "%s", gmb_last_error(a));
	rd_expect_bytes(&r, 0);
	cr_assert(eq(int, op_all(p, OBJ_SIZE, 0), 1));
	rd_expect_touch(&r, true, true);
	cr_assert(not(op_flag(a, "z", "discarded")));
	/* A preserving pause after it keeps the zeros. */
	cr_assert(eq(i32, gmb_object_pause(a, "z", 0), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_resume(a, "z"), 0), "%s", gmb_last_error(a));
	rd_expect_bytes(&r, 0);
	rd_quit(&r);
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "z", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

Test(object_pause, a_publish_to_a_paused_object_is_ebusy_and_leaves_the_allocation)
{
	gmb_client *a = op_connect("publisher");
	uint8_t *p = op_publish(a, "pp", 0x12);
	void *p2 = NULL;
	uint64_t v = 0;

	cr_assert(eq(i32, gmb_object_pause(a, "pp", 0), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_malloc(a, &p2, 2 * MiB, 0, "obj"), 0), "%s", gmb_last_error(a));
	memset(p2, 0x34, 2 * MiB);
	cr_assert(eq(i32, gmb_object_publish(a, "pp", p2, NULL, 0, &v), -EBUSY));
	cr_assert(eq(u64, v, 0));
	/* Still the caller's, writable. */
	memset(p2, 0x35, 2 * MiB);
	cr_assert(eq(i32, gmb_free(a, p2), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_resume(a, "pp"), 0), "%s", gmb_last_error(a));
	cr_assert(eq(int, op_all(p, OBJ_SIZE, 0x12), 1), "version 1, as it was");
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "pp", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

/* As uid 65534: pause (@arg "0 NAME") or resume ("1 NAME") NAME; the exit status is -errno. */
static int op_pause_as_nobody(const char *arg)
{
	gmb_client *c = NULL;
	char name[96];
	int rc, resume = 0;

	if (sscanf(arg, "%d %95s", &resume, name) != 2)
		return 96;
	if (setgid(65534) || setuid(65534))
		return 99;
	if (gmb_connect(ipcfx_gmbd.sock, "nobody", &c) < 0)
		return 98;
	rc = resume ? gmb_object_resume(c, name) : gmb_object_pause(c, name, 0);
	if (rc == -EPERM && !strstr(gmb_last_error(c), "uid"))
		return 97;
	return -rc;
}

/* As uid 65534: publish @arg (2 MiB of 0x42) and exit, the version kept. */
static int op_publish_as_nobody(const char *arg)
{
	gmb_client *c = NULL;
	void *p = NULL;

	if (setgid(65534) || setuid(65534))
		return 99;
	if (gmb_connect(ipcfx_gmbd.sock, "nobody", &c) < 0 || gmb_malloc(c, &p, 2 * MiB, 0, "o"))
		return 98;
	memset(p, 0x42, 2 * MiB);
	return gmb_object_publish(c, arg, p, NULL, 0, NULL) < 0 ? 97 : 0;
}

/* The exit status of child @name run on @arg (-1: it did not exit). */
static int op_child(const char *name, const char *arg)
{
	int st = ipcfx_child(name, arg);

	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(object_pause, another_uid_may_not_pause_or_resume_but_root_may)
{
	gmb_client *a = op_connect("owner");
	uint8_t *p = op_publish(a, "mine", 0x21);
	char pause[80], resume[80];

	if (getuid() != 0) {
		gmb_close(a);
		cr_skip_test("needs root to run a client as another uid");
	}
	cr_assert(eq(i32, gmb_object_pause(a, "nope", 0), -ENOENT));
	cr_assert(eq(i32, gmb_object_resume(a, "nope"), -ENOENT));
	cr_assert(eq(i32, gmb_object_pause(a, "a b", 0), -EINVAL));
	cr_assert(eq(i32, gmb_object_resume(a, ""), -EINVAL));
	cr_assert(eq(i32, gmb_object_pause(NULL, "mine", 0), -EINVAL));
	/* Even granted, another uid only opens. */
	cr_assert(eq(i32, gmb_object_grant(a, "mine", 65534, 0), 0), "%s", gmb_last_error(a));
	snprintf(pause, sizeof(pause), "0 %u/mine", (unsigned)getuid());
	snprintf(resume, sizeof(resume), "1 %u/mine", (unsigned)getuid());
	cr_assert(eq(i32, op_child("pause-as-nobody", pause), EPERM));
	cr_assert(not(op_flag(a, "mine", "paused")));
	cr_assert(eq(i32, gmb_object_pause(a, "mine", 0), 0), "%s", gmb_last_error(a));
	/* Paused, a resume by another uid is refused as well. */
	cr_assert(eq(i32, op_child("pause-as-nobody", resume), EPERM));
	cr_assert(eq(int, op_flag(a, "mine", "paused"), 1));
	cr_assert(eq(i32, gmb_object_resume(a, "mine"), 0), "%s", gmb_last_error(a));
	cr_assert(eq(int, op_all(p, OBJ_SIZE, 0x21), 1));
	/* Root pauses and resumes another uid's object. */
	cr_assert(eq(i32, op_child("publish-as-nobody", "theirs"), 0));
	/* Its exit reaches gmbd after its answer: until then it still maps the object. */
	op_gone_c = a;
	cr_assert(eq(i32, wait_until(op_client_gone, "nobody", 5000), 0), "gmbd still lists it");
	cr_assert(eq(i32, gmb_object_pause(a, "65534/theirs", 0), 0), "%s", gmb_last_error(a));
	cr_assert(eq(int, op_flag(a, "theirs", "paused"), 1));
	cr_assert(eq(i32, gmb_object_resume(a, "65534/theirs"), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_drop(a, "65534/theirs", 0), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "mine", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

/* gmbd's open fds. */
static int op_gmbd_fds(void)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)ipcfx_gmbd.pid);
	d = opendir(path);
	cr_assert(not(eq(ptr, d, NULL)));
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

Test(object_pause, a_drop_of_a_paused_object_lets_go_of_its_host_copy)
{
	gmb_client *a = op_connect("publisher");
	uint8_t *p = op_publish(a, "dp", 0x66);
	char *json;
	int fds;

	cr_assert(eq(i32, gmb_object_close(a, p), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_pause(a, "dp", 0), 0), "%s", gmb_last_error(a));
	fds = op_gmbd_fds();
	cr_assert(eq(i32, gmb_object_drop(a, "dp", 0), 0), "%s", gmb_last_error(a));
	json = op_status(a);
	cr_assert(eq(ptr, strstr(json, "\"name\":\"dp\""), NULL), "%s", json);
	free(json);
	/* The one version's host copy was an fd of gmbd's. */
	cr_assert(eq(i32, op_gmbd_fds(), fds - 1));
	cr_assert(eq(i32, gmb_object_resume(a, "dp"), -ENOENT));
	/* The name is free: a new object starts at version 1, active. */
	p = op_publish(a, "dp", 0x67);
	cr_assert(not(op_flag(a, "dp", "paused")));
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "dp", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
	/* The fixture's stop checks gmbd exits cleanly (ASan's leak check in that build). */
}

Test(object_pause, a_reader_killed_while_paused_does_not_stop_the_resume)
{
	gmb_client *a = op_connect("publisher");
	uint8_t *p = op_publish(a, "k", 0x3c);
	struct rd r1, r2;

	rd_start(&r1, "k");
	rd_start(&r2, "k");
	cr_assert(eq(i32, gmb_object_pause(a, "k", 0), 0), "%s", gmb_last_error(a));
	rd_kill(&r1);
	cr_assert(eq(i32, gmb_object_resume(a, "k"), 0), "%s", gmb_last_error(a));
	rd_expect_bytes(&r2, 0x3c);
	cr_assert(eq(int, op_all(p, OBJ_SIZE, 0x3c), 1));
	rd_quit(&r2);
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "k", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

Test(object_pause, a_reader_that_does_not_follow_fails_the_pause_and_the_others_map_again)
{
	gmb_client *a = op_connect("publisher");
	uint8_t *p = op_publish(a, "s", 0x4d);
	struct rd r1, r2;
	char pid[16];
	int64_t lent;
	int rc;

	rd_start(&r1, "s");
	rd_start(&r2, "s");
	lent = op_lent(a);
	op_stopped = r1.pid;
	cr_assert(eq(i32, kill(r1.pid, SIGSTOP), 0));
	/* Stopped for sure before the pause asks it: a signal takes effect later. */
	cr_assert(eq(i32, waitpid(r1.pid, &rc, WUNTRACED), r1.pid));
	cr_assert(eq(int, WIFSTOPPED(rc) ? 1 : 0, 1), "the reader did not stop");
	rc = gmb_object_pause(a, "s", 0);
	cr_assert(eq(i32, rc, -EBUSY), "%s", gmb_last_error(a));
	snprintf(pid, sizeof(pid), "%d", (int)r1.pid);
	cr_assert(not(eq(ptr, strstr(gmb_last_error(a), pid), NULL)), "names the reader: %s",
		  gmb_last_error(a));
	/* Nothing was paused: the others are mapped again, the memory still lent. */
	cr_assert(not(op_flag(a, "s", "paused")));
	cr_assert(eq(i64, op_lent(a), lent));
	rd_expect_bytes(&r2, 0x4d);
	cr_assert(eq(int, op_all(p, OBJ_SIZE, 0x4d), 1));
	/* Gone, the stopped reader no longer holds the pause back. */
	rd_kill(&r1);
	cr_assert(eq(i32, gmb_object_pause(a, "s", 0), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_resume(a, "s"), 0), "%s", gmb_last_error(a));
	rd_expect_bytes(&r2, 0x4d);
	rd_quit(&r2);
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "s", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

/* This program run as one of the children above (ipcfx_child()). */
__attribute__((constructor)) static void op_child_main(void)
{
	static const struct ipcfx_child_def defs[] = {
		{ "reader", rd_main },
		{ "pause-as-nobody", op_pause_as_nobody },
		{ "publish-as-nobody", op_publish_as_nobody },
	};

	ipcfx_child_main(defs, sizeof(defs) / sizeof(defs[0]));
}
