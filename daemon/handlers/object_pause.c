/*
 * object_pause.c - ObjectPauseRequest: a named object paused and resumed
 * under its readers (README "Named objects").
 *
 * Pause: every reader that maps a version is asked to unmap it, keeping its
 * address (a round of ipc_pause.c, the IpcFollow of imports); once each
 * answered, the bytes are copied to host memory gmbd holds (one memfd per
 * version; discard: none) and the chunks go back to the driver. Resume: new
 * chunks within the budget, the bytes copied back (discard: zeros), then a
 * round asks the readers to map again; the request is answered once they
 * did. A reader that does not follow fails the pause, naming it, and those
 * that did are asked to map again.
 *
 * The copies run off the loop (libuv's thread pool, one job at a time): a
 * job maps the versions' chunks into gmbd's own address space and copies
 * with the backend's contents operations, then lets go of what those keep
 * (cuda: the primary context, about 500 MiB of GPU memory while a job runs,
 * none between). While a job runs its object is busy: nothing else changes
 * it and none of its versions goes (object.h), so the chunks and copies
 * the job reads stay alive. A job still running when gmbd stops ends on
 * the loop's last turns: its copy is dropped and the object left active.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/log.h"
#include "common/size.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

/* One version's bytes to copy: its chunks as the job started. */
struct hobj_part {
	int dev;
	uint64_t size, granularity;
	uint64_t *handles, *sizes; /* owned; the chunks stay pinned while the job runs */
	uint32_t nchunks;
	/* Pause: the copy the job makes (owned by the job until handed to the
	 * version); resume: the version's copy, borrowed (-1: zeros). */
	int fd;
};

struct hobj_job {
	uv_work_t work;
	struct handlers *h;
	struct sess *s;	    /* reference held */
	Gmb__Envelope *env; /* owned */
	uint64_t start_ns;
	struct bobject *obj; /* busy while the job runs */
	bool resume;
	struct hobj_part *parts; /* one per version, in the object's order */
	size_t nparts;
	int rc; /* the copy's: 0 or -errno, with err */
	char err[ERR_MSG_MAX];
};

/* One job at a time: a job lets go of the device's context at its end. */
static pthread_mutex_t hobj_job_lock = PTHREAD_MUTEX_INITIALIZER;

static void hobj_job_free(struct hobj_job *j)
{
	for (size_t i = 0; i < j->nparts; i++) {
		free(j->parts[i].handles);
		free(j->parts[i].sizes);
		if (!j->resume && j->parts[i].fd >= 0)
			close(j->parts[i].fd);
	}
	free(j->parts);
	if (j->env) {
		hconn_of(j->s)->inflight--;
		gmb__envelope__free_unpacked(j->env, NULL);
	}
	sess_unref(j->s);
	free(j);
}

/* ---- on the thread pool: no broker, no session, only the backend ---- */

/* @host (pause: device -> host; resume: host -> device, NULL: zeros) over @pt's chunks. */
static int hobj_copy(struct backend *be, const struct hobj_part *pt, void *host, bool resume,
		     char *err)
{
	uintptr_t va;
	uint64_t off = 0;
	int rc = be->ops->va_reserve(be, pt->size, pt->granularity, &va);

	if (rc < 0)
		return backend_fail_msg(err, rc, "reserving gmbd's range for a copy");
	for (uint32_t i = 0; rc == 0 && i < pt->nchunks; i++) {
		rc = be->ops->map(be, va + off, pt->sizes[i], pt->handles[i]);
		if (rc == 0)
			off += pt->sizes[i];
	}
	if (rc == 0)
		rc = be->ops->set_access(be, pt->dev, va, pt->size);
	if (rc == 0)
		rc = be->ops->contents_queue(be, pt->dev,
					     !resume ? BACKEND_TO_HOST :
					     host    ? BACKEND_FROM_HOST :
						       BACKEND_ZERO,
					     host, va, pt->size);
	if (rc == 0)
		rc = be->ops->wait(be, pt->dev);
	if (rc < 0)
		backend_fail_msg(err, rc, "copying a named object's bytes");
	if (off)
		be->ops->unmap(be, va, off);
	be->ops->va_free(be, va, pt->size);
	return rc;
}

