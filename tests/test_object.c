/*
 * test_object.c - named objects through libgmb against a real gmbd (host
 * backend, tests/ipc_fx.c's): a publish gives an allocation to a name and
 * another client process opening it reads its bytes; the publisher's
 * pointer stays readable and a write to it faults; publishing again moves
 * the latest while a reader keeps its version; close, drop, grants; the
 * refusals (unknown names and versions, bad names, a description too big,
 * gmb_free of a published pointer).
 *
 * Readers run in child processes (a process of their own, a client of
 * their own), fresh execs of this program (ipcfx_child(): a fork alone
 * could hang on a lock a thread of the test's clients held): they report
 * by exit status, the line of their first failed check, since Criterion's
 * asserts belong to the test's own process. Only a write to the
 * publisher's own pointer is a plain fork (obj_touch): it needs the
 * mapping and calls nothing.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/ipc_fx.h"

TestSuite(object, .init = ipcfx_start, .fini = ipcfx_stop, .timeout = 60);

static gmb_client *obj_connect(const char *name)
{
	gmb_client *c = NULL;

	cr_assert(eq(i32, gmb_connect(ipcfx_gmbd.sock, name, &c), 0), "%s", gmb_last_error(NULL));
	return c;
}

/* @size bytes of gmbd memory in tag "obj", every byte @byte (host memory: the CPU writes it). */
static void *obj_alloc(gmb_client *c, size_t size, int byte)
{
	void *p = NULL;

	cr_assert(eq(i32, gmb_malloc(c, &p, size, 0, "obj"), 0), "%s", gmb_last_error(c));
	memset(p, byte, size);
	return p;
}

static uint64_t obj_publish(gmb_client *c, const char *name, void *p, const char *meta)
{
	uint64_t v = 0;

	cr_assert(eq(i32, gmb_object_publish(c, name, p, meta, meta ? strlen(meta) : 0, &v), 0),
		  "%s", gmb_last_error(c));
	cr_assert(gt(u64, v, 0));
	return v;
}

/* Is every byte of [p, p+size) @byte? */
static bool obj_all(const void *p, size_t size, int byte)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < size; i++)
		if (b[i] != (uint8_t)byte)
			return false;
	return true;
}

