/*
 * fake_sd.c - a fake service manager for gmbd's systemd integration (see
 * util.h): the notify socket read by a thread, the fd store, and gmbd run
 * under it with a listening socket that outlives each gmbd.
 */
#include "tests/util.h"

#include "common/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- a fake service manager ---- */

static void fake_sd_store(struct fake_sd *m, const char *name, int fd)
{
	for (int i = 0; i < m->nstore; i++) {
		if (strcmp(m->store[i].name, name) == 0) {
			close(m->store[i].fd);
			m->store[i].fd = fd;
			return;
		}
	}
	if (m->limit && (unsigned)m->nstore >= m->limit) {
		/* systemd 252 logs "Cannot store more fds than
		 * FileDescriptorStoreMax=" in its own journal, nothing more. */
		m->dropped++;
		close(fd);
		return;
	}
	if (m->nstore == FAKE_SD_MAX_FDS) {
		m->overflow++;
		close(fd);
		return;
	}
	m->store[m->nstore].fd = fd;
	snprintf(m->store[m->nstore].name, sizeof(m->store[0].name), "%s", name);
	m->nstore++;
}

static void fake_sd_remove(struct fake_sd *m, const char *name)
{
	for (int i = 0; i < m->nstore;) {
		if (strcmp(m->store[i].name, name) != 0) {
			i++;
			continue;
		}
		close(m->store[i].fd);
		m->store[i] = m->store[--m->nstore];
	}
}

/* One datagram's lines, as systemd reads them. Called with m->lock held. */
static void fake_sd_parse(struct fake_sd *m, char *msg, int *fds, int nfds)
{
	const char *name = "stored";
	bool store = false, remove = false;

	for (char *line = strtok(msg, "\n"); line; line = strtok(NULL, "\n")) {
		if (!strcmp(line, "READY=1"))
			m->ready++;
		else if (!strcmp(line, "STOPPING=1"))
			m->stopping++;
		else if (!strcmp(line, "WATCHDOG=1"))
			m->watchdog++;
		else if (!strcmp(line, "SYNC=1"))
			m->syncs++;
		else if (!strcmp(line, "FDSTORE=1"))
			store = true;
		else if (!strcmp(line, "FDSTOREREMOVE=1"))
			remove = true;
		else if (!strncmp(line, "FDNAME=", 7))
			name = line + 7;
		else if (!strncmp(line, "STATUS=", 7))
			snprintf(m->status, sizeof(m->status), "%s", line + 7);
	}
	for (int i = 0; i < nfds; i++) {
		if (store)
			fake_sd_store(m, name, fds[i]);
		else
			close(fds[i]);
	}
	if (remove)
		fake_sd_remove(m, name);
}

static int fake_sd_read_one(struct fake_sd *m)
{
	char buf[4096];
	union {
		char b[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} cbuf;
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) - 1 };
	struct msghdr msg = { .msg_iov = &iov,
			      .msg_iovlen = 1,
			      .msg_control = cbuf.b,
			      .msg_controllen = sizeof(cbuf.b) };
	int fds[16], nfds = 0;
	ssize_t n = recvmsg(m->sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		memcpy(fds, CMSG_DATA(c), (size_t)nfds * sizeof(int));
	}
	pthread_mutex_lock(&m->lock);
	fake_sd_parse(m, buf, fds, nfds);
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
	return 0;
}

static void *fake_sd_main(void *arg)
{
	struct fake_sd *m = arg;

	for (;;) {
		struct pollfd p[2] = { { .fd = m->sock, .events = POLLIN },
				       { .fd = m->stop[0], .events = POLLIN } };

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		while (fake_sd_read_one(m) == 0)
			;
	}
	return NULL;
}

int fake_sd_open(struct fake_sd *m, const char *path)
{
	int fd;

	memset(m, 0, sizeof(*m));
	snprintf(m->path, sizeof(m->path), "%s", path);
	fd = test_notify_socket(path);
	if (fd < 0)
		return fd;
	m->sock = fd;
	if (pipe2(m->stop, O_CLOEXEC) < 0) {
		close(fd);
		return -errno;
	}
	/* Large enough that a burst of FDSTOREs never blocks gmbd for long. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &(int){ 4 << 20 }, sizeof(int));
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->cond, NULL);
	if (pthread_create(&m->thread, NULL, fake_sd_main, m) != 0)
		return -EAGAIN;
	return 0;
}

void fake_sd_close(struct fake_sd *m)
{
	if (write(m->stop[1], "x", 1) == 1)
		pthread_join(m->thread, NULL);
	close(m->stop[0]);
	close(m->stop[1]);
	close(m->sock);
	unlink(m->path);
	for (int i = 0; i < m->nstore; i++)
		close(m->store[i].fd);
	m->nstore = 0;
	pthread_cond_destroy(&m->cond);
	pthread_mutex_destroy(&m->lock);
}

/* Waits on the manager's condition until @done(@m, @arg) or @ms pass. */
static int fake_sd_wait(struct fake_sd *m, bool (*done)(struct fake_sd *, const void *),
			const void *arg, int ms)
{
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&m->lock);
	while (!done(m, arg) && rc == 0)
		rc = pthread_cond_timedwait(&m->cond, &m->lock, &until);
	rc = done(m, arg) ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&m->lock);
	return rc;
}

