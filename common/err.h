/*
 * err.h - how failures travel in gmbd.
 *
 * Every function returns 0 (or a count) or a negative errno. What becomes of
 * a code depends on where it arises:
 *   - A request the daemon cannot grant (budget: -ENOMEM, permission:
 *     -EPERM, unknown tag/allocation/client: -ENOENT or -EINVAL, paused tag:
 *     -EBUSY, too many requests in flight: -EAGAIN, operator timeout:
 *     -ETIMEDOUT, a count bound such as the uid's chunks: -ENOSPC, gmbd's
 *     own open files: -EMFILE) becomes a reply: status = the code, error = a
 *     sentence that names the client, tag and bytes concerned. The
 *     connection stays up, also when a lend's chunk fds cannot be sent
 *     (the lend is taken back and the request answered with the error).
 *   - A packet that breaks the protocol (undecodable, oversized, fds where
 *     none belong, a body out of place, no hello first, a reply to nothing)
 *     disconnects that client only, after one log line naming it and the
 *     reason. Its memory returns to the pool as for any disconnect.
 *   - Failing to start (bad option, no backend, socket in use) is fatal in
 *     gmbd's main() only: one line, exit status 1. Library code never exits.
 *   - Backend (driver) failures are negative errnos with the driver's own
 *     error name in backend_last_error(); -ENOMEM from the driver is treated
 *     like an exhausted budget.
 */
#ifndef GMB_ERR_H
#define GMB_ERR_H

#include <stdarg.h>
#include <stddef.h>

#define ERR_MSG_MAX 512

/*
 * The one way to write a failure's sentence, daemon and library alike.
 * err_fmt() writes into @err (ERR_MSG_MAX bytes; NULL is ignored) and
 * returns @rc, so that callers write `return err_fmt(err, -EINVAL, ...)`.
 * Formatting goes through a local buffer first, so @err may also be one of
 * the arguments, and errno is left as it was.
 */
int err_fmt(char *err, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same into a buffer of @len bytes, from a va_list. */
int err_vfmt(char *err, size_t len, int rc, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));
/* Appends to the sentence already in @err (ERR_MSG_MAX bytes), truncating. */
void err_append(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
