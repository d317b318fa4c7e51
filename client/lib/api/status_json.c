/*
 * status_json.c - renders a StatusReply for programs and for people.
 *
 * gmb__status_to_json() makes the document that `gmbctl status --json`
 * prints; gmb__status_to_table() makes the aligned text of `gmbctl status`.
 * Both only read the reply and hand back one malloc'd string, or -ENOMEM
 * with nothing left allocated.
 *
 * Names and tags come from clients, so no string in a reply is trusted:
 * JSON gets RFC 8259 escapes and valid UTF-8 only (bad bytes become U+FFFD),
 * and the table gets no byte a terminal would act on (controls and bad
 * bytes become \xHH). Renderers append to a buffer whose first failed
 * allocation sticks, and check once at the end.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/lib/api/status_json.h"
#include "common/size.h"
#include "proto/gmb.pb-c.h"

#define SBUF_MIN_CAP   256
#define TABLE_MAX_COLS 10

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

struct table_col {
	const char *title;
	bool right; /* numbers and sizes align right */
};

/*
 * A table's cells, NUL-separated and already terminal-safe in @text, are
 * added row by row and read back in the same order (@cursor), so no
 * per-cell index is needed; @width grows as cells arrive.
 */
struct table {
	const struct table_col *cols;
	size_t ncols;
	size_t next_col;
	struct sbuf text;
	size_t cursor;
	size_t width[TABLE_MAX_COLS];
};

static const char *const status_mode_names[] = {
	[GMB__MODE__MODE_DISCARD] = "discard",
	[GMB__MODE__MODE_ZERO] = "zero",
	[GMB__MODE__MODE_PRESERVE] = "preserve",
};

/*
 * The device as the driver sees it (TOTAL, USED by every process, OUTSIDE
 * gmbd), then gmbd's share: BUDGET, HELD from the driver, LENT to clients,
 * IDLE (held, not lent: ready for the next request), and AVAIL, what a
 * client can still get (budget minus lent). An idle device reads as idle,
 * not as full.
 */
static const struct table_col status_dev_cols[] = {
	{ "DEV", true },     { "NAME", false },	 { "TOTAL", true }, { "USED", true },
	{ "OUTSIDE", true }, { "BUDGET", true }, { "HELD", true },  { "LENT", true },
	{ "IDLE", true },    { "AVAIL", true },
};

static const struct table_col status_client_cols[] = {
	{ "CLIENT", false }, { "NAME", false },	   { "PID", true },    { "UID", true },
	{ "GID", true },     { "CONTROL", false }, { "GROUP", false }, { "PRIO", true },
};

static const struct table_col status_wait_cols[] = {
	{ "WAITING", false }, { "DEV", true },	{ "KIND", false },  { "TAG", false },
	{ "NEED", true },     { "PRIO", true }, { "WAITED", true }, { "LEFT", true },
};

static const struct table_col status_import_cols[] = {
	{ "IMPORTED BY", false }, { "PID", true },     { "OWNER", false }, { "PID", true },
	{ "ALLOC", true },	  { "DEV", true },     { "BYTES", true },  { "OPENS", true },
	{ "OWNER'S", false },	  { "MAPPED", false },
};

/* Named objects: OWNER is the owner's uid, LATEST its latest version
 * ("-" once dropped, kept for its readers), READERS the opens of every
 * version, GRANTS the other uids that may open it. */
static const struct table_col status_object_cols[] = {
	{ "OBJECT", false }, { "OWNER", true },	  { "LATEST", true },  { "VERSIONS", true },
	{ "BYTES", true },   { "READERS", true }, { "GRANTS", false },
};

static const struct table_col status_tag_cols[] = {
	{ "TAG", false },  { "DEVICE", true }, { "STATE", false },
	{ "MODE", false }, { "ALLOCS", true }, { "BYTES", true },
};

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Tag rows sit under their client's row, indented past the CLIENT column. */
#define STATUS_TAG_INDENT "    "

/* Makes room for @more bytes plus the NUL; sets the sticky error on failure. */
static int sbuf_reserve(struct sbuf *b, size_t more)
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

static void sbuf_putn(struct sbuf *b, const char *s, size_t n)
{
	if (sbuf_reserve(b, n))
		return;
	memcpy(b->buf + b->len, s, n);
	b->len += n;
	b->buf[b->len] = '\0';
}

static void sbuf_puts(struct sbuf *b, const char *s)
{
	sbuf_putn(b, s, strlen(s));
}

