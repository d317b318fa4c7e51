/*
 * objname.c - the grammar of named objects' names (objname.h).
 */
#include "common/objname.h"

#include <stddef.h>
#include <string.h>

static bool objname_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '.' || ch == '_' || ch == '-';
}

bool objname_valid(const char *bare)
{
	size_t n = strlen(bare);

	if (n == 0 || n > OBJNAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!objname_char(bare[i]))
			return false;
	return true;
}

const char *objname_parse(const char *name, const char **bare, bool *has_uid, uint32_t *uid)
{
	const char *slash;
	unsigned long long v = 0;

	*has_uid = false;
	*uid = 0;
	*bare = name;
	if (!name || !*name)
		return "an object needs a name";
	slash = strchr(name, '/');
	if (slash) {
		if (slash == name || slash - name > 10)
			return "UID/NAME wants a uid of 1 to 10 digits";
		for (const char *p = name; p < slash; p++) {
			if (*p < '0' || *p > '9')
				return "UID/NAME wants a number for UID";
			v = v * 10 + (unsigned long long)(*p - '0');
		}
		if (v > 0xfffffffeULL)
			return "UID/NAME wants a uid below 4294967295";
		*has_uid = true;
		*uid = (uint32_t)v;
		*bare = slash + 1;
	}
	if (!**bare || strlen(*bare) > OBJNAME_MAX)
		return "a name is 1 to 64 bytes";
	if (!objname_valid(*bare))
		return "a name is made of [A-Za-z0-9._-]";
	return NULL;
}
