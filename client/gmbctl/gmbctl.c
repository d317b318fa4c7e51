/*
 * gmbctl.c - the operator's CLI of gmbd: status, pause/resume, trim,
 * arbitration (switch, priority), named objects (objects, object drop,
 * grant, revoke, pause, resume), the live views watch and top (client/gmbctl/live.c),
 * and help. A command may be two words ("object drop"): the first is a
 * group of commands, never one of its own.
 *
 * Three tables drive everything: ctl_opts[] (global options), ctl_kinds[]
 * (what each kind of argument is and how it is checked) and ctl_cmds[]
 * (one row per command: name, arguments, flags, handler, help). --help,
 * each command's usage line and every usage error are printed from them,
 * so the help cannot disagree with the parser. ctl_parse() checks every
 * argument before anything connects; a handler gets checked values and only
 * talks to the broker, returning 0 or -errno.
 *
 * gmbctl uses the public libgmb API only (and, from common/, size_str and
 * the default socket path). Results go to stdout, errors to
 * stderr only. Exit status: 0 done; 1 the broker refused or failed, or
 * cannot be reached; 2 usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <grp.h>
#include <pwd.h>

#include "client/gmbctl/ctl.h"
#include "common/size.h"
#include "common/wire.h"
#include "include/gmb.h"

#define CTL_MAX_ARGS 2

enum {
	CTL_EXIT_OK = 0,
	CTL_EXIT_FAIL = 1,
	CTL_EXIT_USAGE = 2
};

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

static int ctl_check_client(const char *s, struct ctl_args *a, const char **why);
static int ctl_check_tag(const char *s, struct ctl_args *a, const char **why);
static int ctl_check_device(const char *s, struct ctl_args *a, const char **why);
static int ctl_check_to(const char *s, struct ctl_args *a, const char **why);
static int ctl_check_priority(const char *s, struct ctl_args *a, const char **why);
static int ctl_switch(gmb_client *c, const struct ctl_args *a);
static int ctl_priority(gmb_client *c, const struct ctl_args *a);
static int ctl_check_command(const char *s, struct ctl_args *a, const char **why);
static int ctl_help(gmb_client *c, const struct ctl_args *a);
static int ctl_status(gmb_client *c, const struct ctl_args *a);
static int ctl_pause(gmb_client *c, const struct ctl_args *a);
static int ctl_resume(gmb_client *c, const struct ctl_args *a);
static int ctl_trim(gmb_client *c, const struct ctl_args *a);
static int ctl_check_object(const char *s, struct ctl_args *a, const char **why);
static int ctl_check_objver(const char *s, struct ctl_args *a, const char **why);
static int ctl_check_uid(const char *s, struct ctl_args *a, const char **why);
static int ctl_objects(gmb_client *c, const struct ctl_args *a);
static int ctl_object_drop(gmb_client *c, const struct ctl_args *a);
static int ctl_object_grant(gmb_client *c, const struct ctl_args *a);
static int ctl_object_revoke(gmb_client *c, const struct ctl_args *a);
static int ctl_object_pause(gmb_client *c, const struct ctl_args *a);
static int ctl_object_resume(gmb_client *c, const struct ctl_args *a);

static const struct ctl_kind_info ctl_kinds[] = {
	[CTL_ARG_CLIENT] = { "CLIENT", "a client's name, pid, or id as #ID or ID (see status)",
			     ctl_check_client },
	[CTL_ARG_TAG] = { "TAG", "a tag of that client; every tag when omitted", ctl_check_tag },
	[CTL_ARG_DEVICE] = { "DEVICE", "a device index (see status); every device when omitted",
			     ctl_check_device },
	[CTL_ARG_FROM] = { "FROM",
			   "a client (as CLIENT) or a group (GMB_GROUP; @NAME: only a group)",
			   ctl_check_client },
	[CTL_ARG_TO] = { "TO", "a client or a group, as FROM", ctl_check_to },
	[CTL_ARG_PRIORITY] = { "N", "a priority, an integer (higher is served first)",
			       ctl_check_priority },
	[CTL_ARG_OBJECT] = { "NAME", "a named object: NAME (your uid's) or UID/NAME (see objects)",
			     ctl_check_object },
	[CTL_ARG_OBJVER] = { "NAME[@VERSION]",
			     "an object (as NAME) and one of its versions; the whole object when"
			     " @VERSION is omitted",
			     ctl_check_objver },
	[CTL_ARG_UID] = { "UID", "a uid, or a user's name", ctl_check_uid },
	[CTL_ARG_COMMAND] = { "COMMAND", "one of the commands above", ctl_check_command },
};

static const struct ctl_cmd ctl_cmds[] = {
	{ "status",
	  { CTL_ARG_NONE },
	  0,
	  0,
	  CTL_F_JSON,
	  ctl_status,
	  "show devices, pools, clients and their tags" },
	{ "pause",
	  { CTL_ARG_CLIENT, CTL_ARG_TAG },
	  1,
	  2,
	  CTL_F_FOLLOW,
	  ctl_pause,
	  "pause a client's tag: memory back to the pool, addresses kept"
	  " (--follow: processes that imported it unmap it too, and map it again on resume)" },
	{ "resume",
	  { CTL_ARG_CLIENT, CTL_ARG_TAG },
	  1,
	  2,
	  CTL_F_WAIT,
	  ctl_resume,
	  "resume a paused tag at the same addresses (--wait: wait for memory)" },
	{ "trim",
	  { CTL_ARG_DEVICE },
	  0,
	  1,
	  CTL_F_JSON,
	  ctl_trim,
	  "release the pool's free memory to the driver" },
	{ "switch",
	  { CTL_ARG_FROM, CTL_ARG_TO },
	  2,
	  2,
	  CTL_F_TAGS | CTL_F_WAIT,
	  ctl_switch,
	  "pause FROM's tags, then resume TO's in the order of --tags" },
	{ "priority",
	  { CTL_ARG_CLIENT, CTL_ARG_PRIORITY },
	  2,
	  2,
	  0,
	  ctl_priority,
	  "set the priority of a client or group" },
	{ "objects",
	  { CTL_ARG_NONE },
	  0,
	  0,
	  CTL_F_JSON,
	  ctl_objects,
	  "show the named objects: owner, latest version, versions kept, bytes, readers" },
	{ "object drop",
	  { CTL_ARG_OBJVER },
	  1,
	  1,
	  0,
	  ctl_object_drop,
	  "drop an object's version, or the whole object (readers keep what they have open)" },
	{ "object grant",
	  { CTL_ARG_OBJECT, CTL_ARG_UID },
	  2,
	  2,
	  0,
	  ctl_object_grant,
	  "let processes of UID open an object's versions (as OWNER_UID/NAME)" },
	{ "object revoke",
	  { CTL_ARG_OBJECT, CTL_ARG_UID },
	  2,
	  2,
	  0,
	  ctl_object_revoke,
	  "take a grant back (opens already made stay)" },
	{ "object pause",
	  { CTL_ARG_OBJECT },
	  1,
	  1,
	  CTL_F_DISCARD,
	  ctl_object_pause,
	  "free an object's GPU memory: readers unmap it (addresses kept), gmbd keeps its"
	  " bytes (--discard: dropped)" },
	{ "object resume",
	  { CTL_ARG_OBJECT },
	  1,
	  1,
	  0,
	  ctl_object_resume,
	  "bring a paused object back: its bytes (zeros after --discard), readers mapped again" },
	{ "watch",
	  { CTL_ARG_NONE },
	  0,
	  0,
	  CTL_F_JSON | CTL_F_LIVE,
	  ctl_watch,
	  "print gmbd's events as they happen, one line each (Ctrl-C ends)" },
	{ "top",
	  { CTL_ARG_NONE },
	  0,
	  0,
	  CTL_F_LIVE,
	  ctl_top,
	  "a live view of devices, clients and tags, every second (q quits)" },
	{ "help",
	  { CTL_ARG_COMMAND },
	  0,
	  1,
	  CTL_F_LOCAL,
	  ctl_help,
	  "show this help, or a command's" },
};

static const struct ctl_opt ctl_opts[] = {
	{ "socket", 's', "PATH",
	  "gmbd's socket (default: $GMB_SOCKET, else " WIRE_DEFAULT_SOCKET ")" },
	{ "json", CTL_OPT_JSON, NULL, "print JSON (commands marked [--json])" },
	{ "help", 'h', NULL, "show this help (after a command: that command's) and exit" },
	{ "version", 'V', NULL, "show the version and exit" },
};

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* --- checks of arguments ------------------------------------------------ */

