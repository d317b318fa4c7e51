/*
 * test_object_core.c - named objects in gmbd's core, in process on the host
 * backend (daemon/core/object.c, import.c's version exports, the state
 * record): publish takes an allocation from its client and keeps its very
 * chunks, pinned and counted, after the client goes; versions supersede
 * each other while readers keep theirs; drop, grant, names, bounds; and the
 * record brings every object, version, description and reader back over
 * the same chunks, a damaged one refused without a leak.
 *
 * The world: "writer" (uid U) and "reader" (uid U), a broker keeping no
 * free chunk warm (so a chunk that came back free is released at once and
 * shows in held_bytes), 2 MiB chunks.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/ipc_handle.h"
#include "daemon/core/broker_internal.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"
#include "daemon/persist/state.h"
#include "tests/util.h"

#define MiB	(1ULL << 20)
#define MAX_FDS 64

static struct {
	struct backend *be;
	struct broker *br, *br2;
	struct bclient *writer, *reader;
	struct state_fd fds[MAX_FDS];
	size_t nfds;
} fx;

static struct broker *new_broker(void)
{
	struct broker_opts bo = { .max_chunk = 2 * MiB, .pool_keep = 0, .daemon_uid = 0 };
	struct broker *br;

	cr_assert(eq(i32, broker_new(fx.be, &bo, &br), 0));
	return br;
}

static struct bclient *add_client(struct broker *br, const char *name, pid_t pid, uid_t uid)
{
	struct broker_peer peer = { .pid = pid, .uid = uid, .gid = getgid(), .start_time = 42 };
	struct bclient *c;

	cr_assert(eq(i32, broker_client_add(br, &peer, name, false, false, &c), 0));
	return c;
}

static struct balloc *alloc(struct bclient *c, uint64_t size)
{
	struct broker_result res;
	char err[ERR_MSG_MAX];
	struct balloc *a;

	cr_assert(eq(i32, lend_alloc(fx.br, c, 0, size, "w", &res, err), 0), "%s", err);
	a = res.allocs[0];
	broker_result_deinit(&res);
	return a;
}

/* @c publishes a new @size allocation as @name; the version. */
static struct bobject_version *publish(struct bclient *c, const char *name, uint64_t size,
				       const char *meta)
{
	struct balloc *a = alloc(c, size);
	struct bobject_version *v;
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32,
		     object_publish(fx.br, c, name, a->id, (const uint8_t *)meta, strlen(meta), &v,
				    err),
		     0),
		  "%s", err);
	/* As the handler does: the allocation leaves its client. */
	cr_assert(eq(i32, lend_free(fx.br, c, a->id, err), 0), "%s", err);
	return v;
}

/* @c opens @name's version @version as a reader does: the handle, then an import. */
static struct bobject_version *open_obj(struct bclient *c, const char *name, uint64_t version)
{
	uint8_t h[IPC_HANDLE_SIZE];
	struct bobject_version *v;
	struct import_export *ex;
	char err[ERR_MSG_MAX] = "";
	uint64_t range = 1;

	cr_assert(eq(i32, object_open(fx.br, c, name, version, &v, err), 0), "%s", err);
	import_export_version_handle(fx.br, v->ex, h);
	cr_assert(eq(i32, import_open(fx.br, c, h, sizeof(h), &ex, &range, err), 0), "%s", err);
	cr_assert(eq(ptr, ex, v->ex));
	cr_assert(eq(u64, range, 0));
	return v;
}

static void close_obj(struct bclient *c, const struct bobject_version *v)
{
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, import_close(fx.br, c, v->ex->id, err), 0), "%s", err);
}

static void setup(void)
{
	struct backend_host_opts ho = { .ndevices = 1, .memory = 64 * MiB, .granularity = 2 * MiB };

	memset(&fx, 0, sizeof(fx));
	cr_assert(eq(i32, test_log_stderr("stderr"), 0));
	cr_assert(eq(i32, backend_host_open(&ho, &fx.be), 0));
	fx.br = new_broker();
	fx.writer = add_client(fx.br, "writer", 100, getuid());
	fx.reader = add_client(fx.br, "reader", 101, getuid());
}

