/*
 * test_chaos.c - SIGKILL at random points, seeded (the seed is printed;
 * GMB_CHAOS_SEED replays one).
 *
 * gmbd: four preserve-mode workers (tests/prog_worker) get a batch of
 * alloc/fill/check/pause/resume/free commands each, and gmbd is killed a
 * random few milliseconds later, in the middle of them, then started again
 * with its stored fds as systemd would (the fake manager of tests/fake_sd.c,
 * as in test_restart.c). After every round: every command succeeded (the
 * library waited for gmbd and carried on), every active allocation has its
 * bytes and its first address, and status shows each tag's bytes and state
 * and a used total equal to the workers' active bytes.
 *
 * Workers: 100 workers are killed at random points of their own batch; after
 * each group every byte they held is back (status: nothing lent but the
 * bystander's, pool = used + free), the bystander's bytes are intact, and at
 * the end gmbd has the fds it had and exits cleanly.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/wire.h"
#include "include/gmb.h"
#include "tests/util.h"
#include "tests/worker_assert.h"

#define MiB	    (1024ULL * 1024)
#define WAIT_MS	    10000
#define NWORKERS    4
#define ROUNDS	    24
#define MAX_BATCH   8
#define KILL_GROUPS 25

static unsigned chaos_seed(void)
{
	const char *v = getenv("GMB_CHAOS_SEED");
	unsigned s = v && *v ? (unsigned)strtoul(v, NULL, 10) : (unsigned)time(NULL);

	cr_log_info("chaos seed %u (GMB_CHAOS_SEED=%u replays it)", s, s);
	return s;
}

/* A random delay of up to @max_us: where the kill lands. */
static void chaos_delay(unsigned *seed, unsigned max_us)
{
	struct timespec ts = { 0, (long)((unsigned)rand_r(seed) % max_us) * 1000 };

	nanosleep(&ts, NULL);
}

/* Commands written now, answers read later: gmbd dies in between. */
static void w_send(struct worker *w, const char *line)
{
	cr_assert(gt(i32, fprintf(w->in, "%s\n", line), 0));
	fflush(w->in);
}

static int w_answer(struct worker *w, char *text, size_t cap)
{
	/* A status answer is one line of the whole JSON document: room for it. */
	static char line[1 << 16];
	int rc;

	if (!fgets(line, sizeof(line), w->out))
		return -EPIPE;
	line[strcspn(line, "\n")] = 0;
	rc = atoi(line);
	snprintf(text, cap, "%s", strchr(line, ' ') ? strchr(line, ' ') + 1 : "");
	return rc;
}

/* ---- gmbd killed ---- */

static struct sd_gmbd fx;

static const char *const restart_args[] = {
	"--host-memory", "256MiB", "--max-chunk", "4MiB", "--rejoin-grace", "30",
	"--log-level",	 "err",	   NULL
};

static void gmbd_up(void)
{
	cr_assert(eq(i32, sd_gmbd_up(&fx, restart_args, WAIT_MS), 0), "gmbd did not say READY=1");
}

static void gmbd_kill(void)
{
	cr_assert(eq(i32, sd_gmbd_kill(&fx), 0));
}

static void restart_setup(void)
{
	cr_assert(eq(i32, sd_gmbd_open(&fx, "/tmp/gmbchaos.XXXXXX", true), 0));
	gmbd_up();
}

static void restart_teardown(void)
{
	sd_gmbd_close(&fx, SIGTERM);
}

/* What one worker holds, as the test knows it. */
struct model {
	struct worker w;
	char tag[16];
	bool paused;
	int nallocs;
	uint64_t bytes;
	char addr[64]; /* the first allocation's, "" when none */
	int byte;      /* what every allocation of the tag holds */
	char batch[MAX_BATCH][64];
	int nbatch;
};

static void batch_add(struct model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void batch_add(struct model *m, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m->batch[m->nbatch++], sizeof(m->batch[0]), fmt, ap);
	va_end(ap);
}

/* The next batch, from what the worker holds now; fill never follows a resume. */
static void batch_make(struct model *m, unsigned *seed)
{
	unsigned pick = (unsigned)rand_r(seed) % 3;
	uint64_t size = (1 + (unsigned)rand_r(seed) % 4) * 2 * MiB;
	int b2 = 1 + (unsigned)rand_r(seed) % 250;

	m->nbatch = 0;
	if (m->paused) {
		batch_add(m, "resume %s", m->tag);
		return;
	}
	if (m->nallocs >= 6)
		pick = 1;
	if (pick == 0) {
		if (m->nallocs)
			batch_add(m, "check %s %d", m->tag, m->byte);
		batch_add(m, "fill %s %d", m->tag, b2);
		batch_add(m, "malloc %s %llu", m->tag, (unsigned long long)size);
		batch_add(m, "fill %s %d", m->tag, b2);
		batch_add(m, "pause %s", m->tag);
	} else if (pick == 1) {
		batch_add(m, "free %s", m->tag);
		batch_add(m, "malloc %s %llu", m->tag, (unsigned long long)size);
		batch_add(m, "fill %s %d", m->tag, b2);
	} else {
		batch_add(m, "malloc %s %llu", m->tag, (unsigned long long)size);
		batch_add(m, "fill %s %d", m->tag, b2);
		batch_add(m, "status");
	}
}

