/*
 * size.c - byte counts for people; see size.h.
 */
#include "common/size.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <strings.h>

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

/* @s's unit suffix ("", K, KiB .. T, TiB, any case) as a shift; -1: none. */
static int size_unit_shift(const char *s)
{
	static const struct {
		const char *suffix;
		int shift;
	} units[] = {
		{ "", 0 },   { "K", 10 },   { "KiB", 10 }, { "M", 20 },	  { "MiB", 20 },
		{ "G", 30 }, { "GiB", 30 }, { "T", 40 },   { "TiB", 40 },
	};

	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (strcasecmp(s, units[i].suffix) == 0)
			return units[i].shift;
	return -1;
}

/*
 * Exact arithmetic, no floating point: the whole part and the decimal
 * digits (up to SIZE_FRAC_MAX of them) are integers, the unit a shift, so
 * "1.5GiB" is 3 << 29 to the byte and "0.1K" (102.4 bytes) is refused.
 */
#define SIZE_FRAC_MAX 18

int size_parse(const char *s, uint64_t *out)
{
	unsigned __int128 whole = 0, frac = 0, scale = 1, v;
	int shift, digits = 0;
	const char *p = s;

	/* strtoull() would take " 1", "+1" and even "-1" (as 2^64 - 1). */
	if (!isdigit((unsigned char)*p))
		return -EINVAL;
	for (; isdigit((unsigned char)*p); p++) {
		whole = whole * 10 + (unsigned)(*p - '0');
		if (whole > UINT64_MAX)
			return -ERANGE;
	}
	if (*p == '.') {
		if (!isdigit((unsigned char)*++p))
			return -EINVAL;
		for (; isdigit((unsigned char)*p); p++) {
			if (++digits > SIZE_FRAC_MAX)
				return -EINVAL;
			frac = frac * 10 + (unsigned)(*p - '0');
			scale *= 10;
		}
	}
	shift = size_unit_shift(p);
	if (shift < 0)
		return -EINVAL;
	if (whole > (UINT64_MAX >> shift))
		return -ERANGE;
	if ((frac << shift) % scale)
		return -EDOM; /* a fraction of a byte */
	v = (whole << shift) + (frac << shift) / scale;
	if (v > UINT64_MAX)
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}