static bool ctl_is_number(const char *s)
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
static int ctl_check_client(const char *s, struct ctl_args *a, const char **why)
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
static int ctl_check_tag(const char *s, struct ctl_args *a, const char **why)
{
	if (!*s) {
		*why = "empty tag (omit TAG for every tag)";
		return -EINVAL;
	}
	a->tag = s;
	return 0;
}

static const struct ctl_cmd *ctl_find_cmd(const char *name);

static bool ctl_is_group(const char *word);

/* A command, or a group of them ("object": help lists its commands). */
static int ctl_check_command(const char *s, struct ctl_args *a, const char **why)
{
	if (!ctl_find_cmd(s) && !ctl_is_group(s)) {
		*why = "unknown command";
		return -EINVAL;
	}
	a->command = s;
	return 0;
}

static int ctl_check_device(const char *s, struct ctl_args *a, const char **why)
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

static int ctl_check_to(const char *s, struct ctl_args *a, const char **why)
{
	const char *from = a->client;
	int r = ctl_check_client(s, a, why);

	a->to = a->client;
	a->client = from;
	return r;
}

static int ctl_check_priority(const char *s, struct ctl_args *a, const char **why)
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
static int ctl_check_object(const char *s, struct ctl_args *a, const char **why)
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
static int ctl_check_objver(const char *s, struct ctl_args *a, const char **why)
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
static int ctl_check_uid(const char *s, struct ctl_args *a, const char **why)
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
static int ctl_check_wait(const char *s, struct ctl_args *a, const char **why)
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
static int ctl_check_tags(const char *s, struct ctl_args *a, const char **why)
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

