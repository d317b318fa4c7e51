/*
 * args.c - the checks of gmbctl's arguments, one per kind of ctl_kinds[]
 * and one each for --wait and --tags. Each checks one word and stores it
 * in struct ctl_args, or refuses it with the reason the usage error
 * prints; nothing is sent to gmbd before every word passed its check.
 */
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/gmbctl/ctl.h"
#include "common/wire.h"

bool ctl_is_number(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

/*
 * The broker resolves the target (name, pid or id), so it is passed as
 * typed; only what can never match is refused here: "" and "#" followed by
 * anything but an id.
 */
int ctl_check_client(const char *s, struct ctl_args *a, const char **why)
{
	if (!*s) {
		*why = "empty client";
		return -EINVAL;
	}
	if (s[0] == '#' && !ctl_is_number(s + 1)) {
		*why = "a client id is #ID, ID a number";
		return -EINVAL;
	}
	a->client = s;
	return 0;
}

/* "" would mean every tag on the wire; omitting TAG says that explicitly. */
int ctl_check_tag(const char *s, struct ctl_args *a, const char **why)
{
	if (!*s) {
		*why = "empty tag (omit TAG for every tag)";
		return -EINVAL;
	}
	a->tag = s;
	return 0;
}

/* A command, or a group of them ("object": help lists its commands). */
int ctl_check_command(const char *s, struct ctl_args *a, const char **why)
{
	if (!ctl_find_cmd(s) && !ctl_is_group(s)) {
		*why = "unknown command";
		return -EINVAL;
	}
	a->command = s;
	return 0;
}

int ctl_check_device(const char *s, struct ctl_args *a, const char **why)
{
	unsigned long v;

	errno = 0;
	v = ctl_is_number(s) ? strtoul(s, NULL, 10) : ULONG_MAX;
	if (errno || v > INT_MAX) {
		*why = "bad device number";
		return -EINVAL;
	}
	a->device = (int)v;
	return 0;
}

int ctl_check_to(const char *s, struct ctl_args *a, const char **why)
{
	const char *from = a->client;
	int r = ctl_check_client(s, a, why);

	a->to = a->client;
	a->client = from;
	return r;
}

int ctl_check_priority(const char *s, struct ctl_args *a, const char **why)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (!*s || *end || errno || v < INT_MIN || v > INT_MAX) {
		*why = "a priority is an integer";
		return -EINVAL;
	}
	a->priority = (int)v;
	return 0;
}

/*
 * NAME or UID/NAME, passed as typed: libgmb and gmbd check the name and
 * say what is wrong with it. Only what never names one is refused here.
 */
int ctl_check_object(const char *s, struct ctl_args *a, const char **why)
{
	if (!*s || strlen(s) >= sizeof(a->object_buf)) {
		*why = !*s ? "empty object name" : "object name too long";
		return -EINVAL;
	}
	snprintf(a->object_buf, sizeof(a->object_buf), "%s", s);
	a->object = a->object_buf;
	a->version = 0;
	return 0;
}

/* NAME[@VERSION]: the version counts from 1; without it, the whole object. */
int ctl_check_objver(const char *s, struct ctl_args *a, const char **why)
{
	char *at, *end;
	unsigned long long v;
	int r = ctl_check_object(s, a, why);

	if (r < 0)
		return r;
	at = strrchr(a->object_buf, '@');
	if (!at)
		return 0;
	*at = '\0';
	errno = 0;
	v = ctl_is_number(at + 1) ? strtoull(at + 1, &end, 10) : 0;
	if (errno || v == 0 || !a->object_buf[0]) {
		*why = "NAME@VERSION wants a name and a version from 1 (omit @VERSION for the"
		       " whole object)";
		return -EINVAL;
	}
	a->version = (uint64_t)v;
	return 0;
}

/* A uid as a number, or a user's name looked up here. */
int ctl_check_uid(const char *s, struct ctl_args *a, const char **why)
{
	struct passwd *pw;
	unsigned long long v;

	errno = 0;
	if (ctl_is_number(s)) {
		v = strtoull(s, NULL, 10);
		if (errno || v >= UINT32_MAX) {
			*why = "bad uid";
			return -EINVAL;
		}
		a->uid = (uint32_t)v;
		return 0;
	}
	pw = *s ? getpwnam(s) : NULL;
	if (!pw) {
		*why = "no such user";
		return -EINVAL;
	}
	a->uid = (uint32_t)pw->pw_uid;
	return 0;
}

/* --wait SECONDS (a decimal fraction) into milliseconds. */
int ctl_check_wait(const char *s, struct ctl_args *a, const char **why)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (!*s || *end || errno || !(v >= 0) || v * 1000 > UINT32_MAX) {
		*why = "--wait takes seconds, a number >= 0";
		return -EINVAL;
	}
	a->wait_ms = (uint32_t)(v * 1000 + 0.5);
	return 0;
}

/* --tags T1,T2,...: non-empty names, in order. */
int ctl_check_tags(const char *s, struct ctl_args *a, const char **why)
{
	char *p, *tok, *save = NULL;

	if (strlen(s) >= sizeof(a->tags_buf)) {
		*why = "--tags is too long";
		return -EINVAL;
	}
	snprintf(a->tags_buf, sizeof(a->tags_buf), "%s", s);
	a->ntags = 0;
	for (p = a->tags_buf; (tok = strtok_r(p, ",", &save)); p = NULL) {
		if (a->ntags == CTL_MAX_TAGS || strlen(tok) > WIRE_MAX_NAME) {
			*why = "too many tags, or a tag too long";
			return -EINVAL;
		}
		a->tags[a->ntags++] = tok;
	}
	if (a->ntags == 0 || s[0] == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,")) {
		*why = "--tags takes names separated by commas, none empty";
		return -EINVAL;
	}
	return 0;
}
