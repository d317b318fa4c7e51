/*
 * mem.h - libgmb's memory: tags, mapping and the connection's callbacks
 * (mem.c), allocations made and undone (allocs.c), pause and resume
 * (cycle.c), a pause's saving of PRESERVE bytes (save.c), and what this
 * client holds as told to gmbd after a restart (rejoin.c).
 *
 * Layer: below the API (client/lib/api/), above the memory tables
 * (client/lib/cache/) and the connection (client/lib/conn/), which it calls
 * for requests and which calls back into it only through the callbacks of
 * gmb__mem_cbs(). Includes cache.h, conn.h, reconnect.h (the claim's
 * types) and common/.
 *
 * Every function runs under the connection's op_lock, except the callbacks
 * (reader thread). The tables the reader also touches (struct gmb__cache)
 * change under the state lock, conn->lock, as well.
 */
#ifndef GMB_CLIENT_MEM_H
#define GMB_CLIENT_MEM_H

#include <string.h>

#include "client/lib/cache/cache.h"
#include "client/lib/mem/backup.h"
#include "client/lib/mem/pack.h"
#include "client/lib/conn/conn.h"
#include "common/err.h"
#include "include/gmb.h"

/* Devices as a bit mask: BACKEND_MAX_DEVICES is 64. */
#define GMB__DEV_BIT(d) (1ULL << (unsigned)(d))

/* A chunk handle imported for an IPC open (client/lib/ipc/), not for a lend. */
struct gmb__staged {
	uint64_t id; /* gmbd's chunk id */
	uint64_t handle;
	uint64_t size;
};

struct gmb__mem {
	/* Set by gmb__mem_init(): the connection below (its state lock) and gmbd's devices. */
	struct gmb__conn *conn;
	const struct gmb__devices *devs;
	/* Written under op_lock and the state lock; op_lock holders read it freely. */
	struct backend *be; /* NULL until needed (tools never map) */
	/* Under the state lock. */
	struct gmb__cache tab;
	/* The handles of an IpcOpenReply's fds, in arrival order, owned here
	 * until gmb__mem_staged_take() (the open runs under op_lock, so there
	 * is at most one such reply at a time). */
	struct gmb__staged *staged;
	size_t nstaged, cap_staged;
	/* The imports of others' memory this client maps, for the rejoin claim:
	 * kept by client/lib/ipc/ (above this layer), which the API registers
	 * here before the connection starts, read-only then. Fills @out with up
	 * to @cap of them and returns how many there are; called with the state
	 * lock held, while no operation runs. NULL: none. */
	size_t (*claim_imports)(void *arg, Gmb__RejoinImport *out, size_t cap);
	void *claim_imports_arg;
	/* Under op_lock only. */
	struct gmb__tag *tags;
	struct gmb__backup_bufs bufs; /* backup.c's pinned buffers */
	uint32_t wait_ms;	      /* how long malloc and resume may wait for memory;
					written under the state lock too */
	bool ipc_follow;	      /* pauses have their importers follow (gmb_set_ipc_follow) */
	bool ipc_keep; /* closed imports stay mapped for the next open (gmb_set_ipc_keep) */
	int pack;      /* GMB_PACK_*: which allocations are packed (pack.c) */
	/* A pause hands allocations back in groups of this many saved bytes
	 * (save.c); 0: 1 GiB (tests make it smaller). */
	uint64_t give_bytes;
	/* Pieces of packs by address (struct gmb__piece), owned by their pack;
	 * changed under op_lock and the state lock. */
	struct idmap pieces;
	/* $GMB_IPC_GRANT: uids every shared allocation is granted to. */
	uint32_t ipc_grants[8];
	uint32_t nipc_grants;
};

void gmb__mem_init(struct gmb__mem *m, struct gmb__conn *conn);
/* The connection's import and drop callbacks (rejoin.c has the claim's). */
void gmb__mem_cbs(struct gmb__mem *m, struct gmb__conn_cbs *cbs);
/* gmb_close(), once the threads are gone and gmb__allocs_drop_all() has
 * run: free every tag, handle and the backend. */
void gmb__mem_deinit(struct gmb__mem *m);

/* mem.c: the caller holds op_lock; @err gets the reason on failure. */
int gmb__mem_backend(struct gmb__mem *m, char *err);
/* gmbd's index of this process's device @ordinal (what the application calls it). */
int gmb__mem_dev_index(struct gmb__mem *m, int ordinal, char *err);
int gmb__mem_set_mode(struct gmb__mem *m, const char *tag, int mode, char *err);
struct gmb__tag *gmb__mem_tag_find(struct gmb__mem *m, const char *name);
/* Tags, shared with allocs.c: a tag name checked, the tag named @name
 * (created if new: *@created), dropped again while still empty; @a put in
 * its tag's list and taken out. */
