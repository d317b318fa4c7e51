/*
 * state.c - the broker's record for the next gmbd: every chunk (id, device,
 * size, owning uid), every client with its tags and allocations (each
 * allocation's last lend by chunk id), and the import table (CUDA IPC: its
 * instance id, every export with its pinned chunks and who imported it), as
 * a Gmb__State (proto/gmb.proto).
 *
 * state_encode() reads the broker only. state_restore() rebuilds a fresh
 * broker from a record and the chunk fds the service manager handed back:
 * each fd is imported through the backend (host: the memfd itself; cuda: a
 * new handle to the same physical memory), so no memory is created. Tools
 * hold nothing and are not recorded; pending drops are not either: holders
 * are rebuilt from last lends, and the keep limit marks what it must again.
 * Exports come back after the clients (they name the restored allocations,
 * chunks and importers) and before the keep limit is applied, so that no
 * pinned chunk is ever free; a record without them (an older gmbd's)
 * restores as before, with a table made at the first export.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/ipc_handle.h"
#include "daemon/core/broker.h"
#include "daemon/core/import.h"
#include "daemon/core/import_restore.h"
#include "daemon/core/object.h"
#include "daemon/core/rejoin.h"
#include "daemon/core/walk.h"
#include "daemon/persist/state.h"

#define STATE_VERSION 1

/* Everything one encoded Gmb__State points to, owned here. */
struct state_enc {
	Gmb__State st;
	Gmb__StateChunk *chunks, **pchunks;
	Gmb__StateClient *clients, **pclients;
	Gmb__StateTag *tags, **ptags;
	Gmb__StateAlloc *allocs, **pallocs;
	Gmb__StateExport *exports, **pexports;
	Gmb__StateImport *imports, **pimports;
	Gmb__StateObject *objects, **pobjects;
	Gmb__StateObjectVersion *versions, **pversions;
	uint64_t *ids; /* allocations' last lends, then exports' pinned chunks */
	uint32_t *groups;
	size_t ntags, nallocs, nimports, nids, ngroups, nversions; /* entries filled */
};

struct state_count {
	size_t clients, tags, allocs, exports, imports, ids, groups, objects, versions;
};

static int state_count_client(void *arg, const struct bclient *c)
{
	struct state_count *n = arg;

	n->clients++;
	n->groups += (size_t)c->ngroups;
	return 0;
}

static int state_count_tag(void *arg, const struct btag *t)
{
	(void)t;
	((struct state_count *)arg)->tags++;
	return 0;
}

static int state_count_alloc(void *arg, const struct balloc *a)
{
	struct state_count *n = arg;

	n->allocs++;
	n->ids += a->nchunks;
	return 0;
}

static int state_count_export(void *arg, const struct import_export *ex)
{
	struct state_count *n = arg;

	n->exports++;
	n->ids += ex->nchunks;
	n->imports += ex->nimports;
	return 0;
}

static int state_count_object(void *arg, const struct bobject *obj)
{
	struct state_count *n = arg;

	n->objects++;
	n->versions += obj->nversions;
	return 0;
}

static void state_count(const struct broker *br, struct state_count *n)
{
	static const struct walk_ops ops = { .client = state_count_client,
					     .tag = state_count_tag,
					     .alloc = state_count_alloc };

	*n = (struct state_count){ 0 };
	walk_tree(br, &ops, n);
	import_record_walk(br, state_count_export, NULL, n);
	object_walk(br, state_count_object, n);
}

static void state_enc_free(struct state_enc *e)
{
	free(e->chunks);
	free(e->pchunks);
	free(e->clients);
	free(e->pclients);
	free(e->tags);
	free(e->ptags);
	free(e->allocs);
	free(e->pallocs);
	free(e->exports);
	free(e->pexports);
	free(e->imports);
	free(e->pimports);
	free(e->objects);
	free(e->pobjects);
	free(e->versions);
	free(e->pversions);
	free(e->ids);
	free(e->groups);
}

