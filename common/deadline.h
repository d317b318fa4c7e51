/*
 * deadline.h - points in time on CLOCK_MONOTONIC, for timed waits
 * (pthread_cond_timedwait on a condition variable whose clock is
 * CLOCK_MONOTONIC) and for "how long is left". One copy for the library's
 * connection, reconnect and poll waits.
 */
#ifndef GMB_DEADLINE_H
#define GMB_DEADLINE_H

#include <stdint.h>
#include <time.h>

/* The monotonic time @ms milliseconds from now. */
struct timespec deadline_in_ms(uint64_t ms);
/* Monotonic now in nanoseconds. */
uint64_t deadline_now_ns(void);
/* Milliseconds left until @d, 0 once it has passed. */
uint64_t deadline_left_ms(const struct timespec *d);

#endif
