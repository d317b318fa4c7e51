/*
 * query.c - the exported functions of include/gmb.h that only make a round
 * trip to gmbd: its status and the named objects' list (as JSON, a table or
 * the screen of `gmbctl top`), control of another client, trim, switch,
 * priority, and the watch stream (gmb_watch(), then gmb_watch_next() takes
 * the events the connection's reader queued).
 *
 * None of them changes this process's mappings, so none takes op_lock: a
 * control handler may call them, and a gmb_control() aimed at this very
 * client cannot deadlock against the worker that carries the command out.
 * Each checks its arguments, sends one request (gmb_watch_next() only reads
 * the queue) and ends as gmb__api_done() (api.c) does. gmbd's status may come in several parts, a client's tags
 * continued from one to the next: query_status_join() makes them one
 * StatusReply again before status_json.h's formatters see it.
 *
 * Like every call that needs gmbd, they wait for a reconnect (api.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/lib/api/client.h"
#include "client/lib/api/status_json.h"
#include "common/deadline.h"
#include "common/size.h"

/* The wait for requests that take no op_lock (written under both locks). */
static uint32_t query_wait(struct gmb_client *c)
{
	uint32_t ms;

	pthread_mutex_lock(&c->conn.lock);
	ms = c->mem.wait_ms;
	pthread_mutex_unlock(&c->conn.lock);
	return ms;
}

/* A query: one round trip, the last part's body of @want kind or -EPROTO. */
static int query_round_trip(struct gmb_client *c, Gmb__Envelope *env, int want,
			    struct gmb__reply *rep, const Gmb__Envelope **last, char *err)
{
	int rc = gmb__request(&c->conn, env, rep, err);

	if (rc < 0)
		return rc;
	*last = rep->parts[rep->nparts - 1];
	if ((int)(*last)->body_case != want)
		return err_fmt(err, -EPROTO, "gmbd answered with message %d, not %d",
			       (int)(*last)->body_case, want);
	return 0;
}

/* A status reply's parts as one: pointers into the parts, but for the
 * clients whose tags came in several entries (malloc'd copies). */
struct query_status_joined {
	Gmb__StatusReply sr;
	Gmb__ImportInfo **imports; /* of every part, in order */
	Gmb__ObjectInfo **objects; /* likewise */
	Gmb__ClientInfo **clients;
	Gmb__ClientInfo *copies;
	size_t ncopies;
};

static void query_status_unjoin(struct query_status_joined *j)
{
	for (size_t i = 0; i < j->ncopies; i++)
		free(j->copies[i].tags);
	free(j->copies);
	free(j->clients);
	free(j->imports);
	free(j->objects);
}

/* Entry @ci continues @prev (its last client): its tags are added to a copy. */
static int query_status_continue(struct query_status_joined *j, Gmb__ClientInfo **prev,
				 const Gmb__ClientInfo *ci)
{
	Gmb__ClientInfo *c = *prev;
	Gmb__TagInfo **tags;

	if (c < j->copies || c >= j->copies + j->ncopies) {
		c = &j->copies[j->ncopies++];
		*c = **prev;
		c->tags = NULL;
		c->n_tags = 0;
		tags = malloc(((*prev)->n_tags + ci->n_tags + 1) * sizeof(*tags));
		if (!tags)
			return -ENOMEM;
		memcpy(tags, (*prev)->tags, (*prev)->n_tags * sizeof(*tags));
		c->tags = tags;
		c->n_tags = (*prev)->n_tags;
		*prev = c;
	} else {
		tags = realloc(c->tags, (c->n_tags + ci->n_tags + 1) * sizeof(*tags));
		if (!tags)
			return -ENOMEM;
		c->tags = tags;
	}
	memcpy(c->tags + c->n_tags, ci->tags, ci->n_tags * sizeof(*tags));
	c->n_tags += ci->n_tags;
	return 0;
}

