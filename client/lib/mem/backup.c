/*
 * backup.c - host copies of PRESERVE allocations (pinned, pageable through
 * a pinned ring, mmap'd, or a file) and the process's settings for them.
 *
 * A copy is made at an allocation's first pause and, unless retained, freed
 * once resume has copied it back; but a retained PINNED one is made ahead.
 * Its memory depends on the kind and on retain:
 *   - PINNED retained: pinned memory, copied directly and queued with the
 *     other copies (the link's full speed). It is made right after the
 *     allocation, off the allocating thread (prep.c: fresh memory faulted
 *     in on several threads and registered in pieces), so the first pause
 *     finds it ready: retain keeps a copy for every pause, so it counts
 *     from the allocation on. A pause that comes first waits for it, or
 *     makes it itself if it was not started; if the making failed, the
 *     pause makes it in the backend's host memory as before (pinned on
 *     cuda), the reason kept (gmb__backup_prep_error());
 *   - PINNED not retained, and MMAP: anonymous mmap'd memory, filled through
 *     a ring of two pinned pieces with the host side copied by several
 *     threads (their first touch faults the fresh pages in parallel): pinning
 *     the whole copy at each pause would cost more than copying it;
 *   - DISK: a file in the disk folder, through one pinned buffer.
 * gmb_host_copy() of a pageable PINNED copy registers it with the backend,
 * so that what it hands out is CUDA host memory as the kind promises; one
 * made ahead is registered again as one range then (the driver refuses a
 * copy across two registrations, and the application's may span them).
 *
 * Ring copies wait for the device (wait()) between pieces: exactly one piece
 * is in flight while the threads copy the other. Everything here runs under
 * the operation lock; the settings are atomics (or under backup_lock) and
 * read by any thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/lib/mem/backup.h"
#include "client/lib/mem/prep.h"
#include "common/err.h"
#include "include/gmb.h"
#include "common/env.h"

/* Two pieces: one in flight on the link while the threads copy the other. */
#define BACKUP_RING_PIECE	  (64ULL << 20)
#define BACKUP_DISK_CHUNK_DEFAULT 256ULL
/* A copy made ahead is registered in pieces of this many bytes (~10-20 ms each on an H200). */
#define BACKUP_REG_PIECE	  (256ULL << 20)

struct backup_cfg {
	atomic_int retain;	   /* 0 or 1 */
	atomic_bool retain_chosen; /* by $TMS_RETAIN_CPU_BACKUP or a setter */
	atomic_int dflt;	   /* GMB_BACKUP_PINNED, _MMAP, or -EINVAL (bad environment) */
	char bad_kind[64];	   /* the malformed $TMS_INIT_CPU_BACKUP_BACKEND */
	char dir[PATH_MAX];	   /* under backup_lock */
};

static struct backup_cfg backup_cfg;
static pthread_mutex_t backup_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t backup_once = PTHREAD_ONCE_INIT;

/* Settings. */

/* "pinned" | "mmap" ("" or NULL: pinned) -> GMB_BACKUP_*, else -EINVAL. */
int gmb__backup_parse(const char *name)
{
	if (!name || !*name || strcmp(name, "pinned") == 0)
		return GMB_BACKUP_PINNED;
	if (strcmp(name, "mmap") == 0)
		return GMB_BACKUP_MMAP;
	return -EINVAL;
}

static void backup_env_load(void)
{
	const char *kind = getenv("TMS_INIT_CPU_BACKUP_BACKEND");
	const char *dir = getenv("TMS_DISK_BACKUP_DIR");
	int k = gmb__backup_parse(kind);

	const char *retain = getenv("TMS_RETAIN_CPU_BACKUP");

	/*
	 * gmbd's own default keeps a PRESERVE allocation's pinned copy for the
	 * next pause: copies then run at the pinned limit every cycle. A process
	 * configured as torch_memory_saver's (TMS_INIT_ENABLE, or its entry
	 * points and Python module: gmb__backup_peer_defaults()) gets the
	 * peer's default instead, retain off.
	 */
	if (retain) {
		atomic_store(&backup_cfg.retain, env_true("TMS_RETAIN_CPU_BACKUP"));
		atomic_store(&backup_cfg.retain_chosen, true);
	} else {
		atomic_store(&backup_cfg.retain, env_true("TMS_INIT_ENABLE") ? 0 : 1);
	}
	atomic_store(&backup_cfg.dflt, k);
	if (k < 0)
		snprintf(backup_cfg.bad_kind, sizeof(backup_cfg.bad_kind), "%.60s", kind);
	snprintf(backup_cfg.dir, sizeof(backup_cfg.dir), "%s", dir && *dir ? dir : "/tmp");
}

