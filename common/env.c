/*
 * env.c - settings from the environment; see env.h.
 */
#include "common/env.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

bool env_true(const char *name)
{
	static const char *const yes[] = { "1", "true", "TRUE", "yes", "YES" };
	const char *v = getenv(name);

	for (size_t i = 0; v && i < sizeof(yes) / sizeof(yes[0]); i++)
		if (strcmp(v, yes[i]) == 0)
			return true;
	return false;
}

int env_01(const char *name, bool *out, char *err)
{
	const char *v = getenv(name);

	if (!v || !*v)
		return 0;
	if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
		return err_fmt(err, -EINVAL, "%s=\"%.32s\": use 0 or 1", name, v);
	*out = *v == '1';
	return 0;
}

int env_uint(const char *name, unsigned long max, const char *unit, unsigned long *out, char *err)
{
	const char *v = getenv(name);
	unsigned long n;
	char *end;

	if (!v || !*v)
		return 0;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (*v < '0' || *v > '9' || errno || *end || n > max)
		return err_fmt(err, -EINVAL, "%s=\"%.32s\" is not a number of %s from 0 to %lu",
			       name, v, unit, max);
	*out = n;
	return 0;
}
