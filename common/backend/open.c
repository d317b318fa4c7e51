/*
 * open.c - choosing a memory backend: the one file that knows every
 * implementation (host.c, cuda.c). The implementations never call it; the
 * reason of a failure goes through error.c.
 */
#include <errno.h>
#include <string.h>

#include "common/backend/backend.h"

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
