/*
 * test_gmbctl.c - every gmbctl command and exit code against a real gmbd,
 * remote pause/resume of real worker processes, and who may do it.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/util.h"

#define MiB    (1024ULL * 1024)
#define CAP    65536
#define NOBODY "65534"

static struct gmbd_proc gmbd;
static char out[CAP], err[CAP];

static void start(void)
{
	/* Warm: trim has free chunks to release. */
	static const char *const args[] = { "--host-memory", "1GiB",	"--pool-keep", "unlimited",
					    "--log-level",   "warning", NULL };

	cr_assert(eq(i32, gmbd_start_shared(&gmbd, args), 0), "gmbd did not start");
}

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly");
}

TestSuite(gmbctl, .init = start, .fini = stop, .timeout = 60);

/* Runs gmbctl -s SOCK ARGS... (NULL-terminated), as nobody when @uid is set. */
static int ctl_v(const char *uid, ...)
{
	static const char *const nobody[] = { "/usr/bin/setpriv", "--reuid=" NOBODY,
					      "--regid=" NOBODY, "--clear-groups", NULL };
	va_list ap;
	int rc;

	va_start(ap, uid);
	rc = gmbctl_vrun(uid ? nobody : NULL, gmbd.sock, out, err, CAP, ap);
	va_end(ap);
	return rc;
}

#define ctl(...)	 ctl_v(NULL, __VA_ARGS__, (char *)NULL)
#define ctl_as(uid, ...) ctl_v(uid, __VA_ARGS__, (char *)NULL)

static void worker_up(struct worker *w, const char *name, const char *handler)
{
	char text[512];

	cr_assert(eq(i32, worker_start(w, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(w, text, sizeof(text), "connect %s", name), 0), "%s", text);
	if (handler)
		cr_assert(eq(i32, worker_cmd(w, NULL, 0, "handler %s", handler), 0));
	cr_assert(eq(i32, worker_cmd(w, NULL, 0, "malloc kv %llu", 16 * MiB), 0));
}

Test(gmbctl, usage_errors_exit_2)
{
	cr_assert(eq(i32, ctl("--help"), 0));
	cr_assert(not(eq(ptr, strstr(out, "pause CLIENT"), NULL)), "help lists pause: %s", out);
	cr_assert(not(eq(ptr, strstr(out, "trim"), NULL)));
	cr_assert(eq(i32, ctl("frobnicate"), 2));
	cr_assert(ne(sz, strlen(err), 0), "usage error explained on stderr");
	cr_assert(eq(i32, ctl("pause"), 2), "pause needs a client");
	cr_assert(eq(i32, ctl("pause", "a", "b", "c"), 2), "too many arguments");
	cr_assert(eq(i32, ctl("trim", "zero"), 2), "device must be a number");
	cr_assert(eq(i32, ctl("status", "--bogus"), 2));
	cr_assert(eq(i32, ctl("--version"), 0));
}

Test(gmbctl, unreachable_broker_exits_1)
{
	char bin[256];
	char *argv[] = { bin, "-s", "/nonexistent/gmbd.sock", "status", NULL };

	snprintf(bin, sizeof(bin), "%s/gmbctl", test_build_dir());
	cr_assert(eq(i32, run_capture(argv, NULL, out, err, CAP), 1));
	cr_assert(ne(sz, strlen(err), 0));
}

Test(gmbctl, status_table_and_json)
{
	struct worker w;

	worker_up(&w, "infer-7", NULL);
	cr_assert(eq(i32, ctl("status"), 0), "%s", err);
	cr_assert(not(eq(ptr, strstr(out, "infer-7"), NULL)), "%s", out);
	cr_assert(eq(i32, ctl("status", "--json"), 0), "%s", err);
	cr_assert(not(eq(ptr, strstr(out, "\"name\":\"infer-7\""), NULL)), "%s", out);
	cr_assert(eq(i64, json_i64(out, "used_bytes"), (int64_t)(16 * MiB)));
	cr_assert(eq(i64, json_i64_after(out, "\"infer-7\"", "bytes"), (int64_t)(16 * MiB)));
	cr_assert(not(eq(ptr, strstr(out, "\"state\":\"active\""), NULL)));
	cr_assert(eq(ptr, strstr(out, "gmbctl"), NULL), "the tool itself is not listed");
	cr_assert(eq(i32, worker_quit(&w), 0));
}

Test(gmbctl, remote_pause_and_resume)
{
	struct worker w;
	char text[256];

	worker_up(&w, "engine", "accept");
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "fill kv 0x5a"), 0));
	cr_assert(eq(i32, ctl("pause", "engine", "kv"), 0), "%s", err);
	cr_assert(eq(i32, ctl("status", "--json"), 0));
	cr_assert(not(eq(ptr, strstr(out, "\"state\":\"paused\""), NULL)), "%s", out);
	cr_assert(eq(i64, json_i64(out, "used_bytes"), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "poll 0"), 0));
	cr_assert(not(eq(ptr, strstr(text, "controls=1"), NULL)), "handler ran once: %s", text);
	cr_assert(eq(i32, ctl("resume", "engine"), 0), "%s", err);
	cr_assert(eq(i32, ctl("status", "--json"), 0));
	cr_assert(eq(i64, json_i64(out, "used_bytes"), (int64_t)(16 * MiB)));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "fill kv 0x33"), 0), "mapped again");
	cr_assert(eq(i32, ctl("pause", "no-such-client"), 1));
	cr_assert(ne(sz, strlen(err), 0));
	cr_assert(eq(i32, worker_quit(&w), 0));
}