static void backup_env(void)
{
	pthread_once(&backup_once, backup_env_load);
}

int gmb__backup_retain(void)
{
	backup_env();
	return atomic_load(&backup_cfg.retain);
}

void gmb__backup_set_retain(int on)
{
	backup_env();
	atomic_store(&backup_cfg.retain, on ? 1 : 0);
	atomic_store(&backup_cfg.retain_chosen, true);
}

void gmb__backup_peer_defaults(void)
{
	backup_env();
	if (!atomic_load(&backup_cfg.retain_chosen))
		atomic_store(&backup_cfg.retain, 0);
}

/* The kind GMB_BACKUP_DEFAULT means, or -EINVAL with the reason in @err. */
int gmb__backup_default(char *err)
{
	int k;

	backup_env();
	k = atomic_load(&backup_cfg.dflt);
	if (k < 0)
		return err_fmt(err, -EINVAL,
			       "TMS_INIT_CPU_BACKUP_BACKEND=\"%s\": want pinned or mmap",
			       backup_cfg.bad_kind);
	return k;
}

int gmb__backup_set_default(int kind)
{
	if (kind != GMB_BACKUP_PINNED && kind != GMB_BACKUP_MMAP)
		return -EINVAL;
	backup_env();
	atomic_store(&backup_cfg.dflt, kind);
	return 0;
}

/* mkdir -p of @dir (mode 0700 for what it creates). */
static int backup_mkdirs(const char *dir)
{
	char p[PATH_MAX];
	size_t n = strlen(dir);

	if (n == 0 || n >= sizeof(p))
		return n ? -ENAMETOOLONG : -EINVAL;
	memcpy(p, dir, n + 1);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0700) < 0 && errno != EEXIST)
			return -errno;
		*s = '/';
	}
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int gmb__backup_set_dir(const char *dir, char *err)
{
	struct stat st;
	int rc;

	if (!dir || !*dir)
		return err_fmt(err, -EINVAL, "an empty disk backup folder");
	backup_env();
	rc = backup_mkdirs(dir);
	if (rc == 0 && (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)))
		rc = -ENOTDIR;
	if (rc < 0)
		return err_fmt(err, rc, "disk backup folder %s: %s", dir, strerror(-rc));
	pthread_mutex_lock(&backup_lock);
	snprintf(backup_cfg.dir, sizeof(backup_cfg.dir), "%s", dir);
	pthread_mutex_unlock(&backup_lock);
	return 0;
}

int gmb__backup_get_dir(char *buf, size_t cap)
{
	int rc = 0;

	backup_env();
	pthread_mutex_lock(&backup_lock);
	if (!buf || strlen(backup_cfg.dir) >= cap)
		rc = -ENOBUFS;
	else
		memcpy(buf, backup_cfg.dir, strlen(backup_cfg.dir) + 1);
	pthread_mutex_unlock(&backup_lock);
	return rc;
}

/* $TMS_DISK_BACKUP_CHUNK_MB MiB (0, unset or bad: 256), read when first needed. */
static uint64_t backup_disk_chunk(void)
{
	const char *v = getenv("TMS_DISK_BACKUP_CHUNK_MB");
	char *end = NULL;
	unsigned long long mb = v && *v ? strtoull(v, &end, 10) : 0;

	if (!end || *end || mb == 0 || mb > (1ULL << 20))
		mb = BACKUP_DISK_CHUNK_DEFAULT;
	return mb << 20;
}

/* memcpy in up to GMB__PREP_PAR_MAX threads, this one among them. */
static void backup_par_copy(void *dst, const void *src, size_t n)
{
	struct gmb__prep_par g;

	gmb__prep_par_start(&g, dst, src, n, true);
	gmb__prep_par_join(&g);
}

/* The ring and the disk buffer: pinned, made on first use, kept until close. */

static int backup_ring(struct backend *be, struct gmb__backup_bufs *b, char *err)
{
	for (int i = 0; i < 2; i++) {
		int rc = b->ring[i] ? 0 : be->ops->host_alloc(be, BACKUP_RING_PIECE, &b->ring[i]);

		if (rc < 0)
			return backend_fail_msg(err, rc, "allocating the pinned copy ring");
	}
	return 0;
}

static int backup_disk_stage(struct backend *be, struct gmb__backup_bufs *b, char *err)
{
	uint64_t want;
	int rc;

	if (b->disk_stage)
		return 0;
	want = backup_disk_chunk();
	rc = be->ops->host_alloc(be, want, &b->disk_stage);
	if (rc < 0)
		return backend_fail_msg(err, rc, "allocating the pinned disk buffer");
	b->disk_stage_size = want;
	return 0;
}