/* --- output helpers ----------------------------------------------------- */

/*
 * Writes a broker message to stderr. It may quote a client's name, and a
 * client can name itself anything, so no control byte reaches the terminal.
 */
void ctl_put_safe_to(FILE *f, const char *s)
{
	for (; *s; s++)
		fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, f);
}

static void ctl_put_safe(const char *s)
{
	ctl_put_safe_to(stderr, s);
}

static const char *ctl_socket_path(const char *socket)
{
	return socket ? socket : wire_default_socket();
}

/* What a person can do about a failed connect: is gmbd there, may I in. */
static void ctl_connect_hint(const char *path, int err)
{
	struct stat st;
	struct group *gr;

	if (err == -ENOTSOCK) {
		fprintf(stderr, "hint: name gmbd's socket with -s PATH or $GMB_SOCKET; the default"
				" is " WIRE_DEFAULT_SOCKET ".\n");
	} else if (err == -ENOENT || err == -ECONNREFUSED) {
		fprintf(stderr,
			"hint: is gmbd running? (systemctl status gmbd.socket gmbd)"
			" Name its socket with -s PATH or $GMB_SOCKET; the default is " WIRE_DEFAULT_SOCKET
			".\n");
	} else if (err == -EACCES || err == -EPERM) {
		gr = stat(path, &st) == 0 ? getgrgid(st.st_gid) : NULL;
		fprintf(stderr, "hint: the socket admits its group only (ls -l ");
		ctl_put_safe(path);
		if (gr && gr->gr_gid == 0) {
			/* Nobody should join root: gmbd was started by hand as root. */
			fprintf(stderr,
				"): its group is root, as gmbd started by hand as root"
				" leaves it; start gmbd with --socket-group GROUP (gmbd.socket"
				" uses gmb) and join GROUP, or run gmbctl as root.\n");
		} else if (gr) {
			fprintf(stderr, "): join it with 'sudo usermod -aG ");
			ctl_put_safe(gr->gr_name);
			fprintf(stderr, " $USER', then log in again.\n");
		} else {
			fprintf(stderr, "): ask to be added to that group (usermod -aG).\n");
		}
	}
}

