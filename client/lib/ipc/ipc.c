/*
 * ipc.c - libgmb's side of memory shared between processes: export (a
 * handle from gmbd for an allocation of this client), open (map the chunks
 * of another process's allocation, fds from gmbd), close (unmap on the
 * last). See ipc.h for the rules.
 *
 * An open maps the whole allocation back to back from a range of its own
 * size and returns base + the handle's range offset (the offset of the
 * chunk the exporter's pointer was in); the caller adds its own offset, as
 * with the runtime. The handles of the open's chunk fds are imported by
 * the reader thread aside from the lend cache (mem.c stages them) and
 * belong to the import from then on.
 *
 * Invariants (between operations):
 *   - an import is mapped, with access set, exactly while opens > 0, and
 *     gmbd has one open of its export recorded for it;
 *   - no staged handle is left after an open returns.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/lib/ipc/ipc.h"

static struct gmb__import *ipc_find_ptr(struct gmb__ipc *ipc, uintptr_t p)
{
	for (struct gmb__import *im = ipc->imports; im; im = im->next)
		if (p >= im->va && p - im->va < im->size)
			return im;
	return NULL;
}

int gmb__ipc_owns(struct gmb__ipc *ipc, const void *ptr)
{
	return ptr && ipc_find_ptr(ipc, (uintptr_t)ptr) != NULL;
}

bool gmb__ipc_is_object(struct gmb__ipc *ipc, const void *ptr)
{
	const struct gmb__import *im = ptr ? ipc_find_ptr(ipc, (uintptr_t)ptr) : NULL;

	return im && im->object && !im->idle;
}

bool gmb__ipc_maybe_ours(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr)
{
	uintptr_t p = (uintptr_t)ptr;
	const struct gmb__alloc *a;
	bool found;
	void *v;

	if (!ptr)
		return false;
	pthread_mutex_lock(&m->conn->lock);
	found = ipc_find_ptr(ipc, p) != NULL;
	for (size_t it = 0; !found && idmap_next(&m->tab.by_id, &it, NULL, &v);) {
		a = v;
		found = p >= a->va && p - a->va < a->size;
	}
	pthread_mutex_unlock(&m->conn->lock);
	return found;
}

/* @im in or out of the list, under the state lock too (gmb__ipc_maybe_ours()). */
static void ipc_link(struct gmb__mem *m, struct gmb__ipc *ipc, struct gmb__import *im)
{
	pthread_mutex_lock(&m->conn->lock);
	im->next = ipc->imports;
	ipc->imports = im;
	pthread_mutex_unlock(&m->conn->lock);
}

static void ipc_unlink(struct gmb__mem *m, struct gmb__ipc *ipc, struct gmb__import *im)
{
	struct gmb__import **pos;

	pthread_mutex_lock(&m->conn->lock);
	for (pos = &ipc->imports; *pos && *pos != im; pos = &(*pos)->next)
		;
	if (*pos)
		*pos = im->next;
	pthread_mutex_unlock(&m->conn->lock);
}

/* The allocation of this client holding @p; op_lock held. */
static struct gmb__alloc *ipc_alloc_holding(struct gmb__mem *m, uintptr_t p)
{
	for (struct gmb__tag *t = m->tags; t; t = t->next)
		for (struct gmb__alloc *a = t->allocs; a; a = a->next)
			if (p >= a->va && p - a->va < a->size)
				return a;
	return NULL;
}

/* Offset of the chunk of @im holding byte @off; @off itself past the end. */
static uint64_t ipc_chunk_start(const struct gmb__import *im, uint64_t off)
{
	uint64_t at = 0;

	for (size_t i = 0; i < im->nchunks; i++) {
		if (off < at + im->chunks[i].size)
			return at;
		at += im->chunks[i].size;
	}
	return off;
}

/* An import's handle again, for the chunk holding @p (PyTorch never
 * re-exports what it imported; others may). */
