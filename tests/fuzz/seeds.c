/*
 * seeds.c - writes the fuzz harnesses' seed corpora (make fuzz-seeds):
 * every packet made with protobuf-c from the same messages gmbd and libgmb
 * exchange, in each harness's input format (tests/fuzz/fuzz_*.c), and
 * records made by the real state_encode() of a real broker.
 *
 *   seeds DIR   writes the folders DIR/daemon, DIR/state and DIR/client
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/ipc_handle.h"
#include "common/log.h"
#include "common/wire.h"
#include "daemon/core/broker.h"
#include "daemon/core/lend.h"
#include "daemon/core/import.h"
#include "daemon/core/object.h"
#include "daemon/persist/state.h"
#include "include/gmb.h"

#define MiB (1ULL << 20)

struct seed {
	uint8_t buf[1 << 16];
	size_t len;
};

static const char *seeds_dir;
static uint64_t seeds_id;

static void seeds_write(const char *harness, const char *name, const struct seed *s)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", seeds_dir, harness);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", seeds_dir, harness, name);
	f = fopen(path, "wb");
	if (!f || fwrite(s->buf, 1, s->len, f) != s->len || fclose(f) != 0) {
		fprintf(stderr, "seeds: %s: %s\n", path, strerror(errno));
		exit(1);
	}
}

static void seeds_put(struct seed *s, const void *p, size_t n)
{
	if (s->len + n > sizeof(s->buf)) {
		fprintf(stderr, "seeds: a seed over %zu bytes\n", sizeof(s->buf));
		exit(1);
	}
	memcpy(s->buf + s->len, p, n);
	s->len += n;
}

/* One record: the op byte, then a length and the packed envelope. */
static void seeds_env(struct seed *s, unsigned op, const Gmb__Envelope *env)
{
	uint8_t b = (uint8_t)op, buf[WIRE_MAX_MSG], le[2];
	size_t n = gmb__envelope__pack(env, buf);

	le[0] = (uint8_t)n, le[1] = (uint8_t)(n >> 8);
	seeds_put(s, &b, 1);
	seeds_put(s, le, 2);
	seeds_put(s, buf, n);
}

static void seeds_op(struct seed *s, unsigned op, int arg)
{
	uint8_t b[2] = { (uint8_t)op, (uint8_t)arg };

	seeds_put(s, b, op == 4 || (op & 7) == 4 ? 2 : 1);
}

/* ---- daemon: client requests; op = socket << 3 (0: a packet) ---- */

static Gmb__Envelope seeds_req(Gmb__Envelope__BodyCase bc, void *body)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.id = ++seeds_id;
	env.body_case = bc;
	env.hello = body;
	return env;
}

/* One request with @body (a message of case @bc) on socket @sock. */
static void seeds_send(struct seed *s, int sock, Gmb__Envelope__BodyCase bc, void *body)
{
	Gmb__Envelope env = seeds_req(bc, body);

	seeds_env(s, (unsigned)sock << 3, &env);
}

static void d_hello(struct seed *s, int sock, const char *name, uint64_t rejoin, bool tool)
{
	Gmb__Hello h = GMB__HELLO__INIT;

	h.version = GMB_PROTOCOL_VERSION, h.name = (char *)name, h.control = !tool;
	h.tool = tool, h.rejoin_id = rejoin;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_HELLO, &h);
}

static void d_alloc(struct seed *s, int sock, uint32_t dev, uint64_t size, const char *tag)
{
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;

	a.device = dev, a.size = size, a.tag = (char *)tag;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_ALLOC, &a);
}

static void d_free(struct seed *s, int sock, uint64_t id)
{
	Gmb__FreeRequest f = GMB__FREE_REQUEST__INIT;

	f.alloc_id = id;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_FREE, &f);
}

static void d_mode(struct seed *s, int sock, const char *tag, Gmb__Mode mode)
{
	Gmb__TagModeRequest m = GMB__TAG_MODE_REQUEST__INIT;

	m.tag = (char *)tag, m.mode = mode;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_TAG_MODE, &m);
}

static void d_cycle(struct seed *s, int sock, const char *tag)
{
	Gmb__PauseRequest p = GMB__PAUSE_REQUEST__INIT;
	Gmb__ResumeRequest r = GMB__RESUME_REQUEST__INIT;

	p.tag = (char *)tag, r.tag = (char *)tag;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_PAUSE, &p);
	seeds_send(s, sock, GMB__ENVELOPE__BODY_RESUME, &r);
}

static void d_status(struct seed *s, int sock)
{
	Gmb__StatusRequest st = GMB__STATUS_REQUEST__INIT;

	seeds_send(s, sock, GMB__ENVELOPE__BODY_STATUS_REQ, &st);
}

static void d_trim(struct seed *s, int sock, int dev)
{
	Gmb__TrimRequest t = GMB__TRIM_REQUEST__INIT;

	t.device = dev;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_TRIM, &t);
}

static void d_control(struct seed *s, int sock, const char *target, Gmb__Op op, const char *tag)
{
	Gmb__ControlRequest c = GMB__CONTROL_REQUEST__INIT;

	c.target = (char *)target, c.op = op, c.tag = (char *)tag;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_CONTROL, &c);
}