int ctl_connect(const char *cmd, const char *socket, bool quiet, gmb_client **c)
{
	int r = gmb_connect_flags(socket, CTL_NAME, GMB_CONNECT_TOOL, c);

	if (r < 0 && !quiet) {
		fprintf(stderr, CTL_NAME ": %s: cannot connect to gmbd at ", cmd);
		ctl_put_safe(ctl_socket_path(socket));
		fprintf(stderr, ": %s\n", r == -ENOTSOCK ? "not a socket" : gmb_strerror(r));
		ctl_connect_hint(ctl_socket_path(socket), r);
	}
	return r;
}

/* --- usage and help, from the tables ------------------------------------ */

/* "pause CLIENT [TAG]", "trim [DEVICE] [--json]" into @buf. */
static const char *ctl_cmd_synopsis(const struct ctl_cmd *cmd, char *buf, size_t size)
{
	size_t n = (size_t)snprintf(buf, size, "%s", cmd->name);
	int i;

	for (i = 0; i < cmd->max_args && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, i < cmd->min_args ? " %s" : " [%s]",
				      ctl_kinds[cmd->args[i]].metavar);
	if ((cmd->flags & CTL_F_TAGS) && n < size)
		n += (size_t)snprintf(buf + n, size - n, " [--tags T1,T2,...]");
	if ((cmd->flags & CTL_F_WAIT) && n < size)
		n += (size_t)snprintf(buf + n, size - n, " [--wait SECONDS]");
	if ((cmd->flags & CTL_F_FOLLOW) && n < size)
		n += (size_t)snprintf(buf + n, size - n, " [--follow]");
	if ((cmd->flags & CTL_F_DISCARD) && n < size)
		n += (size_t)snprintf(buf + n, size - n, " [--discard]");
	if ((cmd->flags & CTL_F_JSON) && n < size)
		snprintf(buf + n, size - n, " [--json]");
	return buf;
}

/* "-s, --socket PATH" or "    --json" into @buf. */
static const char *ctl_opt_synopsis(const struct ctl_opt *o, char *buf, size_t size)
{
	if (o->key < 256)
		snprintf(buf, size, "-%c, --%s%s%s", o->key, o->name, o->metavar ? " " : "",
			 o->metavar ? o->metavar : "");
	else
		snprintf(buf, size, "    --%s%s%s", o->name, o->metavar ? " " : "",
			 o->metavar ? o->metavar : "");
	return buf;
}

static void ctl_print_cmd_usage(FILE *f, const struct ctl_cmd *cmd)
{
	char syn[128];

	fprintf(f, "Usage: " CTL_NAME " [OPTIONS] %s\n", ctl_cmd_synopsis(cmd, syn, sizeof(syn)));
}

