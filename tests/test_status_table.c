/*
 * test_status_table.c - the status for people, rendered from replies built
 * in memory: the aligned table of a small state, columns that widen for
 * long values, hostile names that never reach the terminal raw, an empty
 * reply, binary size units, imports and named objects in tables of their
 * own, and the objects' lines of gmbctl top within its width. The JSON
 * document and the watch lines: test_status_json.c.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/api/status_json.h"
#include "common/size.h"
#include "proto/gmb.pb-c.h"
#include "tests/status_fx.h"

static const char small_table[] =
	"gmbd 0.1.0, backend host\n"
	"\n"
	"DEV  NAME     TOTAL  USED  OUTSIDE   BUDGET     HELD     LENT       IDLE    AVAIL\n"
	"  0  host0  8.0 GiB     ?        ?  8.0 GiB  2.0 GiB  1.5 GiB  512.0 MiB  6.5 GiB\n"
	"\n"
	"CLIENT  NAME  PID  UID  GID  CONTROL  GROUP  PRIO\n"
	"    TAG  DEVICE  STATE   MODE     ALLOCS    BYTES\n"
	"#1      w     123    0    0  yes      -         0\n"
	"    kv        0  active  discard       2  1.5 GiB\n";

Test(status_table, small_state_renders_aligned_rows)
{
	struct fixture f;
	char *text;

	fixture_small(&f);
	text = render_table(&f.st);
	cr_expect(eq(str, text, (char *)small_table));
	free(text);
}

Test(status_table, columns_widen_for_long_values_and_tags_align)
{
	Gmb__TagInfo tag2 = GMB__TAG_INFO__INIT;
	Gmb__TagInfo *tags[2];
	struct fixture f;
	char *text;

	fixture_small(&f);
	f.dev.name = "a-long-device";
	tag2.name = "weights";
	tag2.device = -1;
	tag2.state = "paused";
	tag2.mode = GMB__MODE__MODE_PRESERVE;
	tag2.bytes = 0;
	tags[0] = &f.tag;
	tags[1] = &tag2;
	f.cli.tags = tags;
	f.cli.n_tags = 2;
	text = render_table(&f.st);
	cr_expect(ne(ptr, strstr(text, "DEV  NAME             TOTAL"), NULL), "%s", text);
	cr_expect(ne(ptr, strstr(text, "  0  a-long-device  8.0 GiB"), NULL), "%s", text);
	cr_expect(ne(ptr, strstr(text, "    TAG      DEVICE  STATE   MODE      ALLOCS    BYTES\n"),
		     NULL),
		  "%s", text);
	cr_expect(ne(ptr, strstr(text, "    kv            0  active  discard        2  1.5 GiB\n"),
		     NULL),
		  "%s", text);
	cr_expect(ne(ptr, strstr(text, "    weights       -  paused  preserve       0      0 B\n"),
		     NULL),
		  "%s", text);
	free(text);
}

Test(status_table, hostile_names_cannot_reach_the_terminal_raw)
{
	struct fixture f;
	char *text;

	fixture_small(&f);
	f.cli.name = (char *)hostile;
	f.tag.name = "\xc2\x9b"
		     "2J\xff"; /* C1 CSI, then a byte that is not UTF-8 */
	f.dev.name = "gpu\xc3\xa9";
	text = render_table(&f.st);
	cr_expect(ne(ptr, strstr(text, "a\"b\\c\\x0ad\\x01e\\x7f\\x1b[31m"), NULL), "%s", text);
	cr_expect(ne(ptr, strstr(text, "\\xc2\\x9b2J\\xff"), NULL), "%s", text);
	cr_expect(ne(ptr, strstr(text, "gpu\xc3\xa9"), NULL), "%s", text);
	for (const char *p = text; *p; p++) {
		bool printable = (unsigned char)*p >= 0x20 || *p == '\n';

		cr_assert(printable, "raw control at %zu: %s", (size_t)(p - text), text);
	}
	free(text);
}

Test(status_table, empty_reply_says_so)
{
	Gmb__StatusReply st = GMB__STATUS_REPLY__INIT;
	char *text;

	st.backend = "cuda";
	st.version = "0.1.0";
	text = render_table(&st);
	cr_expect(eq(str, text, "gmbd 0.1.0, backend cuda\n\nno devices\n\nno clients\n"));
	free(text);
}