int gmb__mem_check_name(const char *name, char *err);
int gmb__mem_tag_get(struct gmb__mem *m, const char *name, struct gmb__tag **out, bool *created,
		     char *err);
void gmb__mem_tag_drop(struct gmb__mem *m, struct gmb__tag *t);
void gmb__mem_tag_link(struct gmb__tag *t, struct gmb__alloc *a);
void gmb__mem_tag_unlink(struct gmb__tag *t, struct gmb__alloc *a);
/* Helpers shared with allocs.c and cycle.c. */
int gmb__mem_map(struct gmb__mem *m, struct gmb__alloc *a, char *err);
int gmb__mem_unmap(struct gmb__mem *m, struct gmb__alloc *a, char *err);
int gmb__mem_sync(struct gmb__mem *m, uint64_t dev_mask, char *err);
/* @copied: PRESERVE bytes saved to host before it (gmbd counts them). */
int gmb__mem_send_pause(struct gmb__mem *m, const char *name, uint64_t copied, char *err);
void gmb__mem_sweep(struct gmb__mem *m);
/* The staged handles, now the caller's (free *@out; release each handle);
 * none left staged. *@out NULL when none. */
void gmb__mem_staged_take(struct gmb__mem *m, struct gmb__staged **out, size_t *n);
/* Releases staged handles nobody took (a failed or lost open). */
void gmb__mem_staged_clear(struct gmb__mem *m);

/* allocs.c: the caller holds op_lock; @err gets the reason on failure. */
/* What an allocation's own mode is: @own false follows the tag's mode. */
struct gmb__mem_how {
	bool own;
	int mode;   /* GMB_MODE_* */
	int backup; /* GMB_BACKUP_* (DEFAULT resolved at allocation) */
};

/* @how: NULL follows the tag's mode; @peers: this process's device ordinals
 * (bits) that get access too, besides @dev. */
/* Who allocates, for packing (pack.c): whether the setting packs the call. */
enum gmb__pack_class {
	GMB__PACK_NEVER, /* gmb_malloc_peers(): exact (named objects' buffers) */
	GMB__PACK_PLAIN, /* gmb_malloc(): under GMB_PACK_ALL */
	GMB__PACK_HOOK	 /* an allocator's (the hooks): unless GMB_PACK_OFF */
};

int gmb__allocs_malloc(struct gmb__mem *m, void **ptr, size_t size, int dev, const char *tag,
		       const struct gmb__mem_how *how, uint64_t peers, enum gmb__pack_class pc,
		       char *err);
/* Whether @ptr is an allocation's base (a pack's piece or a whole one); state lock held. */
bool gmb__allocs_owns(const struct gmb__mem *m, uintptr_t ptr);
int gmb__allocs_free(struct gmb__mem *m, void *ptr, char *err);
/* A publish: the allocation at @ptr checked and drained, then given away
 * (its range the caller's: *@va 0 when it could not be unmapped). */
int gmb__allocs_give_check(struct gmb__mem *m, void *ptr, struct gmb__alloc **out, char *err);
void gmb__allocs_give_away(struct gmb__mem *m, struct gmb__alloc *a, uintptr_t *va, uint64_t *size);
/* gmb_close() or a failed connect, before gmb__mem_deinit(): frees every
 * allocation (its pieces, host copy, mapping, VA range), the tags left empty. */
void gmb__allocs_drop_all(struct gmb__mem *m);

/* The tags an operation on @only (NULL: all) in state @paused acts on. */
static inline bool gmb__tag_in(const struct gmb__tag *t, const struct gmb__tag *only, bool paused)
{
	return (!only || t == only) && t->paused == paused;
}

/* save.c: the caller holds op_lock, the devices drained. */
int gmb__save(struct gmb__mem *m, const struct gmb__tag *only, uint64_t *copied, char *err);

/* cycle.c: the caller holds op_lock. @tag NULL or "": every tag. */
int gmb__cycle_pause(struct gmb__mem *m, const char *tag, char *err);
int gmb__cycle_resume(struct gmb__mem *m, const char *tag, char *err);
/* gmb_close(), still connected: drain and unmap every active allocation. */
void gmb__cycle_close(struct gmb__mem *m);

/* rejoin.c: the callbacks of the re-announcement (reader thread, operations still). */
struct gmb__claim;
struct gmb__claim_answer;
int gmb__rejoin_claim_build(void *arg, struct gmb__claim *cl);
void gmb__rejoin_claim_apply(void *arg, const struct gmb__claim_answer *ans);

#endif
