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

#endif