static int state_enc_alloc(struct state_enc *e, size_t nchunks, const struct state_count *n)
{
	e->chunks = calloc(nchunks + 1, sizeof(*e->chunks));
	e->pchunks = calloc(nchunks + 1, sizeof(*e->pchunks));
	e->clients = calloc(n->clients + 1, sizeof(*e->clients));
	e->pclients = calloc(n->clients + 1, sizeof(*e->pclients));
	e->tags = calloc(n->tags + 1, sizeof(*e->tags));
	e->ptags = calloc(n->tags + 1, sizeof(*e->ptags));
	e->allocs = calloc(n->allocs + 1, sizeof(*e->allocs));
	e->pallocs = calloc(n->allocs + 1, sizeof(*e->pallocs));
	e->exports = calloc(n->exports + 1, sizeof(*e->exports));
	e->pexports = calloc(n->exports + 1, sizeof(*e->pexports));
	e->imports = calloc(n->imports + 1, sizeof(*e->imports));
	e->pimports = calloc(n->imports + 1, sizeof(*e->pimports));
	e->objects = calloc(n->objects + 1, sizeof(*e->objects));
	e->pobjects = calloc(n->objects + 1, sizeof(*e->pobjects));
	e->versions = calloc(n->versions + 1, sizeof(*e->versions));
	e->pversions = calloc(n->versions + 1, sizeof(*e->pversions));
	e->ids = calloc(n->ids + 1, sizeof(*e->ids));
	e->groups = calloc(n->groups + 1, sizeof(*e->groups));
	if (!e->chunks || !e->pchunks || !e->clients || !e->pclients || !e->tags || !e->ptags ||
	    !e->allocs || !e->pallocs || !e->exports || !e->pexports || !e->imports ||
	    !e->pimports || !e->objects || !e->pobjects || !e->versions || !e->pversions ||
	    !e->ids || !e->groups)
		return -ENOMEM;
	return 0;
}

static int state_enc_chunk(void *arg, const struct chunk *ch)
{
	struct state_enc *e = arg;
	Gmb__StateChunk *sc = &e->chunks[e->st.n_chunks];

	gmb__state_chunk__init(sc);
	sc->id = ch->id;
	sc->device = (uint32_t)ch->dev;
	sc->size = ch->size;
	sc->uid = (uint32_t)ch->uid;
	sc->uid_set = ch->uid_set;
	sc->shared_out = ch->shared_out;
	e->pchunks[e->st.n_chunks++] = sc;
	return 0;
}

static void state_enc_chunks(const struct broker *br, struct state_enc *e)
{
	e->st.n_chunks = 0;
	e->st.chunks = e->pchunks;
	walk_chunks(br, state_enc_chunk, e);
}

/*
 * The walk fills the arrays in order: a client's tags, a tag's allocations
 * and an allocation's chunk ids each take the next entries, so the one
 * being filled is always the last one begun.
 */
static int state_enc_client(void *arg, const struct bclient *c)
{
	struct state_enc *e = arg;
	Gmb__StateClient *sc = &e->clients[e->st.n_clients];

	gmb__state_client__init(sc);
	sc->id = c->id;
	sc->name = (char *)c->name;
	sc->pid = (int32_t)c->pid;
	sc->uid = (uint32_t)c->uid;
	sc->gid = (uint32_t)c->gid;
	sc->control = c->control;
	sc->start_time = c->start_time;
	sc->groups = &e->groups[e->ngroups];
	sc->n_groups = (size_t)c->ngroups;
	for (int i = 0; i < c->ngroups; i++)
		e->groups[e->ngroups++] = (uint32_t)c->groups[i];
	sc->tags = &e->ptags[e->ntags];
	e->pclients[e->st.n_clients++] = sc;
	return 0;
}

static int state_enc_tag(void *arg, const struct btag *t)
{
	struct state_enc *e = arg;
	Gmb__StateTag *st = &e->tags[e->ntags];

	gmb__state_tag__init(st);
	st->name = (char *)t->name;
	st->mode = (Gmb__Mode)t->mode;
	st->paused = t->paused;
	st->allocs = &e->pallocs[e->nallocs];
	e->ptags[e->ntags++] = st;
	e->pclients[e->st.n_clients - 1]->n_tags++;
	return 0;
}

