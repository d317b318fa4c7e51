/*
 * reconnect.h - libgmb after its connection to gmbd is lost: reconnect with
 * backoff and re-announce what this client holds.
 *
 * Layer: on top of the connection (conn.h), whose reader thread calls
 * gmb__reconnect() through cbs.reconnect. What this client holds is the
 * memory layer's to say: reconnect.c asks cbs.claim_build for the claim and
 * hands gmbd's answer to cbs.claim_apply, and never reads the memory
 * tables itself. Includes conn.h and common/ only.
 */
#ifndef GMB_CLIENT_RECONNECT_H
#define GMB_CLIENT_RECONNECT_H

#include "client/lib/conn/conn.h"

/* The claim; strings and ids point into the memory tables, the arrays are malloc'd. */
struct gmb__claim {
	Gmb__RejoinTag *tags, **ptags;
	size_t ntags;
	Gmb__RejoinAlloc *allocs, **pallocs;
	size_t nallocs;
	uint64_t *held;
	size_t nheld;
	Gmb__RejoinImport *imports, **pimports; /* imports of others' memory mapped here */
	size_t nimports;
};

/* What gmbd answered: last lends to clear, handles to drop (malloc'd). */
struct gmb__claim_answer {
	uint64_t *cleared, *drop;
	size_t ncleared, ndrop;
};

/* Frees the arrays of @cl (not what they point into). */
void gmb__claim_free(struct gmb__claim *cl);
/* The reader after a loss; 0 once back, or <0: gone for good. */
int gmb__reconnect(struct gmb__conn *c);
/* Reads GMB_RECONNECT and GMB_RECONNECT_TIMEOUT into @c (after gmb__conn_open()). */
void gmb__reconnect_config(struct gmb__conn *c);

#endif
