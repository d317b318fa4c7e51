/*
 * status_json.c - a StatusReply as JSON, for programs.
 *
 * gmb__status_to_json() makes the document that `gmbctl status --json`
 * prints; gmb__objects_to_json() its named objects alone, as `gmbctl
 * objects --json` prints them. Both only read the reply and hand back one
 * malloc'd string, or -ENOMEM with nothing left allocated. Every string of
 * the reply goes through json_put_str() (sbuf.h): a client names itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/lib/api/sbuf.h"
#include "client/lib/api/status_json.h"
#include "proto/gmb.pb-c.h"

/*
 * Whether a list entry is there to print (NULL entries are skipped); puts the
 * comma before every printed entry but the first, counted in *@n.
 */
static bool json_list_next(struct sbuf *b, const void *item, size_t *n)
{
	if (!item)
		return false;
	if ((*n)++)
		sbuf_putc(b, ',');
	return true;
}

static void json_put_device(struct sbuf *b, const Gmb__DeviceInfo *d)
{
	sbuf_printf(b, "{\"index\":%" PRIu32 ",\"name\":", d->index);
	json_put_str(b, d->name);
	sbuf_printf(b,
		    ",\"total_bytes\":%" PRIu64 ",\"budget_bytes\":%" PRIu64
		    ",\"granularity\":%" PRIu64 ",\"pool_bytes\":%" PRIu64
		    ",\"used_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64
		    ",\"chunks_created\":%" PRIu64 ",\"chunks_released\":%" PRIu64
		    ",\"chunks_handed_over\":%" PRIu64,
		    d->total_bytes, d->budget_bytes, d->granularity, d->pool_bytes, d->used_bytes,
		    d->free_bytes, d->chunks_created, d->chunks_released, d->chunks_handed_over);
	/* The same facts under plain names, and the driver's view (null: unknown). */
	sbuf_printf(b,
		    ",\"held_bytes\":%" PRIu64 ",\"lent_bytes\":%" PRIu64 ",\"idle_bytes\":%" PRIu64
		    ",\"available_bytes\":%" PRIu64,
		    d->pool_bytes, d->used_bytes, d->free_bytes,
		    d->budget_bytes > d->used_bytes ? d->budget_bytes - d->used_bytes : 0);
	if (d->driver_known) {
		sbuf_printf(b, ",\"driver\":{\"source\":");
		json_put_str(b, d->driver_source);
		sbuf_printf(b,
			    ",\"total_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64
			    ",\"free_bytes\":%" PRIu64 "},\"outside_bytes\":%" PRIu64 "}",
			    d->driver_total_bytes, d->driver_used_bytes,
			    d->driver_total_bytes > d->driver_used_bytes ?
				    d->driver_total_bytes - d->driver_used_bytes :
				    0,
			    d->outside_bytes);
	} else {
		sbuf_puts(b, ",\"driver\":null,\"outside_bytes\":null}");
	}
}

static void json_put_tag(struct sbuf *b, const Gmb__TagInfo *t)
{
	sbuf_puts(b, "{\"name\":");
	json_put_str(b, t->name);
	sbuf_printf(b, ",\"device\":%" PRId32 ",\"state\":", t->device);
	json_put_str(b, t->state);
	sbuf_puts(b, ",\"mode\":");
	json_put_str(b, status_mode_name(t->mode));
	sbuf_printf(b, ",\"allocations\":%" PRIu32 ",\"bytes\":%" PRIu64 "}", t->allocations,
		    t->bytes);
}

static void json_put_client(struct sbuf *b, const Gmb__ClientInfo *c)
{
	size_t i, n = 0;

	sbuf_printf(b, "{\"id\":%" PRIu64 ",\"name\":", c->id);
	json_put_str(b, c->name);
	sbuf_printf(b,
		    ",\"pid\":%" PRId32 ",\"uid\":%" PRIu32 ",\"gid\":%" PRIu32
		    ",\"control\":%s,\"group\":",
		    c->pid, c->uid, c->gid, c->control ? "true" : "false");
	json_put_str(b, c->group);
	sbuf_printf(b, ",\"priority\":%" PRId32 ",\"preemptible\":%s,\"tags\":[", c->priority,
		    c->preemptible ? "true" : "false");
	for (i = 0; i < c->n_tags; i++)
		if (json_list_next(b, c->tags[i], &n))
			json_put_tag(b, c->tags[i]);
	sbuf_puts(b, "]}");
}

static void json_put_waiter(struct sbuf *b, const Gmb__WaiterInfo *w)
{
	sbuf_printf(b, "{\"client_id\":%" PRIu64 ",\"client\":", w->client_id);
	json_put_str(b, w->client);
	sbuf_printf(b, ",\"device\":%" PRIu32 ",\"kind\":", w->device);
	json_put_str(b, w->kind);
	sbuf_puts(b, ",\"tag\":");
	json_put_str(b, w->tag);
	sbuf_printf(b,
		    ",\"bytes\":%" PRIu64 ",\"priority\":%" PRId32 ",\"waited_ms\":%" PRIu64
		    ",\"left_ms\":%" PRIu64 "}",
		    w->bytes, w->priority, w->waited_ms, w->left_ms);
}