static void teardown(void)
{
	for (size_t i = 0; i < fx.nfds; i++)
		close(fx.fds[i].fd);
	broker_free(fx.br2);
	broker_free(fx.br);
	cr_expect(eq(i32, proc_count_memfds(), 0), "chunks leaked past broker_free");
	backend_close(fx.be);
	cr_expect(eq(i32, test_leak_check(), 0), "heap leaked: see the report");
}

TestSuite(object_core, .init = setup, .fini = teardown, .timeout = 30);

static struct bobject *find(struct broker *br, const char *name)
{
	for (struct bobject *o = br->objects ? br->objects->objects : NULL; o; o = o->next)
		if (strcmp(o->name, name) == 0)
			return o;
	return NULL;
}

Test(object_core, a_publish_keeps_the_chunks_after_the_writer_goes)
{
	struct bobject_version *v = publish(fx.writer, "weights", 4 * MiB, "{}");
	uint64_t lent = fx.br->pools[0].lent_bytes;

	cr_assert(eq(u64, v->version, 1));
	cr_assert(eq(u64, v->ex->size, 4 * MiB));
	cr_assert(eq(u32, v->ex->nchunks, 2));
	cr_assert(eq(u32, v->ex->chunks[0]->pins, 1));
	cr_assert(eq(u64, fx.writer->allocs.count, 0), "the allocation left its client");
	cr_assert(eq(u64, fx.writer->lent_chunks, 0));
	cr_assert(eq(u64, broker_uid_chunks(fx.br, getuid()), 2), "the uid's bound counts it");
	cr_assert(eq(u64, lent, 4 * MiB), "counted against the budget");
	broker_client_remove(fx.br, fx.writer);
	fx.writer = NULL;
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 4 * MiB), "kept after its writer went");
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 4 * MiB));
	v = open_obj(fx.reader, "weights", 0);
	cr_assert(eq(u64, v->version, 1));
	cr_assert(eq(u32, object_version_readers(v), 1));
	cr_assert(eq(u32, v->meta_len, 2));
	cr_assert(eq(i32, memcmp(v->meta, "{}", 2), 0));
	close_obj(fx.reader, v);
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 4 * MiB), "held while not dropped");
}

Test(object_core, a_new_version_supersedes_and_the_old_goes_with_its_last_reader)
{
	struct bobject_version *v1 = publish(fx.writer, "w", 2 * MiB, "one"), *v2, *r;
	uint64_t c1 = v1->ex->chunks[0]->id;
	char err[ERR_MSG_MAX] = "";

	r = open_obj(fx.reader, "w", 0);
	cr_assert(eq(ptr, r, v1));
	v2 = publish(fx.writer, "w", 2 * MiB, "two");
	cr_assert(eq(u64, v2->version, 2));
	cr_assert(eq(u64, find(fx.br, "w")->latest, 2), "the commit is the latest at once");
	cr_assert(not(v1->held));
	cr_assert(eq(ptr, open_obj(fx.writer, "w", 0), v2), "latest is the new one");
	/* The reader of 1 still has it: both held in memory. */
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 4 * MiB));
	cr_assert(not(eq(ptr, broker_chunk_get(fx.br, c1), NULL)));
	/* An explicit open of the old one works while it lives. */
	cr_assert(eq(ptr, open_obj(fx.reader, "w", 1), v1));
	close_obj(fx.reader, v1);
	close_obj(fx.reader, v1);
	cr_assert(eq(ptr, broker_chunk_get(fx.br, c1), NULL), "version 1 went with its reader");
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 2 * MiB));
	cr_assert(eq(u32, find(fx.br, "w")->nversions, 1));
	cr_assert(eq(i32, object_open(fx.br, fx.reader, "w", 1, &r, err), -ENOENT));
	cr_assert(not(eq(ptr, strstr(err, "no version 1"), NULL)), "%s", err);
}

