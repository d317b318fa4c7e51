/*
 * test_wire.c - common/wire.c over real AF_UNIX SOCK_SEQPACKET sockets:
 * envelopes and fds arrive intact, every limit is refused with its code and
 * without leaking an fd, and the stream survives a refused packet.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/wire.h"

static int sp[2] = { -1, -1 };

static void wire_test_setup(void)
{
	cr_assert(eq(i32, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0));
}

static void wire_test_teardown(void)
{
	wire_close_fds(sp, 2);
}

TestSuite(wire, .init = wire_test_setup, .fini = wire_test_teardown, .timeout = 20);

static int count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	cr_assert(not(eq(ptr, d, NULL)));
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static int memfd_with(const char *text)
{
	int fd = memfd_create("wire-test", MFD_CLOEXEC);

	cr_assert(ge(i32, fd, 0));
	cr_assert(eq(i64, write(fd, text, strlen(text)), (long)strlen(text)));
	return fd;
}

/* A packed envelope whose fd_chunks claims @n fds. */
static size_t pack_claiming(uint64_t id, size_t n, uint8_t *buf)
{
	uint64_t chunks[WIRE_MAX_FDS] = { 0 };
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.id = id;
	env.n_fd_chunks = n;
	env.fd_chunks = chunks;
	return gmb__envelope__pack(&env, buf);
}

/* sendmsg() bypassing wire_send's checks, as a broken or hostile peer would. */
static void send_raw(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)] = { 0 };
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds > 0) {
		struct cmsghdr *c;

		msg.msg_control = cbuf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	cr_assert(eq(i64, sendmsg(sock, &msg, MSG_NOSIGNAL), (long)len));
}

static void send_id(int sock, uint64_t id)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.id = id;
	cr_assert(eq(i32, wire_send(sock, &env, NULL, 0), 0));
}

static void expect_id(int sock, uint64_t id)
{
	Gmb__Envelope *env = NULL;
	int fds[WIRE_MAX_FDS], nfds = -1;

	cr_assert(eq(i32, wire_recv(sock, &env, fds, &nfds), 0));
	cr_assert(eq(u64, env->id, id));
	cr_assert(eq(i32, nfds, 0));
	gmb__envelope__free_unpacked(env, NULL);
}

Test(wire, envelope_round_trips_with_body_and_fields)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT, *got = NULL;
	Gmb__Hello hello = GMB__HELLO__INIT;
	int fds[WIRE_MAX_FDS], nfds = -1;

	hello.version = GMB_PROTOCOL_VERSION;
	hello.name = "trainer-0";
	hello.control = 1;
	env.id = 42;
	env.reply_to = 7;
	env.status = -ENOMEM;
	env.error = "no memory for you";
	env.body_case = GMB__ENVELOPE__BODY_HELLO;
	env.hello = &hello;
	cr_assert(eq(i32, wire_send(sp[0], &env, NULL, 0), 0));
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), 0));
	cr_assert(eq(i32, nfds, 0));
	cr_assert(eq(u64, got->id, 42));
	cr_assert(eq(u64, got->reply_to, 7));
	cr_assert(eq(i32, got->status, -ENOMEM));
	cr_assert(eq(str, got->error, "no memory for you"));
	cr_assert(eq(i32, got->body_case, GMB__ENVELOPE__BODY_HELLO));
	cr_assert(eq(u32, got->hello->version, GMB_PROTOCOL_VERSION));
	cr_assert(eq(str, got->hello->name, "trainer-0"));
	cr_assert(eq(i32, got->hello->control, 1));
	gmb__envelope__free_unpacked(got, NULL);
}

Test(wire, pack_then_send_packed_is_the_same_packet)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	uint8_t *buf = NULL;
	size_t len = 0;

	env.id = 99;
	cr_assert(eq(i32, wire_pack(&env, &buf, &len), 0));
	cr_assert(eq(sz, len, gmb__envelope__get_packed_size(&env)));
	cr_assert(eq(i32, wire_send_packed(sp[0], buf, len, NULL, 0), 0));
	free(buf);
	expect_id(sp[1], 99);
}

