/*
 * status_json.h - gmbd's StatusReply for people and programs: JSON and an
 * aligned table (gmb_status_json(), gmb_status_text()). Plain formatting:
 * no lock, no socket; includes only common/ and the wire types.
 */
#ifndef GMB_CLIENT_STATUS_JSON_H
#define GMB_CLIENT_STATUS_JSON_H

#include "common/wire.h"

/* *@out is malloc'd (JSON / an aligned table), the caller's. */
int gmb__status_to_json(const Gmb__StatusReply *st, char **out);
int gmb__status_to_table(const Gmb__StatusReply *st, char **out);

#endif