static void sbuf_putc(struct sbuf *b, char c)
{
	sbuf_putn(b, &c, 1);
}

static void sbuf_pad(struct sbuf *b, size_t n)
{
	while (n--)
		sbuf_putc(b, ' ');
}

__attribute__((format(printf, 2, 3))) static void sbuf_printf(struct sbuf *b, const char *fmt, ...)
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
static int sbuf_steal(struct sbuf *b, char **out)
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
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp)
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
static const char *str_or_empty(const char *s)
{
	return s ? s : "";
}

static const char *status_mode_name(Gmb__Mode mode)
{
	if ((unsigned)mode < ARRAY_SIZE(status_mode_names))
		return status_mode_names[mode];
	return "unknown";
}

/* Appends @s as a JSON string: quote and backslash escaped, controls and
 * DEL as \u00XX, invalid UTF-8 as U+FFFD so that strict parsers accept it. */
static void json_put_str(struct sbuf *b, const char *s)
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
 * Whether a list entry is there to print (NULL entries are skipped); puts the
 * comma before every printed entry but the first, counted in *@n.
 */
static bool json_list_next(struct sbuf *b, const void *item, size_t *n)
{
	if (!item)
		return false;
	if ((*n)++)
		sbuf_putc(b, ',');
	return true;
}

static void json_put_device(struct sbuf *b, const Gmb__DeviceInfo *d)
{
	sbuf_printf(b, "{\"index\":%" PRIu32 ",\"name\":", d->index);
	json_put_str(b, d->name);
	sbuf_printf(b,
		    ",\"total_bytes\":%" PRIu64 ",\"budget_bytes\":%" PRIu64
		    ",\"granularity\":%" PRIu64 ",\"pool_bytes\":%" PRIu64
		    ",\"used_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64
		    ",\"chunks_created\":%" PRIu64 ",\"chunks_released\":%" PRIu64
		    ",\"chunks_handed_over\":%" PRIu64,
		    d->total_bytes, d->budget_bytes, d->granularity, d->pool_bytes, d->used_bytes,
		    d->free_bytes, d->chunks_created, d->chunks_released, d->chunks_handed_over);
	/* The same facts under plain names, and the driver's view (null: unknown). */
	sbuf_printf(b,
		    ",\"held_bytes\":%" PRIu64 ",\"lent_bytes\":%" PRIu64 ",\"idle_bytes\":%" PRIu64
		    ",\"available_bytes\":%" PRIu64,
		    d->pool_bytes, d->used_bytes, d->free_bytes,
		    d->budget_bytes > d->used_bytes ? d->budget_bytes - d->used_bytes : 0);
	if (d->driver_known) {
		sbuf_printf(b, ",\"driver\":{\"source\":");
		json_put_str(b, d->driver_source);
		sbuf_printf(b,
			    ",\"total_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64
			    ",\"free_bytes\":%" PRIu64 "},\"outside_bytes\":%" PRIu64 "}",
			    d->driver_total_bytes, d->driver_used_bytes,
			    d->driver_total_bytes > d->driver_used_bytes ?
				    d->driver_total_bytes - d->driver_used_bytes :
				    0,
			    d->outside_bytes);
	} else {
		sbuf_puts(b, ",\"driver\":null,\"outside_bytes\":null}");
	}
}

static void json_put_tag(struct sbuf *b, const Gmb__TagInfo *t)
{
	sbuf_puts(b, "{\"name\":");
	json_put_str(b, t->name);
	sbuf_printf(b, ",\"device\":%" PRId32 ",\"state\":", t->device);
	json_put_str(b, t->state);
	sbuf_puts(b, ",\"mode\":");
	json_put_str(b, status_mode_name(t->mode));
	sbuf_printf(b, ",\"allocations\":%" PRIu32 ",\"bytes\":%" PRIu64 "}", t->allocations,
		    t->bytes);
}

static void json_put_client(struct sbuf *b, const Gmb__ClientInfo *c)
{
	size_t i, n = 0;

	sbuf_printf(b, "{\"id\":%" PRIu64 ",\"name\":", c->id);
	json_put_str(b, c->name);
	sbuf_printf(b,
		    ",\"pid\":%" PRId32 ",\"uid\":%" PRIu32 ",\"gid\":%" PRIu32
		    ",\"control\":%s,\"group\":",
		    c->pid, c->uid, c->gid, c->control ? "true" : "false");
	json_put_str(b, c->group);
	sbuf_printf(b, ",\"priority\":%" PRId32 ",\"preemptible\":%s,\"tags\":[", c->priority,
		    c->preemptible ? "true" : "false");
	for (i = 0; i < c->n_tags; i++)
		if (json_list_next(b, c->tags[i], &n))
			json_put_tag(b, c->tags[i]);
	sbuf_puts(b, "]}");
}

