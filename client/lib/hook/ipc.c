/*
 * ipc.c - the exported calls of memory shared between processes
 * (gmb_ipc_get_handle, gmb_ipc_open, gmb_ipc_close, gmb_ipc_is_handle,
 * gmb_ipc_grant, gmb_ipc_revoke):
 * the client they name (NULL: the process's default client, which an open
 * connects when it must), the operation lock, and the failure sentence in
 * both gmb_last_error() and gmb_region_last_error(), since the preload
 * shim's cudaIpc* calls reach them as hooks do. The work is
 * client/lib/ipc/ipc.c's.
 */
#include <errno.h>
#include <stdint.h>

#include "client/lib/api/client.h"
#include "client/lib/hook/hook.h"
#include "client/lib/ipc/ipc.h"

/* Records @rc's sentence for @c and the calling thread; returns @rc. */
static int hook_ipc_done(struct gmb_client *c, int rc, const char *err, const char *what)
{
	if (rc >= 0 || rc == -ENXIO)
		return rc;
	pthread_mutex_lock(&c->conn.lock);
	err_fmt(c->last_error, rc, "%s", *err ? err : gmb_strerror(rc));
	pthread_mutex_unlock(&c->conn.lock);
	return gmb__hook_fail_client(rc, c, what);
}

/* @c (NULL: the default client, not made here) if @ptr may be its gmbd
 * memory, else NULL: the pointer is the runtime's. */
static struct gmb_client *hook_ipc_mine(struct gmb_client *c, const void *ptr)
{
	if (!c)
		c = gmb__hook_client_peek();
	return c && gmb__ipc_maybe_ours(&c->mem, &c->ipc, ptr) ? c : NULL;
}

GMB_API int gmb_ipc_is_handle(const void *handle)
{
	return ipc_handle_is_gmb(handle);
}

GMB_API int gmb_ipc_get_handle(gmb_client *c, const void *ptr, void *handle)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	c = hook_ipc_mine(c, ptr);
	if (!c)
		return -ENXIO; /* the runtime's, at once */
	gmb__op_begin(&c->conn);
	rc = gmb__ipc_get_handle(&c->mem, &c->ipc, ptr, handle, err);
	gmb__op_end(&c->conn);
	return hook_ipc_done(c, rc, err, "sharing gmbd memory");
}

GMB_API int gmb_ipc_open(gmb_client *c, const void *handle, int device, void **ptr)
{
	char err[ERR_MSG_MAX] = "";
	int rc, dev = -1;

	if (!handle || !ipc_handle_is_gmb(handle))
		return -ENXIO;
	if (!c) {
		rc = gmb_default_client(NULL, NULL, &c);
		if (rc < 0)
			return gmb__hook_fail_client(rc, NULL,
						     "connecting to gmbd to open a handle");
	}
	gmb__op_begin(&c->conn);
	rc = device >= 0 ? dev = gmb__mem_dev_index(&c->mem, device, err) : 0;
	if (rc >= 0)
		rc = gmb__ipc_open(&c->mem, &c->ipc, handle, dev, ptr, err);
	gmb__op_end(&c->conn);
	return hook_ipc_done(c, rc, err, "opening a gmbd handle");
}

GMB_API int gmb_ipc_close(gmb_client *c, void *ptr)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	c = hook_ipc_mine(c, ptr);
	if (!c)
		return -ENXIO;
	gmb__op_begin(&c->conn);
	rc = gmb__ipc_close(&c->mem, &c->ipc, ptr, err);
	gmb__op_end(&c->conn);
	return hook_ipc_done(c, rc, err, "closing a gmbd import");
}

static int hook_ipc_grant(gmb_client *c, const void *ptr, uint32_t uid, bool revoke)
{
	char err[ERR_MSG_MAX] = "";
	int rc;

	c = hook_ipc_mine(c, ptr);
	if (!c)
		return -ENXIO;
	gmb__op_begin(&c->conn);
	rc = gmb__ipc_grant(&c->mem, ptr, uid, revoke, err);
	gmb__op_end(&c->conn);
	return hook_ipc_done(c, rc, err, revoke ? "revoking a grant" : "granting an import");
}

GMB_API int gmb_ipc_grant(gmb_client *c, const void *ptr, uint32_t uid)
{
	return hook_ipc_grant(c, ptr, uid, false);
}

GMB_API int gmb_ipc_revoke(gmb_client *c, const void *ptr, uint32_t uid)
{
	return hook_ipc_grant(c, ptr, uid, true);
}
