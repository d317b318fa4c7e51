/*
 * object.h - named objects: memory that belongs to a name under a uid, not
 * to a process (README "Named objects").
 *
 * A version is what one published allocation was: its chunks, held by an
 * export of the import table (daemon/core/import.h) that no allocation
 * owns, so that readers open it exactly as they open CUDA IPC memory and
 * every rule of imports holds for them (pins, their death, follow, the
 * state record). The object holds its latest version; a version it no
 * longer holds (superseded, dropped) lives while readers have it open.
 *
 * Pure core, like broker.h: no socket, no protobuf type. The handlers
 * (daemon/handlers/object.c) call object_publish(), object_open(),
 * object_drop() and object_grant(); import.c calls object_version_gone()
 * when a version's export goes.
 *
 * Invariants:
 *   - (uid, name) is unique; a name is 1..OBJECT_NAME_MAX bytes of
 *     [A-Za-z0-9._-];
 *   - a version is on its object's list from its publish until its export
 *     goes; held versions pin their chunks (import.h); an object lives while
 *     it has a version on its list or is not dropped;
 *   - version numbers of one object only grow, across drops and restarts;
 *   - latest is 0 or the number of a held version.
 */
#ifndef GMB_OBJECT_H
#define GMB_OBJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/objname.h"
#include "common/wire.h"

struct broker;
struct bclient;
struct import_export;

#define OBJECT_NAME_MAX	   OBJNAME_MAX
#define OBJECT_META_MAX	   (48 * 1024)
#define OBJECT_MAX_PER_UID 1024
#define OBJECT_MAX_GRANTS  8

struct bobject;

struct bobject_version {
	uint64_t version;
	struct bobject *obj;
	struct import_export *ex; /* holds the chunks; its ->version points back */
	uint64_t export_id;	  /* ex's id (a restore links them by it) */
	bool held;		  /* the object's latest (pins the chunks) */
	uint8_t *meta;		  /* owned */
	uint32_t meta_len;
	uint64_t published_ns; /* CLOCK_REALTIME */
	char publisher[WIRE_MAX_NAME + 1];
	pid_t publisher_pid;
	/* Paused with its bytes: their host copy (a memfd of copy_size bytes,
	 * owned; in the fd store under gmbd); -1 otherwise. */
	int copy_fd;
	uint64_t copy_size;
	struct bobject_version *prev, *next; /* oldest first on obj->versions */
};

struct bobject {
	char name[OBJECT_NAME_MAX + 1];
	uid_t uid;
	uint64_t next_version;
	uint64_t latest; /* 0: none */
	bool dropped;	 /* kept only for the versions readers hold */
	/* Paused: no version's export holds chunks (their readers unmapped,
	 * keeping their addresses); discarded: without the bytes. */
	bool paused, discarded;
	/* A pause or resume copies its bytes off the loop (the handlers'
	 * job): its versions stay as they are, nothing else may change it. */
	bool busy;
	uid_t grants[OBJECT_MAX_GRANTS];
	uint32_t ngrants;
	struct bobject_version *versions;
	uint32_t nversions;
	struct bobject *prev, *next;
};

/*
 * What the core tells its owner as host copies of paused versions come and
 * go (gmbd: the service manager's fd store, daemon/persist/persist.c):
 * copy_made() may refuse (a negative errno, its sentence in
 * backend_fail()), and the pause is then refused too.
 */
struct object_hooks {
	int (*copy_made)(void *arg, uint64_t export_id, uint64_t size, int fd);
	void (*copy_gone)(void *arg, uint64_t export_id, uint64_t size);
	void *arg;
};

struct object_table {
	struct bobject *objects; /* newest first */
	uint64_t nobjects;
};

/* The broker's table, made on first use; NULL when there is none yet. */
struct object_table *object_table(struct broker *br);

/* Is @bare (no UID/) a name an object may have? */
bool object_name_valid(const char *bare);

/**
 * object_name_check() - @name as a client gives it: NAME (@c's uid) or
 * UID/NAME. *@uid and the bare name (into @bare, OBJECT_NAME_MAX + 1 bytes).
 * Return: 0; -EINVAL with @err.
 */
int object_name_check(const struct bclient *c, const char *name, uid_t *uid, char *bare, char *err);

/**
 * object_publish() - @c's allocation @alloc_id becomes the next version of
 * @name (@c's uid; the object made if new): its chunks are pinned for the
 * version, which is the latest from now on. The caller then frees the
 * allocation (lend_free()): it leaves @c, its chunks stay for the version.
 * *@out is the version (the table's).
 * Return: 0; -EINVAL (name), -ENOENT (no such allocation of @c), -EBUSY
 * (paused), -E2BIG (@meta_len), -ENOSPC (OBJECT_MAX_PER_UID), -EPERM (a
 * tool), -ENOMEM, -EIO; @err says why.
 */
int object_publish(struct broker *br, struct bclient *c, const char *name, uint64_t alloc_id,
		   const uint8_t *meta, size_t meta_len, struct bobject_version **out, char *err);

/**
 * object_open() - version @version (0: the latest) of @name for @c to open:
 * *@out (the table's). The open itself is an import of (*@out)->ex.
 * Return: 0; -EINVAL, -ENOENT (no such object or version: one answer for
 * another uid's that @c may not know of), -EPERM (another uid's, not
 * granted, named).
 */
