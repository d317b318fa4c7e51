/*
 * raw_client.c - the protocol by hand over common/wire.c, for tests.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>

#include "common/wire.h"
#include "tests/raw_client.h"

int raw_client_connect(const char *sock, int *fd)
{
	return wire_connect(sock, fd);
}

int raw_client_send(int fd, const Gmb__Envelope *env)
{
	return wire_send(fd, env, NULL, 0);
}

int raw_client_reply(int fd, Gmb__Envelope **out)
{
	Gmb__Envelope *r = NULL;
	int fds[WIRE_MAX_FDS], nfds, rc;

	do {
		if (r)
			gmb__envelope__free_unpacked(r, NULL);
		rc = wire_recv(fd, &r, fds, &nfds);
		if (rc < 0)
			return rc;
		wire_close_fds(fds, nfds);
	} while (r->more);
	*out = r;
	return 0;
}

int raw_client_request(int fd, const Gmb__Envelope *env, int *status, char *error, size_t cap)
{
	Gmb__Envelope *r;
	int rc;

	rc = raw_client_send(fd, env);
	if (rc == 0)
		rc = raw_client_reply(fd, &r);
	if (rc < 0)
		return rc;
	rc = r->reply_to == env->id ? 0 : -EBADMSG;
	*status = r->status;
	if (error)
		snprintf(error, cap, "%s", r->error ? r->error : "");
	gmb__envelope__free_unpacked(r, NULL);
	return rc;
}

void raw_client_hello_env(Gmb__Envelope *env, Gmb__Hello *h, const char *name)
{
	gmb__envelope__init(env);
	gmb__hello__init(h);
	h->version = GMB_PROTOCOL_VERSION;
	h->name = (char *)name;
	env->id = 1;
	env->body_case = GMB__ENVELOPE__BODY_HELLO;
	env->hello = h;
}

int raw_client_hello(int fd, uint32_t version, int *status)
{
	Gmb__Envelope env;
	Gmb__Hello h;

	raw_client_hello_env(&env, &h, "raw");
	h.version = version;
	return raw_client_request(fd, &env, status, NULL, 0);
}

int raw_client_wait_closed(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char buf[WIRE_MAX_MSG];

	for (int waited = 0; waited < timeout_ms; waited += 100) {
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return 0;
	}
	return -ETIMEDOUT;
}
