/*
 * memory.c - the memory requests of a client: alloc, free, tag mode,
 * pause, resume, and an operator's trim; and the replies that lend memory.
 * A pause or resume with alloc_ids gives single allocations back, or lends
 * to them again, while their tags stay active (libgmb's pause that hands
 * each allocation back once its bytes are saved).
 *
 * Replies that lend memory (AllocReply, ResumeReply) go out in parts: first
 * the chunk fds, at most WIRE_MAX_FDS per part (more = true, no body), then
 * the lends in parts of at most WIRE_MAX_MSG / 2 bytes, a lend of more than
 * HANDLERS_LEND_PIECE chunks in pieces (Lend.first_chunk); the last part has
 * more = false and status 0. alloc and resume return HANDLERS_PARK when the
 * core must wait for drops (park.c keeps and retries them).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/size.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/event.h"
#include "daemon/core/import.h"
#include "daemon/core/lend.h"
#include "daemon/core/wait.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"
#include "include/gmb.h"

/* Chunks per piece of a lend: 1024 ids and sizes are under 21 KiB packed. */
#define HANDLERS_LEND_PIECE 1024u

/* A resume's followers (ResumeReply.followers); an alloc has none. */
#define HANDLERS_ALLOC_REPLY UINT32_MAX

/* What a reply that lends is: an alloc's, a resume's (its followers) or a
 * resume's of given-back allocations (ResumeReply.given_back). */
struct handlers_lent {
	uint32_t followers; /* HANDLERS_ALLOC_REPLY: an alloc's */
	bool given;
};

static int handlers_send_result(struct hreq *rq, const struct broker_result *res,
				struct handlers_lent kind);
static int handlers_send_lends(struct sess *s, uint64_t reply_to, Gmb__Lend *lends, size_t n,
			       struct handlers_lent kind);
static int handlers_send_lend_part(struct sess *s, uint64_t reply_to, Gmb__Lend **lends, size_t n,
				   struct handlers_lent kind, bool last);

/* Says why and how long @rq waits (park.c reads it) and asks to park it. */
static int handlers_wait(struct hreq *rq, uint32_t wait_ms, bool drops, int dev, uint64_t bytes,
			 int kind, const char *tag)
{
	rq->wait_ms = wait_ms;
	rq->drops = drops;
	rq->short_dev = dev;
	rq->short_bytes = bytes;
	rq->wait_kind = kind;
	rq->wait_tag = tag;
	return HANDLERS_PARK;
}

/* An event of @rq's client about @tag. */
static void handlers_mem_event(struct hreq *rq, enum event_kind kind, const char *tag, int dev,
			       uint64_t bytes, struct event *ev)
{
	*ev = (struct event)EVENT_INIT(kind);
	handlers__event_client(ev, rq->s, hconn_of(rq->s)->client);
	ev->tag = tag;
	ev->device = dev;
	ev->bytes = bytes;
	ev->duration_ns = uv_hrtime() - rq->start_ns;
}

/* Pieces a lend of @n chunks travels in (at least one). */
static size_t handlers_lend_pieces(uint32_t n)
{
	return n ? (n + HANDLERS_LEND_PIECE - 1) / HANDLERS_LEND_PIECE : 1;
}

/*
 * A request to @what memory of @tag needs a valid tag and a client that is no
 * tool. A tool (hello.tool) is not listed in status, cannot be paused and is
 * not in the restart record: memory it held would be nobody's after a restart
 * and could be lent again while still mapped. So tools hold none.
 */
static int handlers_holder_tag(struct hreq *rq, const char *tag, const char *what)
{
	int r = handlers__check_name(rq, "the tag", tag);

	if (r < 0 || !hconn_of(rq->s)->client->tool)
		return r;
	return handlers__fail(rq, -EPERM,
			      "a tool may not %s: connect without the tool flag"
			      " to hold memory",
			      what);
}