static void ipc_handle_of_import(const struct gmb__import *im, uintptr_t p, uint8_t *out)
{
	struct ipc_handle h = {
		.instance = im->instance,
		.owner = im->owner,
		.alloc = im->alloc,
		.gen = im->gen,
		.range_off = ipc_chunk_start(im, p - im->va),
		.dev = (uint32_t)im->dev,
	};

	memcpy(h.token, im->token, sizeof(h.token));
	ipc_handle_encode(&h, out);
}

/*
 * Where a handle of @a for byte @off starts: the piece holding it in a pack
 * (the application's allocation, pack.c), else the chunk holding it, from
 * its last lend; -ENOENT unknown. Under op_lock (pieces).
 */
static int ipc_alloc_range(struct gmb__mem *m, const struct gmb__alloc *a, uint64_t off,
			   uint64_t *range_off)
{
	const struct gmb__piece *p = a->packed ? gmb__pack_piece_at(a, a->va + off) : NULL;
	uint64_t at = 0;
	int rc = -ENOENT;

	if (p) {
		*range_off = p->va - a->va;
		return 0;
	}
	pthread_mutex_lock(&m->conn->lock);
	for (uint32_t i = 0; a->chunk_sizes && i < a->nchunks; i++) {
		if (off < at + a->chunk_sizes[i]) {
			*range_off = at;
			rc = 0;
			break;
		}
		at += a->chunk_sizes[i];
	}
	pthread_mutex_unlock(&m->conn->lock);
	return rc;
}

/* @a's handle from what its first export told, for byte @off. */
static int ipc_handle_known(struct gmb__mem *m, const struct gmb__alloc *a, uint64_t off,
			    uint8_t *handle)
{
	struct ipc_handle h = { .instance = a->ipc_instance,
				.owner = m->conn->id,
				.alloc = a->id,
				.gen = a->ipc_gen,
				.dev = (uint32_t)a->dev };
	int rc = ipc_alloc_range(m, a, off, &h.range_off);

	if (rc < 0)
		return rc;
	memcpy(h.token, a->ipc_token, sizeof(h.token));
	ipc_handle_encode(&h, handle);
	return 0;
}

static int ipc_export(struct gmb__mem *m, struct gmb__alloc *a, uint64_t off, uint8_t *handle,
		      char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcExportRequest req = GMB__IPC_EXPORT_REQUEST__INIT;
	struct ipc_handle h;
	struct gmb__reply rep;
	const Gmb__Envelope *last;
	int rc;

	/* Known: the same bytes gmbd would send (its handles are deterministic). */
	if (a->ipc_known && ipc_handle_known(m, a, off, handle) == 0)
		return 0;
	req.alloc_id = a->id;
	req.offset = off;
	env.body_case = GMB__ENVELOPE__BODY_IPC_EXPORT;
	env.ipc_export = &req;
	rc = gmb__request(m->conn, &env, &rep, err);
	if (rc == 0) {
		last = rep.nparts ? rep.parts[rep.nparts - 1] : NULL;
		if (!last || last->body_case != GMB__ENVELOPE__BODY_IPC_EXPORT_REPLY ||
		    last->ipc_export_reply->handle.len != IPC_HANDLE_SIZE ||
		    ipc_handle_decode(last->ipc_export_reply->handle.data, &h) < 0 ||
		    h.alloc != a->id || h.owner != m->conn->id)
			rc = err_fmt(err, -EPROTO,
				     "gmbd's export reply lacks a %d-byte handle of"
				     " allocation %" PRIu64,
				     IPC_HANDLE_SIZE, a->id);
	}
	if (rc == 0) {
		memcpy(handle, last->ipc_export_reply->handle.data, IPC_HANDLE_SIZE);
		a->ipc_known = true;
		a->ipc_instance = h.instance;
		a->ipc_gen = h.gen;
		memcpy(a->ipc_token, h.token, sizeof(a->ipc_token));
		/* gmbd names the chunk; in a pack, the piece is what was shared. */
		if (a->packed)
			rc = ipc_handle_known(m, a, off, handle);
	}
	gmb__reply_deinit(&rep);
	return rc;
}