/* The claim of the orphan fuzz_daemon.c restores (client 7). */
static void d_rejoin(struct seed *s, int sock, bool honest)
{
	Gmb__RejoinTag tw = GMB__REJOIN_TAG__INIT, tkv = GMB__REJOIN_TAG__INIT;
	Gmb__RejoinTag *tags[] = { &tw, &tkv };
	Gmb__RejoinAlloc a5 = GMB__REJOIN_ALLOC__INIT, a6 = GMB__REJOIN_ALLOC__INIT;
	Gmb__RejoinAlloc *allocs[] = { &a5, &a6 };
	Gmb__RejoinRequest r = GMB__REJOIN_REQUEST__INIT;
	uint64_t ids5[] = { 1, 2 }, ids6[] = { honest ? 3 : 4 }, held[] = { 1, 2, 3 };

	d_hello(s, sock, "orphan", 7, false);
	tw.name = "w", tw.mode = GMB__MODE__MODE_PRESERVE;
	tkv.name = "kv", tkv.paused = true;
	a5.alloc_id = 5, a5.tag = "w", a5.size = 4 * MiB, a5.mapped = true;
	a5.n_chunk_ids = 2, a5.chunk_ids = ids5;
	a6.alloc_id = 6, a6.tag = "kv", a6.size = 2 * MiB, a6.n_chunk_ids = 1, a6.chunk_ids = ids6;
	r.n_tags = 2, r.tags = tags, r.n_allocs = 2, r.allocs = allocs;
	r.n_held_chunk_ids = 3, r.held_chunk_ids = held, r.last = true;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_REJOIN, &r);
}

static void d_ipc_export(struct seed *s, int sock, uint64_t alloc, uint64_t offset)
{
	Gmb__IpcExportRequest e = GMB__IPC_EXPORT_REQUEST__INIT;

	e.alloc_id = alloc, e.offset = offset;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_EXPORT, &e);
}

/* A handle of @owner's allocation @alloc, export @gen; instance and token
 * zero: fuzz_daemon.c puts those of the last export in. @len < 64: cut. */
static void d_ipc_open(struct seed *s, int sock, uint64_t owner, uint64_t alloc, uint64_t gen,
		       uint64_t range_off, size_t len)
{
	Gmb__IpcOpenRequest o = GMB__IPC_OPEN_REQUEST__INIT;
	struct ipc_handle h = { .owner = owner, .alloc = alloc, .gen = gen, .range_off = range_off };
	uint8_t bytes[IPC_HANDLE_SIZE];

	ipc_handle_encode(&h, bytes);
	o.handle.data = bytes, o.handle.len = len;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_OPEN, &o);
}

static void d_ipc_close(struct seed *s, int sock, uint64_t export_id)
{
	Gmb__IpcCloseRequest c = GMB__IPC_CLOSE_REQUEST__INIT;

	c.export_id = export_id;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_CLOSE, &c);
}

/* A pause whose importers follow, then the resume and its IpcResumed. */
static void d_follow_cycle(struct seed *s, int sock, const char *tag)
{
	Gmb__PauseRequest p = GMB__PAUSE_REQUEST__INIT;
	Gmb__ResumeRequest r = GMB__RESUME_REQUEST__INIT;
	Gmb__IpcResumed d = GMB__IPC_RESUMED__INIT;

	p.tag = (char *)tag, p.importers_follow = true, r.tag = (char *)tag, d.tag = (char *)tag;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_PAUSE, &p);
	seeds_send(s, sock, GMB__ENVELOPE__BODY_RESUME, &r);
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_RESUMED, &d);
}

/* The importer maps export @export_id again (IpcOpenRequest.export_id). */
static void d_ipc_remap(struct seed *s, int sock, uint64_t export_id)
{
	Gmb__IpcOpenRequest o = GMB__IPC_OPEN_REQUEST__INIT;
	uint8_t bytes[IPC_HANDLE_SIZE] = { 0 };

	o.handle.data = bytes, o.handle.len = sizeof(bytes), o.export_id = export_id;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_OPEN, &o);
}

/* The importer's last close keeping it mapped (idle), then its reopen. */
static void d_ipc_keep(struct seed *s, int sock, uint64_t export_id)
{
	Gmb__IpcCloseRequest c = GMB__IPC_CLOSE_REQUEST__INIT;
	Gmb__IpcOpenRequest o = GMB__IPC_OPEN_REQUEST__INIT;
	uint8_t bytes[IPC_HANDLE_SIZE] = { 0 };

	c.export_id = export_id, c.keep = true;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_CLOSE, &c);
	o.handle.data = bytes, o.handle.len = sizeof(bytes), o.export_id = export_id;
	o.reopen = true;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_OPEN, &o);
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_CLOSE, &c);
}

static void d_ipc_grant(struct seed *s, int sock, uint64_t alloc, uint32_t uid, bool revoke)
{
	Gmb__IpcGrantRequest g = GMB__IPC_GRANT_REQUEST__INIT;

	g.alloc_id = alloc, g.uid = uid, g.revoke = revoke;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_IPC_GRANT, &g);
}

static void d_obj_publish(struct seed *s, int sock, const char *name, uint64_t alloc,
			  const char *meta)
{
	Gmb__ObjectPublishRequest p = GMB__OBJECT_PUBLISH_REQUEST__INIT;

	p.name = (char *)name, p.alloc_id = alloc;
	p.meta.data = (uint8_t *)meta, p.meta.len = strlen(meta);
	seeds_send(s, sock, GMB__ENVELOPE__BODY_OBJECT_PUBLISH, &p);
}

