/*
 * sbuf.h - the growable string that the status renderers (status_json.c,
 * status_table.c, watch_format.c) append to, and the escapes that make a
 * client's strings safe in it.
 *
 * Names and tags come from clients, so no string in a reply is trusted:
 * json_put_str() gives RFC 8259 escapes and valid UTF-8 only (bad bytes
 * become U+FFFD), and term_put_str() gives no byte a terminal would act on
 * (controls and bad bytes become \xHH). Renderers append to a buffer whose
 * first failed allocation sticks, and check once at the end.
 *
 * All of it is static inline: each renderer compiles its own copy, so the
 * copy of the renderers that tests/test_status_json.c builds with realloc
 * and free redirected fails in here too, and none of these names is global
 * in libgmb.a, where it could clash with a program that links it.
 */
#ifndef GMB_CLIENT_SBUF_H
#define GMB_CLIENT_SBUF_H

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SBUF_MIN_CAP 256

/* A growable NUL-terminated string; err is sticky (0 or -ENOMEM). */
struct sbuf {
	char *buf;
	size_t len;
	size_t cap;
	int err;
};

#define SBUF_INIT             \
	{                     \
		NULL, 0, 0, 0 \
	}

/* Makes room for @more bytes plus the NUL; sets the sticky error on failure. */
static inline int sbuf_reserve(struct sbuf *b, size_t more)
{
	size_t cap;
	char *p;

	if (b->err)
		return b->err;
	if (b->cap && more < b->cap - b->len)
		return 0;
	cap = b->cap ? b->cap : SBUF_MIN_CAP;
	while (cap - b->len <= more) {
		if (cap > SIZE_MAX / 2)
			goto nomem;
		cap *= 2;
	}
	p = realloc(b->buf, cap);
	if (!p)
		goto nomem;
	b->buf = p;
	b->cap = cap;
	return 0;
nomem:
	b->err = -ENOMEM;
	return b->err;
}

static inline void sbuf_putn(struct sbuf *b, const char *s, size_t n)
{
	if (sbuf_reserve(b, n))
		return;
	memcpy(b->buf + b->len, s, n);
	b->len += n;
	b->buf[b->len] = '\0';
}

static inline void sbuf_puts(struct sbuf *b, const char *s)
{
	sbuf_putn(b, s, strlen(s));
}

static inline void sbuf_putc(struct sbuf *b, char c)
{
	sbuf_putn(b, &c, 1);
}

static inline void sbuf_pad(struct sbuf *b, size_t n)
{
	while (n--)
		sbuf_putc(b, ' ');
}

__attribute__((format(printf, 2, 3))) static inline void sbuf_printf(struct sbuf *b,
								     const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || sbuf_reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

/*
 * sbuf_steal() - hand the string to the caller (*@out, malloc'd) or, after
 * any failed append, free it.
 * Return: 0 or the sticky error.
 */
static inline int sbuf_steal(struct sbuf *b, char **out)
{
	sbuf_reserve(b, 0); /* an empty result is still a string */
	if (b->err) {
		free(b->buf);
		*b = (struct sbuf)SBUF_INIT;
		return -ENOMEM;
	}
	*out = b->buf;
	*b = (struct sbuf)SBUF_INIT;
	return 0;
}

/*
 * Length of the valid UTF-8 sequence at @s (at most @n bytes, n > 0) and
 * its code point in *@cp, or 0: overlong forms, surrogates and values past
 * U+10FFFF are invalid, as RFC 3629 says.
 */
static inline size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp)
{
	size_t len, i;
	uint32_t c;

	if (s[0] < 0x80) {
		*cp = s[0];
		return 1;
	}
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, c = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, c = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, c = s[0] & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (s[i] & 0x3f);
	}
	if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
	    (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return len;
}

/* protobuf-c gives "" for unset strings, but a hand-built reply may hold NULL. */
static inline const char *str_or_empty(const char *s)
{
	return s ? s : "";
}

/* Appends @s as a JSON string: quote and backslash escaped, controls and
 * DEL as \u00XX, invalid UTF-8 as U+FFFD so that strict parsers accept it. */
static inline void json_put_str(struct sbuf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)str_or_empty(s);
	size_t n = strlen((const char *)p), k;
	uint32_t cp;

	sbuf_putc(b, '"');
	while (n) {
		k = utf8_seq(p, n, &cp);
		if (!k) {
			sbuf_puts(b, "\\ufffd");
			k = 1;
		} else if (cp == '"' || cp == '\\') {
			sbuf_putc(b, '\\');
			sbuf_putc(b, (char)cp);
		} else if (cp < 0x20 || cp == 0x7f) {
			sbuf_printf(b, "\\u%04" PRIx32, cp);
		} else {
			sbuf_putn(b, (const char *)p, k);
		}
		p += k;
		n -= k;
	}
	sbuf_putc(b, '"');
}

/*
 * Appends @s for a terminal. A client can name itself anything, so C0 and
 * C1 controls, DEL and invalid UTF-8 become \xHH rather than reach the
 * operator's terminal as escape sequences; "" becomes "-" so that a column
 * never looks empty.
 */
static inline void term_put_str(struct sbuf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)str_or_empty(s);
	size_t n = strlen((const char *)p), k, i;
	uint32_t cp;

	if (!n)
		sbuf_putc(b, '-');
	while (n) {
		k = utf8_seq(p, n, &cp);
		if (k && cp >= 0x20 && (cp < 0x7f || cp >= 0xa0)) {
			sbuf_putn(b, (const char *)p, k);
		} else {
			k = k ? k : 1;
			for (i = 0; i < k; i++)
				sbuf_printf(b, "\\x%02x", p[i]);
		}
		p += k;
		n -= k;
	}
}

#endif