Test(status_table, sizes_use_binary_units)
{
	static const struct {
		uint64_t v;
		const char *s;
	} cases[] = {
		{ 0, "0 B" },
		{ 1023, "1023 B" },
		{ 1024, "1.0 KiB" },
		{ 1536, "1.5 KiB" },
		{ 1024 * 1024 - 1, "1.0 MiB" },
		{ 8 * GiB, "8.0 GiB" },
		{ UINT64_MAX, "16.0 EiB" },
	};
	char buf[SIZE_STR_MAX];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		cr_expect(eq(str, (char *)size_str(cases[i].v, buf), (char *)cases[i].s));
}

Test(status_table, imports_get_a_table_of_their_own)
{
	Gmb__ImportInfo ii, *pii[2];
	struct fixture f;
	char *text;

	fixture_import(&f, &ii, pii);
	text = render_table(&f.st);
	cr_expect(ne(ptr,
		     strstr(text, "IMPORTED BY       PID  OWNER  PID  ALLOC  DEV    BYTES  OPENS"
				  "  OWNER'S  MAPPED\n"
				  "#2 engine\\x1b[2J  456  #1 w   123      7    0  4.0 MiB      2"
				  "  freed    yes\n"
				  "... and 69 more imports\n"),
		     NULL),
		  "%s", text);
	free(text);
	/* Nobody imports: no table at all. */
	fixture_small(&f);
	text = render_table(&f.st);
	cr_expect(eq(ptr, strstr(text, "IMPORTED BY"), NULL), "%s", text);
	free(text);
}

Test(status_table, objects_get_a_table_of_their_own)
{
	struct fixture_objects x;
	struct fixture f;
	char *text;

	fixture_objects(&f, &x);
	f.st.objects_total = 5;
	text = render_table(&f.st);
	cr_expect(
		ne(ptr,
		   strstr(text,
			  "\n\nOBJECT   OWNER  STATE   LATEST  VERSIONS      BYTES  READERS  GRANTS\n"
			  "weights   1000  active      v2         2  128.0 MiB        2  1001,1002\n"
			  "old          0  active       -         1    2.0 MiB        1  -\n"
			  "... and 3 more objects\n"),
		   NULL),
		"%s", text);
	free(text);
	/* The objects alone: the same table, and "no objects" for none. */
	cr_assert(eq(i32, gmb__objects_to_table(&f.st, &text), 0));
	cr_expect(eq(i32, strncmp(text, "OBJECT   OWNER", 14), 0), "%s", text);
	free(text);
	fixture_small(&f);
	cr_assert(eq(i32, gmb__objects_to_table(&f.st, &text), 0));
	cr_expect(eq(str, text, "no objects\n"));
	free(text);
	/* No object: no table in the status at all. */
	text = render_table(&f.st);
	cr_expect(eq(ptr, strstr(text, "OBJECT"), NULL), "%s", text);
	cr_expect(eq(str, text, (char *)small_table));
	free(text);
}

/* top: a line an object after the clients, within the width; none without objects. */
Test(status_top, objects_get_a_line_each)
{
	struct fixture_objects x;
	struct fixture f;
	char *text, want[160];

	fixture_objects(&f, &x);
	cr_assert(eq(i32, gmb__status_to_top(&f.st, 80, &text), 0));
	snprintf(want, sizeof(want), "\n%-26s %7s %-13s %7s %4s %10s %7s\n", "OBJECT", "OWNER",
		 "STATE", "LATEST", "VERS", "BYTES", "READERS");
	cr_expect(ne(ptr, strstr(text, want), NULL), "%s", text);
	snprintf(want, sizeof(want), "\n%-26s %7u %-13s %7s %4d %10s %7d\n", "weights", 1000,
		 "active", "v2", 2, "128.0 MiB", 2);
	cr_expect(ne(ptr, strstr(text, want), NULL), "%s", text);
	snprintf(want, sizeof(want), "\n%-26s %7u %-13s %7s %4d %10s %7d\n", "old", 0, "active",
		 "-", 1, "2.0 MiB", 1);
	cr_expect(ne(ptr, strstr(text, want), NULL), "%s", text);
	for (char *l = text, *e; *l; l = e + 1) {
		e = strchr(l, '\n');
		cr_assert(ne(ptr, e, NULL));
		cr_expect(le(sz, (size_t)(e - l), 80), "%.*s", (int)(e - l), l);
	}
	free(text);
	fixture_small(&f);
	cr_assert(eq(i32, gmb__status_to_top(&f.st, 60, &text), 0));
	cr_expect(eq(ptr, strstr(text, "OBJECT"), NULL), "%s", text);
	free(text);
}
