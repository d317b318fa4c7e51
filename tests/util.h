/*
 * util.h - helpers for integration tests: a real gmbd on a temporary socket
 * (host backend), readiness through NOTIFY_SOCKET (never a sleep), commands
 * run with their output and exit status, counts of a process's open fds.
 */
#ifndef GMB_TEST_UTIL_H
#define GMB_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

struct gmbd_proc {
	pid_t pid;
	char dir[256];  /* temporary folder, removed by gmbd_stop */
	char sock[300];
	char log[300];  /* gmbd's stderr; shown by gmbd_stop when it failed */
};

/* The build folder under test: $GMB_BUILD_DIR or "build". */
const char *test_build_dir(void);

/**
 * gmbd_start() - exec build/gmbd --backend host --socket DIR/gmbd.sock plus
 * @args (NULL-terminated, may be NULL) and wait for READY=1 on a
 * NOTIFY_SOCKET of the test's own (10 s at most). The child dies with the
 * test (PR_SET_PDEATHSIG). Return: 0 or a negative errno.
 */
int gmbd_start(struct gmbd_proc *d, const char *const *args);
/* SIGTERM, wait; returns gmbd's exit status (or -1 if killed by a signal). */
int gmbd_stop(struct gmbd_proc *d);

/* Open fds of @pid (/proc/PID/fd), -errno on failure. */
int proc_count_fds(pid_t pid);

/**
 * run_capture() - run argv (argv[0] a path), wait, capture stdout and stderr
 * (each truncated to @cap bytes, NUL-terminated; either may be NULL).
 * Return: the exit status, or -1 when killed by a signal / spawn failed.
 */
int run_capture(char *const argv[], const char *const envp_extra[], char *out, char *err,
		size_t cap);

/* The first integer after "key": in @json (e.g. json_u64(s, "used_bytes")). */
int64_t json_i64(const char *json, const char *key);
/* Same, but after the first occurrence of @after (to reach a nested object). */
int64_t json_i64_after(const char *json, const char *after, const char *key);

/* Wait until @pred(@arg) is true, polling every 10 ms up to @ms. 0 or -ETIMEDOUT. */
int wait_until(int (*pred)(void *), void *arg, int ms);

/* A tests/prog_worker process driven line by line over pipes. */
struct worker {
	pid_t pid;
	FILE *in;   /* its stdin */
	FILE *out;  /* its stdout */
};

/* Starts BUILD/tests/prog_worker with GMB_SOCKET=@sock. 0 or -errno. */
int worker_start(struct worker *w, const char *sock);
/**
 * worker_cmd() - send one command line, read its answer.
 * Return: the rc the worker printed (0 or -errno); -EPIPE if it died.
 * @text (may be NULL) receives the rest of the answer line.
 */
int worker_cmd(struct worker *w, char *text, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* "quit", wait; the exit status (-1 for a signal). */
int worker_quit(struct worker *w);
/* SIGKILL, wait. */
void worker_kill(struct worker *w);

#endif
