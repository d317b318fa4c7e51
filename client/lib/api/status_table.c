/*
 * status_table.c - a StatusReply as aligned text, for people.
 *
 * gmb__status_to_table() makes the text of `gmbctl status`: a header line,
 * the devices, the clients with their tags, then what waits, who maps
 * whose allocation and the named objects where there are any;
 * gmb__objects_to_table() the objects' table alone (`gmbctl objects`). Both
 * only read the reply and hand back one malloc'd string, or -ENOMEM with
 * nothing left allocated.
 *
 * A table takes its cells row by row, made terminal-safe by term_put_str()
 * (sbuf.h) as they arrive, so that the columns are measured on what will be
 * printed; then it writes the rows, padded to those widths.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/api/sbuf.h"
#include "client/lib/api/status_json.h"
#include "common/size.h"
#include "common/wire.h"
#include "proto/gmb.pb-c.h"

#define TABLE_MAX_COLS 10

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

/* Named objects: OWNER is the owner's uid, STATE active, paused or
 * "paused (discarded)" (its bytes dropped: a resume gives zeros), LATEST
 * its latest version ("-" once dropped, kept for its readers), READERS the
 * opens of every version, GRANTS the other uids that may open it. */
static const struct table_col status_object_cols[] = {
	{ "OBJECT", false },  { "OWNER", true }, { "STATE", false },  { "LATEST", true },
	{ "VERSIONS", true }, { "BYTES", true }, { "READERS", true }, { "GRANTS", false },
};

static const struct table_col status_tag_cols[] = {
	{ "TAG", false },  { "DEVICE", true }, { "STATE", false },
	{ "MODE", false }, { "ALLOCS", true }, { "BYTES", true },
};

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Tag rows sit under their client's row, indented past the CLIENT column. */
#define STATUS_TAG_INDENT "    "

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

/* STATE: "active", "paused" or "paused (discarded)". */
static const char *status_object_state(const Gmb__ObjectInfo *o)
{
	if (!o->paused)
		return "active";
	return o->discarded ? "paused (discarded)" : "paused";
}

/* An object's row: its readers are those of every version it keeps. */
static void status_add_object(struct table *t, const Gmb__ObjectInfo *o)
{
	char cell[8 * 12 + 8];
	uint64_t readers = 0;
	size_t n = 0;

	table_add(t, o->name);
	table_add_u64(t, o->owner_uid);
	table_add(t, status_object_state(o));
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