void gmb__backup_bufs_free(struct backend *be, struct gmb__backup_bufs *b)
{
	/* First: the worker may still be making a copy with @be. */
	gmb__prep_close(&b->prep);
	for (int i = 0; i < 2; i++)
		if (b->ring[i])
			be->ops->host_free(be, b->ring[i], BACKUP_RING_PIECE);
	if (b->disk_stage)
		be->ops->host_free(be, b->disk_stage, b->disk_stage_size);
	*b = (struct gmb__backup_bufs){ 0 };
}

/* Copies. */

int gmb__alloc_mode(const struct gmb__alloc *a)
{
	return a->own_mode ? a->mode : a->tag->mode;
}

void gmb__backup_init(struct gmb__alloc *a)
{
	a->copy = (struct gmb__hostcopy){ .how = GMB__COPY_NONE, .fd = -1 };
}

/**
 * gmb__backup_free() - frees @a's copy, whatever it is (the file is
 * removed), and drops the one being made ahead for it, if any.
 */
void gmb__backup_free(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a)
{
	struct gmb__hostcopy *h = &a->copy;

	gmb__prep_cancel(b->prep, a->va);
	if (h->registered)
		gmb__prep_unregister(be, h->p, a->size, h->reg_piece);
	/* Pinned, unregistered: the backend's host memory; else mapped here. */
	if (h->how == GMB__COPY_PINNED && !h->registered)
		be->ops->host_free(be, h->p, a->size);
	else if (h->how == GMB__COPY_PINNED || h->how == GMB__COPY_PAGEABLE)
		munmap(h->p, a->size);
	if (h->how == GMB__COPY_FILE) {
		close(h->fd);
		unlink(h->path);
		free(h->path);
	}
	gmb__backup_init(a);
	a->saved = false;
}

static int backup_file_new(struct gmb__alloc *a, char *err)
{
	char dir[PATH_MAX], *path;
	int fd;

	gmb__backup_get_dir(dir, sizeof(dir));
	if (asprintf(&path, "%s/gmb-%d-%" PRIu64 "-XXXXXX", dir, (int)getpid(), a->id) < 0)
		return err_fmt(err, -ENOMEM, "out of memory naming a disk copy");
	fd = mkostemp(path, O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;

		free(path);
		return err_fmt(err, rc, "creating a disk copy in %s: %s", dir, strerror(-rc));
	}
	/* mkostemp makes it 0600: the bytes are the application's. */
	a->copy = (struct gmb__hostcopy){ .how = GMB__COPY_FILE, .fd = fd, .path = path };
	return 0;
}

/* Whether @a gets a copy made ahead: PRESERVE, PINNED, retained (what keeps one for every pause). */
static bool backup_ahead(struct backend *be, const struct gmb__alloc *a)
{
	return a->copy.how == GMB__COPY_NONE && gmb__alloc_mode(a) == GMB_MODE_PRESERVE &&
	       a->backup == GMB_BACKUP_PINNED && gmb__backup_retain() && be &&
	       be->ops->host_register && be->ops->host_unregister;
}

void gmb__backup_prep(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a)
{
	/* Nothing queued (out of memory for the job): the first pause makes the copy. */
	if (backup_ahead(be, a))
		(void)gmb__prep_submit(&b->prep, be, a->va, a->size,
				       b->reg_piece ? b->reg_piece : BACKUP_REG_PIECE);
}

void gmb__backup_prep_tag(struct backend *be, struct gmb__backup_bufs *b, struct gmb__tag *t)
{
	for (struct gmb__alloc *a = t->allocs; a; a = a->next)
		gmb__backup_prep(be, b, a);
}

void gmb__backup_busy(struct gmb__backup_bufs *b)
{
	gmb__prep_busy(b->prep);
}

void gmb__backup_prep_error(struct gmb__backup_bufs *b, char *buf, size_t cap)
{
	gmb__prep_last_error(b->prep, buf, cap);
}

/* The backend's pinned memory for @a, as before copies were made ahead; @ahead: why that failed. */
static int backup_pinned_new(struct backend *be, struct gmb__alloc *a, const char *ahead, char *err)
{
	void *p;
	int rc = be->ops->host_alloc(be, a->size, &p);

	if (rc < 0) {
		rc = backend_fail_msg(err, rc, "allocating the host copy of an allocation");
		if (ahead[0])
			err_append(err, " (made ahead, it had failed too: %s)", ahead);
		return rc;
	}
	a->copy = (struct gmb__hostcopy){ .how = GMB__COPY_PINNED, .p = p, .fd = -1 };
	return 0;
}

