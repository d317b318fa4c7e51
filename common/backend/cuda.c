/*
 * cuda.c - the "cuda" memory backend: the CUDA driver's virtual
 * memory management API (cuMemCreate, cuMemMap, ...), loaded at run time.
 *
 *   chunk        cuMemCreate, pinned device memory, exportable as a POSIX fd
 *   export       a CLOEXEC dup of the one cuMemExportToShareableHandle fd
 *                made with the chunk (kept until its release)
 *   import       cuMemImportFromShareableHandle: the fd stays the caller's
 *   reservation  cuMemAddressReserve / cuMemAddressFree
 *   map          cuMemMap of a whole chunk at offset 0; no access until
 *   set_access   cuMemSetAccess (read-write for the owning device and any
 *                peers asked for: one descriptor each, one call)
 *   unmap        cuMemUnmap: the VA stays reserved
 *   contents     copies and memset on this backend's stream, then a wait
 *                (cuda_contents.c)
 *
 * Invariants:
 *   - No link-time tie to libcuda: it is dlopen'ed, and each entry point is
 *     fetched by cuGetProcAddress at the ABI version of the PFN_ typedef
 *     (cudaTypedefs.h) it is stored in, so the compiler checks every call
 *     and a newer driver cannot hand over a newer ABI (cuCtxSynchronize at
 *     13000 takes a context; at 2000 it does not).
 *   - Opening runs cuInit and device queries only: no context, so gmbd stays
 *     at cuInit's ~4 MiB of GPU memory; the VMM calls need none (GPU-FACTS).
 *   - Contents operations (sync, zero, copies, host memory) run in a
 *     device's primary context, retained on first use and released at
 *     close, pushed on the calling thread for the call and popped after.
 *   - The host backend's stateless checks are repeated (device index,
 *     granularity multiples: the chunk's or access's own device's, else the
 *     smallest), each refusal -EINVAL with a reason; the driver
 *     checks overlaps and whole mappings. What needs a record of handles and
 *     mappings (whole-chunk maps, unknown handles: cuMemRelease of one is
 *     undefined) is the host backend's to catch, in the tests: callers here
 *     are trusted to pass handles they hold.
 *   - A slot of gmbd's device order this process cannot see
 *     (backend_cuda_open_order) is marked invisible (ordinal -1, visible
 *     false) and refused by every operation; nothing walks into it.
 *   - One mutex guards the lazily made contexts and streams; the driver
 *     serializes a process's VMM calls anyway.
 */
#include "common/backend/libcuda.h"

#define CUDA_ROW(fn, ver, dl) { "cu" #fn, ver, offsetof(struct cuda_api, fn), dl },
static const struct cuda_sym cuda_boot_syms[] = { CUDA_BOOT_SYMS(CUDA_ROW) };
static const struct cuda_sym cuda_syms[] = { CUDA_SYMS(CUDA_ROW) };
#undef CUDA_ROW

static const struct backend_ops cuda_ops;

static int cuda_dlopen(struct cuda_priv *c)
{
	/*
	 * NODELETE: cuInit starts driver threads that outlive our use of it;
	 * unmapping the library's code under them at dlclose would crash.
	 */
	c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!c->lib)
		return backend_fail(-ENODEV, "cuda backend: libcuda.so.1 not found: %s", dlerror());
	return 0;
}

static int cuda_load_syms(struct cuda_priv *c, PFN_cuGetProcAddress_v12000 gpa,
			  const struct cuda_sym *syms, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct cuda_sym *s = &syms[i];
		CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		void *p = NULL;

		/* LEGACY_STREAM: our streams are explicit; never the _ptsz variants. */
		if (gpa && gpa(s->name, &p, s->version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q))
			q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		if (q != CU_GET_PROC_ADDRESS_SUCCESS || !p)
			p = dlsym(c->lib, s->dl_name);
		if (!p)
			return backend_fail(-ENODEV,
					    "cuda backend: the driver lacks %s (ABI %d): "
					    "driver too old?",
					    s->dl_name, s->version);
		/* POSIX guarantees a void * holds a function pointer (dlsym). */
		memcpy((char *)&c->api + s->off, &p, sizeof(p));
	}
	return 0;
}

