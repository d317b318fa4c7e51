/*
 * fuzz_daemon.c - gmbd's input path under a fuzzer: packets from three
 * client sockets go through the real transport (sessions adopted by a server
 * without a listener), the real handlers and dispatch table, and the real
 * core over the host backend (2 devices of 32 MiB, 2 MiB granularity, 4 MiB
 * chunks), all on a real uv loop. Before the packets, a restored record
 * (daemon/persist/state.c) makes an orphan of this very process (its pid and
 * uid), so that a rejoin hello and its claim reach the rejoin code.
 *
 * Input: records, each one byte (op in the low 3 bits, socket above) and
 * what the op needs:
 *   0-3  a packet: 2 bytes length, then the bytes, sent as they are
 *   4    answer every request gmbd sent on that socket (drops, control
 *        commands) with the status of the next byte (0 or a negative errno)
 *   5    a packet as 0-3, with an fd attached (clients never send fds)
 *   6    hang up that socket and connect a new one
 *   7    let the loop settle once more (below)
 * After each record the loop turns until it has nothing left to do now (8
 * turns at most), and every packet gmbd sent is read (its fds closed) after
 * each turn.
 *
 * Handles: gmbd's handles carry a random instance id and token, which no
 * input can know. So an IpcOpenRequest whose 64-byte handle has both all
 * zero is sent with those of the last handle gmbd exported (read from its
 * IpcExportReply) instead, the rest of the fuzzer's bytes kept: opens then
 * reach past the identity check, and every other field stays the fuzzer's.
 *
 * After each record and at the end: the core's counters recomputed
 * (fuzz_check_broker); at the end, with every socket closed, every byte lent
 * belongs to an orphan still waiting, the loop closes (uv_loop_close() == 0)
 * and the process has the fds it had before the input.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/backend/backend.h"
#include "common/ipc_handle.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/handlers.h"
#include "daemon/persist/state.h"
#include "daemon/transport/server.h"
#include "tests/fuzz/fuzz.h"
#include "tests/handlers_fx.h"

#define MiB	     (1ULL << 20)
#define FD_NSOCK     3
#define FD_MAX_DREQS 32
#define FD_ORPHAN_ID 7
#define FD_NCHUNKS   4
#define FD_MAX_TURNS 8

struct fd_sock {
	int fd;			      /* the client's end; -1: none */
	bool eof;		      /* gmbd hung up: nothing more to read */
	uint64_t dreqs[FD_MAX_DREQS]; /* gmbd's requests not answered yet */
	int ndreqs;
};

static struct hfx fx;
static struct fd_sock fd_socks[FD_NSOCK];
/* The instance id (bytes 8-15) and token (52-63) of the last handle gmbd exported. */
static uint8_t fd_handle[IPC_HANDLE_SIZE];
static bool fd_have_handle;

static void fd_setup(void);
static void fd_teardown(void);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	log_max_level = getenv("GMB_FUZZ_LOG") ? LOG_LVL_DEBUG : LOG_LVL_ERR - 1;
	/* libuv opens a few fds once per process (its signal pipe): before any
	 * input is counted. */
	fd_setup();
	fd_teardown();
	return 0;
}

static void fd_sock_open(struct fd_sock *s)
{
	int r;

	s->ndreqs = 0;
	s->fd = -1;
	s->eof = false;
	r = hfx_client(&fx, &s->fd);
	if (r < 0)
		fuzz_fail("cannot connect a client: %s", strerror(-r));
}

/* Reads everything gmbd sent on @s; remembers its requests. */
static void fd_take_handle(const uint8_t *h)
{
	memcpy(fd_handle, h, IPC_HANDLE_SIZE);
	fd_have_handle = true;
}

