/*
 * default.c - the process's default client, for the allocation hooks (the
 * preload shim's cudaMalloc, PyTorch's pluggable allocator, gmb_region_*).
 *
 * It is made once, on the first call that needs it, under hook_lock, and
 * published through an atomic pointer so that the hot path (gmb_owns() on
 * every cudaFree) takes no process-wide lock. It is never closed: gmbd
 * takes the memory back when the process exits. A forked child forgets it
 * (the connection and its threads belong to the parent).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/lib/api/client.h"
#include "client/lib/hook/hook.h"

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct gmb_client *) hook_client;
static pthread_once_t hook_fork_once = PTHREAD_ONCE_INIT;

static void hook_fork_prepare(void)
{
	pthread_mutex_lock(&hook_lock);
}

static void hook_fork_parent(void)
{
	pthread_mutex_unlock(&hook_lock);
}

/* The child has the parent's socket but none of its threads: drop (leak) it. */
static void hook_fork_child(void)
{
	struct gmb_client *c = atomic_exchange(&hook_client, NULL);

	if (c && c->conn.sock >= 0)
		close(c->conn.sock);
	pthread_mutex_unlock(&hook_lock);
}

static void hook_fork_install(void)
{
	pthread_atfork(hook_fork_prepare, hook_fork_parent, hook_fork_child);
}

static int hook_accept(void *arg, int op, const char *tag)
{
	return 0;
}

/* Connects with the environment's settings where @path / @name are NULL. */
static int hook_connect(const char *path, const char *name, struct gmb_client **out)
{
	const char *ctl = getenv("GMB_CONTROL");
	char dflt[WIRE_MAX_NAME + 1];
	int rc;

	if (ctl && *ctl && strcmp(ctl, "accept") != 0)
		return err_fmt(gmb__hook_err(), -EINVAL,
			       "GMB_CONTROL=\"%.64s\": the only value is accept", ctl);
	if (!name)
		name = getenv("GMB_CLIENT_NAME");
	if (!name || !*name) {
		snprintf(dflt, sizeof(dflt), "%.100s-%d", program_invocation_short_name,
			 (int)getpid());
		name = dflt;
	}
	rc = gmb_connect(path, name, out);
	if (rc < 0)
		return gmb__hook_fail_client(rc, NULL, "connecting the default client");
	if (ctl && *ctl)
		gmb_set_control_handler(*out, hook_accept, NULL);
	return 0;
}

GMB_API int gmb_default_client(const char *socket_path, const char *client_name, gmb_client **out)
{
	struct gmb_client *c = atomic_load_explicit(&hook_client, memory_order_acquire);
	int rc = 1;

	if (!out)
		return err_fmt(gmb__hook_err(), -EINVAL, "no place for the client");
	if (!c) {
		pthread_once(&hook_fork_once, hook_fork_install);
		pthread_mutex_lock(&hook_lock);
		c = atomic_load_explicit(&hook_client, memory_order_relaxed);
		if (!c) {
			rc = hook_connect(socket_path, client_name, &c);
			if (rc == 0)
				atomic_store_explicit(&hook_client, c, memory_order_release);
		}
		pthread_mutex_unlock(&hook_lock);
	}
	*out = rc < 0 ? NULL : c;
	return rc;
}

/* The default client if it exists; never connects. */
struct gmb_client *gmb__hook_client_peek(void)
{
	return atomic_load_explicit(&hook_client, memory_order_acquire);
}