static int cuda_load(struct cuda_priv *c)
{
	PFN_cuGetProcAddress_v12000 gpa = NULL;
	void *p = dlsym(c->lib, "cuGetProcAddress_v2");
	CUresult r;
	int rc;

	_Static_assert(sizeof(p) == sizeof(gpa), "function pointers fit a void *");
	memcpy(&gpa, &p, sizeof(p));
	/* "cuInit must be called before any other function": only these before it. */
	rc = cuda_load_syms(c, gpa, cuda_boot_syms, CUDA_COUNT(cuda_boot_syms));
	if (rc < 0)
		return rc;
	r = c->api.Init(0);
	if (r != CUDA_SUCCESS) {
		const char *name, *text;
		char num[24];

		/* Whatever cuInit says (no GPU, driver mismatch), CUDA is unusable here. */
		cuda__err_text(c, r, &name, &text, num);
		return backend_fail(-ENODEV, "cuda backend: cuInit failed: %s (%s)", name, text);
	}
	return cuda_load_syms(c, gpa, cuda_syms, CUDA_COUNT(cuda_syms));
}

/* Devices. */

static void cuda_prop_init(CUmemAllocationProp *prop, int dev)
{
	*prop = (CUmemAllocationProp){
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CUDA_FD_HANDLE,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
	};
}

static int cuda_dev_probe(struct cuda_priv *c, int i)
{
	struct backend_device *bd = &c->b.devices[i];
	CUdevice *d = &c->devs[i].cu;
	int vmm = 0, fd = 0;
	CUmemAllocationProp prop;
	size_t total = 0, gran = 0;
	CUresult r;

	r = c->api.DeviceGet(d, i);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceGetName(bd->name, (int)sizeof(bd->name), *d);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceTotalMem(&total, *d);
	/* The uuid names the GPU across processes whose CUDA_VISIBLE_DEVICES differ. */
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceGetUuid((CUuuid *)bd->uuid, *d);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceGetAttribute(&vmm, CUDA_ATTR_VMM, *d);
	if (r == CUDA_SUCCESS)
		r = c->api.DeviceGetAttribute(&fd, CUDA_ATTR_FD, *d);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuDeviceGet/GetName/TotalMem/GetUuid/GetAttribute",
				  "dev=%d", i);
	if (!vmm || !fd)
		return backend_fail(-EOPNOTSUPP,
				    "cuda backend: device %d (%s) lacks virtual "
				    "memory management with POSIX fd handles",
				    i, bd->name);
	cuda_prop_init(&prop, i);
	r = c->api.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemGetAllocationGranularity", "dev=%d", i);
	bd->total_bytes = total;
	bd->granularity = gran;
	bd->ordinal = i;
	c->devs[i].visible = true;
	return 0;
}

/* The smallest granularity of the visible devices (0 if none is). */
static void cuda_gran_min(struct cuda_priv *c)
{
	c->gran_min = 0;
	for (int i = 0; i < c->b.ndevices; i++) {
		uint64_t g = c->b.devices[i].granularity;

		if (c->devs[i].visible && (!c->gran_min || g < c->gran_min))
			c->gran_min = g;
	}
}

static int cuda_devices(struct cuda_priv *c)
{
	int n = 0, rc;
	CUresult r;

	r = c->api.DeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuDeviceGetCount", "after cuInit");
	if (n <= 0)
		return backend_fail(-ENODEV, "cuda backend: no CUDA device");
	if (n > BACKEND_MAX_DEVICES)
		n = BACKEND_MAX_DEVICES;
	for (int i = 0; i < n; i++) {
		rc = cuda_dev_probe(c, i);
		if (rc < 0)
			return rc;
	}
	c->b.ndevices = n;
	return 0;
}

