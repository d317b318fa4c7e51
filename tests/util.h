/*
 * util.h - helpers for integration tests: a real gmbd on a temporary socket
 * (host backend), readiness through NOTIFY_SOCKET (never a sleep), commands
 * run with their output and exit status, counts of a process's open fds.
 */
#ifndef GMB_TEST_UTIL_H
#define GMB_TEST_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "include/gmb.h"

struct gmbd_proc {
	pid_t pid;
	char dir[256]; /* temporary folder, removed by gmbd_stop */
	char sock[300];
	char log[300];	  /* gmbd's stderr: test_log_path()'s file */
	char fdstore[16]; /* $FDSTORE for gmbd, as systemd 254 sets it; "": unset */
};

/* The build folder under test: $GMB_BUILD_DIR or "build". */
const char *test_build_dir(void);

/*
 * testlog_path() - the current test's log file for @what into @buf
 * (tests/testlog.c, in the Criterion programs only, hence weak: NULL in
 * the programs without it). Return: 0 or a negative errno.
 */
int testlog_path(const char *what, char *buf, size_t cap) __attribute__((weak));
/*
 * test_log_path() - where a test keeps a log (gmbd's stderr, output it
 * captures): testlog_path()'s file, shown if the test fails, or else
 * @dir/@what.log. @what is made unique in this process (a number added).
 */
void test_log_path(char *buf, size_t cap, const char *dir, const char *what);
/*
 * test_log_stderr() - this process's stderr (the daemon's layers run in it,
 * and log there) into the current test's file for @what, shown if the test
 * fails; nothing outside a Criterion test. Return: 0 or a negative errno.
 */
int test_log_stderr(const char *what);

/**
 * gmbd_start() - exec build/gmbd --backend host --socket DIR/gmbd.sock plus
 * @args (NULL-terminated, may be NULL) and wait for READY=1 on a
 * NOTIFY_SOCKET of the test's own (10 s at most). The child dies with the
 * test (PR_SET_PDEATHSIG). Return: 0 or a negative errno.
 */
int gmbd_start(struct gmbd_proc *d, const char *const *args);
/* The argv of build/gmbd --backend host --socket @sock, then @args (NULL
 * ends them), in @argv[0..@cap), NULL-terminated; @bin (@binlen bytes)
 * holds the program's path, argv[0]. */
void test_gmbd_argv(const char **argv, size_t cap, char *bin, size_t binlen, const char *sock,
		    const char *const *args);
/* Reads notify datagrams on @nfd until one holds READY=1 (0), for at most
 * @ms (-ETIMEDOUT); the death of @pid ends it first (-ECHILD, reaped). */
int test_wait_ready(int nfd, pid_t pid, int ms);
/* gmbd_start(), then the folder and the socket open to every uid (as
 * gmbd.socket's group opens them to its members), for tests as nobody. */
int gmbd_start_shared(struct gmbd_proc *d, const char *const *args);
/* SIGTERM, wait; returns gmbd's exit status (or -1 if killed by a signal). */
int gmbd_stop(struct gmbd_proc *d);
/* Waits for gmbd to exit (signalled already); its exit status, -1 for a signal. */
int gmbd_wait(struct gmbd_proc *d);

struct backend;

/*
 * test_backend_fail_creates() - @b's chunk_create succeeds @n more times,
 * then fails with -EIO ("injected chunk_create failure"), until
 * test_backend_restore(@b). One backend at a time.
 */
void test_backend_fail_creates(struct backend *b, int n);
void test_backend_restore(struct backend *b);

/*
 * test_leak_check() - 0, or non-zero when LeakSanitizer finds leaks now
 * (sanitizer builds; Criterion's workers would exit before its report).
 */
int test_leak_check(void);

/* Host backend chunks (memfds named gmb-chunk) this process holds open. */
int proc_count_memfds(void);

