/*
 * sd.c - sd_notify(3) messages of gmbd; see sd.h.
 */
#include "daemon/sd.h"

#include <systemd/sd-daemon.h>

#include "common/log.h"

void sd_glue_ready(const char *status)
{
	int r = sd_notifyf(0, "READY=1\nSTATUS=%s", status);

	if (r < 0)
		log_warn("sd_notify READY failed err=%d", r);
}

void sd_glue_status(const char *status)
{
	sd_notifyf(0, "STATUS=%s", status);
}

void sd_glue_stopping(void)
{
	sd_notify(0, "STOPPING=1");
}
