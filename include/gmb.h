/*
 * gmb.h - client API of gmbd, the GPU memory broker.
 *
 * A worker connects to the node's gmbd, allocates device memory in named
 * tags, and pauses/resumes tags: a paused tag's physical memory goes back to
 * the broker while its virtual addresses stay reserved, so pointers (and CUDA
 * graphs that hold them) stay valid across any number of cycles.
 *
 * Every function returns 0 or a negative errno. gmb_strerror() names a code;
 * gmb_last_error() gives the broker's or the library's message for the last
 * failure of this client (per client, never a global). Nothing here prints,
 * exits or aborts. All functions are thread-safe on one gmb_client.
 */
#ifndef GMB_H
#define GMB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GMB_VERSION "0.1.0"

#if defined(__GNUC__)
#define GMB_API __attribute__((visibility("default")))
#else
#define GMB_API
#endif

typedef struct gmb_client gmb_client;

enum { GMB_MODE_DISCARD = 0, GMB_MODE_ZERO = 1, GMB_MODE_PRESERVE = 2 };
enum { GMB_OP_PAUSE = 1, GMB_OP_RESUME = 2 };

/**
 * gmb_connect() - connect to gmbd and register as a client.
 * @socket_path: NULL for $GMB_SOCKET, else /run/gmbd/gmbd.sock.
 * @client_name: shown in status and logs; NULL for the program name.
 * @out:         receives the client, owned by the caller (gmb_close()).
 *
 * Starts one library thread that answers the broker's requests (remote
 * pause/resume, handle drops) while the application runs.
 *
 * Return: 0, -ENOENT/-ECONNREFUSED when no broker listens, -EPROTO on a
 * protocol version mismatch, or another negative errno.
 */
GMB_API int gmb_connect(const char *socket_path, const char *client_name, gmb_client **out);

/**
 * gmb_close() - unmap everything, release every VA range, disconnect.
 * The broker takes the memory back. NULL is accepted.
 */
GMB_API void gmb_close(gmb_client *c);

/**
 * gmb_malloc() - allocate @size bytes on @device in @tag (NULL: "default").
 * The address in *@ptr is fixed for the allocation's life. A paused tag
 * refuses new allocations with -EBUSY. -ENOMEM when the device's budget is
 * exhausted; gmb_last_error() then names who holds the memory.
 */
GMB_API int gmb_malloc(gmb_client *c, void **ptr, size_t size, int device, const char *tag);

/** gmb_free() - free an allocation, active or paused. -EINVAL if unknown. */
GMB_API int gmb_free(gmb_client *c, void *ptr);

/** gmb_tag_set_mode() - what pause does to the tag's bytes (default DISCARD). */
GMB_API int gmb_tag_set_mode(gmb_client *c, const char *tag, int mode);

/**
 * gmb_pause() - give a tag's physical memory back (NULL: every tag).
 * Drains the device's work first. Pausing a paused tag succeeds.
 */
GMB_API int gmb_pause(gmb_client *c, const char *tag);

/**
 * gmb_resume() - map memory again at the same addresses (NULL: every tag).
 * PRESERVE tags get their bytes back, ZERO tags read zero. Resuming an active
 * tag succeeds. -ENOMEM when the budget does not allow it; the tag stays
 * paused.
 */
GMB_API int gmb_resume(gmb_client *c, const char *tag);

/**
 * gmb_control_fn - called before the broker pauses or resumes this client
 * on behalf of an operator (gmbctl). Runs on the library's thread. Return 0
 * to let the library do it, or a negative errno to refuse. For a pause, the
 * application must have stopped using the tag's memory when it returns 0.
 */
typedef int (*gmb_control_fn)(void *arg, int op, const char *tag);

/**
 * gmb_set_control_handler() - install (or, with NULL, remove) the handler.
 * gmbd learns of it at once (status shows CONTROL yes/no, and a remote
 * pause of a client without one is refused up front). Return: 0, or the
 * error of telling gmbd (the handler is installed all the same).
 */
GMB_API int gmb_set_control_handler(gmb_client *c, gmb_control_fn fn, void *arg);

