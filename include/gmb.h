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

enum {
	GMB_MODE_DISCARD = 0,
	GMB_MODE_ZERO = 1,
	GMB_MODE_PRESERVE = 2
};
/* Which allocations share mappings (gmb_set_pack()). */
enum {
	GMB_PACK_OFF = 0,
	GMB_PACK_HOOKS = 1,
	GMB_PACK_ALL = 2
};
enum {
	GMB_OP_PAUSE = 1,
	GMB_OP_RESUME = 2
};

/**
 * gmb_connect() - connect to gmbd and register as a client.
 * @socket_path: NULL for $GMB_SOCKET, else /run/gmbd/gmbd.sock.
 * @client_name: shown in status and logs; NULL for the program name.
 * @out:         receives the client, owned by the caller (gmb_close()).
 *
 * Starts the library's two threads: a reader (every socket read; it
 * imports fds, answers handle drops and reconnects) and a worker (remote
 * pause/resume through the control handler) while the application runs.
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

/**
 * gmb_malloc_peers() - gmb_malloc() whose memory @device and every device d
 * with bit d of @peers set (indexes as for @device) may read and write, on
 * every mapping: now and after each resume. Kernels on a peer reach it
 * over NVLink or PCIe; the devices must be able to access each other's
 * memory (cuDeviceCanAccessPeer), else the mapping fails with the driver's
 * reason. -ENODEV when a peer is none of gmbd's devices or not visible here.
 */
GMB_API int gmb_malloc_peers(gmb_client *c, void **ptr, size_t size, int device, const char *tag,
			     uint64_t peers);

/** gmb_free() - free an allocation, active or paused. -EINVAL if unknown. */
GMB_API int gmb_free(gmb_client *c, void *ptr);

/** gmb_tag_set_mode() - what pause does to the tag's bytes (default DISCARD). */
GMB_API int gmb_tag_set_mode(gmb_client *c, const char *tag, int mode);

/**
 * gmb_pause() - give a tag's physical memory back (NULL: every tag).
 * Drains the device's work first. Pausing a paused tag succeeds. -EBUSY
 * while another process maps memory of the tag (gmb_ipc_open()), after
 * waiting gmb_set_wait()'s time for it to close; the tag stays active.
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

enum {
	GMB_CONNECT_TOOL = 1 /* an operator tool: not listed in status, holds no memory */
};

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

/**
 * gmb_objects_text() - the named objects alone, as `gmbctl objects`
 * prints them: a table (NAME, owner uid, latest version, versions kept,
 * bytes, readers, grants) or "no objects". gmb_objects_json() - the same as
 * {"objects":[...],"objects_total":N}, each object as in gmb_status_json().
 * *@text / *@json is malloc'd; the caller frees it.
 */
GMB_API int gmb_objects_text(gmb_client *c, char **text);
GMB_API int gmb_objects_json(gmb_client *c, char **json);

/** gmb_trim() - release free pool chunks of @device (-1: all) to the backend. */
GMB_API int gmb_trim(gmb_client *c, int device, uint64_t *released, uint64_t *pending);

/**
 * gmb_watch() - subscribe @c to gmbd's events (what `gmbctl watch` shows):
 * clients connecting and going, allocations, frees, pauses, resumes,
 * refusals, drops, trims. Any client may watch. Read them with
 * gmb_watch_next(). A watcher that falls far behind is disconnected by gmbd
 * after one last event of kind "dropped"; events gmbd could not send while
 * it held its replies (the state record not stored) come as one event of
 * kind "missed" with their count.
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
GMB_API int gmb_default_client(const char *socket_path, const char *client_name, gmb_client **out);

/**
 * gmb_owns() - 1 if @ptr is the address of one of @c's allocations (@c
 * NULL: the default client, 0 if it was never made), else 0. Takes no
 * operation lock, so an allocation hook can ask while a pause runs.
 */