Test(object_core, a_reader_killed_drops_its_opens)
{
	struct bobject_version *v = publish(fx.writer, "w", 2 * MiB, "");
	char err[ERR_MSG_MAX] = "";

	open_obj(fx.reader, "w", 0);
	open_obj(fx.reader, "w", 0);
	cr_assert(eq(u32, import_record_of(fx.br, v->ex->id, fx.reader)->refs, 2));
	cr_assert(eq(i32, object_drop(fx.br, fx.writer, false, "w", 0, err), 0), "%s", err);
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 2 * MiB), "kept for its reader");
	cr_assert(eq(i32, object_open(fx.br, fx.writer, "w", 0, &v, err), -ENOENT),
		  "a dropped object opens no latest");
	broker_client_remove(fx.br, fx.reader);
	fx.reader = NULL;
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 0));
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 0), "back to the backend");
	cr_assert(eq(ptr, find(fx.br, "w"), NULL), "the object went with its last version");
}

Test(object_core, drop_of_one_version_and_of_the_object)
{
	char err[ERR_MSG_MAX] = "";
	struct bobject_version *v;

	publish(fx.writer, "w", 2 * MiB, "");
	publish(fx.writer, "w", 2 * MiB, "");
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 2 * MiB), "version 1 had no reader");
	cr_assert(eq(i32, object_drop(fx.br, fx.writer, false, "w", 1, err), -ENOENT));
	cr_assert(eq(i32, object_drop(fx.br, fx.writer, false, "w", 2, err), 0), "%s", err);
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 0));
	cr_assert(eq(ptr, find(fx.br, "w"), NULL));
	/* A name dropped is free again; its numbers start over with the new object. */
	v = publish(fx.writer, "w", 2 * MiB, "");
	cr_assert(eq(u64, v->version, 1));
	cr_assert(eq(i32, object_drop(fx.br, fx.writer, false, "nope", 0, err), -ENOENT));
}

Test(object_core, bad_input_is_refused_and_changes_nothing)
{
	struct balloc *a = alloc(fx.writer, 2 * MiB);
	struct bobject_version *v;
	uint8_t big[OBJECT_META_MAX + 1] = { 0 };
	char err[ERR_MSG_MAX] = "";
	static const char *const bad[] = { "",	 "a b",		  "x/y",  "1/",
					   "/x", "12345678901/x", "\xff", "a\nb" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert(eq(i32, object_publish(fx.br, fx.writer, bad[i], a->id, NULL, 0, &v, err),
			     -EINVAL),
			  "name '%s'", bad[i]);
	memset(err, 'x', 65);
	err[65] = 0;
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, err, a->id, NULL, 0, &v, err), -EINVAL),
		  "65 bytes");
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "ok", a->id, big, sizeof(big), &v, err),
		     -E2BIG));
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "ok", a->id + 99, NULL, 0, &v, err),
		     -ENOENT));
	cr_assert(eq(i32, object_publish(fx.br, fx.reader, "ok", a->id, NULL, 0, &v, err), -ENOENT),
		  "another client's allocation");
	cr_assert(eq(i32, lend_pause(fx.br, fx.writer, "w", false, err), 0), "%s", err);
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "ok", a->id, NULL, 0, &v, err), -EBUSY));
	cr_assert(eq(ptr, fx.br->objects ? fx.br->objects->objects : NULL, NULL),
		  "no object was left by a refusal");
	cr_assert(eq(i32, object_open(fx.br, fx.reader, "ok", 0, &v, err), -ENOENT));
	cr_assert(eq(u64, fx.writer->allocs.count, 1));
}

