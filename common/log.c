/*
 * log.c - gmbd's log sink: one line per event on stderr, prefixed with the
 * sd-daemon priority ("<6>") under journald so that it keeps the level, and
 * with a timestamp and the level's word anywhere else (log_init()).
 *
 * Invariants: a line is formatted whole into a stack buffer and written with
 * one write(2), so that lines of concurrent threads never interleave; a line
 * longer than the buffer is cut and marked with "..."; logging never changes
 * errno, so a caller may log and then still report errno.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

#define LOG_LINE_MAX 4096

int log_max_level = LOG_LVL_INFO;

enum log_style {
	LOG_STYLE_PLAIN,
	LOG_STYLE_JOURNAL,
	LOG_STYLE_TIME
};
static enum log_style log_style = LOG_STYLE_PLAIN;

static const char *const log_level_names[] = {
	[LOG_LVL_ERR] = "err",	 [LOG_LVL_WARNING] = "warning", [LOG_LVL_NOTICE] = "notice",
	[LOG_LVL_INFO] = "info", [LOG_LVL_DEBUG] = "debug",
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

void log_init(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	log_style = LOG_STYLE_TIME;
	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return;
	if ((unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino)
		log_style = LOG_STYLE_JOURNAL;
}

int log_to_journal(void)
{
	return log_style == LOG_STYLE_JOURNAL;
}

/* The line's start: "<6>", "2026-01-02 10:11:12.345 info " or "info: ". */
static size_t log_prefix(char *line, size_t cap, int level)
{
	struct timespec ts;
	struct tm tm;
	size_t n;

	switch (log_style) {
	case LOG_STYLE_JOURNAL:
		return (size_t)snprintf(line, cap, "<%d>", level);
	case LOG_STYLE_TIME:
		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		n = strftime(line, cap, "%Y-%m-%d %H:%M:%S", &tm);
		return n + (size_t)snprintf(line + n, cap - n, ".%03ld %-7s ", ts.tv_nsec / 1000000,
					    log_level_names[level]);
	default:
		return (size_t)snprintf(line, cap, "%s: ", log_level_names[level]);
	}
}

const char *log_quote(const char *s, char *buf, size_t len)
{
	size_t o = 0;
	bool plain = *s != '\0';

	for (const char *p = s; *p && plain; p++)
		if ((unsigned char)*p <= ' ' || *p == '"' || *p == '\\' || *p == '=' || *p == 0x7f)
			plain = false;
	if (plain)
		return s;
	buf[o++] = '"';
	for (; *s && o + 3 < len; s++) {
		if (*s == '"' || *s == '\\')
			buf[o++] = '\\';
		buf[o++] = (unsigned char)*s < ' ' || *s == 0x7f ? '?' : *s;
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

void log_write(int level, const char *fmt, ...)
{
	char line[LOG_LINE_MAX];
	int saved_errno = errno;
	size_t len;
	va_list ap;
	int n;

	if (level < LOG_LVL_ERR || level > LOG_LVL_DEBUG)
		level = LOG_LVL_ERR;
	len = log_prefix(line, sizeof(line), level);
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
