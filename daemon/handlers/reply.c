/*
 * reply.c - what every handler uses: failure sentences, status replies,
 * the checks of names a client sends, the devices of a reply, the owner's
 * "record changed" hook, and which session speaks for which client.
 *
 * The client -> session map (handlers->conns) replaces a pointer in the
 * core's client: a session is entered when its hello registers a client or
 * its rejoin hello names an orphan, and leaves when it goes or its claim
 * ends without taking the orphan over.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "common/err.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/internal.h"
#include "daemon/transport/sess.h"

static bool handlers_utf8_ok(const char *s);

int handlers__fail(struct hreq *rq, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err_vfmt(rq->err, sizeof(rq->err), rc, fmt, ap);
	va_end(ap);
	return rc;
}

void handlers__reply_status(struct sess *s, uint64_t reply_to, int status, const char *err)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.reply_to = reply_to;
	env.status = status;
	if (status < 0)
		env.error = (char *)(err && *err ? err : strerror(-status));
	sess_send(s, &env);
}

int handlers__check_name(struct hreq *rq, const char *what, const char *name)
{
	if (strnlen(name, WIRE_MAX_NAME + 1) > WIRE_MAX_NAME)
		return handlers__fail(rq, -EINVAL, "%s is longer than %d bytes", what,
				      WIRE_MAX_NAME);
	if (!handlers_utf8_ok(name))
		return handlers__fail(rq, -EINVAL,
				      "%s is not UTF-8 text without control characters", what);
	return 0;
}

/* Well-formed UTF-8 (no overlong forms, surrogates or values past
 * U+10FFFF) without C0/C1 control characters: names end up in logs. */
static bool handlers_utf8_ok(const char *str)
{
	const unsigned char *p = (const unsigned char *)str;

	while (*p) {
		unsigned cp, n;

		if (*p < 0x80) {
			if (*p < 0x20 || *p == 0x7f)
				return false;
			p++;
			continue;
		}
		if (*p >= 0xc2 && *p <= 0xdf)
			n = 1, cp = *p & 0x1f;
		else if (*p >= 0xe0 && *p <= 0xef)
			n = 2, cp = *p & 0x0f;
		else if (*p >= 0xf0 && *p <= 0xf4)
			n = 3, cp = *p & 0x07;
		else
			return false;
		for (unsigned i = 1; i <= n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f))
			return false;
		p += n + 1;
	}
	return true;
}

/* The driver's view of device @d, when the backend can tell it. */
static void handlers_driver_view(const struct broker *br, int d, Gmb__DeviceInfo *di)
{
	struct backend *b = br->backend;
	uint64_t total = 0, used = 0;

	if (!b->ops->driver_mem || b->ops->driver_mem(b, d, &total, &used) < 0)
		return;
	/* The driver sees at least gmbd's own chunks (the host twin cannot
	 * tell the device of the chunks a restart handed back). */
	if (used < di->pool_bytes)
		used = di->pool_bytes;
	di->driver_known = true;
	di->driver_source = (char *)b->ops->driver_source;
	di->driver_total_bytes = total;
	di->driver_used_bytes = used;
	/* gmbd's chunks are part of what the driver counts as used. */
	di->outside_bytes = used > di->pool_bytes ? used - di->pool_bytes : 0;
}

void handlers__devices(const struct broker *br, Gmb__DeviceInfo *di, Gmb__DeviceInfo **pdi)
{
	for (int d = 0; d < br->ndevices; d++) {
		const struct pool *p = &br->pools[d];

		gmb__device_info__init(&di[d]);
		di[d].index = (uint32_t)d;
		di[d].name = (char *)br->backend->devices[d].name;
		di[d].uuid.data = (uint8_t *)br->backend->devices[d].uuid;
		di[d].uuid.len = sizeof(br->backend->devices[d].uuid);
		di[d].total_bytes = p->total;
		di[d].budget_bytes = p->budget;
		di[d].granularity = p->granularity;
		di[d].max_chunk_bytes = p->max_chunk;
		di[d].pool_bytes = p->held_bytes;
		di[d].used_bytes = p->lent_bytes;
		di[d].free_bytes = p->free_bytes;
		di[d].chunks_created = p->chunks_created;
		di[d].chunks_released = p->chunks_released;
		di[d].chunks_handed_over = p->chunks_handed_over;
		handlers_driver_view(br, d, &di[d]);
		pdi[d] = &di[d];
	}
}

void handlers__changed(struct handlers *h)
{
	if (h->changed)
		h->changed(h->changed_arg);
}

int handlers__conn_bind(struct handlers *h, struct sess *s, struct bclient *c)
{
	struct sess *old = idmap_get(&h->conns, c->id);

	if (old != s) {
		int r = idmap_put(&h->conns, c->id, s);

		if (r < 0)
			return r;
	}
	if (!c->orphan) {
		hconn_of(s)->client = c;
		sess_set_name(s, c->name, c->id);
	}
	return 0;
}

void handlers__conn_unbind(struct handlers *h, const struct bclient *c)
{
	idmap_del(&h->conns, c->id);
}

struct sess *handlers__conn_client(const struct handlers *h, const struct bclient *c)
{
	struct sess *s = idmap_get(&h->conns, c->id);

	return s && hconn_of(s)->client == c ? s : NULL;
}

struct sess *handlers_sess_of(const struct handlers *h, const struct bclient *c)
{
	return idmap_get(&h->conns, c->id);
}

const char *handlers__tag_log(const char *tag, char *buf)
{
	return tag[0] ? log_quote(tag, buf, LOG_QUOTE_MAX) : "*";
}

int handlers__not_connected(struct hreq *rq, const struct bclient *c)
{
	return handlers__fail(rq, -ENOENT,
			      "client '%s' (#%" PRIu64 ") is not connected now; it may be"
			      " reconnecting to gmbd",
			      c->name, c->id);
}

int handlers__send_chunk_fds(struct sess *s, const Gmb__Envelope *part, struct chunk *const *chunks,
			     size_t n)
{
	uint64_t ids[WIRE_MAX_FDS], sizes[WIRE_MAX_FDS];

	for (size_t off = 0; off < n;) {
		Gmb__Envelope env = *part;
		size_t k = n - off < WIRE_MAX_FDS ? n - off : WIRE_MAX_FDS;
		int r;

		for (size_t i = 0; i < k; i++) {
			ids[i] = chunks[off + i]->id;
			sizes[i] = chunks[off + i]->size;
		}
		env.more = true;
		env.n_fd_chunks = env.n_fd_sizes = k;
		env.fd_chunks = ids;
		env.fd_sizes = sizes;
		r = sess_send(s, &env);
		if (r < 0)
			return r;
		off += k;
	}
	return 0;
}