Test(object_core, another_uid_opens_only_by_grant)
{
	struct bclient *other = add_client(fx.br, "other", 102, getuid() + 1);
	struct bobject_version *v = publish(fx.writer, "w", 2 * MiB, "");
	struct import_export *ex;
	uint8_t h[IPC_HANDLE_SIZE];
	char name[64], err[ERR_MSG_MAX] = "";
	uint64_t range;

	snprintf(name, sizeof(name), "%u/w", (unsigned)getuid());
	cr_assert(eq(i32, object_open(fx.br, other, "w", 0, &v, err), -ENOENT), "its own uid's");
	cr_assert(eq(i32, object_open(fx.br, other, name, 0, &v, err), -EPERM));
	cr_assert(not(eq(ptr, strstr(err, "did not grant"), NULL)), "%s", err);
	/* Its handle, had it one, does not open either. */
	import_export_version_handle(fx.br, find(fx.br, "w")->versions->ex, h);
	cr_assert(eq(i32, import_open(fx.br, other, h, sizeof(h), &ex, &range, err), -EPERM));
	cr_assert(eq(i32, object_grant(fx.br, other, name, getuid() + 1, false, err), -EPERM),
		  "only the owner grants");
	cr_assert(eq(i32, object_grant(fx.br, fx.writer, "w", getuid(), false, err), -EINVAL));
	cr_assert(eq(i32, object_grant(fx.br, fx.writer, "w", getuid() + 1, false, err), 0), "%s",
		  err);
	v = open_obj(other, name, 0);
	cr_assert(eq(u64, v->version, 1));
	cr_assert(eq(i32, object_drop(fx.br, other, false, name, 0, err), -EPERM),
		  "a grantee reads, it does not drop");
	cr_assert(eq(i32, object_drop(fx.br, other, true, name, 0, err), 0), "an admin drops: %s",
		  err);
	cr_assert(eq(i32, object_grant(fx.br, fx.writer, "w", getuid() + 1, true, err), 0));
	for (uid_t u = 1; u <= OBJECT_MAX_GRANTS + 1; u++) {
		int rc;

		publish(fx.writer, "g", 2 * MiB, "");
		rc = object_grant(fx.br, fx.writer, "g", getuid() + 100 + u, false, err);
		cr_assert(eq(i32, rc, u <= OBJECT_MAX_GRANTS ? 0 : -ENOSPC), "grant %u",
			  (unsigned)u);
	}
}

Test(object_core, objects_per_uid_are_bounded)
{
	char name[16], err[ERR_MSG_MAX] = "";
	struct bobject_version *v;
	struct balloc *a;

	/* Objects as a record brings them before their versions: no memory needed. */
	for (int i = 0; i < OBJECT_MAX_PER_UID; i++) {
		struct object_restore ro = { .name = name, .uid = getuid(), .next_version = 1 };

		snprintf(name, sizeof(name), "o%d", i);
		cr_assert(eq(i32, object_restore(fx.br, &ro, err), 0), "%s", err);
	}
	a = alloc(fx.writer, 2 * MiB);
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "one-more", a->id, NULL, 0, &v, err),
		     -ENOSPC));
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "o7", a->id, NULL, 0, &v, err), 0),
		  "an existing name gets a version: %s", err);
	cr_assert(eq(i32, lend_free(fx.br, fx.writer, a->id, err), 0), "%s", err);
}

/* ---- the record ---- */

static void export_all(void)
{
	struct chunk *ch;
	uint64_t id;
	size_t it = 0;

	while (idmap_next(&fx.br->chunks, &it, &id, (void **)&ch)) {
		struct state_fd *f = &fx.fds[fx.nfds++];

		*f = (struct state_fd){ .id = id, .dev = ch->dev, .size = ch->size };
		cr_assert(eq(i32, fx.be->ops->chunk_export(fx.be, ch->handle, &f->fd), 0));
	}
}

static Gmb__State *state_now(void)
{
	Gmb__State *rec;
	uint8_t *buf;
	size_t len;

	cr_assert(eq(i32, state_encode(fx.br, &buf, &len), 0));
	rec = gmb__state__unpack(NULL, len, buf);
	cr_assert(not(eq(ptr, rec, NULL)));
	free(buf);
	return rec;
}

static void restore_rec(const Gmb__State *rec)
{
	size_t len = gmb__state__get_packed_size(rec);
	uint8_t *buf = malloc(len ? len : 1);
	struct state_stats st;

	cr_assert(not(eq(ptr, buf, NULL)));
	gmb__state__pack(rec, buf);
	export_all();
	fx.br2 = new_broker();
	cr_assert(eq(i32, state_restore(fx.br2, buf, len, fx.fds, fx.nfds, &st), 0));
	free(buf);
}

