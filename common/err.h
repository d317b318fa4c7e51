/*
 * err.h - how failures travel in gmbd.
 *
 * Every function returns 0 (or a count) or a negative errno. What becomes of
 * a code depends on where it arises:
 *   - A request the daemon cannot grant (budget: -ENOMEM, permission:
 *     -EPERM, unknown tag/allocation/client: -ENOENT or -EINVAL, paused tag:
 *     -EBUSY, too many requests in flight: -EAGAIN, operator timeout:
 *     -ETIMEDOUT) becomes a reply: status = the code, error = a sentence that
 *     names the client, tag and bytes concerned. The connection stays up.
 *   - A packet that breaks the protocol (undecodable, oversized, fds where
 *     none belong, a body out of place, no hello first, a reply to nothing)
 *     disconnects that client only, after one log line naming it and the
 *     reason. Its memory returns to the pool as for any disconnect.
 *   - Failing to start (bad option, no backend, socket in use) is fatal in
 *     gmbd's main() only: one line, exit status 1. Library code never exits.
 *   - Backend (driver) failures are negative errnos with the driver's own
 *     error name in backend_last_error(); -ENOMEM from the driver is treated
 *     like an exhausted budget.
 */
#ifndef GMB_ERR_H
#define GMB_ERR_H

#define ERR_MSG_MAX 512

#endif
