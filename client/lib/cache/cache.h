/*
 * cache.h - libgmb's memory tables as plain data: the imported chunk
 * handles, the allocation and tag records, and each allocation's last lend.
 *
 * Layer: the bottom of libgmb's memory side. cache.c takes no lock, sends
 * nothing and calls no layer above it; it includes only common/ (idmap,
 * err, backend for chunk_release) and the wire types. The memory layer
 * (client/lib/mem/) owns a struct gmb__cache and calls in under the
 * client's state lock.
 */
#ifndef GMB_CLIENT_CACHE_H
#define GMB_CLIENT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/idmap.h"
#include "common/ipc_handle.h"
#include "common/wire.h"

/* One imported chunk. refs = allocations of this client whose last lend has it. */
struct gmb__handle {
	uint64_t id;	 /* the daemon's chunk id */
	uint64_t handle; /* backend handle, owned by the cache */
	uint64_t size;
	uint32_t refs;
	bool dropping;		  /* scratch of gmb__cache_drop() */
	struct gmb__handle *next; /* on a release list once out of the cache */
};

struct gmb__tag;
struct gmb__piece;

/* How a host copy's memory was made (client/lib/mem/backup.c). */
enum {
	GMB__COPY_NONE,
	GMB__COPY_PINNED,
	GMB__COPY_PAGEABLE,
	GMB__COPY_FILE
};

/* One allocation's host copy; all of it under op_lock. */
struct gmb__hostcopy {
	int how;	 /* GMB__COPY_* */
	void *p;	 /* PINNED, PAGEABLE: size bytes, owned */
	bool registered; /* PAGEABLE, or PINNED made ahead: registered with the backend */
	int fd;		 /* FILE: the open file, owned; else -1 */
	char *path;	 /* FILE: malloc'd, unlinked when the copy goes */
	/* Registered: one range per reg_piece bytes (the last shorter); 0: one. */
	uint64_t reg_piece;
};

struct gmb__alloc {
	/* Set at malloc, then read-only until free. */
	uint64_t id; /* the daemon's allocation id */
	int dev;
	uint64_t peers; /* gmbd's indexes of the devices given access besides dev */
	uint64_t size;	/* granularity multiple */
	uintptr_t va;	/* reserved for the allocation's whole life */
	struct gmb__tag *tag;
	bool own_mode; /* mode and backup are its own, not the tag's */
	int mode;      /* own_mode: GMB_MODE_* */
	int backup;    /* GMB_BACKUP_PINNED, _MMAP or _DISK (resolved) */
	/* Under the state lock: the last lend, mapping order; id 0 = dropped. */
	uint64_t *chunk_ids;
	uint64_t *chunk_sizes;
	uint32_t nchunks;
	bool freeing; /* a FreeRequest is on its way: not re-announced */
	bool in_use;  /* mapped or being mapped: its chunks are not dropped */
	/* Under op_lock. */
	bool mapped;
	bool saved;	  /* copy holds the bytes of the last pause */
	bool given;	  /* handed back, saved, while its tag's pause runs (save.c) */
	bool marked;	  /* scratch: got its lend in the resume at hand */
	bool ipc_granted; /* $GMB_IPC_GRANT's uids granted at its first share */
	/* Its export, from gmbd's first handle of it: the later handles are
	 * made here (they differ only in the range offset), no round trip. */
	bool ipc_known;
	uint64_t ipc_instance, ipc_gen;
	uint8_t ipc_token[IPC_HANDLE_TOKEN];
	struct gmb__hostcopy copy; /* PRESERVE: made at the first pause */
	/* A pack (client/lib/mem/pack.c): the application's allocations are
	 * its pieces, by address; under op_lock. */
	bool packed;
	struct gmb__piece *pieces;
	uint32_t npieces;
	struct gmb__alloc *prev, *next; /* in the tag */
};

/* Under op_lock (the re-announcement reads them while every operation is still). */
struct gmb__tag {
	char name[WIRE_MAX_NAME + 1];
	int mode; /* GMB_MODE_* */
	bool paused;
	struct gmb__alloc *allocs;
	uint32_t nallocs;
	struct gmb__tag *next;
};

/* The tables the reader thread touches too: all under the state lock. */
struct gmb__cache {
	struct idmap cache; /* chunk id -> struct gmb__handle */
	struct idmap by_id; /* alloc id -> struct gmb__alloc */
	struct idmap by_va; /* base address -> struct gmb__alloc */
};

/* The caller holds the state lock (or owns @m alone). */
int gmb__cache_put(struct gmb__cache *m, uint64_t id, uint64_t handle, uint64_t size,
		   struct gmb__handle **rel);
/*
 * A reply's lends with their pieces joined (a lend of many chunks comes in
 * pieces, Lend.first_chunk): v[] points to gmbd's lends where one piece is
 * the whole, else into joined[] (malloc'd, ids and sizes too).
 */
struct gmb__lends {
	const Gmb__Lend **v;
	size_t n;
	Gmb__Lend *joined;
	size_t njoined;
};

/* Joins @in[0..@n) (pieces in order) into @out; gmb__cache_lends_free() it, even
 * on failure. Return: 0, -EPROTO (a piece out of order), -ENOMEM. */
int gmb__cache_lends_join(const Gmb__Lend *const *in, size_t n, struct gmb__lends *out, char *err);
void gmb__cache_lends_free(struct gmb__lends *ls);

int gmb__cache_lend_check(const struct gmb__cache *m, const struct gmb__alloc *a,
			  const Gmb__Lend *l, char *err);
int gmb__cache_lend_set(struct gmb__cache *m, struct gmb__alloc *a, const uint64_t *ids,
			const uint64_t *sizes, uint32_t n, struct gmb__handle **rel);
int gmb__cache_adopt(struct gmb__cache *m, struct gmb__alloc *a, const Gmb__Lend *l,
		     struct gmb__handle **rel, char *err);
void gmb__cache_forget(struct gmb__cache *m, struct gmb__alloc *a, struct gmb__handle **rel);
void gmb__cache_lend_clear(struct gmb__cache *m, struct gmb__alloc *a, struct gmb__handle **rel);
void gmb__cache_let_go(struct gmb__cache *m, struct gmb__alloc *a, struct gmb__handle **rel);
int gmb__cache_drop(struct gmb__cache *m, const uint64_t *ids, size_t n, struct gmb__handle **rel,
		    char *err);
void gmb__cache_sweep(struct gmb__cache *m, struct gmb__handle **rel);
void gmb__cache_clear(struct gmb__cache *m, struct gmb__handle **rel);
int gmb__cache_lend_handles(const struct gmb__cache *m, const struct gmb__alloc *a,
			    uint64_t *handles, char *err);
/* Outside the lock: release each handle with @be (may be NULL) and free the list. */
void gmb__cache_release_run(struct backend *be, struct gmb__handle *rel);

#endif
