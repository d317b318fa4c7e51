/*
 * tms.c - the process's host copy settings (gmb_set_retain_host_copy and
 * the rest) and torch_memory_saver's C entry points over them, the
 * thread's base region (region.c) and the default client.
 *
 * torch_memory_saver keeps one thread-local configuration that its Python
 * side sets around a region; here its setters edit the calling thread's
 * base region and take effect at the next allocation, and its getters
 * report the region in force (so gmb_region_begin_ex() regions and plain
 * ones count too). None of these prints or exits; failures leave a sentence
 * in gmb_region_last_error().
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "client/lib/api/client.h"
#include "client/lib/hook/hook.h"

/* The runtime's statuses tms_pause/tms_resume return, as the peer's cudaError_t. */
#define TMS_CUDA_OOM	 2
#define TMS_CUDA_INVALID 1
#define TMS_CUDA_UNKNOWN 999

/* The process's settings. */

GMB_API int gmb_set_retain_host_copy(int retain)
{
	if (retain != 0 && retain != 1)
		return err_fmt(gmb__hook_err(), -EINVAL, "retain is 0 or 1, not %d", retain);
	gmb__backup_set_retain(retain);
	return 0;
}

GMB_API int gmb_get_retain_host_copy(void)
{
	return gmb__backup_retain();
}

GMB_API int gmb_set_default_backup(int backup)
{
	if (gmb__backup_set_default(backup) < 0)
		return err_fmt(gmb__hook_err(), -EINVAL,
			       "the default backup is pinned (0) or mmap (1), not %d", backup);
	return 0;
}

GMB_API int gmb_get_default_backup(void)
{
	return gmb__backup_default(gmb__hook_err());
}

GMB_API int gmb_set_disk_dir(const char *dir)
{
	return gmb__backup_set_dir(dir, gmb__hook_err());
}

GMB_API int gmb_get_disk_dir(char *buf, size_t cap)
{
	int rc = gmb__backup_get_dir(buf, cap);

	if (rc < 0)
		return err_fmt(gmb__hook_err(), rc, "the disk folder does not fit %zu bytes", cap);
	return 0;
}

/*
 * torch_memory_saver's configuration: the thread's base region. Every entry
 * point first applies the peer's defaults (retain off) unless the process
 * chose otherwise: a caller of these is a caller of the peer.
 */

GMB_API void tms_set_interesting_region(bool on)
{
	gmb__backup_peer_defaults();
	gmb__region_base_on(on);
}

GMB_API bool tms_get_interesting_region(void)
{
	gmb__backup_peer_defaults();
	return gmb_region_current(NULL, 0, NULL) > 0;
}

GMB_API void tms_set_current_tag(const char *tag)
{
	gmb__backup_peer_defaults();
	gmb__region_base_tag(tag);
}

GMB_API const char *tms_get_current_tag(void)
{
	gmb__backup_peer_defaults();
	const char *tag;
	int mode, backup;

	gmb__region_effective(&tag, &mode, &backup);
	return tag;
}

GMB_API void tms_set_enable_cpu_backup(bool on)
{
	gmb__backup_peer_defaults();
	gmb__region_base_cpu(on);
}

GMB_API bool tms_get_enable_cpu_backup(void)
{
	gmb__backup_peer_defaults();
	const char *tag;
	int mode, backup;

	gmb__region_effective(&tag, &mode, &backup);
	return mode == GMB_MODE_PRESERVE && backup != GMB_BACKUP_DISK;
}

GMB_API void tms_set_cpu_backup_backend(const char *name)
{
	gmb__backup_peer_defaults();
	int kind = gmb__backup_parse(name);

	if (kind < 0)
		err_fmt(gmb__hook_err(), -EINVAL,
			"cpu backup backend \"%.64s\": want pinned or mmap", name);
	else
		gmb__region_base_kind(kind);
}

GMB_API const char *tms_get_cpu_backup_backend(void)
{
	gmb__backup_peer_defaults();
	const char *tag;
	int mode, backup;

	gmb__region_effective(&tag, &mode, &backup);
	if (backup == GMB_BACKUP_DISK) {
		backup = gmb__backup_default(NULL);
		backup = backup < 0 ? GMB_BACKUP_PINNED : backup;
	}
	return backup == GMB_BACKUP_MMAP ? "mmap" : "pinned";
}

GMB_API void tms_set_enable_disk_backup(bool on)
{
	gmb__backup_peer_defaults();
	gmb__region_base_disk(on);
}

GMB_API bool tms_get_enable_disk_backup(void)
{
	gmb__backup_peer_defaults();
	const char *tag;
	int mode, backup;

	gmb__region_effective(&tag, &mode, &backup);
	return mode == GMB_MODE_PRESERVE && backup == GMB_BACKUP_DISK;
}

GMB_API void tms_set_disk_backup_dir(const char *dir)
{
	gmb__backup_peer_defaults();
	gmb_set_disk_dir(dir);
}

GMB_API void set_memory_margin_bytes(uint64_t bytes)
{
	gmb__backup_peer_defaults();
	gmb_set_memory_margin(bytes);
}

GMB_API void tms_set_retain_cpu_backup(bool on)
{
	gmb__backup_peer_defaults();
	gmb__backup_set_retain(on);
}

GMB_API bool tms_get_retain_cpu_backup(void)
{
	gmb__backup_peer_defaults();
	return gmb__backup_retain();
}

/* Pause, resume, copies, PyTorch's entry points. */

/* gmb_pause or gmb_resume of the default client; no client means nothing to do. */
static int tms_cycle(int op, const char *tag)
{
	struct gmb_client *c = gmb__hook_client_peek();
	int rc;

	if (!c)
		return 0;
	rc = op == GMB_OP_PAUSE ? gmb_pause(c, tag) : gmb_resume(c, tag);
	if (rc == 0 || rc == -ENOENT)
		return 0;
	gmb__hook_fail_client(rc, c, op == GMB_OP_PAUSE ? "tms_pause" : "tms_resume");
	if (rc == -ENOMEM)
		return TMS_CUDA_OOM;
	return rc == -EINVAL ? TMS_CUDA_INVALID : TMS_CUDA_UNKNOWN;
}

GMB_API int tms_pause(const char *tag)
{
	gmb__backup_peer_defaults();
	return tms_cycle(GMB_OP_PAUSE, tag);
}

GMB_API int tms_resume(const char *tag)
{
	gmb__backup_peer_defaults();
	return tms_cycle(GMB_OP_RESUME, tag);
}

GMB_API uint8_t *tms_get_cpu_backup_pointer(const uint8_t *gpu_ptr, uint64_t size)
{
	gmb__backup_peer_defaults();
	void *host = NULL;

	if (gmb_host_copy(NULL, gpu_ptr, (size_t)size, &host) < 0)
		return NULL;
	return host;
}

GMB_API void *tms_torch_malloc(ssize_t size, int device, void *stream)
{
	gmb__backup_peer_defaults();
	return gmb_torch_malloc(size, device, stream);
}

GMB_API void tms_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
	gmb__backup_peer_defaults();
	gmb_torch_free(ptr, size, device, stream);
}
