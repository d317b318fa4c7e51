/*
 * ipc_handle.h - the 64-byte handle of memory shared between processes
 * (CUDA IPC on gmbd memory), as both sides read it: gmbd makes it
 * (daemon/core/import_export.c) and checks it (daemon/core/import.c),
 * libgmb reads it to tell its own handles from the runtime's and to map
 * one allocation once however many handles of it a process opens
 * (client/lib/ipc/).
 *
 * Layout (little-endian, reserved bytes zero, README "Sharing memory
 * between processes"): magic "GMBIPC" + version + flags (8), gmbd instance
 * (8), owner client id (8), allocation id (8), generation = export id (8),
 * range offset (8), device (4), token (12). The same fields always encode
 * to the same bytes.
 */
#ifndef GMB_IPC_HANDLE_H
#define GMB_IPC_HANDLE_H

#include <stdbool.h>
#include <stdint.h>

#define IPC_HANDLE_SIZE	   64
#define IPC_HANDLE_TOKEN   12
#define IPC_HANDLE_VERSION 1

struct ipc_handle {
	uint64_t instance;  /* gmbd's, random at its start */
	uint64_t owner;	    /* the exporter's client id */
	uint64_t alloc;	    /* the allocation's id */
	uint64_t gen;	    /* the export's id: never reused by one gmbd */
	uint64_t range_off; /* offset of the chunk holding the exported pointer */
	uint32_t dev;	    /* gmbd's device index */
	uint8_t token[IPC_HANDLE_TOKEN];
};

/* @h into @out (IPC_HANDLE_SIZE bytes). */
void ipc_handle_encode(const struct ipc_handle *h, uint8_t *out);
/* Does @in (IPC_HANDLE_SIZE bytes) start with gmbd's magic (any version)? */
bool ipc_handle_is_gmb(const uint8_t *in);
/**
 * ipc_handle_decode() - @in (IPC_HANDLE_SIZE bytes) into @h.
 * Return: 0; -EINVAL when it is not gmbd's (magic), of another version,
 * or has flags or ids that no gmbd makes (0).
 */
int ipc_handle_decode(const uint8_t *in, struct ipc_handle *h);

#endif
