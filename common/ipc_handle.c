/*
 * ipc_handle.c - the 64-byte handle of memory shared between processes:
 * encoding and the checks of its form. Whether a well-formed handle names
 * anything is gmbd's question (daemon/core/import.c), not this file's.
 */
#include "common/ipc_handle.h"

#include <errno.h>
#include <string.h>

static const uint8_t ipc_handle_magic[6] = { 'G', 'M', 'B', 'I', 'P', 'C' };

static void ipc_handle_put(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t ipc_handle_get(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

void ipc_handle_encode(const struct ipc_handle *h, uint8_t *out)
{
	memset(out, 0, IPC_HANDLE_SIZE);
	memcpy(out, ipc_handle_magic, sizeof(ipc_handle_magic));
	out[6] = IPC_HANDLE_VERSION;
	out[7] = 0; /* flags */
	ipc_handle_put(out + 8, h->instance, 8);
	ipc_handle_put(out + 16, h->owner, 8);
	ipc_handle_put(out + 24, h->alloc, 8);
	ipc_handle_put(out + 32, h->gen, 8);
	ipc_handle_put(out + 40, h->range_off, 8);
	ipc_handle_put(out + 48, h->dev, 4);
	memcpy(out + 52, h->token, IPC_HANDLE_TOKEN);
}

bool ipc_handle_is_gmb(const uint8_t *in)
{
	return in && memcmp(in, ipc_handle_magic, sizeof(ipc_handle_magic)) == 0;
}

int ipc_handle_decode(const uint8_t *in, struct ipc_handle *h)
{
	if (!ipc_handle_is_gmb(in) || in[6] != IPC_HANDLE_VERSION || in[7] != 0)
		return -EINVAL;
	h->instance = ipc_handle_get(in + 8, 8);
	h->owner = ipc_handle_get(in + 16, 8);
	h->alloc = ipc_handle_get(in + 24, 8);
	h->gen = ipc_handle_get(in + 32, 8);
	h->range_off = ipc_handle_get(in + 40, 8);
	h->dev = (uint32_t)ipc_handle_get(in + 48, 4);
	memcpy(h->token, in + 52, IPC_HANDLE_TOKEN);
	if (!h->instance || !h->owner || !h->alloc || !h->gen)
		return -EINVAL;
	return 0;
}
