/*
 * import.h - memory shared between processes (CUDA IPC on gmbd memory):
 * gmbd's record of which allocations were exported, with which handle,
 * and which client imported which of them, how many times.
 *
 * Pure core, like broker.h: no socket, no protobuf type. The handlers
 * (daemon/handlers/ipc.c) call import_export(), import_open() and
 * import_close(); the broker calls the hooks (import_alloc_gone(),
 * import_client_gone(), import_pause_check()) where allocations and
 * clients go and tags pause. import_export.c makes the exports and their
 * handles, import.c keeps the imports of them.
 *
 * Invariants:
 *   - One export per allocation (found by its id while the allocation
 *     lives), made at its first export; its id (the handle's generation)
 *     and token never change and no later export reuses the id.
 *   - An export with a mapped import has every chunk of its allocation
 *     pinned (pool_pin(), once per export, not per import): while some
 *     importer maps them they are never free, never lent to another
 *     allocation and never released, whatever the owner does (free, exit,
 *     be killed). gmbd sends an import's chunk fds only to a mapped record.
 *   - An import record is mapped from its open until it follows its
 *     owner's pause (import_unmapped(): the importer unmapped it and keeps
 *     its address range), and mapped again by import_remap(); nmapped
 *     counts the mapped records. An unmapped record pins nothing.
 *   - An import record has refs > 0 and is on its export's list; an export
 *     whose allocation is gone lives exactly while it has import records.
 *   - Another uid opens only what the owner granted it
 *     (import_export_grant()).
 *   - The owner is charged (its allocation's chunks are lent to it while
 *     it lives); importers are charged nothing. The chunks of a freed
 *     imported allocation stay counted as lent in their pool until the
 *     last import closes.
 */
#ifndef GMB_IMPORT_H
#define GMB_IMPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/idmap.h"
#include "common/ipc_handle.h"
#include "common/wire.h"

struct broker;
struct bclient;
struct balloc;
struct chunk;
struct import_export;
struct bobject_version;

/* Uids one allocation may be granted to. */
#define IMPORT_MAX_GRANTS 8

/* One client's opens of one export. */
struct import_rec {
	struct bclient *importer; /* owned by the broker */
	struct import_export *ex;
	uint32_t refs; /* opens not closed yet */
	bool mapped;   /* not unmapped to follow its owner's pause */
	/* Closed by its importer, which keeps it mapped for its next open
	 * (GMB_IPC_KEEP): still pinned, until gmbd asks for it (asked). */
	bool idle, asked;
	struct import_rec *prev, *next; /* on ex->imports */
};

struct import_export {
	uint64_t id; /* the handle's generation */
	uint64_t alloc_id;
	struct balloc *alloc; /* NULL once freed or its owner gone */
	/* The owner, kept by value: the export may outlive it. */
	uint64_t owner_id;
	char owner[WIRE_MAX_NAME + 1];
	pid_t owner_pid;
	uid_t owner_uid;
	int dev;
	uint64_t size;
	uint8_t token[IPC_HANDLE_TOKEN];
	/* While imported: the allocation's chunks, each pinned once. */
	struct chunk **chunks;
	uint32_t nchunks;
	struct import_rec *imports;
	uint32_t nimports; /* records on the list */
	uint32_t nmapped;  /* of them mapped: the chunks are pinned while > 0 */
	/* Other uids the owner let open it (IpcGrantRequest). */
	uid_t grants[IMPORT_MAX_GRANTS];
	uint32_t ngrants;
	/* A named object's version (daemon/core/object.h), NULL for an
	 * allocation's export: no allocation owns it, its chunks are pinned
	 * from its making to its end, and it lives while the object holds it
	 * or a record is on its list. */
	struct bobject_version *version;
	const struct import_version_ops *vops; /* its object's, with version */
	struct import_export *prev, *next;
};

/*
 * What the table asks of the owner of a named object's version: the
 * callback table daemon/core/object.c hands down with each version export
 * (the one way up from here).
 */
struct import_version_ops {
	/* 0 when @c may map @v now; else -EPERM (not granted) or -EBUSY (paused), @err says. */
	int (*may_map)(const struct bobject_version *v, const struct bclient *c, char *err);
	/* Does its object keep @v without records (held, or its bytes being copied)? */
	bool (*kept)(const struct bobject_version *v);
	/* @v's export goes (unkept, its last record gone): the object forgets @v. */
	void (*gone)(struct broker *br, struct bobject_version *v);
};