Test(object_core, the_record_brings_back_objects_versions_and_readers)
{
	struct bobject_version *v1 = publish(fx.writer, "w", 4 * MiB, "first"), *v2;
	struct bobject *o2;
	struct bobject_version *r;
	char err[ERR_MSG_MAX] = "";
	uint8_t h1[IPC_HANDLE_SIZE], h2[IPC_HANDLE_SIZE];
	struct import_export *ex;
	uint64_t range;
	Gmb__State *rec;

	open_obj(fx.reader, "w", 0);
	v2 = publish(fx.writer, "w", 2 * MiB, "second");
	cr_assert(eq(i32, object_grant(fx.br, fx.writer, "w", 4242, false, err), 0));
	import_export_version_handle(fx.br, v1->ex, h1);
	rec = state_now();
	restore_rec(rec);
	gmb__state__free_unpacked(rec, NULL);
	o2 = find(fx.br2, "w");
	cr_assert(not(eq(ptr, o2, NULL)));
	cr_assert(eq(u64, o2->latest, 2));
	cr_assert(eq(u64, o2->next_version, 3));
	cr_assert(eq(u32, o2->nversions, 2));
	cr_assert(eq(u32, o2->ngrants, 1));
	cr_assert(eq(u32, o2->grants[0], 4242));
	cr_assert(eq(u64, o2->versions->version, 1), "oldest first");
	cr_assert(not(o2->versions->held));
	cr_assert(eq(u32, o2->versions->ex->nimports, 1), "its reader came back");
	cr_assert(eq(u64, o2->versions->ex->chunks[0]->id, v1->ex->chunks[0]->id), "same chunks");
	cr_assert(eq(u32, o2->versions->next->meta_len, 6));
	cr_assert(eq(i32, memcmp(o2->versions->next->meta, "second", 6), 0));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 6 * MiB));
	cr_assert(eq(u64, broker_uid_chunks(fx.br2, getuid()), 3));
	/* The handle of before opens the same version now. */
	import_export_version_handle(fx.br2, o2->versions->ex, h2);
	cr_assert(eq(i32, memcmp(h1, h2, sizeof(h1)), 0), "handles stay valid across a restart");
	cr_assert(eq(i32,
		     object_open(fx.br2, broker_client_get(fx.br2, fx.writer->id), "w", 0, &r, err),
		     0));
	cr_assert(eq(u64, r->version, v2->version));
	cr_assert(eq(i32,
		     import_open(fx.br2, broker_client_get(fx.br2, fx.writer->id), h1, sizeof(h1),
				 &ex, &range, err),
		     0),
		  "%s", err);
	/* The reader reclaimed: version 1 goes, 2 stays with the object. */
	rejoin_reclaim(fx.br2, broker_client_get(fx.br2, fx.reader->id), "not back");
	rejoin_reclaim(fx.br2, broker_client_get(fx.br2, fx.writer->id), "not back");
	cr_assert(eq(u32, o2->nversions, 1));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 2 * MiB));
}

Test(object_core, a_damaged_record_restores_what_is_whole_and_leaks_nothing)
{
	Gmb__State *rec;
	struct bobject *o2;

	publish(fx.writer, "a", 2 * MiB, "");
	publish(fx.writer, "b", 2 * MiB, "");
	publish(fx.writer, "c", 2 * MiB, "");
	rec = state_now();
	cr_assert(eq(u64, rec->n_objects, 3));
	/* c: a version naming an export that is not a version's; b: its latest unheld. */
	for (size_t i = 0; i < rec->n_objects; i++) {
		Gmb__StateObject *so = rec->objects[i];

		if (strcmp(so->name, "c") == 0)
			so->versions[0]->export_id += 1000;
		if (strcmp(so->name, "b") == 0)
			so->versions[0]->held = false;
	}
	restore_rec(rec);
	gmb__state__free_unpacked(rec, NULL);
	o2 = find(fx.br2, "a");
	cr_assert(not(eq(ptr, o2, NULL)));
	cr_assert(eq(ptr, find(fx.br2, "b"), NULL), "a latest it does not hold is refused");
	cr_assert(eq(ptr, find(fx.br2, "c"), NULL), "a version without its export is dropped");
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 2 * MiB), "only a's chunks are held");
	cr_assert(eq(u64, fx.br2->pools[0].held_bytes, 2 * MiB), "the rest went back");
}

/* ---- pause and resume (the core's half; the copies are the handlers') ---- */