/* A usage error: the reason, then the usage line; exit status 2. */
__attribute__((format(printf, 2, 3))) static int ctl_usage_error(const struct ctl_cmd *cmd,
								 const char *fmt, ...)
{
	va_list ap;

	fputs(CTL_NAME ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (cmd)
		ctl_print_cmd_usage(stderr, cmd);
	else
		fputs("Usage: " CTL_NAME " [OPTIONS] COMMAND [ARGS]\n"
		      "Try '" CTL_NAME " --help' for more information.\n",
		      stderr);
	return -EINVAL;
}

/* Where every row's text starts: a synopsis that reaches it has a line of
 * its own, and its text starts the next line there, so the column holds. */
#define CTL_HELP_COL 27

static void ctl_print_row(const char *synopsis, const char *help)
{
	int n = printf("  %s", synopsis);

	if (n >= CTL_HELP_COL - 1) {
		putchar('\n');
		n = 0;
	}
	printf("%*s%s\n", CTL_HELP_COL - n, "", help);
}

static void ctl_print_help(void)
{
	char syn[128];
	size_t i;

	printf("Usage: " CTL_NAME " [OPTIONS] COMMAND [ARGS]\n"
	       "Control gmbd, the GPU memory broker of this node.\n\nCommands:\n");
	for (i = 0; i < ARRAY_SIZE(ctl_cmds); i++)
		ctl_print_row(ctl_cmd_synopsis(&ctl_cmds[i], syn, sizeof(syn)), ctl_cmds[i].help);
	printf("\nArguments:\n");
	for (i = 1; i < ARRAY_SIZE(ctl_kinds); i++)
		ctl_print_row(ctl_kinds[i].metavar, ctl_kinds[i].help);
	printf("\nOptions:\n");
	for (i = 0; i < ARRAY_SIZE(ctl_opts); i++)
		ctl_print_row(ctl_opt_synopsis(&ctl_opts[i], syn, sizeof(syn)), ctl_opts[i].help);
	printf("\nExit status: 0 on success; 1 when gmbd refused or failed, or cannot be\n"
	       "reached; 2 on a usage error.\n");
}

/* --- parsing ------------------------------------------------------------ */

/* getopt_long's tables, built from ctl_opts[] so that --help matches them. */
static void ctl_getopt_tables(struct option *lo, char *so)
{
	size_t i;

	*so++ = '+'; /* stop at the command: what follows it is the command's */
	*so++ = ':'; /* report a missing value as ':' */
	for (i = 0; i < ARRAY_SIZE(ctl_opts); i++) {
		lo[i] = (struct option){ ctl_opts[i].name,
					 ctl_opts[i].metavar ? required_argument : no_argument,
					 NULL, ctl_opts[i].key };
		if (ctl_opts[i].key < 256) {
			*so++ = (char)ctl_opts[i].key;
			if (ctl_opts[i].metavar)
				*so++ = ':';
		}
	}
	lo[i] = (struct option){ 0 };
	*so = '\0';
}

static int ctl_parse_opt(struct ctl_cli *cli, int key, char **argv)
{
	switch (key) {
	case 's':
		if (!*optarg)
			return ctl_usage_error(NULL, "empty socket path");
		cli->socket = optarg;
		return 0;
	case CTL_OPT_JSON:
		cli->json = true;
		return 0;
	case 'h':
		cli->help = true;
		return 0;
	case 'V':
		cli->version = true;
		return 0;
	case ':':
		return ctl_usage_error(NULL, "option '%s' needs a value", argv[optind - 1]);
	default:
		if (optopt && optopt < 256)
			return ctl_usage_error(NULL, "unknown option '-%c'", optopt);
		return ctl_usage_error(NULL, "unknown option '%s'", argv[optind - 1]);
	}
}

/* Global options up to the command; *@next gets the command's index. */
static int ctl_parse_opts(struct ctl_cli *cli, int argc, char **argv, int *next)
{
	struct option lo[ARRAY_SIZE(ctl_opts) + 1];
	char so[2 + 2 * ARRAY_SIZE(ctl_opts) + 1];
	int key, r;

	ctl_getopt_tables(lo, so);
	opterr = 0; /* errors are reported from ctl_parse_opt, with the usage */
	while ((key = getopt_long(argc, argv, so, lo, NULL)) != -1) {
		r = ctl_parse_opt(cli, key, argv);
		if (r < 0)
			return r;
	}
	*next = optind;
	return 0;
}

static const struct ctl_cmd *ctl_find_cmd(const char *name)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(ctl_cmds); i++)
		if (!strcmp(ctl_cmds[i].name, name))
			return &ctl_cmds[i];
	return NULL;
}

