/*
 * test_ipc_restart.c - CUDA IPC on gmbd memory across a restart of gmbd:
 * real tests/prog_preload processes under the shim (an exporter whose
 * memory is gmbd's, an importer), a real gmbd (host backend) played by the
 * fake service manager as test_restart.c does (listening socket kept, fd
 * store handed back, SIGKILL in between), and tests/prog_worker as a third
 * client that allocates everything there is.
 *
 * What must hold across the restart: the import goes on (its bytes, the
 * status rows, the owner's pause refused naming the importer, the close
 * giving the memory back); a freed or killed owner's chunks, before the
 * restart or after it, stay out of the pool until the importer closes, so
 * the third client never gets them; a handle taken before opens after it;
 * an import the importer no longer claims is dropped, and one gmbd has no
 * record of refuses the claim; imports that followed their owner's pause
 * come back unmapped (pinning nothing) and map again on its resume, and
 * grants come back with their exports. Used memory is back to zero after
 * each.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ipc_handle.h"
#include "common/wire.h"
#include "include/gmb.h"
#include "tests/ipc_fx.h"
#include "tests/util.h"
#include "tests/worker_assert.h"

#define WAIT_MS 10000

static struct sd_gmbd fx;

/* 16 MiB in 4 MiB chunks: an 8 MiB export and 8 MiB for everyone else. */
static const char *const gmbd_args[] = { "--host-devices", "1",		  "--host-memory",
					 "16MiB",	   "--max-chunk", "4MiB",
					 "--rejoin-grace", "5",		  "--log-level",
					 "info",	   NULL };

static void gmbd_up(void)
{
	cr_assert(eq(i32, sd_gmbd_up(&fx, gmbd_args, WAIT_MS), 0), "gmbd did not say READY=1");
}

static void gmbd_restart(void)
{
	cr_assert(eq(i32, sd_gmbd_kill(&fx), 0));
	cr_assert(eq(i32, fake_sd_count(&fx.sd, "state"), 1), "no record in the store");
	gmbd_up();
}

static void setup(void)
{
	cr_assert(not(eq(ptr, realpath(test_build_dir(), ipcfx_build), NULL)));
	cr_assert(eq(i32, sd_gmbd_open(&fx, "/tmp/gmbipcrs.XXXXXX", true), 0));
	ipcfx_sock = fx.gmbd.sock;
	gmbd_up();
}

static void teardown(void)
{
	sd_gmbd_close(&fx, SIGTERM);
}

TestSuite(ipc_restart, .init = setup, .fini = teardown, .timeout = 90);

/* ---- the programs (tests/ipc_fx.h) ---- */

static void prog_start(struct worker *w)
{
	ipcfx_prog(w, 0);
	cr_assert(eq(i32, worker_cmd(w, NULL, 0, "gmb"), 0), "libgmb not bound");
}

/* An exporter with 8 MiB of gmbd memory in tag "w" (two chunks) at @p, filled with @byte. */
static void exporter(struct worker *w, int byte, char p[32])
{
	ipcfx_exporter(w, 8 * MiB, byte, p);
}

/* An importer that mapped @h at @q. */
static void importer(struct worker *w, const char *h, char q[32])
{
	prog_start(w);
	ipcfx_open_handle(w, h, q);
}

/* The hex handle @h as bytes, decoded. */
static void handle_of(const char *h, struct ipc_handle *out)
{
	uint8_t b[IPC_HANDLE_SIZE];

	for (int i = 0; i < IPC_HANDLE_SIZE; i++) {
		unsigned v;

		cr_assert(eq(i32, sscanf(h + 2 * i, "%2x", &v), 1));
		b[i] = (uint8_t)v;
	}
	cr_assert(eq(i32, ipc_handle_decode(b, out), 0));
}

/* ---- status ---- */

static char *status(void)
{
	return status_json_on(fx.gmbd.sock);
}

static int64_t used(void)
{
	char *json = status();
	int64_t n = json_i64_after(json, "{\"index\":0,", "used_bytes");

	free(json);
	return n;
}

static bool status_has(const char *needle)
{
	char *json = status();
	bool r = strstr(json, needle) != NULL;

	free(json);
	return r;
}

static int owner_freed(void *arg)
{
	(void)arg;
	return status_has("\"owner_freed\":true");
}

/* gmbd's log (every gmbd of the test appends to it) holds @needle. */
static bool log_has(const char *needle)
{
	static char log[1 << 20];
	FILE *f = fopen(fx.gmbd.log, "r");
	size_t n;

	cr_assert(not(eq(ptr, f, NULL)));
	n = fread(log, 1, sizeof(log) - 1, f);
	log[n] = '\0';
	fclose(f);
	return strstr(log, needle) != NULL;
}

