/*
 * import_restore.h - the import table of memory shared between processes
 * (daemon/core/import.h) back from a previous gmbd's state record
 * (daemon/persist/state.c): the table with its instance id, so that every
 * handle stays valid, and each export with its pins and import records,
 * linked to the restored clients.
 *
 * Invariants (with import.h's): a record's export is checked against the
 * broker restored so far (its clients, allocations and chunks) and comes
 * back whole or not at all; it never pins a chunk twice, a chunk lent to
 * an allocation it is not of, or one of another uid, and never gives an
 * import to a client the broker lacks. Call it after the clients and
 * before the keep limit applies, so that no pinned chunk is ever free.
 *
 * Pure core: no protobuf type (state.c turns the record into these).
 */
#ifndef GMB_IMPORT_RESTORE_H
#define GMB_IMPORT_RESTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct broker;

/* One import record as a previous gmbd's record has it. */
struct import_restore_rec {
	uint64_t importer_id;
	uint32_t opens;
	bool unmapped; /* it followed its owner's pause: pins nothing */
	bool idle;     /* closed, kept mapped by its importer */
};

/* One export as the record has it: ids, checked by import_restore_export(). */
struct import_restore {
	uint64_t id, alloc_id, owner_id;
	const char *owner; /* copied (truncated to WIRE_MAX_NAME) */
	pid_t owner_pid;
	uid_t owner_uid;
	uint32_t dev;
	uint64_t size;
	const uint8_t *token;
	size_t token_len;
	const uint64_t *chunk_ids; /* the pinned chunks in mapping order, when imported */
	size_t nchunks;
	const struct import_restore_rec *recs; /* newest first, as recorded */
	size_t nrecs;
	const uint32_t *grants; /* other uids that may open it */
	size_t ngrants;
	/* A named object's version (object.h): linked to the restored version
	 * of its id, its chunks pinned whether or not anybody imports it. */
	bool version;
};

/**
 * import_restore_table() - the fresh broker @br's table with a previous
 * gmbd's @instance (0: none was made; nothing is done) and next export id.
 * Return: 0; -EEXIST (a table exists already), -ENOMEM.
 */
int import_restore_table(struct broker *br, uint64_t instance, uint64_t next_id);
/**
 * import_restore_export() - export @rx back: linked to its owner's restored
 * allocation when that exists (its chunks pinned again when imported),
 * else kept for its importers over the recorded chunks, each taken off the
 * free list and pinned. Records of clients the broker lacks, of another
 * uid, of no open or named twice are left out; an export whose allocation
 * is gone and that keeps no record is not restored. Restored exports are
 * linked first in the table: restore the record's last first.
 * Return: 0; -EINVAL (no table, ids, device, size or token out of range,
 * an allocation that does not match, chunks that cannot be pinned),
 * -EEXIST (its id or its allocation's export restored already), -ENOENT
 * (gone and imported by nobody), -ENOMEM; @err says why. Nothing changes
 * on failure.
 */
int import_restore_export(struct broker *br, const struct import_restore *rx, char *err);

#endif