/*
 * gmb__backup_prepare() - @a's copy exists (made now if needed) in the
 * memory its kind and the retain setting ask for. A copy kept from an
 * earlier cycle is reused as it is (same address, same file); one made
 * ahead is taken (waited for while it is being made), even if retain was
 * turned off since: it exists already, and resume frees it then.
 */
int gmb__backup_prepare(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			char *err)
{
	char ahead[ERR_MSG_MAX] = "";
	struct gmb__prep_copy pc;
	void *p;
	int rc;

	if (a->copy.how != GMB__COPY_NONE)
		return 0;
	if (a->backup == GMB_BACKUP_DISK)
		return backup_file_new(a, err);
	rc = a->backup == GMB_BACKUP_PINNED ? gmb__prep_take(b->prep, a->va, &pc, ahead) : 0;
	if (rc > 0) {
		a->copy = (struct gmb__hostcopy){ .how = GMB__COPY_PINNED,
						  .p = pc.p,
						  .registered = true,
						  .reg_piece = pc.piece,
						  .fd = -1 };
		return 0;
	}
	if (a->backup == GMB_BACKUP_PINNED && gmb__backup_retain())
		return backup_pinned_new(be, a, ahead, err);
	p = gmb__prep_map(a->size, false);
	if (p == MAP_FAILED)
		return err_fmt(err, -ENOMEM, "mapping a host copy of %" PRIu64 " bytes: %s",
			       a->size, strerror(errno));
	a->copy = (struct gmb__hostcopy){ .how = GMB__COPY_PAGEABLE, .p = p, .fd = -1 };
	return 0;
}

/*
 * gmb__backup_queue() - the PINNED copy's bytes to or from the device,
 * queued; one copy per registration, as the driver refuses one that spans
 * two. Return: 0 or the backend's error (what was queued still runs).
 */
int gmb__backup_queue(struct backend *be, struct gmb__alloc *a, enum backend_contents op)
{
	uint64_t piece = a->copy.reg_piece ? a->copy.reg_piece : a->size;

	for (uint64_t off = 0; off < a->size; off += piece) {
		uint64_t n = a->size - off < piece ? a->size - off : piece;
		int rc = be->ops->contents_queue(be, a->dev, op, (char *)a->copy.p + off,
						 a->va + off, n);

		if (rc < 0)
			return rc;
	}
	return 0;
}

/* Device -> @dst through the ring: one piece in flight while the threads drain the other. */
static int backup_ring_save(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			    char *dst, char *err)
{
	uint64_t off = 0, prev_n = 0;
	int rc = backup_ring(be, b, err), slot = 0;

	while (rc == 0 && (off < a->size || prev_n)) {
		uint64_t n = a->size - off < BACKUP_RING_PIECE ? a->size - off : BACKUP_RING_PIECE;

		if (n)
			rc = be->ops->contents_queue(be, a->dev, BACKEND_TO_HOST, b->ring[slot],
						     a->va + off, n);
		if (rc == 0 && prev_n)
			backup_par_copy(dst + off - prev_n, b->ring[!slot], prev_n);
		if (rc == 0)
			rc = be->ops->wait(be, a->dev);
		off += n;
		prev_n = n;
		slot = !slot;
	}
	return rc < 0 ? backend_fail_msg(err, rc, "copying an allocation to host") : 0;
}

/* @src -> device through the ring: the threads fill one piece while the other is in flight. */
static int backup_ring_restore(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			       const char *src, char *err)
{
	uint64_t off = 0;
	int rc = backup_ring(be, b, err), slot = 0;

	while (rc == 0 && off < a->size) {
		uint64_t n = a->size - off < BACKUP_RING_PIECE ? a->size - off : BACKUP_RING_PIECE;

		/* This piece's last copy (two back) was waited for before the one in flight. */
		backup_par_copy(b->ring[slot], src + off, n);
		rc = be->ops->wait(be, a->dev);
		if (rc == 0)
			rc = be->ops->contents_queue(be, a->dev, BACKEND_FROM_HOST, b->ring[slot],
						     a->va + off, n);
		off += n;
		slot = !slot;
	}
	if (rc == 0)
		rc = be->ops->wait(be, a->dev);
	return rc < 0 ? backend_fail_msg(err, rc, "copying an allocation from host") : 0;
}