static int state_enc_alloc_one(void *arg, const struct balloc *a)
{
	struct state_enc *e = arg;
	Gmb__StateAlloc *sa = &e->allocs[e->nallocs];

	gmb__state_alloc__init(sa);
	sa->id = a->id;
	sa->device = (uint32_t)a->dev;
	sa->size = a->size;
	sa->active = a->active;
	sa->chunk_ids = &e->ids[e->nids];
	e->pallocs[e->nallocs++] = sa;
	e->ptags[e->ntags - 1]->n_allocs++;
	return 0;
}

static int state_enc_chunk_id(void *arg, const struct balloc *a, uint32_t i, const struct chunk *ch)
{
	struct state_enc *e = arg;

	(void)a;
	(void)i;
	e->ids[e->nids++] = ch ? ch->id : 0;
	e->pallocs[e->nallocs - 1]->n_chunk_ids++;
	return 0;
}

static void state_enc_clients(const struct broker *br, struct state_enc *e)
{
	static const struct walk_ops ops = { .client = state_enc_client,
					     .tag = state_enc_tag,
					     .alloc = state_enc_alloc_one,
					     .chunk = state_enc_chunk_id };

	e->st.n_clients = 0;
	e->st.clients = e->pclients;
	walk_tree(br, &ops, e);
}

_Static_assert(sizeof(uid_t) == sizeof(uint32_t), "grants go in the record as uint32 uids");

/* An export, its pinned chunks' ids and, through state_enc_import(), its records. */
static int state_enc_export(void *arg, const struct import_export *ex)
{
	struct state_enc *e = arg;
	Gmb__StateExport *se = &e->exports[e->st.n_exports];

	gmb__state_export__init(se);
	se->id = ex->id;
	se->alloc_id = ex->alloc_id;
	se->owner_id = ex->owner_id;
	se->owner = (char *)ex->owner;
	se->owner_pid = (int32_t)ex->owner_pid;
	se->owner_uid = (uint32_t)ex->owner_uid;
	se->device = (uint32_t)ex->dev;
	se->size = ex->size;
	se->token.data = (uint8_t *)ex->token;
	se->token.len = IPC_HANDLE_TOKEN;
	se->chunk_ids = &e->ids[e->nids];
	/* A paused object's version holds no chunk: those a resume in flight
	 * took are not its yet (a restart then finds the object paused, with
	 * its copy, and those chunks free). */
	se->n_chunk_ids = ex->version && ex->version->obj->paused ? 0 : ex->nchunks;
	for (uint32_t i = 0; i < se->n_chunk_ids; i++)
		e->ids[e->nids++] = ex->chunks[i]->id;
	se->imports = &e->pimports[e->nimports];
	se->grants = (uint32_t *)ex->grants;
	se->n_grants = ex->ngrants;
	se->version = ex->version != NULL;
	e->pexports[e->st.n_exports++] = se;
	return 0;
}

static int state_enc_import(void *arg, const struct import_export *ex, const struct import_rec *r)
{
	struct state_enc *e = arg;
	Gmb__StateImport *si = &e->imports[e->nimports];

	(void)ex;
	gmb__state_import__init(si);
	si->importer_id = r->importer->id;
	si->opens = r->refs;
	si->unmapped = !r->mapped;
	si->idle = r->idle;
	e->pimports[e->nimports++] = si;
	e->pexports[e->st.n_exports - 1]->n_imports++;
	return 0;
}

static void state_enc_exports(const struct broker *br, struct state_enc *e)
{
	const struct import_table *t = br->imports;

	e->st.import_instance = t ? t->instance : 0;
	e->st.import_next_export_id = t ? t->next_id : 0;
	e->st.n_exports = 0;
	e->st.exports = e->pexports;
	import_record_walk(br, state_enc_export, state_enc_import, e);
}

