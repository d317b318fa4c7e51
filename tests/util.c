/*
 * util.c - integration test helpers: see util.h.
 */
#include "tests/util.h"

#include "common/backend/backend.h"
#include "common/wire.h"

/* LeakSanitizer's interface exists in sanitizer builds only. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_LSAN 1
#endif
#endif
#ifdef TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *test_build_dir(void)
{
	const char *b = getenv("GMB_BUILD_DIR");

	return b && *b ? b : "build";
}

void test_log_path(char *buf, size_t cap, const char *dir, const char *what)
{
	static int seq;
	char name[64];

	snprintf(name, sizeof(name), "%s-%d", what, ++seq);
	if (!testlog_path || testlog_path(name, buf, cap) < 0)
		snprintf(buf, cap, "%s/%s.log", dir, name);
}

int test_log_stderr(const char *what)
{
	char path[512];
	int fd, rc = 0;

	if (!testlog_path || testlog_path(what, path, sizeof(path)) < 0)
		return 0;
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (dup2(fd, STDERR_FILENO) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

int test_notify_socket(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

int test_wait_ready(int nfd, pid_t pid, int ms)
{
	char buf[512];

	while (ms > 0) {
		struct pollfd p = { .fd = nfd, .events = POLLIN };
		int n = poll(&p, 1, 100);

		ms -= 100;
		if (n > 0) {
			ssize_t len = recv(nfd, buf, sizeof(buf) - 1, 0);

			if (len > 0) {
				buf[len] = 0;
				if (strstr(buf, "READY=1"))
					return 0;
			}
		}
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -ECHILD;
	}
	return -ETIMEDOUT;
}

void test_gmbd_argv(const char **argv, size_t cap, char *bin, size_t binlen, const char *sock,
		    const char *const *args)
{
	size_t n = 0;

	snprintf(bin, binlen, "%s/gmbd", test_build_dir());
	argv[n++] = bin;
	argv[n++] = "--backend";
	argv[n++] = "host";
	argv[n++] = "--socket";
	argv[n++] = sock;
	for (; args && *args && n + 1 < cap; args++)
		argv[n++] = *args;
	argv[n] = NULL;
}

static void gmbd_exec(struct gmbd_proc *d, const char *notify, const char *const *args)
{
	const char *argv[64];
	char bin[256];

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	test_gmbd_argv(argv, 64, bin, sizeof(bin), d->sock, args);
	setenv("NOTIFY_SOCKET", notify, 1);
	/* Never the limit of a unit the tests themselves may run in. */
	if (d->fdstore[0])
		setenv("FDSTORE", d->fdstore, 1);
	else
		unsetenv("FDSTORE");
	int log = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

	if (log >= 0)
		dup2(log, 2);
	execv(bin, (char *const *)argv);
	_exit(127);
}

int gmbd_start(struct gmbd_proc *d, const char *const *args)
{
	char notify[300];
	int nfd, err;

	d->fdstore[0] = '\0';
	snprintf(d->dir, sizeof(d->dir), "/tmp/gmbtest.XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/gmbd.sock", d->dir);
	snprintf(notify, sizeof(notify), "%s/notify", d->dir);
	test_log_path(d->log, sizeof(d->log), d->dir, "gmbd");
	nfd = test_notify_socket(notify);
	if (nfd < 0)
		return nfd;
	d->pid = fork();
	if (d->pid < 0) {
		err = -errno;
		goto out;
	}
	if (d->pid == 0)
		gmbd_exec(d, notify, args);
	err = test_wait_ready(nfd, d->pid, 10000);
out:
	close(nfd);
	unlink(notify);
	return err;
}

int gmbd_start_shared(struct gmbd_proc *d, const char *const *args)
{
	int rc = gmbd_start(d, args);

	if (rc < 0)
		return rc;
	if (chmod(d->dir, 0711) < 0 || chmod(d->sock, 0666) < 0)
		return -errno;
	return 0;
}

