/*
 * test_restart.c - restart without loss through the fd-store protocol. The
 * test plays systemd (tests/fake_sd.c's fake manager): it holds gmbd's
 * listening socket, keeps what gmbd stores with FDSTORE=1 (a memfd per
 * chunk on the host backend, and the state), kills gmbd with SIGKILL while
 * real client processes (tests/prog_worker) hold memory, and starts it
 * again with those fds in LISTEN_FDS/LISTEN_FDNAMES, as systemd does.
 *
 * What must hold afterwards: the clients' memory kept its bytes and its
 * addresses, they carry on (libgmb reconnected and re-announced by itself),
 * status shows the same clients, tags and bytes, no memory was created; a
 * client that died meanwhile is reclaimed at once, one that does not come
 * back within the grace period then, and a claim gmbd did not grant is
 * refused.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/lib/api/client.h"
#include "common/wire.h"
#include "include/gmb.h"
#include "tests/util.h"
#include "tests/worker_assert.h"

#define MiB	(1024ULL * 1024)
#define WAIT_MS 10000

static struct sd_gmbd fx;

static const char *const gmbd_args[] = { "--host-memory", "64MiB",	    "--max-chunk",
					 "4MiB",	  "--rejoin-grace", "2",
					 "--log-level",	  "notice",	    NULL };

/* Starts gmbd with the listening socket and everything in the store. */
static void gmbd_up(void)
{
	cr_assert(eq(i32, sd_gmbd_up(&fx, gmbd_args, WAIT_MS), 0), "gmbd did not say READY=1");
}

/* SIGKILL, then every datagram it sent is read: the store is what it left. */
static void gmbd_kill(void)
{
	cr_assert(eq(i32, sd_gmbd_kill(&fx), 0));
}

static void setup(void)
{
	cr_assert(eq(i32, sd_gmbd_open(&fx, "/tmp/gmbrestart.XXXXXX", true), 0));
	gmbd_up();
}

static void teardown(void)
{
	sd_gmbd_close(&fx, SIGTERM);
}

TestSuite(restart, .init = setup, .fini = teardown, .timeout = 90);

Test(restart, sigkill_keeps_contents_addresses_and_status)
{
	char a_w[64], a_kv[64], a_act[64], now[64];
	struct worker w1, w2;
	char *before, *after;
	int chunks;

	worker_up_on(&w1, fx.gmbd.sock, "trainer");
	worker_ok(&w1, NULL, 0, "mode weights preserve");
	worker_ok(&w1, a_w, sizeof(a_w), "malloc weights 6291456");
	worker_ok(&w1, NULL, 0, "fill weights 0x5a");
	worker_ok(&w1, a_kv, sizeof(a_kv), "malloc kv 4194304");
	worker_ok(&w1, NULL, 0, "pause kv");
	worker_up_on(&w2, fx.gmbd.sock, "engine");
	worker_ok(&w2, a_act, sizeof(a_act), "malloc act 8388608");
	worker_ok(&w2, NULL, 0, "fill act 0x77");
	before = status_json_on(fx.gmbd.sock);
	/* act took kv's free chunk (same uid) and one new: 6 + 4 + 4 MiB held. */
	cr_assert(eq(i32,
		     fake_sd_wait_status(&fx.sd, "2 clients, 14.0 MiB lent of 14.0 MiB", WAIT_MS),
		     0),
		  "STATUS= says: %s", fx.sd.status);

	gmbd_kill();
	chunks = fake_sd_count(&fx.sd, "chunk.");
	/* 6 MiB = 4 + 2, kv's 4 (lent to act now), act's other 4: each kept. */
	cr_assert(eq(i32, chunks, 4));
	cr_assert(eq(i32, fake_sd_count(&fx.sd, "state"), 1));
	gmbd_up();

	/* A request waits for the reconnection, then carries on. */
	worker_ok(&w1, NULL, 0, "status");
	worker_ok(&w2, NULL, 0, "status");
	after = status_json_on(fx.gmbd.sock);
	cr_assert(eq(str, after, before), "status changed across the restart");
	cr_assert(eq(i32, fake_sd_count(&fx.sd, "chunk."), chunks), "memory was created");
	worker_ok(&w1, now, sizeof(now), "addr weights");
	cr_assert(eq(str, now, a_w));
	worker_ok(&w2, now, sizeof(now), "addr act");
	cr_assert(eq(str, now, a_act));
	worker_ok(&w1, NULL, 0, "check weights 0x5a");
	worker_ok(&w2, NULL, 0, "check act 0x77");

	/* And the memory still cycles, contents and all. */
	worker_ok(&w1, NULL, 0, "pause weights");
	worker_ok(&w1, NULL, 0, "resume weights");
	worker_ok(&w1, NULL, 0, "check weights 0x5a");
	worker_ok(&w1, now, sizeof(now), "addr weights");
	cr_assert(eq(str, now, a_w));
	worker_ok(&w1, NULL, 0, "resume kv");
	worker_ok(&w1, now, sizeof(now), "addr kv");
	cr_assert(eq(str, now, a_kv));
	worker_ok(&w2, NULL, 0, "free act");
	free(after);
	after = status_json_on(fx.gmbd.sock);
	/* weights 6 + kv 4 (it needed a new chunk: act had its old one). */
	cr_assert(eq(i64, json_i64(after, "used_bytes"), (int64_t)(10 * MiB)));
	free(before);
	free(after);
	cr_assert(eq(i32, worker_quit(&w1), 0));
	cr_assert(eq(i32, worker_quit(&w2), 0));
}

