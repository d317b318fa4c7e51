/*
 * table.c - the three tables that drive gmbctl: ctl_kinds[] (what each
 * kind of argument is and how it is checked), ctl_cmds[] (one row per
 * command: name, arguments, flags, handler, help) and ctl_opts[] (global
 * options). The parser (parse.c), the usage and help (help.c) and main
 * read them, so the help cannot disagree with the parser.
 *
 * A command may be two words ("object drop"): the first is a group of
 * commands, never one of its own; ctl_is_group() tells a group's word.
 */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "client/gmbctl/ctl.h"
#include "common/wire.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

const struct ctl_kind_info ctl_kinds[] = {
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

const struct ctl_cmd ctl_cmds[] = {
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

const struct ctl_opt ctl_opts[] = {
	{ "socket", 's', "PATH",
	  "gmbd's socket (default: $GMB_SOCKET, else " WIRE_DEFAULT_SOCKET ")" },
	{ "json", CTL_OPT_JSON, NULL, "print JSON (commands marked [--json])" },
	{ "help", 'h', NULL, "show this help (after a command: that command's) and exit" },
	{ "version", 'V', NULL, "show the version and exit" },
};

const size_t ctl_nkinds = ARRAY_SIZE(ctl_kinds);
const size_t ctl_ncmds = ARRAY_SIZE(ctl_cmds);
const size_t ctl_nopts = ARRAY_SIZE(ctl_opts);

_Static_assert(ARRAY_SIZE(ctl_opts) <= CTL_MAX_OPTS, "parse.c's getopt tables hold CTL_MAX_OPTS");

const struct ctl_cmd *ctl_find_cmd(const char *name)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(ctl_cmds); i++)
		if (!strcmp(ctl_cmds[i].name, name))
			return &ctl_cmds[i];
	return NULL;
}

/* Is @word the first of two-word commands ("object")? */
bool ctl_is_group(const char *word)
{
	size_t n = strlen(word);

	for (size_t i = 0; i < ARRAY_SIZE(ctl_cmds); i++)
		if (n && !strncmp(ctl_cmds[i].name, word, n) && ctl_cmds[i].name[n] == ' ')
			return true;
	return false;
}