static int ipc_send_grant(struct gmb__mem *m, uint64_t alloc_id, uint32_t uid, bool revoke,
			  char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcGrantRequest req = GMB__IPC_GRANT_REQUEST__INIT;

	req.alloc_id = alloc_id;
	req.uid = uid;
	req.revoke = revoke;
	env.body_case = GMB__ENVELOPE__BODY_IPC_GRANT;
	env.ipc_grant = &req;
	return gmb__request_status(m->conn, &env, err);
}

/* $GMB_IPC_GRANT's uids, at the first share of @a (the owner's own uid needs none). */
static int ipc_env_grants(struct gmb__mem *m, struct gmb__alloc *a, char *err)
{
	int rc;

	if (a->ipc_granted)
		return 0;
	for (uint32_t i = 0; i < m->nipc_grants; i++) {
		if (m->ipc_grants[i] == (uint32_t)getuid())
			continue;
		rc = ipc_send_grant(m, a->id, m->ipc_grants[i], false, err);
		if (rc < 0)
			return rc;
	}
	a->ipc_granted = true;
	return 0;
}

int gmb__ipc_grant(struct gmb__mem *m, const void *ptr, uint32_t uid, bool revoke, char *err)
{
	struct gmb__alloc *a = ptr ? ipc_alloc_holding(m, (uintptr_t)ptr) : NULL;

	if (!a)
		return err_fmt(err, -ENXIO, "pointer %p is in no allocation of this client", ptr);
	return ipc_send_grant(m, a->id, uid, revoke, err);
}

int gmb__ipc_get_handle(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr, uint8_t *handle,
			char *err)
{
	int rc;

	uintptr_t p = (uintptr_t)ptr;
	struct gmb__import *im;
	struct gmb__alloc *a;

	if (!handle)
		return err_fmt(err, -EINVAL, "no place for the handle");
	a = ptr ? ipc_alloc_holding(m, p) : NULL;
	if (a) {
		if (!a->mapped)
			return err_fmt(err, -EBUSY,
				       "pointer %p is in paused tag \"%s\": resume it to share it",
				       ptr, a->tag->name);
		rc = ipc_export(m, a, p - a->va, handle, err);
		return rc < 0 ? rc : ipc_env_grants(m, a, err);
	}
	im = ptr ? ipc_find_ptr(ipc, p) : NULL;
	if (!im)
		return err_fmt(err, -ENXIO, "pointer %p is not gmbd memory of this client", ptr);
	ipc_handle_of_import(im, p, handle);
	return 0;
}

/* Is @off the start of a chunk of @im (so that a handle may name it)? */
/* A place a handle of @im may name: inside it, at a granularity multiple
 * (a chunk's start, or a piece's of a pack: gmbd checks the same). */
static bool ipc_is_range(const struct gmb__mem *m, const struct gmb__import *im, uint64_t off)
{
	uint64_t gran = m->devs->granularity[im->dev];

	return off < im->size && gran && off % gran == 0;
}

static struct gmb__import *ipc_find_handle(struct gmb__ipc *ipc, const struct ipc_handle *h)
{
	for (struct gmb__import *im = ipc->imports; im; im = im->next)
		if (im->instance == h->instance && im->owner == h->owner && im->alloc == h->alloc &&
		    im->gen == h->gen && memcmp(im->token, h->token, sizeof(h->token)) == 0)
			return im;
	return NULL;
}

/* One open of export @export_id fewer at gmbd; @keep: the last, the import
 * kept mapped (idle) for the next open. Callers that unmapped already
 * ignore a failure: a lost connection dropped the import at gmbd. */
static int ipc_send_close(struct gmb__mem *m, uint64_t export_id, bool keep, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcCloseRequest req = GMB__IPC_CLOSE_REQUEST__INIT;

	req.export_id = export_id;
	req.keep = keep;
	env.body_case = GMB__ENVELOPE__BODY_IPC_CLOSE;
	env.ipc_close = &req;
	return gmb__request_status(m->conn, &env, err);
}

/* The idle import of export @export_id is open again (nothing to map). */
static int ipc_send_reopen(struct gmb__mem *m, uint64_t export_id, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcOpenRequest req = GMB__IPC_OPEN_REQUEST__INIT;

	req.export_id = export_id;
	req.reopen = true;
	env.body_case = GMB__ENVELOPE__BODY_IPC_OPEN;
	env.ipc_open = &req;
	return gmb__request_status(m->conn, &env, err);
}