static void fd_sock_drain(struct fd_sock *s)
{
	Gmb__Envelope *env;
	int fds[WIRE_MAX_FDS], nfds, r;

	for (;;) {
		env = NULL;
		nfds = 0;
		r = wire_recv(s->fd, &env, fds, &nfds);
		if (r == -ECONNRESET)
			s->eof = true;
		if (r < 0)
			break;
		wire_close_fds(fds, nfds);
		if (env->body_case == GMB__ENVELOPE__BODY_IPC_EXPORT_REPLY &&
		    env->ipc_export_reply->handle.len == IPC_HANDLE_SIZE)
			fd_take_handle(env->ipc_export_reply->handle.data);
		/* A named object's version is opened by the handle gmbd gives too. */
		if (env->body_case == GMB__ENVELOPE__BODY_OBJECT_PUBLISH_REPLY &&
		    env->object_publish_reply->handle.len == IPC_HANDLE_SIZE)
			fd_take_handle(env->object_publish_reply->handle.data);
		if (env->body_case == GMB__ENVELOPE__BODY_OBJECT_OPEN_REPLY &&
		    env->object_open_reply->handle.len == IPC_HANDLE_SIZE)
			fd_take_handle(env->object_open_reply->handle.data);
		if (env->id && env->reply_to == 0 && s->ndreqs < FD_MAX_DREQS)
			s->dreqs[s->ndreqs++] = env->id;
		gmb__envelope__free_unpacked(env, NULL);
	}
}

/* One poll(2) for the three sockets: only those with something are read. A
 * socket gmbd hung up stays readable (EOF) until it is replaced: skipped. */
static void fd_drain_all(void)
{
	struct pollfd pfd[FD_NSOCK];
	struct fd_sock *of[FD_NSOCK];
	nfds_t n = 0;

	for (int k = 0; k < FD_NSOCK; k++) {
		if (fd_socks[k].fd < 0 || fd_socks[k].eof)
			continue;
		pfd[n] = (struct pollfd){ .fd = fd_socks[k].fd, .events = POLLIN };
		of[n++] = &fd_socks[k];
	}
	if (n == 0 || poll(pfd, n, 0) <= 0)
		return;
	for (nfds_t i = 0; i < n; i++)
		if (pfd[i].revents)
			fd_sock_drain(of[i]);
}

/* One turn of the loop, then what gmbd sent is read. */
static void fd_turn(void)
{
	uv_run(&fx.loop, UV_RUN_NOWAIT);
	fd_drain_all();
}

/*
 * Turns the loop until nothing is left to do now (no callback pending, no
 * handle closing, no timer due: uv_backend_timeout() is not 0), at least
 * once, at most FD_MAX_TURNS times. A fixed count of turns spent most of an
 * input turning an idle loop.
 */
static void fd_settle(void)
{
	for (int i = 0; i < FD_MAX_TURNS; i++) {
		fd_turn();
		if (uv_backend_timeout(&fx.loop) != 0)
			break;
	}
}

