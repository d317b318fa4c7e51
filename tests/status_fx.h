/*
 * status_fx.h - StatusReply messages built in memory for the renderers'
 * tests (test_status_json.c, test_status_table.c): a small state of one
 * device, one client and one tag, that state with an import or with two
 * named objects, a hostile name, and the table rendered. render_table()
 * asserts with Criterion: only those two test binaries link it.
 */
#ifndef GMB_TEST_STATUS_FX_H
#define GMB_TEST_STATUS_FX_H

#include <stdint.h>

#include "proto/gmb.pb-c.h"

#define MiB (1024ULL * 1024)
#define GiB (1024 * MiB)

/* One reply with one device, one client and one tag, all in this struct. */
struct fixture {
	Gmb__StatusReply st;
	Gmb__DeviceInfo dev;
	Gmb__DeviceInfo *devs[1];
	Gmb__ClientInfo cli;
	Gmb__ClientInfo *clis[1];
	Gmb__TagInfo tag;
	Gmb__TagInfo *tags[1];
};

/* Two objects: "weights" (v1 read by two, v2 the latest) granted to two
 * uids, and "old" dropped, kept for a reader; all in this struct. */
struct fixture_objects {
	Gmb__ObjectInfo o[2], *po[3];
	Gmb__ObjectVersionInfo v[3], *pv[3];
	uint32_t grants[2];
};

/* Hostile names: quote, backslash, newline, \x01, DEL, an ANSI escape. */
extern const char hostile[];

/* The small state: device host0 of 8 GiB, client #1 "w", its tag "kv". */
void fixture_small(struct fixture *f);
/* One import of the small state's allocation by another client, freed by its owner.
 * @pii holds two entries, the second NULL. */
void fixture_import(struct fixture *f, Gmb__ImportInfo *ii, Gmb__ImportInfo **pii);
/* The small state with the objects of @x. */
void fixture_objects(struct fixture *f, struct fixture_objects *x);
/* @st as gmb__status_to_table() renders it, asserted to succeed; the caller's to free. */
char *render_table(const Gmb__StatusReply *st);

#endif