/* Is @word the first of two-word commands ("object")? */
static bool ctl_is_group(const char *word)
{
	size_t n = strlen(word);

	for (size_t i = 0; i < ARRAY_SIZE(ctl_cmds); i++)
		if (n && !strncmp(ctl_cmds[i].name, word, n) && ctl_cmds[i].name[n] == ' ')
			return true;
	return false;
}

/* The commands of group @word, one "  object drop ..." line each. */
static void ctl_print_group(FILE *f, const char *word)
{
	size_t n = strlen(word);
	char syn[128];

	for (size_t i = 0; i < ARRAY_SIZE(ctl_cmds); i++)
		if (!strncmp(ctl_cmds[i].name, word, n) && ctl_cmds[i].name[n] == ' ')
			fprintf(f, "  " CTL_NAME " %s\n",
				ctl_cmd_synopsis(&ctl_cmds[i], syn, sizeof(syn)));
}

/*
 * The command at @argv[*i]: one word, or a group's word and the next
 * ("object drop"), *@i then on the second. NULL after a usage error.
 */
static const struct ctl_cmd *ctl_parse_cmd(int argc, char **argv, int *i)
{
	const struct ctl_cmd *cmd = ctl_find_cmd(argv[*i]);
	char two[64];

	if (cmd)
		return cmd;
	if (!ctl_is_group(argv[*i])) {
		ctl_usage_error(NULL, "unknown command '%s'", argv[*i]);
		return NULL;
	}
	if (*i + 1 < argc &&
	    (size_t)snprintf(two, sizeof(two), "%s %s", argv[*i], argv[*i + 1]) < sizeof(two))
		cmd = ctl_find_cmd(two);
	if (!cmd) {
		fprintf(stderr, CTL_NAME ": %s: %s; one of:\n", argv[*i],
			*i + 1 < argc ? "unknown command" : "missing command");
		ctl_print_group(stderr, argv[*i]);
		return NULL;
	}
	(*i)++;
	return cmd;
}

/*
 * The command's own words: --json and --help anywhere, "--" before a
 * positional that starts with '-', the positionals checked by kind. A
 * negative number is left to its check ("bad device number" says more
 * than "unknown option '-1'").
 */
