/*
 * spin.h - a bounded busy wait before a blocking one.
 *
 * Why: a thread that blocked (futex, recvmsg, epoll_wait) is woken by the
 * kernel, and on the virtual machines GPUs are rented in often only once
 * the hypervisor has woken its idle virtual CPU. A lend is three such
 * hand-offs (gmbd, libgmb's reader, the calling thread), so a burst of
 * allocations paid them at every one: on the H200 VM a 1 GiB allocation
 * took 0.31 ms, 0.22 ms polling (bench/alloc_probe.cu). A thread that
 * expects an answer within microseconds polls for it first, for at most
 * a budget; past it, it blocks as before.
 *
 * The budget is the one knob: 0 turns spinning off. Each loop turn yields
 * the CPU (sched_yield), so on a machine with fewer CPUs than busy threads
 * the thread being waited for still runs.
 */
#ifndef GMB_SPIN_H
#define GMB_SPIN_H

#include <stdbool.h>
#include <stdint.h>

/* The default budget, in microseconds, of gmbd's --spin-us and $GMB_SPIN_US. */
#define SPIN_DEFAULT_US 200u
/* The largest budget accepted: past a few ms blocking costs less than spinning. */
#define SPIN_MAX_US	100000u

/**
 * spin_until() - call @ready(@arg) until it returns true or @budget_ns
 * have passed. Return: true when @ready said so (at once when it already
 * did: @ready is called at least once, even with a budget of 0).
 */
bool spin_until(bool (*ready)(void *arg), void *arg, uint64_t budget_ns);

/** spin_fd_readable() - spin_until() @fd polls readable (or hung up, or in error). */
bool spin_fd_readable(int fd, uint64_t budget_ns);

#endif
