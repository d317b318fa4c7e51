/*
 * status_top.c - the screen of `gmbctl top` from a StatusReply: per device
 * a bar of what is lent, paused, idle in gmbd's pool and used outside gmbd,
 * then every client's tags with state and bytes, then a line a named
 * object (if any). Plain text, no escape
 * sequence (the caller positions and clears); at most @width columns a line.
 *
 * Paused memory is not on the device: it is what a resume lends again, so
 * the bar draws it over the device's unused part ('p'), to show whether
 * the resumes would fit.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/api/status_json.h"
#include "common/size.h"
#include "proto/gmb.pb-c.h"

#define TOP_MIN_WIDTH 60
#define TOP_MAX_WIDTH 240

/* A client's string for the screen: printable ASCII only, cut to @max. */
static void top_put_name(FILE *f, const char *s, int max)
{
	int n = 0;

	for (; s && *s && n < max; s++, n++)
		fputc((unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f ? *s : '?', f);
	for (; n < max; n++)
		fputc(' ', f);
}

/* Bytes of @st's paused tags on device @dev. */
static uint64_t top_paused(const Gmb__StatusReply *st, uint32_t dev)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < st->n_clients; i++)
		for (size_t j = 0; st->clients[i] && j < st->clients[i]->n_tags; j++) {
			const Gmb__TagInfo *t = st->clients[i]->tags[j];

			if (t && t->device == (int32_t)dev && t->state &&
			    !strcmp(t->state, "paused"))
				sum += t->bytes;
		}
	return sum;
}

/* @n cells of @c for @part of @total bytes over @cells cells. */
static int top_cells(uint64_t part, uint64_t total, int cells)
{
	if (!total)
		return 0;
	return (int)((part * (uint64_t)cells + total / 2) / total);
}

static void top_bar(FILE *f, const Gmb__DeviceInfo *d, uint64_t paused, int cells)
{
	uint64_t total = d->driver_known ? d->driver_total_bytes : d->total_bytes;
	int lent = top_cells(d->used_bytes, total, cells);
	int idle = top_cells(d->free_bytes, total, cells);
	int out = d->driver_known ? top_cells(d->outside_bytes, total, cells) : 0;
	int p = top_cells(paused, total, cells), i = 0;

	fputc('[', f);
	for (; i < lent && i < cells; i++)
		fputc('#', f);
	for (int k = 0; k < idle && i < cells; k++, i++)
		fputc('-', f);
	for (int k = 0; k < p && i < cells - out; k++, i++)
		fputc('p', f);
	for (; i < cells - out; i++)
		fputc(' ', f);
	for (; i < cells; i++)
		fputc('o', f);
	fputc(']', f);
}

static void top_device(FILE *f, const Gmb__StatusReply *st, const Gmb__DeviceInfo *d, int width)
{
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX], b3[SIZE_STR_MAX], b4[SIZE_STR_MAX];
	char b5[SIZE_STR_MAX], b6[SIZE_STR_MAX];
	uint64_t paused = top_paused(st, d->index);
	uint64_t total = d->driver_known ? d->driver_total_bytes : d->total_bytes;

	fprintf(f, "%2" PRIu32 " ", d->index);
	top_put_name(f, d->name, 12);
	fputc(' ', f);
	top_bar(f, d, paused, width - 16 - 12);
	fprintf(f, " %9s\n", size_str(total, b1));
	fprintf(f, "   lent %s  paused %s  idle %s  outside %s  avail %s\n",
		size_str(d->used_bytes, b2), size_str(paused, b3), size_str(d->free_bytes, b4),
		d->driver_known ? size_str(d->outside_bytes, b5) : "?",
		size_str(d->budget_bytes > d->used_bytes ? d->budget_bytes - d->used_bytes : 0,
			 b6));
}

