/*
 * test_badinput.c - hostile and broken clients against a real gmbd: each is
 * answered with an error or dropped alone, the daemon keeps serving a
 * well-behaved client, and its open fds come back to where they started.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/wire.h"
#include "include/gmb.h"
#include "tests/raw_client.h"
#include "tests/util.h"

#define MiB (1024ULL * 1024)

static struct gmbd_proc gmbd;
static gmb_client *good;
static void *good_ptr;
static int fds_at_start;

static void start(void)
{
	/* No warm pool: every freed chunk goes back, so fd counts compare exactly. */
	static const char *const args[] = { "--host-memory", "1GiB", "--pool-keep", "0",
					    "--log-level",   "err",  NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "good", &good), 0));
	cr_assert(eq(i32, gmb_malloc(good, &good_ptr, 4 * MiB, 0, "kv"), 0));
	memset(good_ptr, 0x77, 4 * MiB);
	fds_at_start = proc_count_fds(gmbd.pid);
	cr_assert(gt(i32, fds_at_start, 0));
}

static int fds_back(void *arg)
{
	return proc_count_fds(gmbd.pid) == fds_at_start;
}

/* After every test: the good client still works, nothing leaked. */
static void stop(void)
{
	cr_expect(eq(i32, gmb_pause(good, "kv"), 0), "good client served: %s",
		  gmb_last_error(good));
	cr_expect(eq(i32, gmb_resume(good, "kv"), 0));
	cr_expect(eq(i32, wait_until(fds_back, NULL, 2000), 0), "daemon fds %d, at start %d",
		  proc_count_fds(gmbd.pid), fds_at_start);
	gmb_close(good);
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly (leak or crash)");
}

TestSuite(badinput, .init = start, .fini = stop, .timeout = 60);

static int raw_connect(void)
{
	int fd = -1;

	cr_assert(eq(i32, raw_client_connect(gmbd.sock, &fd), 0));
	return fd;
}

/* True when the daemon closed this connection (EOF within 2 s). */
static int dropped(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char buf[WIRE_MAX_MSG];

	for (int i = 0; i < 20; i++) {
		if (poll(&p, 1, 100) <= 0)
			continue;
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return 1;
	}
	return 0;
}

static void send_env(int fd, Gmb__Envelope *env)
{
	cr_assert(eq(i32, raw_client_send(fd, env), 0));
}

/* Sends a request and returns the status of its (last) reply. */
static int request(int fd, Gmb__Envelope *env, char *error, size_t cap)
{
	int status;

	cr_assert(eq(i32, raw_client_request(fd, env, &status, error, cap), 0));
	return status;
}

static int hello(int fd, uint32_t version)
{
	int status;

	cr_assert(eq(i32, raw_client_hello(fd, version, &status), 0));
	return status;
}

Test(badinput, garbage_bytes_drop_only_that_client)
{
	int fd = raw_connect();

	cr_assert(eq(i64, send(fd, "\xff\xff\xff\xff garbage", 13, 0), 13));
	cr_assert(dropped(fd));
	close(fd);
}

Test(badinput, truncated_message_is_dropped)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__Hello h = GMB__HELLO__INIT;
	uint8_t *buf;
	size_t len;
	int fd = raw_connect();

	h.version = GMB_PROTOCOL_VERSION;
	h.name = "a-name-long-enough-to-cut";
	env.id = 1;
	env.body_case = GMB__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	cr_assert(eq(i32, wire_pack(&env, &buf, &len), 0));
	cr_assert(eq(i64, send(fd, buf, len - 5, 0), (ssize_t)len - 5));
	free(buf);
	cr_assert(dropped(fd));
	close(fd);
}

Test(badinput, oversized_message_is_refused)
{
	size_t len = WIRE_MAX_MSG + 4096;
	char *big = calloc(1, len);
	int fd = raw_connect(), sz = 1 << 20;

	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	cr_assert(eq(i64, send(fd, big, len, 0), (ssize_t)len));
	free(big);
	cr_assert(dropped(fd));
	close(fd);
}

Test(badinput, request_before_hello_and_version_mismatch)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest st = GMB__STATUS_REQUEST__INIT;
	int fd = raw_connect();

	env.id = 7;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &st;
	send_env(fd, &env);
	cr_assert(dropped(fd), "status before hello");
	close(fd);

	fd = raw_connect();
	cr_assert(eq(i32, hello(fd, 999), -EPROTO));
	cr_assert(dropped(fd));
	close(fd);
}

