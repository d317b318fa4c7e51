/*
 * test_persist.c - what a client is told against what the fd store keeps,
 * when the store does not take it all. gmbd runs under the fake service
 * manager (tests/fake_sd.c) with real client processes (tests/prog_worker).
 *
 *   - A write of the state record that fails (the state memfd may not grow:
 *     RLIMIT_FSIZE lowered on the running gmbd) holds the replies of the
 *     changes it would record: the client gets no success for a lend the
 *     record lacks, gmbd keeps serving, says so once and in STATUS=, and
 *     sends the reply once a write succeeds. Killed meanwhile, the next
 *     gmbd and the client agree that the lend never happened. A raw client
 *     that keeps sending meanwhile is no longer read, rather than dropped
 *     for the replies gmbd holds, and gets every one after. A watcher
 *     whose events pile up meanwhile is not dropped either: it is told
 *     once how many it missed, then gets events again.
 *   - A unit whose FileDescriptorStoreMax= is lower than --fdstore-max (the
 *     fake manager closes fds past it unannounced, as systemd 252 does):
 *     told the limit ($FDSTORE), gmbd warns with both numbers and refuses
 *     requests past it with ENOSPC, so a restart loses nothing a client was
 *     told it holds; not told, it says at the restart what was lost.
 *   - A restart under a lower --max-chunks-per-uid than a uid holds keeps
 *     every chunk, says so once, and refuses that uid more until it is
 *     under, while another uid is served.
 *
 * gmbd's stderr is a FIFO read by a thread of the test: a regular file
 * would meet the lowered file size limit too. The thread copies it to the
 * test's log file (tests/testlog.c), shown if the test fails.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/deadline.h"
#include "daemon/handlers/handlers.h"
#include "daemon/transport/sess.h"
#include "include/gmb.h"
#include "tests/raw_client.h"
#include "tests/util.h"
#include "tests/worker_assert.h"

#define WAIT_MS 10000
#define CHUNK	"4194304" /* --max-chunk: one chunk an allocation */

static struct sd_gmbd fx;
static const char *const *fx_args; /* what gmbd_up() started gmbd with */

/* ---- gmbd's log through a FIFO ---- */

static struct {
	int fd;	     /* the FIFO, read and write: no EOF between two gmbds */
	int echo;    /* the test's log file, where what is read is copied */
	int stop[2]; /* wakes the thread at teardown */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char buf[1 << 20];
	size_t len;
} cap = { .fd = -1, .echo = -1 };

static void *cap_main(void *arg)
{
	char chunk[4096];

	for (;;) {
		struct pollfd p[2] = { { .fd = cap.fd, .events = POLLIN },
				       { .fd = cap.stop[0], .events = POLLIN } };
		ssize_t n;

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		n = read(cap.fd, chunk, sizeof(chunk));
		if (n <= 0)
			continue;
		/* Kept as the other tests keep gmbd's stderr. */
		if (cap.echo >= 0 && write(cap.echo, chunk, (size_t)n) != n)
			cap.echo = -1;
		pthread_mutex_lock(&cap.lock);
		if (cap.len + (size_t)n < sizeof(cap.buf) - 1) {
			memcpy(cap.buf + cap.len, chunk, (size_t)n);
			cap.len += (size_t)n;
			cap.buf[cap.len] = '\0';
		}
		pthread_cond_broadcast(&cap.cond);
		pthread_mutex_unlock(&cap.lock);
	}
	return NULL;
}

