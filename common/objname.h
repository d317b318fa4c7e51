/*
 * objname.h - a named object's name as a client writes it: NAME (an object
 * of the caller's uid) or UID/NAME, NAME being 1 to OBJNAME_MAX bytes of
 * [A-Za-z0-9._-]. gmbd decides by it (daemon/core/object.c); libgmb checks
 * it first (client/lib/api/object.c), so that a bad name says so before any
 * request.
 */
#ifndef GMB_OBJNAME_H
#define GMB_OBJNAME_H

#include <stdbool.h>
#include <stdint.h>

#define OBJNAME_MAX 64

/* Is @bare (no UID/) a name an object may have? */
bool objname_valid(const char *bare);
/**
 * objname_parse() - @name split: *@bare its NAME, *@has_uid whether a UID/
 * came first and *@uid that uid (a number below 2^32 - 1).
 * Return: NULL, or the phrase that says why @name is no object's name.
 */
const char *objname_parse(const char *name, const char **bare, bool *has_uid, uint32_t *uid);

#endif
