/*
 * lend.h - allocations and their lends (daemon/core/lend.c): alloc, free,
 * pause, resume, giving single allocations back ahead of their tag's pause
 * (and lending to them again), and undoing a resume's lends that never left.
 *
 * Invariants (with broker.h's and pool.h's):
 *   - An allocation is active exactly while its last lend's chunks are
 *     lent to it (chunk->lent_to), all of them, covering its size; a
 *     paused one lends nothing, and its last lend stays held by its client
 *     until a new lend replaces it or a drop clears entries.
 *   - alloc and resume are all or nothing: on failure every allocation,
 *     lend and hold is as before the call (idle chunks nobody could see
 *     may have gone back to the backend, and -EAGAIN's releasing marks
 *     stay, so that the retry finds the memory).
 *   - The chunks lent to one uid's active allocations stay within
 *     --max-chunks-per-uid (ENOSPC past it), and new chunks within what
 *     gmbd's open files leave room for (EMFILE).
 *
 * Ownership: the broker owns every allocation; @res's array is the
 * result's (broker_result_deinit() it), the allocations and chunks it
 * points to stay the broker's and valid until its next call. @err
 * (ERR_MSG_MAX bytes, may be NULL) gets a sentence on failure.
 */
#ifndef GMB_LEND_H
#define GMB_LEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/core/broker.h"

/**
 * lend_alloc() - a new allocation of @size bytes on @dev in @c's tag
 * @tag (made if new), lent at once: @res (always initialized here) gets
 * it and the chunks whose fds must go out first.
 * Return: 0; -ENODEV, -EINVAL (size 0 or a bad tag name), -EBUSY (the tag
 * is paused), -ENOSPC (the allocation or tag limit, or the per-uid chunk
 * bound), -ENOMEM (the budget is taken: @err names who holds the device's
 * memory; also a size over the budget), -EAGAIN (chunks were marked
 * releasing: park it, flush the drops, retry after broker_dropped()),
 * -EMFILE; @res->short_dev and short_bytes say what was missing.
 */
int lend_alloc(struct broker *br, struct bclient *c, int dev, uint64_t size, const char *tag,
	       struct broker_result *res, char *err);
/**
 * lend_free() - allocation @alloc_id of @c is freed: its chunks
 * back to the pool, its client's holds of them dropped.
 * Return: 0, or -ENOENT for an allocation @c does not have.
 */
int lend_free(struct broker *br, struct bclient *c, uint64_t alloc_id, char *err);
/**
 * lend_pause() - @c's tag @tag (NULL or "": every tag) stops being lent:
 * its chunks go back to the pool, still held by @c, unless @released
 * (HelloReply.release_on_pause: the client lets go of the paused
 * allocations' handles), then @c stops holding them and chunks nobody
 * holds go back to the backend within the call (with a keep limit of 0).
 * Pausing a paused tag succeeds and does nothing.
 * Return: 0, or -ENOENT for a tag @c does not have.
 */
int lend_pause(struct broker *br, struct bclient *c, const char *tag, bool released, char *err);
/**
 * lend_give_back() - allocations @ids of @c stop being lent, as
 * lend_pause() pauses a tag, while their tags stay active: a pause that
 * hands each allocation back once its bytes are saved (a pause of the
 * tags follows). Ids that lend nothing already are skipped.
 * Return: 0 (nothing given back on failure); -ENOENT for an allocation @c
 * does not have; -EBUSY while another process maps memory of its tag.
 */
int lend_give_back(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n,
		   bool released, char *err);
/**
 * lend_resume() - @c's tag @tag (NULL or "": every tag) is lent again,
 * onto its last lend's chunks when they are still free, else onto others;
 * @res as for lend_alloc(). Resuming an active tag succeeds and does
 * nothing.
 * Return: 0; -ENOENT for a tag @c does not have; else as lend_alloc().
 */
int lend_resume(struct broker *br, struct bclient *c, const char *tag, struct broker_result *res,
		char *err);
/**
 * lend_resume_given() - allocations @ids of @c's active tags that
 * lend_give_back() gave back are lent again (a pause that failed after it
 * puts them back); those lent to already are skipped; @res as for
 * lend_alloc().
 * Return: 0; -EINVAL for an id named twice; -ENOENT for an allocation @c
 * does not have; -EBUSY for one of a paused tag; else as lend_alloc().
 */
int lend_resume_given(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n,
		      struct broker_result *res, char *err);
/**
 * lend_undo() - the lends of @ids (allocations of @c a resume lent)
 * never reached the client: each is paused again with its last lend
 * cleared (the client clears its own: ResumeReply.lends_cleared), its
 * chunks back in the pool, and its tag paused, as is every other tag that
 * resume made active and that has no active allocation (a tag without
 * memory that a resume of every tag named): the client, which never got
 * the reply, has them all paused. Ids @c does not have are skipped.
 * @given: the lends were lend_resume_given()'s: the allocations are given
 * back again and their tags stay active.
 * Return: nothing; it cannot fail.
 */
void lend_undo(struct broker *br, struct bclient *c, const uint64_t *ids, size_t n, bool given);
/**
 * lend_warn_uid_bounds() - logs each uid whose clients hold more chunks
 * than --max-chunks-per-uid (restored under a lower bound: all kept, more
 * refused until under).
 * Return: nothing.
 */
void lend_warn_uid_bounds(const struct broker *br);

#endif
