/*
 * fuzz.h - what the fuzz harnesses under tests/fuzz/ share: the libFuzzer
 * entry point each defines, and the invariant checks run after every input.
 *
 * A harness is built twice: with clang's -fsanitize=fuzzer (make fuzz, the
 * fuzzer's own main) and with tests/fuzz/replay.c as main (make check: every
 * file of its corpus once, under the build's sanitizers). A broken invariant
 * aborts with a sentence: the fuzzer saves the input that did it.
 */
#ifndef GMB_FUZZ_H
#define GMB_FUZZ_H

#include <stddef.h>
#include <stdint.h>

struct broker;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional one-time set-up (libFuzzer's name); replay.c calls it too. */
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Prints the sentence and aborts: an invariant does not hold. */
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Open fds of this process (/proc/self/fd). */
int fuzz_count_fds(void);

/*
 * fuzz_check_broker() - recompute every counter of @br from its clients'
 * allocations and compare: each pool's lent bytes are exactly the active
 * allocations of clients the broker still has (no byte lent to nobody),
 * free and pending lists match their byte counts, holder references match
 * the last lends, the chunk registry holds every chunk. @over_budget: a
 * pool may hold more than its budget (a restored record may).
 */
void fuzz_check_broker(const struct broker *br, int over_budget);

/* Reads a little-endian field of @n bytes from *@p (zeros past @end, where
 * *@p stops). */
uint64_t fuzz_take(const uint8_t **p, const uint8_t *end, size_t n);

#endif
