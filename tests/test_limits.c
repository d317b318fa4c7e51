/*
 * test_limits.c - what a careless or hostile user meets at gmbd's limits,
 * and what the operator keeps: a real gmbd (host backend) started here with
 * its own RLIMIT_NOFILE and umask and its stderr in a file of this test's,
 * raw clients and gmbctl of other uids (the tests run as root).
 *
 *   - a flood of refused connections or requests from one source is one
 *     line with its reason, then a count every 10 s;
 *   - root gets a connection while a uid is at its connection limit and
 *     gmbd at its own, and closes idle ones of its own uid to get one;
 *   - under too low an fd limit gmbd does not start and names the limit it
 *     needs, and serves under that limit;
 *   - under umask 077 the socket's folder and the socket have the modes
 *     gmbd logs, and a member of the socket's group connects.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/wire.h"
#include "tests/raw_client.h"
#include "tests/util.h"

#define NOBODY 65534
#define OTHER  65533

/* A gmbd of this file's: its folder (the socket in a subfolder gmbd makes). */
struct lgmbd {
	pid_t pid;
	char dir[64];
	char sock[128];
	char log[128];
};

static struct lgmbd gmbd;

static void lg_exec(const struct lgmbd *d, const char *notify, rlim_t nofile, mode_t mask,
		    const char *const *args)
{
	struct rlimit rl = { .rlim_cur = nofile, .rlim_max = nofile };
	const char *own[40] = { "--fdstore-max", "0", "--log-level", "info" };
	const char *argv[48];
	char bin[256];
	int log;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	for (size_t n = 4; args && *args && n < 39; args++)
		own[n++] = *args;
	test_gmbd_argv(argv, 48, bin, sizeof(bin), d->sock, own);
	log = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (log >= 0)
		dup2(log, 2);
	if (nofile && setrlimit(RLIMIT_NOFILE, &rl) < 0)
		_exit(126);
	umask(mask);
	setenv("NOTIFY_SOCKET", notify, 1);
	unsetenv("FDSTORE");
	execv(bin, (char *const *)argv);
	_exit(127);
}

/* READY=1 on @nfd: 0; gmbd exited first: -ECHILD (reaped, pid 0). */
static int lg_wait_ready(struct lgmbd *d, int nfd)
{
	int r = test_wait_ready(nfd, d->pid, 20000);

	if (r == -ECHILD)
		d->pid = 0;
	return r;
}

/*
 * Starts gmbd with @nofile (0: inherited) as its soft and hard
 * RLIMIT_NOFILE, umask @mask and @args; its socket is DIR/run/gmbd.sock,
 * DIR open to every uid. Return: 0 once ready, -ECHILD if it exited.
 */
static int lg_start(struct lgmbd *d, rlim_t nofile, mode_t mask, const char *const *args)
{
	char notify[128];
	int nfd, r;

	*d = (struct lgmbd){ .pid = 0 };
	snprintf(d->dir, sizeof(d->dir), "/tmp/gmblimits.XXXXXX");
	cr_assert(not(eq(ptr, mkdtemp(d->dir), NULL)));
	cr_assert(eq(i32, chmod(d->dir, 0711), 0));
	snprintf(d->sock, sizeof(d->sock), "%s/run/gmbd.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/gmbd.log", d->dir);
	snprintf(notify, sizeof(notify), "%s/notify", d->dir);
	nfd = test_notify_socket(notify);
	cr_assert(ge(i32, nfd, 0));
	d->pid = fork();
	cr_assert(ge(i32, d->pid, 0));
	if (d->pid == 0)
		lg_exec(d, notify, nofile, mask, args);
	r = lg_wait_ready(d, nfd);
	close(nfd);
	unlink(notify);
	return r;
}