GMB_API int gmb_owns(gmb_client *c, const void *ptr);

/*
 * Memory shared between processes (CUDA IPC on gmbd memory; the preload
 * shim's cudaIpcGetMemHandle/OpenMemHandle/CloseMemHandle call these). A
 * handle is GMB_IPC_HANDLE_SIZE bytes (cudaIpcMemHandle_t's size), the
 * same bytes each time for the same pointer, and names the allocation and
 * the chunk holding the pointer: open returns the import's address of that
 * chunk (the allocation's base for its base); the caller adds its offset.
 * A process may open handles of clients of its own uid (-EPERM otherwise).
 * -ENXIO says "not gmbd's": a pointer in no allocation or import of the
 * client, a handle without gmbd's magic (pass those to the runtime).
 */
#define GMB_IPC_HANDLE_SIZE 64

/* 1 if the GMB_IPC_HANDLE_SIZE bytes at @handle start as gmbd's handles do. */
GMB_API int gmb_ipc_is_handle(const void *handle);
/**
 * gmb_ipc_get_handle() - the handle of the gmbd memory at @ptr (an
 * allocation of @c, or an import: its handle again) into @handle (@c NULL:
 * the default client). Return: 0; -ENXIO (not gmbd memory of @c); -EBUSY
 * (its tag is paused); gmbd's error.
 */
GMB_API int gmb_ipc_get_handle(gmb_client *c, const void *ptr, void *handle);
/**
 * gmb_ipc_open() - map what @handle names into this process (once per
 * allocation however often it is opened: each open is counted) and give
 * this process's @device (-1: the memory's own device) read and write
 * access (@c NULL: the default client, connected if need be).
 * Return: 0; -ENXIO (not a gmbd handle); -EINVAL (damaged); -ENOENT
 * (forged, of an earlier gmbd, or its allocation was freed); -EPERM
 * (another uid; gmb_last_error() names the owner); -EBUSY (paused).
 */
GMB_API int gmb_ipc_open(gmb_client *c, const void *handle, int device, void **ptr);
/**
 * gmb_ipc_close() - one open of the import holding @ptr fewer; the last
 * waits for the device, unmaps it and tells gmbd (@c NULL: the default
 * client). Return: 0; -ENXIO (@ptr is in no import of @c).
 */
GMB_API int gmb_ipc_close(gmb_client *c, void *ptr);
/**
 * gmb_ipc_grant() - let processes of uid @uid open handles of the
 * allocation holding @ptr (@c NULL: the default client), or, with
 * gmb_ipc_revoke(), no longer (opens already made stay). At most 8 uids
 * per allocation. $GMB_IPC_GRANT (uids, comma-separated) grants every
 * allocation the client shares to those uids.
 * Return: 0; -ENXIO (not an allocation of @c); -EINVAL (@uid is @c's own);
 * -ENOSPC (8 uids already); gmbd's error.
 */
GMB_API int gmb_ipc_grant(gmb_client *c, const void *ptr, uint32_t uid);
GMB_API int gmb_ipc_revoke(gmb_client *c, const void *ptr, uint32_t uid);
/**
 * gmb_set_ipc_follow() - whether @c's pauses, and the pauses it asks of
 * other clients (gmb_control()), have the processes that import the tag's
 * memory follow (@on 1): each is asked to drain and unmap it, keeping its
 * addresses, before the pause completes, and maps it again at the same
 * addresses after the resume, before gmb_resume() returns. An importer
 * that cannot be asked or refuses is waited for as by default (0: wait
 * gmb_set_wait()'s time for the importers to close, then -EBUSY).
 * $GMB_IPC_FOLLOW=1 sets it at connect. Return: 0, -EINVAL.
 */