/* ---- the cases ---- */

Test(ipc_restart, an_import_survives_a_restart)
{
	struct worker a, b;
	char p[32], q[32], h[160], want[256];
	char *json;

	exporter(&a, 0x5a, p);
	ipcfx_get_handle(&a, p, h);
	importer(&b, h, q);
	gmbd_restart();

	/* Each call waits for its client's rejoin. */
	ipcfx_run(&a, 0, "status");
	ipcfx_run(&b, 0, "status");
	ipcfx_run(&b, 0, "check %s %llu 90", q, 8 * MiB);
	json = status();
	snprintf(want, sizeof(want),
		 "\"importer_pid\":%d,\"owner_id\":1,\"owner\":\"prog_preload-%d\"", (int)b.pid,
		 (int)a.pid);
	cr_assert(not(eq(ptr, strstr(json, want), NULL)), "the import is not listed: %s", json);
	cr_assert(
		not(eq(ptr,
		       strstr(json,
			      "\"opens\":1,\"owner_freed\":false,\"mapped\":true,\"idle\":false}],"
			      "\"imports_total\":1"),
		       NULL)),
		"%s", json);
	free(json);
	/* The owner's pause is refused, naming the importer; nothing moved. */
	cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "pause w"), -EBUSY));
	snprintf(want, sizeof(want), "client 'prog_preload-%d' (pid %d) has allocation", (int)b.pid,
		 (int)b.pid);
	cr_assert(log_has(want), "the refusal does not name the importer");
	ipcfx_run(&b, 0, "fill %s %llu 51", q, 1 * MiB);
	ipcfx_run(&a, 0, "check %s %llu 51", p, 1 * MiB);
	/* The close is the import's end at gmbd: the pause goes through now. */
	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(status_has("\"imports\":[],\"imports_total\":0"), "the close was not recorded");
	ipcfx_run(&a, 0, "pause w");
	cr_assert(eq(i64, used(), 0));
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, used(), 0));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

static pid_t gone_pid;

static int owner_gone(void *arg)
{
	char pat[64];

	(void)arg;
	snprintf(pat, sizeof(pat), "\"name\":\"prog_preload-%d\"", (int)gone_pid);
	return !status_has(pat);
}

/* @a lets go of its allocation at @p: SIGKILL (gmbd sees it go), or a free. */
static void owner_lets_go(struct worker *a, const char *p, bool kill)
{
	if (!kill) {
		ipcfx_run(a, 0, "free %s", p);
		return;
	}
	gone_pid = a->pid;
	worker_kill(a);
	cr_assert(eq(i32, wait_until(owner_gone, NULL, WAIT_MS), 0), "the owner was not removed");
}

/*
 * The owner lets go of an imported allocation (@kill: SIGKILL, else a
 * free), before the restart or after it: its 8 MiB stay out of the pool,
 * so a third client of the same uid that takes everything there is gets
 * the other 8 MiB and never the importer's chunks, until the close.
 */
static void owner_goes(bool kill, bool before)
{
	struct worker a, b, t;
	char p[32], q[32], h[160];

	exporter(&a, 0x5a, p);
	ipcfx_get_handle(&a, p, h);
	importer(&b, h, q);
	if (before)
		owner_lets_go(&a, p, kill);
	gmbd_restart();
	ipcfx_run(&b, 0, "status");
	if (!before) {
		ipcfx_run(&a, 0, "status");
		owner_lets_go(&a, p, kill);
	}

	worker_up_on(&t, fx.gmbd.sock, "taker");
	worker_ok(&t, NULL, 0, "malloc all 8388608");
	worker_ok(&t, NULL, 0, "fill all 0x11");
	cr_assert(eq(i32, worker_cmd(&t, NULL, 0, "malloc more 4194304"), -ENOMEM),
		  "the importer's chunks were lent again");
	ipcfx_run(&b, 0, "check %s %llu 90", q, 8 * MiB);
	cr_assert(owner_freed(NULL), "the import is not listed as kept for its importer");
	cr_assert(eq(i64, used(), (int64_t)(16 * MiB)));

	ipcfx_run(&b, 0, "ipcclose %s", q);
	cr_assert(eq(i64, used(), (int64_t)(8 * MiB)), "not back at the last close");
	worker_ok(&t, NULL, 0, "malloc more 8388608");
	worker_ok(&t, NULL, 0, "free all");
	worker_ok(&t, NULL, 0, "free more");
	cr_assert(eq(i64, used(), 0));
	cr_assert(status_has("\"imports\":[],\"imports_total\":0"));
	cr_assert(eq(i32, worker_quit(&t), 0));
	ipcfx_quit(&b);
	if (!kill)
		ipcfx_quit(&a);
}