static void json_put_import(struct sbuf *b, const Gmb__ImportInfo *m)
{
	sbuf_printf(b, "{\"importer_id\":%" PRIu64 ",\"importer\":", m->importer_id);
	json_put_str(b, m->importer);
	sbuf_printf(b, ",\"importer_pid\":%" PRId32 ",\"owner_id\":%" PRIu64 ",\"owner\":",
		    m->importer_pid, m->owner_id);
	json_put_str(b, m->owner);
	sbuf_printf(b,
		    ",\"owner_pid\":%" PRId32 ",\"alloc_id\":%" PRIu64 ",\"device\":%" PRIu32
		    ",\"bytes\":%" PRIu64 ",\"opens\":%" PRIu32 ",\"owner_freed\":%s"
		    ",\"mapped\":%s,\"idle\":%s",
		    m->owner_pid, m->alloc_id, m->device, m->bytes, m->opens,
		    m->owner_freed ? "true" : "false", m->unmapped ? "false" : "true",
		    m->idle ? "true" : "false");
	/* A named object's version: its name and number; an allocation's
	 * import has neither (its document as before objects). */
	if (m->object && *m->object) {
		sbuf_puts(b, ",\"object\":");
		json_put_str(b, m->object);
		sbuf_printf(b, ",\"object_version\":%" PRIu64, m->object_version);
	}
	sbuf_putc(b, '}');
}

static void json_put_object_version(struct sbuf *b, const Gmb__ObjectVersionInfo *v)
{
	sbuf_printf(b,
		    "{\"version\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"device\":%" PRIu32
		    ",\"readers\":%" PRIu32 ",\"latest\":%s,\"published_ns\":%" PRIu64
		    ",\"publisher\":",
		    v->version, v->bytes, v->device, v->readers, v->latest ? "true" : "false",
		    v->published_ns);
	json_put_str(b, v->publisher);
	sbuf_printf(b, ",\"publisher_pid\":%" PRId32 ",\"meta_bytes\":%" PRIu32 "}",
		    v->publisher_pid, v->meta_bytes);
}

static void json_put_object(struct sbuf *b, const Gmb__ObjectInfo *o)
{
	size_t i, n = 0;

	sbuf_puts(b, "{\"name\":");
	json_put_str(b, o->name);
	/* Both always, true or false: a reader need not know that a missing
	 * key means false. "discarded" only while paused (a resume clears it). */
	sbuf_printf(b,
		    ",\"owner_uid\":%" PRIu32 ",\"latest\":%" PRIu64 ",\"bytes\":%" PRIu64
		    ",\"paused\":%s,\"discarded\":%s,\"grants\":[",
		    o->owner_uid, o->latest, o->bytes, o->paused ? "true" : "false",
		    o->paused && o->discarded ? "true" : "false");
	for (i = 0; o->grants && i < o->n_grants; i++)
		sbuf_printf(b, "%s%" PRIu32, i ? "," : "", o->grants[i]);
	sbuf_puts(b, "],\"versions\":[");
	for (i = 0; i < o->n_versions; i++)
		if (json_list_next(b, o->versions[i], &n))
			json_put_object_version(b, o->versions[i]);
	sbuf_puts(b, "]}");
}

/* "\"objects\":[...],\"objects_total\":N" of @st. */
static void json_put_objects(struct sbuf *b, const Gmb__StatusReply *st)
{
	size_t n = 0;

	sbuf_puts(b, "\"objects\":[");
	for (size_t i = 0; i < st->n_objects; i++)
		if (json_list_next(b, st->objects[i], &n))
			json_put_object(b, st->objects[i]);
	sbuf_printf(b, "],\"objects_total\":%" PRIu32, st->objects_total);
}

/**
 * gmb__status_to_json() - the broker's state as one JSON object.
 * @st:  the reply; only read. NULL entries in its lists are skipped.
 * @out: receives a malloc'd NUL-terminated string, owned by the caller;
 *       untouched on failure.
 *
 * Return: 0, -EINVAL for a NULL argument, or -ENOMEM (nothing allocated).
 */
int gmb__status_to_json(const Gmb__StatusReply *st, char **out)
{
	struct sbuf b = SBUF_INIT;
	size_t i, n = 0;

	if (!st || !out)
		return -EINVAL;
	sbuf_puts(&b, "{\"backend\":");
	json_put_str(&b, st->backend);
	sbuf_puts(&b, ",\"version\":");
	json_put_str(&b, st->version);
	sbuf_puts(&b, ",\"devices\":[");
	for (i = 0; i < st->n_devices; i++)
		if (json_list_next(&b, st->devices[i], &n))
			json_put_device(&b, st->devices[i]);
	sbuf_puts(&b, "],\"clients\":[");
	for (i = 0, n = 0; i < st->n_clients; i++)
		if (json_list_next(&b, st->clients[i], &n))
			json_put_client(&b, st->clients[i]);
	sbuf_puts(&b, "],\"waiters\":[");
	for (i = 0, n = 0; i < st->n_waiters; i++)
		if (json_list_next(&b, st->waiters[i], &n))
			json_put_waiter(&b, st->waiters[i]);
	sbuf_puts(&b, "],\"imports\":[");
	for (i = 0, n = 0; i < st->n_imports; i++)
		if (json_list_next(&b, st->imports[i], &n))
			json_put_import(&b, st->imports[i]);
	sbuf_printf(&b, "],\"imports_total\":%" PRIu32 ",", st->imports_total);
	json_put_objects(&b, st);
	sbuf_putc(&b, '}');
	return sbuf_steal(&b, out);
}

/**
 * gmb__objects_to_json() - the named objects alone, as `gmbctl objects
 * --json` prints them: {"objects":[...],"objects_total":N}, the same
 * entries as gmb__status_to_json()'s. Return: as it.
 */
int gmb__objects_to_json(const Gmb__StatusReply *st, char **out)
{
	struct sbuf b = SBUF_INIT;

	if (!st || !out)
		return -EINVAL;
	sbuf_putc(&b, '{');
	json_put_objects(&b, st);
	sbuf_putc(&b, '}');
	return sbuf_steal(&b, out);
}
