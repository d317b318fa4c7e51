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

/** gmb_set_control_handler() - install (or, with NULL, remove) the handler. */
GMB_API int gmb_set_control_handler(gmb_client *c, gmb_control_fn fn, void *arg);

/**
 * gmb_poll() - wait up to @timeout_ms (-1: forever) for the next request from
 * the broker and let the library's thread handle it.
 * Return: the number of broker requests handled (0 on timeout), or
 * -ENOTCONN once the connection to the broker is lost.
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

/** gmb_trim() - release free pool chunks of @device (-1: all) to the backend. */
GMB_API int gmb_trim(gmb_client *c, int device, uint64_t *released, uint64_t *pending);

#ifdef __cplusplus
}
#endif
#endif