GMB_API int gmb_set_ipc_follow(gmb_client *c, int on);
/**
 * gmb_set_ipc_keep() - with @on 1, the last close of an import (@c's
 * gmb_ipc_close(), the shim's cudaIpcCloseMemHandle) keeps it mapped,
 * idle, and the next open of the same handle takes it again without
 * mapping anything: one round trip each, instead of fetching, mapping and
 * unmapping the chunks (a weight sync that opens the same buckets every
 * round). gmbd asks for an idle import back before a pause of its owner's
 * tag and once its owner freed it; it stays pinned, and listed, until then.
 * $GMB_IPC_KEEP=1 sets it at connect. Return: 0, -EINVAL.
 */
GMB_API int gmb_set_ipc_keep(gmb_client *c, int on);
/**
 * gmb_set_pack() - which of @c's allocations of at most 32 MiB are packed:
 * carved out of a larger allocation of the same tag, device and mode (up
 * to 256 MiB, from 64 growing with the tag, in whole pieces of the first
 * allocation's size), so that a pause and a resume cost one
 * chunk for many of them and an allocation that fits costs no request.
 * GMB_PACK_HOOKS (the default): those of the allocation hooks (the preload
 * shim, PyTorch's allocators, the torch_memory_saver stand-in), whose
 * callers make many small segments; GMB_PACK_ALL: gmb_malloc()'s too;
 * GMB_PACK_OFF: none. gmb_malloc_peers() is never packed (named objects'
 * buffers come from it). A pack stays lent while any of its pieces lives,
 * so a tag may hold up to one pack's room more than it allocated; a piece
 * cannot be published (gmb_object_publish() wants an allocation of its own).
 * $GMB_PACK=off|hooks|all sets it at connect. Return: 0, -EINVAL.
 */
GMB_API int gmb_set_pack(gmb_client *c, int pack);

/*
 * Named objects: memory that belongs to a name under this process's uid,
 * not to a process. A version is one allocation, published: from then on
 * gmbd keeps its memory (counted in the device's budget and the uid's chunk
 * bound) after the publisher exits and across gmbd's restarts, until the
 * object is dropped (gmb_object_drop(), `gmbctl object drop`). Publishing
 * again makes a new version the latest at once; the one before stays for
 * the processes that have it open and goes with its last close. Readers
 * map a version read-only (the device enforces it: a write faults), at an
 * address of their own that stays as long as they hold it. A name is 1 to
 * 64 bytes of [A-Za-z0-9._-]; another uid's object is "UID/NAME", opened
 * only where its owner granted that uid. Versions count from 1; 0 means
 * the latest. The description (meta) is the publisher's bytes, at most
 * GMB_OBJECT_META_MAX, returned to each reader.
 */
#define GMB_OBJECT_META_MAX (48 * 1024)

struct gmb_object_info {
	uint64_t version;
	uint64_t size; /* bytes mapped at the pointer */
	int device;    /* this process's ordinal of the memory's device */
	uint32_t owner_uid;
	size_t meta_len; /* the description's length (copied up to meta_cap) */
};

/**
 * gmb_object_publish() - the allocation at @ptr (its base; active) becomes
 * the next version of @name (the object made if new), with the description
 * @meta (@meta_len bytes, may be 0). The allocation is no longer @c's: it
 * stays mapped at @ptr, read-only, as this process's open of the new
 * version (close it with gmb_object_close(); gmb_free() refuses it).
 * *@version (may be NULL) gets the version's number.
 * Return: 0; -EINVAL (a bad name, @ptr not an allocation's base); -EBUSY
 * (its tag is paused); -E2BIG (@meta_len past GMB_OBJECT_META_MAX);
 * -ENOSPC (too many objects); gmbd's error.
 */
GMB_API int gmb_object_publish(gmb_client *c, const char *name, void *ptr, const void *meta,
			       size_t meta_len, uint64_t *version);
