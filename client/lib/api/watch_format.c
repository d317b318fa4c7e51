/*
 * watch_format.c - one event of gmbd's watch stream as one line (no
 * newline), as gmb_watch_next() hands it out: JSON under GMB_WATCH_JSON
 * (`gmbctl watch --json`), else text for people, the local time first,
 * then key=value for the fields the event has.
 *
 * Names, tags, reasons and details come from clients, so every string goes
 * through json_put_str() or term_put_str() (sbuf.h). The line is one
 * malloc'd string, or -ENOMEM with nothing left allocated.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "client/lib/api/sbuf.h"
#include "client/lib/api/status_json.h"
#include "common/size.h"
#include "proto/gmb.pb-c.h"

static void watch_json(struct sbuf *b, const Gmb__WatchEvent *e)
{
	sbuf_puts(b, "{\"kind\":");
	json_put_str(b, e->kind);
	sbuf_printf(b, ",\"time_ns\":%" PRIu64 ",\"client_id\":%" PRIu64 ",\"client\":", e->time_ns,
		    e->client_id);
	json_put_str(b, e->client);
	sbuf_printf(b, ",\"pid\":%" PRId32 ",\"tag\":", e->pid);
	json_put_str(b, e->tag);
	sbuf_printf(b,
		    ",\"device\":%" PRId32 ",\"bytes\":%" PRIu64 ",\"duration_ns\":%" PRIu64
		    ",\"reason\":",
		    e->device, e->bytes, e->duration_ns);
	json_put_str(b, e->reason);
	sbuf_puts(b, ",\"request\":");
	json_put_str(b, e->request);
	sbuf_printf(b, ",\"status\":%" PRId32 ",\"actor\":", e->status);
	json_put_str(b, e->actor);
	sbuf_printf(b, ",\"count\":%" PRIu64 ",\"detail\":", e->count);
	json_put_str(b, e->detail);
	sbuf_putc(b, '}');
}

/* " key=value", the value terminal-safe and quoted when it has a space. */
static void watch_kv(struct sbuf *b, const char *key, const char *v)
{
	bool q = !*v || strchr(v, ' ') || strchr(v, '"');

	sbuf_printf(b, " %s=%s", key, q ? "\"" : "");
	term_put_str(b, v);
	if (q)
		sbuf_putc(b, '"');
}

static void watch_text(struct sbuf *b, const Gmb__WatchEvent *e)
{
	time_t sec = (time_t)(e->time_ns / 1000000000u);
	char tbuf[32], sz[SIZE_STR_MAX];
	struct tm tm;

	localtime_r(&sec, &tm);
	strftime(tbuf, sizeof(tbuf), "%H:%M:%S", &tm);
	sbuf_printf(b, "%s.%03u ", tbuf, (unsigned)(e->time_ns / 1000000u % 1000u));
	term_put_str(b, e->kind);
	if (e->client && *e->client) {
		watch_kv(b, "client", e->client);
		sbuf_printf(b, " id=%" PRIu64 " pid=%" PRId32, e->client_id, e->pid);
	}
	if (e->request && *e->request)
		watch_kv(b, "request", e->request);
	if (e->tag && *e->tag)
		watch_kv(b, "tag", e->tag);
	else if (!strcmp(e->kind, "pause") || !strcmp(e->kind, "resume"))
		sbuf_puts(b, " tag=*");
	if (e->device >= 0)
		sbuf_printf(b, " device=%" PRId32, e->device);
	if (e->bytes)
		sbuf_printf(b, " bytes=%s", size_str(e->bytes, sz));
	if (e->duration_ns)
		sbuf_printf(b, " took=%.3fms", (double)e->duration_ns / 1e6);
	if (e->reason && *e->reason)
		watch_kv(b, "reason", e->reason);
	if (e->status)
		sbuf_printf(b, " status=%" PRId32, e->status);
	if (e->actor && *e->actor)
		watch_kv(b, "by", e->actor);
	if (e->count)
		sbuf_printf(b, " count=%" PRIu64, e->count);
	if (e->detail && *e->detail) {
		sbuf_puts(b, ": ");
		term_put_str(b, e->detail);
	}
}

int gmb__watch_format(const Gmb__WatchEvent *ev, bool json, char **out)
{
	struct sbuf b = SBUF_INIT;

	if (!ev || !out)
		return -EINVAL;
	if (json)
		watch_json(&b, ev);
	else
		watch_text(&b, ev);
	return sbuf_steal(&b, out);
}
