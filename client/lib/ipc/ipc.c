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

static int ipc_export(struct gmb__mem *m, const struct gmb__alloc *a, uint64_t off, uint8_t *handle,
		      char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcExportRequest req = GMB__IPC_EXPORT_REQUEST__INIT;
	struct gmb__reply rep;
	const Gmb__Envelope *last;
	int rc;

	req.alloc_id = a->id;
	req.offset = off;
	env.body_case = GMB__ENVELOPE__BODY_IPC_EXPORT;
	env.ipc_export = &req;
	rc = gmb__request(m->conn, &env, &rep, err);
	if (rc == 0) {
		last = rep.nparts ? rep.parts[rep.nparts - 1] : NULL;
		if (!last || last->body_case != GMB__ENVELOPE__BODY_IPC_EXPORT_REPLY ||
		    last->ipc_export_reply->handle.len != IPC_HANDLE_SIZE)
			rc = err_fmt(err, -EPROTO, "gmbd's export reply lacks a %d-byte handle",
				     IPC_HANDLE_SIZE);
		else
			memcpy(handle, last->ipc_export_reply->handle.data, IPC_HANDLE_SIZE);
	}
	gmb__reply_deinit(&rep);
	return rc;
}

int gmb__ipc_get_handle(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr, uint8_t *handle,
			char *err)
{
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
		return ipc_export(m, a, p - a->va, handle, err);
	}
	im = ptr ? ipc_find_ptr(ipc, p) : NULL;
	if (!im)
		return err_fmt(err, -ENXIO, "pointer %p is not gmbd memory of this client", ptr);
	ipc_handle_of_import(im, p, handle);
	return 0;
}

/* Is @off the start of a chunk of @im (so that a handle may name it)? */
static bool ipc_is_range(const struct gmb__import *im, uint64_t off)
{
	return off < im->size && ipc_chunk_start(im, off) == off;
}

static struct gmb__import *ipc_find_handle(struct gmb__ipc *ipc, const struct ipc_handle *h)
{
	for (struct gmb__import *im = ipc->imports; im; im = im->next)
		if (im->instance == h->instance && im->owner == h->owner && im->alloc == h->alloc &&
		    im->gen == h->gen && memcmp(im->token, h->token, sizeof(h->token)) == 0)
			return im;
	return NULL;
}

static void ipc_send_close(struct gmb__mem *m, uint64_t export_id)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__IpcCloseRequest req = GMB__IPC_CLOSE_REQUEST__INIT;
	struct gmb__reply rep;

	req.export_id = export_id;
	env.body_case = GMB__ENVELOPE__BODY_IPC_CLOSE;
	env.ipc_close = &req;
	/* A lost connection dropped the import at gmbd already. */
	gmb__request(m->conn, &env, &rep, NULL);
	gmb__reply_deinit(&rep);
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

/* Reserve, map back to back, set access; on failure nothing is mapped. */
static int ipc_map(struct gmb__mem *m, struct gmb__import *im, int dev_index, char *err)
{
	struct backend *be = m->be;
	uint64_t off = 0, peers = 0;
	int rc;

	if (im->dev < 0 || im->dev >= m->devs->ndevices)
		return err_fmt(err, -EPROTO, "gmbd's open reply names device %d of %d", im->dev,
			       m->devs->ndevices);
	rc = be->ops->va_reserve(be, im->size, m->devs->granularity[im->dev], &im->va);
	if (rc < 0)
		return backend_fail_msg(err, rc, "reserving the import's address range");
	for (size_t i = 0; i < im->nchunks; i++) {
		rc = be->ops->map(be, im->va + off, im->chunks[i].size, im->chunks[i].handle);
		if (rc < 0) {
			rc = backend_fail_msg(err, rc, "mapping an imported chunk");
			goto err_unmap;
		}
		off += im->chunks[i].size;
	}
	if (dev_index >= 0 && dev_index != im->dev)
		peers = GMB__DEV_BIT(dev_index);
	rc = be->ops->set_access_peers(be, im->dev, peers, im->va, im->size);
	if (rc < 0) {
		rc = backend_fail_msg(err, rc, "setting access to the import");
		goto err_unmap;
	}
	return 0;

err_unmap:
	if (off)
		be->ops->unmap(be, im->va, off);
	be->ops->va_free(be, im->va, im->size);
	return rc;
}

/* Asks gmbd for @h's chunks and maps them into a new import. */
static int ipc_open_new(struct gmb__mem *m, struct gmb__ipc *ipc, const struct ipc_handle *h,
			const uint8_t *handle, int dev_index, struct gmb__import **out, char *err)
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
		rc = ipc_map(m, im, dev_index, err);
	}
	if (rc < 0) {
		/* gmbd counted the open: give it back, keep our reason. */
		ipc_send_close(m, h->gen);
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

int gmb__ipc_open(struct gmb__mem *m, struct gmb__ipc *ipc, const uint8_t *handle, int dev_index,
		  void **ptr, char *err)
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
	if (im) {
		if (!ipc_is_range(im, h.range_off))
			return err_fmt(err, -EINVAL, "range offset %" PRIu64 " starts no chunk",
				       h.range_off);
		im->opens++;
		*ptr = (void *)(im->va + h.range_off);
		return 0;
	}
	rc = gmb__mem_backend(m, err);
	if (rc < 0)
		return rc;
	rc = ipc_open_new(m, ipc, &h, handle, dev_index, &im, err);
	if (rc < 0)
		return rc;
	*ptr = (void *)(im->va + h.range_off);
	return 0;
}

/* Drain, unmap, free the range, tell gmbd, forget @im. */
static int ipc_unmap(struct gmb__mem *m, struct gmb__ipc *ipc, struct gmb__import *im, char *err)
{
	struct backend *be = m->be;
	int rc;

	/* The runtime's close waits for work on the memory, as a free does. */
	rc = be->ops->sync(be, im->dev);
	if (rc == 0)
		rc = be->ops->unmap(be, im->va, im->size);
	if (rc < 0)
		return backend_fail_msg(err, rc, "unmapping an import");
	be->ops->va_free(be, im->va, im->size);
	ipc_send_close(m, im->gen);
	ipc_unlink(m, ipc, im);
	ipc_import_free(m, im);
	return 0;
}

int gmb__ipc_close(struct gmb__mem *m, struct gmb__ipc *ipc, const void *ptr, char *err)
{
	struct gmb__import *im = ptr ? ipc_find_ptr(ipc, (uintptr_t)ptr) : NULL;
	int rc;

	if (!im)
		return err_fmt(err, -ENXIO, "pointer %p is in no import of this client", ptr);
	if (im->opens > 1) {
		im->opens--;
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
	}
	return n;
}