static void d_obj_open(struct seed *s, int sock, const char *name, uint64_t version)
{
	Gmb__ObjectOpenRequest o = GMB__OBJECT_OPEN_REQUEST__INIT;

	o.name = (char *)name, o.version = version;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_OBJECT_OPEN, &o);
}

static void d_obj_drop(struct seed *s, int sock, const char *name, uint64_t version)
{
	Gmb__ObjectDropRequest d = GMB__OBJECT_DROP_REQUEST__INIT;

	d.name = (char *)name, d.version = version;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_OBJECT_DROP, &d);
}

static void d_obj_grant(struct seed *s, int sock, const char *name, uint32_t uid, bool revoke)
{
	Gmb__ObjectGrantRequest g = GMB__OBJECT_GRANT_REQUEST__INIT;

	g.name = (char *)name, g.uid = uid, g.revoke = revoke;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_OBJECT_GRANT, &g);
}

static void d_obj_pause(struct seed *s, int sock, const char *name, bool resume, bool discard)
{
	Gmb__ObjectPauseRequest p = GMB__OBJECT_PAUSE_REQUEST__INIT;

	p.name = (char *)name, p.resume = resume, p.discard = discard;
	seeds_send(s, sock, GMB__ENVELOPE__BODY_OBJECT_PAUSE, &p);
}

