/*
 * fuzz_client.c - libgmb's handling of what gmbd sends, under a fuzzer. A
 * fake gmbd (a thread of the harness) listens on a socket of its own and
 * answers the library's requests with the input's envelopes, while the
 * harness's main thread makes real gmb_* calls: connect, a preserve tag,
 * malloc (the memory is then written), pause, resume, status, poll, free,
 * close; the control handler agrees to an operator's pause or resume only
 * after resume (the application is idle then). The library's reconnect and re-announcement run when the fake gmbd
 * hangs up in the middle.
 *
 * Input: items, each one flag byte, 2 bytes length, the envelope's bytes:
 *   bit 0  the envelope answers the library's request now waiting: its
 *          reply_to is set to that request's id (when it decodes)
 *   bit 1  chunk fds ride with it: one memfd per fd_chunks entry (8 at
 *          most), of the size fd_sizes says (16 MiB at most)
 *   bit 2  sent at once, without waiting for a request (drops, control
 *          commands, Bye, replies to nothing)
 *   bit 3  the fake gmbd hangs up after it (the library reconnects)
 * Once the items are used up, the fake gmbd hangs up and turns every later
 * connection away.
 *
 * The fake gmbd never waits on a clock for the library: an item that answers
 * a request waits for one until it comes, or until every other thread of the
 * process sleeps and stays asleep (the library waits for gmbd and will send
 * nothing: see fc_idle()), or FC_WAIT_MS at most; the end of the calls wakes
 * it through an eventfd.
 *
 * After each input: the process has the fds it had before, nothing leaked
 * (LeakSanitizer, per input under the fuzzer), and memory the library said
 * was mapped was readable (after malloc and after a resume that reported
 * success: a drop of a chunk the application has mapped must be refused).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/deadline.h"
#include "common/wire.h"
#include "include/gmb.h"
#include "tests/fuzz/fuzz.h"

#define MiB	       (1ULL << 20)
#define FC_MAX_FDS     8
#define FC_MAX_FD_SIZE (16 * MiB)
#define FC_WAIT_MS     50 /* the longest a library that keeps running is waited for */
#define FC_TICK_NS     100000
#define FC_MAX_TASKS   32

#define FC_REPLY   1
#define FC_FDS	   2
#define FC_AT_ONCE 4
#define FC_HANG_UP 8

struct fc_item {
	unsigned flags;
	const uint8_t *buf;
	size_t len;
};

static struct {
	char dir[64], sock[96];
	int listen_fd;
	int probe; /* a memfd that write(2) copies into */
	int wake;  /* an eventfd: the calls of an input are done */
} fc;

/* A thread of this process as /proc tells: its id and its time on a CPU. */
struct fc_task {
	int tid;
	unsigned long long ran_ns;
};

/* One input's fake gmbd. */
struct fc_daemon {
	const struct fc_item *items;
	size_t nitems, next;
	int conn;	  /* the accepted connection; -1: none */
	uint64_t waiting; /* id of the library's last request not answered */
	pthread_mutex_t lock;
	bool stop; /* the main thread is done */
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	snprintf(fc.dir, sizeof(fc.dir), "/tmp/gmbfuzzc.XXXXXX");
	if (!mkdtemp(fc.dir))
		fuzz_fail("mkdtemp: %s", strerror(errno));
	snprintf(fc.sock, sizeof(fc.sock), "%s/gmbd.sock", fc.dir);
	if (wire_listen(fc.sock, &fc.listen_fd) < 0)
		fuzz_fail("cannot listen on %s", fc.sock);
	fc.probe = memfd_create("fuzz-probe", MFD_CLOEXEC);
	fc.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fc.probe < 0 || fc.wake < 0)
		fuzz_fail("memfd or eventfd: %s", strerror(errno));
	/* Calls fail at once while the library reconnects: no input waits. */
	setenv("GMB_RECONNECT_TIMEOUT", "0", 1);
	return 0;
}

