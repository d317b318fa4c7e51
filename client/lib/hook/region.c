/*
 * region.c - regions: which tag the calling thread's allocations go to.
 *
 * A region is an entry on a per-thread stack (GMB_REGION_MAX deep): the
 * innermost one decides, so regions nest, and a thread never sees another
 * thread's regions (allocations made by NCCL's or a helper thread during a
 * pause must not land in the paused tag). A plain entry (tag NULL) routes
 * allocations outside the broker for its extent. Below the stack, the
 * process-wide default from $GMB_DEFAULT_TAG / $GMB_DEFAULT_MODE applies;
 * it is read once, on first use.
 *
 * Thread-safety: the stack and the failure message are thread-local; the
 * environment is read under pthread_once and never changes afterwards.
 * Nothing here allocates, so it is safe inside an allocation hook.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/hook/hook.h"
#include "common/err.h"
#include "common/wire.h"

struct region {
	char tag[WIRE_MAX_NAME + 1];
	int mode;
	bool plain;
};

/* $GMB_DEFAULT_TAG: err < 0 when the variables are malformed. */
struct region_env {
	bool set;
	int err;
	int mode;
	char tag[WIRE_MAX_NAME + 1];
	char msg[ERR_MSG_MAX];
};

static __thread struct region region_stack[GMB_REGION_MAX];
static __thread int region_depth;
static __thread char region_error[ERR_MSG_MAX];

static struct region_env region_env;
static pthread_once_t region_env_once = PTHREAD_ONCE_INIT;

static const char *const region_mode_names[] = {
	[GMB_MODE_DISCARD] = "discard",
	[GMB_MODE_ZERO] = "zero",
	[GMB_MODE_PRESERVE] = "preserve",
};

/* Messages. */

char *gmb__hook_err(void)
{
	return region_error;
}

int gmb__hook_fail_client(int rc, const gmb_client *c, const char *what)
{
	const char *why = gmb_last_error(c);

	return err_fmt(region_error, rc, "%s: %s", what, why && *why ? why : gmb_strerror(rc));
}

GMB_API const char *gmb_region_last_error(void)
{
	return region_error;
}

/* Modes. */

int gmb__mode_parse(const char *s)
{
	for (int m = GMB_MODE_DISCARD; m <= GMB_MODE_PRESERVE; m++)
		if (s && strcmp(s, region_mode_names[m]) == 0)
			return m;
	return -EINVAL;
}

const char *gmb__mode_name(int mode)
{
	if (mode < GMB_MODE_DISCARD || mode > GMB_MODE_PRESERVE)
		return "unknown";
	return region_mode_names[mode];
}

static int region_check_tag(const char *tag)
{
	size_t n = strlen(tag);

	if (n == 0)
		return err_fmt(region_error, -EINVAL,
			       "a region needs a non-empty tag (NULL: plain)");
	if (n > WIRE_MAX_NAME)
		return err_fmt(region_error, -ENAMETOOLONG,
			       "region tag of %zu bytes (at most %d)", n,
			       WIRE_MAX_NAME);
	return 0;
}

/* The environment's default region. */

static void region_env_load(void)
{
	const char *tag = getenv("GMB_DEFAULT_TAG");
	const char *mode = getenv("GMB_DEFAULT_MODE");

	if (!tag || !*tag)
		return;
	if (strlen(tag) > WIRE_MAX_NAME) {
		region_env.err = -ENAMETOOLONG;
		snprintf(region_env.msg, sizeof(region_env.msg),
			 "GMB_DEFAULT_TAG is longer than %d bytes", WIRE_MAX_NAME);
		return;
	}
	/* A trainer that pauses everything wants its weights and optimizer back. */
	region_env.mode = mode && *mode ? gmb__mode_parse(mode) : GMB_MODE_PRESERVE;
	if (region_env.mode < 0) {
		region_env.err = -EINVAL;
		snprintf(region_env.msg, sizeof(region_env.msg),
			 "GMB_DEFAULT_MODE=\"%.64s\": want discard, zero or preserve", mode);
		return;
	}
	snprintf(region_env.tag, sizeof(region_env.tag), "%s", tag);
	region_env.set = true;
}

/* Regions. */

GMB_API int gmb_region_begin(const char *tag, int mode)
{
	struct region *r;
	int rc;

	if (mode < GMB_MODE_DISCARD || mode > GMB_MODE_PRESERVE)
		return err_fmt(region_error, -EINVAL,
			       "unknown mode %d (want 0 discard, 1 zero, 2 preserve)",
			       mode);
	if (tag) {
		rc = region_check_tag(tag);
		if (rc < 0)
			return rc;
	}
	if (region_depth == GMB_REGION_MAX)
		return err_fmt(region_error, -E2BIG, "%d regions are open on this thread already",
			       GMB_REGION_MAX);
	r = &region_stack[region_depth];
	r->plain = !tag;
	r->mode = tag ? mode : GMB_MODE_DISCARD;
	snprintf(r->tag, sizeof(r->tag), "%s", tag ? tag : "");
	region_depth++;
	return 0;
}

GMB_API int gmb_region_end(void)
{
	if (region_depth == 0)
		return err_fmt(region_error, -EINVAL, "no region is open on this thread");
	region_depth--;
	return 0;
}

/* The tag and mode in force: the innermost region, else the environment's. */
static int region_lookup(const char **tag, int *mode)
{
	const struct region *r = region_depth ? &region_stack[region_depth - 1] : NULL;

	if (r) {
		*tag = r->tag;
		*mode = r->mode;
		return !r->plain;
	}
	pthread_once(&region_env_once, region_env_load);
	if (region_env.err < 0)
		return err_fmt(region_error, region_env.err, "%s", region_env.msg);
	*tag = region_env.tag;
	*mode = region_env.mode;
	return region_env.set;
}

GMB_API int gmb_region_current(char *tag, size_t cap, int *mode)
{
	const char *t = "";
	int m = GMB_MODE_DISCARD, rc = region_lookup(&t, &m);

	if (rc <= 0)
		return rc;
	if (tag) {
		if (strlen(t) >= cap)
			return err_fmt(region_error, -ENOBUFS,
				       "region tag \"%s\" does not fit %zu bytes",
				       t, cap);
		memcpy(tag, t, strlen(t) + 1);
	}
	if (mode)
		*mode = m;
	return 1;
}