/* A host copy as a pause makes it: a memfd of @size bytes of @byte. */
static int copy_of(uint64_t size, int byte)
{
	int fd = memfd_create("test-copy", MFD_CLOEXEC);
	char *p;

	cr_assert(fd >= 0);
	cr_assert(eq(i32, ftruncate(fd, (off_t)size), 0));
	p = mmap(NULL, size, PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED);
	memset(p, byte, size);
	munmap(p, size);
	return fd;
}

Test(object_core, a_pause_gives_the_chunks_back_and_a_resume_takes_new_ones)
{
	struct bobject_version *v1 = publish(fx.writer, "w", 2 * MiB, ""), *v2, *r;
	struct bobject *o;
	char err[ERR_MSG_MAX] = "";
	int fds[2];

	open_obj(fx.reader, "w", 0);
	v2 = publish(fx.writer, "w", 4 * MiB, "");
	o = find(fx.br, "w");
	cr_assert(eq(i32, object_pause_find(fx.br, fx.writer, false, "w", true, &o, err), 1),
		  "resuming an active object does nothing");
	cr_assert(eq(i32, object_pause_find(fx.br, fx.reader, false, "w", false, &o, err), 0),
		  "the owner's uid pauses");
	cr_assert(eq(u32, object_mapped_readers(o), 1));
	cr_assert(eq(i32, import_unmapped(fx.br, fx.reader, v1->ex->id), 0), "the reader follows");
	cr_assert(eq(u32, object_mapped_readers(o), 0));
	fds[0] = copy_of(2 * MiB, 0x11);
	fds[1] = copy_of(4 * MiB, 0x22);
	cr_assert(eq(i32, object_pause_release(fx.br, o, fds, err), 0), "%s", err);
	cr_assert(eq(i32, fds[0], -1), "the copies are the versions' now");
	cr_assert(o->paused && !o->discarded);
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 0));
	cr_assert(eq(u64, fx.br->pools[0].held_bytes, 0), "back to the driver at once");
	cr_assert(eq(u64, broker_uid_chunks(fx.br, getuid()), 0));
	cr_assert(eq(i32, object_open(fx.br, fx.reader, "w", 0, &r, err), -EBUSY));
	cr_assert(eq(i32, import_remap(fx.br, fx.reader, v1->ex->id, &v1->ex, err), -EBUSY));
	cr_assert(eq(i32,
		     object_publish(fx.br, fx.writer, "w", alloc(fx.writer, 2 * MiB)->id, NULL, 0,
				    &r, err),
		     -EBUSY));
	cr_assert(eq(i32, object_pause_find(fx.br, fx.writer, false, "w", false, &o, err), 1));
	/* Resume: new chunks, both versions, the copies closed once done. */
	cr_assert(eq(i32, object_resume_take(fx.br, o, err), 0), "%s", err);
	cr_assert(eq(u32, v2->ex->nchunks, 2));
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 8 * MiB),
		  "6 MiB of versions, 2 of the writer");
	object_resume_done(fx.br, o);
	cr_assert(not(o->paused));
	cr_assert(eq(i32, v1->copy_fd, -1));
	cr_assert(eq(i32, import_remap(fx.br, fx.reader, v1->ex->id, &v1->ex, err), 0), "%s", err);
	cr_assert(eq(ptr, open_obj(fx.reader, "w", 0), v2));
}

Test(object_core, a_resume_past_the_budget_takes_nothing)
{
	struct bobject_version *v = publish(fx.writer, "w", 8 * MiB, "");
	struct bobject *o = find(fx.br, "w");
	char err[ERR_MSG_MAX] = "";
	struct balloc *big;

	cr_assert(eq(i32, object_pause_release(fx.br, o, NULL, err), 0), "%s", err);
	cr_assert(o->discarded);
	big = alloc(fx.writer, 60 * MiB);
	cr_assert(eq(i32, object_resume_take(fx.br, o, err), -ENOMEM));
	cr_assert(not(eq(ptr, strstr(err, "budget"), NULL)), "%s", err);
	cr_assert(eq(ptr, v->ex->chunks, NULL));
	cr_assert(o->paused);
	cr_assert(eq(i32, lend_free(fx.br, fx.writer, big->id, err), 0));
	cr_assert(eq(i32, object_resume_take(fx.br, o, err), 0), "%s", err);
	object_resume_done(fx.br, o);
}

