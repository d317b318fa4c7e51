/*
 * persist.c - the fd store glue of gmbd; see persist.h.
 *
 * The state memfd. A SIGKILL may land in the middle of a write, so a write
 * never touches the bytes the current record lives in:
 *
 *   offset 0, 64   two headers {magic, gen, off, len, crc of the payload,
 *                  crc of the header}; the valid one with the higher gen
 *                  names the record
 *   offset 4096..  payloads (packed Gmb__State)
 *
 * A new record is written where it does not overlap the current one (at
 * 4096 when it fits before it, else right after it), then the header slot
 * gen % 2 is written: one small pwrite within a page. A torn payload or
 * header fails its crc and the other header, whose payload is untouched,
 * still names the previous record. The file stays under 4096 + twice the
 * largest record.
 *
 * Modes: UNKNOWN (a manager may take fds: try at the first change), ON, OFF.
 * Once frozen (handover), neither the record nor the store changes again,
 * so tearing gmbd down does not tell the next one that clients left.
 */
#include "daemon/persist/persist.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/log.h"
#include "daemon/core/broker.h"

#define PERSIST_MAGIC	   "GMBDSTA1"
#define PERSIST_HDR_SLOT   64
#define PERSIST_DATA_OFF   4096
#define PERSIST_MAX_RECORD (256u << 20)

enum persist_mode {
	PERSIST_UNKNOWN,
	PERSIST_ON,
	PERSIST_OFF
};

struct persist_hdr {
	char magic[8];
	uint64_t gen;
	uint64_t off;
	uint64_t len;
	uint32_t crc;
	uint32_t hcrc; /* of the bytes before it */
};

struct persist {
	struct backend *be;
	struct broker *br; /* what the record describes; not owned */
	struct pool_hooks hooks;
	struct object_hooks ohooks; /* named objects' host copies */
	unsigned opt_max;	    /* --fdstore-max */
	unsigned fdstore_max;	    /* kept to: the lower of opt_max and the unit's */
	bool unit_lower;	    /* the unit's FileDescriptorStoreMax= is the lower */
	unsigned nstored;	    /* chunk and copy fds in the store */
	unsigned failures;	    /* failed writes of the record since the last stored */
	enum persist_mode mode;
	bool dirty, frozen;
	int fd;			/* the state memfd; -1 until attached */
	struct persist_hdr cur; /* the record in force (len 0: none) */
};

static void persist_check_limit(struct persist *p);
static int persist_on_created(void *arg, const struct chunk *c);
static void persist_on_destroyed(void *arg, const struct chunk *c);
static int persist_on_copy_made(void *arg, uint64_t export_id, uint64_t size, int fd);
static void persist_on_copy_gone(void *arg, uint64_t export_id, uint64_t size);

/* ---- crc32 (IEEE), enough for a record of a few hundred KiB ---- */

static uint32_t persist_crc32(const void *buf, size_t len)
{
	static uint32_t table[256];
	const uint8_t *p = buf;
	uint32_t crc = 0xffffffffu;

	if (!table[1]) {
		for (uint32_t i = 0; i < 256; i++) {
			uint32_t c = i;

			for (int k = 0; k < 8; k++)
				c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
			table[i] = c;
		}
	}
	while (len--)
		crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc ^ 0xffffffffu;
}

/* ---- life ---- */

int persist_new(struct backend *be, unsigned fdstore_max, struct persist **out)
{
	struct persist *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->be = be;
	p->fd = -1;
	p->opt_max = p->fdstore_max = fdstore_max;
	p->mode = fdstore_max >= 2 && sd_glue_has_manager() ? PERSIST_UNKNOWN : PERSIST_OFF;
	p->hooks = (struct pool_hooks){ .created = persist_on_created,
					.destroyed = persist_on_destroyed,
					.arg = p };
	p->ohooks = (struct object_hooks){ .copy_made = persist_on_copy_made,
					   .copy_gone = persist_on_copy_gone,
					   .arg = p };
	if (p->mode == PERSIST_UNKNOWN)
		persist_check_limit(p);
	*out = p;
	return 0;
}

/*
 * The unit's FileDescriptorStoreMax=, learnt once at start. systemd closes
 * an fd stored past it with a line in its own journal and not a word to
 * gmbd, so a chunk past it would be lent and then lost at the next
 * restart: gmbd keeps to the lower of the two numbers, and says so loudly
 * when the unit's is the lower, since a client then meets ENOSPC sooner
 * than --fdstore-max promises.
 */