Test(wire, passed_fds_refer_to_the_same_file_and_are_cloexec)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT, *got = NULL;
	uint64_t chunks[2] = { 11, 12 }, sizes[2] = { 4096, 4096 };
	int mine[2] = { memfd_with("first"), memfd_with("second") };
	int fds[WIRE_MAX_FDS], nfds = -1;
	char back[16] = { 0 };

	env.id = 1;
	env.n_fd_chunks = 2;
	env.fd_chunks = chunks;
	env.n_fd_sizes = 2;
	env.fd_sizes = sizes;
	cr_assert(eq(i32, wire_send(sp[0], &env, mine, 2), 0));
	/* The sender keeps its fds. */
	cr_assert(ge(i32, fcntl(mine[0], F_GETFD), 0));
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), 0));
	cr_assert(eq(i32, nfds, 2));
	cr_assert(eq(u64, got->fd_chunks[1], 12));
	cr_assert(eq(i32, fcntl(fds[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC));
	cr_assert(eq(i64, pread(fds[1], back, sizeof(back), 0), 6));
	cr_assert(eq(str, back, "second"));
	/* Written through the received fd, read through the sender's. */
	cr_assert(eq(i64, pwrite(fds[0], "FIRST", 5, 0), 5));
	cr_assert(eq(i64, pread(mine[0], back, 5, 0), 5));
	cr_assert(eq(i32, memcmp(back, "FIRST", 5), 0));
	gmb__envelope__free_unpacked(got, NULL);
	wire_close_fds(fds, nfds);
	cr_assert(eq(i32, fds[0], -1));
	wire_close_fds(mine, 2);
}

Test(wire, a_full_batch_of_253_fds_arrives_in_one_packet)
{
	int src = memfd_with("x"), mine[WIRE_MAX_FDS], fds[WIRE_MAX_FDS], nfds = -1;
	Gmb__Envelope *got = NULL;
	uint8_t buf[4096];
	struct stat a, b;
	size_t len;

	for (int i = 0; i < WIRE_MAX_FDS; i++)
		mine[i] = fcntl(src, F_DUPFD_CLOEXEC, 0);
	len = pack_claiming(5, WIRE_MAX_FDS, buf);
	cr_assert(eq(i32, wire_send_packed(sp[0], buf, len, mine, WIRE_MAX_FDS), 0));
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), 0));
	cr_assert(eq(i32, nfds, WIRE_MAX_FDS));
	cr_assert(eq(sz, got->n_fd_chunks, WIRE_MAX_FDS));
	cr_assert(eq(i32, fstat(src, &a), 0));
	for (int i = 0; i < nfds; i++) {
		cr_assert(eq(i32, fstat(fds[i], &b), 0));
		cr_assert(eq(u64, (uint64_t)b.st_ino, (uint64_t)a.st_ino));
	}
	gmb__envelope__free_unpacked(got, NULL);
	wire_close_fds(fds, nfds);
	wire_close_fds(mine, WIRE_MAX_FDS);
	close(src);
}

Test(wire, send_refuses_what_the_receiver_would_refuse)
{
	int fds[WIRE_MAX_FDS + 1] = { 0 };
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	char *big = malloc(WIRE_MAX_MSG + 1);
	uint8_t *buf = NULL;
	size_t len = 0;

	env.id = 1;
	cr_assert(eq(i32, wire_send(sp[0], &env, fds, WIRE_MAX_FDS + 1), -EMSGSIZE));
	memset(big, 'a', WIRE_MAX_MSG);
	big[WIRE_MAX_MSG] = 0;
	env.error = big;
	cr_assert(eq(i32, wire_send(sp[0], &env, NULL, 0), -EMSGSIZE));
	cr_assert(eq(i32, wire_pack(&env, &buf, &len), -EMSGSIZE));
	cr_assert(eq(ptr, buf, NULL));
	free(big);
	/* An all-default envelope packs to zero bytes, which reads as end of stream. */
	env = (Gmb__Envelope)GMB__ENVELOPE__INIT;
	cr_assert(eq(i32, wire_send(sp[0], &env, NULL, 0), -EINVAL));
	/* Nothing was sent by any of the refusals. */
	cr_assert(eq(i64, recv(sp[1], buf, 1, MSG_DONTWAIT), -1));
	cr_assert(eq(i32, errno, EAGAIN));
}