struct import_table {
	uint64_t instance; /* random at the first export, kept across restarts (the state record) */
	uint64_t next_id;
	struct idmap by_id;	       /* export id -> export */
	struct idmap by_alloc;	       /* live allocation id -> export */
	struct import_export *exports; /* newest first */
	uint64_t nexports, nrecs;      /* for status and tests */
	uint64_t nidle;		       /* idle records: the sweeps for them run only while > 0 */
};

/* The broker's table, made on first use; NULL when there is none yet. */
struct import_table *import_table(struct broker *br);

/**
 * import_export() - the handle (IPC_HANDLE_SIZE bytes into @handle) of
 * @c's allocation @alloc_id, naming the chunk that holds byte @offset.
 * Return: 0; -ENOENT (no such allocation of @c), -EBUSY (paused),
 * -EINVAL (@offset past its end), -ENOMEM, -EIO (no randomness), with @err.
 */
int import_export(struct broker *br, struct bclient *c, uint64_t alloc_id, uint64_t offset,
		  uint8_t *handle, char *err);

/**
 * import_open() - @c imports what @handle (@len bytes) names: one open
 * more. *@out is the export (its chunks are what to send, in order) and
 * *@range_off the handle's range offset; both the table's.
 * Return: 0; -EINVAL (not a well-formed gmbd handle, or a range offset
 * that is no chunk's), -ENOENT (of another gmbd, no such export, a wrong
 * token: the same answer for each, so that nothing is learnt from it; or
 * the allocation was freed), -EPERM (another uid, @err naming the owner;
 * or a tool), -EBUSY (the owner's tag is paused), -ENOMEM; @err says why.
 */
int import_open(struct broker *br, struct bclient *c, const uint8_t *handle, size_t len,
		struct import_export **out, uint64_t *range_off, char *err);

/**
 * import_close() - one open of export @export_id by @c fewer. On the last
 * one of the export its chunks are unpinned: back in the pool when their
 * allocation is gone (released as the keep limit says).
 * Return: 0; -ENOENT (@c has no open of it) with @err.
 */
int import_close(struct broker *br, struct bclient *c, uint64_t export_id, char *err);

/**
 * import_export_grant() - uid @uid may (@revoke: may no longer) open
 * handles of @c's allocation @alloc_id; its export is made if it has
 * none. Opens already made stay.
 * Return: 0; -ENOENT (no such allocation of @c), -EINVAL (@uid is @c's
 * own), -ENOSPC (IMPORT_MAX_GRANTS uids already), -ENOMEM, -EIO, with @err.
 */
int import_export_grant(struct broker *br, struct bclient *c, uint64_t alloc_id, uid_t uid,
			bool revoke, char *err);

/**
 * import_unmapped() - @c's import of export @export_id followed its
 * owner's pause: it no longer maps the chunks; the last mapped import of
 * the export unpins them.
 * Return: 0; -ENOENT (@c has no import of it).
 */
int import_unmapped(struct broker *br, struct bclient *c, uint64_t export_id);
/**
 * import_remap() - @c maps its import of export @export_id again (after
 * its owner's resume): the chunks are pinned again, its opens unchanged.
 * *@out is the export, whose chunks are what to send.
 * Return: 0; -ENOENT (no such import of @c, or the allocation was freed),
 * -EBUSY (the owner's tag is paused), -ENOMEM; @err says why.
 */
int import_remap(struct broker *br, struct bclient *c, uint64_t export_id,
		 struct import_export **out, char *err);

typedef int (*import_follow_fn)(void *arg, const struct import_export *ex,
				const struct import_rec *r);
/**
 * import_followers() - @fn for every import record of an allocation of
 * @c's tag @tag ("": every tag) that is @mapped (a pause asks those to
 * unmap, a resume the unmapped ones to map again). @fn changes nothing.
 * Return: 0, or the first nonzero result of @fn.
 */
int import_followers(const struct broker *br, const struct bclient *c, const char *tag, bool mapped,
		     import_follow_fn fn, void *arg);

/**
 * import_keep() - @c closed its last open of export @export_id but keeps
 * the import mapped for its next open: idle (still counted, still pinned).
 * import_reopen() - that next open. Return: 0; -ENOENT (no import of it),
 * -EINVAL (keep: not its last open; reopen: not idle), with @err.
 */
int import_keep(struct broker *br, struct bclient *c, uint64_t export_id, char *err);
int import_reopen(struct broker *br, struct bclient *c, uint64_t export_id, char *err);

/* @r idle or not (rejoin.c: as the claim says), counted in the table. */
void import_record_idle(struct broker *br, struct import_rec *r, bool idle);

