/*
 * worker_assert.h - Criterion assertions over tests/util.h's workers, for
 * the integration tests that drive them: a command that must succeed, a
 * worker that must connect, and gmbd's status read by a tool.
 */
#ifndef GMB_TESTS_WORKER_ASSERT_H
#define GMB_TESTS_WORKER_ASSERT_H

#include <criterion/criterion.h>
#include <criterion/new/assert.h>

#include "include/gmb.h"
#include "tests/util.h"

/* @cmd must answer 0; its answer goes to @out (@cap bytes) when given. */
static inline void worker_ok(struct worker *w, char *out, size_t cap, const char *cmd)
{
	char text[512] = "";
	int rc = worker_cmd(w, out ? out : text, out ? cap : sizeof(text), "%s", cmd);

	cr_assert(eq(i32, rc, 0), "'%s' failed: %s", cmd, out ? out : text);
}

/* A worker connected to gmbd on @sock as @name. */
static inline void worker_up_on(struct worker *w, const char *sock, const char *name)
{
	char text[512] = "";

	cr_assert(eq(i32, worker_connect(w, sock, name, text, sizeof(text)), 0), "%s", text);
}

/* gmbd's status on @sock as a tool sees it (malloc'd JSON). */
static inline char *status_json_on(const char *sock)
{
	gmb_client *t;
	char *json = NULL;

	cr_assert(eq(i32, gmb_connect_flags(sock, "probe", GMB_CONNECT_TOOL, &t), 0));
	cr_assert(eq(i32, gmb_status_json(t, &json), 0));
	gmb_close(t);
	return json;
}

#endif