Test(wire, oversized_packet_is_consumed_refused_and_the_next_one_arrives)
{
	size_t big = WIRE_MAX_MSG + 1024;
	uint8_t *junk = calloc(1, big);
	int fd = memfd_with("x"), fds[WIRE_MAX_FDS], nfds = -1, before;
	Gmb__Envelope *got = (Gmb__Envelope *)1;

	send_raw(sp[0], junk, big, &fd, 1);
	close(fd);
	send_id(sp[0], 8);
	before = count_open_fds();
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -EMSGSIZE));
	cr_assert(eq(ptr, got, NULL));
	cr_assert(eq(i32, nfds, 0));
	/* The fd that rode with it was closed, not leaked. */
	cr_assert(eq(i32, count_open_fds(), before));
	expect_id(sp[1], 8);
	free(junk);
}

Test(wire, garbage_is_a_protocol_error_and_the_stream_goes_on)
{
	/* An 11-byte varint: longer than any protobuf varint may be. */
	static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
					0xff, 0xff, 0xff, 0xff, 0xff };
	int fds[WIRE_MAX_FDS], nfds = -1;
	Gmb__Envelope *got = NULL;

	send_raw(sp[0], junk, sizeof(junk), NULL, 0);
	send_id(sp[0], 9);
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -EPROTO));
	cr_assert(eq(ptr, got, NULL));
	expect_id(sp[1], 9);
}

Test(wire, fd_count_mismatch_is_refused_and_received_fds_are_closed)
{
	int mine[2] = { memfd_with("a"), memfd_with("b") };
	int fds[WIRE_MAX_FDS], nfds = -1, before;
	Gmb__Envelope *got = NULL;
	uint8_t buf[256];
	size_t len;

	len = pack_claiming(3, 1, buf);
	send_raw(sp[0], buf, len, mine, 2);
	/* And the other way: the envelope names an fd that did not come. */
	send_raw(sp[0], buf, len, NULL, 0);
	before = count_open_fds();
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -EPROTO));
	cr_assert(eq(i32, nfds, 0));
	cr_assert(eq(ptr, got, NULL));
	cr_assert(eq(i32, count_open_fds(), before));
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -EPROTO));
	cr_assert(eq(i32, count_open_fds(), before));
	wire_close_fds(mine, 2);
}

/* How many more fds this process can open under its RLIMIT_NOFILE. */
static int free_fd_slots(void)
{
	int fds[64], n = 0;

	while (n < 64 && (fds[n] = dup(0)) >= 0)
		n++;
	cr_assert(eq(i32, errno, EMFILE));
	for (int i = 0; i < n; i++)
		close(fds[i]);
	return n;
}

