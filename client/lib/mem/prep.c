/*
 * prep.c - host memory made ready for copies, and the worker that makes a
 * PRESERVE allocation's retained pinned copy ahead of its first pause.
 *
 * Why ahead: the backend's pinned memory (cuMemHostAlloc) costs about
 * 0.45 s per GiB, zeroing and pinning on one thread, and made at the first
 * pause it made that pause 25 times slower than the next ones; made in
 * gmb_malloc it made allocation as slow. Here it is made off the allocating
 * thread right after the allocation: fresh anonymous memory (2 MiB aligned,
 * transparent huge pages), faulted in by several threads, registered with
 * the backend piece by piece, each piece's registration running while the
 * threads fault in the next. A piece is bounded (256 MiB, ~10-20 ms of
 * the driver) and the worker sleeps briefly after each one: the driver
 * serializes a process's calls, and registrations back to back would hold
 * the application's calls for the whole copy. Nor does the worker start
 * while the application allocates: a burst of allocations (a model's
 * tensors, PyTorch's segments) ran 3 times slower with copies being made
 * under it, so a job waits until the client has been quiet for
 * PREP_QUIET_NS: no allocation, pause or resume, of any mode
 * (gmb__prep_busy()). A job already being made waits again between its
 * pieces whenever the client is busy, unless a pause waits for it.
 *
 * A job is QUEUED (in the queue and the map), RUNNING (its maker, the
 * worker or a pause that took it over, owns the memory), then READY or
 * FAILED until taken or cancelled. Cancelling a RUNNING job orphans it: out
 * of the map, its maker frees it once it sees that (between pieces). The
 * queue and the map are under pr->lock; the fields a maker writes are read
 * by others only after its state changed under the lock. No backend call
 * runs under the lock, and the worker takes no other lock: a pause that
 * waits for it under the client's operation lock cannot deadlock.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/mem/prep.h"
#include "common/list.h"
#include "common/err.h"
#include "common/idmap.h"

/* Each thread of a parallel copy or touch gets at least this many bytes. */
#define PREP_PAR_MIN	(4ULL << 20)
/* The pause after each registration that lets the application's driver calls in. */
#define PREP_BREATHE_NS 200000L
/* How long after the last submitted copy the worker starts: a burst of allocations ends. */
#define PREP_QUIET_NS	30000000L

/* Parallel copies and first touch. */

static void *prep_part_run(void *arg)
{
	struct gmb__prep_part *q = arg;

	if (q->src) {
		memcpy(q->dst, q->src, q->n);
		return NULL;
	}
	/* One write per page faults it in (a huge page at its first); fresh memory reads zero. */
	for (size_t off = 0; off < q->n; off += 4096)
		((volatile char *)q->dst)[off] = 0;
	return NULL;
}

void gmb__prep_par_start(struct gmb__prep_par *g, void *dst, const void *src, size_t n,
			 bool keep_last)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	size_t k = n / PREP_PAR_MIN, each, off = 0;

	if (k > GMB__PREP_PAR_MAX)
		k = GMB__PREP_PAR_MAX;
	if (ncpu > 0 && k > (size_t)ncpu)
		k = (size_t)ncpu;
	if (k < 1)
		k = 1;
	each = (n / k + 4095) & ~(size_t)4095;
	g->k = 0;
	for (size_t i = 0; i < k && off < n; i++) {
		struct gmb__prep_part *q = &g->part[g->k++];

		*q = (struct gmb__prep_part){ (char *)dst + off,
					      src ? (const char *)src + off : NULL,
					      n - off < each ? n - off : each, false };
		off += q->n;
		/* A part whose thread cannot start is the joiner's, as the kept one is. */
		if (!keep_last || (off < n && i + 1 < k))
			q->started = pthread_create(&g->th[i], NULL, prep_part_run, q) == 0;
	}
}

void gmb__prep_par_join(struct gmb__prep_par *g)
{
	for (size_t i = 0; i < g->k; i++)
		if (!g->part[i].started)
			prep_part_run(&g->part[i]);
	for (size_t i = 0; i < g->k; i++)
		if (g->part[i].started)
			pthread_join(g->th[i], NULL);
	g->k = 0;
}

/*
 * Fresh memory: a copy written at a pause, or faulted in here, is bound by
 * the faults of its first touch, and a huge page is one fault where small
 * pages are 512 (the kernel still zeroes it). Where huge pages are off, or
 * the alignment cannot be had, it is ordinary memory.
 */
