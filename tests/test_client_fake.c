/*
 * test_client_fake.c - libgmb against a daemon that misbehaves: a fake gmbd
 * on a real socket speaks the wire protocol from a thread (hello, alloc,
 * pause, resume with memfd chunks) and sends what a buggy or hostile gmbd
 * could: a drop of a chunk that is mapped, a drop in the middle of a pause,
 * a rejoin hello left unanswered. The worker's memory must stay mapped
 * whenever libgmb says it is, and a call waiting for gmbd must sleep.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/wire.h"
#include "include/gmb.h"

#define MiB	  (1024ULL * 1024)
#define FAKE_SIZE (2 * MiB)

/* The fake gmbd: one client, one allocation (id 1), chunks 10, 11, ... */
struct fake {
	char path[108];
	int lfd, fd; /* listening and accepted sockets, owned */
	pthread_t th;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t chunk; /* the allocation's current chunk */
	uint64_t next_chunk;
	bool drop_on_pause; /* first pause: drop the chunk, then refuse */
	int pauses, resumes;
	bool drop_answered;
	int drop_status;
	bool stalled; /* fake_stall_main holds the rejoin hello unanswered */
	int accepts;  /* connections fake_flap_main took */
	bool stop;    /* under lock: fake_flap_main returns (no cancel: ASan) */
};

static struct fake fk;

static int fake_send_lend(Gmb__Envelope *env, Gmb__Lend *l, uint64_t *size)
{
	int mfd = memfd_create("fake-chunk", MFD_CLOEXEC), rc;

	cr_assert(mfd >= 0);
	cr_assert(eq(i32, ftruncate(mfd, FAKE_SIZE), 0));
	fk.chunk = fk.next_chunk++;
	*size = FAKE_SIZE;
	l->alloc_id = 1;
	l->size = FAKE_SIZE;
	l->n_chunk_ids = 1;
	l->chunk_ids = &fk.chunk;
	l->n_chunk_sizes = 1;
	l->chunk_sizes = size;
	env->n_fd_chunks = 1;
	env->fd_chunks = &fk.chunk;
	env->n_fd_sizes = 1;
	env->fd_sizes = size;
	rc = wire_send(fk.fd, env, &mfd, 1);
	close(mfd);
	return rc;
}

/* gmbd's DropRequest for @chunk, sent unasked. */
static void fake_drop(uint64_t chunk)
{
	Gmb__Envelope d = GMB__ENVELOPE__INIT;
	Gmb__DropRequest dr = GMB__DROP_REQUEST__INIT;

	d.id = 1000;
	d.body_case = GMB__ENVELOPE__BODY_DROP;
	d.drop = &dr;
	dr.n_chunk_ids = 1;
	dr.chunk_ids = &chunk;
	cr_assert(eq(i32, wire_send(fk.fd, &d, NULL, 0), 0));
}

static int fake_answer(const Gmb__Envelope *req)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__HelloReply hr = GMB__HELLO_REPLY__INIT;
	Gmb__DeviceInfo dev = GMB__DEVICE_INFO__INIT, *devs[1] = { &dev };
	Gmb__AllocReply ar = GMB__ALLOC_REPLY__INIT;
	Gmb__ResumeReply rr = GMB__RESUME_REPLY__INIT;
	Gmb__PauseReply pr = GMB__PAUSE_REPLY__INIT;
	Gmb__Lend l = GMB__LEND__INIT, *ls[1] = { &l };
	uint64_t size;

	env.reply_to = req->id;
	switch (req->body_case) {
	case GMB__ENVELOPE__BODY_HELLO:
		hr.version = GMB_PROTOCOL_VERSION;
		hr.client_id = 1;
		hr.rejoined = req->hello->rejoin_id != 0;
		hr.backend = "host";
		dev.granularity = FAKE_SIZE;
		dev.total_bytes = 32 * FAKE_SIZE;
		dev.budget_bytes = dev.total_bytes;
		hr.n_devices = 1;
		hr.devices = devs;
		env.body_case = GMB__ENVELOPE__BODY_HELLO_REPLY;
		env.hello_reply = &hr;
		break;
	case GMB__ENVELOPE__BODY_ALLOC:
		ar.lend = &l;
		env.body_case = GMB__ENVELOPE__BODY_ALLOC_REPLY;
		env.alloc_reply = &ar;
		return fake_send_lend(&env, &l, &size);
	case GMB__ENVELOPE__BODY_RESUME:
		rr.n_lends = 1;
		rr.lends = ls;
		env.body_case = GMB__ENVELOPE__BODY_RESUME_REPLY;
		env.resume_reply = &rr;
		pthread_mutex_lock(&fk.lock);
		fk.resumes++;
		pthread_mutex_unlock(&fk.lock);
		return fake_send_lend(&env, &l, &size);
	case GMB__ENVELOPE__BODY_PAUSE:
		if (fk.drop_on_pause && fk.pauses++ == 0) {
			/* The drop goes first; its answer reaches this loop later. */
			fake_drop(fk.chunk);
			env.status = -EIO;
			env.error = "the fake gmbd refuses this pause";
			break;
		}
		env.body_case = GMB__ENVELOPE__BODY_PAUSE_REPLY;
		env.pause_reply = &pr;
		break;
	default:
		break; /* free, tag mode, control state: plain success */
	}
	return wire_send(fk.fd, &env, NULL, 0);
}

