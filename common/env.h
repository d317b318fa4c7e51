/*
 * env.h - settings from the environment. Yes/no: torch_memory_saver's, read
 * as it reads its boolean variables (its get_bool_env_var), so that the
 * same TMS_* values mean the same in libgmb and in the LD_PRELOAD shim;
 * gmbd's own, strictly 0 or 1.
 */
#ifndef GMB_ENV_H
#define GMB_ENV_H

#include <stdbool.h>

/* Whether @name is set to 1, true, TRUE, yes or YES; anything else is no. */
bool env_true(const char *name);

/**
 * env_01() - gmbd's own switches ($GMB_PREEMPTIBLE, $GMB_IPC_FOLLOW, ...),
 * strictly 0 or 1: *@out set when @name is set and not empty, else left.
 * Return: 0, or -EINVAL with @err (ERR_MSG_MAX bytes) naming the value.
 */
int env_01(const char *name, bool *out, char *err);

/**
 * env_uint() - a decimal number from 0 to @max ($GMB_WAIT_MS, $GMB_SPIN_US):
 * *@out set when @name is set and not empty, else left; @unit names what
 * it counts in the message. Return: 0, or -EINVAL with @err (ERR_MSG_MAX
 * bytes) naming the value.
 */
int env_uint(const char *name, unsigned long max, const char *unit, unsigned long *out, char *err);

#endif
