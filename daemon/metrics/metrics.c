/*
 * metrics.c - counting events and writing the exposition text
 * (https://prometheus.io/docs/instrumenting/exposition_formats/, 0.0.4):
 * each family once with its HELP and TYPE, label values escaped (\\, \",
 * \n), histogram buckets cumulative with le="+Inf" equal to _count.
 *
 * Gauges are read from the broker at scrape time, so they are never stale;
 * counters only grow while gmbd runs (a restart starts them at 0, which
 * Prometheus's rate() handles as a counter reset).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/broker.h"
#include "daemon/core/object.h"
#include "daemon/core/walk.h"
#include "daemon/metrics/metrics.h"

/* Upper bounds in seconds; the last bucket is +Inf. */
static const double metrics_bounds[METRICS_NBUCKETS - 1] = {
	0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10,
};

/* The text under construction; err is sticky (0 or -ENOMEM). */
struct mbuf {
	char *buf;
	size_t len, cap;
	int err;
};

static void mbuf_printf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void metrics_init(struct metrics *m, const struct broker *br)
{
	*m = (struct metrics){ .br = br };
}

static void metrics_observe(struct metrics_hist *h, uint64_t ns)
{
	double s = (double)ns / 1e9;
	int i = 0;

	while (i < METRICS_NBUCKETS - 1 && s > metrics_bounds[i])
		i++;
	h->buckets[i]++;
	h->count++;
	h->sum += s;
}

void metrics_on_event(void *arg, const struct event *ev)
{
	struct metrics *m = arg;

	if ((unsigned)ev->kind < EVENT_NKINDS)
		m->events[ev->kind]++;
	switch (ev->kind) {
	case EVENT_PAUSE:
		metrics_observe(&m->pause, ev->duration_ns);
		m->to_host_bytes += ev->to_host_bytes;
		break;
	case EVENT_RESUME:
		metrics_observe(&m->resume, ev->duration_ns);
		m->from_host_bytes += ev->from_host_bytes;
		break;
	case EVENT_CONTROL:
		metrics_observe(&m->control, ev->duration_ns);
		break;
	case EVENT_REFUSED:
		if ((unsigned)ev->reason < EVENT_NREASONS)
			m->refusals[ev->reason]++;
		break;
	default:
		break;
	}
}

/* ---- the text ---- */

static void mbuf_printf(struct mbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->buf ? b->buf + b->len : NULL, b->buf ? b->cap - b->len : 0, fmt,
			      ap);
		va_end(ap);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if (b->buf && (size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap : 4096;
		char *p;

		while (cap < b->len + (size_t)n + 1)
			cap *= 2;
		p = realloc(b->buf, cap);
		if (!p) {
			b->err = -ENOMEM;
			return;
		}
		b->buf = p;
		b->cap = cap;
	}
}

/* A label value: backslash, double quote and newline escaped. */
static void mbuf_label(struct mbuf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			mbuf_printf(b, "\\\\");
		else if (*s == '"')
			mbuf_printf(b, "\\\"");
		else if (*s == '\n')
			mbuf_printf(b, "\\n");
		else
			mbuf_printf(b, "%c", *s);
	}
}

static void metrics_family(struct mbuf *b, const char *name, const char *type, const char *help)
{
	mbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metrics_dev_labels(struct mbuf *b, const struct broker *br, int d)
{
	mbuf_printf(b, "{device=\"%d\",name=\"", d);
	mbuf_label(b, br->backend->devices[d].name);
	mbuf_printf(b, "\"}");
}

static uint64_t metrics_pool_value(const struct pool *p, int which)
{
	switch (which) {
	case 0:
		return p->budget;
	case 1:
		return p->held_bytes;
	case 2:
		return p->lent_bytes;
	default:
		return p->free_bytes;
	}
}

static void metrics_devices(struct mbuf *b, const struct broker *br)
{
	static const char *const names[][2] = {
		{ "gmbd_device_budget_bytes", "Most memory gmbd holds on the device." },
		{ "gmbd_device_held_bytes", "Memory gmbd holds on the device, lent or free." },
		{ "gmbd_device_lent_bytes", "Memory gmbd lends to clients now." },
		{ "gmbd_device_pool_free_bytes", "Memory gmbd holds and does not lend." },
	};
	struct backend *be = br->backend;
	uint64_t total[BACKEND_MAX_DEVICES], used[BACKEND_MAX_DEVICES];
	bool known[BACKEND_MAX_DEVICES];

	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		metrics_family(b, names[k][0], "gauge", names[k][1]);
		for (int d = 0; d < br->ndevices; d++) {
			mbuf_printf(b, "%s", names[k][0]);
			metrics_dev_labels(b, br, d);
			mbuf_printf(b, " %" PRIu64 "\n", metrics_pool_value(&br->pools[d], (int)k));
		}
	}
	for (int d = 0; d < br->ndevices; d++) {
		known[d] = be->ops->driver_mem &&
			   be->ops->driver_mem(be, d, &total[d], &used[d]) == 0;
		/* As in status: the driver sees at least gmbd's own chunks. */
		if (known[d] && used[d] < br->pools[d].held_bytes)
			used[d] = br->pools[d].held_bytes;
	}
	metrics_family(b, "gmbd_device_driver_total_bytes", "gauge",
		       "The device's memory as its driver reports it.");
	for (int d = 0; d < br->ndevices; d++)
		if (known[d]) {
			mbuf_printf(b, "gmbd_device_driver_total_bytes");
			metrics_dev_labels(b, br, d);
			mbuf_printf(b, " %" PRIu64 "\n", total[d]);
		}
	metrics_family(b, "gmbd_device_outside_bytes", "gauge",
		       "Memory the driver counts as used that gmbd does not hold.");
	for (int d = 0; d < br->ndevices; d++)
		if (known[d]) {
			uint64_t held = br->pools[d].held_bytes;

			mbuf_printf(b, "gmbd_device_outside_bytes");
			metrics_dev_labels(b, br, d);
			mbuf_printf(b, " %" PRIu64 "\n", used[d] > held ? used[d] - held : 0);
		}
}