static void top_clients(FILE *f, const Gmb__StatusReply *st, int width)
{
	int name_w = width - 58 > 12 ? 12 + (width - 70 > 0 ? (width - 70) / 2 : 0) : 12;
	char b[SIZE_STR_MAX], id[24];

	fprintf(f, "%-6s ", "CLIENT");
	top_put_name(f, "NAME", name_w);
	fprintf(f, " %7s %-4s ", "PID", "CTL");
	top_put_name(f, "TAG", name_w);
	fprintf(f, " %3s %-6s %10s\n", "DEV", "STATE", "BYTES");
	for (size_t i = 0; i < st->n_clients; i++) {
		const Gmb__ClientInfo *c = st->clients[i];

		if (!c)
			continue;
		snprintf(id, sizeof(id), "#%" PRIu64, c->id);
		for (size_t j = 0; j < (c->n_tags ? c->n_tags : 1); j++) {
			const Gmb__TagInfo *t = c->n_tags ? c->tags[j] : NULL;

			fprintf(f, "%-6s ", j ? "" : id);
			top_put_name(f, j ? "" : c->name, name_w);
			fprintf(f, " %7" PRId32 " %-4s ", c->pid, c->control ? "yes" : "no");
			top_put_name(f, t ? t->name : "-", name_w);
			if (t && t->device >= 0)
				fprintf(f, " %3" PRId32, t->device);
			else
				fprintf(f, " %3s", "-");
			fprintf(f, " %-6s %10s\n", t && t->state ? t->state : "-",
				size_str(t ? t->bytes : 0, b));
		}
	}
	if (!st->n_clients)
		fprintf(f, "(no clients)\n");
}

/* A line an object, after the clients; nothing when there is none. STATE
 * is "paused (disc)" for "paused (discarded)": the screen's columns are few. */
static void top_objects(FILE *f, const Gmb__StatusReply *st, int width)
{
	/* The numbers and the state take 54 columns; names get the rest, up to 40. */
	int name_w = width - 54 > 40 ? 40 : width - 54;
	char b[SIZE_STR_MAX], latest[24];

	if (!st->n_objects)
		return;
	fputc('\n', f);
	top_put_name(f, "OBJECT", name_w);
	fprintf(f, " %7s %-13s %7s %4s %10s %7s\n", "OWNER", "STATE", "LATEST", "VERS", "BYTES",
		"READERS");
	for (size_t i = 0; i < st->n_objects; i++) {
		const Gmb__ObjectInfo *o = st->objects[i];
		uint64_t readers = 0;

		if (!o)
			continue;
		for (size_t k = 0; k < o->n_versions; k++)
			readers += o->versions[k] ? o->versions[k]->readers : 0;
		if (o->latest)
			snprintf(latest, sizeof(latest), "v%" PRIu64, o->latest);
		else
			snprintf(latest, sizeof(latest), "-");
		top_put_name(f, o->name, name_w);
		fprintf(f, " %7" PRIu32 " %-13s %7s %4zu %10s %7" PRIu64 "\n", o->owner_uid,
			!o->paused   ? "active" :
			o->discarded ? "paused (disc)" :
				       "paused",
			latest, o->n_versions, size_str(o->bytes, b), readers);
	}
	if (st->objects_total > st->n_objects)
		fprintf(f, "(and %zu more objects)\n", (size_t)st->objects_total - st->n_objects);
}

int gmb__status_to_top(const Gmb__StatusReply *st, int width, char **out)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f;

	if (!st || !out)
		return -EINVAL;
	width = width < TOP_MIN_WIDTH ? TOP_MIN_WIDTH :
		width > TOP_MAX_WIDTH ? TOP_MAX_WIDTH :
					width;
	f = open_memstream(&buf, &len);
	if (!f)
		return -ENOMEM;
	fprintf(f, "gmbd %s (%s)  %zu client%s   # lent  - idle  p paused  o outside  q quit\n",
		st->version ? st->version : "?", st->backend ? st->backend : "?", st->n_clients,
		st->n_clients == 1 ? "" : "s");
	for (size_t i = 0; i < st->n_devices; i++)
		if (st->devices[i])
			top_device(f, st, st->devices[i], width);
	fputc('\n', f);
	top_clients(f, st, width);
	top_objects(f, st, width);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return -ENOMEM;
	}
	*out = buf;
	return 0;
}
