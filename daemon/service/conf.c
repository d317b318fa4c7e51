/*
 * conf.c - gmbd's configuration file: one "name = value" per line, where
 * name is a long option of the command line; blank lines and lines whose
 * first non-blank character is '#' are skipped; the value runs to the end
 * of the line (trailing blanks dropped) and may be put in double quotes.
 *
 * The whole file is read into one buffer that the caller keeps (values
 * point into it), so that option strings live as long as the options.
 */
#include "daemon/service/conf.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define CONF_MAX_BYTES (1u << 20)

static int conf_fail(char *err, size_t len, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int conf_fail(char *err, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err_vfmt(err, len, rc, fmt, ap);
	va_end(ap);
	return rc;
}

/* Reads @path whole into a NUL-terminated malloc'd buffer. */
static int conf_read(const char *path, char **out, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	size_t n;
	char *buf;
	int rc;

	if (!f)
		return -errno;
	buf = malloc(CONF_MAX_BYTES + 1);
	if (!buf) {
		fclose(f);
		return conf_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
	}
	n = fread(buf, 1, CONF_MAX_BYTES + 1, f);
	rc = ferror(f) ? -EIO : 0;
	fclose(f);
	if (rc == 0 && n > CONF_MAX_BYTES)
		rc = conf_fail(err, errlen, -EFBIG, "%s: larger than %u bytes", path,
			       CONF_MAX_BYTES);
	else if (rc < 0)
		conf_fail(err, errlen, rc, "%s: read error", path);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	buf[n] = '\0';
	*out = buf;
	return 0;
}

static char *conf_trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/* One line, NUL-terminated in place: 0, or -EINVAL with @err set. */
static int conf_line(char *line, const char *path, unsigned no, conf_set_fn set, void *arg,
		     char *err, size_t errlen)
{
	char *eq, *key, *val, msg[256];
	size_t vlen;
	int rc;

	line = conf_trim(line);
	if (!*line || *line == '#')
		return 0;
	eq = strchr(line, '=');
	if (!eq)
		return conf_fail(err, errlen, -EINVAL, "%s:%u: expected 'name = value'", path, no);
	*eq = '\0';
	key = conf_trim(line);
	val = conf_trim(eq + 1);
	vlen = strlen(val);
	if (vlen >= 2 && val[0] == '"' && val[vlen - 1] == '"') {
		val[vlen - 1] = '\0';
		val++;
	}
	msg[0] = '\0';
	rc = set(arg, key, val, msg, sizeof(msg));
	if (rc < 0)
		return conf_fail(err, errlen, rc, "%s:%u: %s", path, no, msg);
	return 0;
}

int conf_load(const char *path, bool required, conf_set_fn set, void *arg, char **storage,
	      char *err, size_t errlen)
{
	char *buf = NULL, *line, *next;
	unsigned no = 0;
	int rc;

	*storage = NULL;
	err[0] = '\0';
	rc = conf_read(path, &buf, err, errlen);
	if (rc == -ENOENT && !required)
		return 0;
	if (rc < 0) {
		if (!*err)
			conf_fail(err, errlen, rc, "cannot read the configuration %s: %s", path,
				  strerror(-rc));
		return rc;
	}
	for (line = buf; line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		rc = conf_line(line, path, ++no, set, arg, err, errlen);
		if (rc < 0) {
			free(buf);
			return rc;
		}
	}
	*storage = buf;
	return 0;
}
