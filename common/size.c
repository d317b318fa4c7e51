/*
 * size.c - byte counts for people; see size.h.
 */
#include "common/size.h"

#include <inttypes.h>
#include <stdio.h>

const char *size_str(uint64_t v, char buf[SIZE_STR_MAX])
{
	static const char units[] = "KMGTPE";
	double d = (double)v / 1024;
	int u = 0;

	if (v < 1024) {
		snprintf(buf, SIZE_STR_MAX, "%" PRIu64 " B", v);
		return buf;
	}
	/* 1023.96 KiB would print as "1024.0 KiB": move up a unit before that. */
	while (d >= 1023.95 && u < (int)sizeof(units) - 2) {
		d /= 1024;
		u++;
	}
	snprintf(buf, SIZE_STR_MAX, "%.1f %ciB", d, units[u]);
	return buf;
}