static int ctl_parse_cmd_args(struct ctl_cli *cli, int argc, char **argv)
{
	const struct ctl_cmd *cmd = cli->cmd;
	const char *why = NULL;
	bool opts = true;
	int i, n = 0;

	for (i = 0; i < argc; i++) {
		if (opts && !strcmp(argv[i], "--")) {
			opts = false;
		} else if (opts && !strcmp(argv[i], "--json")) {
			cli->json = true;
		} else if (opts && (cmd->flags & CTL_F_FOLLOW) && !strcmp(argv[i], "--follow")) {
			cli->args.follow = true;
		} else if (opts && (cmd->flags & CTL_F_DISCARD) && !strcmp(argv[i], "--discard")) {
			cli->args.discard = true;
		} else if (opts && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
			cli->help = true;
		} else if (opts && (cmd->flags & (CTL_F_WAIT | CTL_F_TAGS)) &&
			   (!strcmp(argv[i], "--wait") || !strcmp(argv[i], "--tags"))) {
			bool wait = !strcmp(argv[i], "--wait");

			if ((wait && !(cmd->flags & CTL_F_WAIT)) ||
			    (!wait && !(cmd->flags & CTL_F_TAGS)))
				return ctl_usage_error(cmd, "%s: unknown option '%s'", cmd->name,
						       argv[i]);
			if (i + 1 >= argc)
				return ctl_usage_error(cmd, "%s: option '%s' needs a value",
						       cmd->name, argv[i]);
			if ((wait ? ctl_check_wait : ctl_check_tags)(argv[i + 1], &cli->args,
								     &why) < 0)
				return ctl_usage_error(cmd, "%s: %s: '%s'", cmd->name, why,
						       argv[i + 1]);
			i++;
		} else if (opts && (!strcmp(argv[i], "-s") || !strcmp(argv[i], "--socket"))) {
			if (i + 1 >= argc || !argv[i + 1][0])
				return ctl_usage_error(cmd, "%s: option '%s' needs a value",
						       cmd->name, argv[i]);
			cli->socket = argv[++i];
		} else if (opts && !strncmp(argv[i], "--socket=", 9)) {
			if (!argv[i][9])
				return ctl_usage_error(cmd, "%s: empty socket path", cmd->name);
			cli->socket = argv[i] + 9;
		} else if (opts && argv[i][0] == '-' && argv[i][1] && !ctl_is_number(argv[i] + 1)) {
			return ctl_usage_error(cmd, "%s: unknown option '%s'", cmd->name, argv[i]);
		} else if (n >= cmd->max_args) {
			return ctl_usage_error(cmd, "%s: too many arguments", cmd->name);
		} else if (ctl_kinds[cmd->args[n]].check(argv[i], &cli->args, &why) < 0) {
			return ctl_usage_error(cmd, "%s: %s: '%s'", cmd->name, why, argv[i]);
		} else {
			n++;
		}
	}
	if (cli->help)
		return 0;
	if (n < cmd->min_args)
		return ctl_usage_error(cmd, "%s: missing %s", cmd->name,
				       ctl_kinds[cmd->args[n]].metavar);
	if (cli->json && !(cmd->flags & CTL_F_JSON))
		return ctl_usage_error(cmd, "%s: does not take --json", cmd->name);
	cli->args.json = cli->json;
	cli->args.socket = cli->socket;
	return 0;
}

/**
 * ctl_parse() - the whole command line into @cli, checked.
 * Return: 0 (cli->help/version may ask for text instead of a command), or
 * -EINVAL after the reason and usage went to stderr.
 */
static int ctl_parse(struct ctl_cli *cli, int argc, char **argv)
{
	int i, r;

	*cli = (struct ctl_cli){ .args = { .device = -1 } };
	r = ctl_parse_opts(cli, argc, argv, &i);
	if (r < 0 || cli->help || cli->version)
		return r;
	if (i >= argc)
		return ctl_usage_error(NULL, "missing command");
	cli->cmd = ctl_parse_cmd(argc, argv, &i);
	if (!cli->cmd)
		return -EINVAL;
	return ctl_parse_cmd_args(cli, argc - i - 1, argv + i + 1);
}

/* --- commands ----------------------------------------------------------- */

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

static int ctl_status(gmb_client *c, const struct ctl_args *a)
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

static int ctl_pause(gmb_client *c, const struct ctl_args *a)
{
	gmb_set_ipc_follow(c, a->follow);
	return ctl_control(c, a, GMB_OP_PAUSE);
}

static int ctl_resume(gmb_client *c, const struct ctl_args *a)
{
	gmb_set_wait(c, a->wait_ms);
	return ctl_control(c, a, GMB_OP_RESUME);
}

static int ctl_help(gmb_client *c, const struct ctl_args *a)
{
	const struct ctl_cmd *cmd = a->command ? ctl_find_cmd(a->command) : NULL;

	if (!cmd && a->command && ctl_is_group(a->command)) {
		printf("Usage:\n");
		ctl_print_group(stdout, a->command);
		return 0;
	}
	if (!cmd) {
		ctl_print_help();
		return 0;
	}
	ctl_print_cmd_usage(stdout, cmd);
	printf("%s\n", cmd->help);
	return 0;
}

/* The steps and their times go to stdout, success or not. */
static int ctl_switch(gmb_client *c, const struct ctl_args *a)
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

static int ctl_priority(gmb_client *c, const struct ctl_args *a)
{
	return gmb_set_priority(c, a->client, a->priority);
}