int gmbd_stop(struct gmbd_proc *d)
{
	char cmd[640];
	int st = 0;

	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		if (waitpid(d->pid, &st, 0) < 0)
			st = -1;
		d->pid = 0;
	}
	/* Outside a Criterion test only: there, the failed test's report shows it. */
	if (!testlog_path && (!WIFEXITED(st) || WEXITSTATUS(st))) {
		snprintf(cmd, sizeof(cmd), "cat '%s' >&2", d->log);
		if (system(cmd) != 0)
			fprintf(stderr, "gmbd log %s unreadable\n", d->log);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	if (d->dir[0] && system(cmd) != 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const struct backend_ops *fail_real_ops;
static struct backend_ops fail_ops;
static int fail_creates_left;

static int fail_chunk_create(struct backend *b, int dev, uint64_t size, uint64_t *handle)
{
	if (fail_creates_left-- <= 0)
		return backend_fail(-EIO, "injected chunk_create failure");
	return fail_real_ops->chunk_create(b, dev, size, handle);
}

void test_backend_fail_creates(struct backend *b, int n)
{
	if (b->ops != &fail_ops)
		fail_real_ops = b->ops;
	fail_ops = *fail_real_ops;
	fail_ops.chunk_create = fail_chunk_create;
	fail_creates_left = n;
	b->ops = &fail_ops;
}

void test_backend_restore(struct backend *b)
{
	if (b && b->ops == &fail_ops)
		b->ops = fail_real_ops;
}

int test_leak_check(void)
{
#ifdef TEST_LSAN
	return __lsan_do_recoverable_leak_check();
#else
	return 0;
#endif
}

int proc_count_memfds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		char path[300], link[256];
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len <= 0)
			continue;
		link[len] = '\0';
		n += strncmp(link, "/memfd:gmb-chunk", 16) == 0;
	}
	closedir(d);
	return n;
}

int proc_count_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	if (!dir)
		return -errno;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* Drains both pipes into the caller's buffers until both reach EOF. */
static void capture_pipes(int ofd, int efd, char *out, char *err, size_t cap)
{
	size_t olen = 0, elen = 0;
	struct pollfd p[2] = { { .fd = ofd, .events = POLLIN }, { .fd = efd, .events = POLLIN } };
	char sink[4096];

	while (p[0].fd >= 0 || p[1].fd >= 0) {
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		for (int i = 0; i < 2; i++) {
			char *buf = i ? err : out;
			size_t *len = i ? &elen : &olen;
			ssize_t r;

			if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
				continue;
			if (buf && *len + 1 < cap)
				r = read(p[i].fd, buf + *len, cap - 1 - *len);
			else
				r = read(p[i].fd, sink, sizeof(sink));
			if (r <= 0) {
				close(p[i].fd);
				p[i].fd = -1;
			} else if (buf && *len + 1 < cap) {
				*len += (size_t)r;
			}
		}
	}
	if (out && cap)
		out[olen] = 0;
	if (err && cap)
		err[elen] = 0;
}

int run_capture(char *const argv[], const char *const envp_extra[], char *out, char *err,
		size_t cap)
{
	int op[2], ep[2], st;
	pid_t pid;

	if (pipe2(op, O_CLOEXEC) < 0)
		return -1;
	if (pipe2(ep, O_CLOEXEC) < 0) {
		close(op[0]);
		close(op[1]);
		return -1;
	}
	pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(op[1], 1);
		dup2(ep[1], 2);
		for (; envp_extra && *envp_extra; envp_extra++)
			putenv((char *)*envp_extra);
		execv(argv[0], argv);
		_exit(127);
	}
	close(op[1]);
	close(ep[1]);
	capture_pipes(op[0], ep[0], out, err, cap);
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int64_t json_i64_after(const char *json, const char *after, const char *key)
{
	char pat[128];
	const char *p = json;

	if (!json)
		return -1;
	if (after) {
		p = strstr(json, after);
		if (!p)
			return -1;
	}
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(p, pat);
	if (!p)
		return -1;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	return strtoll(p, NULL, 10);
}