Test(ipc_restart, an_owner_that_freed_before_the_restart_keeps_the_chunks_out)
{
	owner_goes(false, true);
}

Test(ipc_restart, an_owner_killed_before_the_restart_keeps_the_chunks_out)
{
	owner_goes(true, true);
}

Test(ipc_restart, an_owner_that_frees_after_the_restart_keeps_the_chunks_out)
{
	owner_goes(false, false);
}

Test(ipc_restart, an_owner_killed_after_the_restart_keeps_the_chunks_out)
{
	owner_goes(true, false);
}

Test(ipc_restart, a_handle_taken_before_the_restart_opens_after_it)
{
	struct worker a, b;
	char p[32], q[32], h[160], h2[160];

	exporter(&a, 0x3c, p);
	ipcfx_get_handle(&a, p, h);
	gmbd_restart();
	ipcfx_run(&a, 0, "status");
	/* The same bytes: gmbd kept its instance id and the export's token. */
	ipcfx_get_handle(&a, p, h2);
	cr_assert(eq(str, h2, h));
	importer(&b, h, q);
	ipcfx_run(&b, 0, "check %s %llu 60", q, 8 * MiB);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, used(), 0));
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}

/* ---- claims, by in-process importers that do not rejoin by themselves ---- */

static gmb_client *importer_here(const char *name, const char *h, void **q)
{
	uint8_t b[IPC_HANDLE_SIZE];
	gmb_client *c;

	for (int i = 0; i < IPC_HANDLE_SIZE; i++) {
		unsigned v;

		cr_assert(eq(i32, sscanf(h + 2 * i, "%2x", &v), 1));
		b[i] = (uint8_t)v;
	}
	setenv("GMB_RECONNECT", "0", 1);
	cr_assert(eq(i32, gmb_connect(fx.gmbd.sock, name, &c), 0));
	unsetenv("GMB_RECONNECT");
	cr_assert(eq(i32, gmb_ipc_open(c, b, -1, q), 0), "%s", gmb_last_error(c));
	return c;
}

/* Sends @env as request @id; the answer's status (-EPIPE: hung up). */
static int raw_ask(int fd, Gmb__Envelope *env, uint64_t id)
{
	Gmb__Envelope *rep = NULL;
	int fds[WIRE_MAX_FDS], nfds = 0, st;

	env->id = id;
	if (wire_send(fd, env, NULL, 0) < 0 || wire_recv(fd, &rep, fds, &nfds) < 0)
		return -EPIPE;
	wire_close_fds(fds, nfds);
	st = rep->status;
	gmb__envelope__free_unpacked(rep, NULL);
	return st;
}

/* Rejoins as client @id, claiming nothing but @imp (NULL: nothing at all). */
static int raw_rejoin(uint64_t id, Gmb__RejoinImport *imp)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__Hello hello = GMB__HELLO__INIT;
	Gmb__RejoinRequest req = GMB__REJOIN_REQUEST__INIT;
	int fd, rc;

	cr_assert(eq(i32, wire_connect(fx.gmbd.sock, &fd), 0));
	hello.version = GMB_PROTOCOL_VERSION;
	hello.name = "raw";
	hello.rejoin_id = id;
	env.body_case = GMB__ENVELOPE__BODY_HELLO;
	env.hello = &hello;
	rc = raw_ask(fd, &env, 1);
	if (rc == 0) {
		env = (Gmb__Envelope)GMB__ENVELOPE__INIT;
		req.imports = imp ? &imp : NULL;
		req.n_imports = imp ? 1 : 0;
		req.last = true;
		env.body_case = GMB__ENVELOPE__BODY_REJOIN;
		env.rejoin = &req;
		rc = raw_ask(fd, &env, 2);
	}
	close(fd);
	return rc;
}

Test(ipc_restart, an_import_not_claimed_is_dropped_and_one_not_recorded_refused)
{
	Gmb__RejoinImport ri = GMB__REJOIN_IMPORT__INIT;
	struct ipc_handle hd;
	struct worker a;
	gmb_client *gone, *liar;
	char p[32], h[160];
	void *q1, *q2;

	exporter(&a, 0x77, p);
	ipcfx_get_handle(&a, p, h);
	handle_of(h, &hd);
	gone = importer_here("closed-meanwhile", h, &q1);
	liar = importer_here("liar", h, &q2);
	gmbd_restart();
	ipcfx_run(&a, 0, "status");
	cr_assert(status_has("\"imports_total\":2"), "the imports were not restored");
	cr_assert(eq(i32, worker_cmd(&a, NULL, 0, "pause w"), -EBUSY));

	/* An export gmbd has no import of for this client, then another allocation. */
	ri.export_id = hd.gen + 1;
	ri.alloc_id = hd.alloc;
	ri.opens = 1;
	cr_assert(eq(i32, raw_rejoin(gmb_client_id(liar), &ri), -EPERM));
	cr_assert(status_has("\"imports_total\":1"), "a refused claim left its import");
	/* Closed while gmbd was down: it claims no import, and gmbd drops it. */
	cr_assert(eq(i32, raw_rejoin(gmb_client_id(gone), NULL), 0));
	cr_assert(status_has("\"imports\":[],\"imports_total\":0"), "an unclaimed import stayed");
	ipcfx_run(&a, 0, "pause w");
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, used(), 0));
	gmb_close(gone);
	gmb_close(liar);
	ipcfx_quit(&a);
}

