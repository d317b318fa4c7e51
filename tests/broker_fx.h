/*
 * broker_fx.h - the broker's unit tests' fixture: gmbd's core (a broker)
 * over the real host backend of two devices of 8 GiB, 2 MiB granularity and
 * 1 GiB chunks, one per test (bfx_setup/bfx_teardown as the suite's .init
 * and .fini), and the steps the tests take on it.
 *
 * Every step that changes the broker (bfx_alloc_ok, bfx_alloc_rc,
 * bfx_resume_ok, bfx_resume_rc, bfx_pause_ok, bfx_free_ok, bfx_flush) ends
 * with bfx_check(), which recomputes every counter and holder reference
 * from the allocations and compares: per pool, the free list sorted largest
 * first and its bytes, the pending bytes, held = lent + free + pending
 * within the budget; per tag, its bytes and allocation count; per client,
 * its allocations and the chunks it really has lent (the per-uid bound);
 * an active lend covering its allocation with chunks lent to it; each
 * holder's refs recounted from the last lends; as many backend chunks
 * alive (memfds) as the pools count. The core's state is redundant on
 * purpose, and this is where the redundancy is proven. bfx_teardown()
 * checks that broker_free() left no chunk and no heap allocation behind.
 *
 * Every function asserts with Criterion: only Criterion test binaries link it.
 */
#ifndef GMB_TEST_BROKER_FX_H
#define GMB_TEST_BROKER_FX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/backend/backend.h"
#include "daemon/core/broker.h"

#define MiB	(1024ULL * 1024)
#define GiB	(1024 * MiB)
/* A count bfx_alloc_ok() does not check. */
#define BFX_ANY SIZE_MAX

/* The running test's backend and broker, both owned by the fixture. */
extern struct backend *bfx_be;
extern struct broker *bfx_br;

/* What broker_flush_drops() handed over at the last bfx_flush(). */
struct bfx_drops {
	struct bclient *c[8];
	uint64_t ids[8][16];
	size_t n[8];
	int calls;
};
extern struct bfx_drops bfx_drops;

/* Checks every invariant above against the broker as it is now. */
void bfx_check(void);

/* Everything a failed call must leave as it was, as text, into @buf of @cap bytes. */
void bfx_snapshot(char *buf, size_t cap);

/* Replaces the broker by a new one with @budget per device (0: none) and
 * @keep bytes kept warm per pool. */
void bfx_open(uint64_t budget, uint64_t keep);

/* A suite's .init (no budget, everything kept warm) and .fini. */
void bfx_setup(void);
void bfx_teardown(void);

/* A new client of the broker (it owns it) with the peer's credentials:
 * gid @uid, and @ngroups supplementary @groups. */
struct bclient *bfx_client_gid(const char *name, pid_t pid, uid_t uid, const gid_t *groups,
			       int ngroups);
struct bclient *bfx_client(const char *name, pid_t pid, uid_t uid);

/* Allocates, checks how many chunks and fds it took (UINT32_MAX, BFX_ANY:
 * not checked), returns the allocation (the broker's). */
struct balloc *bfx_alloc_ok(struct bclient *c, int dev, uint64_t size, const char *tag,
			    uint32_t want_chunks, size_t want_send);

/* Allocates; a refusal must hand nothing over. Return: lend_alloc()'s result. */
int bfx_alloc_rc(struct bclient *c, int dev, uint64_t size, const char *tag, char *err);

/* Resumes @tag, checks how many allocations and fds came back. */
void bfx_resume_ok(struct bclient *c, const char *tag, size_t want_allocs, size_t want_send);

/* Resumes @tag. Return: lend_resume()'s result. */
int bfx_resume_rc(struct bclient *c, const char *tag, char *err);

/* Pauses @tag (NULL: every tag), handles kept. */
void bfx_pause_ok(struct bclient *c, const char *tag);

/* Frees @a, which must succeed. */
void bfx_free_ok(struct bclient *c, struct balloc *a);

/* Sends the drops owed into bfx_drops, checks broker_flush_drops() made
 * @want_calls calls. */
void bfx_flush(int want_calls);

#endif