static bool fc_stopping(struct fc_daemon *d)
{
	bool stop;

	pthread_mutex_lock(&d->lock);
	stop = d->stop;
	pthread_mutex_unlock(&d->lock);
	return stop;
}

static void fc_hang_up(struct fc_daemon *d)
{
	if (d->conn >= 0)
		close(d->conn);
	d->conn = -1;
	d->waiting = 0;
}

/* Polls @fd and the wake eventfd up to @ns (-1: no limit); true: @fd has
 * something (or hung up). */
static bool fc_poll(int fd, long ns)
{
	struct pollfd p[2] = { { .fd = fd, .events = POLLIN },
			       { .fd = fc.wake, .events = POLLIN } };
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ns };

	return ppoll(p, 2, ns < 0 ? NULL : &ts, NULL) > 0 && p[0].revents;
}

/* Reads the first line of /proc/self/task/@tid/@file into @buf; false: gone. */
static bool fc_task_read(int dirfd, const char *tid, const char *file, char *buf, size_t cap)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", tid, file);
	fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, cap - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	return true;
}

/*
 * The other threads of this process (the harness's main thread, the
 * library's, libFuzzer's) with their CPU time, in @t; -1 when one of them
 * runs or may run (state R or D) or cannot be read.
 */
static int fc_tasks_asleep(struct fc_task *t)
{
	DIR *dir = opendir("/proc/self/task");
	int self = (int)gettid(), n = 0;
	struct dirent *e;
	char buf[512], *st;

	if (!dir)
		fuzz_fail("cannot open /proc/self/task: %s", strerror(errno));
	while (n >= 0 && (e = readdir(dir))) {
		int tid = atoi(e->d_name);

		if (tid <= 0 || tid == self)
			continue;
		if (n == FC_MAX_TASKS ||
		    !fc_task_read(dirfd(dir), e->d_name, "stat", buf, sizeof(buf)) ||
		    !(st = strrchr(buf, ')')) || st[1] != ' ' || st[2] == 'R' || st[2] == 'D' ||
		    !fc_task_read(dirfd(dir), e->d_name, "schedstat", buf, sizeof(buf))) {
			n = -1;
			break;
		}
		t[n++] = (struct fc_task){ .tid = tid, .ran_ns = strtoull(buf, NULL, 10) };
	}
	closedir(dir);
	return n;
}

/*
 * Whether the library waits for gmbd and will send nothing: every other
 * thread asleep at @before (@nbefore of them) and again now, none of them
 * on a CPU in between (the same CPU time), so all of them slept at once
 * (between the two looks), when only this thread could wake them. A sleep
 * may end on a timer (a reconnection's back-off): then the library sends
 * later, as it would to a gmbd that had moved on.
 */
static bool fc_idle(const struct fc_task *before, int nbefore)
{
	struct fc_task now[FC_MAX_TASKS];
	int n = fc_tasks_asleep(now);

	if (n < 0 || n != nbefore)
		return false;
	for (int i = 0; i < n; i++)
		if (now[i].tid != before[i].tid || now[i].ran_ns != before[i].ran_ns)
			return false;
	return true;
}

