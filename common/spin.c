/*
 * spin.c - bounded busy waits; see spin.h.
 */
#include <poll.h>
#include <sched.h>

#include "common/deadline.h"
#include "common/spin.h"

bool spin_until(bool (*ready)(void *arg), void *arg, uint64_t budget_ns)
{
	uint64_t until;

	if (ready(arg))
		return true;
	if (budget_ns == 0)
		return false;
	until = deadline_now_ns() + budget_ns;
	do {
		sched_yield();
		if (ready(arg))
			return true;
	} while (deadline_now_ns() < until);
	return false;
}

static bool spin_fd_ready(void *arg)
{
	struct pollfd p = { .fd = *(int *)arg, .events = POLLIN };

	/* An error or hang-up counts: the blocking read that follows sees it. */
	return poll(&p, 1, 0) > 0;
}

bool spin_fd_readable(int fd, uint64_t budget_ns)
{
	return spin_until(spin_fd_ready, &fd, budget_ns);
}
