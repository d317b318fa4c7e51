/*
 * conf.h - gmbd's configuration file (/etc/gmbd/gmbd.conf): "name = value"
 * lines, name being a long option; see daemon/service/conf.c for the syntax.
 */
#ifndef GMB_CONF_H
#define GMB_CONF_H

#include <stdbool.h>
#include <stddef.h>

/* Applies one setting; on failure writes one sentence to @err (@len bytes). */
typedef int (*conf_set_fn)(void *arg, const char *name, const char *value, char *err, size_t len);

/**
 * conf_load() - read @path and call @set for each setting, in file order.
 * A missing file is fine unless @required. On success *@storage holds the
 * buffer the values point into (NULL when no file was read), owned by the
 * caller (free()). Return: 0, or a negative errno with "PATH:LINE: why" in
 * @err (@errlen bytes); nothing is kept then.
 */
int conf_load(const char *path, bool required, conf_set_fn set, void *arg, char **storage,
	      char *err, size_t errlen);

#endif