Test(gmbctl, refusal_and_missing_handler_exit_1)
{
	struct worker r, n;

	worker_up(&r, "stubborn", "refuse");
	worker_up(&n, "deaf", NULL);
	cr_assert(eq(i32, ctl("pause", "stubborn"), 1));
	cr_assert(not(eq(ptr, strstr(err, "refused"), NULL)), "%s", err);
	cr_assert(eq(i32, ctl("pause", "deaf"), 1));
	cr_assert(not(eq(ptr, strstr(err, "handler"), NULL)), "%s", err);
	cr_assert(eq(i32, ctl("status", "--json"), 0));
	cr_assert(eq(ptr, strstr(out, "\"state\":\"paused\""), NULL), "nothing was paused");
	cr_assert(eq(i32, worker_quit(&r), 0));
	cr_assert(eq(i32, worker_quit(&n), 0));
}

Test(gmbctl, trim_releases_free_chunks)
{
	struct worker w;

	worker_up(&w, "trimmed", NULL);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "free kv"), 0));
	cr_assert(eq(i32, ctl("status", "--json"), 0));
	cr_assert(eq(i64, json_i64(out, "pool_bytes"), (int64_t)(16 * MiB)),
		  "freed chunk stays warm");
	cr_assert(eq(i32, ctl("trim"), 0), "%s", err);
	cr_assert(eq(i32, ctl("status", "--json"), 0));
	cr_assert(eq(i64, json_i64(out, "pool_bytes"), 0), "%s", out);
	cr_assert(eq(i32, ctl("trim", "0"), 0));
	cr_assert(eq(i32, ctl("trim", "9"), 1), "no device 9");
	cr_assert(not(eq(ptr, strstr(err, "device 9 does not exist (1 device)"), NULL)),
		  "one device, in the singular: %s", err);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* Every row of the Commands, Arguments and Options tables has its text at
 * one column: after its synopsis, or alone on the next line when the
 * synopsis reaches that column. */