static void ipc_import_free(struct gmb__mem *m, struct gmb__import *im)
{
	for (size_t i = 0; i < im->nchunks; i++)
		m->be->ops->chunk_release(m->be, im->chunks[i].handle);
	free(im->chunks);
	free(im);
}

/* The last part of an open's reply, checked against what was staged. */
static int ipc_open_reply(const struct gmb__reply *rep, const struct ipc_handle *h,
			  const struct gmb__import *im, const Gmb__IpcOpenReply **out, char *err)
{
	const Gmb__Envelope *last = rep->nparts ? rep->parts[rep->nparts - 1] : NULL;
	const Gmb__IpcOpenReply *r;
	uint64_t sum = 0;

	if (!last || last->body_case != GMB__ENVELOPE__BODY_IPC_OPEN_REPLY)
		return err_fmt(err, -EPROTO, "gmbd's open reply lacks its last part");
	r = last->ipc_open_reply;
	for (size_t i = 0; i < im->nchunks; i++)
		sum += im->chunks[i].size;
	if (r->nchunks != im->nchunks || r->nchunks == 0 || sum != r->size ||
	    r->alloc_id != h->alloc || r->owner_id != h->owner || r->export_id != h->gen ||
	    r->range_offset != h->range_off)
		return err_fmt(err, -EPROTO,
			       "gmbd's open reply does not match its handle or its %zu chunks",
			       im->nchunks);
	*out = r;
	return 0;
}

/* Maps im->chunks back to back at im->va, sets access; on failure nothing is mapped. */
static int ipc_map_chunks(struct gmb__mem *m, struct gmb__import *im, char *err)
{
	struct backend *be = m->be;
	uint64_t off = 0, peers = 0;
	int rc;

	for (size_t i = 0; i < im->nchunks; i++) {
		if (off + im->chunks[i].size > im->size) {
			rc = err_fmt(err, -EPROTO,
				     "gmbd's chunks of an import exceed its %" PRIu64 " bytes",
				     im->size);
			goto err_unmap;
		}
		rc = be->ops->map(be, im->va + off, im->chunks[i].size, im->chunks[i].handle);
		if (rc < 0) {
			rc = backend_fail_msg(err, rc, "mapping an imported chunk");
			goto err_unmap;
		}
		off += im->chunks[i].size;
	}
	if (im->access_dev >= 0 && im->access_dev != im->dev)
		peers = GMB__DEV_BIT(im->access_dev);
	if (im->object)
		rc = be->ops->set_access_ro(be, im->dev, im->va, im->size);
	else
		rc = be->ops->set_access_peers(be, im->dev, peers, im->va, im->size);
	if (rc < 0) {
		rc = backend_fail_msg(err, rc, "setting access to the import");
		goto err_unmap;
	}
	im->mapped = true;
	return 0;

err_unmap:
	if (off)
		be->ops->unmap(be, im->va, off);
	return rc;
}

/* A range for @im: a spare one of its size and device, else a new one. */
static int ipc_range_get(struct gmb__mem *m, struct gmb__ipc *ipc, struct gmb__import *im)
{
	for (unsigned i = 0; i < ipc->nspare; i++) {
		if (ipc->spare[i].size == im->size && ipc->spare[i].dev == im->dev) {
			im->va = ipc->spare[i].va;
			ipc->spare[i] = ipc->spare[--ipc->nspare];
			return 0;
		}
	}
	return m->be->ops->va_reserve(m->be, im->size, m->devs->granularity[im->dev], &im->va);
}

/* @im's range (unmapped) kept for the next import, or freed when enough are kept. */
static void ipc_range_put(struct gmb__mem *m, struct gmb__ipc *ipc, const struct gmb__import *im)
{
	if (ipc->nspare < GMB__IPC_SPARES) {
		ipc->spare[ipc->nspare++] =
			(struct gmb__ipc_range){ .va = im->va, .size = im->size, .dev = im->dev };
		return;
	}
	m->be->ops->va_free(m->be, im->va, im->size);
}