static void persist_check_limit(struct persist *p)
{
	const char *how = "";
	unsigned unit = 0;

	if (sd_glue_fdstore_limit(&unit, &how) < 0) {
		log_notice("cannot check the unit's FileDescriptorStoreMax=, so gmbd trusts"
			   " --fdstore-max to equal it (chunks past a lower one would be lost"
			   " at a restart) fdstore_max=%u reason=\"%s\"",
			   p->opt_max, how);
		return;
	}
	if (unit >= p->opt_max) {
		log_info(
			"fd store limit checked fdstore_max=%u FileDescriptorStoreMax=%u source=%s",
			p->opt_max, unit, how);
		return;
	}
	if (unit < 2) {
		log_warn("the unit's FileDescriptorStoreMax= has no room for the state and a chunk,"
			 " so the fd store is not used and a restart of gmbd loses the clients'"
			 " memory: set FileDescriptorStoreMax=%u in the unit (systemctl edit gmbd),"
			 " or fdstore-max = 0 in gmbd.conf to mean it FileDescriptorStoreMax=%u"
			 " fdstore_max=%u source=%s",
			 p->opt_max, unit, p->opt_max, how);
		p->mode = PERSIST_OFF;
		return;
	}
	log_warn("the unit's FileDescriptorStoreMax= is lower than --fdstore-max: gmbd keeps"
		 " the state and at most %u chunks and refuses requests that need more"
		 " (ENOSPC); set both to the same number (systemctl edit gmbd: [Service]"
		 " FileDescriptorStoreMax=%u, or fdstore-max = %u in gmbd.conf)"
		 " FileDescriptorStoreMax=%u fdstore_max=%u source=%s",
		 unit - 1, p->opt_max, unit, unit, p->opt_max, how);
	p->fdstore_max = unit;
	p->unit_lower = true;
}

void persist_free(struct persist *p)
{
	if (!p)
		return;
	if (p->fd >= 0)
		close(p->fd);
	free(p);
}

const struct pool_hooks *persist_hooks(struct persist *p)
{
	return &p->hooks;
}

const struct object_hooks *persist_object_hooks(struct persist *p)
{
	return &p->ohooks;
}

/* Stores a new state memfd; decides the mode once. */
static void persist_attach(struct persist *p)
{
	int fd, r;

	if (p->mode != PERSIST_UNKNOWN)
		return;
	p->mode = PERSIST_OFF;
	fd = memfd_create("gmbd-state", MFD_CLOEXEC);
	if (fd < 0) {
		log_errno(LOG_LVL_WARNING, -errno, "cannot create the state memfd, no fd store");
		return;
	}
	r = sd_glue_fdstore(fd, "state");
	if (r <= 0) {
		close(fd);
		log_notice("no fd store: the service manager does not take fds, so a restart of"
			   " gmbd loses the clients' memory err=\"%s\"",
			   r < 0 ? strerror(-r) : "no NOTIFY_SOCKET");
		return;
	}
	p->fd = fd;
	p->mode = PERSIST_ON;
	p->dirty = true;
	log_info("fd store in use: a restart of gmbd keeps every chunk and client"
		 " fdstore_max=%u",
		 p->fdstore_max);
}

bool persist_active(struct persist *p)
{
	persist_attach(p);
	return p->mode == PERSIST_ON;
}

/* ---- chunk fds ---- */

/* The one spelling of a chunk's FDNAME: chunk.<id>.<dev>.<size>
 * (persist_parse_chunk() reads it back). */
static void persist_chunk_name(uint64_t id, int dev, uint64_t size, char *buf, size_t len)
{
	snprintf(buf, len, "chunk.%" PRIu64 ".%d.%" PRIu64, id, dev, size);
}