static int ctl_trim(gmb_client *c, const struct ctl_args *a)
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

static int ctl_objects(gmb_client *c, const struct ctl_args *a)
{
	char *text = NULL;
	int r = a->json ? gmb_objects_json(c, &text) : gmb_objects_text(c, &text);

	return ctl_put_text(r, text);
}

/* "dropped version 3 of object 'w'": a success says what it did. */
static int ctl_object_drop(gmb_client *c, const struct ctl_args *a)
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

static int ctl_object_grant(gmb_client *c, const struct ctl_args *a)
{
	return ctl_object_grant_to(c, a, false);
}

static int ctl_object_revoke(gmb_client *c, const struct ctl_args *a)
{
	return ctl_object_grant_to(c, a, true);
}

/* "paused object 'w'": gmbd answers once every reader unmapped it and its
 * bytes are off the device (or dropped), so the sentence is the result. */
static int ctl_object_pause(gmb_client *c, const struct ctl_args *a)
{
	int r = gmb_object_pause(c, a->object, a->discard);

	if (r < 0)
		return r;
	fputs("paused object '", stdout);
	ctl_put_safe_to(stdout, a->object);
	fputs(a->discard ? "', its bytes discarded\n" : "'\n", stdout);
	return 0;
}

static int ctl_object_resume(gmb_client *c, const struct ctl_args *a)
{
	int r = gmb_object_resume(c, a->object);

	if (r < 0)
		return r;
	fputs("resumed object '", stdout);
	ctl_put_safe_to(stdout, a->object);
	fputs("'\n", stdout);
	return 0;
}

/* --- main --------------------------------------------------------------- */

/* "gmbctl: pause: <why>", the broker's sentence when it gave one. */
static void ctl_report(const struct ctl_cmd *cmd, gmb_client *c, int err)
{
	const char *msg = c ? gmb_last_error(c) : NULL;

	fprintf(stderr, CTL_NAME ": %s: ", cmd->name);
	ctl_put_safe(msg && *msg ? msg : gmb_strerror(err));
	fputc('\n', stderr);
}

static int ctl_run(const struct ctl_cli *cli)
{
	gmb_client *c = NULL;
	int r;

	if (cli->cmd->flags & CTL_F_LOCAL)
		return cli->cmd->run(NULL, &cli->args) < 0 ? CTL_EXIT_FAIL : CTL_EXIT_OK;
	if (cli->cmd->flags & CTL_F_LIVE) {
		r = cli->cmd->run(NULL, &cli->args);
		return r < 0 ? CTL_EXIT_FAIL : CTL_EXIT_OK;
	}
	r = ctl_connect(cli->cmd->name, cli->socket, false, &c);
	if (r < 0)
		return CTL_EXIT_FAIL;
	r = cli->cmd->run(c, &cli->args);
	if (r < 0)
		ctl_report(cli->cmd, c, r);
	gmb_close(c);
	return r < 0 ? CTL_EXIT_FAIL : CTL_EXIT_OK;
}

int main(int argc, char **argv)
{
	struct ctl_cli cli;
	int code;

	if (ctl_parse(&cli, argc, argv) < 0)
		return CTL_EXIT_USAGE;
	if (cli.help && cli.cmd) {
		ctl_print_cmd_usage(stdout, cli.cmd);
		printf("%s\n", cli.cmd->help);
		code = CTL_EXIT_OK;
	} else if (cli.help) {
		ctl_print_help();
		code = CTL_EXIT_OK;
	} else if (cli.version) {
		printf(CTL_NAME " %s\n", GMB_VERSION);
		code = CTL_EXIT_OK;
	} else {
		code = ctl_run(&cli);
	}
	/* A result that did not reach stdout (full disk, closed pipe) is a failure. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, CTL_NAME ": cannot write output: %s\n", strerror(errno));
		return CTL_EXIT_FAIL;
	}
	return code;
}