static void json_put_waiter(struct sbuf *b, const Gmb__WaiterInfo *w)
{
	sbuf_printf(b, "{\"client_id\":%" PRIu64 ",\"client\":", w->client_id);
	json_put_str(b, w->client);
	sbuf_printf(b, ",\"device\":%" PRIu32 ",\"kind\":", w->device);
	json_put_str(b, w->kind);
	sbuf_puts(b, ",\"tag\":");
	json_put_str(b, w->tag);
	sbuf_printf(b,
		    ",\"bytes\":%" PRIu64 ",\"priority\":%" PRId32 ",\"waited_ms\":%" PRIu64
		    ",\"left_ms\":%" PRIu64 "}",
		    w->bytes, w->priority, w->waited_ms, w->left_ms);
}

static void json_put_import(struct sbuf *b, const Gmb__ImportInfo *m)
{
	sbuf_printf(b, "{\"importer_id\":%" PRIu64 ",\"importer\":", m->importer_id);
	json_put_str(b, m->importer);
	sbuf_printf(b, ",\"importer_pid\":%" PRId32 ",\"owner_id\":%" PRIu64 ",\"owner\":",
		    m->importer_pid, m->owner_id);
	json_put_str(b, m->owner);
	sbuf_printf(b,
		    ",\"owner_pid\":%" PRId32 ",\"alloc_id\":%" PRIu64 ",\"device\":%" PRIu32
		    ",\"bytes\":%" PRIu64 ",\"opens\":%" PRIu32 ",\"owner_freed\":%s"
		    ",\"mapped\":%s,\"idle\":%s",
		    m->owner_pid, m->alloc_id, m->device, m->bytes, m->opens,
		    m->owner_freed ? "true" : "false", m->unmapped ? "false" : "true",
		    m->idle ? "true" : "false");
	/* A named object's version: its name and number; an allocation's
	 * import has neither (its document as before objects). */
	if (m->object && *m->object) {
		sbuf_puts(b, ",\"object\":");
		json_put_str(b, m->object);
		sbuf_printf(b, ",\"object_version\":%" PRIu64, m->object_version);
	}
	sbuf_putc(b, '}');
}

static void json_put_object_version(struct sbuf *b, const Gmb__ObjectVersionInfo *v)
{
	sbuf_printf(b,
		    "{\"version\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"device\":%" PRIu32
		    ",\"readers\":%" PRIu32 ",\"latest\":%s,\"published_ns\":%" PRIu64
		    ",\"publisher\":",
		    v->version, v->bytes, v->device, v->readers, v->latest ? "true" : "false",
		    v->published_ns);
	json_put_str(b, v->publisher);
	sbuf_printf(b, ",\"publisher_pid\":%" PRId32 ",\"meta_bytes\":%" PRIu32 "}",
		    v->publisher_pid, v->meta_bytes);
}

static void json_put_object(struct sbuf *b, const Gmb__ObjectInfo *o)
{
	size_t i, n = 0;

	sbuf_puts(b, "{\"name\":");
	json_put_str(b, o->name);
	sbuf_printf(b, ",\"owner_uid\":%" PRIu32 ",\"latest\":%" PRIu64 ",\"bytes\":%" PRIu64,
		    o->owner_uid, o->latest, o->bytes);
	/* Only when so: an active object's document stays as it was. */
	if (o->paused)
		sbuf_puts(b, ",\"paused\":true");
	if (o->discarded)
		sbuf_puts(b, ",\"discarded\":true");
	sbuf_puts(b, ",\"grants\":[");
	for (i = 0; o->grants && i < o->n_grants; i++)
		sbuf_printf(b, "%s%" PRIu32, i ? "," : "", o->grants[i]);
	sbuf_puts(b, "],\"versions\":[");
	for (i = 0; i < o->n_versions; i++)
		if (json_list_next(b, o->versions[i], &n))
			json_put_object_version(b, o->versions[i]);
	sbuf_puts(b, "]}");
}