static int persist_on_created(void *arg, const struct chunk *c)
{
	struct persist *p = arg;
	char name[SD_FDNAME_MAX];
	int fd, r;

	if (!persist_active(p) || p->frozen)
		return 0;
	if (p->nstored + 1 >= p->fdstore_max && p->unit_lower)
		return backend_fail(
			-ENOSPC,
			"the fd store holds %u chunks and the state, the unit's limit"
			" (FileDescriptorStoreMax=%u, lower than --fdstore-max %u): raise"
			" it, or use fewer, larger chunks",
			p->nstored, p->fdstore_max, p->opt_max);
	if (p->nstored + 1 >= p->fdstore_max)
		return backend_fail(-ENOSPC,
				    "the fd store holds %u chunks and the state, its limit"
				    " (--fdstore-max %u = FileDescriptorStoreMax=): raise both, or"
				    " use fewer, larger chunks",
				    p->nstored, p->fdstore_max);
	r = p->be->ops->chunk_export(p->be, c->handle, &fd);
	if (r < 0)
		return r;
	persist_chunk_name(c->id, c->dev, c->size, name, sizeof(name));
	r = sd_glue_fdstore(fd, name);
	close(fd);
	if (r <= 0)
		return backend_fail(r < 0 ? r : -EIO,
				    "cannot keep chunk %" PRIu64 " in the fd"
				    " store: %s",
				    c->id, r < 0 ? strerror(-r) : "no manager");
	p->nstored++;
	return 0;
}

static void persist_on_destroyed(void *arg, const struct chunk *c)
{
	struct persist *p = arg;
	char name[SD_FDNAME_MAX];

	if (p->mode != PERSIST_ON || p->frozen)
		return;
	persist_chunk_name(c->id, c->dev, c->size, name, sizeof(name));
	if (sd_glue_fdstore_remove(name) < 0)
		log_warn("cannot remove a chunk from the fd store chunk=%" PRIu64, c->id);
	if (p->nstored)
		p->nstored--;
}

/* ---- named objects' host copies ---- */

/* The one spelling of a copy's FDNAME: objcopy.<export id>.<size>. */
static void persist_copy_name(uint64_t export_id, uint64_t size, char *buf, size_t len)
{
	snprintf(buf, len, "objcopy.%" PRIu64 ".%" PRIu64, export_id, size);
}

static int persist_on_copy_made(void *arg, uint64_t export_id, uint64_t size, int fd)
{
	struct persist *p = arg;
	char name[SD_FDNAME_MAX];
	int r;

	if (!persist_active(p) || p->frozen)
		return 0;
	if (p->nstored + 1 >= p->fdstore_max)
		return backend_fail(-ENOSPC,
				    "the fd store holds %u fds and the state, its limit"
				    " (--fdstore-max %u, FileDescriptorStoreMax=%u)",
				    p->nstored, p->opt_max, p->fdstore_max);
	persist_copy_name(export_id, size, name, sizeof(name));
	r = sd_glue_fdstore(fd, name);
	if (r <= 0)
		return backend_fail(r < 0 ? r : -EIO, "cannot keep a host copy in the fd store: %s",
				    r < 0 ? strerror(-r) : "no manager");
	p->nstored++;
	return 0;
}

static void persist_on_copy_gone(void *arg, uint64_t export_id, uint64_t size)
{
	struct persist *p = arg;
	char name[SD_FDNAME_MAX];

	if (p->mode != PERSIST_ON || p->frozen)
		return;
	persist_copy_name(export_id, size, name, sizeof(name));
	if (sd_glue_fdstore_remove(name) < 0)
		log_warn("cannot remove a host copy from the fd store export=%" PRIu64, export_id);
	if (p->nstored)
		p->nstored--;
}

/* ---- the record ---- */

