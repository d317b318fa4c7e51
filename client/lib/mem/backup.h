/*
 * backup.h - host copies of PRESERVE allocations (backup.c): the kinds,
 * the retain setting, and the copies themselves.
 *
 * The copy calls run under the client's operation lock; @be is its
 * backend (open before any allocation has memory) and @b the pinned
 * buffers it keeps for ring and disk copies. The settings are for any
 * thread.
 */
#ifndef GMB_CLIENT_MEM_BACKUP_H
#define GMB_CLIENT_MEM_BACKUP_H

#include <stddef.h>
#include <stdint.h>

#include "client/lib/cache/cache.h"
#include "common/backend/backend.h"

struct gmb__prep;

/* Pinned buffers made on first use and kept until gmbd's client closes. */
struct gmb__backup_bufs {
	void *ring[2];	  /* the ring's two pieces, NULL until first used */
	void *disk_stage; /* the disk copies' buffer, disk_stage_size bytes */
	uint64_t disk_stage_size;
	/* The copies made ahead (prep.c), NULL until the first one. */
	struct gmb__prep *prep;
	/* Their registrations' size, 0: 256 MiB (tests make it smaller). */
	uint64_t reg_piece;
};

/* Settings. */
int gmb__backup_parse(const char *name);
int gmb__backup_retain(void);
void gmb__backup_set_retain(int on);
/* torch_memory_saver's defaults (retain off) unless the process chose: its
 * entry points call this on first use. */
void gmb__backup_peer_defaults(void);
int gmb__backup_default(char *err);
int gmb__backup_set_default(int kind);
int gmb__backup_set_dir(const char *dir, char *err);
int gmb__backup_get_dir(char *buf, size_t cap);

/* Copies; @err gets the reason on failure. */
int gmb__alloc_mode(const struct gmb__alloc *a);
void gmb__backup_init(struct gmb__alloc *a);
/* A retained pinned copy is made for @a (each of @t's allocations) from
 * now on, off this thread; nothing for other kinds. Never waits. */
void gmb__backup_prep(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a);
void gmb__backup_prep_tag(struct backend *be, struct gmb__backup_bufs *b, struct gmb__tag *t);
/* The client allocates, pauses or resumes now: copies being made ahead wait. */
void gmb__backup_busy(struct gmb__backup_bufs *b);
/* Why the last copy made ahead failed ("" if none). */
void gmb__backup_prep_error(struct gmb__backup_bufs *b, char *buf, size_t cap);
int gmb__backup_prepare(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			char *err);
/* A PINNED copy to (BACKEND_TO_HOST) or from the device, queued (contents_queue). */
int gmb__backup_queue(struct backend *be, struct gmb__alloc *a, enum backend_contents op);
int gmb__backup_save(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
		     char *err);
int gmb__backup_restore(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			char *err);
int gmb__backup_pointer(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			void **p, char *err);
void gmb__backup_free(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a);
void gmb__backup_bufs_free(struct backend *be, struct gmb__backup_bufs *b);

#endif
