/*
 * prog_worker.c - a scriptable libgmb client: the "real client process" of
 * the integration tests and of the demo.
 *
 * Reads one command per line on stdin and answers each with one line on
 * stdout: "<rc> <text>", rc being 0 or a negative errno and text the result
 * or gmb_last_error(). Commands:
 *   uid N                  setuid(N) (before connect)
 *   connect NAME           gmb_connect($GMB_SOCKET)
 *   env NAME VALUE         setenv (before connect: GMB_GROUP, GMB_PRIORITY, ...)
 *   handler accept|refuse|refuse-pause|refuse-resume  install a control handler
 *   wait MS                gmb_set_wait
 *   mode TAG discard|zero|preserve
 *   malloc TAG SIZE        allocate SIZE bytes on device 0 (or "malloc TAG SIZE DEV")
 *   fill TAG BYTE          memset every allocation of TAG
 *   check TAG BYTE         0 if every byte of TAG equals BYTE, else -EILSEQ
 *   addr TAG               the first allocation's address
 *   free TAG               free every allocation of TAG
 *   pause TAG|*  resume TAG|*
 *   poll MS                gmb_poll
 *   status                 the JSON status on one line
 *   publish TAG NAME       the first allocation of TAG becomes NAME's next version
 *                          (its version; it leaves TAG, mapped read-only as an open)
 *   object_close NAME      close the version the last publish of NAME left open
 *   object_check NAME BYTE 0 if every byte of that version equals BYTE, else -EILSEQ
 *   object_pause NAME [discard]  object_resume NAME   gmb_object_pause/_resume
 *   quit
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/gmb.h"

#define MAX_ALLOCS 4096

struct alloc {
	char tag[128];
	void *ptr;
	size_t size;
};

static gmb_client *client;
static struct alloc allocs[MAX_ALLOCS];
static int nallocs;
static int refuse_control; /* bit GMB_OP_PAUSE, bit GMB_OP_RESUME */
static int controls_seen;

static int on_control(void *arg, int op, const char *tag)
{
	controls_seen++;
	return refuse_control & (1 << op) ? -EBUSY : 0;
}

static const char *tag_arg(const char *t)
{
	return strcmp(t, "*") ? t : NULL;
}

static int cmd_malloc(const char *tag, size_t size, int dev, char *out, size_t cap)
{
	void *p;
	int rc;

	if (nallocs == MAX_ALLOCS)
		return -ENOSPC;
	rc = gmb_malloc(client, &p, size, dev, tag);
	if (rc)
		return rc;
	snprintf(allocs[nallocs].tag, sizeof(allocs[nallocs].tag), "%s", tag);
	allocs[nallocs].ptr = p;
	allocs[nallocs].size = size;
	nallocs++;
	snprintf(out, cap, "%p", p);
	return 0;
}

static int cmd_bytes(const char *tag, int byte, int check)
{
	for (int i = 0; i < nallocs; i++) {
		unsigned char *p = allocs[i].ptr;

		if (strcmp(allocs[i].tag, tag))
			continue;
		if (!check) {
			memset(p, byte, allocs[i].size);
			continue;
		}
		for (size_t j = 0; j < allocs[i].size; j++)
			if (p[j] != (unsigned char)byte)
				return -EILSEQ;
	}
	return 0;
}

static int cmd_free(const char *tag)
{
	int rc = 0, kept = 0;

	for (int i = 0; i < nallocs; i++) {
		if (strcmp(allocs[i].tag, tag)) {
			allocs[kept++] = allocs[i];
			continue;
		}
		int r = gmb_free(client, allocs[i].ptr);

		if (r && !rc)
			rc = r;
	}
	nallocs = kept;
	return rc;
}

static int cmd_mode(const char *tag, const char *mode)
{
	int m = !strcmp(mode, "zero")	  ? GMB_MODE_ZERO :
		!strcmp(mode, "preserve") ? GMB_MODE_PRESERVE :
					    GMB_MODE_DISCARD;

	return gmb_tag_set_mode(client, tag, m);
}

static int cmd_status(char *out, size_t cap)
{
	char *json = NULL;
	int rc = gmb_status_json(client, &json);

	if (rc)
		return rc;
	for (char *p = json; *p; p++)
		if (*p == '\n')
			*p = ' ';
	snprintf(out, cap, "%s", json);
	free(json);
	return 0;
}

static int cmd_addr(const char *tag, char *out, size_t cap)
{
	for (int i = 0; i < nallocs; i++) {
		if (!strcmp(allocs[i].tag, tag)) {
			snprintf(out, cap, "%p", allocs[i].ptr);
			return 0;
		}
	}
	return -ENOENT;
}

/* The versions this worker published, kept open at their pointers. */
static struct {
	char name[128];
	void *ptr;
	size_t size;
} published[64];
static int npublished;