int handlers__alloc(struct hreq *rq)
{
	const Gmb__AllocRequest *m = rq->env->alloc;
	struct broker *br = rq->h->broker;
	const char *tag = m->tag ? m->tag : "";
	struct broker_result res = BROKER_RESULT_INIT;
	struct event ev;
	int r;

	r = handlers_holder_tag(rq, tag, "allocate");
	if (r < 0)
		return r;
	/* The core takes an int: a huge uint32 must not wrap to a valid one. */
	if (m->device >= (uint32_t)br->ndevices)
		return handlers__fail(rq, -ENODEV, "device %u does not exist (%d device%s)",
				      m->device, br->ndevices, br->ndevices == 1 ? "" : "s");
	/* A request that may wait queues behind those that wait already. */
	if (m->wait_ms && !rq->retry && wait_ahead(br, hconn_of(rq->s)->client, (int)m->device)) {
		handlers__fail(rq, -ENOMEM,
			       "device %u: requests of the same or higher priority"
			       " wait already",
			       m->device);
		return handlers_wait(rq, m->wait_ms, false, (int)m->device, 0, BROKER_WAIT_ALLOC,
				     tag);
	}
	r = lend_alloc(br, hconn_of(rq->s)->client, (int)m->device, m->size, tag, &res, rq->err);
	if (r == -EAGAIN || (r == -ENOMEM && m->wait_ms && res.short_dev >= 0))
		return handlers_wait(rq, m->wait_ms, r == -EAGAIN, res.short_dev, res.short_bytes,
				     BROKER_WAIT_ALLOC, tag);
	if (r < 0)
		return r;
	handlers_mem_event(rq, EVENT_ALLOC, tag, (int)m->device,
			   res.nallocs ? res.allocs[0]->size : 0, &ev);
	handlers_send_result(rq, &res, (struct handlers_lent){ .followers = HANDLERS_ALLOC_REPLY });
	broker_result_deinit(&res);
	handlers__emit(rq->h, &ev);
	return 0;
}

int handlers__free(struct hreq *rq)
{
	struct bclient *c = hconn_of(rq->s)->client;
	const struct balloc *a = broker_alloc_get(c, rq->env->free->alloc_id);
	char tag[WIRE_MAX_NAME + 1];
	struct event ev;
	int r;

	/* The allocation is gone after the call: what the event says first. */
	snprintf(tag, sizeof(tag), "%s", a ? a->tag->name : "");
	handlers_mem_event(rq, EVENT_FREE, tag, a ? a->dev : -1, a ? a->size : 0, &ev);
	r = lend_free(rq->h->broker, c, rq->env->free->alloc_id, rq->err);
	if (r < 0)
		return r;
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	handlers__emit(rq->h, &ev);
	return 0;
}

int handlers__tag_mode(struct hreq *rq)
{
	const Gmb__TagModeRequest *m = rq->env->tag_mode;
	const char *tag = m->tag ? m->tag : "";
	int r;

	r = handlers__check_name(rq, "the tag", tag);
	if (r < 0)
		return r;
	r = broker_set_mode(rq->h->broker, hconn_of(rq->s)->client, tag, (int)m->mode, rq->err);
	if (r < 0)
		return r;
	handlers__reply_status(rq->s, rq->env->id, 0, NULL);
	return 0;
}

/* PauseRequest.alloc_ids: the allocations go back, their tags stay active. */
static int handlers_give_back(struct hreq *rq)
{
	const Gmb__PauseRequest *m = rq->env->pause;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PauseReply pr = GMB__PAUSE_REPLY__INIT;
	int r;

	r = lend_give_back(rq->h->broker, hconn_of(rq->s)->client, m->alloc_ids, m->n_alloc_ids,
			   m->handles_released, rq->err);
	if (r < 0)
		return r;
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_PAUSE_REPLY;
	env.pause_reply = &pr;
	sess_send(rq->s, &env);
	return 0;
}

