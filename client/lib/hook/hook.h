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

#include <stdbool.h>

#include "common/err.h"
#include "include/gmb.h"

/* The calling thread's message buffer (ERR_MSG_MAX bytes), for err_fmt(). */
char *gmb__hook_err(void);
/* Copies @c's last error (NULL: gmb_last_error(NULL)) as the thread's message. */
int gmb__hook_fail_client(int rc, const gmb_client *c, const char *what);
/* "discard", "zero", "preserve" -> GMB_MODE_*, else -EINVAL. */
int gmb__mode_parse(const char *s);
const char *gmb__mode_name(int mode);
/* The default client if it exists; never connects. */
gmb_client *gmb__hook_client_peek(void);

/* region.c: the region in force for gmb_region_malloc() (1 in one, 0 outside, -errno). */
struct gmb__mem_how;
int gmb__region_how(char *tag, size_t cap, struct gmb__mem_how *how);
/* Its tag ("default" outside; thread-local storage), mode, resolved backup; 1 in one. */
int gmb__region_effective(const char **tag, int *mode, int *backup);
/* The thread's base region, as torch_memory_saver's setters edit it (tms.c). */
void gmb__region_base_on(bool on);
void gmb__region_base_tag(const char *tag);
void gmb__region_base_cpu(bool on);
void gmb__region_base_disk(bool on);
int gmb__region_base_kind(int kind);

#endif
