/*
 * test_object_restart.c - named objects across restarts of gmbd: a real
 * gmbd (host backend) played by the fake service manager as
 * test_ipc_restart.c does (listening socket kept, fd store handed back,
 * SIGKILL in between), its clients in this process (libgmb reconnects and
 * claims what it maps).
 *
 * What must hold: an object outlives its publisher and every restart, its
 * readers go on reading and new ones open it with the same bytes; a
 * version a reader holds past a newer publish comes back with that reader;
 * a paused object's bytes live in the fd store (objcopy.*) and come back
 * with a resume after the restart, at the readers' same addresses; drops
 * give the memory back, the store's copies with it.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/gmb.h"
#include "tests/util.h"

#define MiB	(1ULL << 20)
#define WAIT_MS 10000

static struct sd_gmbd fx;

static const char *const gmbd_args[] = { "--host-devices", "1",		  "--host-memory",
					 "32MiB",	   "--max-chunk", "4MiB",
					 "--rejoin-grace", "5",		  "--log-level",
					 "info",	   NULL };

static void gmbd_up(void)
{
	cr_assert(eq(i32, sd_gmbd_up(&fx, gmbd_args, WAIT_MS), 0), "gmbd did not say READY=1");
}

static void gmbd_restart(void)
{
	cr_assert(eq(i32, sd_gmbd_kill(&fx), 0));
	cr_assert(eq(i32, fake_sd_count(&fx.sd, "state"), 1), "no record in the store");
	gmbd_up();
}

static void setup(void)
{
	cr_assert(eq(i32, sd_gmbd_open(&fx, "/tmp/gmbobjrs.XXXXXX", true), 0));
	gmbd_up();
}

static void teardown(void)
{
	sd_gmbd_close(&fx, SIGTERM);
}

TestSuite(object_restart, .init = setup, .fini = teardown, .timeout = 90);

static gmb_client *client(const char *name)
{
	gmb_client *c = NULL;

	cr_assert(eq(i32, gmb_connect(fx.gmbd.sock, name, &c), 0), "%s", gmb_last_error(NULL));
	return c;
}

/* @c publishes @size bytes of @byte as @name; the version, its pointer in *@p. */
static uint64_t publish(gmb_client *c, const char *name, size_t size, int byte, void **p)
{
	uint64_t v = 0;

	cr_assert(eq(i32, gmb_malloc(c, p, size, 0, "w"), 0), "%s", gmb_last_error(c));
	memset(*p, byte, size);
	cr_assert(eq(i32, gmb_object_publish(c, name, *p, "d", 1, &v), 0), "%s", gmb_last_error(c));
	return v;
}

static void *open_obj(gmb_client *c, const char *name, uint64_t version, uint64_t *got)
{
	struct gmb_object_info info;
	void *p = NULL;

	cr_assert(eq(i32, gmb_object_open(c, name, version, &p, &info, NULL, 0), 0), "%s",
		  gmb_last_error(c));
	if (got)
		*got = info.version;
	return p;
}

static bool every_byte(const void *p, size_t size, int byte)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < size; i += 4096)
		if (b[i] != byte)
			return false;
	return b[size - 1] == byte;
}

/* gmbd's status as JSON (the caller frees it). */
static char *status(gmb_client *c)
{
	char *json = NULL;

	cr_assert(eq(i32, gmb_status_json(c, &json), 0), "%s", gmb_last_error(c));
	return json;
}

static bool status_has(gmb_client *c, const char *needle)
{
	char *json = status(c);
	bool has = strstr(json, needle) != NULL;

	if (!has)
		cr_log_info("status: %s", json);
	free(json);
	return has;
}

/*
 * The fd store's entries named @prefix, once the fake manager has read
 * everything gmbd sent before: gmbd's FDSTORE= datagrams precede its
 * reply, but the fake's thread may not have read them yet; a SYNC= sent
 * now queues behind them on the same socket.
 */
static int store_count(const char *prefix)
{
	cr_assert(eq(i32, fake_sd_sync(&fx.sd), 0), "the fake service manager did not sync");
	return fake_sd_count(&fx.sd, prefix);
}

