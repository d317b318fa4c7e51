/*
 * proc.c - what /proc says of a process: its start time (which tells a
 * reused pid from the process a client was) and whether it still runs.
 * The core's rejoin policy uses it; no socket, no loop.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "daemon/core/proc.h"

/*
 * Field 22 of /proc/PID/stat (start time in clock ticks): a pid reused by
 * another process has another start time. 0 when unknown (*@err says why:
 * -ENOENT for no such process, -ESRCH for a zombie).
 */
uint64_t proc_start_time(pid_t pid, int *err)
{
	char path[64], buf[1024];
	unsigned long long st = 0;
	const char *p;
	FILE *f;
	size_t n;
	int e = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f) {
		e = -errno;
		goto out;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	/* ") S ppid ... starttime": the state, then 19 fields up to field 22. */
	if (!p || sscanf(p + 2,
			 "%*c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s"
			 " %*s %*s %*s %*s %llu",
			 &st) != 1)
		e = -EINVAL;
	else if (p[2] == 'Z' || p[2] == 'X')
		e = -ESRCH;
out:
	if (err)
		*err = e;
	return e ? 0 : st;
}

bool proc_alive(pid_t pid, uint64_t start_time)
{
	int err;
	uint64_t st = proc_start_time(pid, &err);

	if (err == -ENOENT || err == -ESRCH || pid <= 0)
		return false;
	if (err < 0)
		return kill(pid, 0) == 0 || errno == EPERM;
	return !start_time || st == start_time;
}
