/*
 * cmds.c - gmbctl's one-shot commands: status, pause/resume, trim,
 * switch, priority, and the named objects (objects, object drop, grant,
 * revoke, pause, resume). Each gets a connection and checked arguments,
 * asks gmbd once through the public libgmb API, prints the result on
 * stdout (a success says what it did) and returns 0 or -errno; main
 * reports a failure (connect.c).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/gmbctl/ctl.h"
#include "common/size.h"
#include "include/gmb.h"

/* @text (of a gmb_*_text or _json call returning @r) on stdout, one newline at its end. */
static int ctl_put_text(int r, char *text)
{
	size_t n;

	if (r < 0)
		return r;
	n = strlen(text);
	fputs(text, stdout);
	if (!n || text[n - 1] != '\n')
		putchar('\n');
	free(text);
	return 0;
}

int ctl_status(gmb_client *c, const struct ctl_args *a)
{
	char *text = NULL;
	int r = a->json ? gmb_status_json(c, &text) : gmb_status_text(c, &text);

	return ctl_put_text(r, text);
}

/* "paused tag 'kv' of client 'w1'": a success says what it did. */
static int ctl_control(gmb_client *c, const struct ctl_args *a, int op)
{
	int r = gmb_control(c, a->client, op, a->tag);

	if (r < 0)
		return r;
	fputs(op == GMB_OP_PAUSE ? "paused " : "resumed ", stdout);
	if (a->tag) {
		fputs("tag '", stdout);
		ctl_put_safe_to(stdout, a->tag);
		fputs("' of", stdout);
	} else {
		fputs("every tag of", stdout);
	}
	fputs(" client '", stdout);
	ctl_put_safe_to(stdout, a->client);
	fputs("'\n", stdout);
	return 0;
}

int ctl_pause(gmb_client *c, const struct ctl_args *a)
{
	gmb_set_ipc_follow(c, a->follow);
	return ctl_control(c, a, GMB_OP_PAUSE);
}

int ctl_resume(gmb_client *c, const struct ctl_args *a)
{
	gmb_set_wait(c, a->wait_ms);
	return ctl_control(c, a, GMB_OP_RESUME);
}

/* The steps and their times go to stdout, success or not. */
int ctl_switch(gmb_client *c, const struct ctl_args *a)
{
	char *report = NULL;
	int r;

	gmb_set_wait(c, a->wait_ms);
	r = gmb_switch(c, a->client, a->to, a->ntags ? a->tags : NULL, a->ntags, &report);
	if (report)
		fputs(report, stdout);
	free(report);
	return r;
}

int ctl_priority(gmb_client *c, const struct ctl_args *a)
{
	return gmb_set_priority(c, a->client, a->priority);
}

int ctl_trim(gmb_client *c, const struct ctl_args *a)
{
	char rel[SIZE_STR_MAX], pend[SIZE_STR_MAX];
	uint64_t released = 0, pending = 0;
	int r;

	r = gmb_trim(c, a->device, &released, &pending);
	if (r < 0)
		return r;
	if (a->json)
		printf("{\"released_bytes\":%" PRIu64 ",\"pending_bytes\":%" PRIu64 "}\n", released,
		       pending);
	else
		printf("released %s, pending %s\n", size_str(released, rel),
		       size_str(pending, pend));
	return 0;
}

int ctl_objects(gmb_client *c, const struct ctl_args *a)
{
	char *text = NULL;
	int r = a->json ? gmb_objects_json(c, &text) : gmb_objects_text(c, &text);

	return ctl_put_text(r, text);
}

/* "dropped version 3 of object 'w'": a success says what it did. */
int ctl_object_drop(gmb_client *c, const struct ctl_args *a)
{
	int r = gmb_object_drop(c, a->object, a->version);

	if (r < 0)
		return r;
	if (a->version)
		printf("dropped version %" PRIu64 " of object '", a->version);
	else
		fputs("dropped object '", stdout);
	ctl_put_safe_to(stdout, a->object);
	fputs("'\n", stdout);
	return 0;
}

static int ctl_object_grant_to(gmb_client *c, const struct ctl_args *a, bool revoke)
{
	int r = gmb_object_grant(c, a->object, a->uid, revoke);

	if (r < 0)
		return r;
	printf("uid %" PRIu32 " may %sopen object '", a->uid, revoke ? "no longer " : "");
	ctl_put_safe_to(stdout, a->object);
	fputs("'\n", stdout);
	return 0;
}

int ctl_object_grant(gmb_client *c, const struct ctl_args *a)
{
	return ctl_object_grant_to(c, a, false);
}

int ctl_object_revoke(gmb_client *c, const struct ctl_args *a)
{
	return ctl_object_grant_to(c, a, true);
}

/* "paused object 'w'": gmbd answers once every reader unmapped it and its
 * bytes are off the device (or dropped), so the sentence is the result. */
int ctl_object_pause(gmb_client *c, const struct ctl_args *a)
{
	int r = gmb_object_pause(c, a->object, a->discard);

	if (r < 0)
		return r;
	fputs("paused object '", stdout);
	ctl_put_safe_to(stdout, a->object);
	fputs(a->discard ? "', its bytes discarded\n" : "'\n", stdout);
	return 0;
}

int ctl_object_resume(gmb_client *c, const struct ctl_args *a)
{
	int r = gmb_object_resume(c, a->object);

	if (r < 0)
		return r;
	fputs("resumed object '", stdout);
	ctl_put_safe_to(stdout, a->object);
	fputs("'\n", stdout);
	return 0;
}
