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

#include "client/lib/api/client.h"
#include "client/lib/hook/hook.h"
#include "common/env.h"
#include "common/err.h"
#include "common/wire.h"

struct region {
	char tag[WIRE_MAX_NAME + 1];
	int mode;
	int backup; /* GMB_BACKUP_*, DEFAULT unresolved */
	bool plain;
	bool own; /* its allocations keep mode and backup (gmb_region_begin_ex) */
};

/*
 * The thread's base region, below the stack and above $GMB_DEFAULT_TAG:
 * TMS_INIT_ENABLE turns it on from the first allocation, torch_memory_saver's
 * setters (tms.c) edit it. Filled from the environment on the thread's
 * first look.
 */
struct region_base {
	bool init;
	bool on;
	bool cpu;  /* PRESERVE in host memory of kind @kind */
	bool disk; /* PRESERVE on disk (wins over cpu) */
	int kind;  /* GMB_BACKUP_DEFAULT, _PINNED or _MMAP */
	char tag[WIRE_MAX_NAME + 1];
};

/* The TMS_INIT_* variables, read once for every thread's base region. */
struct region_tms_env {
	bool enable, cpu, disk;
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

static __thread struct region_base region_base;

static struct region_env region_env;
static pthread_once_t region_env_once = PTHREAD_ONCE_INIT;
static struct region_tms_env region_tms_env;
static pthread_once_t region_tms_once = PTHREAD_ONCE_INIT;

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
		return err_fmt(region_error, -ENAMETOOLONG, "region tag of %zu bytes (at most %d)",
			       n, WIRE_MAX_NAME);
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

/* The thread's base region. */

static void region_tms_load(void)
{
	region_tms_env.enable = env_true("TMS_INIT_ENABLE");
	region_tms_env.cpu = env_true("TMS_INIT_ENABLE_CPU_BACKUP");
	region_tms_env.disk = env_true("TMS_INIT_ENABLE_DISK_BACKUP");
}

static struct region_base *region_base_get(void)
{
	struct region_base *b = &region_base;

