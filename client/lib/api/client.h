/*
 * client.h - the client behind include/gmb.h's opaque gmb_client: one
 * connection (client/lib/conn/), the memory on it (client/lib/mem/), and
 * what the API keeps itself.
 *
 * Layer: the top of libgmb. api.c registers the callbacks that the
 * connection calls up through (its own for ControlCommands, the memory
 * layer's for imports, drops and the re-announcement, reconnect.c's for a
 * loss) and the one the memory layer's re-announcement calls (the IPC
 * layer's list of imports), and every lower layer is reached from here
 * only by calls down. The exported calls are api.c's (this client's own
 * operations), query.c's (round trips to gmbd) and object.c's (named
 * objects).
 * The hooks (client/lib/hook/) sit above it and use this header.
 */
#ifndef GMB_CLIENT_API_CLIENT_H
#define GMB_CLIENT_API_CLIENT_H

#include "client/lib/conn/conn.h"
#include "client/lib/ipc/ipc.h"
#include "client/lib/mem/mem.h"
#include "include/gmb.h"

struct gmb_client {
	struct gmb__conn conn; /* first: the locks every layer shares */
	struct gmb__mem mem;
	struct gmb__ipc ipc; /* imports of other processes' memory, under op_lock */
	/* Under conn.lock. */
	gmb_control_fn control_fn;
	void *control_arg;
	char last_error[ERR_MSG_MAX];
};

/*
 * gmb__api_done() - how every exported call of api.c and query.c ends:
 * @rc as it is, and on failure @err (or, empty, gmb_strerror(@rc)) copied
 * into @c's last_error under conn.lock. Return: @rc.
 */
int gmb__api_done(struct gmb_client *c, int rc, const char *err);

/*
 * gmb__status_device() (query.c) - device @index's budget and lent bytes, from a
 * StatusRequest. Return: 0; -ENODEV when gmbd's status lacks the device;
 * or the request's failure, which is also gmb_last_error(@c).
 */
int gmb__status_device(struct gmb_client *c, uint32_t index, uint64_t *budget, uint64_t *used);

/* gmb_malloc() with the allocation's own mode and backup (@how NULL: the
 * tag's) and peer devices (@peers: bits of this process's ordinals); @pc:
 * who calls, for packing (gmb_set_pack()). */
int gmb__malloc_how(struct gmb_client *c, void **ptr, size_t size, int device, const char *tag,
		    const struct gmb__mem_how *how, uint64_t peers, enum gmb__pack_class pc);

#endif