/* A named object and its versions, each naming its export. */
static int state_enc_object(void *arg, const struct bobject *obj)
{
	struct state_enc *e = arg;
	Gmb__StateObject *so = &e->objects[e->st.n_objects];

	gmb__state_object__init(so);
	so->name = (char *)obj->name;
	so->uid = (uint32_t)obj->uid;
	so->next_version = obj->next_version;
	so->latest = obj->latest;
	so->grants = (uint32_t *)obj->grants;
	so->n_grants = obj->ngrants;
	so->paused = obj->paused;
	so->discarded = obj->discarded;
	so->versions = &e->pversions[e->nversions];
	for (const struct bobject_version *v = obj->versions; v; v = v->next) {
		Gmb__StateObjectVersion *sv = &e->versions[e->nversions];

		gmb__state_object_version__init(sv);
		sv->version = v->version;
		sv->export_id = v->ex->id;
		sv->meta.data = v->meta;
		sv->meta.len = v->meta_len;
		sv->held = v->held;
		sv->published_ns = v->published_ns;
		sv->publisher = (char *)v->publisher;
		sv->publisher_pid = (int32_t)v->publisher_pid;
		sv->copy_size = v->copy_fd >= 0 ? v->copy_size : 0;
		e->pversions[e->nversions++] = sv;
		so->n_versions++;
	}
	e->pobjects[e->st.n_objects++] = so;
	return 0;
}

int state_encode(const struct broker *br, uint8_t **buf, size_t *len)
{
	struct state_enc e = { 0 };
	struct state_count n;
	uint64_t created[BACKEND_MAX_DEVICES], released[BACKEND_MAX_DEVICES];
	uint64_t handed[BACKEND_MAX_DEVICES];
	uint8_t *out;
	int rc;

	state_count(br, &n);
	rc = state_enc_alloc(&e, br->chunks.count, &n);
	if (rc < 0)
		goto out;
	gmb__state__init(&e.st);
	e.st.version = STATE_VERSION;
	e.st.backend = (char *)br->backend->ops->name;
	e.st.next_chunk_id = br->next_chunk_id;
	e.st.next_client_id = br->next_client_id;
	e.st.next_alloc_id = br->next_alloc_id;
	for (int d = 0; d < br->ndevices; d++) {
		created[d] = br->pools[d].chunks_created;
		released[d] = br->pools[d].chunks_released;
		handed[d] = br->pools[d].chunks_handed_over;
	}
	e.st.n_chunks_created = e.st.n_chunks_released = e.st.n_chunks_handed_over =
		(size_t)br->ndevices;
	e.st.chunks_created = created;
	e.st.chunks_released = released;
	e.st.chunks_handed_over = handed;
	state_enc_chunks(br, &e);
	state_enc_clients(br, &e);
	state_enc_exports(br, &e);
	e.st.objects = e.pobjects;
	object_walk(br, state_enc_object, &e);
	*len = gmb__state__get_packed_size(&e.st);
	out = malloc(*len ? *len : 1);
	rc = -ENOMEM;
	if (!out)
		goto out;
	gmb__state__pack(&e.st, out);
	*buf = out;
	rc = 0;
out:
	state_enc_free(&e);
	return rc;
}

/* ---- restore ---- */

static struct state_fd *state_fd_find(struct state_fd *fds, size_t n, uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i].id == id && fds[i].fd >= 0 && !fds[i].used && !fds[i].copy)
			return &fds[i];
	return NULL;
}

/* The stored host copy of version export @export_id, of @size bytes. */
static struct state_fd *state_copy_find(struct state_fd *fds, size_t n, uint64_t export_id,
					uint64_t size)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i].copy && fds[i].id == export_id && fds[i].size == size &&
		    fds[i].fd >= 0 && !fds[i].used)
			return &fds[i];
	return NULL;
}

