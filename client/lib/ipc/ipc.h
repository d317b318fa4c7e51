/*
 * ipc.h - libgmb's side of memory shared between processes (CUDA IPC on
 * gmbd memory): handles for this client's allocations, and the imports of
 * other processes' allocations this client maps.
 *
 * Layer: beside the memory layer (client/lib/mem/), whose backend, tables
 * and connection it uses, below the API and the hooks that export
 * gmb_ipc_* (client/lib/hook/ipc.c). Includes mem.h and common/.
 *
 * An import is one mapping per exported allocation in this process,
 * however many handles of it are opened (handles differ only in their
 * range offset): its opens are counted, gmbd is asked once, and the last
 * close unmaps it and tells gmbd. Every function runs under the
 * connection's op_lock, but gmb__ipc_maybe_ours(), which takes only the
 * state lock: the list of imports changes under both.
 */
#ifndef GMB_CLIENT_IPC_H
#define GMB_CLIENT_IPC_H

#include <stdbool.h>
#include <stdint.h>

#include "client/lib/mem/mem.h"
#include "common/ipc_handle.h"

/* One imported allocation, mapped at [va, va + size). */
struct gmb__import {
	uint64_t instance, owner, alloc, gen; /* what its handles name */
	int dev;			      /* gmbd's index of the memory's device */
	uint64_t size;
	uintptr_t va;
	uint8_t token[IPC_HANDLE_TOKEN];
	struct gmb__staged *chunks; /* mapping order, handles owned */
	size_t nchunks;
	uint32_t opens;
	/* False while it follows its owner's pause: the range stays reserved,
	 * nothing is mapped and chunks is empty. */
	bool mapped;
	/* Its last open closed with GMB_IPC_KEEP: still mapped (opens 0), for
	 * the next open of the same handle; gmbd may ask for it back. */
	bool idle;
	int access_dev; /* the device given access besides dev (gmbd's index), -1: none */
	/* A named object's version (gmb_object_open(), a publish): mapped
	 * read-only for dev alone, never kept idle (its last close lets gmbd
	 * let go of a version no longer the latest). */
	bool object;
	struct gmb__import *next;
};

/* An address range kept reserved after its import closed. */
struct gmb__ipc_range {
	uintptr_t va;
	uint64_t size;
	int dev;
};

#define GMB__IPC_SPARES 8

struct gmb__ipc {
	struct gmb__import *imports; /* changed under op_lock and the state lock */
	/* Ranges of closed imports, reserved still, for the next import of the
	 * same size on the same device: a reserve and a free fewer per open
	 * (weight syncs open and close the same buckets each round). Under
	 * op_lock; freed by gmb__ipc_close_all(). */
	struct gmb__ipc_range spare[GMB__IPC_SPARES];
	unsigned nspare;
};

/*
 * gmb__ipc_maybe_ours() - may @ptr be in an allocation or an import of
 * this client? Takes the state lock only, so that the runtime's own
 * pointers never wait for an operation of gmbd's (a pause, a parked
 * malloc) to end before they go to the runtime.
 */
bool gmb__ipc_maybe_ours(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr);

/**
 * gmb__ipc_get_handle() - the handle of the memory at @ptr: an allocation
 * of this client (asked of gmbd), or an import (its handle again).
 * Return: 0; -ENXIO when @ptr is in neither (not gmbd's: the caller passes
 * it on to the runtime); gmbd's refusal; -EPROTO.
 */
int gmb__ipc_get_handle(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr, uint8_t *handle,
			char *err);
/**
 * gmb__ipc_open() - map what @handle names (or count one more open of it)
 * and give this process's device index @dev_index (gmbd's index; -1: the
 * memory's own) read and write access. *@ptr: the import's base plus the
 * handle's range offset.
 * Return: 0; -ENXIO when @handle is not gmbd's; -EINVAL malformed; gmbd's
 * refusal (-ENOENT stale or forged, -EPERM another uid, -EBUSY paused);
 * the backend's error.
 */
int gmb__ipc_open(struct gmb__mem *m, struct gmb__ipc *ipc, const uint8_t *handle, int dev_index,
		  void **ptr, char *err);
/* How gmb__ipc_open_how() maps a new import. */
struct gmb__ipc_how {
	int dev_index; /* gmbd's index of a device given access too; -1: none */
	bool object;   /* a named object's version: read-only, dev_index unused */
	/* 0: a range of the import's own. Else a range this process reserved,
	 * of @at_size bytes, for the import to be mapped at: the import's once
	 * the open succeeds, still the caller's when it fails. */
	uintptr_t at;
	uint64_t at_size;
};

/**
 * gmb__ipc_open_how() - gmb__ipc_open() as @how says. An object's handle
 * already open here counts one more open (at its own address: -EEXIST
 * with @how->at); one open read-write by gmb_ipc_open() is -EBUSY.
 */
int gmb__ipc_open_how(struct gmb__mem *m, struct gmb__ipc *ipc, const uint8_t *handle,
		      const struct gmb__ipc_how *how, void **ptr, char *err);
/* Is @ptr in an open import of a named object's version? */
bool gmb__ipc_is_object(struct gmb__ipc *ipc, const void *ptr);
/**
 * gmb__ipc_close() - one open of the import holding @ptr fewer; the last
 * drains its device, unmaps it, frees its range and tells gmbd.
 * Return: 0; -ENXIO when @ptr is in no import; the backend's error.
 */
int gmb__ipc_close(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr, char *err);
/**
 * gmb__ipc_follow() - gmbd's IpcFollow: the owner of export @export_id
 * pauses (@map false: drain the device, unmap the import, keep its range)
 * or has resumed (@map true: fetch the chunks again and map them at the
 * same addresses). Either is a no-op when already so. @drop: close an idle
 * import for good (-EBUSY when it is open again).
 * Return: 0; -ENOENT (no import of it); gmbd's or the backend's error.
 */
int gmb__ipc_follow(struct gmb__mem *m, struct gmb__ipc *ipc, uint64_t export_id, bool map,
		    bool drop, char *err);
/**
 * gmb__ipc_grant() - uid @uid may (@revoke: may no longer) open handles of
 * this client's allocation holding @ptr.
 * Return: 0; -ENXIO (@ptr in no allocation of this client); gmbd's refusal.
 */
int gmb__ipc_grant(struct gmb__mem *m, const void *ptr, uint32_t uid, bool revoke, char *err);
/* Is @ptr in an import of this client? */
int gmb__ipc_owns(struct gmb__ipc *ipc, const void *ptr);
/* gmb_close(): every import unmapped and told to gmbd (while connected). */
void gmb__ipc_close_all(struct gmb__mem *m, struct gmb__ipc *ipc);
/*
 * gmb__ipc_claim() - the imports of @ipc (a struct gmb__ipc) as a rejoin
 * claims them (struct gmb__mem's claim_imports): up to @cap into @out (may
 * be NULL when @cap is 0), each with one open, the one gmbd answered (a
 * process's further opens are counted here only). The caller holds the
 * state lock. Return: how many imports there are.
 */
size_t gmb__ipc_claim(void *ipc, Gmb__RejoinImport *out, size_t cap);

#endif
