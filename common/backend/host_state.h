/*
 * host_state.h - what the two parts of the host backend share: its state
 * and records, the chunk lookup, and what host_va.c offers to host.c (the
 * checks of the driver's rules, the VA operations of struct backend_ops).
 * host.c holds the devices, chunks, contents, setup and the ops table;
 * host_va.c the reservations and mappings, and calls nothing in host.c.
 * Private to them; see host.c for the invariants.
 */
#ifndef GMB_BACKEND_HOST_STATE_H
#define GMB_BACKEND_HOST_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/backend/backend.h"
#include "common/idmap.h"

struct host_range {
	uintptr_t va;
	uint64_t size;
	bool access; /* mappings only: set_access was called */
	bool ro;     /* ... set_access_ro: the device's writes fault */
};

struct host_table {
	struct host_range *v;
	size_t n, cap;
};

struct host_chunk {
	int dev; /* -1 for an imported chunk */
	uint64_t size;
};

struct host_priv {
	pthread_mutex_t lock;
	uint64_t gran;
	uint64_t used[BACKEND_MAX_DEVICES];
	uint64_t outside;    /* the simulated use of other processes, per device */
	struct idmap chunks; /* handle + 1 -> struct host_chunk */
	struct host_table resv;
	struct host_table maps;
};

/* Handles are fds, and idmap reserves key 0. */
static inline uint64_t host_chunk_key(uint64_t handle)
{
	return handle + 1;
}

static inline struct host_chunk *host_chunk_get(struct host_priv *p, uint64_t handle)
{
	if (handle > INT32_MAX)
		return NULL;
	return idmap_get(&p->chunks, host_chunk_key(handle));
}

/* host_va.c: the checks host.c shares, each a refusal with its reason. */
int host__check_dev(struct backend *b, const char *op, int dev);
int host__check_size(struct host_priv *p, const char *op, uint64_t size);
/* Every byte of [va, va+size) mapped and accessible (any sub-range will do);
 * @write: writable too. Called under p->lock. */
int host__check_access(struct host_priv *p, const char *op, uintptr_t va, uint64_t size,
		       bool write);
void host__table_free(struct host_table *t);

/* host_va.c: the backend_ops of virtual address ranges. */
int host__va_reserve(struct backend *b, uint64_t size, uint64_t align, uintptr_t *va);
int host__va_free(struct backend *b, uintptr_t va, uint64_t size);
int host__map(struct backend *b, uintptr_t va, uint64_t size, uint64_t handle);
int host__set_access(struct backend *b, int dev, uintptr_t va, uint64_t size);
int host__set_access_peers(struct backend *b, int dev, uint64_t peers, uintptr_t va, uint64_t size);
int host__set_access_ro(struct backend *b, int dev, uintptr_t va, uint64_t size);
int host__unmap(struct backend *b, uintptr_t va, uint64_t size);

#endif