/* Reserve (or take @how's range), map back to back, set access (read-only
 * for a named object's version, @read_only or @how's); on failure nothing
 * is mapped and @how's range is still the caller's. */
static int ipc_map(struct gmb__mem *m, struct gmb__ipc *ipc, struct gmb__import *im,
		   const struct gmb__ipc_how *how, bool read_only, char *err)
{
	int rc;

	if (im->dev < 0 || im->dev >= m->devs->ndevices)
		return err_fmt(err, -EPROTO, "gmbd's open reply names device %d of %d", im->dev,
			       m->devs->ndevices);
	if (how->at && how->at_size != im->size)
		return err_fmt(err, -EPROTO,
			       "gmbd opens %" PRIu64 " bytes for a %" PRIu64 "-byte range",
			       im->size, how->at_size);
	if (how->at)
		im->va = how->at;
	else if ((rc = ipc_range_get(m, ipc, im)) < 0)
		return backend_fail_msg(err, rc, "reserving the import's address range");
	/* gmbd says which memory is a version: read-only however it is opened. */
	im->object = how->object || read_only;
	im->access_dev = im->object ? -1 : how->dev_index;
	rc = ipc_map_chunks(m, im, err);
	if (rc < 0 && !how->at)
		ipc_range_put(m, ipc, im);
	return rc;
}

/* Asks gmbd for @h's chunks and maps them into a new import. */
static int ipc_open_new(struct gmb__mem *m, struct gmb__ipc *ipc, const struct ipc_handle *h,
			const uint8_t *handle, const struct gmb__ipc_how *how,
			struct gmb__import **out, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcOpenRequest req = GMB__IPC_OPEN_REQUEST__INIT;
	const Gmb__IpcOpenReply *r = NULL;
	struct gmb__import *im = calloc(1, sizeof(*im));
	struct gmb__reply rep;
	int rc;

	if (!im)
		return err_fmt(err, -ENOMEM, "out of memory opening a handle");
	gmb__mem_staged_clear(m);
	req.handle.data = (uint8_t *)handle;
	req.handle.len = IPC_HANDLE_SIZE;
	env.body_case = GMB__ENVELOPE__BODY_IPC_OPEN;
	env.ipc_open = &req;
	rc = gmb__request(m->conn, &env, &rep, err);
	gmb__mem_staged_take(m, &im->chunks, &im->nchunks);
	if (rep.status < 0)
		goto err_rep; /* gmbd recorded nothing */
	if (rc == 0)
		rc = ipc_open_reply(&rep, h, im, &r, err);
	if (rc == 0) {
		im->instance = h->instance;
		im->owner = h->owner;
		im->alloc = h->alloc;
		im->gen = h->gen;
		im->dev = (int)r->device;
		im->size = r->size;
		memcpy(im->token, h->token, sizeof(im->token));
		rc = ipc_map(m, ipc, im, how, r->read_only, err);
	}
	if (rc < 0) {
		/* gmbd counted the open: give it back, keep our reason. */
		ipc_send_close(m, h->gen, false, NULL);
		goto err_rep;
	}
	gmb__reply_deinit(&rep);
	im->opens = 1;
	ipc_link(m, ipc, im);
	*out = im;
	return 0;

err_rep:
	gmb__reply_deinit(&rep);
	ipc_import_free(m, im);
	return rc;
}

/* @im's handle (range offset 0), as gmbd made it. */
static void ipc_handle_base(const struct gmb__import *im, struct ipc_handle *h, uint8_t *out)
{
	*h = (struct ipc_handle){
		.instance = im->instance,
		.owner = im->owner,
		.alloc = im->alloc,
		.gen = im->gen,
		.dev = (uint32_t)im->dev,
	};
	memcpy(h->token, im->token, sizeof(h->token));
	ipc_handle_encode(h, out);
}