void *gmb__prep_map(uint64_t size, bool reserve)
{
	const uint64_t huge = 2ULL << 20;
	const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (reserve ? 0 : MAP_NORESERVE);
	char *p, *aligned, *end;
	uint64_t head;

	if (size < huge)
		return mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
	p = mmap(NULL, size + huge, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED)
		return MAP_FAILED;
	aligned = (char *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
	head = (uint64_t)(aligned - p);
	/* The copy is freed as [aligned, aligned + size): trim the rest now. */
	end = (char *)(((uintptr_t)aligned + size + page - 1) & ~(page - 1));
	if (head)
		munmap(p, head);
	if (end < p + size + huge)
		munmap(end, (size_t)(p + size + huge - end));
	(void)madvise(aligned, size, MADV_HUGEPAGE);
	return aligned;
}

/* Registration in pieces. */

static uint64_t prep_piece_len(uint64_t size, uint64_t piece, uint64_t i)
{
	return size - i * piece < piece ? size - i * piece : piece;
}

static uint64_t prep_npieces(uint64_t size, uint64_t piece)
{
	return (size + piece - 1) / piece;
}

static void prep_unregister_first(struct backend *be, char *p, uint64_t size, uint64_t piece,
				  uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		be->ops->host_unregister(be, p + i * piece, prep_piece_len(size, piece, i));
}

int gmb__prep_register(struct backend *be, void *p, uint64_t size, uint64_t piece, char *err)
{
	uint64_t n;
	int rc = 0;

	piece = piece ? piece : size;
	n = prep_npieces(size, piece);
	for (uint64_t i = 0; i < n && rc == 0; i++) {
		rc = be->ops->host_register(be, (char *)p + i * piece,
					    prep_piece_len(size, piece, i));
		if (rc < 0) {
			prep_unregister_first(be, p, size, piece, i);
			return backend_fail_msg(err, rc, "registering a host copy");
		}
	}
	return 0;
}

void gmb__prep_unregister(struct backend *be, void *p, uint64_t size, uint64_t piece)
{
	piece = piece ? piece : size;
	prep_unregister_first(be, p, size, piece, prep_npieces(size, piece));
}

/* The worker. */

enum {
	PREP_QUEUED,
	PREP_RUNNING,
	PREP_READY,
	PREP_FAILED
};

struct prep_job {
	uintptr_t key; /* the allocation's base address */
	uint64_t size, piece;
	int state;   /* PREP_* */
	bool orphan; /* cancelled while RUNNING: its maker frees it */
	bool wanted; /* a pause waits for it: no more waits for quiet */
	void *p;     /* READY: the copy, owned by the job until taken */
	int rc;	     /* FAILED */
	char err[ERR_MSG_MAX];
	struct prep_job *prev, *next; /* QUEUED: in the queue, newest first */
};

struct gmb__prep {
	struct backend *be;
	pthread_mutex_t lock;
	pthread_cond_t work;	/* the worker's: a job queued, or stop */
	pthread_cond_t done;	/* a making ended */
	struct idmap jobs;	/* key -> job, until taken or cancelled */
	struct prep_job *queue; /* newest first: any order serves (a pause waits for its own) */
	pthread_t worker;
	/* CLOCK_MONOTONIC of the client's last allocation, pause, resume or
	 * submit: written without the lock (gmb__prep_busy()), atomically. */
	uint64_t busy_ns;
	bool started, stop;
	char last_err[ERR_MSG_MAX];
};

/* Frees @j and its copy, if it has one; no lock held (backend calls). */
static void prep_job_free(struct backend *be, struct prep_job *j)
{
	if (j->p) {
		gmb__prep_unregister(be, j->p, j->size, j->piece);
		munmap(j->p, j->size);
	}
	free(j);
}

static uint64_t prep_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Waits on pr->work (CLOCK_MONOTONIC) until @when_ns at the latest; pr->lock held. */
static void prep_wait_until(struct gmb__prep *pr, uint64_t when_ns)
{
	struct timespec ts = { .tv_sec = (time_t)(when_ns / 1000000000ULL),
			       .tv_nsec = (long)(when_ns % 1000000000ULL) };

	pthread_cond_timedwait(&pr->work, &pr->lock, &ts);
}

static void prep_breathe(void)
{
	struct timespec ts = { 0, PREP_BREATHE_NS };

	nanosleep(&ts, NULL);
}

/* When the client's quiet begins: PREP_QUIET_NS after its last busy moment. */
static uint64_t prep_quiet_ns(struct gmb__prep *pr)
{
	return __atomic_load_n(&pr->busy_ns, __ATOMIC_RELAXED) + PREP_QUIET_NS;
}

/*
 * Between two pieces of a making: whether its maker should stop (the job
 * was cancelled, or the client closes). The worker (@worker) first waits
 * while the client is busy, so that its next registration does not hold
 * the driver under the client's calls; not once a pause wants the copy.
 */
static bool prep_stopped(struct gmb__prep *pr, struct prep_job *j, bool worker)
{
	bool stop;

	pthread_mutex_lock(&pr->lock);
	for (uint64_t q; worker && !j->wanted && !j->orphan && !pr->stop &&
			 prep_now_ns() < (q = prep_quiet_ns(pr));)
		prep_wait_until(pr, q);
	stop = j->orphan || pr->stop;
	pthread_mutex_unlock(&pr->lock);
	return stop;
}

/*
 * Makes @j's copy on this thread (j->p on success, j->err on failure):
 * piece i is faulted in by the touch threads while this thread registers
 * piece i - 1. Cancelled between pieces: -ECANCELED, nothing left.
 */
static int prep_make(struct gmb__prep *pr, struct prep_job *j, bool worker)
{
	struct backend *be = pr->be;
	uint64_t n = prep_npieces(j->size, j->piece), nreg = 0;
	struct gmb__prep_par g;
	char *p = gmb__prep_map(j->size, true);
	int rc = 0;

	if (p == MAP_FAILED)
		return err_fmt(j->err, -ENOMEM, "mapping a host copy of %" PRIu64 " bytes: %s",
			       j->size, strerror(errno));
	for (uint64_t i = 0; i <= n && rc == 0; i++) {
		if (i < n)
			gmb__prep_par_start(&g, p + i * j->piece, NULL,
					    prep_piece_len(j->size, j->piece, i), false);
		if (i > 0) {
			rc = be->ops->host_register(be, p + (i - 1) * j->piece,
						    prep_piece_len(j->size, j->piece, i - 1));
			if (rc < 0)
				backend_fail_msg(j->err, rc, "registering a host copy");
			else
				nreg = i;
			prep_breathe();
		}
		if (i < n)
			gmb__prep_par_join(&g);
		if (rc == 0 && prep_stopped(pr, j, worker && i < n))
			rc = err_fmt(j->err, -ECANCELED, "the host copy was no longer wanted");
	}
	if (rc < 0) {
		prep_unregister_first(be, p, j->size, j->piece, nreg);
		munmap(p, j->size);
		return rc;
	}
	j->p = p;
	return 0;
}

/* The end of @j's making; pr->lock held. A cancelled one is the caller's to free (true). */
static bool prep_ended(struct gmb__prep *pr, struct prep_job *j, int rc)
{
	if (j->orphan)
		return true;
	j->state = rc == 0 ? PREP_READY : PREP_FAILED;
	j->rc = rc;
	if (rc < 0 && rc != -ECANCELED)
		snprintf(pr->last_err, sizeof(pr->last_err), "%s", j->err);
	pthread_cond_broadcast(&pr->done);
	return false;
}

static void *prep_worker(void *arg)
{
	struct gmb__prep *pr = arg;

	pthread_mutex_lock(&pr->lock);
	for (;;) {
		struct prep_job *j;
		uint64_t quiet;
		int rc;

		while (!pr->stop && !pr->queue)
			pthread_cond_wait(&pr->work, &pr->lock);
		if (pr->stop)
			break;
		/* Each busy moment moves the start on; a pause may take a queued job meanwhile. */
		quiet = prep_quiet_ns(pr);
		if (prep_now_ns() < quiet) {
			prep_wait_until(pr, quiet);
			continue;
		}
		j = pr->queue;
		DLIST_UNLINK(pr->queue, j);
		j->state = PREP_RUNNING;
		pthread_mutex_unlock(&pr->lock);
		rc = prep_make(pr, j, true);
		pthread_mutex_lock(&pr->lock);
		if (prep_ended(pr, j, rc)) {
			pthread_mutex_unlock(&pr->lock);
			prep_job_free(pr->be, j);
			pthread_mutex_lock(&pr->lock);
		}
	}
	pthread_mutex_unlock(&pr->lock);
	return NULL;
}

/* Library threads take no signals: those belong to the application's threads. */
static void prep_start_worker(struct gmb__prep *pr)
{
	sigset_t all, old;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	/* Without a worker the jobs stay queued, and the first pause makes each. */
	pr->started = pthread_create(&pr->worker, NULL, prep_worker, pr) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static struct gmb__prep *prep_new(struct backend *be)
{
	struct gmb__prep *pr = calloc(1, sizeof(*pr));
	pthread_condattr_t attr;

	if (!pr)
		return NULL;
	pr->be = be;
	pthread_mutex_init(&pr->lock, NULL);
	/* The worker's quiet wait is timed on the monotonic clock. */
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&pr->work, &attr);
	pthread_condattr_destroy(&attr);
	pthread_cond_init(&pr->done, NULL);
	return pr;
}

int gmb__prep_submit(struct gmb__prep **pp, struct backend *be, uintptr_t key, uint64_t size,
		     uint64_t piece)
{
	struct gmb__prep *pr = *pp ? *pp : prep_new(be);
	struct prep_job *j;
	int rc = 0;

	if (!pr)
		return -ENOMEM;
	*pp = pr;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	*j = (struct prep_job){ .key = key, .size = size, .piece = piece ? piece : size };
	pthread_mutex_lock(&pr->lock);
	if (idmap_get(&pr->jobs, key))
		rc = 1;
	else
		rc = idmap_put(&pr->jobs, key, j);
	if (rc == 0) {
		gmb__prep_busy(pr);
		DLIST_PUSH(pr->queue, j);
		if (!pr->started)
			prep_start_worker(pr);
		pthread_cond_signal(&pr->work);
	}
	pthread_mutex_unlock(&pr->lock);
	if (rc != 0)
		free(j);
	return rc < 0 ? rc : 0;
}

int gmb__prep_take(struct gmb__prep *pr, uintptr_t key, struct gmb__prep_copy *out, char *err)
{
	struct prep_job *j;
	int rc;

	if (!pr)
		return 0;
	pthread_mutex_lock(&pr->lock);
	j = idmap_get(&pr->jobs, key);
	if (!j) {
		pthread_mutex_unlock(&pr->lock);
		return 0;
	}
	/* Not started: this thread makes it, rather than wait behind the others. */
	if (j->state == PREP_QUEUED) {
		DLIST_UNLINK(pr->queue, j);
		j->state = PREP_RUNNING;
		pthread_mutex_unlock(&pr->lock);
		rc = prep_make(pr, j, false);
		pthread_mutex_lock(&pr->lock);
		prep_ended(pr, j, rc);
	}
	/* The worker's making: no more waits for the client to be quiet. */
	j->wanted = true;
	pthread_cond_broadcast(&pr->work);
	while (j->state == PREP_RUNNING)
		pthread_cond_wait(&pr->done, &pr->lock);
	idmap_del(&pr->jobs, key);
	pthread_mutex_unlock(&pr->lock);
	rc = j->state == PREP_READY ? 1 : err_fmt(err, j->rc, "%s", j->err);
	if (rc == 1)
		*out = (struct gmb__prep_copy){ .p = j->p, .size = j->size, .piece = j->piece };
	free(j);
	return rc;
}

void gmb__prep_cancel(struct gmb__prep *pr, uintptr_t key)
{
	struct prep_job *j;

	if (!pr)
		return;
	pthread_mutex_lock(&pr->lock);
	j = idmap_del(&pr->jobs, key);
	if (j && j->state == PREP_QUEUED)
		DLIST_UNLINK(pr->queue, j);
	if (j && j->state == PREP_RUNNING) {
		j->orphan = true;
		j = NULL;
		pthread_cond_broadcast(&pr->work); /* its maker may wait for quiet */
	}
	pthread_mutex_unlock(&pr->lock);
	if (j)
		prep_job_free(pr->be, j);
}

void gmb__prep_busy(struct gmb__prep *pr)
{
	if (pr)
		__atomic_store_n(&pr->busy_ns, prep_now_ns(), __ATOMIC_RELAXED);
}

void gmb__prep_last_error(struct gmb__prep *pr, char *buf, size_t cap)
{
	if (!cap)
		return;
	buf[0] = 0;
	if (!pr)
		return;
	pthread_mutex_lock(&pr->lock);
	snprintf(buf, cap, "%s", pr->last_err);
	pthread_mutex_unlock(&pr->lock);
}

void gmb__prep_close(struct gmb__prep **pp)
{
	struct gmb__prep *pr = *pp;
	uint64_t key;
	void *val;

	if (!pr)
		return;
	pthread_mutex_lock(&pr->lock);
	pr->stop = true;
	pthread_cond_broadcast(&pr->work);
	pthread_mutex_unlock(&pr->lock);
	/* The worker ends its job first: cut short between pieces, or made. */
	if (pr->started)
		pthread_join(pr->worker, NULL);
	for (size_t it = 0; idmap_next(&pr->jobs, &it, &key, &val);)
		prep_job_free(pr->be, val);
	idmap_deinit(&pr->jobs);
	pthread_cond_destroy(&pr->done);
	pthread_cond_destroy(&pr->work);
	pthread_mutex_destroy(&pr->lock);
	free(pr);
	*pp = NULL;
}
