/*
 * ipc_fx.c - the CUDA IPC tests' fixture (ipc_fx.h).
 */
#include "tests/ipc_fx.h"

#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct gmbd_proc ipcfx_gmbd;
char ipcfx_build[PATH_MAX];
const char *ipcfx_sock;

static void ipcfx_start_chunk(const char *max_chunk)
{
	const char *const args[] = { "--host-devices", "1",	      "--host-memory",
				     "64MiB",	       "--max-chunk", max_chunk,
				     "--log-level",    "info",	      NULL };

	cr_assert(not(eq(ptr, realpath(test_build_dir(), ipcfx_build), NULL)));
	cr_assert(eq(i32, gmbd_start_shared(&ipcfx_gmbd, args), 0), "gmbd did not start");
}

void ipcfx_start(void)
{
	ipcfx_start_chunk("2MiB");
}

void ipcfx_start_big_chunks(void)
{
	ipcfx_start_chunk("64MiB");
}

void ipcfx_stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&ipcfx_gmbd), 0), "gmbd did not exit cleanly");
}

struct ipcfx_prog_args {
	uid_t uid;
	const char *env;
};

/* In the child: the shim, libgmb and gmbd's socket, @a's credentials. */
static void ipcfx_prog_setup(void *arg)
{
	const struct ipcfx_prog_args *a = arg;

	test_shim_env(ipcfx_build, ipcfx_sock ? ipcfx_sock : ipcfx_gmbd.sock, true);
	/* NAME=VALUE settings separated by spaces; the copy is the child's. */
	char *copy = a->env ? strdup(a->env) : NULL, *save = NULL;

	if (a->env && !copy)
		_exit(126);
	for (char *e = copy ? strtok_r(copy, " ", &save) : NULL; e; e = strtok_r(NULL, " ", &save))
		putenv(e);
	if (a->uid && (setgid(a->uid) || setuid(a->uid)))
		_exit(126);
}

void ipcfx_prog_env(struct worker *w, uid_t uid, const char *env)
{
	struct ipcfx_prog_args a = { .uid = uid, .env = env };
	char bin[PATH_MAX + 32];

	snprintf(bin, sizeof(bin), "%s/tests/prog_preload", ipcfx_build);
	cr_assert(eq(i32, worker_spawn(w, bin, ipcfx_prog_setup, &a), 0));
}

void ipcfx_prog(struct worker *w, uid_t uid)
{
	ipcfx_prog_env(w, uid, NULL);
}

const char *ipcfx_run(struct worker *w, int want, const char *fmt, ...)
{
	static char text[1 << 15];
	char cmd[512];
	va_list ap;
	int rc;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	rc = worker_cmd(w, text, sizeof(text), "%s", cmd);
	cr_assert(eq(i32, rc, want), "\"%s\" answered %d (%s), want %d", cmd, rc, text, want);
	return text;
}

int ipcfx_run_rc(struct worker *w, const char *fmt, const char *arg)
{
	static char text[1 << 15];

	return worker_cmd(w, text, sizeof(text), fmt, arg);
}

void ipcfx_exporter_mode(struct worker *w, size_t size, int byte, char p[32], const char *mode,
			 const char *env)
{
	ipcfx_prog_env(w, 0, env);
	ipcfx_run(w, 0, "gmb");
	ipcfx_run(w, 0, "region w %s", mode);
	snprintf(p, 32, "%s", ipcfx_run(w, 0, "malloc %zu", size));
	cr_assert(strcmp(p, "(nil)") != 0);
	ipcfx_run(w, 0, "fill %s %zu %d", p, size, byte);
}

void ipcfx_exporter_env(struct worker *w, size_t size, int byte, char p[32], const char *env)
{
	ipcfx_exporter_mode(w, size, byte, p, "discard", env);
}

void ipcfx_exporter(struct worker *w, size_t size, int byte, char p[32])
{
	ipcfx_exporter_env(w, size, byte, p, NULL);
}

void ipcfx_get_handle(struct worker *w, const char *ptr, char h[160])
{
	snprintf(h, 160, "%s", ipcfx_run(w, 0, "ipcget %s", ptr));
	cr_assert(eq(sz, strlen(h), 128));
	cr_assert(eq(i32, strncmp(h, "474d42495043", 12), 0), "gmbd's magic: %s", h);
}

void ipcfx_open_handle(struct worker *w, const char *h, char q[32])
{
	snprintf(q, 32, "%s", ipcfx_run(w, 0, "ipcopen %s", h));
	cr_assert(strcmp(q, "(nil)") != 0);
}