/**
 * gmb_object_open() - map version @version (0: the latest) of @name
 * read-only into this process; *@ptr is its address, *@info (may be NULL)
 * its facts, and up to @meta_cap bytes of its description go to @meta
 * (may be NULL). Opening one version twice maps it once and counts.
 * Return: 0; -ENOENT (no such object or version); -EPERM (another uid's,
 * not granted: gmb_last_error() names the owner); gmbd's error.
 */
GMB_API int gmb_object_open(gmb_client *c, const char *name, uint64_t version, void **ptr,
			    struct gmb_object_info *info, void *meta, size_t meta_cap);
/**
 * gmb_object_close() - one open of the version mapped at @ptr fewer; the
 * last waits for the device and unmaps it. Return: 0; -ENXIO (@ptr is no
 * open version of @c).
 */
GMB_API int gmb_object_close(gmb_client *c, void *ptr);
/**
 * gmb_object_drop() - drop version @version of @name (0: the whole
 * object); what readers have open stays until they close. The owner's uid,
 * root or gmbd's admin group only. Return: 0; -ENOENT; -EPERM.
 */
GMB_API int gmb_object_drop(gmb_client *c, const char *name, uint64_t version);
/**
 * gmb_object_grant() - let processes of uid @uid open @name's versions
 * ("OWNER_UID/NAME" for them), or with @revoke no longer (opens already
 * made stay). At most 8 uids. Return: 0; -ENOENT; -EINVAL (@uid is the
 * owner's); -ENOSPC (8 uids already).
 */
GMB_API int gmb_object_grant(gmb_client *c, const char *name, uint32_t uid, int revoke);
/**
 * gmb_object_pause() - pause @name: every process that has a version open
 * is asked to unmap it (keeping its address), its bytes go to host memory
 * gmbd holds (@discard 1: they are dropped) and its GPU memory back to the
 * driver; opens wait for the resume (-EBUSY). gmb_object_resume() takes
 * new memory, copies the bytes back (zeros when discarded) and has the
 * readers map it again at the same addresses before it returns. Either on
 * an object so already does nothing. The owner's uid, root or gmbd's admin
 * group. Return: 0; -ENOENT; -EPERM; -EBUSY (a reader did not follow,
 * named; or a pause or resume of it is running); -ENOMEM (the budget, on
 * resume).
 */
GMB_API int gmb_object_pause(gmb_client *c, const char *name, int discard);
GMB_API int gmb_object_resume(gmb_client *c, const char *name);

/**
 * gmb_host_copy() - the host copy of [@ptr, @ptr+@size) inside one of @c's
 * allocations (@c NULL: the default client), whenever one exists: while
 * paused (PRESERVE), and while active when it was retained (the same
 * pointer). *@host is NULL while active without a copy and for a DISK copy.
 * The pointer is CUDA host memory (pinned or registered) for PINNED copies,
 * valid until the copy is freed (resume without retain, or the free).
 * Return: 0, -ENOENT (no allocation holds the range) or -ENODATA (paused,
 * but the allocation is not PRESERVE).
 */
GMB_API int gmb_host_copy(gmb_client *c, const void *ptr, size_t size, void **host);