Test(restart, sigterm_hands_over_to_the_next_gmbd)
{
	struct worker w;
	char *before, *after;

	worker_up_on(&w, fx.gmbd.sock, "trainer");
	worker_ok(&w, NULL, 0, "mode weights preserve");
	worker_ok(&w, NULL, 0, "malloc weights 6291456");
	worker_ok(&w, NULL, 0, "fill weights 0x33");
	before = status_json_on(fx.gmbd.sock);
	kill(fx.gmbd.pid, SIGTERM);
	cr_assert(eq(i32, gmbd_wait(&fx.gmbd), 0), "gmbd did not exit cleanly");
	cr_assert(eq(i32, fake_sd_sync(&fx.sd), 0));
	cr_assert(ge(u32, fx.sd.stopping, 1), "no STOPPING=1");
	cr_assert(eq(i32, fake_sd_count(&fx.sd, "chunk."), 2), "a stop released the chunks");
	gmbd_up();
	/* Before anything else moves memory: the same document, counters included. */
	after = status_json_on(fx.gmbd.sock);
	cr_assert(eq(str, after, before));
	free(after);
	worker_ok(&w, NULL, 0, "pause weights");
	worker_ok(&w, NULL, 0, "resume weights");
	worker_ok(&w, NULL, 0, "check weights 0x33");
	free(before);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

static bool status_lacks(const char *name)
{
	char *json = status_json_on(fx.gmbd.sock);
	char pat[96];
	bool r;

	snprintf(pat, sizeof(pat), "\"name\":\"%s\"", name);
	r = !strstr(json, pat);
	free(json);
	return r;
}

static int lacks_silent(void *arg)
{
	return status_lacks("silent");
}

Test(restart, dead_and_silent_clients_are_reclaimed)
{
	struct worker w1, w2, w3;
	char out[512];
	char *json;

	worker_up_on(&w1, fx.gmbd.sock, "alive");
	worker_ok(&w1, NULL, 0, "malloc a 4194304");
	worker_up_on(&w2, fx.gmbd.sock, "dead");
	worker_ok(&w2, NULL, 0, "malloc b 4194304");
	worker_up_on(&w3, fx.gmbd.sock, "silent");
	worker_ok(&w3, NULL, 0, "malloc c 4194304");
	json = status_json_on(fx.gmbd.sock);
	cr_assert(not(eq(ptr, strstr(json, "\"name\":\"dead\""), NULL)), "%s", json);
	free(json);

	gmbd_kill();
	worker_kill(&w2);      /* dies while gmbd is down */
	kill(w3.pid, SIGSTOP); /* alive, but does not come back */
	gmbd_up();

	cr_assert(status_lacks("dead"), "a client whose process is gone was not reclaimed");
	cr_assert(not(status_lacks("silent")), "reclaimed before its grace period");
	worker_ok(&w1, NULL, 0, "status");
	cr_assert(eq(i32, wait_until(lacks_silent, NULL, WAIT_MS), 0),
		  "not reclaimed after the grace period");
	json = status_json_on(fx.gmbd.sock);
	cr_assert(eq(i64, json_i64(json, "used_bytes"), (int64_t)(4 * MiB)), "%s", json);
	free(json);

	/* Back too late: refused, and every call says so. */
	kill(w3.pid, SIGCONT);
	cr_assert(eq(i32, worker_cmd(&w3, out, sizeof(out), "status"), -ENOTCONN));
	cr_assert(not(eq(ptr, strstr(out, "no record"), NULL)), "%s", out);
	worker_ok(&w3, NULL, 0, "check c 0");
	cr_assert(eq(i32, worker_quit(&w3), 0));
	cr_assert(eq(i32, worker_quit(&w1), 0));
}

/* ---- claims gmbd did not grant, on a raw socket ---- */

static int raw_connect(void)
{
	int fd;

	cr_assert(eq(i32, wire_connect(fx.gmbd.sock, &fd), 0));
	return fd;
}

/* Sends @env as request 1 and returns the answer's status (-EPIPE: hung up). */
static int raw_ask(int fd, Gmb__Envelope *env, uint64_t id)
{
	Gmb__Envelope *rep = NULL;
	int fds[WIRE_MAX_FDS], nfds = 0, st;

	env->id = id;
	if (wire_send(fd, env, NULL, 0) < 0 || wire_recv(fd, &rep, fds, &nfds) < 0)
		return -EPIPE;
	wire_close_fds(fds, nfds);
	st = rep->status;
	if (st == 0 && rep->body_case == GMB__ENVELOPE__BODY_HELLO_REPLY &&
	    !rep->hello_reply->rejoined)
		st = -EBADMSG;
	gmb__envelope__free_unpacked(rep, NULL);
	return st;
}

static int raw_hello(int fd, uint64_t rejoin_id)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__Hello hello = GMB__HELLO__INIT;

	hello.version = GMB_PROTOCOL_VERSION;
	hello.name = "liar";
	hello.rejoin_id = rejoin_id;
	env.body_case = GMB__ENVELOPE__BODY_HELLO;
	env.hello = &hello;
	return raw_ask(fd, &env, 1);
}