/* The next connection; wire_listen's socket is non-blocking (gmbd's loop). */
static int fake_accept(void)
{
	int fd = accept4(fk.lfd, NULL, NULL, SOCK_CLOEXEC);

	while (fd < 0 && errno == EAGAIN) {
		struct pollfd pfd = { .fd = fk.lfd, .events = POLLIN };

		poll(&pfd, 1, -1);
		fd = accept4(fk.lfd, NULL, NULL, SOCK_CLOEXEC);
	}
	cr_assert(fd >= 0);
	return fd;
}

static void *fake_main(void *arg)
{
	(void)arg;
	fk.fd = fake_accept();
	for (;;) {
		Gmb__Envelope *env = NULL;
		int fds[WIRE_MAX_FDS], nfds = WIRE_MAX_FDS;

		if (wire_recv(fk.fd, &env, fds, &nfds) < 0 || !env)
			break;
		wire_close_fds(fds, nfds);
		if (env->reply_to) {
			/* The only request this fake sends is a drop. */
			pthread_mutex_lock(&fk.lock);
			fk.drop_answered = true;
			fk.drop_status = env->status;
			pthread_cond_broadcast(&fk.cond);
			pthread_mutex_unlock(&fk.lock);
		} else {
			cr_assert(eq(i32, fake_answer(env), 0));
		}
		gmb__envelope__free_unpacked(env, NULL);
	}
	return NULL;
}

static void fake_start(void *(*fn)(void *))
{
	memset(&fk, 0, sizeof(fk));
	fk.fd = -1;
	fk.next_chunk = 10;
	pthread_mutex_init(&fk.lock, NULL);
	pthread_cond_init(&fk.cond, NULL);
	snprintf(fk.path, sizeof(fk.path), "/tmp/gmb-fake-%d.sock", (int)getpid());
	unlink(fk.path);
	cr_assert(eq(i32, wire_listen(fk.path, &fk.lfd), 0));
	cr_assert(eq(i32, pthread_create(&fk.th, NULL, fn, NULL), 0));
}

static void setup(void)
{
	fake_start(fake_main);
}

static void teardown(void)
{
	/* A failed test leaves its client connected: the fake would wait on forever. */
	pthread_cancel(fk.th);
	pthread_join(fk.th, NULL);
	if (fk.fd >= 0)
		close(fk.fd);
	close(fk.lfd);
	unlink(fk.path);
}

TestSuite(client_fake, .init = setup, .fini = teardown, .timeout = 30);

/* The status of the fake's drop, once the client answered it. */
static int fake_drop_status(void)
{
	int st;

	pthread_mutex_lock(&fk.lock);
	while (!fk.drop_answered)
		pthread_cond_wait(&fk.cond, &fk.lock);
	st = fk.drop_status;
	pthread_mutex_unlock(&fk.lock);
	return st;
}

Test(client_fake, a_drop_of_a_mapped_chunk_is_refused)
{
	gmb_client *c;
	char *p;

	cr_assert(eq(i32, gmb_connect(fk.path, "fake-victim", &c), 0), "%s", gmb_last_error(NULL));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, FAKE_SIZE, 0, "t"), 0), "%s",
		  gmb_last_error(c));
	memset(p, 0x5a, FAKE_SIZE);
	fake_drop(fk.chunk);
	cr_assert(eq(i32, fake_drop_status(), -EBUSY),
		  "a drop of a chunk the application has mapped was obeyed");
	/* Still mapped, still the same memory, and pause/resume still work. */
	cr_assert(eq(i32, p[FAKE_SIZE - 1], 0x5a));
	cr_assert(eq(i32, gmb_pause(c, "t"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_resume(c, "t"), 0), "%s", gmb_last_error(c));
	memset(p, 0x33, FAKE_SIZE);
	gmb_close(c);
}

