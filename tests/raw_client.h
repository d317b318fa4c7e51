/*
 * raw_client.h - a client of gmbd that speaks the protocol by hand, for
 * tests that send what libgmb never would (bad packets, many requests
 * without reading) and read each reply themselves. Plain functions that
 * return 0 or a negative errno, no assertions: bench programs link them too.
 */
#ifndef GMB_TEST_RAW_CLIENT_H
#define GMB_TEST_RAW_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/gmb.pb-c.h"

/* A blocking connection to the gmbd at @sock in *@fd (the caller's). */
int raw_client_connect(const char *sock, int *fd);

/* Sends @env, no fds; @env stays the caller's. */
int raw_client_send(int fd, const Gmb__Envelope *env);

/*
 * raw_client_reply() - reads the parts of the next reply up to its last
 * (the one without more), closing the fds that came with them.
 * Return: 0 with *@out the last part (the caller's to free with
 * gmb__envelope__free_unpacked), or the receive's negative errno.
 */
int raw_client_reply(int fd, Gmb__Envelope **out);

/*
 * raw_client_request() - sends @env and reads its reply: *@status is the
 * reply's status, its error sentence goes to @error (@cap bytes; may be
 * NULL). Return: 0, the send's or receive's negative errno, or -EBADMSG
 * when the reply answers another request.
 */
int raw_client_request(int fd, const Gmb__Envelope *env, int *status, char *error, size_t cap);

/*
 * raw_client_hello_env() - makes *@env (request id 1) carry *@h, a hello of
 * the current protocol named @name; both are the caller's, to change
 * further (a tool, a rejoin) before sending.
 */
void raw_client_hello_env(Gmb__Envelope *env, Gmb__Hello *h, const char *name);

/* Waits up to @timeout_ms for gmbd to close @fd (EOF or a reset), reading
 * and dropping what it sends meanwhile. Return: 0 once closed, -ETIMEDOUT. */
int raw_client_wait_closed(int fd, int timeout_ms);

/* A hello of protocol @version named "raw", request id 1: 0 or -errno as
 * raw_client_request(), the reply's status in *@status. */
int raw_client_hello(int fd, uint32_t version, int *status);

#endif