/* Waits for a connection (or the main thread's end); false: none came. */
static bool fc_accept(struct fc_daemon *d)
{
	while (!fc_stopping(d)) {
		if (!fc_poll(fc.listen_fd, -1))
			continue;
		d->conn = accept4(fc.listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (d->conn >= 0)
			return true;
	}
	return false;
}

/* One packet from the library; false when it hung up. */
static bool fc_read_one(struct fc_daemon *d)
{
	Gmb__Envelope *env = NULL;
	int fds[WIRE_MAX_FDS], nfds = 0;

	if (wire_recv(d->conn, &env, fds, &nfds) < 0) {
		fc_hang_up(d);
		return false;
	}
	wire_close_fds(fds, nfds);
	if (getenv("GMB_FUZZ_LOG"))
		fprintf(stderr, "fake gmbd: got body=%d id=%llu reply_to=%llu\n", env->body_case,
			(unsigned long long)env->id, (unsigned long long)env->reply_to);
	if (env->id && !env->reply_to)
		d->waiting = env->id;
	gmb__envelope__free_unpacked(env, NULL);
	return true;
}

/*
 * The library's next request; false when it hung up, or sends none: it
 * waits for gmbd (fc_idle()), or kept running FC_WAIT_MS without sending.
 * While a thread runs, the socket is polled FC_TICK_NS before looking again.
 */
static bool fc_read_request(struct fc_daemon *d)
{
	uint64_t give_up = deadline_now_ns() + FC_WAIT_MS * 1000000ULL;
	struct fc_task before[FC_MAX_TASKS];
	int nbefore;

	while (!fc_stopping(d)) {
		if (fc_poll(d->conn, 0)) {
			if (!fc_read_one(d))
				return false;
			if (d->waiting)
				return true;
			continue;
		}
		nbefore = fc_tasks_asleep(before);
		if (nbefore >= 0 && !fc_poll(d->conn, 0) && fc_idle(before, nbefore))
			return false;
		if (!fc_poll(d->conn, FC_TICK_NS) && deadline_now_ns() > give_up)
			return false;
	}
	return false;
}

static int fc_memfd(uint64_t size)
{
	int fd = memfd_create("fuzz-chunk", MFD_CLOEXEC);

	if (fd < 0)
		fuzz_fail("memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)(size > FC_MAX_FD_SIZE ? FC_MAX_FD_SIZE : size)) < 0)
		fuzz_fail("ftruncate: %s", strerror(errno));
	return fd;
}

/*
 * A hello reply naming "cuda" (or "auto") names "host" instead: libgmb would
 * otherwise reach the real driver where a GPU is, which opens device files,
 * eventfds and threads for the rest of the process, so an input would
 * behave differently on each machine. Overwritten in place: the decoder
 * owns the string. Other names still reach libgmb's refusal.
 */
static void fc_keep_host(Gmb__Envelope *env)
{
	char *b = env->body_case == GMB__ENVELOPE__BODY_HELLO_REPLY && env->hello_reply ?
			  env->hello_reply->backend :
			  NULL;

	if (b && (strcmp(b, "cuda") == 0 || strcmp(b, "auto") == 0))
		memcpy(b, "host", 4);
}

/* Sends @it: as it is, or decoded, patched and packed again. */
static void fc_send(struct fc_daemon *d, const struct fc_item *it)
{
	Gmb__Envelope *env = gmb__envelope__unpack(NULL, it->len, it->buf);
	int fds[FC_MAX_FDS], nfds = 0;
	uint8_t *buf = NULL;
	size_t len;

	if (!env) {
		send(d->conn, it->buf, it->len ? it->len : 1, MSG_NOSIGNAL | MSG_DONTWAIT);
		return;
	}
	fc_keep_host(env);
	if ((it->flags & FC_REPLY) && d->waiting) {
		env->reply_to = d->waiting;
		if (!env->more)
			d->waiting = 0;
	}
	if (it->flags & FC_FDS)
		for (size_t i = 0; i < env->n_fd_chunks && nfds < FC_MAX_FDS; i++)
			fds[nfds++] = fc_memfd(i < env->n_fd_sizes ? env->fd_sizes[i] : 2 * MiB);
	if (wire_pack(env, &buf, &len) == 0)
		wire_send_packed(d->conn, buf, len, fds, nfds);
	free(buf);
	wire_close_fds(fds, nfds);
	gmb__envelope__free_unpacked(env, NULL);
}

static void fc_serve_item(struct fc_daemon *d, const struct fc_item *it)
{
	if (!(it->flags & FC_AT_ONCE) && !d->waiting)
		fc_read_request(d);
	if (d->conn < 0)
		return;
	fc_send(d, it);
	if (it->flags & FC_HANG_UP)
		fc_hang_up(d);
}

static void *fc_daemon_main(void *arg)
{
	struct fc_daemon *d = arg;

	while (d->next < d->nitems && (d->conn >= 0 || fc_accept(d)))
		fc_serve_item(d, &d->items[d->next++]);
	fc_hang_up(d);
	/* Used up: every later connection is turned away. */
	while (fc_accept(d))
		fc_hang_up(d);
	return NULL;
}

/*
 * An operator's pause unmaps the memory under the application's feet, which
 * agreed to it: so the handler agrees only once the calls that touch the
 * memory are done (before, it refuses, which the library must carry too).
 */
static int fc_agree(void *arg, int op, const char *tag)
{
	return __atomic_load_n((int *)arg, __ATOMIC_ACQUIRE) ? 0 : -EBUSY;
}

/* Readable without a fault: write(2) copies it, or says EFAULT. */
static bool fc_readable(const void *p, uint64_t size)
{
	return pwrite(fc.probe, p, size, 0) == (ssize_t)size;
}

static void fc_calls(void)
{
	gmb_client *c;
	void *p = NULL;
	char *json = NULL;
	int agree = 0;

	if (gmb_connect(fc.sock, "fuzz", &c) < 0)
		return;
	gmb_set_control_handler(c, fc_agree, &agree);
	gmb_tag_set_mode(c, "w", GMB_MODE_PRESERVE);
	if (gmb_malloc(c, &p, 4 * MiB, 0, "w") == 0) {
		if (!fc_readable(p, 4 * MiB))
			fuzz_fail("gmb_malloc succeeded with unmapped memory");
		memset(p, 0x5a, 4 * MiB);
	}
	gmb_pause(c, NULL);
	if (gmb_resume(c, NULL) == 0 && p && !fc_readable(p, 4 * MiB))
		fuzz_fail("gmb_resume succeeded with the memory unmapped");
	__atomic_store_n(&agree, 1, __ATOMIC_RELEASE);
	if (gmb_status_json(c, &json) == 0)
		free(json);
	gmb_poll(c, 0);
	if (p)
		gmb_free(c, p);
	gmb_close(c);
}

static size_t fc_parse(const uint8_t *data, size_t size, struct fc_item *items, size_t max)
{
	const uint8_t *p = data, *end = data + size;
	size_t n = 0;

	while (p < end && n < max) {
		items[n].flags = (unsigned)fuzz_take(&p, end, 1);
		items[n].len = (size_t)fuzz_take(&p, end, 2);
		if (items[n].len > (size_t)(end - p))
			items[n].len = p < end ? (size_t)(end - p) : 0;
		if (items[n].len > WIRE_MAX_MSG)
			items[n].len = WIRE_MAX_MSG;
		items[n].buf = p;
		p += items[n].len;
		n++;
	}
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fc_item items[256];
	struct fc_daemon d = { .items = items, .conn = -1 };
	int fds_before = fuzz_count_fds();
	pthread_t t;

	d.nitems = fc_parse(data, size, items, 256);
	pthread_mutex_init(&d.lock, NULL);
	if (pthread_create(&t, NULL, fc_daemon_main, &d) != 0)
		fuzz_fail("pthread_create");
	fc_calls();
	pthread_mutex_lock(&d.lock);
	d.stop = true;
	pthread_mutex_unlock(&d.lock);
	if (eventfd_write(fc.wake, 1) < 0)
		fuzz_fail("eventfd_write: %s", strerror(errno));
	pthread_join(t, NULL);
	pthread_mutex_destroy(&d.lock);
	eventfd_read(fc.wake, &(eventfd_t){ 0 });
	if (fuzz_count_fds() != fds_before)
		fuzz_fail("%d fds open after the input, %d before", fuzz_count_fds(), fds_before);
	return 0;
}
