/*
 * loadgen.c - see loadgen.h.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/gmb.h"
#include "tests/loadgen.h"

#define LOADGEN_ALLOC	   (2u << 20)
#define LOADGEN_MAX_ALLOCS 4

struct loadgen_alloc {
	uint64_t *p;
	int tag; /* 0: kv (discard), 1: w (preserve) */
	uint64_t mark;
};

struct loadgen_client {
	struct loadgen *g;
	unsigned index;
	gmb_client *c;
	struct loadgen_alloc allocs[LOADGEN_MAX_ALLOCS];
	int nallocs;
	int paused[2];
	unsigned rnd;
	uint64_t done, failed, bad;
};

static const char *const loadgen_tags[2] = { "kv", "w" };

static void loadgen_fail(struct loadgen_client *lc, const char *what, int rc)
{
	struct loadgen *g = lc->g;

	lc->failed++;
	pthread_mutex_lock(&g->lock);
	if (!g->first_error[0])
		snprintf(g->first_error, sizeof(g->first_error), "client %u: %s: %s (%s)",
			 lc->index, what, gmb_strerror(rc), lc->c ? gmb_last_error(lc->c) : "");
	pthread_mutex_unlock(&g->lock);
}

static void loadgen_call(struct loadgen_client *lc, const char *what, int rc)
{
	if (rc < 0)
		loadgen_fail(lc, what, rc);
	else
		lc->done++;
}

/* False when no call could be made (both tags paused, or full). */
static bool loadgen_alloc(struct loadgen_client *lc)
{
	int tag = (int)(rand_r(&lc->rnd) & 1);
	struct loadgen_alloc *a = &lc->allocs[lc->nallocs];
	void *p;
	int rc;

	if (lc->paused[tag])
		tag = !tag;
	if (lc->paused[tag] || lc->nallocs == LOADGEN_MAX_ALLOCS)
		return false;
	rc = gmb_malloc(lc->c, &p, LOADGEN_ALLOC, 0, loadgen_tags[tag]);
	loadgen_call(lc, "gmb_malloc", rc);
	if (rc < 0)
		return true;
	a->p = p;
	a->tag = tag;
	a->mark = ((uint64_t)lc->index << 32) | lc->done;
	a->p[0] = a->mark;
	a->p[LOADGEN_ALLOC / 8 - 1] = ~a->mark;
	lc->nallocs++;
	return true;
}

static bool loadgen_free(struct loadgen_client *lc)
{
	int i;

	if (lc->nallocs == 0)
		return false;
	i = (int)((unsigned)rand_r(&lc->rnd) % (unsigned)lc->nallocs);
	loadgen_call(lc, "gmb_free", gmb_free(lc->c, lc->allocs[i].p));
	lc->allocs[i] = lc->allocs[--lc->nallocs];
	return true;
}

static void loadgen_check(struct loadgen_client *lc, int tag)
{
	for (int i = 0; i < lc->nallocs; i++) {
		const struct loadgen_alloc *a = &lc->allocs[i];

		if (a->tag == tag && tag == 1 &&
		    (a->p[0] != a->mark || a->p[LOADGEN_ALLOC / 8 - 1] != ~a->mark))
			lc->bad++;
	}
}

static void loadgen_cycle(struct loadgen_client *lc, bool pause)
{
	int tag = (int)(rand_r(&lc->rnd) & 1);
	int rc;

	if (pause) {
		rc = gmb_pause(lc->c, loadgen_tags[tag]);
		loadgen_call(lc, "gmb_pause", rc);
		lc->paused[tag] |= rc == 0;
		return;
	}
	rc = gmb_resume(lc->c, loadgen_tags[tag]);
	loadgen_call(lc, "gmb_resume", rc);
	if (rc == 0 && lc->paused[tag]) {
		lc->paused[tag] = 0;
		loadgen_check(lc, tag);
	}
}

static void loadgen_status(struct loadgen_client *lc)
{
	char *json = NULL;
	int rc = gmb_status_json(lc->c, &json);

	loadgen_call(lc, "gmb_status_json", rc);
	free(json);
}

/*
 * One call: 30% alloc, 25% free, 20% pause, 20% resume, 5% status. An
 * alloc that cannot be made (full, or both tags paused) is a free, and
 * the other way round; with neither possible, a resume.
 */
static void loadgen_step(struct loadgen_client *lc)
{
	unsigned r = (unsigned)rand_r(&lc->rnd) % 100;

	if (r < 30) {
		if (!loadgen_alloc(lc) && !loadgen_free(lc))
			loadgen_cycle(lc, false);
	} else if (r < 55) {
		if (!loadgen_free(lc) && !loadgen_alloc(lc))
			loadgen_cycle(lc, false);
	} else if (r < 75) {
		loadgen_cycle(lc, true);
	} else if (r < 95) {
		loadgen_cycle(lc, false);
	} else {
		loadgen_status(lc);
	}
}

static void *loadgen_main(void *arg)
{
	struct loadgen_client *lc = arg;
	char name[32];
	int rc;

	snprintf(name, sizeof(name), "load%u", lc->index);
	rc = gmb_connect(lc->g->sock, name, &lc->c);
	if (rc < 0) {
		lc->c = NULL;
		loadgen_fail(lc, "gmb_connect", rc);
		return NULL;
	}
	/* Both tags exist from the start: pausing a tag never made is -ENOENT. */
	gmb_tag_set_mode(lc->c, "kv", GMB_MODE_DISCARD);
	gmb_tag_set_mode(lc->c, "w", GMB_MODE_PRESERVE);
	for (unsigned i = 0; i < lc->g->ops; i++)
		loadgen_step(lc);
	for (int t = 0; t < 2; t++)
		if (lc->paused[t])
			loadgen_cycle(lc, false);
	while (lc->nallocs)
		loadgen_free(lc);
	gmb_close(lc->c);
	return NULL;
}

int loadgen_run(struct loadgen *g)
{
	struct loadgen_client *lcs = calloc(g->clients, sizeof(*lcs));
	pthread_t *threads = calloc(g->clients, sizeof(*threads));
	unsigned started = 0;

	g->done = g->failed = g->bad_bytes = 0;
	g->first_error[0] = 0;
	pthread_mutex_init(&g->lock, NULL);
	if (!lcs || !threads) {
		free(lcs);
		free(threads);
		return -ENOMEM;
	}
	for (; started < g->clients; started++) {
		lcs[started] = (struct loadgen_client){ .g = g,
							.index = started,
							.rnd = g->seed + started };
		if (pthread_create(&threads[started], NULL, loadgen_main, &lcs[started]) != 0)
			break;
	}
	for (unsigned i = 0; i < started; i++) {
		pthread_join(threads[i], NULL);
		g->done += lcs[i].done;
		g->failed += lcs[i].failed;
		g->bad_bytes += lcs[i].bad;
	}
	if (started < g->clients) {
		g->failed++;
		snprintf(g->first_error, sizeof(g->first_error), "pthread_create failed");
	}
	free(lcs);
	free(threads);
	pthread_mutex_destroy(&g->lock);
	return g->failed || g->bad_bytes ? -EIO : 0;
}