/* Fetches @im's chunks again (its owner resumed) and maps them at im->va. */
static int ipc_remap(struct gmb__mem *m, struct gmb__import *im, char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcOpenRequest req = GMB__IPC_OPEN_REQUEST__INIT;
	const Gmb__IpcOpenReply *r = NULL;
	uint8_t handle[IPC_HANDLE_SIZE];
	struct gmb__reply rep;
	struct ipc_handle h;
	int rc;

	ipc_handle_base(im, &h, handle);
	gmb__mem_staged_clear(m);
	req.handle.data = handle;
	req.handle.len = sizeof(handle);
	req.export_id = im->gen;
	env.body_case = GMB__ENVELOPE__BODY_IPC_OPEN;
	env.ipc_open = &req;
	rc = gmb__request(m->conn, &env, &rep, err);
	gmb__mem_staged_take(m, &im->chunks, &im->nchunks);
	if (rc == 0)
		rc = ipc_open_reply(&rep, &h, im, &r, err);
	if (rc == 0 && r->size != im->size)
		rc = err_fmt(err, -EPROTO,
			     "gmbd maps again %" PRIu64 " bytes of a %" PRIu64 "-byte import",
			     r->size, im->size);
	gmb__reply_deinit(&rep);
	if (rc == 0)
		rc = ipc_map_chunks(m, im, err);
	if (rc < 0) {
		/* Unmapped, as gmbd will see it at the next pause or close. */
		for (size_t i = 0; i < im->nchunks; i++)
			m->be->ops->chunk_release(m->be, im->chunks[i].handle);
		free(im->chunks);
		im->chunks = NULL;
		im->nchunks = 0;
	}
	return rc;
}

/* Drains the device and unmaps @im, keeping its range. */
static int ipc_unmap_keep(struct gmb__mem *m, struct gmb__import *im, char *err)
{
	struct backend *be = m->be;
	int rc;

	rc = be->ops->sync(be, im->dev);
	if (rc == 0)
		rc = be->ops->unmap(be, im->va, im->size);
	if (rc < 0)
		return backend_fail_msg(err, rc, "unmapping an import");
	for (size_t i = 0; i < im->nchunks; i++)
		be->ops->chunk_release(be, im->chunks[i].handle);
	free(im->chunks);
	im->chunks = NULL;
	im->nchunks = 0;
	im->mapped = false;
	return 0;
}

static int ipc_unmap(struct gmb__mem *m, struct gmb__ipc *ipc, struct gmb__import *im, char *err);

int gmb__ipc_follow(struct gmb__mem *m, struct gmb__ipc *ipc, uint64_t export_id, bool map,
		    bool drop, char *err)
{
	struct gmb__import *im;

	for (im = ipc->imports; im && im->gen != export_id; im = im->next)
		;
	if (!im)
		return err_fmt(err, -ENOENT, "no import of export %" PRIu64, export_id);
	/* Idle, it goes for good (its close tells gmbd before this answers). */
	if (im->idle && !map)
		return ipc_unmap(m, ipc, im, err);
	if (drop)
		return err_fmt(err, -EBUSY, "the import of export %" PRIu64 " is open again",
			       export_id);
	if (im->mapped == map)
		return 0;
	return map ? ipc_remap(m, im, err) : ipc_unmap_keep(m, im, err);
}

int gmb__ipc_open(struct gmb__mem *m, struct gmb__ipc *ipc, const uint8_t *handle, int dev_index,
		  void **ptr, char *err)
{
	const struct gmb__ipc_how how = { .dev_index = dev_index };

	return gmb__ipc_open_how(m, ipc, handle, &how, ptr, err);
}