static void metrics_tag_labels(struct mbuf *b, const struct bclient *c, const struct btag *t)
{
	mbuf_printf(b, "{client=\"");
	mbuf_label(b, c->name);
	mbuf_printf(b, "\",client_id=\"%" PRIu64 "\",tag=\"", c->id);
	mbuf_label(b, t->name);
	mbuf_printf(b, "\"}");
}

static int metrics_count_client(void *arg, const struct bclient *c)
{
	(void)c;
	(*(uint32_t *)arg)++;
	return 0;
}

static int metrics_tag_bytes(void *arg, const struct btag *t)
{
	struct mbuf *b = arg;

	mbuf_printf(b, "gmbd_tag_bytes");
	metrics_tag_labels(b, t->client, t);
	mbuf_printf(b, " %" PRIu64 "\n", t->bytes);
	return 0;
}

static int metrics_tag_paused(void *arg, const struct btag *t)
{
	struct mbuf *b = arg;

	mbuf_printf(b, "gmbd_tag_paused");
	metrics_tag_labels(b, t->client, t);
	mbuf_printf(b, " %d\n", t->paused ? 1 : 0);
	return 0;
}

static void metrics_tags(struct mbuf *b, const struct broker *br)
{
	static const struct walk_ops count = { .client = metrics_count_client };
	static const struct walk_ops bytes = { .tag = metrics_tag_bytes };
	static const struct walk_ops paused = { .tag = metrics_tag_paused };
	uint32_t clients = 0;

	walk_tree(br, &count, &clients);
	metrics_family(b, "gmbd_clients", "gauge", "Clients connected (tools not counted).");
	mbuf_printf(b, "gmbd_clients %" PRIu32 "\n", clients);
	metrics_family(b, "gmbd_tag_bytes", "gauge",
		       "Bytes of a client's tag, lent (active) or to be lent again (paused).");
	walk_tree(br, &bytes, b);
	metrics_family(b, "gmbd_tag_paused", "gauge", "1 while a client's tag is paused, else 0.");
	walk_tree(br, &paused, b);
}

/* ---- named objects ---- */

struct metrics_obj_walk {
	struct mbuf *b;
	const char *name; /* the family */
	int which;	  /* 0 bytes, 1 versions, 2 readers, 3 paused */
	uint32_t n;	  /* series written */
};

static uint64_t metrics_obj_value(const struct bobject *obj, int which)
{
	uint64_t readers = 0;

	if (which == 0)
		return object_bytes(obj);
	if (which == 1)
		return obj->nversions;
	if (which == 3)
		return obj->paused ? 1 : 0;
	for (const struct bobject_version *v = obj->versions; v; v = v->next)
		readers += object_version_readers(v);
	return readers;
}

static int metrics_obj_count(void *arg, const struct bobject *obj)
{
	(void)obj;
	(*(uint64_t *)arg)++;
	return 0;
}

/* One series of @obj; the walk stops past METRICS_MAX_OBJECTS. */
static int metrics_obj_series(void *arg, const struct bobject *obj)
{
	struct metrics_obj_walk *w = arg;

	if (w->n++ >= METRICS_MAX_OBJECTS)
		return 1;
	mbuf_printf(w->b, "%s{uid=\"%u\",name=\"", w->name, (unsigned)obj->uid);
	mbuf_label(w->b, obj->name);
	mbuf_printf(w->b, "\"} %" PRIu64 "\n", metrics_obj_value(obj, w->which));
	return 0;
}

/*
 * Each object's series are labelled by its owner's uid and its name: one
 * series an object, at most METRICS_MAX_OBJECTS of them a family (the
 * newest objects), so that a uid publishing names without end cannot grow
 * the scrape without bound; gmbd_objects counts every object.
 */
