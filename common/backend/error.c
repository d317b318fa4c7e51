/*
 * error.c - the per-thread reason of the last backend failure, written by
 * every implementation and by open.c.
 *
 * Invariants: backend_last_error() is the calling thread's own buffer, so
 * threads of a client library never see each other's reasons; it is only
 * written on failure (and, by "auto", to say why cuda was passed over), so
 * it stays meaningful until the thread's next failure.
 */
#include <stdarg.h>
#include <string.h>

#include "common/backend/backend.h"
#include "common/err.h"

static __thread char backend_err[ERR_MSG_MAX];

const char *backend_last_error(void)
{
	return backend_err;
}

int backend_fail_msg(char *err, int rc, const char *what)
{
	return err_fmt(err, rc, "%s: %s", what, *backend_err ? backend_err : strerror(-rc));
}

int backend_fail(int err, const char *fmt, ...)
{
	va_list ap;

	/* err_vfmt() formats aside first (callers may pass backend_last_error()
	 * as an argument) and keeps errno. */
	va_start(ap, fmt);
	err_vfmt(backend_err, sizeof(backend_err), err, fmt, ap);
	va_end(ap);
	return err;
}