/* A child's check: its line number is the exit status. */
#define CHILD_CHECK(x)                                                                    \
	do {                                                                              \
		if (!(x)) {                                                               \
			fprintf(stderr, "child: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, \
				gmb_last_error(NULL));                                    \
			return __LINE__ & 0xff ? __LINE__ & 0xff : 1;                     \
		}                                                                         \
	} while (0)

struct obj_expect {
	const char *name;
	uint64_t version; /* asked (0: the latest) */
	uint64_t want_version;
	size_t size;
	int byte;
	const char *meta;
	bool write; /* and then write to it: the child should die of SIGSEGV */
};

/* @e as a child's argument: "NAME VERSION WANT SIZE BYTE WRITE:META". */
static void obj_expect_encode(const struct obj_expect *e, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s %" PRIu64 " %" PRIu64 " %zu %d %d:%s", e->name, e->version,
		 e->want_version, e->size, e->byte, e->write ? 1 : 0, e->meta);
}

/* The child's side: @e from @arg, its strings in @name and at the end of @arg. */
static bool obj_expect_parse(const char *arg, struct obj_expect *e, char name[96])
{
	int write = 0, at = -1;

	if (sscanf(arg, "%95s %" SCNu64 " %" SCNu64 " %zu %d %d:%n", name, &e->version,
		   &e->want_version, &e->size, &e->byte, &write, &at) != 6 ||
	    at < 0)
		return false;
	e->name = name;
	e->write = write;
	e->meta = arg + at;
	return true;
}

/* A reader of its own (@arg: an encoded struct obj_expect): open, check
 * what the publisher said, close. */
static int obj_reader(const char *arg)
{
	struct obj_expect ex, *e = &ex;
	struct gmb_object_info info;
	char name[96];
	char meta[64] = "";
	gmb_client *c = NULL;
	void *p = NULL;

	CHILD_CHECK(obj_expect_parse(arg, e, name));
	CHILD_CHECK(gmb_connect(ipcfx_gmbd.sock, "reader", &c) == 0);
	CHILD_CHECK(gmb_object_open(c, e->name, e->version, &p, &info, meta, sizeof(meta)) == 0);
	CHILD_CHECK(info.version == e->want_version);
	CHILD_CHECK(info.size == e->size);
	CHILD_CHECK(info.device == 0);
	CHILD_CHECK(info.owner_uid == (uint32_t)getuid());
	CHILD_CHECK(info.meta_len == strlen(e->meta));
	CHILD_CHECK(memcmp(meta, e->meta, info.meta_len) == 0);
	CHILD_CHECK(obj_all(p, e->size, e->byte));
	if (e->write) {
		signal(SIGSEGV, SIG_DFL); /* the fault kills, whatever a sanitizer installed */
		*(volatile uint8_t *)p = 1;
	}
	CHILD_CHECK(gmb_object_close(c, p) == 0);
	CHILD_CHECK(gmb_object_close(c, p) == -ENXIO);
	gmb_close(c);
	return 0;
}

/* The wait status of a reader child of @e. */
static int obj_reader_child(const struct obj_expect *e)
{
	char arg[256];

	obj_expect_encode(e, arg, sizeof(arg));
	return ipcfx_child("reader", arg);
}

static void obj_expect_reader(const struct obj_expect *e)
{
	int st = obj_reader_child(e);

	cr_assert(eq(i32, st, 0), "the reader failed at line %d (wait status 0x%x)",
		  WIFEXITED(st) ? WEXITSTATUS(st) : -1, st);
}

Test(object, a_publish_is_read_by_another_process)
{
	gmb_client *a = obj_connect("publisher");
	void *p = obj_alloc(a, 4 * MiB, 0x5a);
	struct obj_expect e = {
		.name = "w1", .want_version = 1, .size = 4 * MiB, .byte = 0x5a, .meta = "layout"
	};
	char uid_name[64];

	cr_assert(eq(u64, obj_publish(a, "w1", p, "layout"), 1));
	obj_expect_reader(&e);
	e.version = 1;
	obj_expect_reader(&e);
	/* Its owner's uid names it too. */
	snprintf(uid_name, sizeof(uid_name), "%u/w1", (unsigned)getuid());
	e.name = uid_name;
	obj_expect_reader(&e);
	cr_assert(eq(i32, gmb_object_close(a, p), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_drop(a, "w1", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

/* The wait status of a plain fork that writes one byte at @p: the mapping
 * is read-only, so it never returns. A fork, not ipcfx_child(), as the
 * mapping is this process's; the child calls nothing that could take a
 * lock (no libgmb, no allocation). */
static int obj_writer(void *p)
{
	int st = 0;
	pid_t pid = fork();

	cr_assert(ge(i32, pid, 0));
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		*(volatile uint8_t *)p = 1;
		_exit(0);
	}
	cr_assert(eq(i32, waitpid(pid, &st, 0), pid));
	return st;
}

Test(object, writes_to_a_version_fault_for_the_publisher_and_the_reader)
{
	gmb_client *a = obj_connect("publisher");
	uint8_t *p = obj_alloc(a, 2 * MiB, 0x33);
	struct obj_expect e = { .name = "ro",
				.want_version = 1,
				.size = 2 * MiB,
				.byte = 0x33,
				.meta = "",
				.write = true };
	int st;

	obj_publish(a, "ro", p, NULL);
	cr_assert(eq(int, obj_all(p, 2 * MiB, 0x33), 1), "still mapped, the same bytes");
	st = obj_writer(p);
	cr_assert(eq(int, WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, 1),
		  "the publisher's write: wait status 0x%x", st);
	st = obj_reader_child(&e);
	cr_assert(eq(int, WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, 1),
		  "the reader's write: wait status 0x%x", st);
	/* The reader's write never reached the bytes. */
	e.write = false;
	obj_expect_reader(&e);
	/* No longer an allocation: gmb_free refuses it and says what to do. */
	cr_assert(eq(i32, gmb_free(a, p), -EINVAL));
	cr_assert(not(eq(ptr, strstr(gmb_last_error(a), "gmb_object_close"), NULL)), "%s",
		  gmb_last_error(a));
	cr_assert(eq(int, obj_all(p, 2 * MiB, 0x33), 1));
	/* gmb_ipc_close works on it too (an import underneath). */
	cr_assert(eq(i32, gmb_ipc_close(a, p), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_close(a, p), -ENXIO));
	cr_assert(eq(i32, gmb_object_drop(a, "ro", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

/* Opens the version's handle (@arg: its bytes in hex) with plain
 * gmb_ipc_open, reads, writes. */
static int obj_ipc_open_and_write(const char *arg)
{
	uint8_t h[GMB_IPC_HANDLE_SIZE];
	gmb_client *c = NULL;
	void *q = NULL;

	CHILD_CHECK(strlen(arg) == 2 * sizeof(h));
	for (size_t i = 0; i < sizeof(h); i++)
		CHILD_CHECK(sscanf(arg + 2 * i, "%2hhx", &h[i]) == 1);
	CHILD_CHECK(gmb_connect(ipcfx_gmbd.sock, "plain", &c) == 0);
	CHILD_CHECK(gmb_ipc_open(c, h, -1, &q) == 0);
	CHILD_CHECK(obj_all(q, 2 * MiB, 0x44));
	signal(SIGSEGV, SIG_DFL);
	*(volatile uint8_t *)q = 1;
	return 0;
}

Test(object, a_versions_handle_opened_with_gmb_ipc_open_maps_read_only)
{
	gmb_client *a = obj_connect("publisher");
	uint8_t *p = obj_alloc(a, 2 * MiB, 0x44);
	uint8_t h[GMB_IPC_HANDLE_SIZE];
	char hex[2 * GMB_IPC_HANDLE_SIZE + 1];
	int st;

	obj_publish(a, "plain", p, NULL);
	/* The publisher's pointer is its open of the version: its handle is the version's. */
	cr_assert(eq(i32, gmb_ipc_get_handle(a, p, h), 0), "%s", gmb_last_error(a));
	cr_assert(eq(int, gmb_ipc_is_handle(h), 1));
	for (size_t i = 0; i < sizeof(h); i++)
		snprintf(hex + 2 * i, 3, "%02x", h[i]);
	st = ipcfx_child("ipc-open-and-write", hex);
	cr_assert(eq(int, WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, 1),
		  "gmbd says it is a version (read_only): wait status 0x%x", st);
	cr_assert(eq(int, obj_all(p, 2 * MiB, 0x44), 1));
	cr_assert(eq(i32, gmb_object_close(a, p), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_drop(a, "plain", 0), 0), "%s", gmb_last_error(a));
	gmb_close(a);
}

Test(object, a_new_version_is_the_latest_while_a_reader_keeps_its_own)
{
	gmb_client *a = obj_connect("publisher"), *r = obj_connect("reader");
	struct gmb_object_info info;
	void *p1 = obj_alloc(a, 2 * MiB, 0x11), *p2, *q1 = NULL, *q1b = NULL, *q2 = NULL;
	struct obj_expect e = {
		.name = "m", .want_version = 2, .size = 4 * MiB, .byte = 0x22, .meta = "two"
	};

	cr_assert(eq(u64, obj_publish(a, "m", p1, "one"), 1));
	cr_assert(eq(i32, gmb_object_open(r, "m", 0, &q1, &info, NULL, 0), 0), "%s",
		  gmb_last_error(r));
	cr_assert(eq(u64, info.version, 1));
	cr_assert(eq(u64, info.meta_len, 3), "the length, even with no room for it");
	p2 = obj_alloc(a, 4 * MiB, 0x22);
	cr_assert(eq(u64, obj_publish(a, "m", p2, "two"), 2));
	obj_expect_reader(&e);
	cr_assert(eq(i32, gmb_object_open(r, "m", 0, &q2, &info, NULL, 0), 0), "%s",
		  gmb_last_error(r));
	cr_assert(eq(u64, info.version, 2));
	cr_assert(eq(int, obj_all(q2, 4 * MiB, 0x22), 1));
	cr_assert(eq(int, obj_all(q1, 2 * MiB, 0x11), 1), "version 1 is still read");
	/* Version 1 opened again: the same mapping, one more open. */
	cr_assert(eq(i32, gmb_object_open(r, "m", 1, &q1b, &info, NULL, 0), 0), "%s",
		  gmb_last_error(r));
	cr_assert(eq(ptr, q1b, q1));
	cr_assert(eq(u64, info.version, 1));
	cr_assert(eq(i32, gmb_object_close(r, q1), 0));
	cr_assert(eq(int, obj_all(q1, 2 * MiB, 0x11), 1), "one open left");
	cr_assert(eq(i32, gmb_object_close(r, q1), 0));
	cr_assert(eq(i32, gmb_object_close(r, q1), -ENXIO));
	/* The publisher closes its own version 1: nobody has it, it goes. */
	cr_assert(eq(i32, gmb_object_close(a, p1), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_open(r, "m", 1, &q1, NULL, NULL, 0), -ENOENT));
	cr_assert(eq(i32, gmb_object_close(r, q2), 0));
	cr_assert(eq(i32, gmb_object_close(a, p2), 0));
	/* Still the latest, held by its name with no process mapping it. */
	e.write = false;
	obj_expect_reader(&e);
	cr_assert(eq(i32, gmb_object_drop(a, "m", 0), 0), "%s", gmb_last_error(a));
	gmb_close(r);
	gmb_close(a);
}

/* Publishes @arg's name and exits without closing anything. */
static int obj_publish_and_exit(const char *arg)
{
	gmb_client *c = NULL;
	uint64_t v = 0;
	void *p = NULL;

	CHILD_CHECK(gmb_connect(ipcfx_gmbd.sock, "short-lived", &c) == 0);
	CHILD_CHECK(gmb_malloc(c, &p, 2 * MiB, 0, "obj") == 0);
	memset(p, 0x77, 2 * MiB);
	CHILD_CHECK(gmb_object_publish(c, arg, p, "x", 1, &v) == 0);
	CHILD_CHECK(v == 1);
	return 0;
}

Test(object, a_version_outlives_its_publisher)
{
	gmb_client *r = obj_connect("reader");
	struct obj_expect e = {
		.name = "kept", .want_version = 1, .size = 2 * MiB, .byte = 0x77, .meta = "x"
	};

	cr_assert(eq(i32, ipcfx_child("publish-and-exit", "kept"), 0));
	obj_expect_reader(&e);
	cr_assert(eq(i32, gmb_object_drop(r, "kept", 0), 0), "%s", gmb_last_error(r));
	cr_assert(eq(i32, gmb_object_drop(r, "kept", 0), -ENOENT));
	gmb_close(r);
}

Test(object, drops_leave_what_readers_have_open)
{
	gmb_client *a = obj_connect("publisher"), *r = obj_connect("reader");
	void *p1 = obj_alloc(a, 2 * MiB, 0x01), *p2, *q = NULL, *q2 = NULL;
	struct gmb_object_info info;

	obj_publish(a, "d", p1, NULL);
	p2 = obj_alloc(a, 2 * MiB, 0x02);
	obj_publish(a, "d", p2, NULL);
	cr_assert(eq(i32, gmb_object_close(a, p1), 0));
	cr_assert(eq(i32, gmb_object_close(a, p2), 0));
	cr_assert(eq(i32, gmb_object_open(r, "d", 2, &q, NULL, NULL, 0), 0), "%s",
		  gmb_last_error(r));
	/* Version 2 dropped: no latest now, its reader still reads it. */
	cr_assert(eq(i32, gmb_object_drop(a, "d", 2), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_drop(a, "d", 2), -ENOENT), "held no more");
	cr_assert(eq(i32, gmb_object_open(r, "d", 0, &q2, NULL, NULL, 0), -ENOENT));
	cr_assert(eq(int, obj_all(q, 2 * MiB, 0x02), 1));
	/* By its number it opens while a reader holds it (as a superseded one does). */
	cr_assert(eq(i32, gmb_object_open(r, "d", 2, &q2, NULL, NULL, 0), 0), "%s",
		  gmb_last_error(r));
	cr_assert(eq(ptr, q2, q));
	cr_assert(eq(i32, gmb_object_close(r, q2), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "d", 9), -ENOENT));
	cr_assert(eq(i32, gmb_object_drop(a, "d", 0), 0), "%s", gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_open(r, "d", 0, &q2, &info, NULL, 0), -ENOENT));
	cr_assert(eq(int, obj_all(q, 2 * MiB, 0x02), 1));
	cr_assert(eq(i32, gmb_object_close(r, q), 0));
	/* Its last reader closed: the version went. */
	cr_assert(eq(i32, gmb_object_open(r, "d", 2, &q2, NULL, NULL, 0), -ENOENT));
	gmb_close(r);
	gmb_close(a);
}

Test(object, unknown_names_and_versions_are_enoent)
{
	gmb_client *a = obj_connect("publisher");
	void *p = obj_alloc(a, 2 * MiB, 0), *q = NULL;
	char other[64];

	cr_assert(eq(i32, gmb_object_open(a, "nope", 0, &q, NULL, NULL, 0), -ENOENT));
	cr_assert(not(eq(str, (char *)gmb_last_error(a), "")));
	cr_assert(eq(i32, gmb_object_drop(a, "nope", 0), -ENOENT));
	cr_assert(eq(i32, gmb_object_grant(a, "nope", 12345, 0), -ENOENT));
	obj_publish(a, "one", p, NULL);
	cr_assert(eq(i32, gmb_object_open(a, "one", 2, &q, NULL, NULL, 0), -ENOENT));
	/* Another uid's name that does not exist: the same answer. */
	snprintf(other, sizeof(other), "%u/one", (unsigned)getuid() + 4242);
	cr_assert(eq(i32, gmb_object_open(a, other, 0, &q, NULL, NULL, 0), -ENOENT));
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "one", 0), 0));
	gmb_close(a);
}

Test(object, bad_names_are_einval_and_touch_nothing)
{
	static const char *const bad[] = { "",	    "a b", "x/",   "/x", "a/b",
					   "1/2/3", "ü",   "a\tb", "1/", "..-/x" };
	char long_name[80], own[32];
	gmb_client *a = obj_connect("publisher");
	void *p = obj_alloc(a, 4 * MiB, 0), *q = NULL;
	uint64_t v = 0;

	memset(long_name, 'n', 65);
	long_name[65] = 0;
	for (size_t i = 0; i <= sizeof(bad) / sizeof(bad[0]); i++) {
		const char *n = i < sizeof(bad) / sizeof(bad[0]) ? bad[i] : long_name;

		cr_assert(eq(i32, gmb_object_open(a, n, 0, &q, NULL, NULL, 0), -EINVAL), "%s", n);
		cr_assert(eq(i32, gmb_object_publish(a, n, p, NULL, 0, NULL), -EINVAL), "%s", n);
		cr_assert(eq(i32, gmb_object_drop(a, n, 0), -EINVAL), "%s", n);
		cr_assert(eq(i32, gmb_object_grant(a, n, 1, 0), -EINVAL), "%s", n);
	}
	cr_assert(eq(i32, gmb_object_open(a, NULL, 0, &q, NULL, NULL, 0), -EINVAL));
	/* One publishes under one's own uid only, by the bare name. */
	snprintf(own, sizeof(own), "%u/x", (unsigned)getuid());
	cr_assert(eq(i32, gmb_object_publish(a, own, p, NULL, 0, NULL), -EINVAL));
	/* Not an allocation's base. */
	cr_assert(eq(i32, gmb_object_publish(a, "x", (char *)p + 2 * MiB, NULL, 0, NULL), -EINVAL));
	cr_assert(eq(i32, gmb_object_publish(a, "x", &v, NULL, 0, NULL), -EINVAL));
	cr_assert(eq(i32, gmb_object_publish(a, "x", NULL, NULL, 0, NULL), -EINVAL));
	/* Still an allocation of the client's, writable: nothing was published. */
	memset(p, 0x66, 4 * MiB);
	long_name[64] = 0; /* 64 bytes: the longest name */
	cr_assert(eq(u64, obj_publish(a, long_name, p, NULL), 1));
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, long_name, 0), 0));
	gmb_close(a);
}

Test(object, a_description_past_the_limit_is_e2big_and_one_at_it_reads_back)
{
	gmb_client *a = obj_connect("publisher");
	void *p = obj_alloc(a, 2 * MiB, 0x10), *q = NULL;
	char *meta = malloc(GMB_OBJECT_META_MAX + 1), *back = calloc(1, GMB_OBJECT_META_MAX);
	struct gmb_object_info info;
	uint64_t v = 0;

	cr_assert(not(eq(ptr, meta, NULL)));
	cr_assert(not(eq(ptr, back, NULL)));
	for (size_t i = 0; i <= GMB_OBJECT_META_MAX; i++)
		meta[i] = (char)(i * 7);
	cr_assert(eq(i32, gmb_object_publish(a, "big", p, meta, GMB_OBJECT_META_MAX + 1, &v),
		     -E2BIG));
	cr_assert(eq(u64, v, 0));
	cr_assert(eq(i32, gmb_object_publish(a, "big", p, NULL, 4, &v), -EINVAL));
	cr_assert(eq(i32, gmb_object_publish(a, "big", p, meta, GMB_OBJECT_META_MAX, &v), 0), "%s",
		  gmb_last_error(a));
	cr_assert(eq(i32, gmb_object_open(a, "big", 0, &q, &info, back, GMB_OBJECT_META_MAX), 0),
		  "%s", gmb_last_error(a));
	cr_assert(eq(ptr, q, p), "the publisher's own open");
	cr_assert(eq(u64, info.meta_len, GMB_OBJECT_META_MAX));
	cr_assert(eq(int, memcmp(back, meta, GMB_OBJECT_META_MAX), 0));
	cr_assert(eq(i32, gmb_object_close(a, q), 0));
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "big", 0), 0));
	free(meta);
	free(back);
	gmb_close(a);
}

