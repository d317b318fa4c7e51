/*
 * ctl.h - what gmbctl's files share: the tables that drive the CLI
 * (table.c), the checked arguments a command gets (args.c, parse.c), the
 * usage and help printed from those tables (help.c), connecting to gmbd
 * and reporting its refusals (connect.c), and the commands (cmds.c, and
 * live.c for watch and top). gmbctl.c's main ties them together.
 */
#ifndef GMB_CTL_H
#define GMB_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "include/gmb.h"

#define CTL_NAME "gmbctl"

#define CTL_MAX_TAGS 64
#define CTL_MAX_ARGS 2
/* The most global options ctl_opts[] may hold: parse.c's getopt tables. */
#define CTL_MAX_OPTS 8

/* ctl_cmd.flags */
enum {
	CTL_F_JSON = 1u << 0,	 /* takes --json */
	CTL_F_LOCAL = 1u << 1,	 /* needs no connection (help) */
	CTL_F_LIVE = 1u << 2,	 /* makes its own connections (watch, top) */
	CTL_F_WAIT = 1u << 3,	 /* takes --wait SECONDS */
	CTL_F_TAGS = 1u << 4,	 /* takes --tags T1,T2,... */
	CTL_F_FOLLOW = 1u << 5,	 /* takes --follow */
	CTL_F_DISCARD = 1u << 6, /* takes --discard */
};

/* getopt keys of long-only options: past every char. */
enum {
	CTL_OPT_JSON = 256
};

enum ctl_kind {
	CTL_ARG_NONE,
	CTL_ARG_CLIENT,
	CTL_ARG_TAG,
	CTL_ARG_DEVICE,
	CTL_ARG_COMMAND,
	CTL_ARG_FROM,
	CTL_ARG_TO,
	CTL_ARG_PRIORITY,
	CTL_ARG_OBJECT,
	CTL_ARG_OBJVER,
	CTL_ARG_UID
};

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

struct ctl_kind_info {
	const char *metavar;
	const char *help;
	/* Checks @s and stores it in @a; -EINVAL with a reason in @why. */
	int (*check)(const char *s, struct ctl_args *a, const char **why);
};

struct ctl_cmd {
	const char *name;
	enum ctl_kind args[CTL_MAX_ARGS]; /* in order; CTL_ARG_NONE ends */
	int min_args;			  /* the rest are optional */
	int max_args;
	unsigned flags;
	int (*run)(gmb_client *c, const struct ctl_args *a);
	const char *help;
};

struct ctl_opt {
	const char *name;
	int key;	     /* the short letter, or CTL_OPT_* for long-only */
	const char *metavar; /* NULL: takes no value */
	const char *help;
};

/* What the command line asks for. */
struct ctl_cli {
	const char *socket; /* NULL: $GMB_SOCKET, else the default */
	bool json;
	bool help;
	bool version;
	const struct ctl_cmd *cmd; /* NULL: no command given */
	struct ctl_args args;
};

/* table.c: the kinds of argument (indexed by enum ctl_kind), the commands
 * and the global options, each with its number of rows. */
extern const struct ctl_kind_info ctl_kinds[];
extern const size_t ctl_nkinds;
extern const struct ctl_cmd ctl_cmds[];
extern const size_t ctl_ncmds;
extern const struct ctl_opt ctl_opts[];
extern const size_t ctl_nopts;

/* The command named @name ("object drop"), or NULL. */
const struct ctl_cmd *ctl_find_cmd(const char *name);
/* Is @word the first of two-word commands ("object")? */
bool ctl_is_group(const char *word);

/* args.c: the checks of ctl_kinds[] and of --wait and --tags. */
bool ctl_is_number(const char *s);
int ctl_check_client(const char *s, struct ctl_args *a, const char **why);
int ctl_check_tag(const char *s, struct ctl_args *a, const char **why);
int ctl_check_command(const char *s, struct ctl_args *a, const char **why);
int ctl_check_device(const char *s, struct ctl_args *a, const char **why);
int ctl_check_to(const char *s, struct ctl_args *a, const char **why);
int ctl_check_priority(const char *s, struct ctl_args *a, const char **why);
int ctl_check_object(const char *s, struct ctl_args *a, const char **why);
int ctl_check_objver(const char *s, struct ctl_args *a, const char **why);
int ctl_check_uid(const char *s, struct ctl_args *a, const char **why);
int ctl_check_wait(const char *s, struct ctl_args *a, const char **why);
int ctl_check_tags(const char *s, struct ctl_args *a, const char **why);

/**
 * ctl_parse() - the whole command line into @cli, checked (parse.c).
 * Return: 0 (cli->help/version may ask for text instead of a command), or
 * -EINVAL after the reason and usage went to stderr.
 */
int ctl_parse(struct ctl_cli *cli, int argc, char **argv);

/* help.c: usage and help, printed from the tables. */
void ctl_print_cmd_usage(FILE *f, const struct ctl_cmd *cmd);
/* A usage error: the reason, then the usage line; exit status 2. */
__attribute__((format(printf, 2, 3))) int ctl_usage_error(const struct ctl_cmd *cmd,
							  const char *fmt, ...);
/* The commands of group @word, one "  object drop ..." line each. */
void ctl_print_group(FILE *f, const char *word);
void ctl_print_help(void);
int ctl_help(gmb_client *c, const struct ctl_args *a);

/* connect.c: gmbd's socket, and what to say when a request fails. */

/* @s with control bytes as '?': a client can name itself anything. */
void ctl_put_safe_to(FILE *f, const char *s);

/**
 * ctl_connect() - connect as a tool to @socket (NULL: the default). On
 * failure, unless @quiet, says so on stderr for command @cmd with a hint
 * (is gmbd running, the socket's group). Return: 0 or gmb_connect's error.
 */
int ctl_connect(const char *cmd, const char *socket, bool quiet, gmb_client **c);

/* "gmbctl: pause: <why>" on stderr, the broker's sentence when it gave one. */
void ctl_report(const struct ctl_cmd *cmd, gmb_client *c, int err);

/* cmds.c: the one-shot commands, one connection each (@c). */
int ctl_status(gmb_client *c, const struct ctl_args *a);
int ctl_pause(gmb_client *c, const struct ctl_args *a);
int ctl_resume(gmb_client *c, const struct ctl_args *a);
int ctl_trim(gmb_client *c, const struct ctl_args *a);
int ctl_switch(gmb_client *c, const struct ctl_args *a);
int ctl_priority(gmb_client *c, const struct ctl_args *a);
int ctl_objects(gmb_client *c, const struct ctl_args *a);
int ctl_object_drop(gmb_client *c, const struct ctl_args *a);
int ctl_object_grant(gmb_client *c, const struct ctl_args *a);
int ctl_object_revoke(gmb_client *c, const struct ctl_args *a);
int ctl_object_pause(gmb_client *c, const struct ctl_args *a);
int ctl_object_resume(gmb_client *c, const struct ctl_args *a);

/* live.c: the commands that make their own connections (@c is NULL). */
int ctl_watch(gmb_client *c, const struct ctl_args *a);
int ctl_top(gmb_client *c, const struct ctl_args *a);

#endif
