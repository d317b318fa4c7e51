/*
 * backend.c - choosing a memory backend, and the per-thread reason of the
 * last backend failure.
 *
 * Invariants: backend_last_error() is the calling thread's own buffer, so
 * threads of a client library never see each other's reasons; it is only
 * written on failure (and, by "auto", to say why cuda was passed over), so
 * it stays meaningful until the thread's next failure.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/backend/backend.h"
#include "common/err.h"

static __thread char backend_err[ERR_MSG_MAX];

const char *backend_last_error(void)
{
	return backend_err;
}

int backend_fail(int err, const char *fmt, ...)
{
	/* Formatted aside first: callers may pass backend_last_error() as an argument. */
	char msg[ERR_MSG_MAX];
	int saved_errno = errno;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	memcpy(backend_err, msg, sizeof(msg));
	errno = saved_errno;
	return err;
}

/* "auto": cuda when a driver and a GPU answer, else host with cuda's reason kept. */
static int backend_open_auto(const struct backend_host_opts *host, struct backend **out)
{
	int rc = backend_cuda_open(out);

	if (rc == 0)
		return 0;
	backend_fail(rc, "auto: cuda unavailable (%s): %s", strerror(-rc), backend_last_error());
	/* Keep cuda's reason readable after a successful fallback: the caller logs it. */
	return backend_host_open(host, out);
}

int backend_open(const char *kind, const struct backend_host_opts *host, struct backend **out)
{
	static const struct backend_host_opts defaults = BACKEND_HOST_OPTS_INIT;

	if (!out)
		return backend_fail(-EINVAL, "backend_open: no place for the result");
	*out = NULL;
	if (!host)
		host = &defaults;
	if (!kind || strcmp(kind, "auto") == 0)
		return backend_open_auto(host, out);
	if (strcmp(kind, "host") == 0)
		return backend_host_open(host, out);
	if (strcmp(kind, "cuda") == 0)
		return backend_cuda_open(out);
	return backend_fail(-EINVAL, "unknown backend \"%s\" (want auto, cuda or host)", kind);
}

void backend_close(struct backend *b)
{
	if (b && b->ops && b->ops->close)
		b->ops->close(b);
}