/* Named objects: publish, a new version over a reader, opens, drops, grants, bad names. */
static void seeds_daemon_objects(void)
{
	struct seed s;

	s.len = 0;
	d_hello(&s, 0, "writer", 0, false);
	d_alloc(&s, 0, 0, 4 * MiB, "w");
	d_alloc(&s, 0, 0, 2 * MiB, "w");
	d_obj_publish(&s, 0, "weights", 10, "{\"a\": [0, \"bf16\", [4]]}");
	d_hello(&s, 1, "reader", 0, false);
	d_obj_open(&s, 1, "weights", 0);
	d_ipc_open(&s, 1, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	d_obj_publish(&s, 0, "weights", 11, "");
	d_obj_open(&s, 1, "weights", 1);
	d_obj_open(&s, 1, "weights", 7);
	d_ipc_open(&s, 1, 10, 11, 2, 0, IPC_HANDLE_SIZE);
	d_obj_grant(&s, 0, "weights", 4242, false);
	d_obj_grant(&s, 1, "0/weights", 4242, true);
	d_status(&s, 2);
	d_ipc_close(&s, 1, 1);
	d_obj_drop(&s, 0, "weights", 2);
	d_obj_drop(&s, 0, "weights", 0);
	d_obj_publish(&s, 0, "a/b/c", 10, "");
	d_obj_publish(&s, 0, "", 99, "");
	d_obj_open(&s, 1, "12345678901/x", 0);
	d_obj_drop(&s, 1, "nothing", 0);
	seeds_op(&s, 6 | (1 << 3), 0);
	d_status(&s, 2);
	seeds_write("daemon", "objects", &s);

	s.len = 0; /* paused under a reader that follows, resumed; discarded; refusals */
	d_hello(&s, 0, "writer", 0, false);
	d_alloc(&s, 0, 0, 4 * MiB, "w");
	d_obj_publish(&s, 0, "weights", 10, "");
	d_hello(&s, 1, "reader", 0, false);
	d_obj_open(&s, 1, "weights", 0);
	d_ipc_open(&s, 1, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	d_hello(&s, 2, "gmbctl", 0, true);
	d_obj_pause(&s, 2, "0/weights", false, false);
	seeds_op(&s, 4 | (1 << 3), 0);
	d_status(&s, 2);
	d_obj_open(&s, 1, "weights", 0);
	d_obj_pause(&s, 2, "0/weights", true, false);
	seeds_op(&s, 4 | (1 << 3), 0);
	d_ipc_remap(&s, 1, 1);
	d_obj_pause(&s, 2, "0/weights", false, true);
	seeds_op(&s, 4 | (1 << 3), (uint8_t)-EIO);
	d_obj_pause(&s, 0, "weights", false, true);
	d_obj_pause(&s, 0, "weights", true, false);
	d_obj_pause(&s, 1, "nothing", false, false);
	d_obj_drop(&s, 0, "weights", 0);
	seeds_write("daemon", "objects-pause", &s);
}

static void seeds_daemon(void)
{
	struct seed s;

	s.len = 0; /* one client's life: every request */
	d_hello(&s, 0, "trainer", 0, false);
	d_mode(&s, 0, "w", GMB__MODE__MODE_PRESERVE);
	d_alloc(&s, 0, 0, 4 * MiB, "w");
	d_alloc(&s, 0, 1, 6 * MiB, "kv");
	d_cycle(&s, 0, "");
	d_cycle(&s, 0, "kv");
	d_status(&s, 0);
	d_free(&s, 0, 10);
	d_trim(&s, 0, -1);
	d_free(&s, 0, 11);
	seeds_write("daemon", "life", &s);

	s.len = 0; /* the orphan comes back with its claim, then cycles */
	d_rejoin(&s, 0, true);
	d_cycle(&s, 0, "");
	d_free(&s, 0, 5);
	d_status(&s, 1);
	seeds_write("daemon", "rejoin", &s);

	s.len = 0; /* a claim gmbd did not grant */
	d_rejoin(&s, 1, false);
	seeds_write("daemon", "rejoin-refused", &s);

	s.len = 0; /* another uid's memory is not needed: the same uid, a full pool, drops */
	d_hello(&s, 0, "a", 0, false);
	d_hello(&s, 1, "b", 0, false);
	d_alloc(&s, 0, 0, 20 * MiB, "x");
	d_cycle(&s, 0, "x");
	d_mode(&s, 0, "x", GMB__MODE__MODE_ZERO);
	d_alloc(&s, 1, 0, 24 * MiB, "y");
	seeds_op(&s, 4, 0);
	seeds_op(&s, 7, 0);
	d_trim(&s, 1, 0);
	seeds_op(&s, 4, 0);
	d_alloc(&s, 1, 0, 64 * MiB, "y");
	seeds_write("daemon", "drops", &s);

	s.len = 0; /* an operator pauses and resumes a client */
	d_hello(&s, 0, "worker", 0, false);
	d_alloc(&s, 0, 0, 2 * MiB, "t");
	d_hello(&s, 1, "gmbctl", 0, true);
	d_control(&s, 1, "worker", GMB__OP__OP_PAUSE, "t");
	seeds_op(&s, 4, 0);
	d_control(&s, 1, "#1", GMB__OP__OP_RESUME, "");
	seeds_op(&s, 4, 0);
	d_control(&s, 1, "orphan", GMB__OP__OP_PAUSE, "");
	seeds_op(&s, 6 | (1 << 3), 0);
	d_status(&s, 1);
	seeds_write("daemon", "control", &s);

	s.len = 0; /* protocol errors: no hello, fds from a client, a hang-up */
	d_alloc(&s, 0, 0, 2 * MiB, "x");
	d_hello(&s, 1, "f", 0, false);
	{
		Gmb__StatusRequest st = GMB__STATUS_REQUEST__INIT;
		Gmb__Envelope env = seeds_req(GMB__ENVELOPE__BODY_STATUS_REQ, &st);

		seeds_env(&s, 5 | (1 << 3), &env);
	}
	d_hello(&s, 2, "g", 0, false);
	d_alloc(&s, 2, 0, 2 * MiB, "x");
	seeds_op(&s, 6 | (2 << 3), 0);
	seeds_write("daemon", "errors", &s);

	s.len = 0; /* memory shared: export, open twice, a refused pause, owner frees, close */
	d_hello(&s, 0, "trainer", 0, false);
	d_alloc(&s, 0, 0, 8 * MiB, "w");
	d_ipc_export(&s, 0, 10, 0);
	d_ipc_export(&s, 0, 10, 5 * MiB);
	d_hello(&s, 1, "engine", 0, false);
	d_ipc_open(&s, 1, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	d_ipc_open(&s, 1, 10, 10, 1, 4 * MiB, IPC_HANDLE_SIZE);
	d_cycle(&s, 0, "w");
	d_ipc_close(&s, 1, 1);
	d_free(&s, 0, 10);
	d_status(&s, 2);
	d_ipc_close(&s, 1, 1);
	d_ipc_close(&s, 1, 1);
	seeds_write("daemon", "ipc", &s);

	s.len = 0; /* handles that name nothing; an importer and an owner that hang up */
	d_hello(&s, 0, "trainer", 0, false);
	d_alloc(&s, 0, 0, 4 * MiB, "w");
	d_ipc_export(&s, 0, 10, 0);
	d_ipc_export(&s, 0, 99, 0);
	d_hello(&s, 1, "engine", 0, false);
	d_ipc_open(&s, 1, 10, 10, 2, 0, IPC_HANDLE_SIZE);
	d_ipc_open(&s, 1, 10, 10, 1, 0, 20);
	d_ipc_open(&s, 1, 10, 10, 1, 2 * MiB, IPC_HANDLE_SIZE);
	d_ipc_open(&s, 1, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	d_ipc_open(&s, 2, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	seeds_op(&s, 6 | (1 << 3), 0);
	d_ipc_close(&s, 2, 7);
	seeds_op(&s, 6 | (0 << 3), 0);
	d_hello(&s, 0, "late", 0, false);
	d_ipc_open(&s, 0, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	seeds_op(&s, 6 | (2 << 3), 0);
	seeds_write("daemon", "ipc-refused", &s);

	s.len = 0; /* importers that follow: unmap, the pause, the resume, map again; grants */
	d_hello(&s, 0, "trainer", 0, false);
	d_alloc(&s, 0, 0, 8 * MiB, "w");
	d_ipc_export(&s, 0, 10, 0);
	d_ipc_grant(&s, 0, 10, 4242, false);
	d_ipc_grant(&s, 0, 10, 4242, true);
	d_ipc_grant(&s, 0, 99, 4242, false);
	d_hello(&s, 1, "engine", 0, false);
	d_ipc_open(&s, 1, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	d_follow_cycle(&s, 0, "w");
	seeds_op(&s, 4 | (1 << 3), 0);
	d_ipc_remap(&s, 1, 1);
	seeds_op(&s, 4 | (1 << 3), 0);
	d_ipc_remap(&s, 1, 2);
	d_status(&s, 2);
	d_follow_cycle(&s, 0, "");
	seeds_op(&s, 4 | (1 << 3), (uint8_t)-EIO);
	d_ipc_close(&s, 1, 1);
	d_follow_cycle(&s, 0, "w");
	seeds_write("daemon", "ipc-follow", &s);

	s.len = 0; /* an import kept idle: the pause asks it back, so does the owner's free */
	d_hello(&s, 0, "trainer", 0, false);
	d_alloc(&s, 0, 0, 8 * MiB, "w");
	d_ipc_export(&s, 0, 10, 0);
	d_hello(&s, 1, "engine", 0, false);
	d_ipc_open(&s, 1, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	d_ipc_keep(&s, 1, 1);
	d_cycle(&s, 0, "w");
	seeds_op(&s, 4 | (1 << 3), 0);
	d_ipc_close(&s, 1, 1);
	d_cycle(&s, 0, "w");
	d_ipc_open(&s, 1, 10, 10, 1, 0, IPC_HANDLE_SIZE);
	d_ipc_keep(&s, 1, 1);
	d_free(&s, 0, 10);
	seeds_op(&s, 4 | (1 << 3), (uint8_t)-EBUSY);
	d_status(&s, 2);
	seeds_write("daemon", "ipc-keep", &s);
	seeds_daemon_objects();
}

/* ---- state: records ---- */

static void seeds_record(const char *name, const Gmb__State *st)
{
	struct seed s;

	s.len = gmb__state__pack(st, s.buf);
	seeds_write("state", name, &s);
}

/* By hand, over the harness's stored fds (ids 1-4: 2 MiB, device 0; 5-8: 4 MiB, device 1). */
static void seeds_state_crafted(void)
{
	Gmb__StateChunk ch[8], *pch[8];
	Gmb__StateAlloc a[3], *pa[3];
	Gmb__StateTag t[2], *pt0[1], *pt1[1];
	Gmb__StateClient cl[2], *pcl[2];
	Gmb__State st = GMB__STATE__INIT;
	uint64_t ids0[] = { 1, 2 }, ids1[] = { 0, 5 }, ids2[] = { 3 };
	uint32_t groups[] = { 27, 100 };

	for (int i = 0; i < 8; i++) {
		gmb__state_chunk__init(&ch[i]);
		ch[i].id = (uint64_t)i + 1, ch[i].device = i < 4 ? 0 : 1;
		ch[i].size = (i < 4 ? 2 : 4) * MiB, ch[i].uid = 1000 + (i & 1),
		ch[i].uid_set = i < 6;
		pch[i] = &ch[i];
	}
	for (int i = 0; i < 3; i++) {
		gmb__state_alloc__init(&a[i]);
		pa[i] = &a[i];
	}
	a[0].id = 11, a[0].size = 4 * MiB, a[0].active = true, a[0].n_chunk_ids = 2,
	a[0].chunk_ids = ids0;
	a[1].id = 12, a[1].device = 1, a[1].size = 8 * MiB, a[1].n_chunk_ids = 2,
	a[1].chunk_ids = ids1;
	a[2].id = 13, a[2].size = 2 * MiB, a[2].n_chunk_ids = 1, a[2].chunk_ids = ids2;
	gmb__state_tag__init(&t[0]);
	gmb__state_tag__init(&t[1]);
	t[0].name = "weights", t[0].mode = GMB__MODE__MODE_PRESERVE, t[0].n_allocs = 1;
	pt0[0] = &t[0], pt1[0] = &t[1];
	t[0].allocs = &pa[0];
	t[1].name = "kv", t[1].paused = true, t[1].n_allocs = 2, t[1].allocs = &pa[1];
	for (int i = 0; i < 2; i++) {
		gmb__state_client__init(&cl[i]);
		pcl[i] = &cl[i];
	}
	cl[0].id = 3, cl[0].name = "trainer", cl[0].pid = 4242, cl[0].uid = 1000, cl[0].gid = 1000;
	cl[0].control = true, cl[0].n_groups = 2, cl[0].groups = groups;
	cl[0].n_tags = 1, cl[0].tags = pt0;
	cl[1].id = 4, cl[1].name = "infer", cl[1].pid = 4243, cl[1].uid = 1001, cl[1].gid = 1001;
	cl[1].n_tags = 1, cl[1].tags = pt1;
	st.version = 1, st.backend = "host", st.next_chunk_id = 9, st.next_client_id = 5;
	st.next_alloc_id = 14, st.n_chunks = 8, st.chunks = pch, st.n_clients = 2, st.clients = pcl;
	seeds_record("two-clients", &st);
	st.n_clients = 0;
	seeds_record("pool-only", &st);
	st.n_clients = 2, st.backend = "cuda";
	seeds_record("other-backend", &st);
}

/*
 * The import table by hand, over the same stored fds: export 1 of a live
 * allocation imported by another client of the owner's uid, export 2 of a
 * freed one kept for two importers over its chunk, export 3 of a paused
 * allocation nobody imports. Fixed instance id and tokens, so that the
 * record is the same on every run.
 */
static void seeds_state_imports(void)
{
	Gmb__StateChunk ch[8], *pch[8];
	Gmb__StateAlloc a[2], *pa0[1], *pa1[1];
	Gmb__StateTag t[2], *pt[2];
	Gmb__StateClient cl[2], *pcl[2];
	Gmb__StateImport im[3], *pim1[1], *pim2[2];
	Gmb__StateExport ex[3], *pex[3];
	Gmb__State st = GMB__STATE__INIT;
	uint64_t ids_w[] = { 1 }, ids_kv[] = { 5 }, pinned1[] = { 1 }, pinned2[] = { 3 };
	uint8_t tokens[3][IPC_HANDLE_TOKEN];

	for (int i = 0; i < 8; i++) {
		gmb__state_chunk__init(&ch[i]);
		ch[i].id = (uint64_t)i + 1, ch[i].device = i < 4 ? 0 : 1;
		ch[i].size = (i < 4 ? 2 : 4) * MiB, ch[i].uid = 1000 + (i & 1),
		ch[i].uid_set = i < 6;
		pch[i] = &ch[i];
	}
	for (int i = 0; i < 2; i++) {
		gmb__state_alloc__init(&a[i]);
		gmb__state_tag__init(&t[i]);
		gmb__state_client__init(&cl[i]);
		pt[i] = &t[i], pcl[i] = &cl[i];
	}
	a[0].id = 11, a[0].size = 2 * MiB, a[0].active = true, a[0].n_chunk_ids = 1;
	a[0].chunk_ids = ids_w;
	a[1].id = 12, a[1].device = 1, a[1].size = 4 * MiB, a[1].n_chunk_ids = 1;
	a[1].chunk_ids = ids_kv;
	pa0[0] = &a[0], pa1[0] = &a[1];
	t[0].name = "weights", t[0].n_allocs = 1, t[0].allocs = pa0;
	t[1].name = "kv", t[1].paused = true, t[1].n_allocs = 1, t[1].allocs = pa1;
	cl[0].id = 3, cl[0].name = "trainer", cl[0].pid = 4242, cl[0].uid = 1000, cl[0].gid = 1000;
	cl[0].n_tags = 2, cl[0].tags = pt;
	cl[1].id = 5, cl[1].name = "reader", cl[1].pid = 4245, cl[1].uid = 1000, cl[1].gid = 1000;
	for (int i = 0; i < 3; i++) {
		gmb__state_import__init(&im[i]);
		gmb__state_export__init(&ex[i]);
		memset(tokens[i], 0x41 + i, sizeof(tokens[i]));
		ex[i].owner_id = 3, ex[i].owner = "trainer", ex[i].owner_pid = 4242;
		ex[i].owner_uid = 1000, ex[i].size = 2 * MiB;
		ex[i].token.data = tokens[i], ex[i].token.len = IPC_HANDLE_TOKEN;
	}
	im[0].importer_id = 5, im[0].opens = 1;
	im[1].importer_id = 5, im[1].opens = 2;
	im[2].importer_id = 3, im[2].opens = 1;
	pim1[0] = &im[0], pim2[0] = &im[1], pim2[1] = &im[2];
	ex[2].id = 1, ex[2].alloc_id = 11, ex[2].n_chunk_ids = 1, ex[2].chunk_ids = pinned1;
	ex[2].n_imports = 1, ex[2].imports = pim1;
	ex[1].id = 2, ex[1].alloc_id = 9, ex[1].n_chunk_ids = 1, ex[1].chunk_ids = pinned2;
	ex[1].n_imports = 2, ex[1].imports = pim2;
	ex[0].id = 3, ex[0].alloc_id = 12, ex[0].device = 1, ex[0].size = 4 * MiB;
	for (int i = 0; i < 3; i++)
		pex[i] = &ex[i];
	st.version = 1, st.backend = "host", st.next_chunk_id = 9, st.next_client_id = 6;
	st.next_alloc_id = 13, st.n_chunks = 8, st.chunks = pch, st.n_clients = 2, st.clients = pcl;
	st.import_instance = 0x1122334455667788ULL, st.import_next_export_id = 4;
	st.n_exports = 3, st.exports = pex;
	seeds_record("imports", &st);
}

/* What the real state_encode() writes for a real broker. The client is a
 * made-up process of root (not this one), so that the record is the
 * same on every run and every machine. */
/* A real broker's record with named objects: two versions of one, the
 * first kept for a reader, a grant; made-up root processes as above. */
static void seeds_state_objects(void)
{
	struct backend_host_opts ho = { .ndevices = 2, .memory = 32 * MiB, .granularity = 2 * MiB };
	struct broker_opts bo = { .max_chunk = 4 * MiB, .pool_keep = 0, .daemon_uid = 0 };
	struct broker_peer peer = { .pid = 4246, .uid = 0, .gid = 0 };
	struct broker_result res = BROKER_RESULT_INIT;
	struct bobject_version *v;
	struct import_export *ex;
	uint8_t h[IPC_HANDLE_SIZE];
	struct backend *be;
	struct broker *br;
	struct bclient *c, *r;
	struct seed s;
	uint64_t range;
	uint8_t *buf;
	size_t len;

	if (backend_host_open(&ho, &be) < 0 || broker_new(be, &bo, &br) < 0 ||
	    broker_client_add(br, &peer, "writer", true, false, &c) < 0)
		exit(1);
	peer.pid = 4247;
	if (broker_client_add(br, &peer, "reader", true, false, &r) < 0)
		exit(1);
	for (uint64_t id = 1; id <= 2; id++) {
		lend_alloc(br, c, 0, 2 * MiB, "w", &res, NULL);
		broker_result_deinit(&res);
		if (object_publish(br, c, "weights", id, (const uint8_t *)"meta", 4, &v, NULL) <
			    0 ||
		    lend_free(br, c, id, NULL) < 0)
			exit(1);
		v->published_ns = 1700000000000000000ULL + id; /* the same record every run */
		if (id == 1) {
			import_export_version_handle(br, v->ex, h);
			if (import_open(br, r, h, sizeof(h), &ex, &range, NULL) < 0)
				exit(1);
		}
	}
	object_grant(br, c, "weights", 4242, false, NULL);
	/* Instance and tokens are random: fixed here, as the crafted records have them. */
	br->imports->instance = 0x1122334455667788ULL;
	for (struct import_export *e = br->imports->exports; e; e = e->next)
		memset(e->token, 0x50 + (int)e->id, sizeof(e->token));
	if (state_encode(br, &buf, &len) < 0)
		exit(1);
	memcpy(s.buf, buf, len);
	s.len = len;
	seeds_write("state", "objects", &s);
	free(buf);
	broker_free(br);
	backend_close(be);
}

static void seeds_state_real(void)
{
	struct backend_host_opts ho = { .ndevices = 2, .memory = 32 * MiB, .granularity = 2 * MiB };
	struct broker_opts bo = { .max_chunk = 4 * MiB, .pool_keep = UINT64_MAX, .daemon_uid = 0 };
	struct broker_peer peer = { .pid = 4244, .uid = 0, .gid = 0 };
	struct broker_result res = BROKER_RESULT_INIT;
	struct backend *be;
	struct broker *br;
	struct bclient *c;
	struct seed s;
	uint8_t *buf;
	size_t len;

	if (backend_host_open(&ho, &be) < 0 || broker_new(be, &bo, &br) < 0 ||
	    broker_client_add(br, &peer, "real", true, false, &c) < 0)
		exit(1);
	/* Chunks 1-3: 2 MiB on device 0, 4-5: 4 MiB on device 1, as the
	 * harness's stored fds (ids 1-4 and 5-8) mostly agree. */
	broker_set_mode(br, c, "w", GMB_MODE_PRESERVE, NULL);
	for (int i = 0; i < 5; i++) {
		lend_alloc(br, c, i < 3 ? 0 : 1, (i < 3 ? 2 : 4) * MiB, i < 2 ? "w" : "kv", &res,
			   NULL);
		broker_result_deinit(&res);
	}
	lend_pause(br, c, "kv", false, NULL);
	lend_free(br, c, 1, NULL);
	if (state_encode(br, &buf, &len) < 0)
		exit(1);
	memcpy(s.buf, buf, len);
	s.len = len;
	seeds_write("state", "real", &s);
	free(buf);
	broker_free(br);
	backend_close(be);
}

/* ---- client: what gmbd answers, in fuzz_client.c's items ---- */

#define C_REPLY	  1
#define C_FDS	  2
#define C_AT_ONCE 4
#define C_HANG_UP 8

static void c_item(struct seed *s, unsigned flags, Gmb__Envelope *env)
{
	seeds_env(s, flags, env);
}

static void c_hello(struct seed *s, bool rejoined)
{
	Gmb__DeviceInfo dev = GMB__DEVICE_INFO__INIT, *pdev = &dev;
	Gmb__HelloReply hr = GMB__HELLO_REPLY__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	uint8_t uuid[16] = { 'h', 'o', 's', 't', 0 };

	dev.name = "host0", dev.total_bytes = 64 * MiB, dev.budget_bytes = 64 * MiB;
	dev.granularity = 2 * MiB, dev.uuid.len = 16, dev.uuid.data = uuid;
	hr.version = GMB_PROTOCOL_VERSION, hr.client_id = 3, hr.backend = "host";
	hr.n_devices = 1, hr.devices = &pdev, hr.rejoined = rejoined;
	env.body_case = GMB__ENVELOPE__BODY_HELLO_REPLY, env.hello_reply = &hr;
	c_item(s, C_REPLY, &env);
}

static void c_status(struct seed *s, int status)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.status = status;
	if (status)
		env.error = "refused by the seed";
	c_item(s, C_REPLY, &env);
}

static Gmb__Lend c_lend(uint64_t *ids, uint64_t *sizes)
{
	Gmb__Lend l = GMB__LEND__INIT;

	ids[0] = 11, ids[1] = 12, sizes[0] = sizes[1] = 2 * MiB;
	l.alloc_id = 20, l.size = 4 * MiB, l.n_chunk_ids = 2, l.chunk_ids = ids;
	l.n_chunk_sizes = 2, l.chunk_sizes = sizes;
	return l;
}

/* An AllocReply lending two chunks with their fds; @flags added to the item's. */
static void c_alloc(struct seed *s, unsigned flags)
{
	uint64_t ids[2], sizes[2];
	Gmb__Lend l = c_lend(ids, sizes);
	Gmb__AllocReply ar = GMB__ALLOC_REPLY__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	ar.lend = &l;
	env.body_case = GMB__ENVELOPE__BODY_ALLOC_REPLY, env.alloc_reply = &ar;
	env.n_fd_chunks = 2, env.fd_chunks = ids, env.n_fd_sizes = 2, env.fd_sizes = sizes;
	c_item(s, C_REPLY | C_FDS | flags, &env);
}

static void c_pause(struct seed *s)
{
	Gmb__PauseReply pr = GMB__PAUSE_REPLY__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	env.body_case = GMB__ENVELOPE__BODY_PAUSE_REPLY, env.pause_reply = &pr;
	c_item(s, C_REPLY, &env);
}

static void c_resume(struct seed *s, bool fds)
{
	uint64_t ids[2], sizes[2];
	Gmb__Lend l = c_lend(ids, sizes), *pl = &l;
	Gmb__ResumeReply rr = GMB__RESUME_REPLY__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	rr.n_lends = 1, rr.lends = &pl;
	env.body_case = GMB__ENVELOPE__BODY_RESUME_REPLY, env.resume_reply = &rr;
	if (fds)
		env.n_fd_chunks = 2, env.fd_chunks = ids, env.n_fd_sizes = 2, env.fd_sizes = sizes;
	c_item(s, C_REPLY | (fds ? C_FDS : 0), &env);
}

static void c_status_reply(struct seed *s)
{
	Gmb__DeviceInfo dev = GMB__DEVICE_INFO__INIT, *pdev = &dev;
	Gmb__TagInfo t = GMB__TAG_INFO__INIT, *pt = &t;
	Gmb__ClientInfo ci = GMB__CLIENT_INFO__INIT, *pci = &ci;
	Gmb__StatusReply sr = GMB__STATUS_REPLY__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	dev.name = "host0", dev.total_bytes = dev.budget_bytes = 64 * MiB;
	dev.granularity = 2 * MiB, dev.pool_bytes = dev.used_bytes = 4 * MiB;
	t.name = "w", t.state = "active", t.mode = GMB__MODE__MODE_PRESERVE;
	t.allocations = 1, t.bytes = 4 * MiB;
	ci.id = 3, ci.name = "fuzz", ci.pid = 1, ci.control = true, ci.n_tags = 1, ci.tags = &pt;
	sr.backend = "host", sr.version = "0.1.0", sr.n_devices = 1, sr.devices = &pdev;
	sr.n_clients = 1, sr.clients = &pci;
	env.body_case = GMB__ENVELOPE__BODY_STATUS_REPLY, env.status_reply = &sr;
	c_item(s, C_REPLY, &env);
}

static void c_drop(struct seed *s, uint64_t id)
{
	Gmb__DropRequest d = GMB__DROP_REQUEST__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	uint64_t ids[] = { id };

	d.n_chunk_ids = 1, d.chunk_ids = ids;
	env.id = 1000 + id, env.body_case = GMB__ENVELOPE__BODY_DROP, env.drop = &d;
	c_item(s, C_AT_ONCE, &env);
}

static void c_control(struct seed *s, Gmb__Op op)
{
	Gmb__ControlCommand cc = GMB__CONTROL_COMMAND__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;

	cc.op = op, cc.tag = "";
	env.id = 2000 + (uint64_t)op, env.body_case = GMB__ENVELOPE__BODY_CONTROL_CMD;
	env.control_cmd = &cc;
	c_item(s, C_AT_ONCE, &env);
}

static void c_rejoin_reply(struct seed *s)
{
	Gmb__RejoinReply rr = GMB__REJOIN_REPLY__INIT;
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	uint64_t drop[] = { 12 };

	rr.n_drop_chunk_ids = 1, rr.drop_chunk_ids = drop;
	env.body_case = GMB__ENVELOPE__BODY_REJOIN_REPLY, env.rejoin_reply = &rr;
	c_item(s, C_REPLY, &env);
}

static void seeds_client(void)
{
	struct seed s;

	s.len = 0; /* every call answered as gmbd answers it */
	c_hello(&s, false);
	c_status(&s, 0); /* tag mode */
	c_alloc(&s, 0);
	c_pause(&s);
	c_resume(&s, false);
	c_status_reply(&s);
	c_status(&s, 0); /* free */
	seeds_write("client", "life", &s);

	s.len = 0; /* gmbd asks for drops and pauses it from outside */
	c_hello(&s, false);
	c_status(&s, 0);
	c_alloc(&s, 0);
	c_drop(&s, 12);
	c_control(&s, GMB__OP__OP_PAUSE);
	c_pause(&s);
	c_resume(&s, true);
	c_control(&s, GMB__OP__OP_RESUME);
	c_status(&s, -ENOMEM);
	c_status(&s, 0);
	seeds_write("client", "drops-control", &s);

	s.len = 0; /* gmbd restarts after the alloc: rejoin, then on */
	c_hello(&s, false);
	c_status(&s, 0);
	c_alloc(&s, C_HANG_UP);
	c_hello(&s, true);
	c_rejoin_reply(&s);
	c_pause(&s);
	c_resume(&s, true);
	c_status_reply(&s);
	c_status(&s, 0);
	seeds_write("client", "restart", &s);

	s.len = 0; /* gmbd says Bye in the middle */
	c_hello(&s, false);
	c_status(&s, 0);
	c_alloc(&s, 0);
	{
		Gmb__Bye bye = GMB__BYE__INIT;
		Gmb__Envelope env = GMB__ENVELOPE__INIT;

		bye.reason = "stopping";
		env.body_case = GMB__ENVELOPE__BODY_BYE, env.bye = &bye;
		c_item(&s, C_AT_ONCE | C_HANG_UP, &env);
	}
	seeds_write("client", "bye", &s);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: seeds DIR\n");
		return 2;
	}
	log_max_level = LOG_LVL_ERR;
	seeds_dir = argv[1];
	mkdir(seeds_dir, 0755);
	seeds_daemon();
	seeds_state_crafted();
	seeds_state_imports();
	seeds_state_objects();
	seeds_state_real();
	seeds_client();
	return 0;
}
