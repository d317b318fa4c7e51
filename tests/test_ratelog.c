/*
 * test_ratelog.c - common/ratelog: a flood of one key is one line, then a
 * count said once its interval is over; keys apart are logged apart; a
 * full table says the count of the slot it reuses; a quiet key is news
 * again. Lines are read back from stderr, redirected to a file.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/ratelog.h"

static char path[] = "/tmp/gmbratelog.XXXXXX";
static int saved = -1;

static void setup(void)
{
	int fd = mkstemp(path);

	cr_assert(ge(i32, fd, 0));
	fflush(stderr);
	saved = dup(2);
	dup2(fd, 2);
	close(fd);
	log_max_level = LOG_LVL_INFO;
}

static void teardown(void)
{
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	unlink(path);
}

TestSuite(ratelog, .init = setup, .fini = teardown);

/* Lines written so far that hold @needle. */
static int lines_with(const char *needle)
{
	char line[1024];
	FILE *f;
	int n = 0;

	fflush(stderr);
	f = fopen(path, "r");
	cr_assert(not(eq(ptr, f, NULL)));
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

Test(ratelog, a_flood_is_one_line_then_a_count_each_interval)
{
	static struct ratelog rl;
	int logged = 0;

	for (uint64_t t = 0; t < 1000; t++)
		logged += ratelog_admit(&rl, "refused", 7, "uid=7", LOG_LVL_NOTICE, t);
	cr_assert(eq(i32, logged, 1));
	ratelog_tick(&rl, 5000);
	cr_assert(eq(i32, lines_with("more in the last"), 0), "said before its interval");
	ratelog_tick(&rl, 10000);
	cr_assert(eq(i32, lines_with("refused: 999 more in the last 10 s uid=7"), 1));
	/* Counted again in the next interval, said again at its end. */
	cr_assert(not(ratelog_admit(&rl, "refused", 7, "uid=7", LOG_LVL_NOTICE, 10001)));
	ratelog_tick(&rl, 20000);
	cr_assert(eq(i32, lines_with("refused: 1 more in the last 10 s uid=7"), 1));
	/* A whole interval quiet: the slot is freed and the next line is news. */
	ratelog_tick(&rl, 30000);
	cr_assert(not(ratelog_pending(&rl)));
	cr_assert(ratelog_admit(&rl, "refused", 7, "uid=7", LOG_LVL_NOTICE, 30001));
}

Test(ratelog, kinds_and_sources_are_counted_apart)
{
	static struct ratelog rl;

	cr_assert(ratelog_admit(&rl, "refused", 1, "uid=1", LOG_LVL_NOTICE, 0));
	cr_assert(ratelog_admit(&rl, "refused", 2, "uid=2", LOG_LVL_NOTICE, 0));
	cr_assert(ratelog_admit(&rl, "closed", 1, "uid=1", LOG_LVL_NOTICE, 0));
	cr_assert(ratelog_admit(&rl, "refused", 1, "uid=1 request=free", LOG_LVL_NOTICE, 0));
	cr_assert(not(ratelog_admit(&rl, "refused", 2, "uid=2", LOG_LVL_NOTICE, 1)));
	ratelog_flush(&rl, 2000);
	cr_assert(eq(i32, lines_with("more in the last"), 1), "only the counted key is said");
	cr_assert(eq(i32, lines_with("refused: 1 more in the last 2 s uid=2"), 1));
	cr_assert(not(ratelog_pending(&rl)));
}

Test(ratelog, a_full_table_says_the_count_of_the_slot_it_takes)
{
	static struct ratelog rl;
	char who[32];

	for (uint64_t s = 0; s < RATELOG_SLOTS; s++) {
		snprintf(who, sizeof(who), "uid=%u", (unsigned)s);
		cr_assert(ratelog_admit(&rl, "refused", s, who, LOG_LVL_NOTICE, s));
		cr_assert(not(ratelog_admit(&rl, "refused", s, who, LOG_LVL_NOTICE, s)));
	}
	/* The least recently used, source 0, makes room and says its count. */
	cr_assert(ratelog_admit(&rl, "refused", 1000, "uid=1000", LOG_LVL_NOTICE, 100));
	cr_assert(eq(i32, lines_with("refused: 1 more in the last 1 s uid=0"), 1));
	cr_assert(ratelog_admit(&rl, "refused", 0, "uid=0", LOG_LVL_NOTICE, 101));
	ratelog_flush(&rl, 200);
	cr_assert(eq(i32, lines_with("more in the last"), RATELOG_SLOTS));
}

Test(ratelog, a_late_tick_leaves_the_next_line_logged)
{
	static struct ratelog rl;

	cr_assert(ratelog_admit(&rl, "refused", 3, "uid=3", LOG_LVL_NOTICE, 0));
	cr_assert(not(ratelog_admit(&rl, "refused", 3, "uid=3", LOG_LVL_NOTICE, 10)));
	/* No tick for 12 s: this line says the count and is logged itself. */
	cr_assert(ratelog_admit(&rl, "refused", 3, "uid=3", LOG_LVL_NOTICE, 12000));
	cr_assert(eq(i32, lines_with("refused: 1 more in the last 12 s uid=3"), 1));
}