int handlers__pause(struct hreq *rq)
{
	const char *tag = rq->env->pause->tag ? rq->env->pause->tag : "";
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PauseReply pr = GMB__PAUSE_REPLY__INIT;
	uint64_t bytes, chunks;
	char b[SIZE_STR_MAX], q[LOG_QUOTE_MAX];
	struct event ev;
	int r;

	if (rq->env->pause->n_alloc_ids)
		return handlers_give_back(rq);
	r = handlers__check_name(rq, "the tag", tag);
	if (r < 0)
		return r;
	/* Allocations given back before it (alloc_ids) count as paused by it. */
	broker_client_pausing(hconn_of(rq->s)->client, tag, &bytes, &chunks);
	/* With handles_released, what nobody holds goes back to the backend before the reply. */
	r = lend_pause(rq->h->broker, hconn_of(rq->s)->client, tag,
		       rq->env->pause->handles_released, rq->err);
	/* Other processes map the tag's memory: ask the idle ones back and,
	 * following, the others to unmap (once); wait for them, if the client
	 * may wait; fail otherwise. */
	if (r == -EBUSY &&
	    import_pause_check(rq->h->broker, hconn_of(rq->s)->client, tag, NULL) < 0) {
		if (!rq->retry &&
		    handlers__ipc_follow(rq, handlers__pause, tag,
					 rq->env->pause->importers_follow) == HANDLERS_KEPT)
			return HANDLERS_KEPT;
		if (rq->env->pause->wait_ms)
			return rq->retry ? HANDLERS_PARK :
					   handlers__ipc_wait(rq, handlers__pause,
							      rq->env->pause->wait_ms);
	}
	if (r < 0)
		return r;
	if (chunks)
		log_info("tag paused " SESS_FMT " tag=%s bytes=%s chunks=%" PRIu64,
			 SESS_ARGS(rq->s), handlers__tag_log(tag, q), size_str(bytes, b), chunks);
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_PAUSE_REPLY;
	env.pause_reply = &pr;
	sess_send(rq->s, &env);
	if (chunks) {
		handlers_mem_event(rq, EVENT_PAUSE, tag, -1, bytes, &ev);
		ev.to_host_bytes = rq->env->pause->host_copied_bytes;
		handlers__emit(rq->h, &ev);
	}
	return 0;
}

/* ResumeRequest.alloc_ids: given-back allocations of active tags lent again. */
static int handlers_resume_given(struct hreq *rq)
{
	const Gmb__ResumeRequest *m = rq->env->resume;
	struct broker_result res = BROKER_RESULT_INIT;
	int r;

	r = lend_resume_given(rq->h->broker, hconn_of(rq->s)->client, m->alloc_ids, m->n_alloc_ids,
			      &res, rq->err);
	if (r == -EAGAIN)
		return handlers_wait(rq, 0, true, res.short_dev, res.short_bytes,
				     BROKER_WAIT_RESUME, "");
	if (r < 0)
		return r;
	handlers_send_result(rq, &res, (struct handlers_lent){ .followers = 0, .given = true });
	broker_result_deinit(&res);
	return 0;
}