/* Joins @rep's StatusReply parts into @j (query_status_unjoin() it, even on failure). */
static int query_status_join(const struct gmb__reply *rep, struct query_status_joined *j, char *err)
{
	size_t n = 0, k = 0, ni = 0, no = 0;
	bool head = false;

	*j = (struct query_status_joined){ .sr = GMB__STATUS_REPLY__INIT };
	for (size_t p = 0; p < rep->nparts; p++)
		if (rep->parts[p]->body_case == GMB__ENVELOPE__BODY_STATUS_REPLY) {
			n += rep->parts[p]->status_reply->n_clients;
			ni += rep->parts[p]->status_reply->n_imports;
			no += rep->parts[p]->status_reply->n_objects;
		}
	j->clients = calloc(n + 1, sizeof(*j->clients));
	j->copies = calloc(n + 1, sizeof(*j->copies));
	j->imports = calloc(ni + 1, sizeof(*j->imports));
	j->objects = calloc(no + 1, sizeof(*j->objects));
	if (!j->clients || !j->copies || !j->imports || !j->objects)
		return err_fmt(err, -ENOMEM, "out of memory reading gmbd's status");
	for (size_t p = 0; p < rep->nparts; p++) {
		const Gmb__StatusReply *sr = rep->parts[p]->status_reply;

		if (rep->parts[p]->body_case != GMB__ENVELOPE__BODY_STATUS_REPLY)
			continue;
		/* The first part carries backend, version and the devices. */
		if (!head) {
			head = true;
			j->sr.backend = sr->backend;
			j->sr.version = sr->version;
			j->sr.n_devices = sr->n_devices;
			j->sr.devices = sr->devices;
			j->sr.n_waiters = sr->n_waiters;
			j->sr.waiters = sr->waiters;
		}
		/* Imports come in a part of their own, the last. */
		for (size_t i = 0; i < sr->n_imports; i++)
			j->imports[j->sr.n_imports++] = sr->imports[i];
		if (sr->imports_total > j->sr.imports_total)
			j->sr.imports_total = sr->imports_total;
		/* And the named objects in one after them. */
		for (size_t i = 0; i < sr->n_objects; i++)
			j->objects[j->sr.n_objects++] = sr->objects[i];
		if (sr->objects_total > j->sr.objects_total)
			j->sr.objects_total = sr->objects_total;
		for (size_t i = 0; i < sr->n_clients; i++) {
			const Gmb__ClientInfo *ci = sr->clients[i];

			if (!ci || !ci->continued) {
				j->clients[k++] = sr->clients[i];
				continue;
			}
			if (k == 0 || !j->clients[k - 1] || j->clients[k - 1]->id != ci->id)
				return err_fmt(err, -EPROTO,
					       "gmbd's status continues client %" PRIu64
					       " out of order",
					       ci->id);
			if (query_status_continue(j, &j->clients[k - 1], ci) < 0)
				return err_fmt(err, -ENOMEM, "out of memory reading gmbd's status");
		}
	}
	j->sr.n_clients = k;
	j->sr.clients = j->clients;
	j->sr.imports = j->imports;
	j->sr.objects = j->objects;
	return 0;
}

/* StatusRequest, then @fmt turns the reply into a malloc'd string in *@out. */
static int query_fmt_json(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__status_to_json(st, out);
}

static int query_fmt_table(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__status_to_table(st, out);
}

static int query_status(struct gmb_client *c, char **out,
			int (*fmt)(const Gmb__StatusReply *, int, char **), int width,
			const char *what)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest req = GMB__STATUS_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	struct query_status_joined j = { 0 };
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	if (!out)
		return gmb__api_done(c, -EINVAL, "no place for the status");
	*out = NULL;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &req;
	rc = query_round_trip(c, &env, GMB__ENVELOPE__BODY_STATUS_REPLY, &rep, &last, err);
	if (rc == 0)
		rc = query_status_join(&rep, &j, err);
	if (rc == 0) {
		rc = fmt(&j.sr, width, out);
		if (rc < 0)
			err_fmt(err, rc, "formatting gmbd's status as %s: %s", what,
				gmb_strerror(rc));
	}
	query_status_unjoin(&j);
	gmb__reply_deinit(&rep);
	return gmb__api_done(c, rc, err);
}

/* The first of @st's devices numbered @index, or NULL. */
static const Gmb__DeviceInfo *query_status_find(const Gmb__StatusReply *st, uint32_t index)
{
	for (size_t i = 0; st && i < st->n_devices; i++)
		if (st->devices[i] && st->devices[i]->index == index)
			return st->devices[i];
	return NULL;
}

int gmb__status_device(struct gmb_client *c, uint32_t index, uint64_t *budget, uint64_t *used)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__StatusRequest req = GMB__STATUS_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__DeviceInfo *d;
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	env.body_case = GMB__ENVELOPE__BODY_STATUS_REQ;
	env.status_req = &req;
	rc = query_round_trip(c, &env, GMB__ENVELOPE__BODY_STATUS_REPLY, &rep, &last, err);
	if (rc == 0) {
		/* The devices come in the first part. */
		d = query_status_find(rep.parts[0]->body_case == GMB__ENVELOPE__BODY_STATUS_REPLY ?
					      rep.parts[0]->status_reply :
					      NULL,
				      index);
		rc = d ? 0 : -ENODEV;
		*budget = d ? d->budget_bytes : 0;
		*used = d ? d->used_bytes : 0;
	}
	gmb__reply_deinit(&rep);
	return rc == -ENODEV ? rc : gmb__api_done(c, rc, err);
}

GMB_API int gmb_status_json(gmb_client *c, char **json)
{
	return query_status(c, json, query_fmt_json, 0, "JSON");
}