/* "\"objects\":[...],\"objects_total\":N" of @st. */
static void json_put_objects(struct sbuf *b, const Gmb__StatusReply *st)
{
	size_t n = 0;

	sbuf_puts(b, "\"objects\":[");
	for (size_t i = 0; i < st->n_objects; i++)
		if (json_list_next(b, st->objects[i], &n))
			json_put_object(b, st->objects[i]);
	sbuf_printf(b, "],\"objects_total\":%" PRIu32, st->objects_total);
}

/**
 * gmb__status_to_json() - the broker's state as one JSON object.
 * @st:  the reply; only read. NULL entries in its lists are skipped.
 * @out: receives a malloc'd NUL-terminated string, owned by the caller;
 *       untouched on failure.
 *
 * Return: 0, -EINVAL for a NULL argument, or -ENOMEM (nothing allocated).
 */
int gmb__status_to_json(const Gmb__StatusReply *st, char **out)
{
	struct sbuf b = SBUF_INIT;
	size_t i, n = 0;

	if (!st || !out)
		return -EINVAL;
	sbuf_puts(&b, "{\"backend\":");
	json_put_str(&b, st->backend);
	sbuf_puts(&b, ",\"version\":");
	json_put_str(&b, st->version);
	sbuf_puts(&b, ",\"devices\":[");
	for (i = 0; i < st->n_devices; i++)
		if (json_list_next(&b, st->devices[i], &n))
			json_put_device(&b, st->devices[i]);
	sbuf_puts(&b, "],\"clients\":[");
	for (i = 0, n = 0; i < st->n_clients; i++)
		if (json_list_next(&b, st->clients[i], &n))
			json_put_client(&b, st->clients[i]);
	sbuf_puts(&b, "],\"waiters\":[");
	for (i = 0, n = 0; i < st->n_waiters; i++)
		if (json_list_next(&b, st->waiters[i], &n))
			json_put_waiter(&b, st->waiters[i]);
	sbuf_puts(&b, "],\"imports\":[");
	for (i = 0, n = 0; i < st->n_imports; i++)
		if (json_list_next(&b, st->imports[i], &n))
			json_put_import(&b, st->imports[i]);
	sbuf_printf(&b, "],\"imports_total\":%" PRIu32 ",", st->imports_total);
	json_put_objects(&b, st);
	sbuf_putc(&b, '}');
	return sbuf_steal(&b, out);
}

/**
 * gmb__objects_to_json() - the named objects alone, as `gmbctl objects
 * --json` prints them: {"objects":[...],"objects_total":N}, the same
 * entries as gmb__status_to_json()'s. Return: as it.
 */
int gmb__objects_to_json(const Gmb__StatusReply *st, char **out)
{
	struct sbuf b = SBUF_INIT;

	if (!st || !out)
		return -EINVAL;
	sbuf_putc(&b, '{');
	json_put_objects(&b, st);
	sbuf_putc(&b, '}');
	return sbuf_steal(&b, out);
}

/*
 * Appends @s for a terminal. A client can name itself anything, so C0 and
 * C1 controls, DEL and invalid UTF-8 become \xHH rather than reach the
 * operator's terminal as escape sequences; "" becomes "-" so that a column
 * never looks empty.
 */
static void term_put_str(struct sbuf *b, const char *s)
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

/*
 * Columns a terminal gives @s, which term_put_str() made valid UTF-8: one
 * per code point. Wide (CJK) and combining characters are off by one; the
 * table stays readable and exact layout is what --json is for.
 */
static size_t term_width(const char *s)
{
	size_t w = 0;

	for (; *s; s++)
		w += ((unsigned char)*s & 0xc0) != 0x80;
	return w;
}

static void table_init(struct table *t, const struct table_col *cols, size_t ncols)
{
	size_t i;

	*t = (struct table){ .cols = cols, .ncols = ncols, .text = SBUF_INIT };
	for (i = 0; i < ncols; i++)
		t->width[i] = term_width(cols[i].title);
}

static void table_deinit(struct table *t)
{
	free(t->text.buf);
	t->text = (struct sbuf)SBUF_INIT;
}

/* Adds the next cell of the current row; the cells of a row come in order. */
static void table_add(struct table *t, const char *s)
{
	size_t start = t->text.len, w;

	term_put_str(&t->text, s);
	if (!t->text.err) {
		w = term_width(t->text.buf + start);
		if (w > t->width[t->next_col])
			t->width[t->next_col] = w;
	}
	sbuf_putn(&t->text, "", 1); /* the NUL that ends this cell */
	t->next_col = (t->next_col + 1) % t->ncols;
}