/* Puts the probed devices in @uuids' order; unmatched uuids become holes. */
static void cuda_devices_order(struct cuda_priv *c, const uint8_t (*uuids)[16], int n)
{
	static const struct backend_device hole = { .name = "not visible", .ordinal = -1 };
	struct backend_device bd[BACKEND_MAX_DEVICES];
	struct cuda_dev cd[BACKEND_MAX_DEVICES];

	if (n > BACKEND_MAX_DEVICES)
		n = BACKEND_MAX_DEVICES;
	for (int i = 0; i < n; i++) {
		bd[i] = hole;
		memcpy(bd[i].uuid, uuids[i], sizeof(bd[i].uuid));
		cd[i] = (struct cuda_dev){ .visible = false };
		for (int j = 0; j < c->b.ndevices; j++) {
			if (memcmp(c->b.devices[j].uuid, uuids[i], sizeof(bd[i].uuid)) == 0) {
				bd[i] = c->b.devices[j];
				cd[i] = c->devs[j];
				break;
			}
		}
	}
	memcpy(c->b.devices, bd, (size_t)n * sizeof(bd[0]));
	memcpy(c->devs, cd, (size_t)n * sizeof(cd[0]));
	c->b.ndevices = n;
}

/* Range checks, as the host backend makes them (device checks: cuda_error.c). */

/*
 * @size non-zero, @size and @va multiples of @dev's granularity (pass va 0
 * if none; @dev -1: not tied to a device, the smallest granularity).
 */
static int cuda_check_range(struct cuda_priv *c, const char *op, int dev, uintptr_t va,
			    uint64_t size)
{
	uint64_t gran = dev >= 0 ? c->b.devices[dev].granularity : c->gran_min;

	if (size == 0)
		return backend_fail(-EINVAL, "cuda backend: %s: size 0", op);
	if (!gran)
		return backend_fail(-ENODEV,
				    "cuda backend: %s: none of the devices is visible "
				    "in this process (CUDA_VISIBLE_DEVICES)",
				    op);
	if (size % gran || va % gran)
		return backend_fail(-EINVAL,
				    "cuda backend: %s: 0x%" PRIxPTR "+0x%" PRIx64
				    " is not aligned to the granularity 0x%" PRIx64,
				    op, va, size, gran);
	return 0;
}

/* Physical memory: no context needed (GPU-FACTS.md). */

static int cuda_keep_new(struct cuda_priv *c, CUmemGenericAllocationHandle h);

static int cuda_chunk_create(struct backend *b, int dev, uint64_t size, uint64_t *handle)
{
	struct cuda_priv *c = b->priv;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	CUresult r;
	int rc;

	rc = cuda__check_dev(c, "chunk_create", dev);
	if (rc == 0)
		rc = cuda_check_range(c, "chunk_create", dev, 0, size);
	if (rc < 0)
		return rc;
	cuda_prop_init(&prop, c->b.devices[dev].ordinal);
	r = CUDA_RELAXED(c, c->api.MemCreate(&h, size, &prop, 0));
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemCreate", "dev=%d size=0x%" PRIx64, dev, size);
	rc = cuda_keep_new(c, h);
	if (rc < 0) {
		CUDA_RELAXED(c, c->api.MemRelease(h));
		return rc;
	}
	*handle = h;
	return 0;
}

/*
 * Driver 580 makes an export in a process that holds no other exported fd
 * cost about 0.6 ms, and the close that drops the last one about as much
 * in whichever process drops it (the client, after its import); with
 * another exported fd open they cost ~30 and ~13 us (bench/export_probe.cu:
 * a lend's round trip 1.3 ms without, 0.1 ms with). gmbd closes each chunk's
 * fd once it is sent, so every lend paid both. One fd per device, of a
 * granularity-sized chunk whose handle is released (the fd keeps those
 * bytes alive, outside the pool), stays open until the backend closes. A
 * device where it cannot be made exports as before, only slower. Called
 * with c->lock held.
 */
