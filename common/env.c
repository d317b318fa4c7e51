/*
 * env.c - yes/no settings from the environment; see env.h.
 */
#include "common/env.h"

#include <stdlib.h>
#include <string.h>

bool env_true(const char *name)
{
	static const char *const yes[] = { "1", "true", "TRUE", "yes", "YES" };
	const char *v = getenv(name);

	for (size_t i = 0; v && i < sizeof(yes) / sizeof(yes[0]); i++)
		if (strcmp(v, yes[i]) == 0)
			return true;
	return false;
}