int handlers__resume(struct hreq *rq)
{
	const char *tag = rq->env->resume->tag ? rq->env->resume->tag : "";
	struct broker_result res = BROKER_RESULT_INIT;
	uint64_t bytes = 0, chunks = 0, restored = 0;
	char b[SIZE_STR_MAX], q[LOG_QUOTE_MAX];
	struct event ev;
	int r;

	if (rq->env->resume->n_alloc_ids)
		return handlers_resume_given(rq);
	r = handlers_holder_tag(rq, tag, "resume memory");
	if (r < 0)
		return r;
	r = lend_resume(rq->h->broker, hconn_of(rq->s)->client, tag, &res, rq->err);
	if (r == -EAGAIN || (r == -ENOMEM && rq->env->resume->wait_ms && res.short_dev >= 0))
		return handlers_wait(rq, rq->env->resume->wait_ms, r == -EAGAIN, res.short_dev,
				     res.short_bytes, BROKER_WAIT_RESUME, tag);
	if (r < 0)
		return r;
	for (size_t i = 0; i < res.nallocs; i++) {
		bytes += res.allocs[i]->size;
		chunks += res.allocs[i]->nchunks;
		/* The client copies a PRESERVE tag's saved bytes back in full. */
		if (res.allocs[i]->tag->mode == GMB_MODE_PRESERVE)
			restored += res.allocs[i]->size;
	}
	if (res.nallocs)
		log_info("tag resumed " SESS_FMT " tag=%s bytes=%s chunks=%" PRIu64 " fds=%zu",
			 SESS_ARGS(rq->s), handlers__tag_log(tag, q), size_str(bytes, b), chunks,
			 res.nsend);
	handlers_send_result(
		rq, &res,
		(struct handlers_lent){ .followers = handlers__ipc_followers(
						rq->h, hconn_of(rq->s)->client, tag) });
	broker_result_deinit(&res);
	if (chunks) {
		handlers_mem_event(rq, EVENT_RESUME, tag, -1, bytes, &ev);
		ev.from_host_bytes = restored;
		handlers__emit(rq->h, &ev);
	}
	return 0;
}

int handlers__trim(struct hreq *rq)
{
	const Gmb__TrimRequest *m = rq->env->trim;
	struct broker *br = rq->h->broker;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__TrimReply tr = GMB__TRIM_REPLY__INIT;
	char b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];
	struct event ev;
	int r;

	r = broker_may_control(br, hconn_of(rq->s)->client, NULL, rq->err);
	if (r < 0)
		return r;
	r = broker_trim(br, m->device, &tr.released_bytes, &tr.pending_bytes, rq->err);
	if (r < 0)
		return r;
	log_info("pools trimmed " SESS_FMT " device=%d released=%s pending=%s", SESS_ARGS(rq->s),
		 m->device, size_str(tr.released_bytes, b1), size_str(tr.pending_bytes, b2));
	env.reply_to = rq->env->id;
	env.body_case = GMB__ENVELOPE__BODY_TRIM_REPLY;
	env.trim_reply = &tr;
	sess_send(rq->s, &env);
	handlers_mem_event(rq, EVENT_TRIM, NULL, m->device, tr.released_bytes, &ev);
	ev.actor = sess_name(rq->s);
	handlers__emit(rq->h, &ev);
	return 0;
}

/* The allocations the lends of @envs name, once each; resume or alloc in
 * *@resume, a resume of given-back allocations in *@given. */
static size_t handlers_lent_ids(Gmb__Envelope *const *envs, size_t n, uint64_t *ids, size_t max,
				bool *resume, bool *given)
{
	size_t k = 0;

	*resume = *given = false;
	for (size_t i = 0; i < n; i++) {
		const Gmb__Envelope *e = envs[i];

		if (e->body_case == GMB__ENVELOPE__BODY_ALLOC_REPLY && e->alloc_reply->lend &&
		    e->alloc_reply->lend->first_chunk == 0 && k < max)
			ids[k++] = e->alloc_reply->lend->alloc_id;
		if (e->body_case != GMB__ENVELOPE__BODY_RESUME_REPLY)
			continue;
		*resume = true;
		*given |= e->resume_reply->given_back;
		for (size_t j = 0; j < e->resume_reply->n_lends; j++)
			if (e->resume_reply->lends[j]->first_chunk == 0 && k < max)
				ids[k++] = e->resume_reply->lends[j]->alloc_id;
	}
	return k;
}