static void cuda_keep_exported(struct cuda_priv *c)
{
	for (int i = 0; i < c->b.ndevices; i++) {
		struct cuda_dev *d = &c->devs[i];
		CUmemGenericAllocationHandle h;
		CUmemAllocationProp prop;
		int fd = -1;

		if (d->keep_tried || !d->visible)
			continue;
		d->keep_tried = true;
		d->keep_fd = -1;
		cuda_prop_init(&prop, c->b.devices[i].ordinal);
		if (CUDA_RELAXED(c, c->api.MemCreate(&h, c->b.devices[i].granularity, &prop, 0)) !=
		    CUDA_SUCCESS)
			continue;
		if (CUDA_RELAXED(c, c->api.MemExportToShareableHandle(&fd, h, CUDA_FD_HANDLE, 0)) ==
			    CUDA_SUCCESS &&
		    fcntl(fd, F_SETFD, FD_CLOEXEC) == 0)
			d->keep_fd = fd;
		else if (fd >= 0)
			close(fd);
		CUDA_RELAXED(c, c->api.MemRelease(h));
	}
}

/* The fd in a kept map's value (fd + 1), or -1 for none (NULL). */
static int cuda_kept_fd(void *val)
{
	return (int)((intptr_t)val - 1);
}

/* A new CLOEXEC export of @h in *@fd. */
static int cuda_export_fresh(struct cuda_priv *c, CUmemGenericAllocationHandle h, int *fd)
{
	int rc, out = -1;
	CUresult r;

	r = CUDA_RELAXED(c, c->api.MemExportToShareableHandle(&out, h, CUDA_FD_HANDLE, 0));
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemExportToShareableHandle", "handle=0x%llx",
				  (unsigned long long)h);
	/*
	 * An inherited chunk fd keeps GPU memory alive in whatever the process
	 * execs. Driver 580 returns it CLOEXEC, but no document promises it.
	 */
	if (fcntl(out, F_SETFD, FD_CLOEXEC) < 0) {
		rc = backend_fail(-errno, "cuda backend: chunk_export: FD_CLOEXEC on fd %d: %s",
				  out, strerror(errno));
		close(out);
		return rc;
	}
	*fd = out;
	return 0;
}

/*
 * A created chunk is exported once and its fd kept until the release:
 * every lend sends a dup of it. Closing a dup (gmbd's, once sent; the
 * client's, once imported) only drops a reference to the open file, where
 * closing the export's last fd makes the driver tear the export down,
 * which on driver 580 grows with the chunk (about 0.1 ms for 1 GiB, in
 * each process). So a chunk costs one fd in gmbd, as on the host backend.
 */
static int cuda_keep_new(struct cuda_priv *c, CUmemGenericAllocationHandle h)
{
	int fd, rc;

	pthread_mutex_lock(&c->lock);
	cuda_keep_exported(c);
	pthread_mutex_unlock(&c->lock);
	rc = cuda_export_fresh(c, h, &fd);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&c->lock);
	rc = idmap_put(&c->kept, h, (void *)(intptr_t)(fd + 1));
	pthread_mutex_unlock(&c->lock);
	if (rc < 0) {
		close(fd);
		return backend_fail(-ENOMEM, "cuda backend: chunk_create: out of memory");
	}
	return 0;
}

static int cuda_chunk_export(struct backend *b, uint64_t handle, int *fd)
{
	struct cuda_priv *c = b->priv;
	int kept, out = -1;

	pthread_mutex_lock(&c->lock);
	kept = cuda_kept_fd(idmap_get(&c->kept, handle));
	if (kept >= 0)
		out = fcntl(kept, F_DUPFD_CLOEXEC, 0);
	else
		cuda_keep_exported(c);
	pthread_mutex_unlock(&c->lock);
	if (kept < 0) /* a handle this backend neither made nor adopted */
		return cuda_export_fresh(c, handle, fd);
	if (out < 0)
		return backend_fail(-errno, "cuda backend: chunk_export: dup of fd %d: %s", kept,
				    strerror(errno));
	*fd = out;
	return 0;
}