static void table_add_u64(struct table *t, uint64_t v)
{
	char num[24];

	snprintf(num, sizeof(num), "%" PRIu64, v);
	table_add(t, num);
}

static void table_add_size(struct table *t, uint64_t v)
{
	char size[SIZE_STR_MAX];

	table_add(t, size_str(v, size));
}

/* One line: @cell[i] padded to column i's width, two spaces between. */
static void table_put_line(const struct table *t, struct sbuf *out, const char *indent,
			   const char *const *cell)
{
	size_t i, w, pad;

	sbuf_puts(out, indent);
	for (i = 0; i < t->ncols; i++) {
		w = term_width(cell[i]);
		pad = t->width[i] > w ? t->width[i] - w : 0;
		if (i)
			sbuf_puts(out, "  ");
		if (t->cols[i].right)
			sbuf_pad(out, pad);
		sbuf_puts(out, cell[i]);
		/* No trailing blanks: the last column is never padded on the right. */
		if (!t->cols[i].right && i + 1 < t->ncols)
			sbuf_pad(out, pad);
	}
	sbuf_putc(out, '\n');
}

static void table_put_header(const struct table *t, struct sbuf *out, const char *indent)
{
	const char *cell[TABLE_MAX_COLS];
	size_t i;

	for (i = 0; i < t->ncols; i++)
		cell[i] = t->cols[i].title;
	table_put_line(t, out, indent, cell);
}

/* Writes the next stored row; nothing once the cells ran out or failed. */
static void table_put_row(struct table *t, struct sbuf *out, const char *indent)
{
	const char *cell[TABLE_MAX_COLS];
	size_t i;

	for (i = 0; i < t->ncols; i++) {
		if (t->text.err || t->cursor >= t->text.len)
			return;
		cell[i] = t->text.buf + t->cursor;
		t->cursor += strlen(cell[i]) + 1;
	}
	table_put_line(t, out, indent, cell);
}

static void status_add_device(struct table *t, const Gmb__DeviceInfo *d)
{
	table_add_u64(t, d->index);
	table_add(t, d->name);
	table_add_size(t, d->driver_known ? d->driver_total_bytes : d->total_bytes);
	if (d->driver_known) {
		table_add_size(t, d->driver_used_bytes);
		table_add_size(t, d->outside_bytes);
	} else {
		table_add(t, "?"); /* no driver view (no NVML) */
		table_add(t, "?");
	}
	table_add_size(t, d->budget_bytes);
	table_add_size(t, d->pool_bytes);
	table_add_size(t, d->used_bytes);
	table_add_size(t, d->free_bytes);
	table_add_size(t, d->budget_bytes > d->used_bytes ? d->budget_bytes - d->used_bytes : 0);
}

/* The id as "#N", the spelling gmbctl accepts for a client id. */
static void status_add_client(struct table *t, const Gmb__ClientInfo *c)
{
	char num[24];

	snprintf(num, sizeof(num), "#%" PRIu64, c->id);
	table_add(t, num);
	table_add(t, c->name);
	snprintf(num, sizeof(num), "%" PRId32, c->pid);
	table_add(t, num);
	table_add_u64(t, c->uid);
	table_add_u64(t, c->gid);
	table_add(t, c->control ? "yes" : "no");
	table_add(t, c->group && c->group[0] ? c->group : "-");
	snprintf(num, sizeof(num), "%" PRId32 "%s", c->priority, c->preemptible ? "p" : "");
	table_add(t, num);
}

/* "#ID NAME" of a client, for a table cell (table_add() makes it safe). */
static void status_client_cell(struct table *t, uint64_t id, const char *name)
{
	char cell[WIRE_MAX_NAME + 32];

	snprintf(cell, sizeof(cell), "#%" PRIu64 " %s", id, name ? name : "");
	table_add(t, cell);
}