Test(object_restart, an_object_outlives_its_publisher_and_every_restart)
{
	gmb_client *w = client("writer"), *r = client("reader"), *r2;
	void *pw, *pr, *p2;
	uint64_t v;

	cr_assert(eq(u64, publish(w, "weights", 8 * MiB, 0x5a, &pw), 1));
	pr = open_obj(r, "weights", 0, &v);
	cr_assert(eq(u64, v, 1));
	gmbd_restart();
	cr_assert(every_byte(pr, 8 * MiB, 0x5a), "the reader's mapping went");
	/* A new reader after the restart: the same version, the same bytes. */
	r2 = client("reader2");
	p2 = open_obj(r2, "weights", 0, &v);
	cr_assert(eq(u64, v, 1));
	cr_assert(every_byte(p2, 8 * MiB, 0x5a));
	cr_assert(status_has(r2, "\"name\":\"weights\""), "not listed after the restart");
	/* The publisher goes, and gmbd again: the object stays. */
	gmb_close(w);
	gmbd_restart();
	cr_assert(eq(i32, gmb_object_close(r2, p2), 0), "%s", gmb_last_error(r2));
	p2 = open_obj(r2, "weights", 0, &v);
	cr_assert(every_byte(p2, 8 * MiB, 0x5a));
	cr_assert(eq(i32, gmb_object_close(r2, p2), 0));
	cr_assert(eq(i32, gmb_object_close(r, pr), 0));
	cr_assert(eq(i32, gmb_object_drop(r2, "weights", 0), 0), "%s", gmb_last_error(r2));
	cr_assert(status_has(r2, "\"objects\":[]"), "dropped, still listed");
	gmb_close(r2);
	gmb_close(r);
}

Test(object_restart, an_old_version_comes_back_with_its_reader)
{
	gmb_client *w = client("writer"), *r = client("reader");
	void *p1, *p2, *pr;
	uint64_t v;

	publish(w, "w", 4 * MiB, 0x11, &p1);
	pr = open_obj(r, "w", 0, &v);
	cr_assert(eq(u64, v, 1));
	cr_assert(eq(u64, publish(w, "w", 4 * MiB, 0x22, &p2), 2));
	gmbd_restart();
	cr_assert(every_byte(pr, 4 * MiB, 0x11), "the reader of 1 reads 1");
	cr_assert(every_byte(open_obj(w, "w", 1, &v), 4 * MiB, 0x11), "1 opens while read");
	cr_assert(every_byte(open_obj(r, "w", 0, &v), 4 * MiB, 0x22), "latest is 2");
	cr_assert(eq(u64, v, 2));
	gmb_close(w);
	gmb_close(r);
	/* Every reader gone: version 1 went; 2 stays with the object. */
	r = client("reader");
	cr_assert(eq(i32, gmb_object_open(r, "w", 1, &pr, NULL, NULL, 0), -ENOENT));
	cr_assert(eq(i32, gmb_object_drop(r, "w", 0), 0));
	gmb_close(r);
}

Test(object_restart, a_paused_object_keeps_its_bytes_in_the_store_and_resumes_after)
{
	gmb_client *w = client("writer"), *r = client("reader"), *op = client("operator");
	void *pw, *pr, *again;
	uint64_t v;

	publish(w, "w", 8 * MiB, 0x77, &pw);
	cr_assert(eq(i32, gmb_object_close(w, pw), 0));
	pr = open_obj(r, "w", 0, &v);
	cr_assert(eq(i32, gmb_object_pause(op, "w", 0), 0), "%s", gmb_last_error(op));
	cr_assert(eq(i32, store_count("objcopy."), 1), "the copy is not in the store");
	cr_assert(status_has(op, "\"paused\":true"), "not shown paused");
	gmbd_restart();
	cr_assert(eq(i32, store_count("objcopy."), 1), "the copy left the store");
	cr_assert(status_has(op, "\"paused\":true"), "not paused after the restart");
	cr_assert(eq(i32, gmb_object_open(op, "w", 0, &again, NULL, NULL, 0), -EBUSY));
	cr_assert(eq(i32, gmb_object_resume(op, "w"), 0), "%s", gmb_last_error(op));
	cr_assert(every_byte(pr, 8 * MiB, 0x77), "the reader's address, the same bytes");
	cr_assert(eq(i32, store_count("objcopy."), 0), "the copy outlived the resume");
	cr_assert(eq(i32, gmb_object_close(r, pr), 0));
	cr_assert(eq(i32, gmb_object_drop(op, "w", 0), 0));
	gmb_close(op);
	gmb_close(r);
	gmb_close(w);
}
