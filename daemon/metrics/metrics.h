/*
 * metrics.h - gmbd's Prometheus metrics: counters and latency histograms
 * fed by the handlers' events, and gauges read from the broker when
 * scraped, rendered in the text exposition format 0.0.4. No socket here:
 * daemon/metrics/http.c serves what metrics_render() writes.
 */
#ifndef GMB_METRICS_H
#define GMB_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/core/event.h"

#define METRICS_NBUCKETS    12
/* Named objects with series of their own (uid, name labels), the newest. */
#define METRICS_MAX_OBJECTS 256

struct broker;

struct metrics_hist {
	uint64_t buckets[METRICS_NBUCKETS]; /* not cumulative; the last is +Inf */
	uint64_t count;
	double sum; /* seconds */
};

struct metrics {
	const struct broker *br; /* not owned */
	uint64_t events[EVENT_NKINDS];
	uint64_t refusals[EVENT_NREASONS];
	uint64_t to_host_bytes, from_host_bytes;
	struct metrics_hist pause, resume, control;
};

void metrics_init(struct metrics *m, const struct broker *br);
/* handlers->on_event: counts @ev (@arg is the struct metrics). */
void metrics_on_event(void *arg, const struct event *ev);
/**
 * metrics_render() - every metric, now, as exposition text.
 * *@out is malloc'd and the caller's (*@len bytes, NUL-terminated).
 * Return: 0 or -ENOMEM.
 */
int metrics_render(const struct metrics *m, char **out, size_t *len);

#endif