/* One recorded chunk back from its fd; 0, or why it stays lost. */
static int state_restore_chunk(struct broker *br, const Gmb__StateChunk *sc, struct state_fd *fds,
			       size_t nfds)
{
	struct backend *be = br->backend;
	struct state_fd *f = state_fd_find(fds, nfds, sc->id);
	struct chunk *ch;
	uint64_t handle;
	int rc;

	if (!f)
		return -ENOENT;
	if (sc->device >= (uint32_t)br->ndevices || f->dev != (int)sc->device ||
	    f->size != sc->size)
		return -EINVAL;
	/* Adopted, not only imported: gmbd lends it again (an export). */
	rc = be->ops->chunk_adopt(be, f->fd, sc->size, &handle);
	if (rc < 0)
		return rc;
	rc = pool_adopt(&br->pools[sc->device], sc->id, sc->size, handle, &ch);
	if (rc < 0) {
		be->ops->chunk_release(be, handle);
		return rc;
	}
	ch->uid = (uid_t)sc->uid;
	ch->uid_set = sc->uid_set;
	ch->shared_out = sc->shared_out;
	f->used = true;
	if (br->next_chunk_id <= sc->id)
		br->next_chunk_id = sc->id + 1;
	return 0;
}

static void state_restore_chunks(struct broker *br, const Gmb__State *st, struct state_fd *fds,
				 size_t nfds, struct state_stats *out)
{
	for (size_t i = 0; i < st->n_chunks; i++) {
		int rc = state_restore_chunk(br, st->chunks[i], fds, nfds);

		if (rc == 0) {
			out->chunks++;
			out->bytes += st->chunks[i]->size;
			continue;
		}
		out->lost++;
		log_warn(
			"chunk not restored chunk=%llu device=%u size=%llu err=\"%s\" reason=\"%s\"",
			(unsigned long long)st->chunks[i]->id, st->chunks[i]->device,
			(unsigned long long)st->chunks[i]->size,
			rc == -ENOENT ? "no fd in the store" : strerror(-rc), backend_last_error());
	}
}

/* The last lend's chunks by id; a missing one (or one of another device) is dropped. */
static int state_restore_alloc(struct broker *br, struct bclient *c, struct btag *t,
			       const Gmb__StateAlloc *sa)
{
	struct chunk **chunks;
	int rc;

	if (sa->n_chunk_ids == 0 || sa->n_chunk_ids > UINT32_MAX ||
	    sa->device >= (uint32_t)br->ndevices)
		return -EINVAL;
	chunks = calloc(sa->n_chunk_ids, sizeof(*chunks));
	if (!chunks)
		return -ENOMEM;
	for (size_t i = 0; i < sa->n_chunk_ids; i++) {
		struct chunk *ch = sa->chunk_ids[i] ? broker_chunk_get(br, sa->chunk_ids[i]) : NULL;

		chunks[i] = ch && ch->dev == (int)sa->device ? ch : NULL;
	}
	rc = rejoin_restore_alloc(br, c, t, sa->id, (int)sa->device, sa->size, sa->active, chunks,
				  (uint32_t)sa->n_chunk_ids);
	free(chunks);
	return rc;
}

static int state_restore_tag(struct broker *br, struct bclient *c, const Gmb__StateTag *st)
{
	struct btag *t;
	int rc;

	rc = rejoin_restore_tag(c, st->name, (int)st->mode, st->paused, &t);
	if (rc < 0)
		return rc;
	/* Allocations are linked first in their tag: last recorded first. */
	for (size_t i = st->n_allocs; i-- > 0;) {
		rc = state_restore_alloc(br, c, t, st->allocs[i]);
		if (rc < 0)
			log_warn("allocation not restored client=%s alloc=%llu err=\"%s\"", c->name,
				 (unsigned long long)st->allocs[i]->id, strerror(-rc));
	}
	return 0;
}

static int state_restore_client(struct broker *br, const Gmb__StateClient *sc)
{
	struct broker_peer peer = {
		.pid = sc->pid, .uid = sc->uid, .gid = sc->gid, .start_time = sc->start_time
	};
	gid_t *groups = NULL; /* owned here; the client keeps a copy */
	struct bclient *c;
	int rc;

	/* Every group, as recorded (the kernel allows up to NGROUPS_MAX). */
	if (sc->n_groups > NGROUPS_MAX)
		return -EINVAL;
	if (sc->n_groups) {
		groups = malloc(sc->n_groups * sizeof(*groups));
		if (!groups)
			return -ENOMEM;
	}
	for (size_t i = 0; i < sc->n_groups; i++)
		groups[i] = (gid_t)sc->groups[i];
	peer.groups = groups;
	peer.ngroups = (int)sc->n_groups;
	rc = broker_restore_client(br, &peer, sc->id, sc->name, sc->control, &c);
	free(groups);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < sc->n_tags; i++) {
		rc = state_restore_tag(br, c, sc->tags[i]);
		if (rc < 0)
			log_warn("tag not restored client=%s tag=%s err=\"%s\"", c->name,
				 sc->tags[i]->name, strerror(-rc));
	}
	return 0;
}