/* MemAvailable of /proc/meminfo in bytes; UINT64_MAX when it cannot be read. */
static uint64_t hobj_host_available(void)
{
	unsigned long long kib = 0;
	char line[128];
	FILE *f = fopen("/proc/meminfo", "re");
	bool found = false;

	while (f && !found && fgets(line, sizeof(line), f))
		found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
	if (f)
		fclose(f);
	return found ? (uint64_t)kib << 10 : UINT64_MAX;
}

/* The host side of @pt: its memfd (made for a pause), mapped and registered. */
static int hobj_part_run(struct backend *be, struct hobj_part *pt, bool resume, char *err)
{
	void *host = NULL;
	int rc = 0;

	if (!resume) {
		uint64_t avail = hobj_host_available();

		/* Filling a copy the host cannot hold would bring the OOM killer to gmbd. */
		if (avail < pt->size)
			return err_fmt(err, -ENOMEM,
				       "a host copy of %" PRIu64 " bytes: the host has %" PRIu64
				       " available (MemAvailable)",
				       pt->size, avail);
		pt->fd = memfd_create("gmbd-object-copy", MFD_CLOEXEC);
		if (pt->fd < 0 || ftruncate(pt->fd, (off_t)pt->size) < 0)
			return err_fmt(err, -errno, "a host copy of %" PRIu64 " bytes: %s",
				       pt->size, strerror(errno));
	}
	if (pt->fd >= 0) {
		/*
		 * Populated now: the copy runs at the link's speed, not the faults'.
		 * Writable for a resume too: cuMemHostRegister refuses a read-only
		 * mapping (CUDA_ERROR_INVALID_VALUE) unless told it is one.
		 */
		host = mmap(NULL, pt->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
			    pt->fd, 0);
		if (host == MAP_FAILED)
			return err_fmt(err, -errno, "mapping a host copy of %" PRIu64 " bytes: %s",
				       pt->size, strerror(errno));
		if (be->ops->host_register)
			rc = be->ops->host_register(be, host, pt->size);
		if (rc < 0)
			backend_fail_msg(err, rc, "registering a host copy");
	}
	if (rc == 0)
		rc = hobj_copy(be, pt, host, resume, err);
	if (host) {
		if (be->ops->host_unregister)
			be->ops->host_unregister(be, host, pt->size);
		munmap(host, pt->size);
	}
	return rc;
}

static void hobj_job_run(uv_work_t *w)
{
	struct hobj_job *j = w->data;
	struct backend *be = j->h->broker->backend;
	uint64_t used = 0;

	pthread_mutex_lock(&hobj_job_lock);
	j->rc = 0;
	for (size_t i = 0; j->rc == 0 && i < j->nparts; i++) {
		j->rc = hobj_part_run(be, &j->parts[i], j->resume, j->err);
		used |= 1ULL << (unsigned)j->parts[i].dev;
	}
	for (int d = 0; d < be->ndevices; d++)
		if ((used & (1ULL << (unsigned)d)) && be->ops->contents_release)
			be->ops->contents_release(be, d);
	pthread_mutex_unlock(&hobj_job_lock);
}

/* ---- on the loop ---- */

static void hobj_event(struct handlers *h, struct sess *s, const struct bobject *obj,
		       enum event_kind kind, uint64_t duration_ns)
{
	struct event ev = EVENT_INIT(kind);

	handlers__event_client(&ev, s, hconn_of(s)->client);
	ev.bytes = object_bytes(obj);
	ev.detail = obj->name;
	ev.duration_ns = duration_ns;
	handlers__emit(h, &ev);
}

