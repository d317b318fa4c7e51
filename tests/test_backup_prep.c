/*
 * test_backup_prep.c - a PRESERVE allocation's retained pinned copy is made
 * right after gmb_malloc, off the allocating thread (client/lib/mem/prep.c),
 * against a real gmbd (host backend): the first pause takes it instead of
 * allocating one, a pause that comes first waits for it or makes it, a free
 * or a close while it is being made leaves nothing behind, and a making that
 * fails leaves the first pause to the backend's host memory.
 *
 * The client runs in this process and its backend's host memory calls go
 * through a spy (a copy of its ops): it counts registrations (and the
 * thread that made each, and when), unregistrations and host allocations, holds the
 * making in a registration when asked, or refuses it. The copies register
 * in pieces of 4 MiB here, so that a 32 MiB copy has eight.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/api/client.h"
#include "common/backend/backend.h"
#include "include/gmb.h"
#include "tests/util.h"

#define MiB	  (1ULL << 20)
#define PIECE	  (4 * MiB)
#define SPY_CALLS 64

static struct gmbd_proc gmbd;

static void daemon_start(void)
{
	static const char *const args[] = { "--host-memory", "256MiB",	"--max-chunk", "8MiB",
					    "--log-level",   "warning", NULL };

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

static void daemon_stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(backup_prep, .init = daemon_start, .fini = daemon_stop, .timeout = 60);

/* The spy on the client's backend. */