/* Claims @a mapped over @ids, in tag "t". */
static int raw_claim(int fd, const struct gmb__alloc *a, uint64_t *ids, size_t n)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__RejoinRequest req = GMB__REJOIN_REQUEST__INIT;
	Gmb__RejoinTag tag = GMB__REJOIN_TAG__INIT, *ptag = &tag;
	Gmb__RejoinAlloc ra = GMB__REJOIN_ALLOC__INIT, *pra = &ra;

	tag.name = "t";
	ra.alloc_id = a->id;
	ra.tag = "t";
	ra.size = a->size;
	ra.mapped = true;
	ra.chunk_ids = ids;
	ra.n_chunk_ids = n;
	req.tags = &ptag;
	req.n_tags = 1;
	req.allocs = &pra;
	req.n_allocs = 1;
	req.last = true;
	env.body_case = GMB__ENVELOPE__BODY_REJOIN;
	env.rejoin = &req;
	return raw_ask(fd, &env, 2);
}

static const struct gmb__alloc *alloc_at(gmb_client *c, void *p)
{
	return idmap_get(&c->mem.tab.by_va, (uintptr_t)p);
}

Test(restart, claims_gmbd_did_not_grant_are_refused)
{
	const struct gmb__alloc *a, *b;
	struct worker w;
	gmb_client *liar;
	char *json;
	void *pa, *pb;
	uint64_t other;
	int fd;

	worker_up_on(&w, fx.gmbd.sock, "honest");
	worker_ok(&w, NULL, 0, "malloc h 4194304");
	/* An in-process client that does not rejoin by itself: the test does. */
	setenv("GMB_RECONNECT", "0", 1);
	cr_assert(eq(i32, gmb_connect(fx.gmbd.sock, "liar", &liar), 0));
	unsetenv("GMB_RECONNECT");
	cr_assert(eq(i32, gmb_malloc(liar, &pa, 4 * MiB, 0, "t"), 0));
	cr_assert(eq(i32, gmb_malloc(liar, &pb, 2 * MiB, 0, "t"), 0));
	a = alloc_at(liar, pa);
	b = alloc_at(liar, pb);
	json = status_json_on(fx.gmbd.sock);
	/* Clients are listed oldest first: "honest"'s id precedes its name. */
	other = (uint64_t)json_i64_after(json, "\"clients\"", "id");
	free(json);
	gmbd_kill();
	gmbd_up();

	fd = raw_connect();
	cr_assert(eq(i32, raw_hello(fd, 999), -ESTALE), "an id gmbd never had");
	close(fd);
	fd = raw_connect();
	cr_assert(eq(i32, raw_hello(fd, other), -EPERM), "another process's client");
	close(fd);
	/* Its own id, but allocation a over b's chunk: not what gmbd lent. */
	fd = raw_connect();
	cr_assert(eq(i32, raw_hello(fd, gmb_client_id(liar)), 0));
	cr_assert(eq(i32, raw_claim(fd, a, b->chunk_ids, b->nchunks), -EPERM));
	close(fd);
	cr_assert(status_lacks("liar"), "a refused claim leaves the client's memory lent");
	worker_ok(&w, NULL, 0, "status");
	json = status_json_on(fx.gmbd.sock);
	cr_assert(eq(i64, json_i64(json, "used_bytes"), (int64_t)(4 * MiB)), "%s", json);
	free(json);
	gmb_close(liar);
	cr_assert(eq(i32, worker_quit(&w), 0));
}
