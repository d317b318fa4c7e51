/*
 * status_json.h - gmbd's StatusReply for people and programs: JSON and an
 * aligned table (gmb_status_json(), gmb_status_text()). Plain formatting:
 * no lock, no socket; includes only common/ and the wire types.
 *
 * JSON in status_json.c, the tables in status_table.c, the screen of
 * `gmbctl top` in status_top.c, watch events in watch_format.c; the buffer
 * and escapes they share in sbuf.h.
 */
#ifndef GMB_CLIENT_STATUS_JSON_H
#define GMB_CLIENT_STATUS_JSON_H

#include <stdbool.h>

#include "common/wire.h"

/* *@out is malloc'd (JSON / an aligned table), the caller's. */
int gmb__status_to_json(const Gmb__StatusReply *st, char **out);
int gmb__status_to_table(const Gmb__StatusReply *st, char **out);
/* The named objects alone (`gmbctl objects`): JSON / the table. */
int gmb__objects_to_json(const Gmb__StatusReply *st, char **out);
int gmb__objects_to_table(const Gmb__StatusReply *st, char **out);
/* The screen of `gmbctl top`, lines of at most @width columns (status_top.c). */
int gmb__status_to_top(const Gmb__StatusReply *st, int width, char **out);
/* One event as one line (no newline): JSON when @json, else text. */
int gmb__watch_format(const Gmb__WatchEvent *ev, bool json, char **out);

/* A tag's mode as both the JSON and the table spell it. */
static inline const char *status_mode_name(Gmb__Mode mode)
{
	static const char *const names[] = {
		[GMB__MODE__MODE_DISCARD] = "discard",
		[GMB__MODE__MODE_ZERO] = "zero",
		[GMB__MODE__MODE_PRESERVE] = "preserve",
	};

	if ((unsigned)mode < sizeof(names) / sizeof(names[0]))
		return names[mode];
	return "unknown";
}

#endif
