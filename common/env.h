/*
 * env.h - yes/no settings from the environment, read as torch_memory_saver
 * reads its boolean variables (its get_bool_env_var), so that the same
 * TMS_* values mean the same in libgmb and in the LD_PRELOAD shim.
 */
#ifndef GMB_ENV_H
#define GMB_ENV_H

#include <stdbool.h>

/* Whether @name is set to 1, true, TRUE, yes or YES; anything else is no. */
bool env_true(const char *name);

#endif
