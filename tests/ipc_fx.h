/*
 * ipc_fx.h - the fixture of the CUDA IPC integration tests (test_ipc.c,
 * test_ipc_follow.c): one gmbd (host backend, one 64 MiB device, 2 MiB
 * chunks) per test, and tests/prog_preload programs under the preload
 * shim driven line by line (an exporter whose memory is gmbd's, importers).
 * Every helper asserts (Criterion) what it needs to go on.
 */
#ifndef GMB_TESTS_IPC_FX_H
#define GMB_TESTS_IPC_FX_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "tests/util.h"

#define MiB	       (1024ULL * 1024)
/* 400: the runtime's answer to a handle that names nothing. */
#define INVALID_HANDLE 400

extern struct gmbd_proc ipcfx_gmbd;
extern char ipcfx_build[PATH_MAX];
/* The socket the programs reach: NULL for ipcfx_gmbd's (a suite with a
 * gmbd of its own sets it, and ipcfx_build, in its init). */
extern const char *ipcfx_sock;

/* The suite's init and fini: gmbd started, stopped cleanly. */
void ipcfx_start(void);
/* The same with --max-chunk 64MiB: a 64 MiB allocation is one chunk. */
void ipcfx_start_big_chunks(void);
void ipcfx_stop(void);

/* A prog_preload under the shim on gmbd's socket; @uid > 0: run as that
 * uid; @env (may be NULL): VAR=value settings, separated by spaces. */
void ipcfx_prog_env(struct worker *w, uid_t uid, const char *env);
void ipcfx_prog(struct worker *w, uid_t uid);
/* Sends a command, asserts its status is @want; the rest of the answer. */
const char *ipcfx_run(struct worker *w, int want, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The status of @fmt with @arg. */
int ipcfx_run_rc(struct worker *w, const char *fmt, const char *arg);
/* An exporter with @size bytes of gmbd memory in tag "w" (@mode: discard
 * or preserve), filled with @byte; its pointer into @p. */
void ipcfx_exporter_env(struct worker *w, size_t size, int byte, char p[32], const char *env);
void ipcfx_exporter(struct worker *w, size_t size, int byte, char p[32]);
void ipcfx_exporter_mode(struct worker *w, size_t size, int byte, char p[32], const char *mode,
			 const char *env);
/* The exporter's handle of @ptr (128 hex digits, gmbd's magic first). */
void ipcfx_get_handle(struct worker *w, const char *ptr, char h[160]);
void ipcfx_open_handle(struct worker *w, const char *h, char q[32]);
/* Bytes lent on device 0, as @w's client of gmbd sees it. */
int64_t ipcfx_used(struct worker *w);
uintptr_t ipcfx_addr(const char *p);
void ipcfx_quit(struct worker *w);
/* Whether @w answered within @ms (not read); the answer's status. */
bool ipcfx_answered(struct worker *w, int ms);
int ipcfx_answer(struct worker *w);
double ipcfx_ms_since(const struct timespec *t0);
/* gmbctl -s SOCK @args...: its stdout at @out, its stderr at @out + @cap / 2;
 * its exit status. */
int ipcfx_ctl(char *out, size_t cap, const char *const *args);
/* gmbctl status (--json when @json) into @out. */
void ipcfx_ctl_status(bool json, char *out, size_t cap);
/* gmbd's log so far into @buf (NUL-terminated). */
void ipcfx_log(char *buf, size_t cap);

/*
 * Child processes that are clients of gmbd. A test process has libgmb
 * clients with threads of their own, and a fork of a multi-threaded
 * process copies whatever lock another thread held at that instant (the
 * allocator's, ASan's included): a child that goes on to allocate or to
 * use libgmb can hang for good. So such a child is a fresh exec of the test
 * program: its own constructor, before Criterion's main, calls
 * ipcfx_child_main(), which runs the function named in its environment and
 * exits with what it returns. (A child that only touches memory it got
 * from its parent, to see whether that faults, stays a plain fork: an exec
 * would lose the mapping.)
 */
typedef int (*ipcfx_child_fn)(const char *arg);
struct ipcfx_child_def {
	const char *name;
	ipcfx_child_fn fn;
};

/* Forks and execs /proc/self/exe (no arguments) with GMB_TEST_CHILD=@name,
 * GMB_TEST_CHILD_ARG=@arg and GMB_TEST_SOCK (ipcfx_sock or ipcfx_gmbd's)
 * added to the environment, built before the fork so that the child
 * allocates nothing before its exec. Fds without FD_CLOEXEC stay open in
 * it. The child's pid (asserted). */
pid_t ipcfx_child_start(const char *name, const char *arg);
/* ipcfx_child_start(), then the child's wait status. */
int ipcfx_child(const char *name, const char *arg);
/* From a constructor of the test program: when GMB_TEST_CHILD is set,
 * ipcfx_gmbd.sock from GMB_TEST_SOCK, then _exit() with what the def of
 * that name returns for GMB_TEST_CHILD_ARG (127: no def of that name).
 * Returns when GMB_TEST_CHILD is not set: the test program itself. */
void ipcfx_child_main(const struct ipcfx_child_def *defs, size_t n);

#endif
