/*
 * wire.c - framing of gmbd's protocol for both sides: one packed
 * Gmb__Envelope per SOCK_SEQPACKET packet, chunk fds in SCM_RIGHTS.
 *
 * Invariants:
 *   - Every limit (WIRE_MAX_MSG bytes, WIRE_MAX_FDS fds, fd count equal to
 *     the envelope's fd_chunks) is checked here and only here.
 *   - A packet is sized with MSG_PEEK|MSG_TRUNC before anything is allocated
 *     for it; an oversized one is consumed into a scratch byte and refused.
 *   - Received fds are O_CLOEXEC (MSG_CMSG_CLOEXEC) and belong to the caller
 *     only on success; every error path closes them.
 *   - An empty packet is never sent: on SOCK_SEQPACKET a zero-length read is
 *     how end of stream looks, so the receiver could not tell them apart.
 *   - One thread reads a given socket at a time (peek and read must see the
 *     same packet).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/wire.h"

/* Ancillary buffer for the largest fd batch, aligned for struct cmsghdr. */
union wire_cmsg_buf {
	char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
	struct cmsghdr align;
};

static int wire_fill_addr(const char *path, struct sockaddr_un *addr)
{
	size_t len;

	if (!path || !*path)
		return -EINVAL;
	len = strlen(path);
	if (len >= sizeof(addr->sun_path))
		return -ENAMETOOLONG;
	memset(addr, 0, sizeof(*addr));
	addr->sun_family = AF_UNIX;
	memcpy(addr->sun_path, path, len + 1);
	return 0;
}

int wire_pack(const Gmb__Envelope *env, uint8_t **buf, size_t *len)
{
	size_t size;
	uint8_t *p;

	if (!env || !buf || !len)
		return -EINVAL;
	size = gmb__envelope__get_packed_size(env);
	if (size > WIRE_MAX_MSG)
		return -EMSGSIZE;
	/* An all-default envelope packs to nothing; see the file comment. */
	if (size == 0)
		return -EINVAL;
	p = malloc(size);
	if (!p)
		return -ENOMEM;
	*len = gmb__envelope__pack(env, p);
	*buf = p;
	return 0;
}

int wire_send_packed(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds)
{
	union wire_cmsg_buf cbuf;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (!buf || len == 0 || nfds < 0 || (nfds > 0 && !fds))
		return -EINVAL;
	if (len > WIRE_MAX_MSG || nfds > WIRE_MAX_FDS)
		return -EMSGSIZE;
	if (nfds > 0) {
		struct cmsghdr *c;

		memset(&cbuf, 0, sizeof(cbuf));
		msg.msg_control = cbuf.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	/* SOCK_SEQPACKET sends all or nothing; anything else is not our socket. */
	if ((size_t)n != len)
		return -EIO;
	return 0;
}

int wire_send(int sock, const Gmb__Envelope *env, const int *fds, int nfds)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	rc = wire_pack(env, &buf, &len);
	if (rc < 0)
		return rc;
	rc = wire_send_packed(sock, buf, len, fds, nfds);
	free(buf);
	return rc;
}

void wire_close_fds(int *fds, int n)
{
	if (!fds)
		return;
	for (int i = 0; i < n; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
}

/* Size of the next packet without consuming it; 0 means end of stream. */
static ssize_t wire_peek_size(int sock)
{
	char byte;
	ssize_t n;

	do
		n = recv(sock, &byte, 1, MSG_PEEK | MSG_TRUNC);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

/* Copies the SCM_RIGHTS fds of @msg to @fds; any other ancillary is ignored. */
static int wire_take_fds(struct msghdr *msg, int *fds)
{
	int nfds = 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		/* The buffer has room for WIRE_MAX_FDS only, so n cannot exceed it. */
		if (n > (size_t)(WIRE_MAX_FDS - nfds))
			n = (size_t)(WIRE_MAX_FDS - nfds);
		memcpy(fds + nfds, CMSG_DATA(c), n * sizeof(int));
		nfds += (int)n;
	}
	return nfds;
}

/*
 * Reads the packet that wire_peek_size() saw into @buf (@cap bytes; a scratch
 * byte when oversized). Return: bytes read, or -errno; fds in @fds/@nfds.
 */
static ssize_t wire_read_packet(int sock, uint8_t *buf, size_t cap, int *fds, int *nfds, int *flags)
{
	union wire_cmsg_buf cbuf;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = cbuf.buf,
		.msg_controllen = sizeof(cbuf.buf),
	};
	ssize_t n;

	*nfds = 0;
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	*nfds = wire_take_fds(&msg, fds);
	*flags = msg.msg_flags;
	return n;
}

static int wire_recv_checked(const uint8_t *buf, size_t len, int nfds, Gmb__Envelope **env)
{
	Gmb__Envelope *e;

	e = gmb__envelope__unpack(NULL, len, buf);
	if (!e)
		return -EPROTO;
	if (e->n_fd_chunks != (size_t)nfds) {
		gmb__envelope__free_unpacked(e, NULL);
		return -EPROTO;
	}
	*env = e;
	return 0;
}

