/*
 * ratelog.c - a flood's lines said once, then counted (ratelog.h).
 *
 * Invariants: a slot is free when its what is ""; a used slot's count is
 * the lines of its key since since_ms that were not logged, and is said
 * (and zeroed) before the slot is reused or freed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/ratelog.h"

static uint64_t ratelog_interval(const struct ratelog *rl)
{
	return rl->interval_ms ? rl->interval_ms : RATELOG_INTERVAL_MS;
}

/* The summary of @s's count, which is then zero. */
static void ratelog_say(struct ratelog_slot *s, uint64_t now_ms)
{
	uint64_t secs = (now_ms - s->since_ms + 500) / 1000;

	if (s->count)
		log_at(s->level, "%s: %" PRIu64 " more in the last %" PRIu64 " s %s", s->what,
		       s->count, secs ? secs : 1, s->who);
	s->count = 0;
	s->since_ms = now_ms;
}

static struct ratelog_slot *ratelog_find(struct ratelog *rl, const char *what, uint64_t source,
					 const char *who)
{
	for (int i = 0; i < RATELOG_SLOTS; i++) {
		struct ratelog_slot *s = &rl->slots[i];

		if (s->what[0] && s->source == source &&
		    strncmp(s->what, what, sizeof(s->what) - 1) == 0 &&
		    strncmp(s->who, who, sizeof(s->who) - 1) == 0)
			return s;
	}
	return NULL;
}

/* A free slot, else the one used least recently, its count said first. */
static struct ratelog_slot *ratelog_take(struct ratelog *rl, uint64_t now_ms)
{
	struct ratelog_slot *old = &rl->slots[0];

	for (int i = 0; i < RATELOG_SLOTS; i++) {
		struct ratelog_slot *s = &rl->slots[i];

		if (!s->what[0])
			return s;
		if (s->last_ms < old->last_ms)
			old = s;
	}
	ratelog_say(old, now_ms);
	return old;
}

bool ratelog_admit(struct ratelog *rl, const char *what, uint64_t source, const char *who,
		   int level, uint64_t now_ms)
{
	struct ratelog_slot *s = ratelog_find(rl, what, source, who);

	if (s) {
		s->last_ms = now_ms;
		/* Late ticks: an interval over is said here, and this line starts the next. */
		if (now_ms - s->since_ms >= ratelog_interval(rl)) {
			ratelog_say(s, now_ms);
			return true;
		}
		s->count++;
		return false;
	}
	s = ratelog_take(rl, now_ms);
	*s = (struct ratelog_slot){
		.source = source, .level = level, .since_ms = now_ms, .last_ms = now_ms
	};
	snprintf(s->what, sizeof(s->what), "%s", what[0] ? what : "?");
	snprintf(s->who, sizeof(s->who), "%s", who);
	return true;
}

void ratelog_tick(struct ratelog *rl, uint64_t now_ms)
{
	uint64_t iv = ratelog_interval(rl);

	for (int i = 0; i < RATELOG_SLOTS; i++) {
		struct ratelog_slot *s = &rl->slots[i];

		if (!s->what[0] || now_ms - s->since_ms < iv)
			continue;
		/* Quiet for the whole interval: its next line is news again. */
		if (!s->count) {
			s->what[0] = '\0';
			continue;
		}
		ratelog_say(s, now_ms);
	}
}

bool ratelog_pending(const struct ratelog *rl)
{
	for (int i = 0; i < RATELOG_SLOTS; i++)
		if (rl->slots[i].what[0])
			return true;
	return false;
}

void ratelog_flush(struct ratelog *rl, uint64_t now_ms)
{
	for (int i = 0; i < RATELOG_SLOTS; i++) {
		struct ratelog_slot *s = &rl->slots[i];

		if (s->what[0])
			ratelog_say(s, now_ms);
		s->what[0] = '\0';
	}
}
