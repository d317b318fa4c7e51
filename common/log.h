/*
 * log.h - gmbd's logging: one line per event on stderr, with the sd-daemon
 * priority prefix ("<3>") that journald turns into a priority, then a
 * constant message and key=value facts. The level gate lives in the macro so
 * that a disabled debug line costs one comparison.
 */
#ifndef GMB_LOG_H
#define GMB_LOG_H

#include <stdarg.h>

enum log_level {
	LOG_LVL_ERR = 3,
	LOG_LVL_WARNING = 4,
	LOG_LVL_NOTICE = 5,
	LOG_LVL_INFO = 6,
	LOG_LVL_DEBUG = 7,
};

extern int log_max_level;

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses "err|warning|notice|info|debug" (or 3..7); -EINVAL otherwise. */
int log_parse_level(const char *s);

#define log_at(lvl, ...)                                                                 \
	do {                                                                             \
		if ((lvl) <= log_max_level)                                              \
			log_write((lvl), __VA_ARGS__);                                   \
	} while (0)
#define log_err(...) log_at(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_LVL_WARNING, __VA_ARGS__)
#define log_notice(...) log_at(LOG_LVL_NOTICE, __VA_ARGS__)
#define log_info(...) log_at(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_LVL_DEBUG, __VA_ARGS__)
/* Appends " err=<strerror(-err)>" to the line. */
#define log_errno(lvl, err, fmt, ...)                                                     \
	log_at((lvl), fmt " err=\"%s\"", ##__VA_ARGS__, strerror(-(err)))

#endif