static int cuda_chunk_import(struct backend *b, int fd, uint64_t size, uint64_t *handle)
{
	struct cuda_priv *c = b->priv;
	CUmemGenericAllocationHandle h;
	CUresult r;
	int rc;

	if (fd < 0)
		return backend_fail(-EBADF, "cuda backend: chunk_import: bad fd %d", fd);
	rc = cuda_check_range(c, "chunk_import", -1, 0, size);
	if (rc < 0)
		return rc;
	/* The POSIX fd travels as the pointer value; the driver does not close it. */
	r = CUDA_RELAXED(c, c->api.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
								CUDA_FD_HANDLE));
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemImportFromShareableHandle", "fd=%d size=0x%" PRIx64,
				  fd, size);
	/* The driver cannot tell a chunk's size: @size is only checked for alignment. */
	*handle = h;
	return 0;
}

/*
 * An imported handle cannot be exported again: the driver (580) answers
 * cuMemExportToShareableHandle with CUDA_ERROR_INVALID_VALUE. gmbd lends the
 * chunks it took back from its fd store, so it adopts them: the fd is kept,
 * and each export of the handle is a dup of it (the same memory, as any
 * export would be).
 */
static int cuda_chunk_adopt(struct backend *b, int fd, uint64_t size, uint64_t *handle)
{
	struct cuda_priv *c = b->priv;
	int keep, rc;

	if (fd < 0)
		return backend_fail(-EBADF, "cuda backend: chunk_adopt: bad fd %d", fd);
	keep = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (keep < 0)
		return backend_fail(-errno, "cuda backend: chunk_adopt: dup of fd %d: %s", fd,
				    strerror(errno));
	rc = cuda_chunk_import(b, fd, size, handle);
	if (rc < 0)
		goto err_close;
	pthread_mutex_lock(&c->lock);
	rc = idmap_put(&c->kept, *handle, (void *)(intptr_t)(keep + 1));
	pthread_mutex_unlock(&c->lock);
	if (rc < 0) {
		CUDA_RELAXED(c, c->api.MemRelease(*handle));
		rc = backend_fail(-ENOMEM, "cuda backend: chunk_adopt: out of memory");
		goto err_close;
	}
	return 0;

err_close:
	close(keep);
	return rc;
}

static int cuda_chunk_release(struct backend *b, uint64_t handle)
{
	struct cuda_priv *c = b->priv;
	CUresult r;
	int kept;

	pthread_mutex_lock(&c->lock);
	kept = cuda_kept_fd(idmap_del(&c->kept, handle));
	pthread_mutex_unlock(&c->lock);
	if (kept >= 0)
		close(kept);

	/* Mappings keep the memory; the last reference zeroes it (GPU-FACTS.md). */
	r = CUDA_RELAXED(c, c->api.MemRelease(handle));
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemRelease", "handle=0x%" PRIx64, handle);
	return 0;
}

/* Virtual address ranges. */

static int cuda_va_reserve(struct backend *b, uint64_t size, uint64_t align, uintptr_t *va)
{
	struct cuda_priv *c = b->priv;
	CUdeviceptr p = 0;
	CUresult r;
	int rc;

	rc = cuda_check_range(c, "va_reserve", -1, 0, size);
	if (rc < 0)
		return rc;
	if (align & (align - 1))
		return backend_fail(-EINVAL,
				    "cuda backend: va_reserve: alignment 0x%" PRIx64
				    " is not a power of two",
				    align);
	/*
	 * Every map address must be a multiple of its chunk's device's
	 * granularity: callers pass that device's as @align (at least the
	 * smallest is kept).
	 */
	if (align < c->gran_min)
		align = c->gran_min;
	r = CUDA_RELAXED(c, c->api.MemAddressReserve(&p, size, align, 0, 0));
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemAddressReserve",
				  "size=0x%" PRIx64 " align=0x%" PRIx64, size, align);
	*va = (uintptr_t)p;
	return 0;
}

