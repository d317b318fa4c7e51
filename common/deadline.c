/*
 * deadline.c - monotonic deadlines; see deadline.h.
 */
#include "common/deadline.h"

#define DEADLINE_NS_PER_S 1000000000LL

struct timespec deadline_in_ms(uint64_t ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= DEADLINE_NS_PER_S) {
		ts.tv_sec++;
		ts.tv_nsec -= DEADLINE_NS_PER_S;
	}
	return ts;
}

uint64_t deadline_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * DEADLINE_NS_PER_S + (uint64_t)ts.tv_nsec;
}

uint64_t deadline_left_ms(const struct timespec *d)
{
	uint64_t until = (uint64_t)d->tv_sec * DEADLINE_NS_PER_S + (uint64_t)d->tv_nsec;
	uint64_t now = deadline_now_ns();

	return until > now ? (until - now + 999999) / 1000000 : 0;
}