static void cap_start(void)
{
	char echo[300];

	test_log_path(echo, sizeof(echo), fx.dir, "gmbd-fifo");
	cap.echo = open(echo, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	snprintf(fx.gmbd.log, sizeof(fx.gmbd.log), "%s/gmbd.log", fx.dir);
	cr_assert(eq(i32, mkfifo(fx.gmbd.log, 0600), 0));
	cap.fd = open(fx.gmbd.log, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	cr_assert(ge(i32, cap.fd, 0));
	cr_assert(eq(i32, pipe2(cap.stop, O_CLOEXEC), 0));
	cap.len = 0;
	cap.buf[0] = '\0';
	pthread_mutex_init(&cap.lock, NULL);
	pthread_cond_init(&cap.cond, NULL);
	cr_assert(eq(i32, pthread_create(&cap.thread, NULL, cap_main, NULL), 0));
}

static void cap_stop(void)
{
	if (cap.fd < 0)
		return;
	if (write(cap.stop[1], "x", 1) == 1)
		pthread_join(cap.thread, NULL);
	close(cap.stop[0]);
	close(cap.stop[1]);
	close(cap.fd);
	cap.fd = -1;
	if (cap.echo >= 0)
		close(cap.echo);
	cap.echo = -1;
	pthread_cond_destroy(&cap.cond);
	pthread_mutex_destroy(&cap.lock);
}

/* Lines of the log so far that contain @needle. */
static int cap_count_locked(const char *needle)
{
	int n = 0;

	for (const char *p = cap.buf; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

static int cap_count(const char *needle)
{
	int n;

	pthread_mutex_lock(&cap.lock);
	n = cap_count_locked(needle);
	pthread_mutex_unlock(&cap.lock);
	return n;
}

/* Waits until @needle is in the log @n times; 0 or -ETIMEDOUT. */
static int cap_wait(const char *needle, int n, int ms)
{
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (long)(ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&cap.lock);
	while (cap_count_locked(needle) < n && rc == 0)
		rc = pthread_cond_timedwait(&cap.cond, &cap.lock, &until);
	rc = cap_count_locked(needle) >= n ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&cap.lock);
	return rc;
}

/* ---- gmbd and its clients ---- */

static void setup(void)
{
	cr_assert(eq(i32, sd_gmbd_open(&fx, "/tmp/gmbpersist.XXXXXX", true), 0));
	cap_start();
}

static void teardown(void)
{
	sd_gmbd_close(&fx, SIGTERM);
	cap_stop();
}

TestSuite(persist, .init = setup, .fini = teardown, .timeout = 90);

static void gmbd_up(const char *const *args)
{
	fx_args = args;
	cr_assert(eq(i32, sd_gmbd_up(&fx, args, WAIT_MS), 0), "gmbd did not say READY=1");
}

static void gmbd_kill(void)
{
	cr_assert(eq(i32, sd_gmbd_kill(&fx), 0));
}

/* A command whose answer is read later (worker_answer()). */
static void worker_send(struct worker *w, const char *cmd)
{
	cr_assert(ge(i32, fprintf(w->in, "%s\n", cmd), 0));
	cr_assert(eq(i32, fflush(w->in), 0));
}

/* Nothing to read on @fd, not even its end. */
static void assert_nothing_to_read(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	cr_assert(eq(i32, poll(&p, 1, 0), 0), "revents 0x%x", (unsigned)p.revents);
}

/* Whether the worker answered within @ms (a bound for what must not come). */
static bool worker_answered(struct worker *w, int ms)
{
	struct pollfd p = { .fd = fileno(w->out), .events = POLLIN };

	return poll(&p, 1, ms) > 0;
}

/* The answer to worker_send(): its rc, the rest in @text. */
static int worker_answer(struct worker *w, char *text, size_t len)
{
	char line[1024];
	char *sp;
	int rc;

	if (!fgets(line, sizeof(line), w->out))
		return -EPIPE;
	rc = (int)strtol(line, &sp, 10);
	snprintf(text, len, "%s", sp + (*sp == ' '));
	text[strcspn(text, "\n")] = '\0';
	return rc;
}

/* The running gmbd's file size limit (soft; the hard one stays). */
static void gmbd_fsize(rlim_t soft)
{
	struct rlimit rl;

	cr_assert(eq(i32, prlimit(fx.gmbd.pid, RLIMIT_FSIZE, NULL, &rl), 0));
	rl.rlim_cur = soft;
	cr_assert(eq(i32, prlimit(fx.gmbd.pid, RLIMIT_FSIZE, &rl, NULL), 0));
}

/* A restart must restore exactly what @w holds: status, bytes. */
static void restart_keeps(struct worker *w, const char *tag, const char *byte)
{
	char cmd[64], *before, *after;

	before = status_json_on(fx.gmbd.sock);
	gmbd_kill();
	gmbd_up(fx_args);
	snprintf(cmd, sizeof(cmd), "check %s %s", tag, byte);
	worker_ok(w, NULL, 0, cmd);
	after = status_json_on(fx.gmbd.sock);
	cr_assert(eq(str, after, before), "status changed across the restart");
	free(before);
	free(after);
}

/* ---- a failed write of the record ---- */

static const char *const keep_args[] = { "--host-memory", "64MiB",	 "--max-chunk",
					 CHUNK,		  "--pool-keep", "unlimited",
					 "--log-level",	  "debug",	 NULL };

/*
 * A client that allocated and freed a chunk, which the pool keeps: the
 * next allocation takes it and needs no new memfd, so with the file size
 * limit of gmbd at 4 KiB only the record's write (past 4 KiB) fails.
 */
static void freed_chunk(struct worker *w, const char *const *args)
{
	gmbd_up(args);
	worker_up_on(w, fx.gmbd.sock, "trainer");
	worker_ok(w, NULL, 0, "malloc a " CHUNK);
	/* Its reply came: the record with the free is stored. */
	worker_ok(w, NULL, 0, "free a");
}

/* The next allocation, a change the record cannot be written with. */
static void no_room(struct worker *w)
{
	gmbd_fsize(4096);
	worker_send(w, "malloc b " CHUNK);
	/* The record is written at the end of the turn the request came in,
	 * well within this bound on what must not come. */
	cr_assert(not(worker_answered(w, 500)), "a reply left for a lend the record lacks");
	cr_assert(eq(i32, kill(fx.gmbd.pid, 0), 0));
	cr_assert(eq(i32, waitpid(fx.gmbd.pid, NULL, WNOHANG), 0),
		  "gmbd died when it could not write the record");
	cr_assert(eq(i32, fake_sd_wait_status(&fx.sd, "replies held", WAIT_MS), 0),
		  "STATUS= never said the replies are held: %s", fx.sd.status);
}

static void freed_chunk_then_no_room(struct worker *w)
{
	freed_chunk(w, keep_args);
	no_room(w);
}

Test(persist, a_lend_the_record_lacks_is_never_told_and_a_crash_agrees)
{
	char text[512];
	struct worker w;

	freed_chunk_then_no_room(&w);
	/* Killed while it cannot write: the record knows nothing of b. */
	gmbd_kill();
	gmbd_up(keep_args);
	/* libgmb sends the unanswered request again; the new gmbd grants it. */
	cr_assert(eq(i32, worker_answer(&w, text, sizeof(text)), 0), "malloc b: %s", text);
	worker_ok(&w, NULL, 0, "fill b 0x3c");
	restart_keeps(&w, "b", "0x3c");
	cr_assert(eq(i32, worker_quit(&w), 0));
}

Test(persist, a_held_reply_leaves_once_the_record_is_stored_said_once)
{
	char text[512];
	struct worker w;
	int failed;

	freed_chunk_then_no_room(&w);
	/* Nothing but gmbd's own timer tries again; each try is not logged
	 * at error level again. */
	cr_assert(eq(i32, cap_wait("still cannot store the state record", 3, WAIT_MS), 0));
	failed = cap_count("cannot store the state record in the fd store");
	cr_assert(eq(i32, failed, 1), "the failure was said %d times", failed);
	cr_assert(not(worker_answered(&w, 0)));
	gmbd_fsize(RLIM_INFINITY);
	cr_assert(eq(i32, worker_answer(&w, text, sizeof(text)), 0), "malloc b: %s", text);
	cr_assert(eq(i32, cap_wait("state record stored again", 1, WAIT_MS), 0));
	cr_assert(eq(i32, fake_sd_wait_status_not(&fx.sd, "replies held", WAIT_MS), 0),
		  "STATUS= says: %s", fx.sd.status);
	cr_assert(not(eq(ptr, strstr(fx.sd.status, "1 client, 4.0 MiB lent"), NULL)), "%s",
		  fx.sd.status);
	worker_ok(&w, NULL, 0, "fill b 0x5a");
	restart_keeps(&w, "b", "0x5a");
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* ---- a client that keeps sending while replies are held ---- */

#define QUIET_MS 1000 /* no room for this long: gmbd no longer reads */

/*
 * Sends @env again and again (ids from @first on) without reading, through
 * @fd made non-blocking, until gmbd stops taking them: the socket full and
 * no room for QUIET_MS (a bound for what must not come). Fails when gmbd
 * closes the connection, or never stops reading. Return: how many went.
 */
static int keep_sending(int fd, Gmb__Envelope *env, uint64_t first)
{
	int flags = fcntl(fd, F_GETFL), sent = 0, r;

	cr_assert(eq(i32, fcntl(fd, F_SETFL, flags | O_NONBLOCK), 0));
	while (sent < 4 * SESS_OUT_MAX_PACKETS) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };

		env->id = first + (uint64_t)sent;
		r = raw_client_send(fd, env);
		if (r == 0) {
			sent++;
			continue;
		}
		cr_assert(eq(i32, r, -EAGAIN), "gmbd closed the connection after %d requests: %s",
			  sent, strerror(-r));
		if (poll(&p, 1, QUIET_MS) == 0)
			break;
	}
	cr_assert(lt(i32, sent, 4 * SESS_OUT_MAX_PACKETS), "gmbd never stopped reading");
	/* It took more than it keeps queued while held: the rest are in the socket. */
	cr_assert(gt(i32, sent, SESS_HOLD_MAX_PACKETS), "gmbd stopped reading at %d requests",
		  sent);
	/* Neither a reply nor the end of the connection came. */
	assert_nothing_to_read(fd);
	cr_assert(eq(i32, fcntl(fd, F_SETFL, flags), 0));
	cr_assert(eq(i32, cap_count("does not read its replies"), 0));
	return sent;
}

/* One reply each to the @n requests from id @first on, in order, with @status. */
static void read_replies(int fd, uint64_t first, int n, int status)
{
	for (int i = 0; i < n; i++) {
		Gmb__Envelope *r = NULL;

		cr_assert(eq(i32, raw_client_reply(fd, &r), 0), "reply %d of %d", i + 1, n);
		cr_assert(eq(u64, r->reply_to, first + (uint64_t)i), "reply %d of %d", i + 1, n);
		cr_assert(eq(i32, r->status, status), "reply %d: %s", i + 1,
			  r->error ? r->error : "");
		gmb__envelope__free_unpacked(r, NULL);
	}
}

static const char *const info_args[] = { "--host-memory",   "64MiB",	 "--max-chunk", CHUNK,
					 "--pool-keep",	    "unlimited", "--log-level", "info",
					 "--hello-timeout", "2",	 NULL };

Test(persist, a_client_that_keeps_sending_while_replies_are_held_stays)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest st = GMB__STATUS_REQUEST__INIT;
	char text[512];
	struct worker w;
	int fd, sent, status;

	freed_chunk(&w, info_args);
	cr_assert(eq(i32, raw_client_connect(fx.gmbd.sock, &fd), 0));
	cr_assert(eq(i32, raw_client_hello(fd, GMB_PROTOCOL_VERSION, &status), 0));
	cr_assert(eq(i32, status, 0));
	no_room(&w);
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &st;
	sent = keep_sending(fd, &env, 2);
	gmbd_fsize(RLIM_INFINITY);
	read_replies(fd, 2, sent, 0);
	env.id = 2 + (uint64_t)sent;
	cr_assert(eq(i32, raw_client_request(fd, &env, &status, text, sizeof(text)), 0));
	cr_assert(eq(i32, status, 0), "the session answers no more: %s", text);
	cr_assert(eq(i32, worker_answer(&w, text, sizeof(text)), 0), "malloc b: %s", text);
	close(fd);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* Before its hello: the time it is not read does not count against it. */
Test(persist, a_client_not_read_while_replies_are_held_keeps_its_hello_time)
{
	Gmb__Envelope env;
	Gmb__Hello h;
	struct timespec late;
	char text[512];
	struct worker w;
	int fd, sent, status;

	freed_chunk(&w, info_args);
	no_room(&w);
	cr_assert(eq(i32, raw_client_connect(fx.gmbd.sock, &fd), 0));
	/* --hello-timeout (2 s), a tick of its timer and as much again. */
	late = deadline_in_ms(3000);
	/* Refused (a tool may not rejoin), it leaves the client before hello. */
	raw_client_hello_env(&env, &h, "raw");
	h.tool = true;
	h.rejoin_id = 1;
	sent = keep_sending(fd, &env, 1);
	/* A bound for what must not come. */
	cr_assert(eq(i32, cap_wait("no hello within", 1, (int)deadline_left_ms(&late)), -ETIMEDOUT),
		  "closed for a hello it could not send");
	gmbd_fsize(RLIM_INFINITY);
	read_replies(fd, 1, sent, -EPERM);
	cr_assert(eq(i32, raw_client_hello(fd, GMB_PROTOCOL_VERSION, &status), 0));
	cr_assert(eq(i32, status, 0));
	cr_assert(eq(i32, worker_answer(&w, text, sizeof(text)), 0), "malloc b: %s", text);
	close(fd);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* ---- a watcher while replies are held ---- */

/* The next event of watcher @c, as JSON (the caller frees it). */
static char *watch_line(gmb_client *c)
{
	char *line = NULL;
	int r = gmb_watch_next(c, WAIT_MS, GMB_WATCH_JSON, &line);

	cr_assert(eq(i32, r, 1), "no event came: %d %s", r, gmb_last_error(c));
	return line;
}

static bool watch_is(const char *line, const char *kind)
{
	char want[64];

	snprintf(want, sizeof(want), "{\"kind\":\"%s\",", kind);
	return !strncmp(line, want, strlen(want));
}

/* The "missed" event's count, and its sentence says why. */
static uint64_t watch_missed(const char *line)
{
	const char *n = strstr(line, "\"count\":");

	cr_assert(not(eq(ptr, (void *)n, NULL)), "%s", line);
	cr_assert(not(eq(ptr, strstr(line, "could not store its state record"), NULL)), "%s", line);
	return strtoull(n + strlen("\"count\":"), NULL, 10);
}

Test(persist, a_watcher_while_replies_are_held_is_told_what_it_missed)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__FreeRequest fr = GMB__FREE_REQUEST__INIT;
	int fd[2], sent[2], status, nmissed = 0;
	uint64_t refused = 0, missed = 0;
	gmb_client *c;
	char text[512], *line;
	struct worker w;

	freed_chunk(&w, info_args);
	for (int i = 0; i < 2; i++) {
		cr_assert(eq(i32, raw_client_connect(fx.gmbd.sock, &fd[i]), 0));
		cr_assert(eq(i32, raw_client_hello(fd[i], GMB_PROTOCOL_VERSION, &status), 0));
		cr_assert(eq(i32, status, 0));
	}
	cr_assert(eq(i32, gmb_connect_flags(fx.gmbd.sock, "watcher", GMB_CONNECT_TOOL, &c), 0));
	cr_assert(eq(i32, gmb_watch(c), 0));
	line = watch_line(c);
	cr_assert(watch_is(line, "subscribed"), "%s", line);
	free(line);
	no_room(&w);
	/* Each refused free is an event; each client is read until
	 * SESS_HOLD_MAX_PACKETS replies wait, so two make more events than
	 * the watcher may have queued. */
	fr.alloc_id = 999;
	env.body_case = GMB__ENVELOPE__BODY_FREE;
	env.free = &fr;
	for (int i = 0; i < 2; i++)
		sent[i] = keep_sending(fd[i], &env, 2);
	cr_assert(gt(i32, sent[0] + sent[1], HANDLERS_WATCH_MAX_PACKETS + 512));
	gmbd_fsize(RLIM_INFINITY);
	for (int i = 0; i < 2; i++)
		read_replies(fd[i], 2, sent[i], -ENOENT);
	cr_assert(eq(i32, worker_answer(&w, text, sizeof(text)), 0), "malloc b: %s", text);
	/* gmbd's next event, after every refusal: the watcher still gets it. */
	worker_ok(&w, NULL, 0, "free b");
	while (!watch_is(line = watch_line(c), "free")) {
		cr_assert(not(watch_is(line, "dropped") || watch_is(line, "lost")), "%s", line);
		refused += watch_is(line, "refused");
		if (watch_is(line, "missed")) {
			missed = watch_missed(line);
			nmissed++;
		}
		free(line);
	}
	free(line);
	cr_assert(eq(i32, nmissed, 1));
	/* Every refusal was either sent or counted. */
	cr_assert(eq(u64, refused + missed, (uint64_t)(sent[0] + sent[1])),
		  "%" PRIu64 " + %" PRIu64, refused, missed);
	cr_assert(gt(u64, missed, 512));
	cr_assert(eq(i32, cap_count("watcher fell behind"), 0));
	gmb_close(c);
	for (int i = 0; i < 2; i++)
		close(fd[i]);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* ---- FileDescriptorStoreMax= lower than --fdstore-max ---- */

static const char *const small_args[] = { "--host-memory", "64MiB", "--max-chunk", CHUNK,
					  "--log-level",   "info",  NULL };

/* The state and 3 chunks fit a unit limit of 4: three allocations. */
static void fill_small_store(struct worker *w)
{
	fx.sd.limit = 4;
	gmbd_up(small_args);
	worker_up_on(w, fx.gmbd.sock, "trainer");
	worker_ok(w, NULL, 0, "malloc a " CHUNK);
	worker_ok(w, NULL, 0, "malloc b " CHUNK);
	worker_ok(w, NULL, 0, "malloc c " CHUNK);
	worker_ok(w, NULL, 0, "fill c 0x11");
}

Test(persist, a_lower_unit_limit_is_said_at_start_and_refused_past)
{
	char text[512];
	struct worker w;
	int rc;

	fx.sd.announce = true;
	fill_small_store(&w);
	rc = worker_cmd(&w, text, sizeof(text), "malloc d " CHUNK);
	cr_assert(eq(i32, fake_sd_sync(&fx.sd), 0));
	cr_assert(eq(u32, fx.sd.dropped, 0), "lent a chunk whose fd the manager closed");
	cr_assert(eq(i32, rc, -ENOSPC), "malloc d: %d %s", rc, text);
	cr_assert(not(eq(ptr, strstr(text, "FileDescriptorStoreMax=4"), NULL)), "%s", text);
	/* The log comes its own way: READY=1 may overtake it. */
	cr_assert(eq(i32,
		     cap_wait("FileDescriptorStoreMax= is lower than --fdstore-max", 1, WAIT_MS),
		     0));
	cr_assert(eq(i32, cap_count("FileDescriptorStoreMax=4 fdstore_max=16384"), 1));
	/* Still serving: with a chunk given back there is room again. */
	worker_ok(&w, NULL, 0, "free a");
	worker_ok(&w, NULL, 0, "malloc d " CHUNK);
	worker_ok(&w, NULL, 0, "fill d 0x22");
	restart_keeps(&w, "c", "0x11");
	worker_ok(&w, NULL, 0, "check d 0x22");
	cr_assert(eq(i32, fake_sd_sync(&fx.sd), 0));
	cr_assert(eq(u32, fx.sd.dropped, 0));
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* Without $FDSTORE and a bus to ask, the mismatch shows at the restart. */
Test(persist, an_unknown_lower_limit_is_said_at_the_restart)
{
	struct worker w;

	fill_small_store(&w);
	cr_assert(eq(i32, cap_wait("cannot check the unit's FileDescriptorStoreMax=", 1, WAIT_MS),
		     0));
	worker_ok(&w, NULL, 0, "malloc d " CHUNK);
	gmbd_kill();
	cr_assert(eq(u32, fx.sd.dropped, 1), "the fake manager did not drop the fourth chunk");
	gmbd_up(small_args);
	cr_assert(eq(i32, cap_wait("did not hand back", 1, WAIT_MS), 0));
	cr_assert(eq(i32, cap_count("lost_chunks=1 fdstore_max=16384"), 1));
	worker_kill(&w);
}

/* ---- a lower --max-chunks-per-uid after a restart ---- */

static const char *const unbound_args[] = {
	"--host-memory",	"64MiB", "--max-chunk", CHUNK, "--log-level", "info",
	"--max-chunks-per-uid", "0",	 NULL
};
static const char *const bound2_args[] = {
	"--host-memory",	"64MiB", "--max-chunk", CHUNK, "--log-level", "info",
	"--max-chunks-per-uid", "2",	 NULL
};

/* A worker of uid nobody: the folder and the socket opened to it first. */
static void worker_up_nobody(struct worker *w, const char *name)
{
	char text[512];

	cr_assert(eq(i32, chmod(fx.dir, 0711), 0));
	cr_assert(eq(i32, chmod(fx.gmbd.sock, 0666), 0));
	cr_assert(eq(i32, worker_start(w, fx.gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "uid 65534"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "connect %s", name), 0), "%s", text);
}

/*
 * Restored with a bound lower than what a uid holds, gmbd keeps every chunk
 * (the client maps them), says once which uid is over which bound, refuses
 * that uid's requests until it is under, and serves other uids meanwhile.
 */
Test(persist, restored_chunks_past_a_lower_uid_bound_are_kept_counted_and_said)
{
	char text[512], said[128], want[128], *before, *after;
	struct worker w, other;

	gmbd_up(unbound_args);
	worker_up_on(&w, fx.gmbd.sock, "trainer");
	worker_ok(&w, NULL, 0, "malloc a " CHUNK);
	worker_ok(&w, NULL, 0, "malloc b " CHUNK);
	worker_ok(&w, NULL, 0, "malloc c " CHUNK);
	worker_ok(&w, NULL, 0, "fill c 0x33");
	before = status_json_on(fx.gmbd.sock);
	gmbd_kill();
	gmbd_up(bound2_args);
	worker_ok(&w, NULL, 0, "check c 0x33");
	after = status_json_on(fx.gmbd.sock);
	cr_assert(eq(str, after, before), "status changed across the restart");
	free(before);
	free(after);

	snprintf(said, sizeof(said), "uid=%u chunks=3 max_chunks_per_uid=2", (unsigned)getuid());
	cr_assert(eq(i32, cap_wait(said, 1, WAIT_MS), 0), "not said: %s", said);
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "malloc d " CHUNK), -ENOSPC), "%s",
		  text);
	snprintf(want, sizeof(want), "uid %u has 3 chunks lent", (unsigned)getuid());
	cr_assert(not(eq(ptr, strstr(text, want), NULL)), "%s", text);
	cr_assert(not(eq(ptr, strstr(text, "--max-chunks-per-uid"), NULL)), "%s", text);

	worker_up_nobody(&other, "other");
	worker_ok(&other, NULL, 0, "malloc a " CHUNK);
	worker_ok(&other, NULL, 0, "fill a 0x44");
	/* At the bound is not under it; one chunk fewer is. */
	worker_ok(&w, NULL, 0, "free a");
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "malloc d " CHUNK), -ENOSPC), "%s",
		  text);
	worker_ok(&w, NULL, 0, "free b");
	worker_ok(&w, NULL, 0, "malloc d " CHUNK);
	worker_ok(&w, NULL, 0, "check c 0x33");
	worker_ok(&other, NULL, 0, "check a 0x44");
	cr_assert(eq(i32, cap_count(said), 1), "said more than once");
	cr_assert(eq(i32, worker_quit(&other), 0));
	cr_assert(eq(i32, worker_quit(&w), 0));
}