GMB_API int gmb_status_text(gmb_client *c, char **text)
{
	return query_status(c, text, query_fmt_table, 0, "a table");
}

GMB_API int gmb_status_top(gmb_client *c, int width, char **text)
{
	return query_status(c, text, gmb__status_to_top, width, "a screen");
}

static int query_fmt_objects_json(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__objects_to_json(st, out);
}

static int query_fmt_objects_table(const Gmb__StatusReply *st, int width, char **out)
{
	return gmb__objects_to_table(st, out);
}

GMB_API int gmb_objects_json(gmb_client *c, char **json)
{
	return query_status(c, json, query_fmt_objects_json, 0, "JSON");
}

GMB_API int gmb_objects_text(gmb_client *c, char **text)
{
	return query_status(c, text, query_fmt_objects_table, 0, "a table");
}

/* Sends @env, which names the request, and ends as gmb__api_done() does. */
static int query_call(gmb_client *c, Gmb__Envelope *env)
{
	struct gmb__reply rep = GMB__REPLY_INIT;
	char err[ERR_MSG_MAX] = "";
	int rc = gmb__request(&c->conn, env, &rep, err);

	gmb__reply_deinit(&rep);
	return gmb__api_done(c, rc, err);
}

GMB_API int gmb_control(gmb_client *c, const char *target, int op, const char *tag)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ControlRequest req = GMB__CONTROL_REQUEST__INIT;

	if (!c)
		return -EINVAL;
	if (!target || !*target)
		return gmb__api_done(c, -EINVAL, "no target client");
	if (op != GMB_OP_PAUSE && op != GMB_OP_RESUME)
		return gmb__api_done(c, -EINVAL, "op must be GMB_OP_PAUSE or GMB_OP_RESUME");
	req.target = (char *)target;
	req.op = (Gmb__Op)op;
	req.tag = (char *)(tag ? tag : "");
	req.wait_ms = op == GMB_OP_RESUME ? query_wait(c) : 0;
	req.importers_follow = op == GMB_OP_PAUSE && c->mem.ipc_follow;
	env.body_case = GMB__ENVELOPE__BODY_CONTROL;
	env.control = &req;
	return query_call(c, &env);
}

GMB_API int gmb_trim(gmb_client *c, int device, uint64_t *released, uint64_t *pending)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__TrimRequest req = GMB__TRIM_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	if (device < -1)
		return gmb__api_done(c, -EINVAL, "device must be -1 (all) or an index");
	req.device = device;
	env.body_case = GMB__ENVELOPE__BODY_TRIM;
	env.trim = &req;
	rc = query_round_trip(c, &env, GMB__ENVELOPE__BODY_TRIM_REPLY, &rep, &last, err);
	if (rc == 0 && released)
		*released = last->trim_reply->released_bytes;
	if (rc == 0 && pending)
		*pending = last->trim_reply->pending_bytes;
	gmb__reply_deinit(&rep);
	return gmb__api_done(c, rc, err);
}

/* One line per step of @sr, then the total, as a malloc'd string. */
static char *query_switch_report(const Gmb__SwitchReply *sr)
{
	char *text = NULL, b1[SIZE_STR_MAX], b2[SIZE_STR_MAX];
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	for (size_t i = 0; i < sr->n_steps; i++) {
		const Gmb__SwitchStep *st = sr->steps[i];
		char what[WIRE_MAX_NAME + 16];

		if (st->tag && st->tag[0])
			snprintf(what, sizeof(what), "tag '%s'", st->tag);
		else
			snprintf(what, sizeof(what), "every tag");
		fprintf(f, "%s%-6s %s (#%" PRIu64 ") %s: %.3f ms%s%s\n", st->undo ? "undo " : "",
			st->op == GMB__OP__OP_PAUSE ? "pause" : "resume",
			st->client ? st->client : "", st->client_id, what, st->ms,
			st->status ? ": failed: " : "",
			st->status ?
				(st->error && *st->error ? st->error : gmb_strerror(st->status)) :
				"");
	}
	fprintf(f, "total %.3f ms; handed over %s, created %s\n", sr->total_ms,
		size_str(sr->handed_over_bytes, b1), size_str(sr->created_bytes, b2));
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

GMB_API int gmb_switch(gmb_client *c, const char *from, const char *to, const char *const *tags,
		       size_t ntags, char **report)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__SwitchRequest req = GMB__SWITCH_REQUEST__INIT;
	struct gmb__reply rep = GMB__REPLY_INIT;
	const Gmb__Envelope *last;
	char err[ERR_MSG_MAX] = "";
	int rc;

	if (!c)
		return -EINVAL;
	if (report)
		*report = NULL;
	if (!from || !*from || !to || !*to)
		return gmb__api_done(c, -EINVAL, "a switch needs FROM and TO");
	if (ntags && !tags)
		return gmb__api_done(c, -EINVAL, "no tags given for ntags > 0");
	req.from = (char *)from;
	req.to = (char *)to;
	req.n_tags = ntags;
	req.tags = (char **)tags;
	req.wait_ms = query_wait(c);
	env.body_case = GMB__ENVELOPE__BODY_SWITCH_REQ;
	env.switch_req = &req;
	rc = gmb__request(&c->conn, &env, &rep, err);
	last = rep.nparts ? rep.parts[rep.nparts - 1] : NULL;
	if (report && last && last->body_case == GMB__ENVELOPE__BODY_SWITCH_REPLY) {
		*report = query_switch_report(last->switch_reply);
		if (!*report && rc == 0)
			rc = err_fmt(err, -ENOMEM, "out of memory for the switch's report");
	}
	gmb__reply_deinit(&rep);
	return gmb__api_done(c, rc, err);
}

