/*
 * log.c - gmbd's log sink: one line per event on stderr, prefixed with the
 * sd-daemon priority ("<6>") so that journald keeps the level.
 *
 * Invariants: a line is formatted whole into a stack buffer and written with
 * one write(2), so that lines of concurrent threads never interleave; a line
 * longer than the buffer is cut and marked with "..."; logging never changes
 * errno, so a caller may log and then still report errno.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/log.h"

#define LOG_LINE_MAX 4096

int log_max_level = LOG_LVL_INFO;

static const char *const log_level_names[] = {
	[LOG_LVL_ERR] = "err",
	[LOG_LVL_WARNING] = "warning",
	[LOG_LVL_NOTICE] = "notice",
	[LOG_LVL_INFO] = "info",
	[LOG_LVL_DEBUG] = "debug",
};

static void log_write_all(const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(STDERR_FILENO, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		/* Nowhere to report a broken stderr; drop the line. */
		if (n <= 0)
			return;
		buf += n;
		len -= (size_t)n;
	}
}

void log_write(int level, const char *fmt, ...)
{
	char line[LOG_LINE_MAX];
	int saved_errno = errno;
	size_t len;
	va_list ap;
	int n;

	if (level < 0 || level > LOG_LVL_DEBUG)
		level = LOG_LVL_ERR;
	len = (size_t)snprintf(line, sizeof(line), "<%d>", level);
	va_start(ap, fmt);
	n = vsnprintf(line + len, sizeof(line) - len - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof(line) - len - 1) {
		/* Cut, but say so: a silently truncated fact misleads. */
		len = sizeof(line) - 1 - 3;
		memcpy(line + len, "...", 3);
		len += 3;
	} else {
		len += (size_t)n;
	}
	line[len++] = '\n';
	log_write_all(line, len);
	errno = saved_errno;
}

int log_parse_level(const char *s)
{
	char *end;
	long v;

	if (!s || !*s)
		return -EINVAL;
	for (int i = LOG_LVL_ERR; i <= LOG_LVL_DEBUG; i++)
		if (strcasecmp(s, log_level_names[i]) == 0)
			return i;
	/* Common spellings from syslog and other daemons' flags. */
	if (strcasecmp(s, "error") == 0)
		return LOG_LVL_ERR;
	if (strcasecmp(s, "warn") == 0)
		return LOG_LVL_WARNING;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < LOG_LVL_ERR || v > LOG_LVL_DEBUG)
		return -EINVAL;
	return (int)v;
}
