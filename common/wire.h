/*
 * wire.h - framing of gmbd's protocol, for both sides.
 *
 * One packet = one packed Gmb__Envelope (proto/gmb.proto) on a
 * SOCK_SEQPACKET socket, with up to WIRE_MAX_FDS descriptors in SCM_RIGHTS.
 * Limits are checked here, once: a packet over WIRE_MAX_MSG is consumed and
 * refused without allocating for it; lost fds (MSG_CTRUNC) and a count that
 * differs from the envelope's fd_chunks are protocol errors. Received fds are
 * O_CLOEXEC and are closed on every error path.
 */
#ifndef GMB_WIRE_H
#define GMB_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/gmb.pb-c.h"

#define GMB_PROTOCOL_VERSION 1
#define WIRE_MAX_MSG	     (64 * 1024)
#define WIRE_MAX_FDS	     253
/* Requests one client may have unanswered at the daemon. */
#define WIRE_MAX_INFLIGHT    64
#define WIRE_MAX_NAME	     128 /* client names and tags, bytes */
/* gmbd's socket when neither an option nor $GMB_SOCKET names one. */
#define WIRE_DEFAULT_SOCKET  "/run/gmbd/gmbd.sock"

/**
 * wire_send() - pack @env and send it with @fds in one packet.
 * @fds stay owned by the caller. Non-blocking sockets may return -EAGAIN,
 * in which case nothing was sent.
 * Return: 0, -EMSGSIZE (over WIRE_MAX_MSG or too many fds), -EAGAIN, -EPIPE...
 */
int wire_send(int sock, const Gmb__Envelope *env, const int *fds, int nfds);

/** wire_pack() - pack @env into a malloc'd buffer owned by the caller. */
int wire_pack(const Gmb__Envelope *env, uint8_t **buf, size_t *len);

/** wire_send_packed() - send an already packed message; @fds stay the caller's. */
int wire_send_packed(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds);

/**
 * wire_recv() - receive one packet.
 * @env:  receives the unpacked envelope, owned by the caller
 *        (gmb__envelope__free_unpacked(env, NULL)).
 * @fds:  room for WIRE_MAX_FDS; receives fds owned by the caller.
 * @nfds: receives the count (== env->n_fd_chunks).
 * Return: 0; -EAGAIN when nothing is queued (non-blocking); -ECONNRESET at
 * end of stream; -EMSGSIZE for an oversized packet (consumed, fds closed);
 * -EPROTO for an undecodable packet, lost fds or an fd count mismatch
 * (consumed, fds closed); another negative errno.
 */
int wire_recv(int sock, Gmb__Envelope **env, int *fds, int *nfds);

/** wire_close_fds() - close @n fds and set them to -1. */
void wire_close_fds(int *fds, int n);

/**
 * wire_listen() - create, bind and listen a SOCK_SEQPACKET socket at @path
 * (a stale socket file is replaced; a live one is -EADDRINUSE).
 * The fd (O_CLOEXEC, non-blocking) is the caller's.
 */
int wire_listen(const char *path, int *fd);

/** wire_connect() - connect to @path; blocking, O_CLOEXEC fd is the caller's.
 * Return: 0 or a negative errno; -ENOTSOCK for a file that is not a socket. */
int wire_connect(const char *path, int *fd);

/**
 * wire_connect_timed() - connect to @path without waiting for backlog room
 * (a full backlog is -EAGAIN), then blocking with send and receive timeouts
 * of @timeout_s seconds. The O_CLOEXEC fd is the caller's.
 */
int wire_connect_timed(const char *path, unsigned timeout_s, int *fd);

/** wire_default_socket() - $GMB_SOCKET if set, else /run/gmbd/gmbd.sock. */
const char *wire_default_socket(void);

#endif
