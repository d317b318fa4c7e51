/*
 * ratelog.h - log lines of a flood once, then count them. A refusal that a
 * source (a uid, a client) can repeat as fast as it likes is said once at
 * its level and then counted, and every RATELOG_INTERVAL_MS a line says how
 * many more came of each kind from each source ("1234 more in the last
 * 10 s"); a source quiet for a whole interval is logged at its level again.
 *
 * The table is bounded (RATELOG_SLOTS): a new key when it is full takes the
 * slot used least recently, saying its count first, so that no count is
 * lost and many sources cannot grow gmbd. Nothing here allocates; the owner
 * passes the time in (uv_now() in gmbd) and calls ratelog_tick() at least
 * every interval while ratelog_pending() says counts wait.
 */
#ifndef GMB_RATELOG_H
#define GMB_RATELOG_H

#include <stdbool.h>
#include <stdint.h>

#define RATELOG_SLOTS	    64
#define RATELOG_INTERVAL_MS 10000
#define RATELOG_WHAT_MAX    96	/* the kind's message, without facts */
#define RATELOG_WHO_MAX	    400 /* the source's key=value facts */

struct ratelog_slot {
	char what[RATELOG_WHAT_MAX]; /* "": free */
	char who[RATELOG_WHO_MAX];
	uint64_t source;
	int level;
	uint64_t since_ms; /* start of the interval being counted */
	uint64_t last_ms;  /* the latest line of this key */
	uint64_t count;	   /* lines not logged since since_ms */
};

struct ratelog {
	struct ratelog_slot slots[RATELOG_SLOTS];
	uint64_t interval_ms; /* 0: RATELOG_INTERVAL_MS */
};

/**
 * ratelog_admit() - one line of kind @what (a constant message) from
 * @source (its facts @who, kept for the summary) at @now_ms. The key is
 * all three (each cut to its slot's size).
 * Return: true when the caller logs this line at @level (the first of its
 * key in an interval), false when it was counted (the caller may log it
 * at debug).
 */
bool ratelog_admit(struct ratelog *rl, const char *what, uint64_t source, const char *who,
		   int level, uint64_t now_ms);

/*
 * ratelog_tick() - says the counts of the keys whose interval is over
 * ("<what>: N more in the last S s <who>", at the key's level) and frees
 * the slots of keys quiet for a whole interval.
 */
void ratelog_tick(struct ratelog *rl, uint64_t now_ms);

/* Whether a slot is in use (so ratelog_tick() still has work). */
bool ratelog_pending(const struct ratelog *rl);

/* Says every count left (at shutdown) and empties the table. */
void ratelog_flush(struct ratelog *rl, uint64_t now_ms);

#endif