static int cmd_publish(const char *tag, const char *name, char *out, size_t cap)
{
	uint64_t version = 0;
	int rc;

	for (int i = 0; i < nallocs; i++) {
		if (strcmp(allocs[i].tag, tag))
			continue;
		if (npublished == 64)
			return -ENOSPC;
		rc = gmb_object_publish(client, name, allocs[i].ptr, "meta", 4, &version);
		if (rc)
			return rc;
		snprintf(published[npublished].name, sizeof(published[0].name), "%s", name);
		published[npublished].size = allocs[i].size;
		published[npublished++].ptr = allocs[i].ptr;
		allocs[i] = allocs[--nallocs];
		snprintf(out, cap, "%llu", (unsigned long long)version);
		return 0;
	}
	return -ENOENT;
}

static int cmd_object_close(const char *name)
{
	for (int i = npublished - 1; i >= 0; i--) {
		if (strcmp(published[i].name, name))
			continue;
		int rc = gmb_object_close(client, published[i].ptr);

		published[i] = published[--npublished];
		return rc;
	}
	return -ENOENT;
}

/* Reads the version the last publish of @name left open (read-only). */
static int cmd_object_check(const char *name, int byte)
{
	for (int i = npublished - 1; i >= 0; i--) {
		const unsigned char *p = published[i].ptr;

		if (strcmp(published[i].name, name))
			continue;
		for (size_t j = 0; j < published[i].size; j++)
			if (p[j] != (unsigned char)byte)
				return -EILSEQ;
		return 0;
	}
	return -ENOENT;
}

static int run(char *line, char *out, size_t cap)
{
	char a[128] = "", b[128] = "", c[64] = "";
	char verb[32] = "";
	int n = sscanf(line, "%31s %127s %127s %63s", verb, a, b, c);

	if (n < 1)
		return -EINVAL;
	if (!strcmp(verb, "uid"))
		return setuid((uid_t)atoi(a)) ? -errno : 0;
	if (!strcmp(verb, "connect"))
		return gmb_connect(NULL, a, &client);
	if (!strcmp(verb, "env"))
		return setenv(a, b, 1) ? -errno : 0;
	if (!client)
		return -ENOTCONN;
	if (!strcmp(verb, "handler")) {
		refuse_control = !strcmp(a, "refuse") ? (1 << GMB_OP_PAUSE) | (1 << GMB_OP_RESUME) :
				 !strcmp(a, "refuse-pause")  ? 1 << GMB_OP_PAUSE :
				 !strcmp(a, "refuse-resume") ? 1 << GMB_OP_RESUME :
							       0;
		return gmb_set_control_handler(client, on_control, NULL);
	}
	if (!strcmp(verb, "wait")) {
		return gmb_set_wait(client, (uint32_t)strtoul(a, NULL, 0));
	}
	if (!strcmp(verb, "mode"))
		return cmd_mode(a, b);
	if (!strcmp(verb, "malloc"))
		return cmd_malloc(a, strtoull(b, NULL, 0), n > 3 ? atoi(c) : 0, out, cap);
	if (!strcmp(verb, "fill") || !strcmp(verb, "check"))
		return cmd_bytes(a, (int)strtol(b, NULL, 0), verb[0] == 'c');
	if (!strcmp(verb, "addr"))
		return cmd_addr(a, out, cap);
	if (!strcmp(verb, "free"))
		return cmd_free(a);
	if (!strcmp(verb, "pause"))
		return gmb_pause(client, tag_arg(a));
	if (!strcmp(verb, "resume"))
		return gmb_resume(client, tag_arg(a));
	if (!strcmp(verb, "poll")) {
		int r = gmb_poll(client, atoi(a));

		snprintf(out, cap, "%d controls=%d", r, controls_seen);
		return r < 0 ? r : 0;
	}
	if (!strcmp(verb, "status"))
		return cmd_status(out, cap);
	if (!strcmp(verb, "publish"))
		return cmd_publish(a, b, out, cap);
	if (!strcmp(verb, "object_close"))
		return cmd_object_close(a);
	if (!strcmp(verb, "object_check"))
		return cmd_object_check(a, (int)strtol(b, NULL, 0));
	if (!strcmp(verb, "object_pause"))
		return gmb_object_pause(client, a, !strcmp(b, "discard"));
	if (!strcmp(verb, "object_resume"))
		return gmb_object_resume(client, a);
	return -EINVAL;
}

int main(void)
{
	static char out[1 << 16];
	char line[512];

	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		int rc;

		if (!strncmp(line, "quit", 4))
			break;
		out[0] = 0;
		rc = run(line, out, sizeof(out));
		if (rc && !out[0])
			snprintf(out, sizeof(out), "%s",
				 client && *gmb_last_error(client) ? gmb_last_error(client) :
								     gmb_strerror(rc));
		printf("%d %s\n", rc, out);
	}
	gmb_close(client);
	return 0;
}