Test(badinput, fds_from_a_client_are_a_protocol_error)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest st = GMB__STATUS_REQUEST__INIT;
	uint64_t ids[2] = { 1, 2 };
	int fd = raw_connect(), devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

	cr_assert(eq(i32, hello(fd, GMB_PROTOCOL_VERSION), 0));
	env.id = 2;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &st;
	env.n_fd_chunks = 2; /* says two, carries one */
	env.fd_chunks = ids;
	cr_assert(eq(i32, wire_send(fd, &env, &devnull, 1), 0));
	cr_assert(dropped(fd));
	close(fd);

	fd = raw_connect();
	cr_assert(eq(i32, hello(fd, GMB_PROTOCOL_VERSION), 0));
	env.n_fd_chunks = 1; /* consistent, but clients never send fds */
	cr_assert(eq(i32, wire_send(fd, &env, &devnull, 1), 0));
	cr_assert(dropped(fd));
	close(fd);
	close(devnull);
}

Test(badinput, unknown_ids_sizes_and_tags_are_answered)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;
	Gmb__FreeRequest f = GMB__FREE_REQUEST__INIT;
	Gmb__PauseRequest p = GMB__PAUSE_REQUEST__INIT;
	char error[512];
	int fd = raw_connect();

	cr_assert(eq(i32, hello(fd, GMB_PROTOCOL_VERSION), 0));
	env.id = 10;
	env.body_case = GMB__ENVELOPE__BODY_FREE;
	env.free = &f;
	f.alloc_id = 424242;
	cr_assert(eq(i32, request(fd, &env, error, sizeof(error)), -ENOENT));
	cr_assert(ne(sz, strlen(error), 0), "a reason comes with the refusal");

	env.body_case = GMB__ENVELOPE__BODY_ALLOC;
	env.alloc = &a;
	a.tag = "t";
	a.size = 0;
	cr_assert(eq(i32, request(fd, &env, error, sizeof(error)), -EINVAL), "zero size");
	a.size = 1ULL << 62;
	cr_assert(lt(i32, request(fd, &env, error, sizeof(error)), 0), "huge size");
	a.size = 2 * MiB;
	a.device = 99;
	cr_assert(eq(i32, request(fd, &env, error, sizeof(error)), -ENODEV));
	a.device = 0;
	a.tag = "";
	cr_assert(eq(i32, request(fd, &env, error, sizeof(error)), -EINVAL), "empty tag");

	env.body_case = GMB__ENVELOPE__BODY_PAUSE;
	env.pause = &p;
	p.tag = "never-made";
	cr_assert(eq(i32, request(fd, &env, error, sizeof(error)), -ENOENT));
	close(fd);
}

Test(badinput, double_free_on_the_wire)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT, *r = NULL;
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;
	Gmb__FreeRequest f = GMB__FREE_REQUEST__INIT;
	int fds[WIRE_MAX_FDS], nfds, fd = raw_connect();

	cr_assert(eq(i32, hello(fd, GMB_PROTOCOL_VERSION), 0));
	env.id = 20;
	env.body_case = GMB__ENVELOPE__BODY_ALLOC;
	env.alloc = &a;
	a.tag = "t";
	a.size = 2 * MiB;
	send_env(fd, &env);
	for (;;) { /* fd parts, then the reply */
		cr_assert(eq(i32, wire_recv(fd, &r, fds, &nfds), 0));
		wire_close_fds(fds, nfds);
		if (!r->more)
			break;
		gmb__envelope__free_unpacked(r, NULL);
	}
	cr_assert(eq(i32, r->status, 0));
	cr_assert(eq(i32, r->body_case, GMB__ENVELOPE__BODY_ALLOC_REPLY));
	f.alloc_id = r->alloc_reply->lend->alloc_id;
	gmb__envelope__free_unpacked(r, NULL);

	env.id = 21;
	env.body_case = GMB__ENVELOPE__BODY_FREE;
	env.free = &f;
	cr_assert(eq(i32, request(fd, &env, NULL, 0), 0));
	env.id = 22;
	cr_assert(eq(i32, request(fd, &env, NULL, 0), -ENOENT), "second free");
	close(fd);
}

Test(badinput, reply_to_nothing_is_dropped)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	int fd = raw_connect();

	cr_assert(eq(i32, hello(fd, GMB_PROTOCOL_VERSION), 0));
	env.reply_to = 12345;
	send_env(fd, &env);
	cr_assert(dropped(fd));
	close(fd);
}

Test(badinput, many_clients_connect_and_vanish)
{
	for (int i = 0; i < 200; i++) {
		int fd = raw_connect();

		if (i % 2)
			cr_assert(eq(i32, hello(fd, GMB_PROTOCOL_VERSION), 0));
		close(fd);
	}
}