/* @fn (named @sym) on [va, va+size), after the range is checked as @op's. */
static int cuda_range_call(struct cuda_priv *c, const char *op, PFN_cuMemUnmap_v10020 fn,
			   const char *sym, uintptr_t va, uint64_t size)
{
	CUresult r;
	int rc;

	rc = cuda_check_range(c, op, -1, va, size);
	if (rc < 0)
		return rc;
	r = CUDA_RELAXED(c, fn(va, size));
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, sym, "va=0x%" PRIxPTR " size=0x%" PRIx64, va, size);
	return 0;
}

static int cuda_va_free(struct backend *b, uintptr_t va, uint64_t size)
{
	struct cuda_priv *c = b->priv;

	return cuda_range_call(c, "va_free", c->api.MemAddressFree, "cuMemAddressFree", va, size);
}

static int cuda_map(struct backend *b, uintptr_t va, uint64_t size, uint64_t handle)
{
	struct cuda_priv *c = b->priv;
	CUresult r;
	int rc;

	rc = cuda_check_range(c, "map", -1, va, size);
	if (rc < 0)
		return rc;
	/* offset "currently must be zero" (cuMemMap); flags must be 0. */
	r = CUDA_RELAXED(c, c->api.MemMap(va, size, 0, handle, 0));
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemMap",
				  "va=0x%" PRIxPTR " size=0x%" PRIx64 " handle=0x%" PRIx64, va,
				  size, handle);
	return 0;
}

/* One descriptor per device of @dev and @peers, by this process's ordinals. */
static int cuda_access_descs(struct cuda_priv *c, int dev, uint64_t peers, CUmemAccess_flags flags,
			     CUmemAccessDesc desc[static BACKEND_MAX_DEVICES], int *n)
{
	int rc = cuda__check_dev(c, "set_access", dev);

	*n = 0;
	peers |= 1ULL << dev;
	for (int d = 0; d < BACKEND_MAX_DEVICES && rc == 0; d++) {
		if (!(peers & (1ULL << d)))
			continue;
		if (d != dev && (rc = cuda__check_dev(c, "set_access (peer)", d)) < 0)
			break;
		/* The driver names a device by this process's ordinal, not by our index. */
		desc[(*n)++] = (CUmemAccessDesc){
			.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE,
				      .id = c->b.devices[d].ordinal },
			.flags = flags,
		};
	}
	return rc;
}

static int cuda_access(struct backend *b, int dev, uint64_t peers, CUmemAccess_flags flags,
		       uintptr_t va, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	CUmemAccessDesc desc[BACKEND_MAX_DEVICES];
	CUresult r;
	int rc, n;

	rc = cuda_access_descs(c, dev, peers, flags, desc, &n);
	if (rc == 0)
		rc = cuda_check_range(c, "set_access", dev, va, size);
	if (rc < 0)
		return rc;
	/* One call over back-to-back mappings costs what one call per mapping does
	 * (GPU-FACTS.md, bench/unmap_probe.cu): the driver charges per mapping. */
	r = CUDA_RELAXED(c, c->api.MemSetAccess(va, size, desc, (size_t)n));
	if (r != CUDA_SUCCESS)
		return cuda__fail(
			c, r, "cuMemSetAccess",
			"dev=%d peers=0x%" PRIx64 " va=0x%" PRIxPTR " size=0x%" PRIx64 "%s", dev,
			peers, va, size,
			n > 1 ? " (can each peer reach the device? cuDeviceCanAccessPeer)" : "");
	return 0;
}

static int cuda_set_access_peers(struct backend *b, int dev, uint64_t peers, uintptr_t va,
				 uint64_t size)
{
	return cuda_access(b, dev, peers, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, va, size);
}