int64_t ipcfx_used(struct worker *w)
{
	return json_i64_after(ipcfx_run(w, 0, "status"), "{\"index\":0,", "used_bytes");
}

uintptr_t ipcfx_addr(const char *p)
{
	return (uintptr_t)strtoull(p, NULL, 0);
}

void ipcfx_quit(struct worker *w)
{
	cr_assert(eq(i32, worker_quit(w), 0), "prog_preload did not exit cleanly");
}

bool ipcfx_answered(struct worker *w, int ms)
{
	struct pollfd pfd = { .fd = fileno(w->out), .events = POLLIN };

	return poll(&pfd, 1, ms) == 1;
}

int ipcfx_answer(struct worker *w)
{
	char line[4096];

	cr_assert(not(eq(ptr, fgets(line, sizeof(line), w->out), NULL)), "the program died");
	return atoi(line);
}

double ipcfx_ms_since(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* stdout in the first half of @out, stderr in the second. */
int ipcfx_ctl(char *out, size_t cap, const char *const *args)
{
	char bin[PATH_MAX + 16];
	char *argv[16] = { bin, "-s", (char *)(ipcfx_sock ? ipcfx_sock : ipcfx_gmbd.sock) };
	size_t n = 3;

	snprintf(bin, sizeof(bin), "%s/gmbctl", ipcfx_build);
	while (*args && n < 15)
		argv[n++] = (char *)*args++;
	argv[n] = NULL;
	return run_capture(argv, NULL, out, out + cap / 2, cap / 2);
}

void ipcfx_ctl_status(bool json, char *out, size_t cap)
{
	const char *const args[] = { "status", json ? "--json" : NULL, NULL };

	cr_assert(eq(i32, ipcfx_ctl(out, cap, args), 0), "%s", out);
}

void ipcfx_log(char *buf, size_t cap)
{
	FILE *lf = fopen(ipcfx_gmbd.log, "r");
	size_t n;

	cr_assert(not(eq(ptr, lf, NULL)));
	n = fread(buf, 1, cap - 1, lf);
	buf[n] = 0;
	fclose(lf);
}

pid_t ipcfx_child_start(const char *name, const char *arg)
{
	static char *const argv[] = { "gmb-test-child", NULL };
	extern char **environ;
	char child[128], carg[1024], sock[sizeof(ipcfx_gmbd.sock) + 16];
	char **envp; /* ours: the array only, its strings are environ's and the three above */
	size_t n = 0, k = 0;
	pid_t pid;

	cr_assert(lt(sz, strlen(name), sizeof(child) - 20));
	cr_assert(lt(sz, strlen(arg), sizeof(carg) - 24), "%s", arg);
	snprintf(child, sizeof(child), "GMB_TEST_CHILD=%s", name);
	snprintf(carg, sizeof(carg), "GMB_TEST_CHILD_ARG=%s", arg);
	snprintf(sock, sizeof(sock), "GMB_TEST_SOCK=%s", ipcfx_sock ? ipcfx_sock : ipcfx_gmbd.sock);
	while (environ[n])
		n++;
	envp = calloc(n + 4, sizeof(*envp));
	cr_assert(not(eq(ptr, envp, NULL)));
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "GMB_TEST_CHILD", 14) &&
		    strncmp(environ[i], "GMB_TEST_SOCK=", 14))
			envp[k++] = environ[i];
	envp[k++] = child;
	envp[k++] = carg;
	envp[k++] = sock;
	envp[k] = NULL;
	pid = fork();
	if (pid == 0) {
		/* Async-signal-safe calls only until the exec. */
		execve("/proc/self/exe", argv, envp);
		_exit(126);
	}
	free(envp);
	cr_assert(ge(i32, pid, 0), "fork: %s", strerror(errno));
	return pid;
}

int ipcfx_child(const char *name, const char *arg)
{
	pid_t pid = ipcfx_child_start(name, arg);
	int st = 0;

	cr_assert(eq(i32, waitpid(pid, &st, 0), pid));
	return st;
}

void ipcfx_child_main(const struct ipcfx_child_def *defs, size_t n)
{
	const char *name = getenv("GMB_TEST_CHILD"), *arg = getenv("GMB_TEST_CHILD_ARG");
	const char *sock = getenv("GMB_TEST_SOCK");

	if (!name)
		return;
	snprintf(ipcfx_gmbd.sock, sizeof(ipcfx_gmbd.sock), "%s", sock ? sock : "");
	for (size_t i = 0; i < n; i++)
		if (strcmp(defs[i].name, name) == 0)
			_exit(defs[i].fn(arg ? arg : ""));
	fprintf(stderr, "gmb-test-child: no child named %s\n", name);
	_exit(127);
}