int wire_recv(int sock, Gmb__Envelope **env, int *fds, int *nfds)
{
	uint8_t scratch, *buf = &scratch;
	int flags = 0, rc;
	ssize_t size, n;
	size_t cap = 1;

	if (!env || !fds || !nfds)
		return -EINVAL;
	*env = NULL;
	*nfds = 0;
	size = wire_peek_size(sock);
	if (size < 0)
		return (int)size;
	if (size > 0 && size <= WIRE_MAX_MSG) {
		buf = malloc((size_t)size);
		if (!buf)
			return -ENOMEM;
		cap = (size_t)size;
	}
	n = wire_read_packet(sock, buf, cap, fds, nfds, &flags);
	if (n < 0) {
		rc = (int)n;
		goto out_buf;
	}
	if (n == 0)
		rc = -ECONNRESET;
	else if (flags & MSG_CTRUNC)
		rc = -EPROTO;
	else if (size > WIRE_MAX_MSG || (flags & MSG_TRUNC))
		rc = -EMSGSIZE;
	else
		rc = wire_recv_checked(buf, (size_t)n, *nfds, env);
	if (rc < 0) {
		wire_close_fds(fds, *nfds);
		*nfds = 0;
	}
out_buf:
	if (buf != &scratch)
		free(buf);
	return rc;
}

/*
 * A socket file is stale when nobody accepts on it. Return: 0 when stale (or
 * gone), -EADDRINUSE when something listens or the file is not a socket.
 */
static int wire_probe_stale(const struct sockaddr_un *addr)
{
	struct stat st;
	int fd, rc;

	if (lstat(addr->sun_path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	/* Never unlink what is not ours to replace, such as a regular file. */
	if (!S_ISSOCK(st.st_mode))
		return -EADDRINUSE;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	rc = connect(fd, (const struct sockaddr *)addr, sizeof(*addr));
	/* EAGAIN: a full backlog, so someone listens; EPROTOTYPE: a live socket of another type. */
	if (rc == 0 || errno == EAGAIN || errno == EPROTOTYPE || errno == EINTR)
		rc = -EADDRINUSE;
	else if (errno == ECONNREFUSED || errno == ENOENT)
		rc = 0;
	else
		rc = -errno;
	close(fd);
	return rc;
}

static int wire_bind(int fd, const struct sockaddr_un *addr)
{
	int rc;

	if (bind(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0)
		return 0;
	if (errno != EADDRINUSE)
		return -errno;
	rc = wire_probe_stale(addr);
	if (rc < 0)
		return rc;
	if (unlink(addr->sun_path) < 0 && errno != ENOENT)
		return -errno;
	if (bind(fd, (const struct sockaddr *)addr, sizeof(*addr)) < 0)
		return -errno;
	return 0;
}

/* A new AF_UNIX socket of @type (with flags) for @path, whose address goes
 * to @addr. Return: the fd, the caller's to close, or a negative errno. */
static int wire_socket(const char *path, int type, struct sockaddr_un *addr)
{
	int s, rc = wire_fill_addr(path, addr);

	if (rc < 0)
		return rc;
	s = socket(AF_UNIX, type, 0);
	return s < 0 ? -errno : s;
}

int wire_listen(const char *path, int *fd)
{
	struct sockaddr_un addr;
	int s, rc;

	if (!fd)
		return -EINVAL;
	s = wire_socket(path, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, &addr);
	if (s < 0)
		return s;
	rc = wire_bind(s, &addr);
	if (rc < 0)
		goto out_socket;
	if (listen(s, SOMAXCONN) < 0) {
		rc = -errno;
		goto out_socket;
	}
	*fd = s;
	return 0;

out_socket:
	close(s);
	return rc;
}

/* connect()'s errno as a negative one; a file that is there but no socket
 * (connect() says ECONNREFUSED for it too) is -ENOTSOCK. */
static int wire_connect_errno(const char *path, int err)
{
	struct stat st;

	if (err == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
		return -ENOTSOCK;
	return -err;
}

int wire_connect(const char *path, int *fd)
{
	struct sockaddr_un addr;
	int s, rc;

	if (!fd)
		return -EINVAL;
	s = wire_socket(path, SOCK_SEQPACKET | SOCK_CLOEXEC, &addr);
	if (s < 0)
		return s;
	/* An AF_UNIX connect interrupted while waiting for backlog room never completed. */
	do
		rc = connect(s, (const struct sockaddr *)&addr, sizeof(addr));
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		rc = wire_connect_errno(path, errno);
		goto out_socket;
	}
	*fd = s;
	return 0;

out_socket:
	close(s);
	return rc;
}

int wire_connect_timed(const char *path, unsigned timeout_s, int *fd)
{
	struct timeval tv = { .tv_sec = timeout_s };
	struct sockaddr_un addr;
	int s, rc;

	if (!fd)
		return -EINVAL;
	s = wire_socket(path, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, &addr);
	if (s < 0)
		return s;
	/* Non-blocking: with a full backlog connect() fails (EAGAIN) instead of
	 * hanging where the caller's shutdown() could not reach it. */
	if (connect(s, (const struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    fcntl(s, F_SETFL, 0) < 0 ||
	    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
		rc = -errno;
		goto out_socket;
	}
	*fd = s;
	return 0;

out_socket:
	close(s);
	return rc;
}

const char *wire_default_socket(void)
{
	const char *p = getenv("GMB_SOCKET");

	return p && *p ? p : WIRE_DEFAULT_SOCKET;
}