typedef void (*import_idle_fn)(void *arg, const struct import_export *ex, struct import_rec *r);
/**
 * import_idle_walk() - @fn for every idle import record not asked back yet
 * of an allocation of @owner's tag @tag ("": every tag), or, @owner NULL,
 * of an export whose allocation is gone. @fn may set r->asked, nothing else.
 */
void import_idle_walk(struct broker *br, const struct bclient *owner, const char *tag,
		      import_idle_fn fn, void *arg);

/* Export @export_id, NULL if none: the table's, valid until its next change. */
const struct import_export *import_find(const struct broker *br, uint64_t export_id);
/* @c's imports now (every open of every export), for status and tests. */
uint64_t import_client_opens(struct broker *br, const struct bclient *c);

typedef int (*import_walk_fn)(void *arg, const struct import_export *ex,
			      const struct import_rec *r);
/**
 * import_walk() - @fn for every import record (one importer's opens of one
 * export), newest export first, for status. @fn reads and changes nothing.
 * Return: 0, or the first nonzero result of @fn.
 */
int import_walk(const struct broker *br, import_walk_fn fn, void *arg);

/**
 * import_export_version() - a new export for version @v of a named object
 * (@ops its object's, kept), holding the chunks of @c's allocation @a (pinned here, once; the
 * allocation may go right after); *@out the table's, its handle into
 * @handle (range offset 0). Return: 0; -ENOMEM, -EIO with @err.
 */
int import_export_version(struct broker *br, struct balloc *a, struct bobject_version *v,
			  const struct import_version_ops *ops, struct import_export **out,
			  uint8_t *handle, char *err);
/* The handle of version export @ex (range offset 0) into @handle. */
void import_export_version_handle(const struct broker *br, const struct import_export *ex,
				  uint8_t *handle);
/* Version export @ex is no longer held by its object: it goes now if no
 * record is on its list (object_version_gone() is called), else with the last. */
void import_version_unheld(struct broker *br, struct import_export *ex);

/* Hooks of the broker. */
/* @a goes (freed, or its client removed): its export, if any, loses it. */
void import_alloc_gone(struct broker *br, struct balloc *a);
/* @c goes: every import of it is dropped. */
void import_client_gone(struct broker *br, struct bclient *c);
/**
 * import_pause_check() - may @c pause @tag ("" or NULL: every tag)?
 * Return: 0; -EBUSY when another process maps one of its allocations
 * (an import that followed the pause does not count), @err naming each
 * importer (client, pid) and allocation.
 */
int import_pause_check(struct broker *br, const struct bclient *c, const char *tag, char *err);
/* broker_free(): the table goes (every client removed before). */
void import_deinit(struct broker *br);

/*
 * Restart without loss: the records a rejoin claim keeps or drops
 * (daemon/core/rejoin.c) and the walk the state record is written from
 * (daemon/persist/state.c); the table's restore is import_restore.h's.
 */

/* @c's import record of export @export_id; NULL if none. The table's. */
struct import_rec *import_record_of(const struct broker *br, uint64_t export_id,
				    const struct bclient *c);
/* Is @a imported now (its export has records, so its chunks are pinned)? */
bool import_record_maps(const struct broker *br, const struct balloc *a);
typedef bool (*import_record_keep_fn)(void *arg, struct import_rec *r);
/**
 * import_record_sweep() - @keep for each import record of @c: one it
 * answers false for is dropped, as by its last close (the last record of
 * an export unpins its chunks); @keep may lower r->refs, never to 0.
 * Return: nothing.
 */
void import_record_sweep(struct broker *br, struct bclient *c, import_record_keep_fn keep,
			 void *arg);
typedef int (*import_record_export_fn)(void *arg, const struct import_export *ex);
/**
 * import_record_walk() - for the state record: @export_fn for every export,
 * newest first, then @rec_fn (may be NULL) for each of its import records,
 * newest first. Neither reads past what it is handed nor changes anything.
 * Return: 0, or the first nonzero result of either.
 */
int import_record_walk(const struct broker *br, import_record_export_fn export_fn,
		       import_walk_fn rec_fn, void *arg);

/*
 * Internal to the table's two files: import_export.c pins a version's
 * chunks at its making with import.c's pin, the one call between them.
 */

/**
 * import_pin() - pin the chunks of @ex's allocation, once: at the first
 * mapped import of an allocation's export, or at a version's making.
 * Return: 0; -ENOMEM with @err. @ex owns the chunk array after the call.
 */
int import_pin(struct broker *br, struct import_export *ex, char *err);

#endif
