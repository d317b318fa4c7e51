/*
 * log.h - gmbd's logging: one line per event on stderr, a constant message
 * and key=value facts. Under journald (stderr is the stream $JOURNAL_STREAM
 * names) each line starts with the sd-daemon priority prefix ("<3>") that
 * journald turns into a priority; elsewhere (a terminal, a file) with a
 * timestamp and the level's word. The level gate lives in the macro so that
 * a disabled debug line costs one comparison.
 */
#ifndef GMB_LOG_H
#define GMB_LOG_H

#include <stdarg.h>
#include <stddef.h>

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

/*
 * log_init() - decide once how lines look: sd-daemon prefixes when stderr is
 * journald's stream ($JOURNAL_STREAM's device and inode are stderr's, as
 * sd-daemon(3) says), else "YYYY-MM-DD HH:MM:SS.mmm level ". Before it (and
 * in programs that never call it) lines are plain "level message".
 */
void log_init(void);
/* Whether log_init() found journald on stderr. */
int log_to_journal(void);

/*
 * log_quote() - @s as a key=value value: as it is when it has no space,
 * quote, backslash, '=' or control byte and is not empty, else in double
 * quotes with '"' and '\' escaped and control bytes as '?'. Cut to fit
 * @len (at least 3). Returns @s or @buf.
 */
const char *log_quote(const char *s, char *buf, size_t len);
#define LOG_QUOTE_MAX 280 /* fits a quoted client name or tag (WIRE_MAX_NAME) */

#define log_at(lvl, ...)                               \
	do {                                           \
		if ((lvl) <= log_max_level)            \
			log_write((lvl), __VA_ARGS__); \
	} while (0)
#define log_err(...)	log_at(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...)	log_at(LOG_LVL_WARNING, __VA_ARGS__)
#define log_notice(...) log_at(LOG_LVL_NOTICE, __VA_ARGS__)
#define log_info(...)	log_at(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...)	log_at(LOG_LVL_DEBUG, __VA_ARGS__)
/* Appends " err=<strerror(-err)>" to the line. */
#define log_errno(lvl, err, fmt, ...) \
	log_at((lvl), fmt " err=\"%s\"", ##__VA_ARGS__, strerror(-(err)))

#endif