/* As uid 65534: open @arg ("UID/NAME"); the exit status is -errno. */
static int obj_open_as_nobody(const char *arg)
{
	gmb_client *c = NULL;
	void *p = NULL;
	int rc;

	if (setgid(65534) || setuid(65534))
		return 100;
	CHILD_CHECK(gmb_connect(ipcfx_gmbd.sock, "nobody", &c) == 0);
	rc = gmb_object_open(c, arg, 0, &p, NULL, NULL, 0);
	if (rc == 0 && !obj_all(p, 2 * MiB, 0x42))
		return 101;
	if (rc == -EPERM && !strstr(gmb_last_error(c), "owner") &&
	    !strstr(gmb_last_error(c), "uid"))
		return 102;
	return -rc;
}

Test(object, another_uid_opens_only_once_granted)
{
	gmb_client *a = obj_connect("publisher");
	void *p = obj_alloc(a, 2 * MiB, 0x42);
	char name[64];
	int st;

	if (getuid() != 0) {
		gmb_close(a);
		cr_skip_test("needs root to run a reader as another uid");
	}
	obj_publish(a, "shared", p, NULL);
	snprintf(name, sizeof(name), "%u/shared", (unsigned)getuid());
	st = ipcfx_child("open-as-nobody", name);
	cr_assert(eq(int, WIFEXITED(st) ? WEXITSTATUS(st) : -1, EPERM), "not granted: 0x%x", st);
	cr_assert(eq(i32, gmb_object_grant(a, "shared", getuid(), 0), -EINVAL), "the owner's");
	cr_assert(eq(i32, gmb_object_grant(a, "shared", 65534, 0), 0), "%s", gmb_last_error(a));
	st = ipcfx_child("open-as-nobody", name);
	cr_assert(eq(i32, st, 0), "granted: 0x%x", st);
	cr_assert(eq(i32, gmb_object_grant(a, "shared", 65534, 1), 0), "%s", gmb_last_error(a));
	st = ipcfx_child("open-as-nobody", name);
	cr_assert(eq(int, WIFEXITED(st) ? WEXITSTATUS(st) : -1, EPERM), "revoked: 0x%x", st);
	cr_assert(eq(i32, gmb_object_close(a, p), 0));
	cr_assert(eq(i32, gmb_object_drop(a, "shared", 0), 0));
	gmb_close(a);
}

/* This program run as one of the children above (ipcfx_child()). */
__attribute__((constructor)) static void obj_child_main(void)
{
	static const struct ipcfx_child_def defs[] = {
		{ "reader", obj_reader },
		{ "ipc-open-and-write", obj_ipc_open_and_write },
		{ "publish-and-exit", obj_publish_and_exit },
		{ "open-as-nobody", obj_open_as_nobody },
	};

	ipcfx_child_main(defs, sizeof(defs) / sizeof(defs[0]));
}
