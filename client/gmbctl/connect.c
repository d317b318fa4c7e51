/*
 * connect.c - gmbctl and gmbd's socket: connecting as a tool, and what a
 * person reads when that or a request fails: the reason, a hint they can
 * act on (is gmbd running, may they use its socket), the broker's own
 * sentence for a refusal. Text from gmbd may quote a client's name, so it
 * reaches the terminal through ctl_put_safe_to() only.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>
#include <grp.h>

#include "client/gmbctl/ctl.h"
#include "common/wire.h"
#include "include/gmb.h"

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

/* "gmbctl: pause: <why>", the broker's sentence when it gave one. */
void ctl_report(const struct ctl_cmd *cmd, gmb_client *c, int err)
{
	const char *msg = c ? gmb_last_error(c) : NULL;

	fprintf(stderr, CTL_NAME ": %s: ", cmd->name);
	ctl_put_safe(msg && *msg ? msg : gmb_strerror(err));
	fputc('\n', stderr);
}