/* Who maps whose allocation (CUDA IPC); nothing when nobody does. */
static int status_put_imports(const Gmb__StatusReply *st, struct sbuf *out)
{
	struct table t;
	size_t n = 0;
	char num[48];
	int r;

	table_init(&t, status_import_cols, ARRAY_SIZE(status_import_cols));
	for (size_t i = 0; i < st->n_imports; i++) {
		const Gmb__ImportInfo *m = st->imports[i];

		if (!m)
			continue;
		status_client_cell(&t, m->importer_id, m->importer);
		snprintf(num, sizeof(num), "%" PRId32, m->importer_pid);
		table_add(&t, num);
		/* A named object's version: NAME@VERSION, as gmbctl names it. */
		if (m->object && *m->object) {
			char cell[WIRE_MAX_NAME + 32];

			snprintf(cell, sizeof(cell), "%s@%" PRIu64, m->object, m->object_version);
			table_add(&t, cell);
		} else {
			status_client_cell(&t, m->owner_id, m->owner);
		}
		snprintf(num, sizeof(num), "%" PRId32, m->owner_pid);
		table_add(&t, num);
		table_add_u64(&t, m->alloc_id);
		table_add_u64(&t, m->device);
		table_add_size(&t, m->bytes);
		table_add_u64(&t, m->opens);
		table_add(&t, m->object && *m->object ? "object" :
			      m->owner_freed	      ? "freed" :
							"live");
		/* "paused": it followed its owner's pause and maps it again on resume. */
		/* "idle": closed, kept mapped by the importer for its next open. */
		table_add(&t, m->unmapped ? "paused" : m->idle ? "idle" : "yes");
		n++;
	}
	if (n) {
		sbuf_putc(out, '\n');
		table_put_header(&t, out, "");
	}
	for (size_t i = 0; i < n; i++)
		table_put_row(&t, out, "");
	if (st->imports_total > n)
		sbuf_printf(out, "... and %" PRIu64 " more imports\n",
			    (uint64_t)(st->imports_total - n));
	r = t.text.err;
	table_deinit(&t);
	return r;
}

/* An object's row: its readers are those of every version it keeps. */
static void status_add_object(struct table *t, const Gmb__ObjectInfo *o)
{
	char cell[8 * 12 + 8];
	uint64_t readers = 0;
	size_t n = 0;

	table_add(t, o->name);
	table_add_u64(t, o->owner_uid);
	if (o->latest) {
		snprintf(cell, sizeof(cell), "v%" PRIu64, o->latest);
		table_add(t, cell);
	} else {
		table_add(t, "-"); /* dropped: kept only for its readers */
	}
	table_add_u64(t, o->n_versions);
	table_add_size(t, o->bytes);
	for (size_t i = 0; i < o->n_versions; i++)
		readers += o->versions[i] ? o->versions[i]->readers : 0;
	table_add_u64(t, readers);
	cell[0] = '\0';
	for (size_t i = 0; o->grants && i < o->n_grants && n < sizeof(cell) - 12; i++)
		n += (size_t)snprintf(cell + n, sizeof(cell) - n, "%s%" PRIu32, i ? "," : "",
				      o->grants[i]);
	table_add(t, cell[0] ? cell : "-");
}

/* The named objects, @empty when there is none (NULL: nothing at all). */
static int status_put_objects(const Gmb__StatusReply *st, struct sbuf *out, const char *empty)
{
	struct table t;
	size_t n = 0;
	int r;

	table_init(&t, status_object_cols, ARRAY_SIZE(status_object_cols));
	for (size_t i = 0; i < st->n_objects; i++) {
		if (!st->objects[i])
			continue;
		status_add_object(&t, st->objects[i]);
		n++;
	}
	if (n)
		table_put_header(&t, out, "");
	else if (empty)
		sbuf_puts(out, empty);
	for (size_t i = 0; i < n; i++)
		table_put_row(&t, out, "");
	if (st->objects_total > n)
		sbuf_printf(out, "... and %" PRIu64 " more objects\n",
			    (uint64_t)(st->objects_total - n));
	r = t.text.err;
	table_deinit(&t);
	return r;
}

/**
 * gmb__objects_to_table() - the named objects alone, as `gmbctl objects`
 * prints them: the table of gmb__status_to_table(), or "no objects".
 * Return: as it.
 */
int gmb__objects_to_table(const Gmb__StatusReply *st, char **out)
{
	struct sbuf b = SBUF_INIT;
	int r;

	if (!st || !out)
		return -EINVAL;
	r = status_put_objects(st, &b, "no objects\n");
	if (r && !b.err)
		b.err = r;
	return sbuf_steal(&b, out);
}