int64_t json_i64(const char *json, const char *key)
{
	return json_i64_after(json, NULL, key);
}

int wait_until(int (*pred)(void *), void *arg, int ms)
{
	struct timespec ts = { .tv_nsec = 10 * 1000 * 1000 };

	for (int waited = 0; waited <= ms; waited += 10) {
		if (pred(arg))
			return 0;
		nanosleep(&ts, NULL);
	}
	return -ETIMEDOUT;
}

int worker_spawn(struct worker *w, const char *bin, void (*setup)(void *arg), void *arg)
{
	int to[2], from[2];

	if (pipe2(to, O_CLOEXEC) < 0)
		return -errno;
	if (pipe2(from, O_CLOEXEC) < 0) {
		close(to[0]);
		close(to[1]);
		return -errno;
	}
	w->pid = fork();
	if (w->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(to[0], 0);
		dup2(from[1], 1);
		if (setup)
			setup(arg);
		execl(bin, bin, (char *)NULL);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	w->in = fdopen(to[1], "w");
	w->out = fdopen(from[0], "r");
	if (w->pid < 0 || !w->in || !w->out)
		return -EIO;
	setvbuf(w->in, NULL, _IOLBF, 0);
	return 0;
}

static void worker_setup_socket(void *sock)
{
	setenv("GMB_SOCKET", sock, 1);
}

int worker_start(struct worker *w, const char *sock)
{
	char bin[256];

	snprintf(bin, sizeof(bin), "%s/tests/prog_worker", test_build_dir());
	return worker_spawn(w, bin, worker_setup_socket, (void *)sock);
}

int worker_cmd(struct worker *w, char *text, size_t cap, const char *fmt, ...)
{
	static char line[1 << 16];
	va_list ap;
	char *sp;
	int rc;

	va_start(ap, fmt);
	vfprintf(w->in, fmt, ap);
	va_end(ap);
	fputc('\n', w->in);
	if (fflush(w->in) || !fgets(line, sizeof(line), w->out))
		return -EPIPE;
	rc = (int)strtol(line, &sp, 10);
	if (text && cap) {
		while (*sp == ' ')
			sp++;
		snprintf(text, cap, "%s", sp);
		text[strcspn(text, "\n")] = 0;
	}
	return rc;
}

int worker_connect(struct worker *w, const char *sock, const char *name, char *text, size_t cap)
{
	int rc = worker_start(w, sock);

	if (rc < 0) {
		if (text && cap)
			snprintf(text, cap, "cannot start the worker: %s", strerror(-rc));
		return rc;
	}
	return worker_cmd(w, text, cap, "connect %s", name);
}

int worker_quit(struct worker *w)
{
	int st = 0;

	fputs("quit\n", w->in);
	fclose(w->in);
	fclose(w->out);
	if (waitpid(w->pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void worker_kill(struct worker *w)
{
	kill(w->pid, SIGKILL);
	waitpid(w->pid, NULL, 0);
	fclose(w->in);
	fclose(w->out);
}

/* In the child: @fds at 3.., LISTEN_* set as systemd does, then exec. */
static void gmbd_spawn_child(struct gmbd_proc *d, const char *notify, const struct sd_pass *fds,
			     int nfds, const char *const *args)
{
	static char names[FAKE_SD_MAX_FDS * 64 + 1024];
	char num[32];
	int hi = 3 + nfds;
	size_t off = 0;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* Out of the way first, above every fd passed (a test with many fds
	 * open has store fds above 3 + nfds), so that no dup2() clobbers one
	 * not yet copied; then to 3.. . */
	for (int i = 0; i < nfds; i++)
		if (fds[i].fd >= hi)
			hi = fds[i].fd + 1;
	for (int i = 0; i < nfds; i++)
		if (dup2(fds[i].fd, hi + i) < 0)
			_exit(126);
	for (int i = 0; i < nfds; i++) {
		if (dup2(hi + i, 3 + i) < 0)
			_exit(126);
		close(hi + i);
		off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%s", i ? ":" : "",
					fds[i].name);
	}
	if (nfds) {
		snprintf(num, sizeof(num), "%d", nfds);
		setenv("LISTEN_FDS", num, 1);
		snprintf(num, sizeof(num), "%d", (int)getpid());
		setenv("LISTEN_PID", num, 1);
		setenv("LISTEN_FDNAMES", names, 1);
	}
	gmbd_exec(d, notify, args);
}

int gmbd_spawn(struct gmbd_proc *d, const char *notify, const struct sd_pass *fds, int nfds,
	       const char *const *args)
{
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0)
		gmbd_spawn_child(d, notify, fds, nfds, args);
	return 0;
}

int gmbd_wait(struct gmbd_proc *d)
{
	int st = 0;

	if (d->pid <= 0 || waitpid(d->pid, &st, 0) < 0)
		return -1;
	d->pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void test_fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed);
}

bool test_holds(const unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 31 + seed))
			return false;
	return true;
}