static void metrics_objects(struct mbuf *b, const struct broker *br)
{
	static const char *const names[][2] = {
		{ "gmbd_object_bytes",
		  "Bytes a named object's versions hold, every one still kept." },
		{ "gmbd_object_versions",
		  "Versions of a named object still kept (its latest, and older ones readers hold)." },
		{ "gmbd_object_readers", "Opens of a named object's versions by clients now." },
		{ "gmbd_object_paused",
		  "1 while a named object is paused (its bytes off the device), else 0." },
	};
	uint64_t n = 0;

	object_walk(br, metrics_obj_count, &n);
	metrics_family(b, "gmbd_objects", "gauge", "Named objects gmbd keeps.");
	mbuf_printf(b, "gmbd_objects %" PRIu64 "\n", n);
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		struct metrics_obj_walk w = { .b = b, .name = names[k][0], .which = (int)k };

		metrics_family(b, names[k][0], "gauge", names[k][1]);
		object_walk(br, metrics_obj_series, &w);
	}
}

static void metrics_counters(struct mbuf *b, const struct metrics *m)
{
	static const struct {
		enum event_kind k;
		const char *name, *help;
	} rows[] = {
		{ EVENT_PAUSE, "gmbd_pauses_total",
		  "Pauses of a tag (or of every tag) that unlent memory." },
		{ EVENT_RESUME, "gmbd_resumes_total", "Resumes that lent memory again." },
		{ EVENT_ALLOC, "gmbd_allocations_total", "Allocations lent." },
		{ EVENT_FREE, "gmbd_frees_total", "Allocations freed." },
		{ EVENT_CONNECTED, "gmbd_connections_total", "Clients that connected." },
		{ EVENT_DROP, "gmbd_drop_requests_total",
		  "Requests to clients to drop cached handles." },
		{ EVENT_IMPORT, "gmbd_imports_total",
		  "Opens of another client's allocation (CUDA IPC)." },
		{ EVENT_IMPORT_CLOSE, "gmbd_import_closes_total",
		  "Closes of such an open (CUDA IPC)." },
		{ EVENT_IMPORT_UNMAP, "gmbd_import_unmaps_total",
		  "Imports unmapped to follow their owner's pause (CUDA IPC)." },
		{ EVENT_IMPORT_MAP, "gmbd_import_remaps_total",
		  "Imports mapped again after their owner's resume (CUDA IPC)." },
		{ EVENT_OBJECT_PUBLISH, "gmbd_object_publishes_total",
		  "Versions of named objects published." },
		{ EVENT_OBJECT_DROP, "gmbd_object_drops_total",
		  "Drops of a named object's version, or of a whole object." },
		{ EVENT_OBJECT_PAUSE, "gmbd_object_pauses_total",
		  "Pauses of a named object (its readers unmapped, its memory given back)." },
		{ EVENT_OBJECT_RESUME, "gmbd_object_resumes_total",
		  "Resumes of a named object (its bytes back, its readers mapped again)." },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		metrics_family(b, rows[i].name, "counter", rows[i].help);
		mbuf_printf(b, "%s %" PRIu64 "\n", rows[i].name, m->events[rows[i].k]);
	}
	metrics_family(b, "gmbd_refusals_total", "counter", "Requests gmbd refused, by reason.");
	for (int r = 0; r < EVENT_NREASONS; r++)
		mbuf_printf(b, "gmbd_refusals_total{reason=\"%s\"} %" PRIu64 "\n",
			    event_reason_name((enum event_reason)r), m->refusals[r]);
	metrics_family(b, "gmbd_host_copy_bytes_total", "counter",
		       "Bytes of PRESERVE tags copied between device and host by clients.");
	mbuf_printf(b, "gmbd_host_copy_bytes_total{direction=\"to_host\"} %" PRIu64 "\n",
		    m->to_host_bytes);
	mbuf_printf(b, "gmbd_host_copy_bytes_total{direction=\"from_host\"} %" PRIu64 "\n",
		    m->from_host_bytes);
}

static void metrics_hist(struct mbuf *b, const char *name, const char *help,
			 const struct metrics_hist *h)
{
	uint64_t cum = 0;

	metrics_family(b, name, "histogram", help);
	for (int i = 0; i < METRICS_NBUCKETS - 1; i++) {
		cum += h->buckets[i];
		mbuf_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, metrics_bounds[i], cum);
	}
	cum += h->buckets[METRICS_NBUCKETS - 1];
	mbuf_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
	mbuf_printf(b, "%s_sum %.9g\n%s_count %" PRIu64 "\n", name, h->sum, name, h->count);
}

int metrics_render(const struct metrics *m, char **out, size_t *len)
{
	struct mbuf b = { 0 };

	metrics_devices(&b, m->br);
	metrics_tags(&b, m->br);
	metrics_objects(&b, m->br);
	metrics_counters(&b, m);
	metrics_hist(&b, "gmbd_pause_duration_seconds",
		     "A client's pause at gmbd, from its request to the reply.", &m->pause);
	metrics_hist(
		&b, "gmbd_resume_duration_seconds",
		"A client's resume at gmbd, from its request to the reply (waits for memory included).",
		&m->resume);
	metrics_hist(
		&b, "gmbd_control_duration_seconds",
		"An operator's pause or resume of another client, from the request to the answer.",
		&m->control);
	if (b.err) {
		free(b.buf);
		return b.err;
	}
	*out = b.buf;
	*len = b.len;
	return 0;
}