static void fd_send(struct fd_sock *s, const uint8_t *buf, size_t len, bool with_fd)
{
	char zero = 0;
	struct iovec iov = { .iov_base = len ? (void *)buf : &zero, .iov_len = len ? len : 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	int memfd = -1;

	if (with_fd) {
		memfd = memfd_create("fuzz-client-fd", MFD_CLOEXEC);
		if (memfd < 0)
			fuzz_fail("memfd_create: %s", strerror(errno));
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
	}
	/* A full socket drains as the loop turns; a closed one takes nothing. */
	for (int i = 0; i < 64 && sendmsg(s->fd, &mh, MSG_NOSIGNAL) < 0 && errno == EAGAIN; i++)
		fd_turn();
	if (memfd >= 0)
		close(memfd);
}

static bool fd_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/*
 * @buf as it goes out: an IpcOpenRequest with a zero instance and token
 * gets the last exported handle's (header comment); anything else, or a
 * packet that does not decode, unchanged. Return: the length in @out.
 */
static size_t fd_with_handle(const uint8_t *buf, size_t len, uint8_t *out)
{
	Gmb__Envelope *env;
	uint8_t *h;
	size_t n = 0;

	if (!fd_have_handle || len > WIRE_MAX_MSG)
		return 0;
	env = gmb__envelope__unpack(NULL, len, buf);
	if (!env)
		return 0;
	h = env->body_case == GMB__ENVELOPE__BODY_IPC_OPEN ? env->ipc_open->handle.data : NULL;
	if (h && env->ipc_open->handle.len == IPC_HANDLE_SIZE && fd_zero(h + 8, 8) &&
	    fd_zero(h + 52, IPC_HANDLE_TOKEN)) {
		memcpy(h + 8, fd_handle + 8, 8);
		memcpy(h + 52, fd_handle + 52, IPC_HANDLE_TOKEN);
		n = gmb__envelope__get_packed_size(env);
		n = n <= WIRE_MAX_MSG ? gmb__envelope__pack(env, out) : 0;
	}
	gmb__envelope__free_unpacked(env, NULL);
	return n;
}

static void fd_answer(struct fd_sock *s, int status)
{
	for (int i = 0; i < s->ndreqs; i++) {
		Gmb__Envelope env = GMB__ENVELOPE__INIT;

		env.reply_to = s->dreqs[i];
		env.status = status;
		wire_send(s->fd, &env, NULL, 0);
	}
	s->ndreqs = 0;
}

/* A chunk fd as the service manager would hand it back. */
static int fd_memfd(uint64_t size)
{
	int fd = memfd_create("gmb-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		fuzz_fail("memfd for a stored chunk: %s", strerror(errno));
	return fd;
}

/*
 * The orphan: this process as client 7 before a restart, with tag "w"
 * (preserve, active: allocation 5 over chunks 1 and 2) and tag "kv"
 * (paused: allocation 6, last lend chunk 3); chunk 4 free in the pool.
 */
static void fd_restore_orphan(void)
{
	Gmb__StateChunk ch[FD_NCHUNKS], *pch[FD_NCHUNKS];
	Gmb__StateAlloc a5 = GMB__STATE_ALLOC__INIT, a6 = GMB__STATE_ALLOC__INIT;
	Gmb__StateAlloc *pa5 = &a5, *pa6 = &a6;
	Gmb__StateTag tw = GMB__STATE_TAG__INIT, tkv = GMB__STATE_TAG__INIT,
		      *ptags[2] = { &tw, &tkv };
	Gmb__StateClient cl = GMB__STATE_CLIENT__INIT, *pcl = &cl;
	Gmb__State st = GMB__STATE__INIT;
	uint64_t ids5[] = { 1, 2 }, ids6[] = { 3 };
	struct state_fd fds[FD_NCHUNKS];
	struct state_stats stats;
	uint8_t buf[1024];
	size_t len;

	for (int i = 0; i < FD_NCHUNKS; i++) {
		gmb__state_chunk__init(&ch[i]);
		ch[i].id = (uint64_t)i + 1;
		ch[i].size = 2 * MiB;
		ch[i].uid = geteuid();
		ch[i].uid_set = i < 3;
		pch[i] = &ch[i];
		fds[i] = (struct state_fd){
			.id = ch[i].id, .dev = 0, .size = 2 * MiB, .fd = fd_memfd(2 * MiB)
		};
	}
	a5.id = 5, a5.size = 4 * MiB, a5.active = true, a5.n_chunk_ids = 2, a5.chunk_ids = ids5;
	a6.id = 6, a6.size = 2 * MiB, a6.n_chunk_ids = 1, a6.chunk_ids = ids6;
	tw.name = "w", tw.mode = GMB__MODE__MODE_PRESERVE, tw.n_allocs = 1, tw.allocs = &pa5;
	tkv.name = "kv", tkv.paused = true, tkv.n_allocs = 1, tkv.allocs = &pa6;
	cl.id = FD_ORPHAN_ID, cl.name = "orphan", cl.pid = getpid(), cl.uid = geteuid();
	cl.gid = getegid(), cl.control = true, cl.n_tags = 2, cl.tags = ptags;
	st.version = 1, st.backend = "host", st.next_chunk_id = 10, st.next_client_id = 10;
	st.next_alloc_id = 10, st.n_chunks = FD_NCHUNKS, st.chunks = pch, st.n_clients = 1;
	st.clients = &pcl;
	len = gmb__state__pack(&st, buf);
	if (state_restore(fx.br, buf, len, fds, FD_NCHUNKS, &stats) < 0 || stats.clients != 1)
		fuzz_fail("the orphan's record was not restored");
	for (int i = 0; i < FD_NCHUNKS; i++)
		close(fds[i].fd);
}

static void fd_setup(void)
{
	struct backend_host_opts ho = { .ndevices = 2, .memory = 32 * MiB, .granularity = 2 * MiB };
	struct broker_opts bo = { .max_chunk = 4 * MiB,
				  .pool_keep = 8 * MiB,
				  .daemon_uid = geteuid() };

	memset(&fx, 0, sizeof(fx));
	memset(fd_socks, 0, sizeof(fd_socks));
	fd_have_handle = false;
	if (hfx_start(&fx, &ho, &bo, 2) < 0)
		fuzz_fail("cannot set up gmbd's layers");
	/* Short deadlines: parked requests and forwarded control time out too. */
	fx.h.park_timeout_ms = 2;
	fd_restore_orphan();
	handlers_orphans_start(&fx.h, 60000);
	for (int k = 0; k < FD_NSOCK; k++)
		fd_sock_open(&fd_socks[k]);
}

static void fd_teardown(void)
{
	for (int k = 0; k < FD_NSOCK; k++)
		if (fd_socks[k].fd >= 0)
			close(fd_socks[k].fd);
	/* Every hang-up is seen and reaped before the server stops. */
	for (int i = 0; i < 8 && server_sessions(fx.srv); i++)
		uv_run(&fx.loop, UV_RUN_NOWAIT);
	hfx_stop(&fx);
	fuzz_check_broker(fx.br, 0);
	for (const struct bclient *c = fx.br->clients; c; c = c->next)
		if (!c->orphan)
			fuzz_fail("client %llu (%s) outlived its session",
				  (unsigned long long)c->id, c->name);
	if (hfx_free(&fx) != 0)
		fuzz_fail("the loop has handles left");
}

static void fd_record(const uint8_t **p, const uint8_t *end)
{
	unsigned b = (unsigned)fuzz_take(p, end, 1);
	struct fd_sock *s = &fd_socks[(b >> 3) % FD_NSOCK];
	unsigned op = b & 7;
	size_t len;

	if (op <= 3 || op == 5) {
		len = (size_t)fuzz_take(p, end, 2);
		if (len > (size_t)(end - *p))
			len = (size_t)(end - *p);
		if (s->fd >= 0) {
			static uint8_t with[WIRE_MAX_MSG];
			size_t n = fd_with_handle(*p, len, with);

			fd_send(s, n ? with : *p, n ? n : len, op == 5);
		}
		*p += len;
	} else if (op == 4) {
		fd_answer(s, -(int)(fuzz_take(p, end, 1) % 40));
	} else if (op == 6) {
		close(s->fd);
		fd_settle();
		fd_sock_open(s);
	} else {
		fd_settle();
	}
	fd_settle();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *end = data + size;
	int fds_before = fuzz_count_fds();

	fd_setup();
	while (p < end) {
		fd_record(&p, end);
		fuzz_check_broker(fx.br, 0);
	}
	fd_teardown();
	if (fuzz_count_fds() != fds_before)
		fuzz_fail("%d fds open after the input, %d before", fuzz_count_fds(), fds_before);
	return 0;
}