Test(wire, lost_fds_are_a_protocol_error_and_the_survivors_are_closed)
{
	int mine[16], fds[WIRE_MAX_FDS], nfds = -1, before, room;
	Gmb__Envelope *got = NULL;
	struct rlimit rl;
	uint8_t buf[256];

	for (int i = 0; i < 16; i++)
		mine[i] = memfd_with("x");
	/* Fds are numbered lowest first, so below mine[15] no number is free. */
	cr_assert(eq(i32, getrlimit(RLIMIT_NOFILE, &rl), 0));
	rl.rlim_cur = (rlim_t)mine[15] + 1;
	cr_assert(eq(i32, setrlimit(RLIMIT_NOFILE, &rl), 0));
	wire_close_fds(mine + 12, 4);
	room = free_fd_slots();
	cr_assert(gt(i32, room, 0));
	cr_assert(lt(i32, room, 8));
	/*
	 * Room for a few fds only: the kernel installs what fits and sets
	 * MSG_CTRUNC. The envelope names exactly the fds that fit, so only
	 * MSG_CTRUNC tells that some were lost.
	 */
	send_raw(sp[0], buf, pack_claiming(4, (size_t)room, buf), mine, 8);
	before = count_open_fds();
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -EPROTO));
	cr_assert(eq(i32, nfds, 0));
	cr_assert(eq(i32, free_fd_slots(), room));
	cr_assert(eq(i32, count_open_fds(), before));
	wire_close_fds(mine, 12);
}

Test(wire, end_of_stream_is_connreset)
{
	int fds[WIRE_MAX_FDS], nfds = -1;
	Gmb__Envelope *got = NULL;

	send_id(sp[0], 1);
	close(sp[0]);
	sp[0] = -1;
	/* Queued packets are still delivered before the end. */
	expect_id(sp[1], 1);
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -ECONNRESET));
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -ECONNRESET));
}

Test(wire, nonblocking_socket_with_nothing_queued_is_eagain)
{
	int fds[WIRE_MAX_FDS], nfds = -1;
	Gmb__Envelope *got = NULL;

	cr_assert(eq(i32, fcntl(sp[1], F_SETFL, O_NONBLOCK), 0));
	cr_assert(eq(i32, wire_recv(sp[1], &got, fds, &nfds), -EAGAIN));
	send_id(sp[0], 2);
	expect_id(sp[1], 2);
}

static void temp_socket_path(char *path, size_t len)
{
	char dir[] = "/tmp/gmb-wire-XXXXXX";

	cr_assert(not(eq(ptr, mkdtemp(dir), NULL)));
	snprintf(path, len, "%s/gmbd.sock", dir);
}

/* @lfd accepts @c's waiting connection, and a message with @id crosses it. */
static void expect_link(int lfd, int c, uint64_t id)
{
	int a = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

	cr_assert(ge(i32, a, 0));
	send_id(c, id);
	expect_id(a, id);
	close(a);
}

/* Connects to @path and checks that @lfd accepts that connection. */
static void expect_accepts(int lfd, const char *path)
{
	int c = -1;

	cr_assert(eq(i32, wire_connect(path, &c), 0));
	cr_assert(eq(i32, fcntl(c, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC));
	expect_link(lfd, c, 77);
	close(c);
}

/* wire_listen's liveness probe is a real connection: the listener sees it end at once. */
static void expect_probe_ended(int lfd)
{
	int fds[WIRE_MAX_FDS], nfds = -1, probe = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	Gmb__Envelope *got = NULL;

	cr_assert(ge(i32, probe, 0));
	cr_assert(eq(i32, wire_recv(probe, &got, fds, &nfds), -ECONNRESET));
	close(probe);
}

Test(wire, listen_replaces_a_stale_socket_file)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int old, lfd = -1;
	char path[108];

	temp_socket_path(path, sizeof(path));
	strcpy(addr.sun_path, path);
	/* A crashed daemon leaves its socket file behind. */
	old = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	cr_assert(eq(i32, bind(old, (struct sockaddr *)&addr, sizeof(addr)), 0));
	close(old);
	cr_assert(eq(i32, wire_listen(path, &lfd), 0));
	cr_assert(eq(i32, fcntl(lfd, F_GETFL) & O_NONBLOCK, O_NONBLOCK));
	expect_accepts(lfd, path);
	close(lfd);
	unlink(path);
}

