/*
 * prep.h - host memory made ready for copies (prep.c): fresh pageable
 * memory, faulted in on several threads, registered with the backend in
 * bounded pieces; and a worker per client that makes the retained pinned
 * copies of PRESERVE allocations ahead of their first pause, off the
 * allocating thread.
 *
 * Layer: under backup.c, which alone calls it; it calls only the backend.
 * The worker's functions are called under the client's operation lock (one
 * caller at a time); the worker thread takes no lock of the client's, only
 * its own, and no backend call runs under that one.
 */
#ifndef GMB_CLIENT_MEM_PREP_H
#define GMB_CLIENT_MEM_PREP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/backend/backend.h"

/* The most threads a parallel copy or first touch runs on. */
#define GMB__PREP_PAR_MAX 16

/* Parallel memcpy (@src) or first touch (@src NULL) of @n bytes at @dst. */
struct gmb__prep_par {
	struct gmb__prep_part {
		void *dst;
		const void *src;
		size_t n;
		bool started; /* on a thread of its own; else run by the joiner */
	} part[GMB__PREP_PAR_MAX];
	pthread_t th[GMB__PREP_PAR_MAX];
	size_t k;
};

/* Starts the parts on threads, but the last one if @keep_last: the caller's
 * own thread runs that (and any whose thread could not start) in
 * gmb__prep_par_join(), before it waits for the others. */
void gmb__prep_par_start(struct gmb__prep_par *g, void *dst, const void *src, size_t n,
			 bool keep_last);
void gmb__prep_par_join(struct gmb__prep_par *g);

/*
 * gmb__prep_map() - @size bytes of fresh anonymous memory, 2 MiB aligned and
 * asked for transparent huge pages, or MAP_FAILED (errno set). @reserve:
 * counted against the commit limit now (memory that will be touched at
 * once), else MAP_NORESERVE. Freed with munmap(p, size).
 */
void *gmb__prep_map(uint64_t size, bool reserve);
/*
 * gmb__prep_register() - [@p, @p+@size) registered with @be, one range per
 * @piece bytes (the last shorter), so that no driver call holds the
 * process's other calls for long; on failure none stays registered. A
 * device copy must then stay inside one piece (the driver refuses one that
 * spans two registrations). @piece 0: one range.
 */
int gmb__prep_register(struct backend *be, void *p, uint64_t size, uint64_t piece, char *err);
void gmb__prep_unregister(struct backend *be, void *p, uint64_t size, uint64_t piece);

/* A copy made ahead: @size bytes at @p, registered in pieces of @piece, mapped by gmb__prep_map. */
struct gmb__prep_copy {
	void *p;
	uint64_t size;
	uint64_t piece;
};

struct gmb__prep;

/*
 * gmb__prep_submit() - queues the making of a copy of @size bytes for the
 * allocation at @key (its base address), registered in pieces of @piece,
 * and starts *@pp's worker if it has none (*@pp made on first use). Never
 * waits for the copy. A key already submitted is left as it is.
 * Return: 0; -ENOMEM (nothing queued: the first pause makes the copy).
 */
int gmb__prep_submit(struct gmb__prep **pp, struct backend *be, uintptr_t key, uint64_t size,
		     uint64_t piece);
/*
 * gmb__prep_take() - the copy made for @key, now the caller's (*@out):
 * waited for while the worker makes it, made on this thread if the worker
 * has not started it. Return: 1 (*@out set); 0 (none submitted); or the
 * making's negative errno, with its reason in @err (nothing is left).
 */
int gmb__prep_take(struct gmb__prep *pr, uintptr_t key, struct gmb__prep_copy *out, char *err);
/* Drops what was submitted for @key (freed now, or by the worker as soon as
 * it sees it while making it). Never waits. */
void gmb__prep_cancel(struct gmb__prep *pr, uintptr_t key);
/* The client is busy now (an allocation, a pause, a resume): the worker
 * starts nothing, and waits between a making's pieces, until it has been
 * quiet a while. Lock-free, cheap; @pr NULL (no copy asked for yet): nothing. */
void gmb__prep_busy(struct gmb__prep *pr);
/* The reason of the last making that failed ("" if none), into @buf. */
void gmb__prep_last_error(struct gmb__prep *pr, char *buf, size_t cap);
/* Stops and joins the worker, frees everything left; *@pp NULL. */
void gmb__prep_close(struct gmb__prep **pp);

#endif
