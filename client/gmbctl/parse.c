/*
 * parse.c - gmbctl's command line into struct ctl_cli, checked: the global
 * options (getopt_long, its tables built from ctl_opts[]), the command
 * (one word, or a group's word and the next), then the command's own
 * options and its positionals, each checked by its kind (args.c). Every
 * argument is checked before anything connects; a bad one is a usage
 * error (help.c) and exit status 2.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "client/gmbctl/ctl.h"

/* getopt_long's tables, built from ctl_opts[] so that --help matches them. */
static void ctl_getopt_tables(struct option *lo, char *so)
{
	size_t i;

	*so++ = '+'; /* stop at the command: what follows it is the command's */
	*so++ = ':'; /* report a missing value as ':' */
	for (i = 0; i < ctl_nopts; i++) {
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
	struct option lo[CTL_MAX_OPTS + 1];
	char so[2 + 2 * CTL_MAX_OPTS + 1];
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

int ctl_parse(struct ctl_cli *cli, int argc, char **argv)
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