Test(client_fake, a_remap_that_fails_leaves_the_tag_paused)
{
	gmb_client *c;
	char *p;

	fk.drop_on_pause = true;
	cr_assert(eq(i32, gmb_connect(fk.path, "fake-victim", &c), 0), "%s", gmb_last_error(NULL));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, FAKE_SIZE, 0, "t"), 0), "%s",
		  gmb_last_error(c));
	memset(p, 0x5a, FAKE_SIZE);
	/* gmbd drops the (now unmapped) chunk, then refuses the pause. */
	cr_assert(lt(i32, gmb_pause(c, NULL), 0), "the fake gmbd refused the pause");
	cr_assert(eq(i32, fake_drop_status(), 0), "an unmapped chunk may be dropped");
	cr_assert(eq(i32, gmb_resume(c, NULL), 0), "%s", gmb_last_error(c));
	pthread_mutex_lock(&fk.lock);
	cr_assert(eq(i32, fk.resumes, 1),
		  "resume returned without asking gmbd: the tag was left active and unmapped");
	pthread_mutex_unlock(&fk.lock);
	memset(p, 0x33, FAKE_SIZE); /* mapped again: no SEGV */
	cr_assert(eq(i32, p[0], 0x33));
	gmb_close(c);
}

/*
 * A re-announcement that outlasts GMB_RECONNECT_TIMEOUT: the fake answers
 * the first hello, hangs up, takes the library's reconnection and leaves its
 * hello unanswered for FAKE_STALL_MS, then hangs up again. A call made
 * meanwhile waits for the re-announcement's end past its own deadline,
 * asleep.
 */
#define FAKE_STALL_MS 300

static void *fake_stall_main(void *arg)
{
	Gmb__Envelope *env = NULL;
	int fds[WIRE_MAX_FDS], nfds = 0;
	struct timespec stall = { .tv_sec = 0, .tv_nsec = FAKE_STALL_MS * 1000000L };

	(void)arg;
	fk.fd = fake_accept();
	cr_assert(eq(i32, wire_recv(fk.fd, &env, fds, &nfds), 0));
	cr_assert(eq(i32, fake_answer(env), 0));
	gmb__envelope__free_unpacked(env, NULL);
	close(fk.fd);
	fk.fd = fake_accept();
	cr_assert(eq(i32, wire_recv(fk.fd, &env, fds, &nfds), 0));
	cr_assert(eq(i32, env->body_case, GMB__ENVELOPE__BODY_HELLO), "not the rejoin hello");
	gmb__envelope__free_unpacked(env, NULL);
	pthread_mutex_lock(&fk.lock);
	fk.stalled = true;
	pthread_cond_broadcast(&fk.cond);
	pthread_mutex_unlock(&fk.lock);
	nanosleep(&stall, NULL); /* the stall is the point, not a wait for something */
	close(fk.fd);
	fk.fd = -1;
	return NULL;
}

static void setup_stall(void)
{
	fake_start(fake_stall_main);
}

static uint64_t thread_cpu_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

Test(client_fake_rejoin, a_call_past_its_deadline_sleeps_until_the_rejoin_ends, .init = setup_stall,
     .fini = teardown, .timeout = 30)
{
	uint64_t cpu, wall;
	gmb_client *c;
	char *json = NULL;
	int rc;

	/* 0: the call's own deadline has passed the moment it starts waiting. */
	setenv("GMB_RECONNECT_TIMEOUT", "0", 1);
	rc = gmb_connect(fk.path, "fake-rejoin", &c);
	unsetenv("GMB_RECONNECT_TIMEOUT");
	cr_assert(eq(i32, rc, 0), "%s", gmb_last_error(NULL));
	pthread_mutex_lock(&fk.lock);
	while (!fk.stalled)
		pthread_cond_wait(&fk.cond, &fk.lock);
	pthread_mutex_unlock(&fk.lock);
	cpu = thread_cpu_ms();
	wall = mono_ms();
	/* A request without op_lock (a status) does not wait in gmb__op_begin(). */
	rc = gmb_status_json(c, &json);
	cpu = thread_cpu_ms() - cpu;
	wall = mono_ms() - wall;
	cr_assert(lt(i32, rc, 0), "the fake gmbd never answers");
	cr_assert(ge(u64, wall, FAKE_STALL_MS / 2),
		  "the call did not wait for the rejoin (%llu ms)", (unsigned long long)wall);
	cr_assert(lt(u64, cpu, FAKE_STALL_MS / 10),
		  "waiting %llu ms for the rejoin took %llu ms of CPU: a busy loop",
		  (unsigned long long)wall, (unsigned long long)cpu);
	gmb_close(c);
}