Test(gmbctl, help_rows_share_one_column)
{
	const int col = 27;
	int rows = 0, wrapped = 0;
	bool table = false, pending = false;

	cr_assert(eq(i32, ctl("help"), 0), "%s", err);
	for (char *l = out, *nl; *l; l = nl + 1) {
		int len, lead;

		nl = strchr(l, '\n');
		cr_assert(not(eq(ptr, nl, NULL)), "unterminated line: %s", l);
		len = (int)(nl - l);
		lead = (int)strspn(l, " ");
		if (len > 0 && lead == 0) { /* a heading or the text around the tables */
			cr_assert(not(pending), "a synopsis alone before '%.*s'", len, l);
			table = l[len - 1] == ':' && strncmp(l, "Usage", 5) != 0;
			continue;
		}
		if (!table || len == 0) {
			cr_assert(not(pending), "a synopsis alone before an empty line");
			continue;
		}
		rows++;
		if (pending) { /* the text of the synopsis above, alone at the column */
			cr_assert(eq(i32, lead, col), "wrapped text at column %d: '%.*s'", lead,
				  len, l);
			pending = false;
			continue;
		}
		cr_assert(lead == 2 || lead == 6, "row: '%.*s'", len, l);
		if (len >= col && l[col] != ' ' && l[col - 1] == ' ' && l[col - 2] == ' ')
			continue;
		/* No text at the column: the synopsis alone, reaching it. */
		cr_assert(eq(ptr, memmem(l + lead, (size_t)(len - lead), "  ", 2), NULL),
			  "misaligned row: '%.*s'", len, l);
		cr_assert(ge(i32, len, col - 1), "short synopsis alone: '%.*s'", len, l);
		pending = true;
		wrapped++;
	}
	cr_assert(not(pending));
	cr_assert(ge(i32, rows, 20), "the tables have their rows: %s", out);
	cr_assert(ge(i32, wrapped, 2), "resume's and switch's synopses have lines of their own");
}

Test(gmbctl, a_path_that_is_not_a_socket_is_named_so)
{
	char bin[256];
	char *argv[] = { bin, "-s", "/etc/passwd", "status", NULL };

	snprintf(bin, sizeof(bin), "%s/gmbctl", test_build_dir());
	cr_assert(eq(i32, run_capture(argv, NULL, out, err, CAP), 1));
	cr_assert(not(eq(ptr, strstr(err, "/etc/passwd: not a socket"), NULL)), "%s", err);
	cr_assert(eq(ptr, strstr(err, "is gmbd running"), NULL), "%s", err);
}

/* gmbd started by hand as root: the socket's group is root, which nobody
 * should be told to join. */
Test(gmbctl, a_socket_of_group_root_gets_no_hint_to_join_root)
{
	if (getegid() != 0)
		cr_skip_test("gmbd runs as root only when the tests do");
	cr_assert(eq(i32, chmod(gmbd.sock, 0660), 0));
	cr_assert(eq(i32, ctl_as(NOBODY, "status"), 1));
	cr_assert(not(eq(ptr, strstr(err, "Permission denied"), NULL)), "%s", err);
	cr_assert(eq(ptr, strstr(err, "usermod -aG root"), NULL), "%s", err);
	cr_assert(not(eq(ptr, strstr(err, "--socket-group"), NULL)), "%s", err);
}

Test(gmbctl, another_uid_may_not_control)
{
	struct worker root_w, nobody_w;
	char text[512];

	worker_up(&root_w, "rootjob", "accept");
	cr_assert(eq(i32, worker_start(&nobody_w, gmbd.sock), 0));
	cr_assert(eq(i32, worker_cmd(&nobody_w, NULL, 0, "uid " NOBODY), 0));
	cr_assert(eq(i32, worker_cmd(&nobody_w, text, sizeof(text), "connect nobodyjob"), 0), "%s",
		  text);
	cr_assert(eq(i32, worker_cmd(&nobody_w, NULL, 0, "handler accept"), 0));
	cr_assert(eq(i32, worker_cmd(&nobody_w, NULL, 0, "malloc kv %llu", 8 * MiB), 0));

	cr_assert(eq(i32, ctl_as(NOBODY, "pause", "rootjob"), 1));
	cr_assert(not(eq(ptr, strstr(err, "may not"), NULL)), "%s", err);
	cr_assert(eq(i32, ctl_as(NOBODY, "trim"), 1), "trim needs privilege");
	cr_assert(eq(i32, ctl_as(NOBODY, "pause", "nobodyjob"), 0), "same uid: %s", err);
	cr_assert(eq(i32, ctl("resume", "nobodyjob"), 0), "root may: %s", err);
	cr_assert(eq(i32, worker_quit(&root_w), 0));
	cr_assert(eq(i32, worker_quit(&nobody_w), 0));
}