/* One recorded export, as the core's import_restore_export() takes it. */
static int state_restore_export(struct broker *br, const Gmb__StateExport *se, char *err)
{
	struct import_restore_rec *recs = calloc(se->n_imports + 1, sizeof(*recs));
	struct import_restore rx = { .id = se->id,
				     .alloc_id = se->alloc_id,
				     .owner_id = se->owner_id,
				     .owner = se->owner,
				     .owner_pid = se->owner_pid,
				     .owner_uid = se->owner_uid,
				     .dev = se->device,
				     .size = se->size,
				     .token = se->token.data,
				     .token_len = se->token.len,
				     .chunk_ids = se->chunk_ids,
				     .nchunks = se->n_chunk_ids,
				     .recs = recs,
				     .nrecs = se->n_imports,
				     .grants = se->grants,
				     .ngrants = se->n_grants,
				     .version = se->version };
	int rc;

	if (!recs)
		return err_fmt(err, -ENOMEM, "out of memory restoring export %llu",
			       (unsigned long long)se->id);
	for (size_t i = 0; i < se->n_imports; i++)
		recs[i] = (struct import_restore_rec){ .importer_id = se->imports[i]->importer_id,
						       .opens = se->imports[i]->opens,
						       .unmapped = se->imports[i]->unmapped,
						       .idle = se->imports[i]->idle };
	rc = import_restore_export(br, &rx, err);
	free(recs);
	return rc;
}

/* The import table, then its exports: the record's last first (each is linked first). */
static void state_restore_imports(struct broker *br, const Gmb__State *st, struct state_stats *out)
{
	char err[ERR_MSG_MAX];
	int rc = import_restore_table(br, st->import_instance, st->import_next_export_id);

	if (rc < 0) {
		log_warn("import table not restored instance=%llu next_export=%llu err=\"%s\"",
			 (unsigned long long)st->import_instance,
			 (unsigned long long)st->import_next_export_id, strerror(-rc));
		return;
	}
	for (size_t i = st->n_exports; i-- > 0;) {
		const Gmb__StateExport *se = st->exports[i];
		const struct import_export *ex;

		err[0] = '\0';
		rc = state_restore_export(br, se, err);
		if (rc < 0) {
			log_warn("export not restored export=%llu alloc=%llu owner=%llu"
				 " err=\"%s\" reason=\"%s\"",
				 (unsigned long long)se->id, (unsigned long long)se->alloc_id,
				 (unsigned long long)se->owner_id, strerror(-rc), err);
			continue;
		}
		ex = import_find(br, se->id);
		out->exports++;
		out->imports += ex->nimports;
	}
}

/* One recorded object with its versions, still without their exports. */
static int state_restore_object(struct broker *br, const Gmb__StateObject *so, struct state_fd *fds,
				size_t nfds, char *err)
{
	struct object_restore_version *vs = calloc(so->n_versions + 1, sizeof(*vs));
	struct object_restore ro = { .name = so->name,
				     .uid = (uid_t)so->uid,
				     .next_version = so->next_version,
				     .latest = so->latest,
				     .grants = so->grants,
				     .ngrants = so->n_grants,
				     .paused = so->paused,
				     .discarded = so->discarded,
				     .versions = vs,
				     .nversions = so->n_versions };
	int rc;

	if (!vs)
		return err_fmt(err, -ENOMEM, "out of memory restoring object '%s'", so->name);
	for (size_t i = 0; i < so->n_versions; i++) {
		const Gmb__StateObjectVersion *sv = so->versions[i];
		struct state_fd *cf =
			sv->copy_size ? state_copy_find(fds, nfds, sv->export_id, sv->copy_size) :
					NULL;

		vs[i] = (struct object_restore_version){ .version = sv->version,
							 .export_id = sv->export_id,
							 .meta = sv->meta.data,
							 .meta_len = sv->meta.len,
							 .held = sv->held,
							 .published_ns = sv->published_ns,
							 .publisher = sv->publisher,
							 .publisher_pid = sv->publisher_pid,
							 .copy_fd = cf ? cf->fd : -1,
							 .copy_size = sv->copy_size };
	}
	rc = object_restore(br, &ro, err);
	/* The copies are the versions' (dup'ed): those fds stay in the store. */
	for (size_t i = 0; rc == 0 && i < so->n_versions; i++)
		for (size_t k = 0; k < nfds; k++)
			if (fds[k].copy && vs[i].copy_fd >= 0 && fds[k].fd == vs[i].copy_fd)
				fds[k].used = true;
	free(vs);
	return rc;
}