int gmbctl_vrun(const char *const *pre, const char *sock, char *out, char *err, size_t cap,
		va_list ap)
{
	char bin[256];
	char *argv[24];
	const char *a;
	int n = 0;

	snprintf(bin, sizeof(bin), "%s/gmbctl", test_build_dir());
	for (; pre && *pre && n < 8; pre++)
		argv[n++] = (char *)*pre;
	argv[n++] = bin;
	if (sock) {
		argv[n++] = "-s";
		argv[n++] = (char *)sock;
	}
	while ((a = va_arg(ap, const char *)) && n < 23)
		argv[n++] = (char *)a;
	argv[n] = NULL;
	return run_capture(argv, NULL, out, err, cap);
}

void test_shim_env(const char *build, const char *sock, bool preload)
{
	char path[PATH_MAX + 32], asan[1024];
	const char *old = getenv("ASAN_OPTIONS");

	setenv("GMB_SOCKET", sock, 1);
	/* The shim's tests count bytes per allocation; packing is test_pack's
	 * and test_ipc's (GMB_PACK=hooks given on purpose). */
	setenv("GMB_PACK", "off", 0);
	snprintf(path, sizeof(path), "%s/libgmb.so", build);
	setenv("GMB_LIB", path, 1);
	if (preload) {
		snprintf(path, sizeof(path), "%s/libgmb_preload.so", build);
		setenv("LD_PRELOAD", path, 1);
	}
	snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", old ? old : "",
		 old && *old ? ":" : "");
	setenv("ASAN_OPTIONS", asan, 1);
}

/* The fd number below which process @pid has room for exactly @k new fds; -1 if none. */
long test_fd_room(pid_t pid, int k)
{
	static bool used[1 << 16];
	char path[64];
	struct dirent *e;
	DIR *d;
	int n;

	memset(used, 0, sizeof(used));
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && (n = atoi(e->d_name)) < (int)sizeof(used))
			used[n] = true;
	closedir(d);
	for (n = 0; n < (int)sizeof(used); n++)
		if (!used[n] && k-- == 0)
			return n;
	return -1;
}

/* @pid's soft open-file limit set to @cur behind its back (*@old: what it was); 0 or -errno. */
int test_set_nofile(pid_t pid, rlim_t cur, struct rlimit *old)
{
	struct rlimit rl;

	if (prlimit(pid, RLIMIT_NOFILE, NULL, &rl) < 0)
		return -errno;
	if (old)
		*old = rl;
	rl.rlim_cur = cur;
	return prlimit(pid, RLIMIT_NOFILE, &rl, NULL) < 0 ? -errno : 0;
}

uint64_t test_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* This process's RssAnon (private anonymous resident bytes); -1 if unread. */
int64_t test_rss_anon(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long long kb = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %lld kB", &kb) == 1)
			break;
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}
