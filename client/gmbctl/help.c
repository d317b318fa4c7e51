/*
 * help.c - gmbctl's usage and help, printed from the tables (table.c):
 * --help and the help command, each command's usage line, a group's
 * commands ("object ..."), and the usage errors of the parser, which go to
 * stderr with the usage line of the command at fault.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "client/gmbctl/ctl.h"

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

void ctl_print_cmd_usage(FILE *f, const struct ctl_cmd *cmd)
{
	char syn[128];

	fprintf(f, "Usage: " CTL_NAME " [OPTIONS] %s\n", ctl_cmd_synopsis(cmd, syn, sizeof(syn)));
}

/* A usage error: the reason, then the usage line; exit status 2. */
__attribute__((format(printf, 2, 3))) int ctl_usage_error(const struct ctl_cmd *cmd,
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

void ctl_print_help(void)
{
	char syn[128];
	size_t i;

	printf("Usage: " CTL_NAME " [OPTIONS] COMMAND [ARGS]\n"
	       "Control gmbd, the GPU memory broker of this node.\n\nCommands:\n");
	for (i = 0; i < ctl_ncmds; i++)
		ctl_print_row(ctl_cmd_synopsis(&ctl_cmds[i], syn, sizeof(syn)), ctl_cmds[i].help);
	printf("\nArguments:\n");
	for (i = 1; i < ctl_nkinds; i++)
		ctl_print_row(ctl_kinds[i].metavar, ctl_kinds[i].help);
	printf("\nOptions:\n");
	for (i = 0; i < ctl_nopts; i++)
		ctl_print_row(ctl_opt_synopsis(&ctl_opts[i], syn, sizeof(syn)), ctl_opts[i].help);
	printf("\nExit status: 0 on success; 1 when gmbd refused or failed, or cannot be\n"
	       "reached; 2 on a usage error.\n");
}

/* The commands of group @word, one "  object drop ..." line each. */
void ctl_print_group(FILE *f, const char *word)
{
	size_t n = strlen(word);
	char syn[128];

	for (size_t i = 0; i < ctl_ncmds; i++)
		if (!strncmp(ctl_cmds[i].name, word, n) && ctl_cmds[i].name[n] == ' ')
			fprintf(f, "  " CTL_NAME " %s\n",
				ctl_cmd_synopsis(&ctl_cmds[i], syn, sizeof(syn)));
}

/* The help command: one command's usage and help, a group's commands, or all. */
int ctl_help(gmb_client *c, const struct ctl_args *a)
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
