/*
 * proc.h - a client's process as /proc shows it (daemon/core/proc.c).
 */
#ifndef GMB_PROC_H
#define GMB_PROC_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* /proc/PID/stat's start time, 0 if unknown (*@err, may be NULL, says why:
 * -ENOENT no such process, -ESRCH a zombie). */
uint64_t proc_start_time(pid_t pid, int *err);
/* Is @pid still the process that started at @start_time (0: unknown)? */
bool proc_alive(pid_t pid, uint64_t start_time);

#endif