GMB_API int gmb_set_priority(gmb_client *c, const char *target, int priority)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__PriorityRequest req = GMB__PRIORITY_REQUEST__INIT;

	if (!c)
		return -EINVAL;
	if (!target || !*target)
		return gmb__api_done(c, -EINVAL, "no target client");
	req.target = (char *)target;
	req.priority = priority;
	env.body_case = GMB__ENVELOPE__BODY_PRIORITY;
	env.priority = &req;
	return query_call(c, &env);
}

GMB_API int gmb_watch(gmb_client *c)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__WatchRequest req = GMB__WATCH_REQUEST__INIT;

	if (!c)
		return -EINVAL;
	env.body_case = GMB__ENVELOPE__BODY_WATCH;
	env.watch = &req;
	return query_call(c, &env);
}

/* The oldest event, waited for under the lock; NULL on timeout or loss. */
static struct gmb__job *query_watch_take(struct gmb_client *c, int timeout_ms, uint64_t *lost)
{
	struct timespec until = deadline_in_ms(timeout_ms > 0 ? (uint64_t)timeout_ms : 0);
	struct gmb__job *ev;

	while (!c->conn.events && !c->conn.gone && timeout_ms != 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&c->conn.event_cond, &c->conn.lock);
		else if (pthread_cond_timedwait(&c->conn.event_cond, &c->conn.lock, &until) ==
			 ETIMEDOUT)
			break;
	}
	*lost = c->conn.events_lost;
	c->conn.events_lost = 0;
	ev = c->conn.events;
	if (ev) {
		c->conn.events = ev->next;
		if (!c->conn.events)
			c->conn.events_tail = &c->conn.events;
		c->conn.nevents--;
	}
	return ev;
}

GMB_API int gmb_watch_next(gmb_client *c, int timeout_ms, unsigned flags, char **line)
{
	Gmb__WatchEvent lost_ev = GMB__WATCH_EVENT__INIT;
	const Gmb__WatchEvent *we;
	struct gmb__job *ev;
	char msg[ERR_MSG_MAX];
	uint64_t lost;
	bool gone;
	int rc;

	if (!c || !line || (flags & ~(unsigned)GMB_WATCH_JSON))
		return -EINVAL;
	*line = NULL;
	pthread_mutex_lock(&c->conn.lock);
	ev = query_watch_take(c, timeout_ms, &lost);
	gone = c->conn.gone;
	snprintf(msg, sizeof(msg), "%s",
		 c->conn.lost_msg[0] ? c->conn.lost_msg : "the connection to gmbd is lost");
	pthread_mutex_unlock(&c->conn.lock);
	if (lost) {
		/* Said before the next event: the gap is where it happened. */
		char detail[96];

		snprintf(detail, sizeof(detail), "%" PRIu64 " events lost: read too slowly", lost);
		lost_ev.kind = "lost";
		lost_ev.count = lost;
		lost_ev.detail = detail;
		lost_ev.device = -1;
		rc = gmb__watch_format(&lost_ev, flags & GMB_WATCH_JSON, line);
		if (ev) {
			/* Back to the head of the queue, for the next call. */
			pthread_mutex_lock(&c->conn.lock);
			ev->next = c->conn.events;
			if (!c->conn.events)
				c->conn.events_tail = &ev->next;
			c->conn.events = ev;
			c->conn.nevents++;
			pthread_mutex_unlock(&c->conn.lock);
		}
		return rc < 0 ? rc : 1;
	}
	if (!ev)
		return gone ? gmb__api_done(c, -ENOTCONN, msg) : 0;
	we = ev->env->watch_event;
	rc = gmb__watch_format(we, flags & GMB_WATCH_JSON, line);
	gmb__envelope__free_unpacked(ev->env, NULL);
	free(ev);
	return rc < 0 ? rc : 1;
}