/*
 * Host copies per allocation (what the torch_memory_saver drop-in builds
 * on). An allocation made in a region opened with gmb_region_begin_ex()
 * keeps that region's mode and backup kind as its own, whatever its tag's
 * mode: a DISCARD allocation in a tag that also has PRESERVE ones loses its
 * bytes at a pause. A PRESERVE allocation's host copy is made at its first
 * pause (a retained PINNED one before), in one of these kinds:
 *   PINNED: host memory the device copies at full speed. Unless retained it
 *           is pageable memory filled through a small pinned ring (pinning
 *           the whole copy at every pause would cost more than the copy),
 *           registered with the driver only when gmb_host_copy() hands it out;
 *           a retained copy is pinned memory, made by a thread of libgmb
 *           right after the allocation (gmb_malloc() does not wait for it;
 *           the first pause does if it is not ready), so it takes its host
 *           memory from the allocation on.
 *   MMAP:   anonymous mmap'd memory; its resident pages go back to the
 *           system when the copy is freed.
 *   DISK:   one file per allocation in the disk folder (0600), written at
 *           pause and read at resume through a pinned buffer of
 *           $TMS_DISK_BACKUP_CHUNK_MB MiB (default 256).
 * Retain (process-wide, read at each resume): off (the default) frees a
 * copy once resume has copied it back (the file is removed); on keeps it,
 * and the next pause rewrites it at the same address.
 *
 * Environment, read once at first use (booleans: "1", "true", "TRUE",
 * "yes", "YES"): TMS_INIT_ENABLE makes each thread's base region (below any
 * region, above $GMB_DEFAULT_TAG) tag "default" from the first allocation
 * on, in mode PRESERVE with TMS_INIT_ENABLE_CPU_BACKUP, PRESERVE on disk
 * with TMS_INIT_ENABLE_DISK_BACKUP, else DISCARD; TMS_INIT_CPU_BACKUP_BACKEND
 * ("pinned" or "mmap") is the default kind; TMS_RETAIN_CPU_BACKUP the
 * retain setting; TMS_DISK_BACKUP_DIR the disk folder (else /tmp).
 */
enum {
	GMB_BACKUP_DEFAULT = -1,
	GMB_BACKUP_PINNED = 0,
	GMB_BACKUP_MMAP = 1,
	GMB_BACKUP_DISK = 2
};

/**
 * gmb_region_begin_ex() - gmb_region_begin() whose allocations keep @mode
 * and @backup (GMB_BACKUP_*; DEFAULT: gmb_get_default_backup() at
 * allocation time) as their own. @backup only matters for PRESERVE.
 * Return: as gmb_region_begin(), or -EINVAL for an unknown @backup.
 */
GMB_API int gmb_region_begin_ex(const char *tag, int mode, int backup);

/**
 * gmb_region_current_ex() - gmb_region_current() plus the backup kind in
 * force, resolved (never DEFAULT). The thread's base region counts.
 */
GMB_API int gmb_region_current_ex(char *tag, size_t cap, int *mode, int *backup);

/** gmb_set_retain_host_copy() - 0 or 1 (else -EINVAL); see above. */
GMB_API int gmb_set_retain_host_copy(int retain);
GMB_API int gmb_get_retain_host_copy(void);

/**
 * gmb_set_default_backup() - the kind GMB_BACKUP_DEFAULT means: PINNED or
 * MMAP (else -EINVAL). gmb_get_default_backup() returns it, or -EINVAL when
 * $TMS_INIT_CPU_BACKUP_BACKEND is malformed (then every region allocation
 * fails with -EINVAL until a kind is set).
 */
GMB_API int gmb_set_default_backup(int backup);
GMB_API int gmb_get_default_backup(void);

/**
 * gmb_set_disk_dir() - the folder of disk copies for the process, created
 * if needed (-errno if it cannot be). gmb_get_disk_dir() copies it to @buf
 * (-ENOBUFS when @cap is too small).
 */
GMB_API int gmb_set_disk_dir(const char *dir);
GMB_API int gmb_get_disk_dir(char *buf, size_t cap);

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

/*
 * torch_memory_saver's C entry points, same names and C types (its
 * csrc/entrypoint.cpp), so that its C/C++ callers work unchanged; the
 * preload shim re-exports them. The setters edit the calling thread's base
 * region (tag, on/off, backup), taking effect at the next allocation; the
 * getters report the region in force. tms_pause/tms_resume act on the
 * default client (NULL: every tag) and return 0 or a nonzero status (a
 * sentence in gmb_region_last_error()); an unknown tag is 0.
 */