/* ---- a gmbd that takes the client back, then drops it at once ---- */

#define FAKE_FLAP_MS 1500

static bool fake_stopping(void)
{
	bool stop;

	pthread_mutex_lock(&fk.lock);
	stop = fk.stop;
	pthread_mutex_unlock(&fk.lock);
	return stop;
}

/* The next connection, or -1 once told to stop (looked at every 20 ms). */
static int fake_accept_or_stop(void)
{
	while (!fake_stopping()) {
		struct pollfd pfd = { .fd = fk.lfd, .events = POLLIN };
		int fd;

		if (poll(&pfd, 1, 20) <= 0)
			continue;
		fd = accept4(fk.lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd >= 0)
			return fd;
	}
	return -1;
}

/* Every connection: hello and the claim answered, then closed. */
static void *fake_flap_main(void *arg)
{
	(void)arg;
	for (;;) {
		bool claimed = false;

		fk.fd = fake_accept_or_stop();
		if (fk.fd < 0)
			return NULL;
		pthread_mutex_lock(&fk.lock);
		fk.accepts++;
		pthread_mutex_unlock(&fk.lock);
		while (!claimed) {
			Gmb__Envelope *env = NULL, rep = GMB__ENVELOPE__INIT;
			Gmb__RejoinReply rr = GMB__REJOIN_REPLY__INIT;
			int fds[WIRE_MAX_FDS], nfds = WIRE_MAX_FDS;
			bool first = false;

			if (wire_recv(fk.fd, &env, fds, &nfds) < 0 || !env)
				break;
			wire_close_fds(fds, nfds);
			if (env->body_case == GMB__ENVELOPE__BODY_REJOIN) {
				rep.reply_to = env->id;
				rep.body_case = GMB__ENVELOPE__BODY_REJOIN_REPLY;
				rep.rejoin_reply = &rr;
				claimed = env->rejoin->last;
				wire_send(fk.fd, &rep, NULL, 0);
			} else {
				first = env->body_case == GMB__ENVELOPE__BODY_HELLO &&
					!env->hello->rejoin_id;
				fake_answer(env);
			}
			gmb__envelope__free_unpacked(env, NULL);
			if (first)
				break; /* the first connection: dropped after its hello */
		}
		close(fk.fd);
		fk.fd = -1;
	}
	return NULL;
}

static void setup_flap(void)
{
	fake_start(fake_flap_main);
}

static void teardown_flap(void)
{
	pthread_mutex_lock(&fk.lock);
	fk.stop = true;
	pthread_mutex_unlock(&fk.lock);
	pthread_join(fk.th, NULL);
	close(fk.lfd);
	unlink(fk.path);
}

/*
 * A loss soon after a reconnect keeps the backoff where it was: 50 ms,
 * doubling, is about six connections in 1.5 s; trying at once after each
 * would be hundreds.
 */
Test(client_fake_rejoin, a_connection_lost_again_soon_after_a_reconnect_backs_off,
     .init = setup_flap, .fini = teardown_flap, .timeout = 30)
{
	struct timespec flap = { .tv_sec = FAKE_FLAP_MS / 1000,
				 .tv_nsec = (FAKE_FLAP_MS % 1000) * 1000000L };
	gmb_client *c;
	int n;

	cr_assert(eq(i32, gmb_connect(fk.path, "fake-flap", &c), 0), "%s", gmb_last_error(NULL));
	nanosleep(&flap, NULL); /* the reconnects are counted over this time */
	pthread_mutex_lock(&fk.lock);
	n = fk.accepts;
	pthread_mutex_unlock(&fk.lock);
	cr_assert(ge(i32, n, 3), "it did reconnect (%d connections)", n);
	cr_assert(le(i32, n, 10), "%d connections in %d ms: no backoff between losses", n,
		  FAKE_FLAP_MS);
	gmb_close(c);
}
