/*
 * rejoin.h - restart without loss (daemon/core/rejoin.c): the previous
 * gmbd's clients restored as orphans, the check of a rejoining client's
 * claim against the record, orphans made of live clients whose connection
 * gmbd ended, and the reclaim of those that do not come back.
 *
 * Invariants (with broker.h's and pool.h's):
 *   - An orphan's memory stays counted and lent, and nothing it holds is
 *     lent to anyone else, until it rejoins or is reclaimed.
 *   - A claim never gives a client a chunk the record did not give it:
 *     where the two differ the record follows the client only towards
 *     holding less (memory it stopped mapping back to the pool, a last lend
 *     the sides disagree on cleared on both, an import it closed dropped);
 *     a mapped allocation matches the record chunk for chunk, and every
 *     claimed import is one the record gives it.
 *   - rejoin_accept() accepts all of a claim or none: nothing changes on
 *     failure.
 *
 * Ownership: the claim is the caller's, read during the call; a
 * broker_rejoin_result's arrays are malloc'd and the caller's
 * (rejoin_result_deinit()); restored tags and allocations are the
 * broker's. @err (ERR_MSG_MAX bytes, may be NULL) gets a sentence on
 * failure. The restored client itself is broker.h's
 * broker_restore_client().
 */
#ifndef GMB_REJOIN_H
#define GMB_REJOIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/core/broker.h"

struct broker_claim_tag {
	const char *name;
	int mode;
	bool paused;
};

struct broker_claim_alloc {
	uint64_t id;
	const char *tag;
	int dev;
	uint64_t size;
	bool mapped;		   /* the client maps it now */
	const uint64_t *chunk_ids; /* its last lend as the client holds it; 0 dropped */
	size_t nchunks;
};

/* An import of another client's memory the client maps (daemon/core/import.h). */
struct broker_claim_import {
	uint64_t export_id;
	uint64_t alloc_id; /* what its handle names */
	uint32_t opens;	   /* not closed yet */
	bool unmapped;	   /* it followed its owner's pause: maps nothing now */
	bool idle;	   /* closed, kept mapped for its next open */
};

struct broker_claim {
	const struct broker_claim_tag *tags;
	size_t ntags;
	const struct broker_claim_alloc *allocs;
	size_t nallocs;
	const uint64_t *held; /* handles the client holds */
	size_t nheld;
	const struct broker_claim_import *imports;
	size_t nimports;
};

/* What both sides forget after a rejoin; malloc'd arrays owned by the caller. */
struct broker_rejoin_result {
	uint64_t *cleared; /* allocations whose last lend is cleared */
	size_t ncleared;
	uint64_t *drop; /* held chunks the client must drop */
	size_t ndrop;
};

/**
 * rejoin_restore_tag() - tag @name of restored @c, as it was; *@out stays @c's.
 * Return: 0; -EINVAL (an empty or too long name), -ENOSPC (the tag limit), -EEXIST
 * (the record named it before), -ENOMEM.
 */
int rejoin_restore_tag(struct bclient *c, const char *name, int mode, bool paused,
		       struct btag **out);
/**
 * rejoin_restore_alloc() - an allocation of @t as it was: @chunks (NULL
 * entries: dropped; the array is copied) become its last lend, held by the
 * client, and lent to it when @active (each must then be free, named once,
 * adding up to @size, and @t not paused; else it is restored paused).
 * Return: 0, -EINVAL (id 0 or taken, bad device or size), -ENOMEM.
 */
int rejoin_restore_alloc(struct broker *br, struct bclient *c, struct btag *t, uint64_t id, int dev,
			 uint64_t size, bool active, struct chunk **chunks, uint32_t n);
/**
 * rejoin_accept() - orphan @c is back with @claim: check it (same
 * allocations, devices, sizes and tags; a mapped allocation over exactly its
 * recorded chunks, each lent to it or free; no chunk mapped twice; each
 * import one gmbd recorded for @c, of the same allocation, with no more
 * opens) and make the record agree with it: unclaimed allocations freed,
 * mapped ones lent, unmapped ones back in the pool, paused ones whose
 * claimed last lend differs cleared, unclaimed imports dropped (as by their
 * last close) and claimed ones left with the opens claimed. Nothing changes
 * on failure.
 * Return: 0 with @res filled; -EPERM (a claim gmbd did not grant) or
 * -EPROTO (a claim that contradicts itself) with @err saying which; -ENOMEM.
 */
int rejoin_accept(struct broker *br, struct bclient *c, const struct broker_claim *claim,
		  struct broker_rejoin_result *res, char *err);
/**
 * rejoin_result_deinit() - frees @res's arrays (@res itself is the
 * caller's).
 * Return: nothing.
 */
void rejoin_result_deinit(struct broker_rejoin_result *res);
/**
 * rejoin_orphan() - gmbd ended live @c's connection while its process may
 * still map what it was lent: @c becomes an orphan, as after a restart, so
 * that nothing it holds is lent again until it rejoins or is reclaimed.
 * Return: nothing.
 */
void rejoin_orphan(struct broker *br, struct bclient *c);
/**
 * rejoin_reclaim() - orphan @c will not be back (@why, logged): its memory
 * returns; @c is freed.
 * Return: nothing.
 */
void rejoin_reclaim(struct broker *br, struct bclient *c, const char *why);

#endif