int object_open(struct broker *br, struct bclient *c, const char *name, uint64_t version,
		struct bobject_version **out, char *err);

/**
 * object_drop() - @name's version @version (0: every version, and the
 * object) is no longer held; readers keep what they have open. Only @c of
 * the owner's uid, or one @may_admin says may act for anyone.
 * Return: 0; -EINVAL, -ENOENT, -EPERM.
 */
int object_drop(struct broker *br, struct bclient *c, bool may_admin, const char *name,
		uint64_t version, char *err);

/**
 * object_grant() - uid @uid may (@revoke: may no longer) open @name's
 * versions. Return: 0; -EINVAL, -ENOENT, -ENOSPC, -EPERM.
 */
int object_grant(struct broker *br, struct bclient *c, const char *name, uid_t uid, bool revoke,
		 char *err);

/*
 * Pause and resume (daemon/handlers/object_pause.c drives them: readers
 * follow, bytes copied off the loop while the object is busy).
 */
/**
 * object_pause_find() - @name for @c to pause (@resume false) or resume:
 * *@out, the owner's uid or one @may_admin says may act for anyone.
 * Return: 0; 1 when it is so already (nothing to do); -EINVAL, -ENOENT,
 * -EPERM, -EBUSY (a pause or resume of it is running).
 */
int object_pause_find(struct broker *br, struct bclient *c, bool may_admin, const char *name,
		      bool resume, struct bobject **out, char *err);
/* Mapped readers of @obj's versions (a pause waits for them to unmap). */
uint32_t object_mapped_readers(const struct bobject *obj);
/**
 * object_pause_release() - @obj is paused: each version gets its host copy
 * @copy_fds[i] (the versions' order; NULL: discarded) and its chunks go
 * back to the pool (the keep limit applies). No reader may map any
 * (object_mapped_readers() == 0). Return: 0, the copies the versions'
 * (the caller's -1 where taken); a hook's refusal, with @err, nothing
 * changed and the copies still the caller's.
 */
int object_pause_release(struct broker *br, struct bobject *obj, int *copy_fds, char *err);
/**
 * object_resume_take() - new chunks for every version of paused @obj,
 * pinned, lent to nobody (all or nothing): the caller copies the bytes
 * back, then object_resume_done(). Return: 0; -ENOMEM (the budget, named),
 * -ENOSPC, -EMFILE, with @err.
 */
int object_resume_take(struct broker *br, struct bobject *obj, char *err);
/* A resume took its chunks and restored the bytes: @obj is active again,
 * its host copies closed. */
void object_resume_done(struct broker *br, struct bobject *obj);
/* A resume whose copy failed gives back what object_resume_take() took. */
void object_resume_undo(struct broker *br, struct bobject *obj);
/* The job on @obj ended: versions nobody holds or reads go now. */
void object_job_end(struct broker *br, struct bobject *obj);

/* May @uid open @obj's versions (its owner, or granted)? */
bool object_may_open(const struct bobject *obj, uid_t uid);

/* @v's export is going (its last reader closed, unheld): @v goes. */
void object_version_gone(struct broker *br, struct bobject_version *v);
/* The callbacks a version's export calls (import.h), for import_restore.c too. */
struct import_version_ops;
const struct import_version_ops *object_version_ops(void);

/* Bytes of every version on @obj's list; chunks held for uid @uid. */
uint64_t object_bytes(const struct bobject *obj);
uint64_t object_uid_chunks(const struct broker *br, uid_t uid);

/* Every object, newest first; @fn's nonzero return stops and is returned. */
typedef int (*object_walk_fn)(void *arg, const struct bobject *obj);
int object_walk(const struct broker *br, object_walk_fn fn, void *arg);
/* Readers (import records) of @v. */
uint32_t object_version_readers(const struct bobject_version *v);

/*
 * Restart without loss (daemon/persist/state.c): the objects come back
 * before the import table's exports, each version without its export;
 * import_restore_export() links a version's export to it by id
 * (object_restore_version_of()), and object_restore_finish() drops the
 * versions whose export did not come back and lets go of those nobody
 * holds or reads.
 */
struct object_restore_version {
	uint64_t version, export_id;
	int copy_fd; /* paused with its bytes: the copy (dup'ed here), else -1 */
	uint64_t copy_size;
	const uint8_t *meta; /* copied */
	size_t meta_len;
	bool held;
	uint64_t published_ns;
	const char *publisher; /* copied (truncated) */
	pid_t publisher_pid;
};

struct object_restore {
	const char *name;
	uid_t uid;
	bool paused, discarded;
	uint64_t next_version, latest;
	const uint32_t *grants;
	size_t ngrants;
	const struct object_restore_version *versions; /* oldest first */
	size_t nversions;
};

/* Return: 0; -EINVAL (a bad name, version numbers, too many grants),
 * -EEXIST (the name twice), -ENOMEM; @err says why. */
int object_restore(struct broker *br, const struct object_restore *ro, char *err);
/* The restored version whose export is @export_id, not linked yet; NULL if none. */
struct bobject_version *object_restore_version_of(struct broker *br, uint64_t export_id);
void object_restore_finish(struct broker *br);

/* @obj (out of the table) and its versions' records go, their copies
 * closed; the exports are not touched. */
void object_free_records(struct bobject *obj);

/* broker_free(): everything goes (the exports with the import table). */
void object_deinit(struct broker *br);

#endif
