/*
 * handlers_fx.h - gmbd's layers as gmbd runs them, without a listener: a
 * uv loop, the host backend, a broker, the handlers and a server whose
 * sessions come only through server_adopt(). The client's end of each
 * session is a socket the caller reads and writes with wire_send() and
 * wire_recv() while it turns the loop. Plain functions that return values
 * or a negative errno, no assertions: the fuzz harness links them too.
 */
#ifndef GMB_TEST_HANDLERS_FX_H
#define GMB_TEST_HANDLERS_FX_H

#include <stdint.h>
#include <uv.h>

#include "common/backend/backend.h"
#include "daemon/core/broker.h"
#include "daemon/handlers/handlers.h"
#include "daemon/transport/server.h"
#include "proto/gmb.pb-c.h"

struct hfx {
	uv_loop_t loop;
	struct backend *be; /* owned, closed by hfx_free() */
	struct broker *br;  /* owned, freed by hfx_free() */
	struct handlers h;
	struct server *srv; /* owned until hfx_stop() */
};

/**
 * hfx_start() - a broker over a host backend of @ho with @bo, handlers
 * (control commands time out after @control_timeout_ms) and a server on a
 * new loop, all in @fx. On failure nothing is left to undo.
 * Return: 0, or the first layer's negative errno.
 */
int hfx_start(struct hfx *fx, const struct backend_host_opts *ho, const struct broker_opts *bo,
	      uint64_t control_timeout_ms);

/* Stops the server and the handlers and runs the loop until they are gone;
 * the broker stays, for the caller to check what sessions left in it. */
void hfx_stop(struct hfx *fx);

/* After hfx_stop(): frees the broker and the backend, closes the loop.
 * Return: 0, or -EBUSY when the loop still has handles. */
int hfx_free(struct hfx *fx);

/* A new session: *@fd is the client's end (the caller's), non-blocking.
 * Return: 0 or a negative errno. */
int hfx_client(struct hfx *fx, int *fd);

/* Turns the loop a few times without blocking. */
void hfx_spin(struct hfx *fx);

/* CLOCK_MONOTONIC in milliseconds. */
uint64_t hfx_now_ms(void);

/**
 * hfx_recv() - the next packet for @fd, turning the loop while none is
 * there, for @wait_ms at most. @env and @fds (room for WIRE_MAX_FDS) as
 * wire_recv(): the caller's on success.
 * Return: 0, -ETIMEDOUT, or wire_recv()'s error other than -EAGAIN.
 */
int hfx_recv(struct hfx *fx, int fd, Gmb__Envelope **env, int *fds, int *nfds, int wait_ms);

#endif
