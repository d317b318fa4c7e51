/*
 * size.h - byte counts for people: "512 B", "1.5 KiB" .. "16.0 EiB"
 * (binary units, one decimal, as free -h), in gmbd's refusals, gmbctl's
 * output and the status table alike.
 */
#ifndef GMB_SIZE_H
#define GMB_SIZE_H

#include <stdint.h>

#define SIZE_STR_MAX 16 /* "1023.9 EiB" and a NUL fit */

/* Writes @v into @buf and returns @buf. */
const char *size_str(uint64_t v, char buf[SIZE_STR_MAX]);

/*
 * size_parse() - "8GiB", "512M", "4096", "1.5GiB" -> bytes: digits, an
 * optional decimal fraction, an optional suffix K, M, G, T (or KiB .. TiB,
 * any case), all powers of 1024. A fraction must come to whole bytes.
 * Return: 0 with *@out; -EINVAL (not a size), -ERANGE (over 2^64 - 1) or
 * -EDOM (a fraction of a byte, as "1.5" or "0.1K").
 */
int size_parse(const char *s, uint64_t *out);

#endif