Test(object_core, a_busy_object_keeps_a_version_its_last_reader_closed)
{
	struct bobject_version *v1 = publish(fx.writer, "w", 2 * MiB, "");
	struct bobject *o = find(fx.br, "w");
	char err[ERR_MSG_MAX] = "";

	open_obj(fx.reader, "w", 0);
	publish(fx.writer, "w", 2 * MiB, "");
	o->busy = true; /* as a job copying its bytes */
	cr_assert(eq(i32, object_drop(fx.br, fx.writer, false, "w", 0, err), -EBUSY));
	close_obj(fx.reader, v1);
	cr_assert(eq(u32, o->nversions, 2), "kept while the job may read it");
	object_job_end(fx.br, o);
	cr_assert(eq(u32, o->nversions, 1), "gone once the job ended");
}

Test(object_core, a_paused_object_comes_back_with_its_host_copies)
{
	struct bobject_version *v = publish(fx.writer, "w", 4 * MiB, "m");
	struct bobject *o = find(fx.br, "w"), *o2;
	char err[ERR_MSG_MAX] = "", buf[4];
	int fds[1] = { copy_of(4 * MiB, 0x5a) };
	Gmb__State *rec;

	publish(fx.writer, "d", 2 * MiB, "");
	cr_assert(eq(i32, object_pause_release(fx.br, o, fds, err), 0), "%s", err);
	cr_assert(eq(i32, object_pause_release(fx.br, find(fx.br, "d"), NULL, err), 0), "%s", err);
	/* The store's fds: the chunks (none left) and each copy. */
	fx.fds[fx.nfds++] = (struct state_fd){ .id = v->ex->id,
					       .dev = -1,
					       .size = 4 * MiB,
					       .fd = fcntl(v->copy_fd, F_DUPFD_CLOEXEC, 0),
					       .copy = true };
	rec = state_now();
	restore_rec(rec);
	o2 = find(fx.br2, "w");
	cr_assert(not(eq(ptr, o2, NULL)));
	cr_assert(o2->paused);
	cr_assert(not(o2->discarded));
	cr_assert(fx.nfds >= 1 && fx.fds[0].used, "the copy's fd was taken");
	cr_assert(o2->versions->copy_fd >= 0);
	cr_assert(eq(u64, o2->versions->copy_size, 4 * MiB));
	cr_assert(eq(i64, pread(o2->versions->copy_fd, buf, 4, 1000), 4));
	cr_assert(eq(i32, memcmp(buf, "\x5a\x5a\x5a\x5a", 4), 0), "the same bytes");
	cr_assert(find(fx.br2, "d") && find(fx.br2, "d")->discarded);
	/* Without its copy a paused object's bytes are lost: it is not restored. */
	broker_free(fx.br2);
	fx.br2 = NULL;
	for (size_t i = 0; i < fx.nfds; i++)
		close(fx.fds[i].fd);
	fx.nfds = 0;
	restore_rec(rec);
	gmb__state__free_unpacked(rec, NULL);
	cr_assert(eq(ptr, find(fx.br2, "w"), NULL), "no copy, no object");
	cr_assert(not(eq(ptr, find(fx.br2, "d"), NULL)), "a discarded one needs none");
}