/* SIGTERM and wait: gmbd's exit status (-1: a signal, or not running). */
static int lg_stop(struct lgmbd *d)
{
	int st = 0;

	if (d->pid <= 0)
		return -1;
	kill(d->pid, SIGTERM);
	if (waitpid(d->pid, &st, 0) < 0)
		st = -1;
	d->pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* gmbd's log so far, NUL-terminated in a static buffer. */
static const char *lg_log(const struct lgmbd *d)
{
	static char buf[1 << 20];
	FILE *f = fopen(d->log, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

/* Lines of gmbd's log that hold @needle. */
static int lg_lines(const struct lgmbd *d, const char *needle)
{
	const char *p = lg_log(d);
	int n = 0;

	while (*p) {
		const char *end = strchr(p, '\n');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char line[4096];

		snprintf(line, sizeof(line), "%.*s",
			 (int)(len < sizeof(line) ? len : sizeof(line) - 1), p);
		n += strstr(line, needle) != NULL;
		p += len + (end != NULL);
	}
	return n;
}

static void lg_clean(struct lgmbd *d)
{
	char cmd[128];

	if (d->pid > 0)
		lg_stop(d);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	if (d->dir[0] && system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", d->dir);
	d->dir[0] = 0;
}

static void fini(void)
{
	if (gmbd.pid > 0)
		cr_expect(eq(i32, lg_stop(&gmbd), 0), "gmbd did not exit cleanly:\n%s",
			  lg_log(&gmbd));
	lg_clean(&gmbd);
}

TestSuite(limits, .fini = fini, .timeout = 120);

/* ---- raw connections ---- */

/* A connection to @sock that said hello (a tool: it may hold nothing): its
 * fd, or -errno of the connect or the hello. */
static int raw_open(const char *sock, bool hello)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__Hello h = GMB__HELLO__INIT;
	int fd, st, r;

	r = wire_connect(sock, &fd);
	if (r < 0 || !hello)
		return r < 0 ? r : fd;
	raw_client_hello_env(&env, &h, "many");
	h.tool = true;
	r = raw_client_request(fd, &env, &st, NULL, 0);
	if (r == 0 && st != 0)
		r = st;
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

/* True once gmbd closed @fd (EOF within 5 s). */
static bool raw_closed(int fd)
{
	return raw_client_wait_closed(fd, 5000) == 0;
}

/*
 * A child process of @uid (gid @gid unless -1) for raw connections: it
 * runs @fn, writes its int result to the pipe and waits there until the
 * parent closes its end, holding its connections open.
 */
struct kid {
	pid_t pid;
	int to, from;
};

static void kid_start(struct kid *k, uid_t uid, gid_t gid, int (*fn)(void *), void *arg)
{
	int to[2], from[2];

	cr_assert(eq(i32, pipe(to), 0));
	cr_assert(eq(i32, pipe(from), 0));
	k->pid = fork();
	cr_assert(ge(i32, k->pid, 0));
	if (k->pid == 0) {
		char c;
		int r = 0;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(to[1]);
		close(from[0]);
		if (gid != (gid_t)-1 && (setgroups(0, NULL) < 0 || setgid(gid) < 0))
			r = -errno;
		if (r == 0 && setuid(uid) < 0)
			r = -errno;
		if (r == 0)
			r = fn(arg);
		if (write(from[1], &r, sizeof(r)) != sizeof(r))
			_exit(2);
		while (read(to[0], &c, 1) > 0)
			;
		_exit(0);
	}
	close(to[0]);
	close(from[1]);
	k->to = to[1];
	k->from = from[0];
}

/* The child's result (it keeps running until kid_end()). */
static int kid_result(struct kid *k)
{
	int r = -EPIPE;

	cr_assert(eq(i32, (int)read(k->from, &r, sizeof(r)), (int)sizeof(r)));
	return r;
}

static void kid_end(struct kid *k)
{
	int st;

	close(k->to);
	close(k->from);
	cr_assert(eq(i32, waitpid(k->pid, &st, 0), k->pid));
}

struct flood {
	const char *sock;
	int open;    /* connections to keep open, each after a hello */
	int refused; /* then connections to try */
};

/* @f->open connections kept, then @f->refused tried: how many of the tries
 * gmbd closed at once (the rest are closed here). -errno if a kept one fails. */
static int flood_run(void *arg)
{
	struct flood *f = arg;
	int closed = 0;

	for (int i = 0; i < f->open; i++) {
		int fd = raw_open(f->sock, true);

		if (fd < 0)
			return fd;
	}
	for (int i = 0; i < f->refused; i++) {
		int fd = raw_open(f->sock, false);

		if (fd < 0)
			continue;
		closed += raw_closed(fd);
		close(fd);
	}
	return closed;
}

/* Connections with a hello until gmbd closes one: how many it kept (held
 * open by the child). */
static int flood_until_closed(void *arg)
{
	struct flood *f = arg;
	int n = 0;

	for (; n < 4096; n++) {
		int fd = raw_open(f->sock, true);

		if (fd < 0)
			return n;
	}
	return n;
}

static int gmbctl(const char *sock, const char *a, const char *b, char *out, size_t cap)
{
	char bin[256];
	char *argv[] = { bin, "-s", (char *)sock, (char *)a, (char *)b, NULL };

	snprintf(bin, sizeof(bin), "%s/gmbctl", test_build_dir());
	return run_capture(argv, NULL, out, NULL, cap);
}

/* ---- floods: said once with the reason, then counted ---- */

static int summary_of_both(void *arg)
{
	return lg_lines(&gmbd, "connection refused: the uid is at its connection limit"
			       " (--max-connections-per-uid): 299 more in the last") == 1 &&
	       lg_lines(&gmbd, "request refused: 299 more in the last") == 1;
}

Test(limits, a_flood_of_refusals_is_one_line_with_its_reason_then_a_count)
{
	static const char *const args[] = { "--max-connections-per-uid", "2", NULL };
	struct flood f = { .open = 2, .refused = 300 };
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;
	struct kid k;
	int fd, st;

	cr_assert(eq(i32, lg_start(&gmbd, 0, 022, args), 0), "%s", lg_log(&gmbd));
	f.sock = gmbd.sock;
	kid_start(&k, NOBODY, -1, flood_run, &f);
	cr_assert(eq(i32, kid_result(&k), 300), "not every connection past the limit was closed");

	/* 300 allocations past the budget from one client. */
	fd = raw_open(gmbd.sock, false);
	cr_assert(ge(i32, fd, 0));
	{
		Gmb__Hello h = GMB__HELLO__INIT;

		raw_client_hello_env(&env, &h, "asker");
		cr_assert(eq(i32, raw_client_request(fd, &env, &st, NULL, 0), 0));
		cr_assert(eq(i32, st, 0));
	}
	env = (Gmb__Envelope)GMB__ENVELOPE__INIT;
	a.size = 1ull << 50;
	a.tag = "t";
	env.body_case = GMB__ENVELOPE__BODY_ALLOC;
	env.alloc = &a;
	for (int i = 0; i < 300; i++) {
		env.id = 2 + (uint64_t)i;
		cr_assert(eq(i32, raw_client_request(fd, &env, &st, NULL, 0), 0));
		cr_assert(eq(i32, st, -ENOMEM));
	}

	/* One line each so far, with the reason; none at warning. */
	cr_assert(eq(i32, lg_lines(&gmbd, "Too many open files"), 0), "%s", lg_log(&gmbd));
	cr_assert(eq(i32, lg_lines(&gmbd, "cannot serve a new connection"), 0));
	cr_assert(eq(i32, lg_lines(&gmbd, "request refused"), 1), "%s", lg_log(&gmbd));
	cr_assert(eq(i32, lg_lines(&gmbd, "reason=budget"), 1));
	cr_assert(eq(i32, lg_lines(&gmbd, "connection refused"), 1), "%s", lg_log(&gmbd));
	cr_assert(eq(i32, lg_lines(&gmbd, "--max-connections-per-uid) uid=65534 limit=2"), 1), "%s",
		  lg_log(&gmbd));
	cr_assert(eq(i32, lg_lines(&gmbd, "RLIMIT_NOFILE"), 0), "%s", lg_log(&gmbd));

	/* Then the count, within the next interval. */
	cr_assert(eq(i32, wait_until(summary_of_both, NULL, 15000), 0), "%s", lg_log(&gmbd));
	cr_assert(lt(i32, lg_lines(&gmbd, ""), 60), "%s", lg_log(&gmbd));
	close(fd);
	kid_end(&k);
}

/* ---- the operator always gets a connection ---- */

static int status_ok(void *arg)
{
	char out[1 << 14];

	return gmbctl(gmbd.sock, "status", NULL, out, sizeof(out)) == 0;
}

Test(limits, root_gets_a_connection_while_a_uid_and_gmbd_are_at_their_limits)
{
	/* Room for about 80 connections: a uid without a limit of its own
	 * fills gmbd's; then a uid at its own limit of 4. */
	static const char *const args[] = { "--max-connections-per-uid", "4", NULL };
	static const char *const nolimit[] = { "--max-connections-per-uid", "0", NULL };
	struct flood f = { 0 };
	struct worker w;
	char out[1 << 14], text[512];
	struct kid k, k2;
	int n;

	/* gmbd at its own limit, filled by one uid: root still looks and acts. */
	cr_assert(eq(i32, lg_start(&gmbd, 400, 022, nolimit), 0), "%s", lg_log(&gmbd));
	f.sock = gmbd.sock;
	cr_assert(eq(i32, worker_start(&w, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "uid %d", NOBODY), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "connect trainer"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "handler accept"), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "malloc kv 4096"), 0), "%s", text);
	kid_start(&k, NOBODY, -1, flood_until_closed, &f);
	n = kid_result(&k);
	cr_assert(gt(i32, n, 16), "gmbd took %d connections", n);
	kid_start(&k2, OTHER, -1, flood_until_closed, &f);
	cr_assert(eq(i32, kid_result(&k2), 0), "another uid got a connection past gmbd's limit");
	cr_assert(eq(i32, gmbctl(gmbd.sock, "status", NULL, out, sizeof(out)), 0), "%s", out);
	cr_assert(not(eq(ptr, strstr(out, "trainer"), NULL)), "%s", out);
	cr_assert(eq(i32, gmbctl(gmbd.sock, "pause", "trainer", out, sizeof(out)), 0), "%s\n%s",
		  out, lg_log(&gmbd));
	/* Said once for each uid refused, with gmbd's limit as the reason. */
	cr_assert(eq(i32, lg_lines(&gmbd, "gmbd keeps its last open files"), 2), "%s",
		  lg_log(&gmbd));
	cr_assert(eq(i32, lg_lines(&gmbd, "(RLIMIT_NOFILE) uid=65534 limit=400"), 1), "%s",
		  lg_log(&gmbd));
	kid_end(&k2);
	kid_end(&k);
	cr_assert(eq(i32, worker_quit(&w), 0));
	cr_assert(eq(i32, lg_stop(&gmbd), 0));
	lg_clean(&gmbd);

	/* A uid at its own limit: its next is closed, root is served. */
	cr_assert(eq(i32, lg_start(&gmbd, 0, 022, args), 0), "%s", lg_log(&gmbd));
	f.sock = gmbd.sock;
	kid_start(&k, NOBODY, -1, flood_until_closed, &f);
	cr_assert(eq(i32, kid_result(&k), 4));
	cr_assert(eq(i32, gmbctl(gmbd.sock, "status", NULL, out, sizeof(out)), 0), "%s", out);
	cr_assert(eq(i32, lg_lines(&gmbd, "--max-connections-per-uid) uid=65534 limit=4"), 1), "%s",
		  lg_log(&gmbd));
	kid_end(&k);
}

Test(limits, root_at_its_own_connection_limit_closes_idle_ones_to_look)
{
	static const char *const args[] = { "--max-connections-per-uid", "4", "--hello-timeout",
					    "2", NULL };
	struct flood f = { 0 };
	struct timespec t0, t1;
	struct kid k;
	int n;

	cr_assert(eq(i32, lg_start(&gmbd, 0, 022, args), 0), "%s", lg_log(&gmbd));
	f.sock = gmbd.sock;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kid_start(&k, 0, -1, flood_until_closed, &f);
	n = kid_result(&k);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* The operators' reserve past the uid's limit, then closed; once its
	 * connections have been quiet for the hello timeout, idle ones go. */
	if (t1.tv_sec - t0.tv_sec < 2)
		cr_assert(eq(i32, n, 4 + 16), "root kept %d connections", n);
	cr_assert(eq(i32, wait_until(status_ok, NULL, 10000), 0), "%s", lg_log(&gmbd));
	cr_assert(ge(i32, lg_lines(&gmbd, "idle connection closed to make room"), 1), "%s",
		  lg_log(&gmbd));
	kid_end(&k);
}

/* @fd is still open: gmbd has not closed it. */
static bool raw_open_still(int fd)
{
	char b;
	ssize_t n = recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);

	return n < 0 && errno == EAGAIN;
}

Test(limits, at_gmbd_s_limit_idle_connections_make_room_but_not_an_operator_s)
{
	static const char *const args[] = { "--max-connections-per-uid", "0", "--hello-timeout",
					    "1", NULL };
	struct flood f = { 0 };
	struct kid k, k2;
	int root_fd, n, m;

	cr_assert(eq(i32, lg_start(&gmbd, 400, 022, args), 0), "%s", lg_log(&gmbd));
	f.sock = gmbd.sock;
	/* Root's quiet tool connection, then a uid filling gmbd's room. */
	root_fd = raw_open(gmbd.sock, true);
	cr_assert(ge(i32, root_fd, 0));
	kid_start(&k, NOBODY, -1, flood_until_closed, &f);
	n = kid_result(&k);
	cr_assert(gt(i32, n, 16), "gmbd took %d connections", n);
	/* Once those are quiet for the hello timeout, another uid gets in. */
	usleep(1600 * 1000);
	kid_start(&k2, OTHER, -1, flood_until_closed, &f);
	m = kid_result(&k2);
	cr_assert(gt(i32, m, 0), "no idle connection was closed for another uid");
	cr_assert(le(i32, m, n), "another uid got %d connections, the first %d", m, n);
	cr_assert(not(eq(i32, lg_lines(&gmbd, "idle connection closed to make room"), 0)), "%s",
		  lg_log(&gmbd));
	cr_assert(eq(i32, lg_lines(&gmbd, "uid=0 reason=\"idle connection closed"), 0), "%s",
		  lg_log(&gmbd));
	cr_assert(not(eq(i32, lg_lines(&gmbd, "uid=65534 reason=\"idle connection closed"), 0)),
		  "%s", lg_log(&gmbd));
	cr_assert(raw_open_still(root_fd), "root's connection was closed for another uid");
	close(root_fd);
	kid_end(&k2);
	kid_end(&k);
}

/* ---- too low an fd limit ---- */

Test(limits, under_too_low_an_fd_limit_gmbd_names_the_limit_it_needs_and_serves_under_it)
{
	struct worker w;
	char text[512];
	char *at;
	long need;

	cr_assert(eq(i32, lg_start(&gmbd, 128, 022, NULL), -ECHILD), "gmbd served under 128 fds");
	at = strstr((char *)lg_log(&gmbd), "raise LimitNOFILE= (ulimit -n) to at least ");
	cr_assert(not(eq(ptr, at, NULL)), "%s", lg_log(&gmbd));
	need = strtol(at + strlen("raise LimitNOFILE= (ulimit -n) to at least "), NULL, 10);
	cr_assert(gt(i64, need, 128));
	cr_assert(eq(i32, lg_lines(&gmbd, "gmbd ready"), 0));
	lg_clean(&gmbd);

	cr_assert(eq(i32, lg_start(&gmbd, (rlim_t)need - 1, 022, NULL), -ECHILD),
		  "gmbd served under %ld fds, one less than it said it needs", need - 1);
	lg_clean(&gmbd);

	cr_assert(eq(i32, lg_start(&gmbd, (rlim_t)need, 022, NULL), 0), "%s", lg_log(&gmbd));
	cr_assert(eq(i32, worker_start(&w, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "uid %d", NOBODY), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "connect small"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "malloc t 4096"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "status"), 0), "%s", text);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* ---- the socket's modes, whatever the umask ---- */

struct member {
	const char *sock;
};

static int member_connects(void *arg)
{
	struct member *m = arg;
	int fd = raw_open(m->sock, true);

	if (fd < 0)
		return fd;
	close(fd);
	return 0;
}

Test(limits, under_umask_077_the_modes_are_those_logged_and_the_group_connects)
{
	struct group *gr = getgrnam("users") ? getgrnam("users") : getgrnam("nogroup");
	const char *args[] = { "--socket-group", gr ? gr->gr_name : "users", NULL };
	struct member m;
	char dir[160], want[200];
	struct stat st;
	gid_t gid;
	struct kid k;

	cr_assert(not(eq(ptr, gr, NULL)), "no group to give the socket to");
	gid = gr->gr_gid;
	cr_assert(eq(i32, lg_start(&gmbd, 0, 077, args), 0), "%s", lg_log(&gmbd));
	snprintf(dir, sizeof(dir), "%s/run", gmbd.dir);
	cr_assert(eq(i32, stat(dir, &st), 0));
	cr_assert(eq(u32, (unsigned)(st.st_mode & 07777), 0755), "folder mode %o", st.st_mode);
	snprintf(want, sizeof(want), "socket directory created path=%s mode=0755", dir);
	cr_assert(eq(i32, lg_lines(&gmbd, want), 1), "%s", lg_log(&gmbd));
	cr_assert(eq(i32, stat(gmbd.sock, &st), 0));
	cr_assert(eq(u32, (unsigned)(st.st_mode & 07777), 0660), "socket mode %o", st.st_mode);
	cr_assert(eq(u32, (unsigned)st.st_gid, (unsigned)gid));
	cr_assert(eq(i32, lg_lines(&gmbd, "mode=0660 group="), 1), "%s", lg_log(&gmbd));

	/* A member of the group, not gmbd's user, connects; a stranger may not. */
	m.sock = gmbd.sock;
	kid_start(&k, OTHER, gid, member_connects, &m);
	cr_assert(eq(i32, kid_result(&k), 0), "a member of the socket's group cannot connect");
	kid_end(&k);
	kid_start(&k, OTHER, OTHER, member_connects, &m);
	cr_assert(eq(i32, kid_result(&k), -EACCES), "a stranger connected");
	kid_end(&k);
}