/* Open fds of @pid (/proc/PID/fd), -errno on failure. */
int proc_count_fds(pid_t pid);
/* This process's RssAnon (private anonymous resident bytes); -1 if unread. */
int64_t test_rss_anon(void);
/* CLOCK_MONOTONIC in ns. */
uint64_t test_now_ns(void);
/* The fd number below which @pid has room for exactly @k new fds; -1 if none. */
long test_fd_room(pid_t pid, int k);
/* @pid's soft RLIMIT_NOFILE set to @cur behind its back; *@old (may be NULL)
 * gets what it was. Return: 0 or -errno. */
int test_set_nofile(pid_t pid, rlim_t cur, struct rlimit *old);

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
/* The first integer after "key" in gmbd's status document as @c reads it
 * (e.g. device 0's "used_bytes"); -1 when the status fails. Inline: only
 * the tests that call it link libgmb for it. */
static inline int64_t test_status_i64(gmb_client *c, const char *key)
{
	char *json = NULL;
	int64_t v;

	if (gmb_status_json(c, &json))
		return -1;
	v = json_i64(json, key);
	free(json);
	return v;
}

/* Wait until @pred(@arg) is true, polling every 10 ms up to @ms. 0 or -ETIMEDOUT. */
int wait_until(int (*pred)(void *), void *arg, int ms);

/* A tests/prog_worker process driven line by line over pipes. */
struct worker {
	pid_t pid;
	FILE *in;  /* its stdin */
	FILE *out; /* its stdout */
};

/* Starts @bin with its stdin and stdout on pipes to @w; in the child,
 * before the exec, @setup(@arg) (NULL: none) sets its environment or
 * credentials and may _exit() on failure. The child dies with the test
 * (PR_SET_PDEATHSIG). 0 or -errno. */
int worker_spawn(struct worker *w, const char *bin, void (*setup)(void *arg), void *arg);
/* A child's environment for a program of the shim's tests: gmbd's socket
 * @sock, @build's libgmb.so as GMB_LIB, with @preload its libgmb_preload.so
 * as LD_PRELOAD, and ASan told that a preloaded library before libasan is
 * fine. */
void test_shim_env(const char *build, const char *sock, bool preload);
/* Starts BUILD/tests/prog_worker with GMB_SOCKET=@sock. 0 or -errno. */
int worker_start(struct worker *w, const char *sock);
/**
 * worker_cmd() - send one command line, read its answer.
 * Return: the rc the worker printed (0 or -errno); -EPIPE if it died.
 * @text (may be NULL) receives the rest of the answer line.
 */
