/*
 * err.c - error sentences; see err.h.
 */
#include "common/err.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int err_vfmt(char *err, size_t len, int rc, const char *fmt, va_list ap)
{
	char msg[ERR_MSG_MAX];
	int saved_errno = errno;

	if (!err || !len)
		return rc;
	/* Formatted aside first: @err may be one of the arguments. */
	vsnprintf(msg, sizeof(msg), fmt, ap);
	snprintf(err, len, "%s", msg);
	errno = saved_errno;
	return rc;
}

int err_fmt(char *err, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err_vfmt(err, ERR_MSG_MAX, rc, fmt, ap);
	va_end(ap);
	return rc;
}

void err_append(char *err, const char *fmt, ...)
{
	size_t off;
	va_list ap;

	if (!err)
		return;
	off = strnlen(err, ERR_MSG_MAX - 1);
	va_start(ap, fmt);
	err_vfmt(err + off, ERR_MSG_MAX - off, 0, fmt, ap);
	va_end(ap);
}