Test(wire, listen_on_a_live_socket_is_eaddrinuse_and_leaves_it_working)
{
	int lfd = -1, second = -1;
	char path[108];

	temp_socket_path(path, sizeof(path));
	cr_assert(eq(i32, wire_listen(path, &lfd), 0));
	cr_assert(eq(i32, wire_listen(path, &second), -EADDRINUSE));
	cr_assert(eq(i32, second, -1));
	expect_probe_ended(lfd);
	expect_accepts(lfd, path);
	close(lfd);
	unlink(path);
}

Test(wire, listen_never_removes_a_file_that_is_not_a_socket)
{
	char path[108];
	struct stat st;
	int fd, lfd = -1;

	temp_socket_path(path, sizeof(path));
	fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	cr_assert(ge(i32, fd, 0));
	close(fd);
	cr_assert(eq(i32, wire_listen(path, &lfd), -EADDRINUSE));
	cr_assert(eq(i32, stat(path, &st), 0));
	cr_assert(eq(i32, S_ISREG(st.st_mode), 1));
	unlink(path);
}

Test(wire, paths_too_long_or_missing_are_refused)
{
	char path[200];
	int fd = -1;

	memset(path, 'a', sizeof(path) - 1);
	path[0] = '/';
	path[sizeof(path) - 1] = 0;
	cr_assert(eq(i32, wire_listen(path, &fd), -ENAMETOOLONG));
	cr_assert(eq(i32, wire_connect(path, &fd), -ENAMETOOLONG));
	cr_assert(eq(i32, wire_listen("", &fd), -EINVAL));
	cr_assert(eq(i32, wire_connect("/nonexistent-gmb/gmbd.sock", &fd), -ENOENT));
	cr_assert(eq(i32, fd, -1));
}

Test(wire, default_socket_honours_gmb_socket)
{
	unsetenv("GMB_SOCKET");
	cr_assert(eq(str, (char *)wire_default_socket(), "/run/gmbd/gmbd.sock"));
	setenv("GMB_SOCKET", "/tmp/x.sock", 1);
	cr_assert(eq(str, (char *)wire_default_socket(), "/tmp/x.sock"));
	setenv("GMB_SOCKET", "", 1);
	cr_assert(eq(str, (char *)wire_default_socket(), "/run/gmbd/gmbd.sock"));
}

/* The reconnect socket: blocking once connected, both timeouts set; a full backlog: -EAGAIN. */
Test(wire, connect_timed_sets_timeouts_and_never_waits_for_backlog_room)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct timeval tv = { 0 };
	socklen_t len = sizeof(tv);
	int lfd, first = -1, second = -1;
	char path[108];

	temp_socket_path(path, sizeof(path));
	strcpy(addr.sun_path, path);
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	cr_assert(eq(i32, bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0));
	/* Backlog 0: one connection may wait for accept, the next finds it full. */
	cr_assert(eq(i32, listen(lfd, 0), 0));
	cr_assert(eq(i32, wire_connect_timed(path, 7, &first), 0));
	cr_assert(eq(i32, fcntl(first, F_GETFL) & O_NONBLOCK, 0));
	cr_assert(eq(i32, fcntl(first, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC));
	cr_assert(eq(i32, getsockopt(first, SOL_SOCKET, SO_RCVTIMEO, &tv, &len), 0));
	cr_assert(eq(i64, (int64_t)tv.tv_sec, 7));
	cr_assert(eq(i32, getsockopt(first, SOL_SOCKET, SO_SNDTIMEO, &tv, &len), 0));
	cr_assert(eq(i64, (int64_t)tv.tv_sec, 7));
	cr_assert(eq(i32, wire_connect_timed(path, 7, &second), -EAGAIN));
	cr_assert(eq(i32, second, -1));
	expect_link(lfd, first, 78);
	close(first);
	close(lfd);
	cr_assert(eq(i32, wire_connect_timed(path, 7, &second), -ECONNREFUSED));
	unlink(path);
	cr_assert(eq(i32, wire_connect_timed(path, 7, &second), -ENOENT));
}