int worker_cmd(struct worker *w, char *text, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/*
 * worker_start() on @sock, then "connect @name". Return: 0, or the first
 * failure's -errno with the worker's answer in @text (may be NULL).
 */
int worker_connect(struct worker *w, const char *sock, const char *name, char *text, size_t cap);
/* "quit", wait; the exit status (-1 for a signal). */
int worker_quit(struct worker *w);
/* SIGKILL, wait. */
void worker_kill(struct worker *w);

/*
 * A fake service manager: the datagram socket gmbd's $NOTIFY_SOCKET names,
 * read by a thread of its own (sd_notify() blocks on a full socket). It
 * keeps what systemd would: READY=1, STOPPING=1 and WATCHDOG=1 counts, the
 * last STATUS=, and the fd store (FDSTORE=1 + FDNAME=, FDSTOREREMOVE=1).
 * The store's fds are the manager's (closed by fake_sd_close()). With a
 * limit it is a unit's FileDescriptorStoreMax= and kept as systemd 252
 * keeps it: an fd past it is closed and counted, and the sender is told
 * nothing; with announce, sd_gmbd_up() says the limit in $FDSTORE, as
 * systemd 254 and later do.
 */
#define FAKE_SD_MAX_FDS 1024

struct fake_sd_fd {
	int fd;
	char name[256];
};

struct fake_sd {
	char path[300];
	int sock;
	int stop[2]; /* the thread's wake-up pipe */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond; /* something arrived */
	unsigned ready, stopping, watchdog, syncs;
	char status[512];
	struct fake_sd_fd store[FAKE_SD_MAX_FDS];
	int nstore;
	int overflow;	  /* FDSTOREs beyond FAKE_SD_MAX_FDS */
	unsigned limit;	  /* FileDescriptorStoreMax=; 0: FAKE_SD_MAX_FDS only */
	bool announce;	  /* $FDSTORE=limit for the gmbd sd_gmbd_up() starts */
	unsigned dropped; /* FDSTOREs closed past the limit, unannounced */
};

/* A datagram socket bound at @path, as a NOTIFY_SOCKET (close-on-exec; the
 * caller's). The fd or -errno. */
int test_notify_socket(const char *path);
/* Binds @path and starts reading. 0 or -errno. */
int fake_sd_open(struct fake_sd *m, const char *path);
void fake_sd_close(struct fake_sd *m);
/* Waits until every datagram sent before the call has been read (10 s). */
int fake_sd_sync(struct fake_sd *m);
/* Waits (at most @ms) until *@counter (a field of @m) reaches @n. */
int fake_sd_wait_count(struct fake_sd *m, const unsigned *counter, unsigned n, int ms);
/* Waits (at most @ms) until the last STATUS= contains @needle. */
int fake_sd_wait_status(struct fake_sd *m, const char *needle, int ms);
/* Waits (at most @ms) until there is a STATUS= and it lacks @needle. */
int fake_sd_wait_status_not(struct fake_sd *m, const char *needle, int ms);
/* How many stored fds have a name starting with @prefix. */
int fake_sd_count(struct fake_sd *m, const char *prefix);

/* An fd handed to gmbd at start as systemd does (LISTEN_FDS, LISTEN_FDNAMES). */
struct sd_pass {
	int fd; /* stays the caller's */
	const char *name;
};

/**
 * gmbd_spawn() - exec BUILD/gmbd --backend host --socket @d->sock plus @args
 * with NOTIFY_SOCKET=@notify and @fds passed at 3.. (LISTEN_PID is gmbd's
 * own pid); returns once forked: wait for READY=1 on the fake manager.
 * @d->dir and @d->sock must be set. Return: 0 or -errno.
 */
int gmbd_spawn(struct gmbd_proc *d, const char *notify, const struct sd_pass *fds, int nfds,
	       const char *const *args);

/* Every fd of @m's store, with its name, for gmbd_spawn() (@out: @max entries). */
int fake_sd_pass(struct fake_sd *m, struct sd_pass *out, int max);

/*
 * gmbd run as systemd runs it: a folder of its own, the fake manager on
 * dir/notify, and a listening socket that outlives each gmbd (as
 * gmbd.socket does; -1 when not asked for), plus how often it started.
 */
struct sd_gmbd {
	char dir[256]; /* removed by sd_gmbd_close */
	char notify[300];
	struct fake_sd sd;
	struct gmbd_proc gmbd;
	int listen_fd;
	unsigned starts;
};

/* Makes a folder from @tmpl (mkdtemp), opens the manager there and, when
 * @listen, gmbd's socket; starts no gmbd. 0 or -errno. */
int sd_gmbd_open(struct sd_gmbd *f, const char *tmpl, bool listen);
/* Starts gmbd with @args, the socket and the whole store; waits @ms for its READY=1. */
int sd_gmbd_up(struct sd_gmbd *f, const char *const *args, int ms);
/* SIGKILL, reaped, then every datagram it sent read: the store is what it left. */
int sd_gmbd_kill(struct sd_gmbd *f);
/* Ends a running gmbd with @sig, closes the manager and the socket, removes the folder. */
void sd_gmbd_close(struct sd_gmbd *f, int sig);

/* Fills @p with a pattern of @seed; test_holds() says whether it is still there. */
void test_fill(unsigned char *p, size_t n, unsigned seed);
bool test_holds(const unsigned char *p, size_t n, unsigned seed);

/*
 * gmbctl_vrun() - run BUILD/gmbctl -s @sock and the NULL-ended arguments in
 * @ap, after the NULL-ended @pre (a program it runs under, e.g. setpriv;
 * may be NULL); @sock NULL leaves -s out. stdout and stderr into @out and
 * @err (@cap bytes each). Return: its exit status, or -1.
 */
int gmbctl_vrun(const char *const *pre, const char *sock, char *out, char *err, size_t cap,
		va_list ap);

#endif