static bool has(const char *s, const char *needle)
{
	return strstr(s, needle) != NULL;
}

/* `gmbctl objects` says "no objects" within a few seconds (a process's
 * last close reaches gmbd after it exits). */
static bool objects_none_soon(void)
{
	for (int i = 0; i < 100; i++) {
		struct timespec ts = { 0, 50 * 1000 * 1000 };

		if (ctl("objects") == 0 && !strcmp(out, "no objects\n"))
			return true;
		nanosleep(&ts, NULL);
	}
	return false;
}

Test(gmbctl, objects_listed_granted_and_dropped)
{
	struct worker w;
	char text[256], row[128], owner[160];

	cr_assert(eq(i32, ctl("objects"), 0), "%s", err);
	cr_expect(eq(str, out, "no objects\n"));
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	cr_expect(eq(str, out, "{\"objects\":[],\"objects_total\":0}\n"));
	cr_assert(eq(i32, ctl("status", "--json"), 0), "%s", err);
	cr_expect(has(out, "\"objects\":[],\"objects_total\":0}"), "%s", out);
	cr_assert(eq(i32, ctl("status"), 0), "%s", err);
	cr_expect(eq(ptr, strstr(out, "OBJECT"), NULL), "%s", out);

	worker_up(&w, "publisher", NULL);
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "publish kv weights"), 0), "%s", text);
	cr_assert(eq(str, text, "1"));
	cr_assert(eq(i32, ctl("objects"), 0), "%s", err);
	snprintf(row, sizeof(row), "weights  %5u  active      v1         1  16.0 MiB        1  -\n",
		 (unsigned)getuid());
	cr_expect(has(out, "OBJECT   OWNER  STATE   LATEST  VERSIONS     BYTES  READERS  GRANTS\n"),
		  "%s", out);
	cr_expect(has(out, row), "%s", out);
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	snprintf(owner, sizeof(owner), "{\"objects\":[{\"name\":\"weights\",\"owner_uid\":%u,",
		 (unsigned)getuid());
	cr_expect(has(out, owner), "%s", out);
	cr_expect(has(out, "\"latest\":1,\"bytes\":16777216,\"paused\":false,\"discarded\":false,"
			   "\"grants\":[],\"versions\":[{"
			   "\"version\":1,\"bytes\":16777216,\"device\":0,\"readers\":1,"
			   "\"latest\":true,"),
		  "%s", out);
	cr_expect(has(out, "\"publisher\":\"publisher\""), "%s", out);
	cr_expect(has(out, "\"meta_bytes\":4}]}],\"objects_total\":1}"), "%s", out);
	/* The whole status has them too, and the publisher's open of its version. */
	cr_assert(eq(i32, ctl("status", "--json"), 0), "%s", err);
	cr_expect(has(out, "\"objects\":[{\"name\":\"weights\""), "%s", out);
	cr_expect(has(out, "\"object\":\"weights\",\"object_version\":1}"), "%s", out);
	cr_assert(eq(i32, ctl("status"), 0), "%s", err);
	cr_expect(has(out, "\nOBJECT ") && has(out, "weights@1"), "%s", out);

	/* A second version is the latest; the first stays while it is open. */
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv2 %llu", 4 * MiB), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "publish kv2 weights"), 0), "%s",
		  text);
	cr_assert(eq(str, text, "2"));
	cr_assert(eq(i32, ctl("objects"), 0), "%s", err);
	cr_expect(has(out, "      v2         2  20.0 MiB        2  -\n"), "%s", out);

	cr_assert(eq(i32, ctl("object", "grant", "weights", NOBODY), 0), "%s", err);
	cr_expect(eq(str, out, "uid " NOBODY " may open object 'weights'\n"));
	cr_assert(eq(i32, ctl("objects"), 0), "%s", err);
	cr_expect(has(out, "  " NOBODY "\n"), "%s", out);
	cr_assert(eq(i32, ctl("object", "revoke", "weights", NOBODY), 0), "%s", err);
	cr_expect(eq(str, out, "uid " NOBODY " may no longer open object 'weights'\n"));
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	cr_expect(has(out, "\"grants\":[]"), "%s", out);

	/* Refusals: the daemon's sentence, exit 1. */
	cr_assert(eq(i32, ctl("object", "drop", "no-such-object"), 1));
	cr_expect(has(err, "gmbctl: object drop: ") && strlen(err) > 22, "%s", err);
	cr_assert(eq(i32, ctl("object", "drop", "weights@9"), 1));
	cr_expect(has(err, "gmbctl: object drop: "), "%s", err);
	cr_assert(eq(i32, ctl("object", "drop", "bad name"), 1));
	cr_expect(has(err, "[A-Za-z0-9._-]"), "%s", err);
	snprintf(owner, sizeof(owner), "%u/weights", (unsigned)getuid());
	cr_assert(eq(i32, ctl_as(NOBODY, "object", "drop", owner), 1));
	cr_expect(ne(sz, strlen(err), 0));

	/* The whole object: readers keep their opens, the object has no latest. */
	cr_assert(eq(i32, ctl("object", "drop", "weights"), 0), "%s", err);
	cr_expect(eq(str, out, "dropped object 'weights'\n"));
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	cr_expect(has(out, "\"name\":\"weights\"") && has(out, "\"latest\":0,"), "%s", out);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "object_close weights"), 0));
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "object_close weights"), 0));
	cr_expect(objects_none_soon(), "%s", out);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

