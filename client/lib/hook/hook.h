/*
 * hook.h - what the allocation hooks share: regions (region.c), the
 * default client (default.c), region allocation and queries (alloc.c),
 * PyTorch's entry points (torch.c) and the library path (libpath.c).
 *
 * Layer: above the API; these files call gmb_* and read the client's
 * memory through client/lib/api/client.h, and nothing below calls them.
 *
 * Those entry points are called from inside allocators (the preload shim's
 * cudaMalloc, PyTorch's pluggable allocator) that can only pass a status
 * code on, so the failure sentence lives per thread, next to the region
 * stack (gmb_region_last_error()).
 */
#ifndef GMB_CLIENT_HOOK_H
#define GMB_CLIENT_HOOK_H

#include "common/err.h"
#include "gmb.h"

/* The calling thread's message buffer (ERR_MSG_MAX bytes), for err_fmt(). */
char *gmb__hook_err(void);
/* Copies @c's last error (NULL: gmb_last_error(NULL)) as the thread's message. */
int gmb__hook_fail_client(int rc, const gmb_client *c, const char *what);
/* "discard", "zero", "preserve" -> GMB_MODE_*, else -EINVAL. */
int gmb__mode_parse(const char *s);
const char *gmb__mode_name(int mode);
/* The default client if it exists; never connects. */
gmb_client *gmb__hook_client_peek(void);

#endif
