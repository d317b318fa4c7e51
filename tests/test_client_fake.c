/*
 * test_client_fake.c - libgmb against a daemon that misbehaves: a fake gmbd
 * on a real socket speaks the wire protocol from a thread (hello, alloc,
 * pause, resume with memfd chunks) and sends what a buggy or hostile gmbd
 * could: a drop of a chunk that is mapped, a drop in the middle of a pause.
 * The worker's memory must stay mapped whenever libgmb says it is.
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
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/wire.h"
#include "gmb.h"

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

static void *fake_main(void *arg)
{
	(void)arg;
	/* wire_listen's socket is non-blocking (gmbd's loop): this one blocks. */
	fk.fd = accept4(fk.lfd, NULL, NULL, SOCK_CLOEXEC);
	while (fk.fd < 0 && errno == EAGAIN) {
		struct pollfd pfd = { .fd = fk.lfd, .events = POLLIN };

		poll(&pfd, 1, -1);
		fk.fd = accept4(fk.lfd, NULL, NULL, SOCK_CLOEXEC);
	}
	cr_assert(fk.fd >= 0);
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

static void setup(void)
{
	memset(&fk, 0, sizeof(fk));
	fk.next_chunk = 10;
	pthread_mutex_init(&fk.lock, NULL);
	pthread_cond_init(&fk.cond, NULL);
	snprintf(fk.path, sizeof(fk.path), "/tmp/gmb-fake-%d.sock", (int)getpid());
	unlink(fk.path);
	cr_assert(eq(i32, wire_listen(fk.path, &fk.lfd), 0));
	cr_assert(eq(i32, pthread_create(&fk.th, NULL, fake_main, NULL), 0));
}

static void teardown(void)
{
	/* A failed test leaves its client connected: the fake would wait on forever. */
	pthread_cancel(fk.th);
	pthread_join(fk.th, NULL);
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