/* The objects, before the exports that hold their versions' chunks. */
static void state_restore_objects(struct broker *br, const Gmb__State *st, struct state_fd *fds,
				  size_t nfds)
{
	char err[ERR_MSG_MAX];

	for (size_t i = st->n_objects; i-- > 0;) {
		err[0] = '\0';
		if (state_restore_object(br, st->objects[i], fds, nfds, err) < 0)
			log_warn("object not restored name=%s uid=%u reason=\"%s\"",
				 st->objects[i]->name, st->objects[i]->uid, err);
	}
}

static int state_check(const struct broker *br, const Gmb__State *st)
{
	if (st->version != STATE_VERSION) {
		log_err("cannot restore the state of another gmbd version version=%u want=%d",
			st->version, STATE_VERSION);
		return -EPROTO;
	}
	if (!st->backend || strcmp(st->backend, br->backend->ops->name) != 0) {
		log_err("cannot restore the state of another backend recorded=%s now=%s",
			st->backend ? st->backend : "", br->backend->ops->name);
		return -EPROTO;
	}
	return 0;
}

int state_restore(struct broker *br, const uint8_t *buf, size_t len, struct state_fd *fds,
		  size_t nfds, struct state_stats *out)
{
	Gmb__State *st;
	int rc;

	*out = (struct state_stats){ 0 };
	st = gmb__state__unpack(NULL, len, buf);
	if (!st) {
		log_err("cannot decode the recorded state bytes=%zu", len);
		return -EPROTO;
	}
	rc = state_check(br, st);
	if (rc < 0)
		goto out;
	state_restore_chunks(br, st, fds, nfds, out);
	for (size_t i = 0; i < st->n_clients; i++) {
		rc = state_restore_client(br, st->clients[i]);
		if (rc < 0) {
			log_warn("client not restored client=%s id=%llu err=\"%s\"",
				 st->clients[i]->name, (unsigned long long)st->clients[i]->id,
				 strerror(-rc));
			continue;
		}
		out->clients++;
	}
	state_restore_objects(br, st, fds, nfds);
	state_restore_imports(br, st, out);
	object_restore_finish(br);
	if (out->exports)
		log_notice("imports restored exports=%u imports=%u", out->exports, out->imports);
	if (br->next_client_id < st->next_client_id)
		br->next_client_id = st->next_client_id;
	if (br->next_alloc_id < st->next_alloc_id)
		br->next_alloc_id = st->next_alloc_id;
	if (br->next_chunk_id < st->next_chunk_id)
		br->next_chunk_id = st->next_chunk_id;
	/* The counters go on from where the previous gmbd left them. */
	for (int d = 0; d < br->ndevices; d++) {
		struct pool *p = &br->pools[d];

		p->chunks_created += (size_t)d < st->n_chunks_created ? st->chunks_created[d] : 0;
		p->chunks_released += (size_t)d < st->n_chunks_released ? st->chunks_released[d] :
									  0;
		p->chunks_handed_over +=
			(size_t)d < st->n_chunks_handed_over ? st->chunks_handed_over[d] : 0;
		pool_shrink(p, br->opts.pool_keep, NULL);
	}
	rc = 0;
out:
	gmb__state__free_unpacked(st, NULL);
	return rc;
}