/*
 * The chunk fds of an alloc or resume reply could not go out (@err, from the
 * transport): the client never got that lend, so gmbd takes it back (an
 * allocation freed; resumed allocations paused again with their last lend
 * cleared, which lends_cleared tells libgmb) and answers the request with
 * @err and a sentence. The session stays. An IPC open's reply is ipc.c's
 * (the open given back). Return: 0, or @err when the packets lend nothing
 * (the session is then doomed).
 */
int handlers__undeliverable(void *arg, struct sess *s, Gmb__Envelope *const *envs, size_t n,
			    int err)
{
	struct handlers *h = arg;
	struct bclient *c = hconn_of(s)->client;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ResumeReply rr = GMB__RESUME_REPLY__INIT;
	char msg[ERR_MSG_MAX];
	uint64_t *ids = NULL;
	size_t max = 0, k;
	bool resume, given;

	for (size_t i = 0; i < n; i++)
		if (envs[i]->body_case == GMB__ENVELOPE__BODY_IPC_OPEN_REPLY)
			return handlers__ipc_undeliverable(h, s, envs, n, err);
	for (size_t i = 0; i < n; i++)
		max += envs[i]->body_case == GMB__ENVELOPE__BODY_RESUME_REPLY ?
			       envs[i]->resume_reply->n_lends :
			       1;
	if (!c || c->tool || !(ids = malloc((max ? max : 1) * sizeof(*ids))))
		goto err_ids;
	k = handlers_lent_ids(envs, n, ids, max, &resume, &given);
	if (k == 0)
		goto err_ids;
	if (resume)
		lend_undo(h->broker, c, ids, k, given);
	else
		lend_free(h->broker, c, ids[0], NULL);
	free(ids);
	err_fmt(msg, err,
		"gmbd lent the memory but could not send its chunk fds (%s), and took it"
		" back: %s; gmbd holds %llu chunk fds and %llu others, of a limit of %llu"
		" open files",
		strerror(-err),
		given  ? "the allocations stay given back" :
		resume ? "the tags stay paused" :
			 "nothing is allocated",
		(unsigned long long)broker_chunk_fds(h->broker),
		(unsigned long long)(h->broker->fds_base + h->broker->fds_conns),
		(unsigned long long)h->broker->opts.fd_limit);
	log_warn("lend taken back, its chunk fds could not be sent " SESS_FMT
		 " request=%s allocations=%zu err=\"%s\"",
		 SESS_ARGS(s), resume ? "resume" : "alloc", k, strerror(-err));
	env.reply_to = envs[0]->reply_to;
	env.status = err;
	env.error = msg;
	if (resume) {
		rr.lends_cleared = true;
		rr.given_back = given;
		env.body_case = GMB__ENVELOPE__BODY_RESUME_REPLY;
		env.resume_reply = &rr;
	}
	sess_send(s, &env);
	handlers__settle(h);
	handlers__changed(h);
	return 0;

err_ids:
	free(ids);
	return err;
}

/*
 * The core already lent @res: a reply we cannot build would leave the
 * client without memory the broker counts as its own, so an encoding
 * failure disconnects it (and the memory comes back).
 */
static int handlers_send_result(struct hreq *rq, const struct broker_result *res,
				struct handlers_lent kind)
{
	bool resume = kind.followers != HANDLERS_ALLOC_REPLY;
	Gmb__Envelope part = GMB__ENVELOPE__INIT;
	Gmb__Lend *lends = NULL;
	uint64_t *vals = NULL;
	size_t total = 0, off = 0, npieces = 0, k = 0;
	int r;