struct fake_sd_count_arg {
	const unsigned *counter;
	unsigned n;
};

static bool fake_sd_count_done(struct fake_sd *m, const void *arg)
{
	const struct fake_sd_count_arg *a = arg;

	return *a->counter >= a->n;
}

int fake_sd_wait_count(struct fake_sd *m, const unsigned *counter, unsigned n, int ms)
{
	struct fake_sd_count_arg a = { counter, n };

	return fake_sd_wait(m, fake_sd_count_done, &a, ms);
}

static bool fake_sd_status_done(struct fake_sd *m, const void *arg)
{
	return strstr(m->status, arg) != NULL;
}

int fake_sd_wait_status(struct fake_sd *m, const char *needle, int ms)
{
	return fake_sd_wait(m, fake_sd_status_done, needle, ms);
}

static bool fake_sd_status_gone(struct fake_sd *m, const void *arg)
{
	return m->status[0] && strstr(m->status, arg) == NULL;
}

int fake_sd_wait_status_not(struct fake_sd *m, const char *needle, int ms)
{
	return fake_sd_wait(m, fake_sd_status_gone, needle, ms);
}

/* Datagrams are read in order: once ours is, every earlier one is too. */
int fake_sd_sync(struct fake_sd *m)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	unsigned want;
	int fd, rc;

	pthread_mutex_lock(&m->lock);
	want = m->syncs + 1;
	pthread_mutex_unlock(&m->lock);
	if (strlen(m->path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, m->path, strlen(m->path) + 1);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	rc = sendto(fd, "SYNC=1", 6, 0, (struct sockaddr *)&sa, sizeof(sa)) == 6 ? 0 : -errno;
	close(fd);
	if (rc < 0)
		return rc;
	return fake_sd_wait_count(m, &m->syncs, want, 10000);
}

int fake_sd_count(struct fake_sd *m, const char *prefix)
{
	int n = 0;

	pthread_mutex_lock(&m->lock);
	for (int i = 0; i < m->nstore; i++)
		n += strncmp(m->store[i].name, prefix, strlen(prefix)) == 0;
	pthread_mutex_unlock(&m->lock);
	return n;
}

int fake_sd_pass(struct fake_sd *m, struct sd_pass *out, int max)
{
	int n = 0;

	pthread_mutex_lock(&m->lock);
	for (int i = 0; i < m->nstore && n < max; i++)
		out[n++] = (struct sd_pass){ .fd = m->store[i].fd, .name = m->store[i].name };
	pthread_mutex_unlock(&m->lock);
	return n;
}

int sd_gmbd_open(struct sd_gmbd *f, const char *tmpl, bool listen)
{
	int rc;

	memset(f, 0, sizeof(*f));
	f->listen_fd = -1;
	snprintf(f->dir, sizeof(f->dir), "%s", tmpl);
	if (!mkdtemp(f->dir))
		return -errno;
	snprintf(f->notify, sizeof(f->notify), "%s/notify", f->dir);
	snprintf(f->gmbd.dir, sizeof(f->gmbd.dir), "%s", f->dir);
	snprintf(f->gmbd.sock, sizeof(f->gmbd.sock), "%s/gmbd.sock", f->dir);
	/* Every gmbd of this fixture (restarts included) appends to one file. */
	test_log_path(f->gmbd.log, sizeof(f->gmbd.log), f->dir, "gmbd");
	rc = fake_sd_open(&f->sd, f->notify);
	if (rc < 0 || !listen)
		return rc;
	return wire_listen(f->gmbd.sock, &f->listen_fd);
}

int sd_gmbd_up(struct sd_gmbd *f, const char *const *args, int ms)
{
	static struct sd_pass pass[FAKE_SD_MAX_FDS + 1];
	int n = 0, rc;

	if (f->listen_fd >= 0)
		pass[n++] = (struct sd_pass){ .fd = f->listen_fd, .name = "gmbd.socket" };
	n += fake_sd_pass(&f->sd, pass + n, FAKE_SD_MAX_FDS);
	if (f->sd.announce)
		snprintf(f->gmbd.fdstore, sizeof(f->gmbd.fdstore), "%u", f->sd.limit);
	else
		f->gmbd.fdstore[0] = '\0';
	rc = gmbd_spawn(&f->gmbd, f->notify, pass, n, args);
	if (rc < 0)
		return rc;
	f->starts++;
	return fake_sd_wait_count(&f->sd, &f->sd.ready, f->starts, ms);
}

int sd_gmbd_kill(struct sd_gmbd *f)
{
	pid_t pid = f->gmbd.pid;

	kill(pid, SIGKILL);
	f->gmbd.pid = 0;
	if (waitpid(pid, NULL, 0) != pid)
		return -ECHILD;
	return fake_sd_sync(&f->sd);
}

void sd_gmbd_close(struct sd_gmbd *f, int sig)
{
	if (f->gmbd.pid > 0) {
		kill(f->gmbd.pid, sig);
		waitpid(f->gmbd.pid, NULL, 0);
	}
	f->gmbd.pid = 0;
	fake_sd_close(&f->sd);
	if (f->listen_fd >= 0)
		close(f->listen_fd);
	f->listen_fd = -1;
	gmbd_stop(&f->gmbd); /* removes the folder */
}