static int backup_file_io(struct gmb__alloc *a, void *buf, uint64_t off, uint64_t n, bool wr,
			  char *err)
{
	uint64_t done = 0;

	while (done < n) {
		ssize_t r =
			wr ? pwrite(a->copy.fd, (char *)buf + done, n - done, (off_t)(off + done)) :
			     pread(a->copy.fd, (char *)buf + done, n - done, (off_t)(off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return err_fmt(err, r < 0 ? -errno : -EIO, "%s disk copy %s: %s",
				       wr ? "writing" : "reading", a->copy.path,
				       r < 0 ? strerror(errno) : "short file");
		done += (uint64_t)r;
	}
	return 0;
}

/* Device <-> file through the pinned disk buffer, piece by piece. */
static int backup_file_copy(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			    bool save, char *err)
{
	int rc = backup_disk_stage(be, b, err);

	for (uint64_t off = 0; rc == 0 && off < a->size;) {
		uint64_t n = a->size - off < b->disk_stage_size ? a->size - off :
								  b->disk_stage_size;

		if (!save)
			rc = backup_file_io(a, b->disk_stage, off, n, false, err);
		if (rc == 0) {
			rc = be->ops->contents_queue(be, a->dev,
						     save ? BACKEND_TO_HOST : BACKEND_FROM_HOST,
						     b->disk_stage, a->va + off, n);
			if (rc == 0)
				rc = be->ops->wait(be, a->dev);
			if (rc < 0)
				rc = backend_fail_msg(err, rc, "copying through the disk buffer");
		}
		if (rc == 0 && save)
			rc = backup_file_io(a, b->disk_stage, off, n, true, err);
		off += n;
	}
	return rc;
}

/**
 * gmb__backup_save() - @a's bytes to its prepared copy, unless it is
 * PINNED (cycle.c queues those with the others). Returns once they landed.
 */
int gmb__backup_save(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
		     char *err)
{
	if (a->copy.how == GMB__COPY_FILE)
		return backup_file_copy(be, b, a, true, err);
	if (a->copy.how == GMB__COPY_PAGEABLE)
		return backup_ring_save(be, b, a, a->copy.p, err);
	return 0;
}

/** gmb__backup_restore() - the copy back to the mapped @a (not PINNED; see save). */
int gmb__backup_restore(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			char *err)
{
	if (a->copy.how == GMB__COPY_FILE)
		return backup_file_copy(be, b, a, false, err);
	if (a->copy.how == GMB__COPY_PAGEABLE)
		return backup_ring_restore(be, b, a, a->copy.p, err);
	return 0;
}

/*
 * A copy made ahead, registered in pieces, as one registration: what the
 * application copies may span pieces. The pieces go first (the driver
 * refuses to register memory twice); if the whole cannot be registered
 * they come back, or, failing that too, the copy is plain pageable memory
 * (copied through the ring), and the error is returned either way.
 */
static int backup_register_whole(struct backend *be, struct gmb__alloc *a, char *err)
{
	struct gmb__hostcopy *h = &a->copy;
	int rc;

	gmb__prep_unregister(be, h->p, a->size, h->reg_piece);
	rc = gmb__prep_register(be, h->p, a->size, 0, err);
	if (rc == 0) {
		h->reg_piece = 0;
		return 0;
	}
	if (gmb__prep_register(be, h->p, a->size, h->reg_piece, NULL) < 0)
		*h = (struct gmb__hostcopy){ .how = GMB__COPY_PAGEABLE, .p = h->p, .fd = -1 };
	return rc;
}

/**
 * gmb__backup_pointer() - the address of @a's copy for gmb_host_copy(),
 * NULL for a file or none. A pageable PINNED copy is registered first, and
 * one made ahead registered as one range, so that it is CUDA host memory
 * the application copies to and from as it likes (until it is freed).
 */
int gmb__backup_pointer(struct backend *be, struct gmb__backup_bufs *b, struct gmb__alloc *a,
			void **p, char *err)
{
	struct gmb__hostcopy *h = &a->copy;
	int rc;

	*p = NULL;
	if (h->how != GMB__COPY_PINNED && h->how != GMB__COPY_PAGEABLE)
		return 0;
	if (h->registered && h->reg_piece && h->reg_piece < a->size) {
		rc = backup_register_whole(be, a, err);
		if (rc < 0)
			return rc;
	}
	if (h->how == GMB__COPY_PAGEABLE && a->backup == GMB_BACKUP_PINNED && !h->registered &&
	    be->ops->host_register) {
		rc = gmb__prep_register(be, h->p, a->size, 0, err);
		if (rc < 0)
			return rc;
		h->registered = true;
	}
	*p = h->p;
	return 0;
}