Test(gmbctl, a_version_is_dropped_alone)
{
	struct worker w;
	char text[256];

	worker_up(&w, "publisher2", NULL);
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "publish kv w2"), 0), "%s", text);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "object_close w2"), 0));
	cr_assert(eq(i32, ctl("objects"), 0), "%s", err);
	cr_expect(has(out, "w2 ") && has(out, " v1 "), "%s", out);
	cr_assert(eq(i32, ctl("object", "drop", "w2@1"), 0), "%s", err);
	cr_expect(eq(str, out, "dropped version 1 of object 'w2'\n"));
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	cr_expect(eq(ptr, strstr(out, "\"version\":1,"), NULL), "%s", out);
	/* Whatever the version's drop left of the object, dropping it ends it. */
	ctl("object", "drop", "w2");
	cr_expect(objects_none_soon(), "%s", out);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

/* @name's row of `gmbctl objects` (under the header: after a newline)
 * has @state in its STATE column, then the column's gap. */
static bool object_state_is(const char *name, const char *state)
{
	char row[160];

	snprintf(row, sizeof(row), "\n%s  %5u  %s  ", name, (unsigned)getuid(), state);
	return ctl("objects") == 0 && has(out, row);
}

/*
 * An object's pause and resume from the CLI, its publisher (a reader of
 * its version) following: the state shown everywhere, its memory off the
 * device while paused, the bytes back at the same address after the
 * resume (zeros after --discard), and who may.
 */