/**
 * gmb_poll() - wait up to @timeout_ms (-1: forever) for the next request from
 * the broker and let the library's thread handle it.
 * Return: the number of broker requests handled (0 on timeout), or
 * -ENOTCONN once the connection to the broker is lost for good. While the
 * library reconnects (after a restart of gmbd) it just times out.
 *
 * Environment: GMB_RECONNECT=0 turns reconnecting off; GMB_RECONNECT_TIMEOUT
 * (seconds, default 30; 0: fail at once) bounds how long a call that needs
 * gmbd waits for it to come back before it returns -ENOTCONN.
 */
GMB_API int gmb_poll(gmb_client *c, int timeout_ms);

/** gmb_strerror() - a static description of a negative errno. */
GMB_API const char *gmb_strerror(int err);

/** gmb_last_error() - message of this client's last failure ("" if none). */
GMB_API const char *gmb_last_error(const gmb_client *c);

/* Additions to the core API. */

/** gmb_client_id() - the broker's id for this client (0 if unknown). */
GMB_API uint64_t gmb_client_id(const gmb_client *c);

/**
 * gmb_status_json() - the broker's state as a JSON object (the same document
 * as `gmbctl status --json`). *@json is malloc'd; the caller frees it.
 */
GMB_API int gmb_status_json(gmb_client *c, char **json);

enum { GMB_CONNECT_TOOL = 1 /* an operator tool: not listed in status */ };

/** gmb_connect_flags() - gmb_connect() with GMB_CONNECT_* @flags. */
GMB_API int gmb_connect_flags(const char *socket_path, const char *client_name, unsigned flags,
			      gmb_client **out);

/**
 * gmb_control() - pause (GMB_OP_PAUSE) or resume another client's @tag
 * (NULL: every tag). @target is its name, pid or id. Returns once that
 * client did it: 0, -ENOENT (no such client), -EPERM, -ETIMEDOUT, or the
 * client's refusal.
 */
GMB_API int gmb_control(gmb_client *c, const char *target, int op, const char *tag);

/**
 * gmb_status_text() - the broker's state as a readable table (what `gmbctl
 * status` prints). *@text is malloc'd; the caller frees it.
 */
GMB_API int gmb_status_text(gmb_client *c, char **text);

/**
 * gmb_status_top() - the screen `gmbctl top` shows, as text of lines at most
 * @width columns (60-240): per device a bar of lent, idle, paused and
 * outside memory, then every client's tags. *@text is malloc'd.
 */
GMB_API int gmb_status_top(gmb_client *c, int width, char **text);

/** gmb_trim() - release free pool chunks of @device (-1: all) to the backend. */
GMB_API int gmb_trim(gmb_client *c, int device, uint64_t *released, uint64_t *pending);

/**
 * gmb_watch() - subscribe @c to gmbd's events (what `gmbctl watch` shows):
 * clients connecting and going, allocations, frees, pauses, resumes,
 * refusals, drops, trims. Any client may watch. Read them with
 * gmb_watch_next(). A watcher that falls far behind is disconnected by gmbd
 * after one last event of kind "dropped".
 */
GMB_API int gmb_watch(gmb_client *c);

enum {
	GMB_WATCH_JSON = 1 /* gmb_watch_next(): a JSON object, not text */
};

/**
 * gmb_watch_next() - wait up to @timeout_ms (-1: forever) for the next event
 * and put it in *@line as one line without a newline: text, or with
 * GMB_WATCH_JSON one JSON object (malloc'd, the caller frees it).
 * Return: 1 with *@line, 0 on timeout, -ENOTCONN once the connection is
 * gone (gmb_last_error() says why), or another negative errno.
 */
GMB_API int gmb_watch_next(gmb_client *c, int timeout_ms, unsigned flags, char **line);

/*
 * Regions and the process's default client: what the LD_PRELOAD shim
 * (libgmb_preload.so), the PyTorch allocator entry points and the Python
 * module build on.
 *
 * A region says which tag the calling thread's allocations go to. Regions
 * are per thread and nest; other threads are not affected (NCCL's or a
 * helper thread's allocations during a region stay outside it). Outside any
 * region, $GMB_DEFAULT_TAG (with $GMB_DEFAULT_MODE: discard, zero or
 * preserve, default preserve) makes every allocation of the process a region
 * allocation; a region with a NULL tag ("plain") turns that off again for
 * its extent.
 *
 * The default client is one connection per process, made on first use:
 * $GMB_SOCKET (or the built-in path), named $GMB_CLIENT_NAME or
 * "<program>-<pid>". $GMB_CONTROL=accept installs a handler that agrees to
 * every remote pause/resume (for workers that cannot install their own).
 */

