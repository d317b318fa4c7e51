/*
 * hook.h - what region.c and hook.c share: the per-thread failure message
 * of the region and hook entry points (gmb_region_last_error()).
 *
 * Those entry points are called from inside allocators (the preload shim's
 * cudaMalloc, PyTorch's pluggable allocator) that can only pass a status
 * code on, so the sentence lives per thread, next to the region stack.
 */
#ifndef GMB_CLIENT_HOOK_H
#define GMB_CLIENT_HOOK_H

#include "gmb.h"

/* Writes the calling thread's message; returns @rc. */
int gmb__hook_fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Copies @c's last error (NULL: gmb_last_error(NULL)) as the thread's message. */
int gmb__hook_fail_client(int rc, const gmb_client *c, const char *what);
/* "discard", "zero", "preserve" -> GMB_MODE_*, else -EINVAL. */
int gmb__mode_parse(const char *s);
const char *gmb__mode_name(int mode);

#endif