#ifdef __cplusplus
#define GMB_BOOL bool
#else
#define GMB_BOOL _Bool
#endif
GMB_API void tms_set_interesting_region(GMB_BOOL on);
GMB_API GMB_BOOL tms_get_interesting_region(void);
GMB_API void tms_set_current_tag(const char *tag);
GMB_API const char *tms_get_current_tag(void);
GMB_API void tms_set_enable_cpu_backup(GMB_BOOL on);
GMB_API GMB_BOOL tms_get_enable_cpu_backup(void);
GMB_API void tms_set_cpu_backup_backend(const char *name);
GMB_API const char *tms_get_cpu_backup_backend(void);
GMB_API void tms_set_enable_disk_backup(GMB_BOOL on);
GMB_API GMB_BOOL tms_get_enable_disk_backup(void);
GMB_API void tms_set_disk_backup_dir(const char *dir);
GMB_API void set_memory_margin_bytes(uint64_t bytes);
GMB_API void tms_set_retain_cpu_backup(GMB_BOOL on);
GMB_API GMB_BOOL tms_get_retain_cpu_backup(void);
GMB_API int tms_pause(const char *tag);
GMB_API int tms_resume(const char *tag);
GMB_API uint8_t *tms_get_cpu_backup_pointer(const uint8_t *gpu_ptr, uint64_t size);
GMB_API void *tms_torch_malloc(ssize_t size, int device, void *stream);
GMB_API void tms_torch_free(void *ptr, ssize_t size, int device, void *stream);

/** gmb_library_path() - the file this libgmb was loaded from ("" if unknown). */
GMB_API const char *gmb_library_path(void);

/*
 * Arbitration: waits, switches, groups and priorities.
 *
 * At connect, $GMB_GROUP names the client's group (a switch or `gmbctl
 * priority` may name the group instead of each client), $GMB_PRIORITY its
 * priority (an integer, default 0; higher is served first), and
 * $GMB_PREEMPTIBLE=1 lets gmbd pause it (as a remote pause, so it needs a
 * control handler) when a waiting request of higher priority cannot be
 * served otherwise. $GMB_WAIT_MS sets the client's initial wait (below).
 */

/**
 * gmb_set_wait() - how long (@ms milliseconds, 0: not at all, the default)
 * gmb_malloc(), gmb_resume() and the region/preload allocations of @c wait
 * at gmbd for memory that does not fit the budget now, instead of failing
 * with -ENOMEM. Waiting requests are served per device, higher priority
 * first, then first come first served, as memory comes back; at the
 * deadline the call fails with -ENOMEM and gmb_last_error() names who
 * holds the memory. For a tool, it is how long a resume by gmb_control()
 * or the resumes of gmb_switch() may wait. It is also how long a pause
 * waits for other processes to close their imports of the tag's memory
 * (then -EBUSY naming them, the tag staying active).
 */
GMB_API int gmb_set_wait(gmb_client *c, uint32_t ms);

/**
 * gmb_switch() - pause @from's tags, then resume @to's, as one request:
 * @from and @to name a client (name, pid, #id) or a group (every client
 * that connected with that $GMB_GROUP; "@NAME" for a group only). @tags
 * (@ntags of them, in order; NULL/0: every tag) are the tags to pause on
 * FROM and to resume on TO, each where that client has it. Between clients
 * of one Unix user TO gets FROM's memory straight (no release, no zeroing,
 * no create); between users through the driver. On any failure both sides
 * are put back (TO paused again, FROM resumed again) and the error says so.
 * *@report (may be NULL) gets a malloc'd text, one line per step with its
 * time, then the total, on success and on failure alike (NULL when gmbd
 * did not answer).
 */
GMB_API int gmb_switch(gmb_client *c, const char *from, const char *to, const char *const *tags,
		       size_t ntags, char **report);

/**
 * gmb_set_priority() - set the priority of client or group @target
 * (higher is served first among waiting requests). -ENOENT, -EPERM.
 */
GMB_API int gmb_set_priority(gmb_client *c, const char *target, int priority);

#ifdef __cplusplus
}
#endif
#endif