Test(ipc_restart, a_claim_of_another_allocation_or_more_opens_is_refused)
{
	Gmb__RejoinImport ri = GMB__REJOIN_IMPORT__INIT;
	struct ipc_handle hd;
	struct worker a;
	gmb_client *c1, *c2;
	char p[32], h[160];
	void *q1, *q2;

	exporter(&a, 0x77, p);
	ipcfx_get_handle(&a, p, h);
	handle_of(h, &hd);
	c1 = importer_here("other-alloc", h, &q1);
	c2 = importer_here("more-opens", h, &q2);
	gmbd_restart();
	ri.export_id = hd.gen;
	ri.alloc_id = hd.alloc + 1;
	ri.opens = 1;
	cr_assert(eq(i32, raw_rejoin(gmb_client_id(c1), &ri), -EPERM));
	ri.alloc_id = hd.alloc;
	ri.opens = 2;
	cr_assert(eq(i32, raw_rejoin(gmb_client_id(c2), &ri), -EPERM));
	/* Refused claims reclaim their clients, imports and all. */
	cr_assert(status_has("\"imports\":[],\"imports_total\":0"));
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, used(), 0));
	gmb_close(c1);
	gmb_close(c2);
	ipcfx_quit(&a);
}

/* Another uid may reach gmbd's socket (its folder and the socket opened up). */
static void share_socket(void)
{
	cr_assert(eq(i32, chmod(fx.gmbd.dir, 0711), 0));
	cr_assert(eq(i32, chmod(fx.gmbd.sock, 0666), 0));
}

Test(ipc_restart, imports_that_followed_a_pause_and_grants_survive_a_restart)
{
	struct worker a, b, c, d;
	char p[32], q[32], r[32], q2[32], h[160];
	char *json;

	share_socket();
	ipcfx_exporter_mode(&a, 8 * MiB, 0x42, p, "preserve", "GMB_IPC_FOLLOW=1");
	ipcfx_run(&a, 0, "ipcgrant %s 65534", p);
	ipcfx_get_handle(&a, p, h);
	importer(&b, h, q);
	ipcfx_prog(&c, 65534);
	ipcfx_run(&c, 0, "gmb");
	ipcfx_open_handle(&c, h, r);
	/* Both follow the pause: the memory is back before the restart. */
	ipcfx_run(&a, 0, "pause w");
	cr_assert(eq(i64, used(), 0));
	gmbd_restart();
	share_socket();
	ipcfx_run(&a, 0, "status");
	ipcfx_run(&b, 0, "status");
	ipcfx_run(&c, 0, "status");
	json = status();
	cr_assert(eq(ptr, strstr(json, "\"mapped\":true"), NULL), "%s", json);
	cr_assert(not(eq(ptr, strstr(json, "\"imports_total\":2"), NULL)), "%s", json);
	free(json);
	cr_assert(eq(i64, used(), 0), "unmapped imports pin nothing after the restart either");
	/* Resumed: both map it again at the same addresses, the bytes kept. */
	ipcfx_run(&a, 0, "resume w");
	ipcfx_run(&b, 0, "check %s %llu 66", q, 8 * MiB);
	ipcfx_run(&c, 0, "check %s %llu 66", r, 8 * MiB);
	cr_assert(not(status_has("\"mapped\":false")), "both are mapped again");
	/* The grant came back with the export: a new process of that uid opens. */
	ipcfx_prog(&d, 65534);
	ipcfx_open_handle(&d, h, q2);
	ipcfx_run(&d, 0, "check %s %llu 66", q2, 8 * MiB);
	ipcfx_run(&d, 0, "ipcclose %s", q2);
	ipcfx_run(&c, 0, "ipcclose %s", r);
	ipcfx_run(&b, 0, "ipcclose %s", q);
	ipcfx_run(&a, 0, "free %s", p);
	cr_assert(eq(i64, used(), 0));
	ipcfx_quit(&d);
	ipcfx_quit(&c);
	ipcfx_quit(&b);
	ipcfx_quit(&a);
}