int gmb__ipc_open_how(struct gmb__mem *m, struct gmb__ipc *ipc, const uint8_t *handle,
		      const struct gmb__ipc_how *how, void **ptr, char *err)
{
	struct gmb__import *im;
	struct ipc_handle h;
	int rc;

	if (!ptr || !handle)
		return err_fmt(err, -EINVAL, "no handle or no place for the pointer");
	if (!ipc_handle_is_gmb(handle))
		return err_fmt(err, -ENXIO, "not a gmbd handle");
	if (ipc_handle_decode(handle, &h) < 0)
		return err_fmt(err, -EINVAL, "a gmbd handle of another version, or damaged");
	im = ipc_find_handle(ipc, &h);
	/* Mapped once per process: an object's version read-only, at one address. */
	if (im && how->object && !im->object)
		return err_fmt(
			err, -EBUSY,
			"the version is open read-write here (gmb_ipc_open): close that first");
	if (im && how->at)
		return err_fmt(err, -EEXIST, "the handle is open here already, at %p",
			       (void *)im->va);
	/* Kept idle by its last close: gmbd knows it open again, nothing to map. */
	if (im && im->idle) {
		if (!ipc_is_range(m, im, h.range_off))
			return err_fmt(err, -EINVAL, "range offset %" PRIu64 " is no place in it",
				       h.range_off);
		rc = ipc_send_reopen(m, im->gen, err);
		if (rc < 0)
			return rc;
		im->idle = false;
		im->opens = 1;
		*ptr = (void *)(im->va + h.range_off);
		return 0;
	}
	if (im) {
		/* It followed its owner's pause: map it again first (EBUSY while paused). */
		if (!im->mapped && (rc = ipc_remap(m, im, err)) < 0)
			return rc;
		if (!ipc_is_range(m, im, h.range_off))
			return err_fmt(err, -EINVAL, "range offset %" PRIu64 " is no place in it",
				       h.range_off);
		im->opens++;
		*ptr = (void *)(im->va + h.range_off);
		return 0;
	}
	rc = gmb__mem_backend(m, err);
	if (rc < 0)
		return rc;
	rc = ipc_open_new(m, ipc, &h, handle, how, &im, err);
	if (rc < 0)
		return rc;
	*ptr = (void *)(im->va + h.range_off);
	return 0;
}

/* Drain, unmap, keep (or free) the range, tell gmbd, forget @im. */
static int ipc_unmap(struct gmb__mem *m, struct gmb__ipc *ipc, struct gmb__import *im, char *err)
{
	int rc;

	/* The runtime's close waits for work on the memory, as a free does. */
	if (im->mapped && (rc = ipc_unmap_keep(m, im, err)) < 0)
		return rc;
	ipc_range_put(m, ipc, im);
	ipc_send_close(m, im->gen, false, NULL);
	ipc_unlink(m, ipc, im);
	ipc_import_free(m, im);
	return 0;
}

int gmb__ipc_close(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr, char *err)
{
	struct gmb__import *im = ptr ? ipc_find_ptr(ipc, (uintptr_t)ptr) : NULL;
	int rc;

	if (!im || im->idle)
		return err_fmt(err, -ENXIO, "pointer %p is in no open import of this client", ptr);
	if (im->opens > 1) {
		im->opens--;
		return 0;
	}
	/* Kept for the next open of its handle: gmbd records it idle, still
	 * pinned. Not an object's version: that would pin one no longer the
	 * latest for as long as the process lives. */
	if (m->ipc_keep && im->mapped && !im->object &&
	    ipc_send_close(m, im->gen, true, NULL) == 0) {
		im->opens = 0;
		im->idle = true;
		return 0;
	}
	rc = ipc_unmap(m, ipc, im, err);
	return rc;
}

void gmb__ipc_close_all(struct gmb__mem *m, struct gmb__ipc *ipc)
{
	while (ipc->imports) {
		struct gmb__import *im = ipc->imports;

		/* Unmapped or not, the import goes: the process closes its handles. */
		if (ipc_unmap(m, ipc, im, NULL) < 0) {
			ipc_unlink(m, ipc, im);
			ipc_import_free(m, im);
		}
	}
	while (ipc->nspare > 0) {
		const struct gmb__ipc_range *r = &ipc->spare[--ipc->nspare];

		m->be->ops->va_free(m->be, r->va, r->size);
	}
}

size_t gmb__ipc_claim(void *arg, Gmb__RejoinImport *out, size_t cap)
{
	struct gmb__ipc *ipc = arg;
	size_t n = 0;

	for (const struct gmb__import *im = ipc->imports; im; im = im->next, n++) {
		if (n >= cap)
			continue;
		gmb__rejoin_import__init(&out[n]);
		out[n].export_id = im->gen;
		out[n].alloc_id = im->alloc;
		out[n].opens = 1;
		out[n].unmapped = !im->mapped;
		out[n].idle = im->idle;
	}
	return n;
}