/**
 * gmb_region_begin() - route this thread's allocations to @tag until the
 * matching gmb_region_end(). @tag NULL: a plain region (allocations go to
 * the real allocator, even under $GMB_DEFAULT_TAG). @mode (GMB_MODE_*) is
 * the tag's mode when its first allocation is made; a tag's mode only ever
 * grows stronger (DISCARD < ZERO or PRESERVE), and ZERO against PRESERVE is
 * refused at allocation time with -EINVAL.
 * Return: 0, -EINVAL (bad mode or empty tag), -ENAMETOOLONG, or -E2BIG when
 * GMB_REGION_MAX regions are already open on this thread.
 */
#define GMB_REGION_MAX 16
GMB_API int gmb_region_begin(const char *tag, int mode);

/** gmb_region_end() - close this thread's innermost region; -EINVAL if none. */
GMB_API int gmb_region_end(void);

/**
 * gmb_region_current() - the calling thread's current tag and mode (either
 * may be NULL). Return: 1 inside a region (or under $GMB_DEFAULT_TAG), 0
 * outside (or in a plain region), -EINVAL when $GMB_DEFAULT_MODE is bad, or
 * -ENOBUFS when @tag's @cap is too small.
 */
GMB_API int gmb_region_current(char *tag, size_t cap, int *mode);

/**
 * gmb_region_malloc() - gmb_malloc() in the current region's tag, setting
 * the tag's mode from the region first; outside a region, tag "default".
 * @c NULL: the default client (connected now if needed). Honours the
 * process's memory margin (gmb_set_memory_margin). On failure,
 * gmb_region_last_error() says why.
 */
GMB_API int gmb_region_malloc(gmb_client *c, void **ptr, size_t size, int device);

/** gmb_region_last_error() - why this thread's last gmb_region_* / hook call failed. */
GMB_API const char *gmb_region_last_error(void);

/**
 * gmb_default_client() - the process's default client, connected on the
 * first call with @socket_path / @client_name (NULL: from the environment,
 * see above); later calls return it and ignore both. It is never closed:
 * gmbd takes its memory back when the process exits.
 * Return: 0 (connected now), 1 (already connected), or a negative errno.
 */
GMB_API int gmb_default_client(const char *socket_path, const char *client_name,
			       gmb_client **out);

/**
 * gmb_owns() - 1 if @ptr is the address of one of @c's allocations (@c
 * NULL: the default client, 0 if it was never made), else 0. Takes no
 * operation lock, so an allocation hook can ask while a pause runs.
 */
GMB_API int gmb_owns(gmb_client *c, const void *ptr);

/**
 * gmb_host_copy() - the host copy of [@ptr, @ptr+@size) inside one of @c's
 * allocations (@c NULL: the default client). *@host is NULL while the tag is
 * active, else the saved bytes of a paused PRESERVE tag (valid until the
 * allocation is freed; rewritten by each pause).
 * Return: 0, -ENOENT (no allocation holds the range) or -ENODATA (paused,
 * but its tag is not PRESERVE).
 */
GMB_API int gmb_host_copy(gmb_client *c, const void *ptr, size_t size, void **host);

/**
 * gmb_set_memory_margin() - region allocations of this process fail with
 * -ENOMEM when they would leave less than @bytes of the device's budget
 * unlent at gmbd (0, the default: no check; each check costs a status query).
 */
GMB_API void gmb_set_memory_margin(uint64_t bytes);

/*
 * PyTorch pluggable allocator entry points, for
 * torch.cuda.memory.CUDAPluggableAllocator(path, "gmb_torch_malloc",
 * "gmb_torch_free") and torch.cuda.MemPool. Inside a region the memory comes
 * from gmbd (default client) on @device; outside, from the CUDA runtime's
 * cudaMalloc found in the process. @stream is a cudaStream_t, unused.
 * gmb_torch_malloc() returns NULL on failure (PyTorch reports it as out of
 * memory); gmb_region_last_error() says why.
 */
GMB_API void *gmb_torch_malloc(ssize_t size, int device, void *stream);
GMB_API void gmb_torch_free(void *ptr, ssize_t size, int device, void *stream);

/** gmb_library_path() - the file this libgmb was loaded from ("" if unknown). */
GMB_API const char *gmb_library_path(void);

#ifdef __cplusplus
}
#endif
#endif
