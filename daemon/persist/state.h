/*
 * state.h - the broker's record for the next gmbd, as a Gmb__State
 * (proto/gmb.proto): chunks, clients, tags, allocations and last lends,
 * and the exports and imports of memory shared between processes.
 * daemon/persist/persist.c keeps it in the service manager's fd store; this module
 * only turns a broker into bytes and bytes (plus chunk fds) into a broker.
 */
#ifndef GMB_STATE_H
#define GMB_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct broker;

/* A chunk fd handed back by the service manager, named by its FDNAME. */
struct state_fd {
	uint64_t id;
	int dev;
	uint64_t size;
	int fd;	   /* the caller's; state_restore() never closes it */
	bool used; /* out: a chunk (or a copy) was restored from it */
	/* A named object's host copy (id: its version's export, dev -1), not a chunk. */
	bool copy;
};

struct state_stats {
	uint32_t clients; /* restored as orphans */
	uint32_t chunks;  /* back in the pools */
	uint32_t lost;	  /* recorded chunks without a usable fd */
	uint64_t bytes;	  /* of the chunks back */
	uint32_t exports; /* of memory shared between processes, back */
	uint32_t imports; /* import records back with them */
};

/**
 * state_encode() - the broker as a packed Gmb__State in *@buf (malloc'd,
 * the caller's). Return: 0 or -ENOMEM.
 */
int state_encode(const struct broker *br, uint8_t **buf, size_t *len);

/**
 * state_restore() - rebuild the fresh broker @br from a packed record and
 * the chunk fds @fds (imported, not consumed: each used one is marked).
 * Recorded clients come back as orphans, their imports with them (the
 * chunks an import pins are never free); what cannot be restored (a chunk
 * without its fd, an allocation naming a chunk of another device, an export
 * whose chunks are lent elsewhere) is logged and left out, so that a claim
 * naming it is refused later.
 * Return: 0 with @out filled; -EPROTO for a record that is not this gmbd's
 * (version, backend) or not decodable: nothing is restored then.
 */
int state_restore(struct broker *br, const uint8_t *buf, size_t len, struct state_fd *fds,
		  size_t nfds, struct state_stats *out);

#endif
