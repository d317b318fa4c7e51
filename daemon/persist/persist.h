/*
 * persist.h - restart without loss: gmbd's chunks and its record of who
 * holds them, kept in the service manager's fd store.
 *
 *   - Every chunk's fd (chunk_export(); host: the memfd) is stored when the
 *     chunk is created (FDSTORE=1, FDNAME=chunk.<id>.<device>.<size>) and
 *     removed when it goes back to the backend (FDSTOREREMOVE=1).
 *   - The broker's record (daemon/persist/state.c) lives in one memfd stored as
 *     FDNAME=state and rewritten in place once per loop turn that changed
 *     something, before any reply of that turn leaves (the server holds its
 *     output until persist_flush() said the record is stored): no client
 *     ever learns of a lend the record lacks. A write that fails holds every
 *     reply until one succeeds (see persist_flush()).
 *   - At start, the fds handed back (sd_glue_take_fds()) are re-imported
 *     and the record restored (state_restore()), so no memory is created.
 *
 * The fd store is used when $NOTIFY_SOCKET is set, --fdstore-max is at
 * least 2 and the manager takes the state memfd; that is tried at the first
 * change (or at shutdown), not at start: a test harness that only waits for
 * READY=1 and then closes its socket gets no fd store and the old
 * behaviour, a stop that disconnects everyone.
 *
 * Beyond --fdstore-max (the unit's FileDescriptorStoreMax=: the state plus
 * fdstore-max - 1 chunks) no chunk is created: the request fails with
 * -ENOSPC and a sentence saying so, rather than lending memory that a
 * restart would lose. The manager closes what is stored past the unit's
 * own limit without telling gmbd, so persist_new() asks for that limit
 * (sd_glue_fdstore_limit()) and keeps to the lower of the two, with a
 * warning when the unit's is the lower.
 */
#ifndef GMB_PERSIST_H
#define GMB_PERSIST_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/core/object.h"
#include "daemon/core/pool.h"
#include "daemon/system/sd.h"
#include "daemon/persist/state.h"

struct backend;
struct broker;
struct persist;

/**
 * persist_new() - the fd store glue for chunks of @be; @fdstore_max is
 * --fdstore-max, meant to equal the unit's FileDescriptorStoreMax= (0 or 1:
 * never use the store). Under a manager, the unit's own limit is looked up
 * here and the lower one kept (logged). *@out is the caller's
 * (persist_free()). Return: 0 or -ENOMEM.
 */
int persist_new(struct backend *be, unsigned fdstore_max, struct persist **out);
void persist_free(struct persist *p);

/* The pool hooks that store and remove chunk fds; valid while @p lives. */
const struct pool_hooks *persist_hooks(struct persist *p);
/* The named objects' hooks that store and remove host copies of paused
 * versions (FDNAME=objcopy.<export id>.<size>); valid while @p lives. */
const struct object_hooks *persist_object_hooks(struct persist *p);

/**
 * persist_restore() - rebuild @br (fresh, made with persist_hooks()) from
 * the fds the manager handed back in @named, which this consumes: each is
 * imported and closed, or removed from the store (chunks no record names,
 * unknown names). @br is then what persist_flush() records.
 * Return: 0 (@out says what came back; all zero without a record) or
 * -ENOMEM.
 */
int persist_restore(struct persist *p, struct broker *br, struct sd_named_fd *named, size_t n,
		    struct state_stats *out);

/* The record changed: it is written at the next persist_flush(). */
void persist_changed(struct persist *p);

/**
 * persist_flush() - write the record if it changed; the server's hook
 * before replies leave. Holding the replies of a failed write, rather than
 * undoing the requests behind them, is what keeps this simple and right:
 * the record is a snapshot of the whole broker, so the next write that
 * succeeds covers every held reply at once, whatever mix of alloc, free,
 * pause, switch or rejoin produced it, while undoing each kind of request
 * would need its own inverse. A client whose reply is held waits (libgmb
 * has no reply timeout), and if gmbd dies meanwhile the record and the
 * client agree that the request never happened (libgmb sends it again).
 * The first failure is logged at error level with the limit it most
 * likely met, later tries at debug, the recovery at notice.
 * Return: 0 when the stored record covers the broker (or there is no fd
 * store); the write's error, or -ESTALE for a change after the handover
 * record: replies must not leave then.
 */
int persist_flush(void *p);

/* A write of the record failed and none succeeded since (replies held). */
bool persist_failing(const struct persist *p);

/* Whether chunks and record go to the fd store (tries it if not known yet). */
bool persist_active(struct persist *p);

/* The fd store may be used (not known yet, or in use): replies wait for it. */
bool persist_enabled(const struct persist *p);

/**
 * persist_handover() - gmbd is stopping: write the record a last time and
 * freeze it (and the chunk fds) for the next gmbd, whatever the teardown
 * does next. Return: true when the fd store keeps them; false when there is
 * no fd store (the clients' memory is then lost with this gmbd).
 */
bool persist_handover(struct persist *p);

/* Nothing changes in the store from now on (gmbd failed to start, or is
 * tearing down after persist_handover()): what was stored stays. */
void persist_freeze(struct persist *p);

#endif