static int persist_pwrite(int fd, const void *buf, size_t len, uint64_t off)
{
	const char *b = buf;

	while (len) {
		ssize_t n = pwrite(fd, b, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		b += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/* Where a record of @len goes without touching the current one. */
static uint64_t persist_place(const struct persist *p, uint64_t len)
{
	uint64_t end = p->cur.off + p->cur.len;

	if (p->cur.len == 0 || PERSIST_DATA_OFF + len <= p->cur.off)
		return PERSIST_DATA_OFF;
	return (end + 4095) / 4096 * 4096;
}

static int persist_write(struct persist *p, const uint8_t *buf, size_t len)
{
	struct persist_hdr h = { .magic = PERSIST_MAGIC };
	int r;

	h.gen = p->cur.gen + 1;
	h.off = persist_place(p, len);
	h.len = len;
	h.crc = persist_crc32(buf, len);
	h.hcrc = persist_crc32(&h, offsetof(struct persist_hdr, hcrc));
	r = persist_pwrite(p->fd, buf, len, h.off);
	if (r == 0)
		r = persist_pwrite(p->fd, &h, sizeof(h), (h.gen % 2) * PERSIST_HDR_SLOT);
	if (r == 0)
		p->cur = h;
	return r;
}

/* Which limit a failed write of the record most likely met, for people. */
static const char *persist_write_why(int r)
{
	switch (r) {
	case -E2BIG:
		return "the record is larger than the next gmbd would read";
	case -EFBIG:
		return "the state memfd may not grow: the file size limit (LimitFSIZE=) is below it";
	case -ENOMEM:
	case -ENOSPC:
		return "no memory for the state memfd (the unit's MemoryMax=, or the machine's)";
	default:
		return "the write into the state memfd failed";
	}
}

/* Said once at error level, then at debug per try until one succeeds. */
static void persist_write_failed(struct persist *p, int r)
{
	if (p->failures++ == 0)
		log_err("cannot store the state record in the fd store: replies wait until it is"
			" stored (tried again, said once) err=\"%s\" reason=\"%s\"",
			strerror(-r), persist_write_why(r));
	else
		log_debug("still cannot store the state record attempts=%u err=\"%s\"", p->failures,
			  strerror(-r));
}

int persist_flush(void *arg)
{
	struct persist *p = arg;
	uint8_t *buf = NULL;
	size_t len = 0;
	int r;

	if (p->mode != PERSIST_ON || !p->dirty || !p->br)
		return 0;
	/* A change after the handover record: the next gmbd will not know it. */
	if (p->frozen)
		return -ESTALE;
	r = state_encode(p->br, &buf, &len);
	if (r == 0 && len > PERSIST_MAX_RECORD)
		r = -E2BIG;
	if (r == 0)
		r = persist_write(p, buf, len);
	free(buf);
	if (r < 0) {
		/* dirty stays set: the next call tries again. */
		persist_write_failed(p, r);
		return r;
	}
	if (p->failures)
		log_notice("state record stored again, the replies held for it leave now"
			   " attempts=%u",
			   p->failures + 1);
	p->failures = 0;
	p->dirty = false;
	return 0;
}

bool persist_failing(const struct persist *p)
{
	return p->failures > 0;
}

bool persist_enabled(const struct persist *p)
{
	return p->mode != PERSIST_OFF;
}

void persist_changed(struct persist *p)
{
	persist_attach(p);
	if (p->mode == PERSIST_ON)
		p->dirty = true;
}

bool persist_handover(struct persist *p)
{
	if (!persist_active(p))
		return false;
	p->dirty = true;
	/* Failed, the record stored last stands: the replies held since were
	 * never sent, so the next gmbd still knows all that clients were told. */
	if (persist_flush(p) < 0)
		log_warn("handing over the state record stored last, not this gmbd's latest:"
			 " its unsent replies are dropped");
	p->frozen = true;
	log_info("state kept in the fd store for the next gmbd chunks=%u record_bytes=%" PRIu64,
		 p->nstored, p->cur.len);
	return true;
}

void persist_freeze(struct persist *p)
{
	if (p)
		p->frozen = true;
}

/* ---- restore ---- */

static bool persist_hdr_valid(int fd, const struct persist_hdr *h)
{
	uint8_t *buf;
	bool ok;

	if (memcmp(h->magic, PERSIST_MAGIC, 8) != 0 || h->len > PERSIST_MAX_RECORD ||
	    h->hcrc != persist_crc32(h, offsetof(struct persist_hdr, hcrc)))
		return false;
	buf = malloc(h->len ? h->len : 1);
	if (!buf)
		return false;
	ok = pread(fd, buf, h->len, (off_t)h->off) == (ssize_t)h->len &&
	     persist_crc32(buf, h->len) == h->crc;
	free(buf);
	return ok;
}

/* The record in force in @fd, into p->cur (len 0: none). */
static void persist_read_hdr(struct persist *p, int fd)
{
	struct persist_hdr h[2];

	memset(&p->cur, 0, sizeof(p->cur));
	for (int i = 0; i < 2; i++) {
		if (pread(fd, &h[i], sizeof(h[i]), i * PERSIST_HDR_SLOT) != sizeof(h[i]) ||
		    !persist_hdr_valid(fd, &h[i]))
			continue;
		if (h[i].gen > p->cur.gen)
			p->cur = h[i];
	}
}

/* chunk.<id>.<dev>.<size> */
static bool persist_parse_chunk(const char *name, struct state_fd *f)
{
	unsigned long long id, size;
	int dev, end = 0;

	if (sscanf(name, "chunk.%llu.%d.%llu%n", &id, &dev, &size, &end) == 3 && !name[end]) {
		f->id = id;
		f->dev = dev;
		f->size = size;
		return true;
	}
	/* A named object's host copy: id is its version's export. */
	end = 0;
	if (sscanf(name, "objcopy.%llu.%llu%n", &id, &size, &end) == 2 && !name[end]) {
		f->id = id;
		f->dev = -1;
		f->size = size;
		f->copy = true;
		return true;
	}
	return false;
}

/* Sorts the handed-back fds: the state memfd, chunk fds, the rest (closed). */
static void persist_sort_fds(struct sd_named_fd *named, size_t n, struct state_fd *chunks,
			     size_t *nchunks, int *state_fd)
{
	*nchunks = 0;
	*state_fd = -1;
	for (size_t i = 0; i < n; i++) {
		struct state_fd f = { .fd = named[i].fd };

		if (strcmp(named[i].name, "state") == 0 && *state_fd < 0) {
			*state_fd = named[i].fd;
		} else if (persist_parse_chunk(named[i].name, &f)) {
			chunks[(*nchunks)++] = f;
		} else {
			log_warn("dropping an unknown fd the service manager passed name=%s",
				 named[i].name);
			if (sd_glue_has_manager())
				sd_glue_fdstore_remove(named[i].name);
			close(named[i].fd);
		}
		named[i].fd = -1;
	}
}

/* Restores from the record in @p->fd, if there is one. */
static void persist_load(struct persist *p, struct broker *br, struct state_fd *chunks, size_t n,
			 struct state_stats *out)
{
	uint8_t *buf;

	persist_read_hdr(p, p->fd);
	if (p->cur.len == 0) {
		if (n)
			log_warn("the fd store holds chunks but no readable state, releasing them"
				 " chunks=%zu",
				 n);
		return;
	}
	buf = malloc(p->cur.len);
	if (!buf || pread(p->fd, buf, p->cur.len, (off_t)p->cur.off) != (ssize_t)p->cur.len) {
		log_err("cannot read the recorded state bytes=%" PRIu64, p->cur.len);
		free(buf);
		return;
	}
	if (state_restore(br, buf, p->cur.len, chunks, n, out) < 0)
		log_err("starting without the previous gmbd's clients: its state cannot be"
			" restored");
	free(buf);
}

/* Every chunk fd is closed; those no chunk came back from leave the store. */
static void persist_settle_fds(struct persist *p, struct state_fd *chunks, size_t n)
{
	char name[SD_FDNAME_MAX];

	for (size_t i = 0; i < n; i++) {
		if (chunks[i].used) {
			p->nstored++;
		} else {
			if (chunks[i].copy)
				persist_copy_name(chunks[i].id, chunks[i].size, name, sizeof(name));
			else
				persist_chunk_name(chunks[i].id, chunks[i].dev, chunks[i].size,
						   name, sizeof(name));
			sd_glue_fdstore_remove(name);
		}
		close(chunks[i].fd);
	}
}

int persist_restore(struct persist *p, struct broker *br, struct sd_named_fd *named, size_t n,
		    struct state_stats *out)
{
	struct state_fd *chunks = calloc(n + 1, sizeof(*chunks));
	size_t nchunks;
	int state_fd;

	*out = (struct state_stats){ 0 };
	p->br = br;
	if (!chunks)
		return -ENOMEM;
	persist_sort_fds(named, n, chunks, &nchunks, &state_fd);
	if (state_fd >= 0 && p->mode != PERSIST_OFF) {
		p->fd = state_fd;
		p->mode = PERSIST_ON;
		p->dirty = true;
		persist_load(p, br, chunks, nchunks, out);
	} else if (state_fd >= 0) {
		log_notice("fd store turned off: dropping the previous gmbd's state");
		sd_glue_fdstore_remove("state");
		close(state_fd);
	}
	persist_settle_fds(p, chunks, nchunks);
	free(chunks);
	return 0;
}