	/* The fds of the chunks the client holds no handle to. */
	part.reply_to = rq->env->id;
	r = handlers__send_chunk_fds(rq->s, &part, res->send, res->nsend);
	if (r < 0)
		return r;
	for (size_t i = 0; i < res->nallocs; i++) {
		total += res->allocs[i]->nchunks;
		npieces += handlers_lend_pieces(res->allocs[i]->nchunks);
	}
	lends = calloc(npieces ? npieces : 1, sizeof(*lends));
	vals = malloc(2 * (total ? total : 1) * sizeof(*vals));
	if (!lends || !vals) {
		r = -ENOMEM;
		sess_doom(rq->s, LOG_LVL_ERR, "out of memory encoding a %s reply",
			  resume ? "resume" : "alloc");
		goto out_free;
	}
	for (size_t i = 0; i < res->nallocs; i++) {
		const struct balloc *a = res->allocs[i];

		for (uint32_t j = 0; j < a->nchunks; j++) {
			vals[off + j] = a->chunks[j] ? a->chunks[j]->id : 0;
			vals[total + off + j] = a->chunks[j] ? a->chunks[j]->size : 0;
		}
		for (uint32_t first = 0; first == 0 || first < a->nchunks;
		     first += HANDLERS_LEND_PIECE) {
			Gmb__Lend *l = &lends[k++];
			uint32_t n = a->nchunks - first;

			gmb__lend__init(l);
			l->alloc_id = a->id;
			l->device = (uint32_t)a->dev;
			l->size = a->size;
			l->first_chunk = first;
			l->n_chunk_ids = l->n_chunk_sizes =
				n < HANDLERS_LEND_PIECE ? n : HANDLERS_LEND_PIECE;
			l->chunk_ids = vals + off + first;
			l->chunk_sizes = vals + total + off + first;
		}
		off += a->nchunks;
	}
	r = handlers_send_lends(rq->s, rq->env->id, lends, k, kind);
out_free:
	free(vals);
	free(lends);
	return r;
}

/* Pieces of lends in parts of at most WIRE_MAX_MSG / 2 bytes (a piece of
 * HANDLERS_LEND_PIECE chunks is well under); an AllocReply holds one. */
static int handlers_send_lends(struct sess *s, uint64_t reply_to, Gmb__Lend *lends, size_t n,
			       struct handlers_lent kind)
{
	bool resume = kind.followers != HANDLERS_ALLOC_REPLY;
	/* Envelope fields around the lends: reply_to, status, more, tags. */
	const size_t base = 64;
	Gmb__Lend **ptrs;
	size_t first = 0, bytes = base;
	int r = 0;

	ptrs = malloc((n ? n : 1) * sizeof(*ptrs));
	if (!ptrs) {
		sess_doom(s, LOG_LVL_ERR, "out of memory encoding a reply");
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		size_t sz = gmb__lend__get_packed_size(&lends[i]) + 16;

		ptrs[i] = &lends[i];
		if (i > first && (!resume || bytes + sz > WIRE_MAX_MSG / 2)) {
			r = handlers_send_lend_part(s, reply_to, ptrs + first, i - first, kind,
						    false);
			if (r < 0)
				goto out_free;
			first = i;
			bytes = base;
		}
		bytes += sz;
	}
	r = handlers_send_lend_part(s, reply_to, ptrs + first, n - first, kind, true);
out_free:
	free(ptrs);
	return r;
}

static int handlers_send_lend_part(struct sess *s, uint64_t reply_to, Gmb__Lend **lends, size_t n,
				   struct handlers_lent kind, bool last)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__AllocReply ar = GMB__ALLOC_REPLY__INIT;
	Gmb__ResumeReply rr = GMB__RESUME_REPLY__INIT;

	env.reply_to = reply_to;
	env.more = !last;
	if (kind.followers != HANDLERS_ALLOC_REPLY) {
		rr.followers = last ? kind.followers : 0;
		rr.given_back = kind.given;
		rr.n_lends = n;
		rr.lends = lends;
		env.body_case = GMB__ENVELOPE__BODY_RESUME_REPLY;
		env.resume_reply = &rr;
	} else {
		ar.lend = n ? lends[0] : NULL;
		env.body_case = GMB__ENVELOPE__BODY_ALLOC_REPLY;
		env.alloc_reply = &ar;
	}
	return sess_send(s, &env);
}