/* Requests waiting for memory, in serving order; nothing when none. */
static int status_put_waiters(const Gmb__StatusReply *st, struct sbuf *out)
{
	struct table t;
	size_t n = 0;
	char num[48];
	int r;

	table_init(&t, status_wait_cols, ARRAY_SIZE(status_wait_cols));
	for (size_t i = 0; i < st->n_waiters; i++) {
		const Gmb__WaiterInfo *w = st->waiters[i];

		if (!w)
			continue;
		snprintf(num, sizeof(num), "#%" PRIu64, w->client_id);
		table_add(&t, num);
		table_add_u64(&t, w->device);
		table_add(&t, w->kind);
		table_add(&t, w->tag && w->tag[0] ? w->tag : "*");
		table_add_size(&t, w->bytes);
		snprintf(num, sizeof(num), "%" PRId32, w->priority);
		table_add(&t, num);
		snprintf(num, sizeof(num), "%.1f s", (double)w->waited_ms / 1000);
		table_add(&t, num);
		snprintf(num, sizeof(num), "%.1f s", (double)w->left_ms / 1000);
		table_add(&t, num);
		n++;
	}
	if (n) {
		sbuf_putc(out, '\n');
		table_put_header(&t, out, "");
	}
	while (n--)
		table_put_row(&t, out, "");
	r = t.text.err;
	table_deinit(&t);
	return r;
}

static void status_add_tag(struct table *t, const Gmb__TagInfo *g)
{
	char num[24];

	table_add(t, g->name);
	snprintf(num, sizeof(num), "%" PRId32, g->device);
	table_add(t, g->device < 0 ? "-" : num); /* -1: nothing allocated yet */
	table_add(t, g->state);
	table_add(t, status_mode_name(g->mode));
	table_add_u64(t, g->allocations);
	table_add_size(t, g->bytes);
}

static int status_put_devices(const Gmb__StatusReply *st, struct sbuf *out)
{
	struct table t;
	size_t i, n = 0;
	int r;

	table_init(&t, status_dev_cols, ARRAY_SIZE(status_dev_cols));
	for (i = 0; i < st->n_devices; i++) {
		if (!st->devices[i])
			continue;
		status_add_device(&t, st->devices[i]);
		n++;
	}
	if (!n)
		sbuf_puts(out, "no devices\n");
	else
		table_put_header(&t, out, "");
	while (n--)
		table_put_row(&t, out, "");
	r = t.text.err;
	table_deinit(&t);
	return r;
}

static size_t status_add_clients(const Gmb__StatusReply *st, struct table *ct, struct table *tt)
{
	const Gmb__ClientInfo *c;
	size_t i, j, ntags = 0;

	for (i = 0; i < st->n_clients; i++) {
		c = st->clients[i];
		if (!c)
			continue;
		status_add_client(ct, c);
		for (j = 0; j < c->n_tags; j++) {
			if (!c->tags[j])
				continue;
			status_add_tag(tt, c->tags[j]);
			ntags++;
		}
	}
	return ntags;
}

/*
 * Clients, each followed by its tags indented below it. Client and tag
 * columns are measured as two tables so that a long tag name does not widen
 * the client columns, and tags line up across all clients.
 */
static int status_put_clients(const Gmb__StatusReply *st, struct sbuf *out)
{
	const Gmb__ClientInfo *c;
	struct table ct, tt;
	size_t i, j, ntags;
	int r;

	table_init(&ct, status_client_cols, ARRAY_SIZE(status_client_cols));
	table_init(&tt, status_tag_cols, ARRAY_SIZE(status_tag_cols));
	ntags = status_add_clients(st, &ct, &tt);
	if (ct.text.len)
		table_put_header(&ct, out, "");
	else
		sbuf_puts(out, "no clients\n");
	if (ntags)
		table_put_header(&tt, out, STATUS_TAG_INDENT);
	for (i = 0; i < st->n_clients; i++) {
		c = st->clients[i];
		if (!c)
			continue;
		table_put_row(&ct, out, "");
		for (j = 0; j < c->n_tags; j++)
			if (c->tags[j])
				table_put_row(&tt, out, STATUS_TAG_INDENT);
	}
	r = ct.text.err ? ct.text.err : tt.text.err;
	table_deinit(&tt);
	table_deinit(&ct);
	return r;
}

/**
 * gmb__status_to_table() - the broker's state as aligned text for people:
 * a header line, the devices, then the clients with their tags.
 * @st:  the reply; only read. NULL entries in its lists are skipped.
 * @out: receives a malloc'd string ending in a newline, owned by the
 *       caller; untouched on failure.
 *
 * Return: 0, -EINVAL for a NULL argument, or -ENOMEM (nothing allocated).
 */