/* The paused object's readers map again; the request is answered after them. */
static int hobj_resumed(struct hreq *rq, struct bobject *obj)
{
	int r = handlers__object_follow(rq, NULL, obj, true);

	if (r == HANDLERS_KEPT)
		return r;
	if (*rq->err)
		log_info("object readers not mapped again " SESS_FMT " object=%s why=\"%s\"",
			 SESS_ARGS(rq->s), obj->name, rq->err);
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

static void hobj_job_done(uv_work_t *w, int status)
{
	struct hobj_job *j = w->data;
	struct handlers *h = j->h;
	struct bobject *obj = j->obj;
	struct hreq rq = {
		.h = h, .s = j->s, .env = j->env, .short_dev = -1, .start_ns = j->start_ns
	};
	int r = j->rc ? j->rc : status;
	size_t i = 0;

	bool answer = j->s->state == SESS_OPEN;

	memcpy(rq.err, j->err, sizeof(rq.err));
	if (h->closed) {
		/* gmbd stops: the object stays as it was (active), the copy dropped. */
		if (j->resume)
			object_resume_undo(h->broker, obj);
		object_job_end(h->broker, obj);
		hobj_job_free(j);
		return;
	}
	/* The operator's request is carried out even when its asker went. */
	if (r == 0 && !j->resume) {
		/* The copies become the versions', in the object's order. */
		int *fds = calloc(j->nparts + 1, sizeof(*fds));

		r = fds ? 0 : err_fmt(rq.err, -ENOMEM, "out of memory pausing '%s'", obj->name);
		for (i = 0; fds && i < j->nparts; i++)
			fds[i] = j->parts[i].fd;
		if (r == 0)
			r = object_pause_release(h->broker, obj, fds, rq.err);
		for (i = 0; fds && i < j->nparts; i++)
			j->parts[i].fd = fds[i];
		free(fds);
	}
	if (r == 0 && !j->resume) {
		hobj_event(h, j->s, obj, EVENT_OBJECT_PAUSE, uv_hrtime() - j->start_ns);
		if (answer)
			handlers__reply_status(j->s, j->env->id, 0, NULL);
	} else if (r == 0) {
		object_resume_done(h->broker, obj);
		hobj_event(h, j->s, obj, EVENT_OBJECT_RESUME, uv_hrtime() - j->start_ns);
		if (!answer) {
			handlers__object_remap_all(h, obj);
		} else if (hobj_resumed(&rq, obj) == HANDLERS_KEPT) {
			hconn_of(j->s)->inflight--;
			j->env = NULL; /* the round's now */
		}
	} else {
		if (j->resume)
			object_resume_undo(h->broker, obj);
		else
			handlers__object_remap_all(h, obj);
		handlers__refused(h, j->s, "object_pause", r, rq.err);
		if (answer)
			handlers__reply_status(j->s, j->env->id, r, rq.err);
	}
	/* May free @obj: a dropped one whose readers closed meanwhile. */
	object_job_end(h->broker, obj);
	hobj_job_free(j);
	h->settle(h);
	handlers__changed(h);
}

/* The job of @obj's copies; @rq's envelope is the job's from here on. */
static int hobj_job_start(struct hreq *rq, struct bobject *obj, bool resume)
{
	struct hobj_job *j = calloc(1, sizeof(*j));
	size_t i = 0;
	int r;

	if (!j || !(j->parts = calloc(obj->nversions + 1, sizeof(*j->parts)))) {
		free(j);
		return handlers__fail(rq, -ENOMEM, "out of memory pausing object '%s'", obj->name);
	}
	for (struct bobject_version *v = obj->versions; v; v = v->next, i++) {
		struct import_export *ex = v->ex;
		struct hobj_part *pt = &j->parts[j->nparts++];

		*pt = (struct hobj_part){ .dev = ex->dev,
					  .size = ex->size,
					  .granularity = rq->h->broker->pools[ex->dev].granularity,
					  .nchunks = ex->nchunks,
					  .fd = resume ? v->copy_fd : -1 };
		pt->handles = calloc(ex->nchunks + 1, sizeof(*pt->handles));
		pt->sizes = calloc(ex->nchunks + 1, sizeof(*pt->sizes));
		if (!pt->handles || !pt->sizes)
			goto err_nomem;
		for (uint32_t k = 0; k < ex->nchunks; k++) {
			pt->handles[k] = ex->chunks[k]->handle;
			pt->sizes[k] = ex->chunks[k]->size;
		}
	}
	j->work.data = j;
	j->h = rq->h;
	j->obj = obj;
	j->resume = resume;
	j->start_ns = rq->start_ns;
	r = uv_queue_work(rq->h->loop, &j->work, hobj_job_run, hobj_job_done);
	if (r < 0) {
		r = handlers__fail(rq, -EAGAIN, "object '%s': no worker for its copy: %s",
				   obj->name, uv_strerror(r));
		goto err_free;
	}
	obj->busy = true;
	j->s = sess_ref(rq->s);
	j->env = rq->env;
	hconn_of(rq->s)->inflight++;
	log_info("object %s copies start " SESS_FMT " object=%s versions=%zu bytes=%" PRIu64,
		 resume ? "resume" : "pause", SESS_ARGS(rq->s), obj->name, j->nparts,
		 object_bytes(obj));
	return HANDLERS_KEPT;

err_nomem:
	r = handlers__fail(rq, -ENOMEM, "out of memory pausing object '%s'", obj->name);
err_free:
	for (size_t k = 0; k < j->nparts; k++) {
		free(j->parts[k].handles);
		free(j->parts[k].sizes);
	}
	free(j->parts);
	free(j);
	return r;
}

static int hobj_resume(struct hreq *rq, struct bobject *obj)
{
	int r = object_resume_take(rq->h->broker, obj, rq->err);

	if (r < 0)
		return r;
	/* Discarded: zeros (warm chunks of the uid may hold its old bytes). */
	r = hobj_job_start(rq, obj, true);
	if (r < 0)
		object_resume_undo(rq->h->broker, obj);
	return r;
}

int handlers__object_pause(struct hreq *rq)
{
	const Gmb__ObjectPauseRequest *m = rq->env->object_pause;
	struct bclient *c = hconn_of(rq->s)->client;
	bool admin = broker_may_control(rq->h->broker, c, NULL, NULL) == 0;
	struct bobject *obj;
	uint32_t mapped;
	int r;

	r = object_pause_find(rq->h->broker, c, admin, m->name, m->resume, &obj, rq->err);
	if (r < 0)
		return r;
	if (r == 1) {
		handlers__reply_status(rq->s, rq->env->id, 0, NULL);
		return 0;
	}
	if (m->resume)
		return hobj_resume(rq, obj);
	mapped = object_mapped_readers(obj);
	if (mapped && rq->retry) {
		/*
		 * The round is over and some still map it: refused, once those that
		 * followed mapped again (a reader touching its pointer right after
		 * the refusal must find it mapped).
		 */
		char msg[ERR_MSG_MAX];

		err_fmt(rq->err, -EBUSY, "object '%s': %u readers still map it", obj->name, mapped);
		snprintf(msg, sizeof(msg), "%s", rq->err);
		if (rq->not_followed && *rq->not_followed)
			err_append(msg, "; did not follow: %s", rq->not_followed);
		r = handlers__refuse_remapped(rq, "", obj, -EBUSY, msg);
		if (r == HANDLERS_KEPT) {
			handlers__refused(rq->h, rq->s, "object_pause", -EBUSY, msg);
			return r;
		}
		return -EBUSY; /* nobody to map again: the round's end answers with rq->err */
	}
	if (mapped) {
		r = handlers__object_follow(rq, handlers__object_pause, obj, false);
		if (r != 0)
			return r < 0 ? handlers__fail(rq, r, "out of memory asking readers") : r;
		return handlers__fail(rq, -EBUSY, "object '%s': %u readers map it: %s", obj->name,
				      mapped, rq->err);
	}
	if (m->discard) {
		r = object_pause_release(rq->h->broker, obj, NULL, rq->err);
		if (r < 0)
			return r;
		hobj_event(rq->h, rq->s, obj, EVENT_OBJECT_PAUSE, uv_hrtime() - rq->start_ns);
		handlers__reply_status(rq->s, rq->env->id, 0, NULL);
		return 0;
	}
	return hobj_job_start(rq, obj, false);
}