	if (b->init)
		return b;
	pthread_once(&region_tms_once, region_tms_load);
	*b = (struct region_base){ .init = true,
				   .on = region_tms_env.enable,
				   .cpu = region_tms_env.cpu,
				   .disk = region_tms_env.disk,
				   .kind = GMB_BACKUP_DEFAULT,
				   .tag = "default" };
	return b;
}

void gmb__region_base_on(bool on)
{
	region_base_get()->on = on;
}

void gmb__region_base_tag(const char *tag)
{
	if (tag && *tag && strlen(tag) <= WIRE_MAX_NAME)
		snprintf(region_base_get()->tag, sizeof(region_base.tag), "%s", tag);
}

void gmb__region_base_cpu(bool on)
{
	region_base_get()->cpu = on;
}

void gmb__region_base_disk(bool on)
{
	region_base_get()->disk = on;
}

int gmb__region_base_kind(int kind)
{
	if (kind != GMB_BACKUP_DEFAULT && kind != GMB_BACKUP_PINNED && kind != GMB_BACKUP_MMAP)
		return -EINVAL;
	region_base_get()->kind = kind;
	return 0;
}

/* Regions. */

static int region_push(const char *tag, int mode, int backup, bool own)
{
	struct region *r;
	int rc;

	if (mode < GMB_MODE_DISCARD || mode > GMB_MODE_PRESERVE)
		return err_fmt(region_error, -EINVAL,
			       "unknown mode %d (want 0 discard, 1 zero, 2 preserve)", mode);
	if (backup < GMB_BACKUP_DEFAULT || backup > GMB_BACKUP_DISK)
		return err_fmt(region_error, -EINVAL,
			       "unknown backup %d (want -1 default, 0 pinned, 1 mmap, 2 disk)",
			       backup);
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
	r->own = own && tag;
	r->mode = tag ? mode : GMB_MODE_DISCARD;
	r->backup = backup;
	snprintf(r->tag, sizeof(r->tag), "%s", tag ? tag : "");
	region_depth++;
	return 0;
}

GMB_API int gmb_region_begin(const char *tag, int mode)
{
	return region_push(tag, mode, GMB_BACKUP_DEFAULT, false);
}

GMB_API int gmb_region_begin_ex(const char *tag, int mode, int backup)
{
	return region_push(tag, mode, backup, true);
}

GMB_API int gmb_region_end(void)
{
	if (region_depth == 0)
		return err_fmt(region_error, -EINVAL, "no region is open on this thread");
	region_depth--;
	return 0;
}

/*
 * The region in force: the innermost one, else the thread's base region
 * when on, else the environment's default. 1 for a gmbd region, 0 for none
 * (or a plain one), or a negative errno.
 */
/* Which setting decides the calling thread's region (region_source()). */
enum region_src {
	REGION_SRC_STACK, /* the innermost gmb_region_begin() of this thread */
	REGION_SRC_BASE,  /* the process's base region (TMS_INIT_ENABLE and the like) */
	REGION_SRC_ENV,	  /* GMB_DEFAULT_TAG / GMB_DEFAULT_MODE, or none */
};

/*
 * The one order of precedence, for region_lookup() and region_in_force():
 * the thread's stack, then the base region, then the environment. *@top is
 * the stack's innermost entry for REGION_SRC_STACK. -errno when the
 * environment's setting is bad (the sentence in gmb_region_last_error()).
 */
static int region_source(const struct region **top)
{
	int depth = region_depth;

	if (depth) {
		*top = &region_stack[depth - 1];
		return REGION_SRC_STACK;
	}
	if (region_base_get()->on)
		return REGION_SRC_BASE;
	pthread_once(&region_env_once, region_env_load);
	if (region_env.err < 0)
		return err_fmt(region_error, region_env.err, "%s", region_env.msg);
	return REGION_SRC_ENV;
}

static int region_lookup(struct region *out)
{
	const struct region *top = NULL;
	const struct region_base *b;
	int src = region_source(&top);

	switch (src) {
	case REGION_SRC_STACK:
		*out = *top;
		return !top->plain;
	case REGION_SRC_BASE:
		b = region_base_get();
		*out = (struct region){ .mode = b->disk || b->cpu ? GMB_MODE_PRESERVE :
								    GMB_MODE_DISCARD,
					.backup = b->disk ? GMB_BACKUP_DISK : b->kind,
					.own = true };
		memcpy(out->tag, b->tag, sizeof(out->tag));
		return 1;
	case REGION_SRC_ENV:
		*out = (struct region){ .mode = region_env.mode, .backup = GMB_BACKUP_DEFAULT };
		memcpy(out->tag, region_env.tag, sizeof(out->tag));
		return region_env.set;
	default:
		return src;
	}
}

/* What gmb_region_malloc() needs: 1 in a region (@how filled), 0 outside, or -errno. */
int gmb__region_how(char *tag, size_t cap, struct gmb__mem_how *how)
{
	int backup = GMB_BACKUP_DEFAULT, rc = gmb_region_current_ex(tag, cap, &how->mode, &backup);
	struct region r;

	if (rc <= 0)
		return rc;
	region_lookup(&r);
	how->own = r.own;
	how->backup = backup;
	return 1;
}

/*
 * region_lookup's answer without its copy: the preload shim asks this on
 * every cudaMalloc, so it reads only flags (each thread-local read in a
 * dlopen'd library is a call).
 */
static int region_in_force(void)
{
	const struct region *top = NULL;
	int src = region_source(&top);

	switch (src) {
	case REGION_SRC_STACK:
		return !top->plain;
	case REGION_SRC_BASE:
		return 1;
	case REGION_SRC_ENV:
		return region_env.set;
	default:
		return src;
	}
}

GMB_API int gmb_region_current(char *tag, size_t cap, int *mode)
{
	struct region r;
	int rc;

	if (!tag && !mode)
		return region_in_force();
	r = (struct region){ .mode = GMB_MODE_DISCARD };
	rc = region_lookup(&r);

	if (rc <= 0)
		return rc;
	if (tag) {
		if (strlen(r.tag) >= cap)
			return err_fmt(region_error, -ENOBUFS,
				       "region tag \"%s\" does not fit %zu bytes", r.tag, cap);
		memcpy(tag, r.tag, strlen(r.tag) + 1);
	}
	if (mode)
		*mode = r.mode;
	return 1;
}

/* The kind @backup means here (DEFAULT: the process's default), or -EINVAL. */
static int region_resolve(int backup)
{
	return backup == GMB_BACKUP_DEFAULT ? gmb__backup_default(region_error) : backup;
}

GMB_API int gmb_region_current_ex(char *tag, size_t cap, int *mode, int *backup)
{
	struct region r = { .mode = GMB_MODE_DISCARD, .backup = GMB_BACKUP_DEFAULT };
	int rc = gmb_region_current(tag, cap, mode), k;

	if (rc <= 0)
		return rc;
	region_lookup(&r);
	k = region_resolve(r.backup);
	if (k < 0)
		return k;
	if (backup)
		*backup = k;
	return 1;
}

/*
 * torch_memory_saver's view of the region in force (tms.c): its tag
 * ("default" outside any), its mode and its resolved backup kind (the
 * default kind when there is none or it is bad).
 */
int gmb__region_effective(const char **tag, int *mode, int *backup)
{
	static __thread char tag_buf[WIRE_MAX_NAME + 1];
	struct region r = { .mode = GMB_MODE_DISCARD, .backup = GMB_BACKUP_DEFAULT };
	int rc = region_lookup(&r), k;

	snprintf(tag_buf, sizeof(tag_buf), "%s", rc > 0 && r.tag[0] ? r.tag : "default");
	*tag = tag_buf;
	*mode = rc > 0 ? r.mode : GMB_MODE_DISCARD;
	k = region_resolve(r.backup);
	*backup = k < 0 ? GMB_BACKUP_PINNED : k;
	return rc > 0;
}