int gmb__status_to_table(const Gmb__StatusReply *st, char **out)
{
	struct sbuf b = SBUF_INIT;
	int r;

	if (!st || !out)
		return -EINVAL;
	sbuf_puts(&b, "gmbd ");
	term_put_str(&b, st->version);
	sbuf_puts(&b, ", backend ");
	term_put_str(&b, st->backend);
	sbuf_puts(&b, "\n\n");
	r = status_put_devices(st, &b);
	sbuf_putc(&b, '\n');
	if (!r)
		r = status_put_clients(st, &b);
	if (!r)
		r = status_put_waiters(st, &b);
	if (!r)
		r = status_put_imports(st, &b);
	if (!r && (st->n_objects || st->objects_total)) {
		sbuf_putc(&b, '\n');
		r = status_put_objects(st, &b, NULL);
	}
	if (r && !b.err)
		b.err = r;
	return sbuf_steal(&b, out);
}

/* ---- watch events ---- */

static void watch_json(struct sbuf *b, const Gmb__WatchEvent *e)
{
	sbuf_puts(b, "{\"kind\":");
	json_put_str(b, e->kind);
	sbuf_printf(b, ",\"time_ns\":%" PRIu64 ",\"client_id\":%" PRIu64 ",\"client\":", e->time_ns,
		    e->client_id);
	json_put_str(b, e->client);
	sbuf_printf(b, ",\"pid\":%" PRId32 ",\"tag\":", e->pid);
	json_put_str(b, e->tag);
	sbuf_printf(b,
		    ",\"device\":%" PRId32 ",\"bytes\":%" PRIu64 ",\"duration_ns\":%" PRIu64
		    ",\"reason\":",
		    e->device, e->bytes, e->duration_ns);
	json_put_str(b, e->reason);
	sbuf_puts(b, ",\"request\":");
	json_put_str(b, e->request);
	sbuf_printf(b, ",\"status\":%" PRId32 ",\"actor\":", e->status);
	json_put_str(b, e->actor);
	sbuf_printf(b, ",\"count\":%" PRIu64 ",\"detail\":", e->count);
	json_put_str(b, e->detail);
	sbuf_putc(b, '}');
}

/* " key=value", the value terminal-safe and quoted when it has a space. */
static void watch_kv(struct sbuf *b, const char *key, const char *v)
{
	bool q = !*v || strchr(v, ' ') || strchr(v, '"');

	sbuf_printf(b, " %s=%s", key, q ? "\"" : "");
	term_put_str(b, v);
	if (q)
		sbuf_putc(b, '"');
}

static void watch_text(struct sbuf *b, const Gmb__WatchEvent *e)
{
	time_t sec = (time_t)(e->time_ns / 1000000000u);
	char tbuf[32], sz[SIZE_STR_MAX];
	struct tm tm;

	localtime_r(&sec, &tm);
	strftime(tbuf, sizeof(tbuf), "%H:%M:%S", &tm);
	sbuf_printf(b, "%s.%03u ", tbuf, (unsigned)(e->time_ns / 1000000u % 1000u));
	term_put_str(b, e->kind);
	if (e->client && *e->client) {
		watch_kv(b, "client", e->client);
		sbuf_printf(b, " id=%" PRIu64 " pid=%" PRId32, e->client_id, e->pid);
	}
	if (e->request && *e->request)
		watch_kv(b, "request", e->request);
	if (e->tag && *e->tag)
		watch_kv(b, "tag", e->tag);
	else if (!strcmp(e->kind, "pause") || !strcmp(e->kind, "resume"))
		sbuf_puts(b, " tag=*");
	if (e->device >= 0)
		sbuf_printf(b, " device=%" PRId32, e->device);
	if (e->bytes)
		sbuf_printf(b, " bytes=%s", size_str(e->bytes, sz));
	if (e->duration_ns)
		sbuf_printf(b, " took=%.3fms", (double)e->duration_ns / 1e6);
	if (e->reason && *e->reason)
		watch_kv(b, "reason", e->reason);
	if (e->status)
		sbuf_printf(b, " status=%" PRId32, e->status);
	if (e->actor && *e->actor)
		watch_kv(b, "by", e->actor);
	if (e->count)
		sbuf_printf(b, " count=%" PRIu64, e->count);
	if (e->detail && *e->detail) {
		sbuf_puts(b, ": ");
		term_put_str(b, e->detail);
	}
}

int gmb__watch_format(const Gmb__WatchEvent *ev, bool json, char **out)
{
	struct sbuf b = SBUF_INIT;

	if (!ev || !out)
		return -EINVAL;
	if (json)
		watch_json(&b, ev);
	else
		watch_text(&b, ev);
	return sbuf_steal(&b, out);
}
