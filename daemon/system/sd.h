/*
 * sd.h - gmbd's systemd glue; the only module that calls sd-daemon(3).
 *
 *   - socket activation: the fds the service manager passed (LISTEN_FDS,
 *     LISTEN_FDNAMES), split into the listening socket (an AF_UNIX
 *     SOCK_SEQPACKET listener, checked) and the fd store's named fds;
 *   - notifications: READY=1, STATUS=, STOPPING=1, FDSTORE=1 and
 *     FDSTOREREMOVE=1 with FDNAME=;
 *   - the unit's FileDescriptorStoreMax=, which the manager enforces
 *     without telling the sender (sd_glue_fdstore_limit());
 *   - from the event loop: WATCHDOG=1 from a uv_timer_t at half the
 *     interval sd_watchdog_enabled(3) gives, and STATUS= lines on changes,
 *     at most one a second.
 *
 * Outside systemd (no $NOTIFY_SOCKET, no $LISTEN_FDS) every call is a
 * no-op, so tests can read the notifications on a datagram socket of their
 * own and hand fds over the way systemd does.
 */
#ifndef GMB_SD_H
#define GMB_SD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define SD_STATUS_MIN_MS 1000 /* STATUS= at most this often */
#define SD_FDNAME_MAX	 256

struct sd_named_fd {
	int fd; /* owned by the holder of the array; -1 once taken */
	char name[SD_FDNAME_MAX];
};

/* What the service manager passed at start. */
struct sd_fds {
	int listen_fd;		   /* -1: none; non-blocking, CLOEXEC; the caller's */
	struct sd_named_fd *named; /* every other fd (the fd store), malloc'd */
	size_t nnamed;
};

/**
 * sd_glue_take_fds() - the fds passed by the service manager, consumed from
 * the environment. A second listening socket and sockets of another kind
 * are closed with a warning. Return: 0 (@out filled, maybe empty) or
 * -ENOMEM; sd_glue_fds_free() closes whatever is left in @out.
 */
int sd_glue_take_fds(struct sd_fds *out);
void sd_glue_fds_free(struct sd_fds *f);

/* $NOTIFY_SOCKET is set: there is a service manager to talk to. */
bool sd_glue_has_manager(void);
/* READY=1 plus a STATUS= line, once the socket serves. */
void sd_glue_ready(const char *status);
void sd_glue_stopping(void);
/**
 * sd_glue_fdstore() - FDSTORE=1 with FDNAME=@name: the manager keeps a dup
 * of @fd (still the caller's) across restarts of gmbd.
 * Return: 1 sent, 0 no manager, or a negative errno.
 */
int sd_glue_fdstore(int fd, const char *name);
/* FDSTOREREMOVE=1: the manager closes every stored fd named @name. */
int sd_glue_fdstore_remove(const char *name);

/*
 * sd_glue_fdstore_limit() - the unit's FileDescriptorStoreMax=. systemd
 * closes an FDSTORE=1 fd past that limit with a line in its own journal
 * and nothing to the sender (systemd 252: service_add_fd_store_set()), so
 * gmbd must know the number itself. From $FDSTORE (set by systemd 254 and
 * later when the limit is not 0), else from the unit's property on the
 * system bus (systemd 252 sets no variable), asked only when this process
 * is the unit's MainPID: a gmbd started by a test harness that itself
 * runs in a unit must not take that unit's limit for its own.
 * *@how names the source for logs. Return: 0 with *@max, or a negative
 * errno when the limit cannot be known (*@how then says why).
 */
int sd_glue_fdstore_limit(unsigned *max, const char **how);

/* Fills @buf with the STATUS= text (without "STATUS="). */
typedef void (*sd_status_fn)(void *arg, char *buf, size_t len);

/* Watchdog and STATUS= from the loop; embed it, zeroed, in its owner. */
struct sd_glue {
	uv_timer_t watchdog;
	uv_timer_t status_timer;
	sd_status_fn status_fn;
	void *status_arg;
	uint64_t status_sent_ms; /* uv_now() of the last STATUS= */
	uint64_t watchdog_usec;	 /* 0: no watchdog */
	char status[256];	 /* the last line sent */
	bool started;
};

/**
 * sd_glue_start() - arm the watchdog (if the manager asked for one) and the
 * STATUS= updates on @loop. Return: 0 or libuv's error.
 */
int sd_glue_start(struct sd_glue *g, uv_loop_t *loop, sd_status_fn fn, void *arg);
/* Something STATUS= shows changed: a new line soon, rate-limited. */
void sd_glue_changed(struct sd_glue *g);
/* The current line, now (READY=1 carries it). */
const char *sd_glue_status_now(struct sd_glue *g);
/* Closes the timers (the loop frees them); no watchdog after this. */
void sd_glue_stop(struct sd_glue *g);

#endif
