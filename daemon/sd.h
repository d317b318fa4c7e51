/*
 * sd.h - gmbd's systemd glue: readiness and status through sd_notify(3).
 * Outside systemd (no $NOTIFY_SOCKET) every call is a no-op, so tests can
 * wait for READY=1 on a datagram socket of their own.
 */
#ifndef GMB_SD_H
#define GMB_SD_H

/* READY=1 plus a STATUS= line, once the socket serves. */
void sd_glue_ready(const char *status);
/* STATUS= only, on changes a person would want to see in systemctl status. */
void sd_glue_status(const char *status);
void sd_glue_stopping(void);

#endif