struct spy_call {
	void *p;
	uint64_t n;
	bool on_main; /* made on the test's own thread */
	uint64_t ns;  /* CLOCK_MONOTONIC when it was called */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const struct backend_ops *real;
	struct backend_ops ops;
	pthread_t main;
	struct spy_call reg[SPY_CALLS];
	int nreg;
	uint64_t reg_bytes, unreg_bytes;
	int nallocs;	       /* host_alloc calls */
	uint64_t first_reg_ns; /* CLOCK_MONOTONIC of the first registration off the main thread */
	bool hold;	       /* the next registration off the main thread waits... */
	int hold_ms;	       /* ...until released, or this long (0: no limit) */
	bool held;	       /* a registration is waiting */
	bool refuse;	       /* registrations fail */
} spy = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void spy_deadline(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static int spy_register(struct backend *b, void *p, uint64_t size)
{
	bool on_main = pthread_equal(pthread_self(), spy.main);
	uint64_t called = test_now_ns();
	struct timespec ts;
	int rc;

	if (spy.refuse)
		return backend_fail(-ENOMEM, "spy: registration refused");
	rc = spy.real->host_register(b, p, size);
	pthread_mutex_lock(&spy.lock);
	if (!on_main && !spy.first_reg_ns)
		spy.first_reg_ns = test_now_ns();
	if (rc == 0 && spy.nreg < SPY_CALLS)
		spy.reg[spy.nreg++] = (struct spy_call){ p, size, on_main, called };
	if (rc == 0)
		spy.reg_bytes += size;
	pthread_cond_broadcast(&spy.cond);
	if (spy.hold && !on_main) {
		spy.hold = false;
		spy.held = true;
		pthread_cond_broadcast(&spy.cond);
		spy_deadline(&ts, spy.hold_ms);
		while (spy.held &&
		       (spy.hold_ms == 0 ? pthread_cond_wait(&spy.cond, &spy.lock) == 0 :
					   pthread_cond_timedwait(&spy.cond, &spy.lock, &ts) == 0))
			;
		spy.held = false;
	}
	pthread_mutex_unlock(&spy.lock);
	return rc;
}

static void spy_unregister(struct backend *b, void *p, uint64_t size)
{
	spy.real->host_unregister(b, p, size);
	pthread_mutex_lock(&spy.lock);
	spy.unreg_bytes += size;
	pthread_cond_broadcast(&spy.cond);
	pthread_mutex_unlock(&spy.lock);
}

static int spy_host_alloc(struct backend *b, uint64_t size, void **p)
{
	pthread_mutex_lock(&spy.lock);
	spy.nallocs++;
	pthread_mutex_unlock(&spy.lock);
	return spy.real->host_alloc(b, size, p);
}

/* A client whose backend goes through the spy, its copies in 4 MiB pieces. */
static gmb_client *spy_connect(const char *name)
{
	gmb_client *c = NULL;

	cr_assert(eq(i32, gmb_connect(gmbd.sock, name, &c), 0), "%s", gmb_last_error(NULL));
	/* Before its first allocation: nothing calls these yet. */
	spy.real = c->mem.be->ops;
	spy.ops = *spy.real;
	spy.ops.host_register = spy_register;
	spy.ops.host_unregister = spy_unregister;
	spy.ops.host_alloc = spy_host_alloc;
	c->mem.be->ops = &spy.ops;
	c->mem.bufs.reg_piece = PIECE;
	spy.main = pthread_self();
	return c;
}

/* Whether @what(arg) came true under the spy's lock within @ms. */
static bool spy_wait(bool (*what)(uint64_t), uint64_t arg, int ms)
{
	struct timespec ts;
	bool ok;

	spy_deadline(&ts, ms);
	pthread_mutex_lock(&spy.lock);
	while (!(ok = what(arg)) && pthread_cond_timedwait(&spy.cond, &spy.lock, &ts) == 0)
		;
	ok = what(arg);
	pthread_mutex_unlock(&spy.lock);
	return ok;
}

static bool spy_registered(uint64_t bytes)
{
	return spy.reg_bytes >= bytes;
}

static bool spy_is_held(uint64_t unused)
{
	return spy.held;
}

static bool spy_all_unregistered(uint64_t unused)
{
	return spy.unreg_bytes == spy.reg_bytes;
}

static void spy_release(void)
{
	pthread_mutex_lock(&spy.lock);
	spy.held = false;
	pthread_cond_broadcast(&spy.cond);
	pthread_mutex_unlock(&spy.lock);
}

/* Registrations made on the test's thread. */
static int spy_on_main(void)
{
	int n = 0;

	pthread_mutex_lock(&spy.lock);
	for (int i = 0; i < spy.nreg; i++)
		n += spy.reg[i].on_main;
	pthread_mutex_unlock(&spy.lock);
	return n;
}

/* Private anonymous resident bytes of this process (host copies; not the memfd chunks). */
static int64_t rss_anon(void)
{
	int64_t v = test_rss_anon();

	cr_assert(ge(i64, v, 0), "no RssAnon in /proc/self/status");
	return v;
}

static unsigned char *alloc_preserve(gmb_client *c, const char *tag, size_t n)
{
	void *p = NULL;

	cr_assert(eq(i32, gmb_tag_set_mode(c, tag, GMB_MODE_PRESERVE), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_malloc(c, &p, n, 0, tag), 0), "%s", gmb_last_error(c));
	return p;
}

/* Pause @tag; its host copy holds @seed's pattern; resume; the device does too. */
static void cycle_holds(gmb_client *c, const char *tag, unsigned char *p, size_t n, unsigned seed,
			void **host)
{
	cr_assert(eq(i32, gmb_pause(c, tag), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_host_copy(c, p, n, host), 0), "%s", gmb_last_error(c));
	cr_assert(not(eq(ptr, *host, NULL)));
	cr_assert(test_holds(*host, n, seed), "the host copy");
	cr_assert(eq(i32, gmb_resume(c, tag), 0), "%s", gmb_last_error(c));
	cr_assert(test_holds(p, n, seed), "the device after resume");
}

/* Close the client: nothing left registered, nothing leaked. */
static void close_clean(gmb_client *c)
{
	gmb_close(c);
	cr_expect(eq(u64, spy.unreg_bytes, spy.reg_bytes));
	cr_expect(eq(i32, test_leak_check(), 0), "this process leaked");
}

Test(backup_prep, the_copy_is_made_after_malloc_without_a_pause)
{
	gmb_client *c = spy_connect("ahead");
	const size_t n = 32 * MiB;
	int64_t before = rss_anon();
	unsigned char *p = alloc_preserve(c, "p", n);
	void *h = NULL, *h2 = NULL;
	uint64_t reg;

	cr_assert(spy_wait(spy_registered, n, 10000), "registered %llu of %zu bytes",
		  (unsigned long long)spy.reg_bytes, n);
	cr_assert(eq(i32, spy.nreg, (int)(n / PIECE)), "in pieces");
	cr_assert(eq(i32, spy_on_main(), 0), "off the allocating thread");
	cr_assert(ge(i64, rss_anon() - before, (int64_t)(n * 3 / 4)),
		  "faulted in before any pause: %lld bytes", (long long)(rss_anon() - before));
	test_fill(p, n, 1);
	reg = spy.reg_bytes;
	cr_assert(eq(i32, gmb_pause(c, "p"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, spy.nallocs, 0), "the pause took the copy, made no other");
	cr_assert(eq(u64, spy.reg_bytes, reg), "and registered nothing");
	cr_assert(eq(i32, gmb_resume(c, "p"), 0), "%s", gmb_last_error(c));
	cr_assert(test_holds(p, n, 1));
	/* Handed out, it is one registration: what the application copies may span pieces. */
	test_fill(p, n, 2);
	cycle_holds(c, "p", p, n, 2, &h);
	cr_assert(eq(ptr, spy.reg[spy.nreg - 1].p, h));
	cr_assert(eq(u64, spy.reg[spy.nreg - 1].n, (uint64_t)n));
	cr_assert(eq(u64, spy.unreg_bytes, (uint64_t)n), "the pieces went first");
	test_fill(p, n, 3);
	cycle_holds(c, "p", p, n, 3, &h2);
	cr_assert(eq(ptr, h2, h), "retained: the same copy");
	cr_assert(eq(i32, gmb_free(c, p), 0), "%s", gmb_last_error(c));
	cr_assert(eq(u64, spy.unreg_bytes, spy.reg_bytes),
		  "everything registered was unregistered");
	cr_assert(lt(i64, rss_anon() - before, (int64_t)(n / 4)), "and unmapped");
	gmb_close(c);
	cr_expect(eq(i32, test_leak_check(), 0), "this process leaked");
}

Test(backup_prep, copies_wait_for_a_burst_of_allocations_to_end)
{
	gmb_client *c = spy_connect("burst");
	unsigned char *p[4];
	uint64_t last = 0;

	for (int i = 0; i < 4; i++) {
		if (i == 3)
			last = test_now_ns();
		p[i] = alloc_preserve(c, "b", PIECE);
		if (i < 3)
			usleep(2000); /* an application's work between its allocations */
	}
	cr_assert(spy_wait(spy_registered, 4 * PIECE, 10000), "the copies were not made");
	cr_assert(eq(i32, spy_on_main(), 0), "off the allocating thread");
	cr_assert(ge(u64, spy.first_reg_ns, last + 20000000ULL),
		  "the first copy began %lld us after the last allocation began, within the burst",
		  (long long)((int64_t)(spy.first_reg_ns - last) / 1000));
	for (int i = 0; i < 4; i++)
		cr_assert(eq(i32, gmb_free(c, p[i]), 0), "%s", gmb_last_error(c));
	close_clean(c);
}

struct pauser {
	gmb_client *c;
	const char *tag;
	int rc;
};

static void *pauser_run(void *arg)
{
	struct pauser *q = arg;

	q->rc = gmb_pause(q->c, q->tag);
	return NULL;
}

Test(backup_prep, a_pause_while_the_copy_is_made_waits_for_it)
{
	gmb_client *c = spy_connect("wait");
	const size_t n = 32 * MiB;
	struct pauser q;
	pthread_t t;
	unsigned char *p;
	void *h = NULL;

	spy.hold = true;
	p = alloc_preserve(c, "p", n);
	cr_assert(spy_wait(spy_is_held, 0, 10000), "the making did not start");
	test_fill(p, n, 4);
	q = (struct pauser){ c, "p", -1 };
	cr_assert(eq(i32, pthread_create(&t, NULL, pauser_run, &q), 0));
	spy_release();
	pthread_join(t, NULL);
	cr_assert(eq(i32, q.rc, 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, spy.nallocs, 0), "it waited for the copy: no other was made");
	cr_assert(eq(u64, spy.reg_bytes, (uint64_t)n), "nor registered twice");
	cr_assert(eq(i32, gmb_host_copy(c, p, n, &h), 0), "%s", gmb_last_error(c));
	cr_assert(test_holds(h, n, 4), "not torn");
	cr_assert(eq(i32, gmb_resume(c, "p"), 0), "%s", gmb_last_error(c));
	cr_assert(test_holds(p, n, 4));
	close_clean(c);
}

/* When the registration @i (0: the first) was called; 0 if there is none yet. */
static uint64_t spy_reg_ns(int i)
{
	uint64_t ns;

	pthread_mutex_lock(&spy.lock);
	ns = i < spy.nreg ? spy.reg[i].ns : 0;
	pthread_mutex_unlock(&spy.lock);
	return ns;
}

/* Resume @tag, its bytes @seed's pattern again; close; nothing left registered or leaked. */
static void resume_holds_and_close(gmb_client *c, const char *tag, unsigned char *p, size_t n,
				   unsigned seed)
{
	cr_assert(eq(i32, gmb_resume(c, tag), 0), "%s", gmb_last_error(c));
	cr_assert(test_holds(p, n, seed));
	close_clean(c);
}

Test(backup_prep, a_copy_being_made_waits_between_pieces_while_the_client_allocates)
{
	gmb_client *c = spy_connect("yield");
	const size_t n = 32 * MiB;
	unsigned char *p;
	void *d[4];
	uint64_t last = 0;

	spy.hold = true;
	p = alloc_preserve(c, "p", n);
	cr_assert(spy_wait(spy_is_held, 0, 10000), "the making did not start");
	/* A burst in another tag, of another mode, begins while a piece is registered. */
	for (int i = 0; i < 4; i++) {
		if (i == 1)
			spy_release();
		if (i == 3)
			last = test_now_ns();
		cr_assert(eq(i32, gmb_malloc(c, &d[i], PIECE, 0, "d"), 0), "%s", gmb_last_error(c));
		if (i < 3)
			usleep(2000);
	}
	cr_assert(spy_wait(spy_registered, n, 10000), "the copy was not made");
	cr_assert(ge(u64, spy_reg_ns(1), last + 20000000ULL),
		  "the next piece was registered %lld us after the last allocation began",
		  (long long)((int64_t)(spy_reg_ns(1) - last) / 1000));
	for (int i = 0; i < 4; i++)
		cr_assert(eq(i32, gmb_free(c, d[i]), 0), "%s", gmb_last_error(c));
	test_fill(p, n, 5);
	cr_assert(eq(i32, gmb_pause(c, "p"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, spy.nallocs, 0), "the copy made ahead served the pause");
	resume_holds_and_close(c, "p", p, n, 5);
}

Test(backup_prep, a_pause_waiting_for_the_copy_lets_it_go_on_though_the_client_is_busy)
{
	gmb_client *c = spy_connect("hurry");
	const size_t n = 32 * MiB;
	struct pauser q;
	unsigned char *p;
	uint64_t released;
	pthread_t t;

	spy.hold = true;
	p = alloc_preserve(c, "p", n);
	cr_assert(spy_wait(spy_is_held, 0, 10000), "the making did not start");
	test_fill(p, n, 6);
	/* The pause itself is the client being busy; it must not hold up what it waits for. */
	q = (struct pauser){ c, "p", -1 };
	cr_assert(eq(i32, pthread_create(&t, NULL, pauser_run, &q), 0));
	usleep(5000);
	released = test_now_ns();
	spy_release();
	pthread_join(t, NULL);
	cr_assert(eq(i32, q.rc, 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, spy.nallocs, 0), "it waited for the copy: no other was made");
	cr_assert(lt(u64, spy_reg_ns(1), released + 15000000ULL),
		  "the next piece was registered %lld us after the release",
		  (long long)((int64_t)(spy_reg_ns(1) - released) / 1000));
	resume_holds_and_close(c, "p", p, n, 6);
}

Test(backup_prep, a_pause_makes_a_copy_the_worker_has_not_started)
{
	gmb_client *c = spy_connect("take");
	const size_t nx = 32 * MiB, ny = 8 * MiB;
	unsigned char *x, *y;
	void *h = NULL;

	spy.hold = true;
	x = alloc_preserve(c, "x", nx);
	cr_assert(spy_wait(spy_is_held, 0, 10000), "the making did not start");
	/* Queued behind x's, which the worker is held in. */
	y = alloc_preserve(c, "y", ny);
	test_fill(y, ny, 5);
	cycle_holds(c, "y", y, ny, 5, &h);
	cr_assert(eq(i32, spy_on_main(), (int)(ny / PIECE) + 1),
		  "the pause made y's copy (in pieces), then registered it whole");
	cr_assert(eq(i32, spy.nallocs, 0), "as one made ahead, not the backend's");
	spy_release();
	cr_assert(spy_wait(spy_registered, nx + ny + ny, 10000), "x's copy was not made");
	test_fill(x, nx, 6);
	cycle_holds(c, "x", x, nx, 6, &h);
	cr_assert(eq(i32, spy.nallocs, 0));
	close_clean(c);
}

Test(backup_prep, a_free_while_the_copy_is_made_does_not_wait_and_leaves_nothing)
{
	gmb_client *c = spy_connect("free");
	const size_t n = 32 * MiB;
	int64_t before = rss_anon();
	unsigned char *p;

	spy.hold = true;
	p = alloc_preserve(c, "p", n);
	cr_assert(spy_wait(spy_is_held, 0, 10000), "the making did not start");
	/* Held in its first registration: a free that waited would never return. */
	cr_assert(eq(i32, gmb_free(c, p), 0), "%s", gmb_last_error(c));
	spy_release();
	cr_assert(spy_wait(spy_all_unregistered, 0, 10000), "registered %llu, unregistered %llu",
		  (unsigned long long)spy.reg_bytes, (unsigned long long)spy.unreg_bytes);
	cr_assert(lt(i32, spy.nreg, (int)(n / PIECE)), "cut short: %d pieces", spy.nreg);
	gmb_close(c);
	cr_assert(eq(u64, spy.unreg_bytes, spy.reg_bytes));
	cr_assert(lt(i64, rss_anon() - before, (int64_t)(n / 4)), "unmapped: %lld bytes",
		  (long long)(rss_anon() - before));
	cr_expect(eq(i32, test_leak_check(), 0), "this process leaked");
}

Test(backup_prep, a_close_while_the_copy_is_made_stops_it_and_leaves_nothing)
{
	gmb_client *c = spy_connect("close");
	const size_t n = 32 * MiB;
	int64_t before = rss_anon();

	/* Held until the close has stopped it (it lets go by itself after 2 s). */
	spy.hold = true;
	spy.hold_ms = 2000;
	alloc_preserve(c, "p", n);
	cr_assert(spy_wait(spy_is_held, 0, 10000), "the making did not start");
	gmb_close(c);
	cr_assert(lt(i32, spy.nreg, (int)(n / PIECE)), "cut short: %d pieces", spy.nreg);
	cr_assert(eq(u64, spy.unreg_bytes, spy.reg_bytes), "registered %llu, unregistered %llu",
		  (unsigned long long)spy.reg_bytes, (unsigned long long)spy.unreg_bytes);
	cr_assert(lt(i64, rss_anon() - before, (int64_t)(n / 4)), "unmapped: %lld bytes",
		  (long long)(rss_anon() - before));
	cr_expect(eq(i32, test_leak_check(), 0), "this process leaked");
}

Test(backup_prep, a_failed_copy_leaves_the_first_pause_to_the_backends_memory)
{
	gmb_client *c = spy_connect("refused");
	const size_t n = 8 * MiB;
	char why[ERR_MSG_MAX];
	unsigned char *p;
	void *h = NULL;

	spy.refuse = true;
	p = alloc_preserve(c, "p", n);
	test_fill(p, n, 7);
	/* Waits for the failed making if it still runs, then allocates. */
	cycle_holds(c, "p", p, n, 7, &h);
	cr_assert(eq(i32, spy.nallocs, 1), "the backend's host memory, as before");
	gmb__backup_prep_error(&c->mem.bufs, why, sizeof(why));
	cr_assert(not(eq(ptr, strstr(why, "spy: registration refused"), NULL)), "the reason: %s",
		  why);
	test_fill(p, n, 8);
	cycle_holds(c, "p", p, n, 8, &h);
	cr_assert(eq(i32, spy.nallocs, 1), "retained");
	gmb_close(c);
	cr_expect(eq(i32, test_leak_check(), 0), "this process leaked");
}

Test(backup_prep, only_retained_pinned_preserve_copies_are_made_ahead)
{
	gmb_client *c = spy_connect("kinds");
	void *d = NULL, *m = NULL, *r = NULL;

	cr_assert(eq(i32, gmb_malloc(c, &d, 4 * MiB, 0, "discard"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_region_begin_ex("mmap", GMB_MODE_PRESERVE, GMB_BACKUP_MMAP), 0));
	cr_assert(eq(i32, gmb_region_malloc(c, &m, 4 * MiB, 0), 0), "%s", gmb_region_last_error());
	cr_assert(eq(i32, gmb_region_end(), 0));
	cr_assert(eq(i32, gmb_set_retain_host_copy(0), 0));
	alloc_preserve(c, "unretained", 4 * MiB);
	/* Decided in gmb_malloc: none of these started the worker. */
	cr_assert(eq(ptr, c->mem.bufs.prep, NULL));
	cr_assert(eq(i32, gmb_set_retain_host_copy(1), 0));
	/* A tag switched to PRESERVE gets its allocations' copies made then. */
	cr_assert(eq(i32, gmb_malloc(c, &r, 8 * MiB, 0, "later"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(ptr, c->mem.bufs.prep, NULL));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "later", GMB_MODE_PRESERVE), 0));
	cr_assert(spy_wait(spy_registered, 8 * MiB, 10000), "its copy was not made");
	cr_assert(eq(i32, spy_on_main(), 0));
	test_fill(r, 8 * MiB, 9);
	cr_assert(eq(i32, gmb_pause(c, "later"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_resume(c, "later"), 0), "%s", gmb_last_error(c));
	cr_assert(test_holds(r, 8 * MiB, 9));
	cr_assert(eq(i32, spy.nallocs, 0));
	gmb_close(c);
	cr_expect(eq(i32, test_leak_check(), 0), "this process leaked");
}