/* Reads the batch's answers and follows them in the model. */
static void batch_read(struct model *m, unsigned seed, int round)
{
	for (int i = 0; i < m->nbatch; i++) {
		char text[1 << 16], verb[16];
		unsigned long long arg = 0;
		int rc = w_answer(&m->w, text, sizeof(text));

		cr_assert(eq(i32, rc, 0), "seed %u round %d: worker %s: '%s' failed: %s", seed,
			  round, m->tag, m->batch[i], text);
		sscanf(m->batch[i], "%15s %*s %llu", verb, &arg);
		if (!strcmp(verb, "malloc")) {
			if (!m->nallocs)
				snprintf(m->addr, sizeof(m->addr), "%.63s", text);
			m->nallocs++;
			m->bytes += arg;
		} else if (!strcmp(verb, "fill")) {
			m->byte = (int)arg;
		} else if (!strcmp(verb, "free")) {
			m->nallocs = 0;
			m->bytes = 0;
			m->addr[0] = 0;
		} else if (!strcmp(verb, "pause")) {
			m->paused = true;
		} else if (!strcmp(verb, "resume")) {
			m->paused = false;
		}
	}
}

static void wcmd_ok(struct model *m, char *out, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void wcmd_ok(struct model *m, char *out, size_t cap, const char *fmt, ...)
{
	char cmd[128], text[1 << 16];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	cr_assert(eq(i32, worker_cmd(&m->w, out ? out : text, out ? cap : sizeof(text), "%s", cmd),
		     0),
		  "'%s' failed: %s", cmd, out ? out : text);
}

/* Bytes and first address of every active worker; each tag's line in status. */
static void round_check(struct model *ms, unsigned seed, int round)
{
	char *json;
	uint64_t used = 0;

	/* A worker idle since before the kill rejoins on its own; a request
	 * of its own waits for that, then status lists it again. */
	for (int k = 0; k < NWORKERS; k++)
		wcmd_ok(&ms[k], NULL, 0, "status");
	json = status_json_on(fx.gmbd.sock);

	for (int k = 0; k < NWORKERS; k++) {
		struct model *m = &ms[k];
		char pat[32], addr[64];
		const char *at;

		if (!m->paused && m->nallocs) {
			wcmd_ok(m, NULL, 0, "check %s %d", m->tag, m->byte);
			wcmd_ok(m, addr, sizeof(addr), "addr %s", m->tag);
			cr_assert(eq(str, addr, m->addr), "seed %u round %d: %s moved", seed, round,
				  m->tag);
		}
		if (!m->paused)
			used += m->bytes;
		snprintf(pat, sizeof(pat), "\"name\":\"%s\"", m->tag);
		at = strstr(json, pat);
		cr_assert(not(eq(ptr, (void *)at, NULL)), "seed %u round %d: no tag %s in %s", seed,
			  round, m->tag, json);
		cr_assert(eq(i64, json_i64(at, "bytes"), (int64_t)m->bytes),
			  "seed %u round %d: tag %s: %s", seed, round, m->tag, json);
		cr_assert(eq(i32,
			     strncmp(strstr(at, "\"state\":\"") + 9,
				     m->paused ? "paused" : "active", 6),
			     0),
			  "seed %u round %d: tag %s: %s", seed, round, m->tag, json);
	}
	cr_assert(eq(i64, json_i64(json, "used_bytes"), (int64_t)used), "seed %u round %d: %s",
		  seed, round, json);
	free(json);
}

Test(chaos, gmbd_killed_at_random_points_loses_nothing, .init = restart_setup,
     .fini = restart_teardown, .timeout = 120)
{
	static struct model ms[NWORKERS];
	unsigned seed = chaos_seed(), rnd = seed;
	char cmd[64];

	for (int k = 0; k < NWORKERS; k++) {
		struct model *m = &ms[k];

		memset(m, 0, sizeof(*m));
		snprintf(m->tag, sizeof(m->tag), "t%d", k);
		cr_assert(eq(i32, worker_start(&m->w, fx.gmbd.sock), 0));
		snprintf(cmd, sizeof(cmd), "connect chaos%d", k);
		wcmd_ok(m, NULL, 0, "%s", cmd);
		wcmd_ok(m, NULL, 0, "mode %s preserve", m->tag);
		/* Every tag has memory from the start, so status lists it. */
		wcmd_ok(m, m->addr, sizeof(m->addr), "malloc %s %llu", m->tag, 2 * MiB);
		m->nallocs = 1, m->bytes = 2 * MiB;
		wcmd_ok(m, NULL, 0, "fill %s %d", m->tag, m->byte = 1 + k);
	}
	for (int round = 0; round < ROUNDS; round++) {
		for (int k = 0; k < NWORKERS; k++) {
			batch_make(&ms[k], &rnd);
			for (int i = 0; i < ms[k].nbatch; i++)
				w_send(&ms[k].w, ms[k].batch[i]);
		}
		chaos_delay(&rnd, 20000);
		gmbd_kill();
		gmbd_up();
		for (int k = 0; k < NWORKERS; k++)
			batch_read(&ms[k], seed, round);
		round_check(ms, seed, round);
	}
	for (int k = 0; k < NWORKERS; k++)
		cr_assert(eq(i32, worker_quit(&ms[k].w), 0));
}

/* ---- workers killed ---- */

static struct gmbd_proc gmbd;

static int fds_at_start;

static int fds_back(void *arg)
{
	return proc_count_fds(gmbd.pid) == fds_at_start;
}

/* Nothing lent but the bystander's 8 MiB, nothing of the dead in status. */
static int all_back(void *arg)
{
	char *json = status_json_on(gmbd.sock);
	int ok = json_i64(json, "used_bytes") == (int64_t)(8 * MiB) &&
		 json_i64(json, "pool_bytes") ==
			 json_i64(json, "used_bytes") + json_i64(json, "free_bytes") &&
		 !strstr(json, "\"name\":\"victim");

	free(json);
	return ok;
}

Test(chaos, workers_killed_at_random_points_give_every_byte_back, .timeout = 120)
{
	/* No warm pool: every byte a dead worker held goes back to the backend. */
	static const char *const args[] = { "--host-memory", "512MiB",	    "--max-chunk",
					    "4MiB",	     "--pool-keep", "0",
					    "--log-level",   "err",	    NULL };
	static const char *const script[] = {
		"mode w preserve", "malloc w 6291456",	"fill w 7",  "malloc kv 4194304",
		"pause w",	   "resume w",		"check w 7", "pause *",
		"resume kv",	   "malloc kv 8388608", "free kv",   "resume w",
		"free w",	   "malloc w 2097152"
	};
	unsigned seed = chaos_seed(), rnd = seed;
	struct model by = { .tag = "keep" };
	int kills = 0;

	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
	cr_assert(eq(i32, worker_start(&by.w, gmbd.sock), 0));
	wcmd_ok(&by, NULL, 0, "connect bystander");
	wcmd_ok(&by, NULL, 0, "mode keep preserve");
	wcmd_ok(&by, NULL, 0, "malloc keep %llu", 8 * MiB);
	wcmd_ok(&by, NULL, 0, "fill keep 60");
	fds_at_start = proc_count_fds(gmbd.pid);
	for (int g = 0; g < KILL_GROUPS; g++) {
		struct worker ws[NWORKERS];
		char line[64];

		for (int k = 0; k < NWORKERS; k++) {
			cr_assert(eq(i32, worker_start(&ws[k], gmbd.sock), 0));
			snprintf(line, sizeof(line), "connect victim%d", g * NWORKERS + k);
			w_send(&ws[k], line);
			for (size_t i = 0; i < sizeof(script) / sizeof(script[0]); i++)
				w_send(&ws[k], script[i]);
		}
		for (int k = 0; k < NWORKERS; k++) {
			chaos_delay(&rnd, 8000);
			worker_kill(&ws[k]);
			kills++;
		}
		cr_assert(eq(i32, wait_until(all_back, NULL, WAIT_MS), 0),
			  "seed %u group %d: the dead workers' memory did not come back", seed, g);
	}
	cr_assert(eq(i32, kills, 100));
	wcmd_ok(&by, NULL, 0, "check keep 60");
	wcmd_ok(&by, NULL, 0, "pause keep");
	wcmd_ok(&by, NULL, 0, "resume keep");
	wcmd_ok(&by, NULL, 0, "check keep 60");
	cr_assert(eq(i32, wait_until(fds_back, NULL, WAIT_MS), 0), "gmbd has %d fds, %d at start",
		  proc_count_fds(gmbd.pid), fds_at_start);
	cr_assert(eq(i32, worker_quit(&by.w), 0));
	cr_assert(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly (leak or crash)");
}
