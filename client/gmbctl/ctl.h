/*
 * ctl.h - what gmbctl.c (the command table, parsing, the one-shot
 * commands) and live.c (watch and top) share.
 */
#ifndef GMB_CTL_H
#define GMB_CTL_H

#include <stdbool.h>
#include <stdio.h>

#include "include/gmb.h"

#define CTL_NAME "gmbctl"

#define CTL_MAX_TAGS 64

/* A command's arguments, checked: what a handler gets. */
struct ctl_args {
	const char *client;
	const char *tag;     /* NULL: every tag */
	int device;	     /* -1: every device */
	const char *command; /* help COMMAND; NULL: none */
	const char *socket;  /* NULL: $GMB_SOCKET, else the default */
	bool json;
	const char *to; /* switch: TO */
	int priority;
	uint32_t wait_ms;		/* --wait */
	bool follow;			/* pause --follow */
	bool discard;			/* object pause --discard */
	const char *tags[CTL_MAX_TAGS]; /* --tags, in order (pointing into tags_buf) */
	size_t ntags;
	char tags_buf[4096];
	/* object drop/grant/revoke: NAME or UID/NAME (into object_buf, the
	 * @VERSION cut off), the version (0: the whole object), the uid. */
	const char *object;
	uint64_t version;
	uint32_t uid;
	char object_buf[256];
};

/* @s with control bytes as '?': a client can name itself anything. */
void ctl_put_safe_to(FILE *f, const char *s);

/**
 * ctl_connect() - connect as a tool to @socket (NULL: the default). On
 * failure, unless @quiet, says so on stderr for command @cmd with a hint
 * (is gmbd running, the socket's group). Return: 0 or gmb_connect's error.
 */
int ctl_connect(const char *cmd, const char *socket, bool quiet, gmb_client **c);

/* live.c: the commands that make their own connections (@c is NULL). */
int ctl_watch(gmb_client *c, const struct ctl_args *a);
int ctl_top(gmb_client *c, const struct ctl_args *a);

#endif
