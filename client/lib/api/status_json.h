/*
 * status_json.h - gmbd's StatusReply for people and programs: JSON and an
 * aligned table (gmb_status_json(), gmb_status_text()). Plain formatting:
 * no lock, no socket; includes only common/ and the wire types.
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

#endif