Test(gmbctl, object_paused_and_resumed)
{
	struct worker w;
	char text[256], other[160];

	worker_up(&w, "pauser", NULL);
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "fill kv 0x5a"), 0));
	cr_assert(eq(i32, worker_cmd(&w, text, sizeof(text), "publish kv frozen"), 0), "%s", text);
	cr_assert(eq(i32, ctl("status", "--json"), 0), "%s", err);
	cr_assert(eq(i64, json_i64(out, "used_bytes"), (int64_t)(16 * MiB)), "%s", out);

	cr_assert(eq(i32, ctl("object", "pause", "frozen"), 0), "%s", err);
	cr_expect(eq(str, out, "paused object 'frozen'\n"));
	cr_expect(object_state_is("frozen", "paused"), "%s", out);
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	cr_expect(has(out, "\"name\":\"frozen\"") &&
			  has(out, "\"paused\":true,\"discarded\":false,"),
		  "%s", out);
	cr_assert(eq(i32, ctl("status", "--json"), 0), "%s", err);
	cr_expect(eq(i64, json_i64(out, "used_bytes"), 0), "its GPU memory went back: %s", out);
	/* No new version while paused; a second pause does nothing. */
	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "malloc kv2 %llu", 2 * MiB), 0));
	cr_expect(eq(i32, worker_cmd(&w, text, sizeof(text), "publish kv2 frozen"), -EBUSY), "%s",
		  text);
	cr_assert(eq(i32, ctl("object", "pause", "frozen"), 0), "%s", err);

	/* Another uid may neither pause nor resume it: gmbd's sentence, exit 1. */
	snprintf(other, sizeof(other), "%u/frozen", (unsigned)getuid());
	cr_assert(eq(i32, ctl_as(NOBODY, "object", "resume", other), 1), "%s", out);
	cr_expect(has(err, "gmbctl: object resume: ") && has(err, "uid " NOBODY),
		  "refused, as nobody: %s", err);
	cr_expect(object_state_is("frozen", "paused"), "still paused: %s", out);
	cr_assert(eq(i32, ctl("object", "pause", "no-such-object"), 1));
	cr_expect(has(err, "gmbctl: object pause: no object 'no-such-object'"), "%s", err);
	cr_assert(eq(i32, ctl("object", "resume", "bad name"), 1));
	cr_expect(has(err, "[A-Za-z0-9._-]"), "%s", err);

	cr_assert(eq(i32, ctl("object", "resume", "frozen"), 0), "%s", err);
	cr_expect(eq(str, out, "resumed object 'frozen'\n"));
	cr_expect(eq(i32, worker_cmd(&w, text, sizeof(text), "object_check frozen 0x5a"), 0),
		  "the bytes back at the publisher's address: %s", text);
	cr_expect(object_state_is("frozen", "active"), "%s", out);
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	cr_expect(has(out, "\"paused\":false,\"discarded\":false,"), "%s", out);
	cr_assert(eq(i32, ctl("status", "--json"), 0), "%s", err);
	cr_expect(eq(i64, json_i64(out, "used_bytes"), (int64_t)(18 * MiB)), "%s", out);

	/* --discard: the bytes are dropped, a resume gives zeros. */
	cr_assert(eq(i32, ctl_as(NOBODY, "object", "pause", other), 1), "%s", out);
	cr_expect(has(err, "gmbctl: object pause: ") && has(err, "uid " NOBODY), "%s", err);
	cr_assert(eq(i32, ctl("object", "pause", "--discard", "frozen"), 0), "%s", err);
	cr_expect(eq(str, out, "paused object 'frozen', its bytes discarded\n"));
	cr_expect(object_state_is("frozen", "paused (discarded)"), "%s", out);
	cr_assert(eq(i32, ctl("objects", "--json"), 0), "%s", err);
	cr_expect(has(out, "\"paused\":true,\"discarded\":true,"), "%s", out);
	cr_assert(eq(i32, ctl("object", "resume", "frozen", "--discard"), 2),
		  "resume takes no --discard");
	cr_assert(eq(i32, ctl("object", "resume", "frozen"), 0), "%s", err);
	cr_expect(eq(i32, worker_cmd(&w, text, sizeof(text), "object_check frozen 0"), 0),
		  "zeros after a discard: %s", text);
	cr_expect(object_state_is("frozen", "active"), "%s", out);

	cr_assert(eq(i32, worker_cmd(&w, NULL, 0, "object_close frozen"), 0));
	cr_assert(eq(i32, ctl("object", "drop", "frozen"), 0), "%s", err);
	cr_expect(objects_none_soon(), "%s", out);
	cr_assert(eq(i32, worker_quit(&w), 0));
}

Test(gmbctl, object_pause_and_resume_have_help)
{
	cr_assert(eq(i32, ctl("help", "object"), 0), "%s", err);
	cr_expect(has(out, "object pause NAME [--discard]\n") && has(out, "object resume NAME\n"),
		  "%s", out);
	cr_assert(eq(i32, ctl("object", "pause", "--help"), 0), "%s", err);
	cr_expect(has(out, "Usage: gmbctl [OPTIONS] object pause NAME [--discard]\n"), "%s", out);
	cr_assert(eq(i32, ctl("object", "pause"), 2), "pause needs a name");
	cr_assert(eq(i32, ctl("object", "pause", "a", "b"), 2), "one name");
	cr_assert(eq(i32, ctl("object", "pause", "a", "--json"), 2), "no --json");
}
