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

/* Pinned buffers made on first use and kept until gmbd's client closes. */
struct gmb__backup_bufs {
	void *ring[2];	  /* the ring's two pieces, NULL until first used */
	void *disk_stage; /* the disk copies' buffer, disk_stage_size bytes */
	uint64_t disk_stage_size;
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
int gmb__backup_prepare(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			char *err);
int gmb__backup_save(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
		     char *err);
int gmb__backup_restore(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			char *err);
int gmb__backup_pointer(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			void **p, char *err);
void gmb__backup_free(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a);
void gmb__backup_bufs_free(struct backend *be, struct gmb__backup_bufs *b);

#endif