static int cuda_set_access(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	return cuda_set_access_peers(b, dev, 0, va, size);
}

/* The device enforces it: a kernel's write to the range faults. */
static int cuda_set_access_ro(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	return cuda_access(b, dev, 0, CU_MEM_ACCESS_FLAGS_PROT_READ, va, size);
}

static int cuda_unmap(struct backend *b, uintptr_t va, uint64_t size)
{
	struct cuda_priv *c = b->priv;

	/* Does not wait for GPU work on the range: callers sync first. */
	return cuda_range_call(c, "unmap", c->api.MemUnmap, "cuMemUnmap", va, size);
}

/* Setup and teardown. */

static void cuda_close(struct backend *b)
{
	struct cuda_priv *c;
	void *val;

	if (!b)
		return;
	c = b->priv;
	/* Chunks and reservations stay the caller's to release; the kept fds
	 * are this backend's (their handles live on until released). */
	for (size_t it = 0, key; idmap_next(&c->kept, &it, &key, &val);)
		close(cuda_kept_fd(val));
	idmap_deinit(&c->kept);
	for (int i = 0; i < b->ndevices; i++) {
		if (c->devs[i].keep_tried && c->devs[i].keep_fd >= 0)
			close(c->devs[i].keep_fd);
		cuda__close_dev(c, i);
	}
	cuda__nvml_close(c);
	dlclose(c->lib);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int backend_cuda_open(struct backend **out)
{
	return backend_cuda_open_order(NULL, 0, out);
}

int backend_cuda_open_order(const uint8_t (*uuids)[16], int n, struct backend **out)
{
	struct cuda_priv *c;
	int rc;

	if (!out)
		return backend_fail(-EINVAL, "cuda backend: no place for the result");
	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return backend_fail(-ENOMEM, "cuda backend: out of memory");
	rc = -pthread_mutex_init(&c->lock, NULL);
	if (rc < 0) {
		backend_fail(rc, "cuda backend: mutex: %s", strerror(-rc));
		goto out_free;
	}
	rc = cuda_dlopen(c);
	if (rc < 0)
		goto out_lock;
	rc = cuda_load(c);
	if (rc == 0)
		rc = cuda_devices(c);
	if (rc < 0)
		goto out_lib;
	if (uuids && n > 0)
		cuda_devices_order(c, uuids, n);
	cuda_gran_min(c);
	c->b.ops = &cuda_ops;
	c->b.priv = c;
	*out = &c->b;
	return 0;

out_lib:
	dlclose(c->lib);
out_lock:
	pthread_mutex_destroy(&c->lock);
out_free:
	free(c);
	return rc;
}

static const struct backend_ops cuda_ops = {
	.name = "cuda",
	.chunk_fds = 1,
	.close = cuda_close,
	.chunk_create = cuda_chunk_create,
	.chunk_export = cuda_chunk_export,
	.chunk_import = cuda_chunk_import,
	.chunk_adopt = cuda_chunk_adopt,
	.chunk_release = cuda_chunk_release,
	.va_reserve = cuda_va_reserve,
	.va_free = cuda_va_free,
	.map = cuda_map,
	.set_access = cuda_set_access,
	.set_access_peers = cuda_set_access_peers,
	.set_access_ro = cuda_set_access_ro,
	.unmap = cuda_unmap,
	.sync = cuda__sync,
	.zero = cuda__zero,
	.copy_to_host = cuda__copy_to_host,
	.copy_from_host = cuda__copy_from_host,
	.contents_queue = cuda__contents_queue,
	.wait = cuda__wait,
	.contents_release = cuda__contents_release,
	.host_alloc = cuda__host_alloc,
	.host_free = cuda__host_free,
	.host_register = cuda__host_register,
	.host_unregister = cuda__host_unregister,
	.driver_mem = cuda__driver_mem,
	.driver_source = "nvml",
};