Test(object_core, a_published_allocation_another_process_imported_shares_its_chunks)
{
	struct balloc *a = alloc(fx.writer, 4 * MiB);
	uint8_t h[IPC_HANDLE_SIZE];
	struct import_export *ex, *x2, *v2ex;
	struct bobject_version *v;
	struct bobject *o2;
	char err[ERR_MSG_MAX] = "";
	uint64_t range, xid;
	Gmb__State *rec;

	/* The reader imports the allocation through CUDA IPC, then it is published. */
	cr_assert(eq(i32, import_export(fx.br, fx.writer, a->id, 0, h, err), 0), "%s", err);
	cr_assert(eq(i32, import_open(fx.br, fx.reader, h, sizeof(h), &ex, &range, err), 0), "%s",
		  err);
	xid = ex->id;
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "w", a->id, NULL, 0, &v, err), 0), "%s",
		  err);
	cr_assert(eq(i32, lend_free(fx.br, fx.writer, a->id, err), 0), "%s", err);
	cr_assert(eq(u32, v->ex->chunks[0]->pins, 2), "both exports pin the chunks");
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 4 * MiB), "counted once");
	rec = state_now();
	restore_rec(rec);
	gmb__state__free_unpacked(rec, NULL);
	o2 = find(fx.br2, "w");
	cr_assert(not(eq(ptr, o2, NULL)), "the version came back beside the old export");
	x2 = (struct import_export *)import_find(fx.br2, xid);
	v2ex = o2->versions->ex;
	cr_assert(not(eq(ptr, x2, NULL)));
	cr_assert(eq(ptr, x2->chunks[0], v2ex->chunks[0]));
	cr_assert(eq(u32, v2ex->chunks[0]->pins, 2));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 4 * MiB));
	/* The IPC reader goes: the version keeps the chunks; dropped: they go. */
	rejoin_reclaim(fx.br2, broker_client_get(fx.br2, fx.reader->id), "not back");
	cr_assert(eq(u32, v2ex->chunks[0]->pins, 1));
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 4 * MiB));
	cr_assert(eq(i32,
		     object_drop(fx.br2, broker_client_get(fx.br2, fx.writer->id), false, "w", 0,
				 err),
		     0),
		  "%s", err);
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 0));
}

Test(object_core, a_publish_twice_and_a_writer_gone_before_publishing_leave_nothing_behind)
{
	struct balloc *b;
	struct bobject_version *v;
	uint64_t id = alloc(fx.writer, 2 * MiB)->id;
	char err[ERR_MSG_MAX] = "";

	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "w", id, NULL, 0, &v, err), 0), "%s",
		  err);
	cr_assert(eq(i32, lend_free(fx.br, fx.writer, id, err), 0), "%s", err);
	/* The allocation left at its publish: the same one again is no allocation. */
	cr_assert(eq(i32, object_publish(fx.br, fx.writer, "w", id, NULL, 0, &v, err), -ENOENT));
	cr_assert(eq(u32, find(fx.br, "w")->nversions, 1));
	/* A writer that dies with its allocation filled but unpublished: no version. */
	b = alloc(fx.writer, 4 * MiB);
	(void)b;
	broker_client_remove(fx.br, fx.writer);
	fx.writer = NULL;
	cr_assert(eq(u32, find(fx.br, "w")->nversions, 1));
	cr_assert(eq(u64, find(fx.br, "w")->latest, 1));
	cr_assert(eq(u64, fx.br->pools[0].lent_bytes, 2 * MiB), "only the version is held");
}

Test(object_core, a_restart_during_a_resume_finds_the_object_paused_with_its_copy)
{
	struct bobject_version *v = publish(fx.writer, "w", 4 * MiB, "");
	struct bobject *o = find(fx.br, "w"), *o2;
	char err[ERR_MSG_MAX] = "";
	int fds[1] = { copy_of(4 * MiB, 0x3c) };
	Gmb__State *rec;

	cr_assert(eq(i32, object_pause_release(fx.br, o, fds, err), 0), "%s", err);
	/* The resume took its chunks and copies: gmbd dies before it is done. */
	cr_assert(eq(i32, object_resume_take(fx.br, o, err), 0), "%s", err);
	o->busy = true;
	fx.fds[fx.nfds++] = (struct state_fd){ .id = v->ex->id,
					       .dev = -1,
					       .size = 4 * MiB,
					       .fd = fcntl(v->copy_fd, F_DUPFD_CLOEXEC, 0),
					       .copy = true };
	rec = state_now();
	restore_rec(rec);
	gmb__state__free_unpacked(rec, NULL);
	o2 = find(fx.br2, "w");
	cr_assert(not(eq(ptr, o2, NULL)), "the object was lost");
	cr_assert(o2->paused);
	cr_assert(eq(ptr, o2->versions->ex->chunks, NULL));
	cr_assert(o2->versions->copy_fd >= 0);
	cr_assert(eq(u64, fx.br2->pools[0].lent_bytes, 0), "the resume's chunks are not held");
	o->busy = false;
	object_resume_done(fx.br, o);
}
