/*
 * gmbctl.c - the operator's CLI of gmbd: status, pause/resume, trim,
 * arbitration (switch, priority), named objects (objects, object drop,
 * grant, revoke, pause, resume), the live views watch and top, and help.
 * This file is main: parse, then print help or run the command.
 *
 * Three tables drive everything (table.c): ctl_opts[] (global options),
 * ctl_kinds[] (what each kind of argument is and how it is checked) and
 * ctl_cmds[] (one row per command: name, arguments, flags, handler, help).
 * --help, each command's usage line and every usage error are printed
 * from them (help.c), so the help cannot disagree with the parser.
 * ctl_parse() (parse.c) checks every argument (args.c) before anything
 * connects; a handler (cmds.c; live.c for watch and top) gets checked
 * values and only talks to the broker, returning 0 or -errno.
 *
 * gmbctl uses the public libgmb API only (and, from common/, size_str and
 * the default socket path). Results go to stdout, errors to
 * stderr only. Exit status: 0 done; 1 the broker refused or failed, or
 * cannot be reached; 2 usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "client/gmbctl/ctl.h"
#include "include/gmb.h"

enum {
	CTL_EXIT_OK = 0,
	CTL_EXIT_FAIL = 1,
	CTL_EXIT_USAGE = 2
};

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
