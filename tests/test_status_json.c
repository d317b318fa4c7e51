/*
 * test_status_json.c - the status document and the watch lines, rendered
 * from replies built in memory: exact JSON for a small state, escaping of
 * hostile client names, empty lists, 64-bit values, imports and named
 * objects (paused ones in every form), output that strict JSON parsers
 * accept (a checker here, and Python's json when it is installed), watch
 * events in both forms, and -ENOMEM at every allocation with nothing
 * leaked. The tables and top's screen: test_status_table.c.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/lib/api/status_json.h"
#include "proto/gmb.pb-c.h"
#include "tests/status_fx.h"

/*
 * Allocation failures: a second copy of the renderers (every file of them,
 * sbuf.h's buffer with them), compiled here with realloc/free redirected
 * and the entry points renamed, fails the Nth allocation and counts the
 * blocks it holds. The linked copy (the one libgmb ships) is what every
 * other test exercises.
 */
static long fault_countdown = -1; /* allocations before one fails; -1: none */
static long fault_live;		  /* blocks the faulty copy holds now */

static void *fault_realloc(void *p, size_t n)
{
	void *q;

	if (fault_countdown == 0)
		return NULL;
	if (fault_countdown > 0)
		fault_countdown--;
	q = realloc(p, n);
	if (q && !p)
		fault_live++;
	return q;
}

static void fault_free(void *p)
{
	if (p)
		fault_live--;
	free(p);
}

/* status_json.h is already in, so its guard keeps these names out of it. */
int faulty_status_to_json(const Gmb__StatusReply *st, char **out);
int faulty_status_to_table(const Gmb__StatusReply *st, char **out);
int faulty_watch_format(const Gmb__WatchEvent *ev, bool json, char **out);
int faulty_objects_to_json(const Gmb__StatusReply *st, char **out);
int faulty_objects_to_table(const Gmb__StatusReply *st, char **out);

#define realloc		      fault_realloc
#define free		      fault_free
#define gmb__status_to_json   faulty_status_to_json
#define gmb__status_to_table  faulty_status_to_table
#define gmb__watch_format     faulty_watch_format
#define gmb__objects_to_json  faulty_objects_to_json
#define gmb__objects_to_table faulty_objects_to_table
#include "client/lib/api/status_json.c"
#include "client/lib/api/status_table.c"
#include "client/lib/api/watch_format.c"
#undef realloc
#undef free
#undef gmb__watch_format
#undef gmb__objects_to_json
#undef gmb__objects_to_table
#undef gmb__status_to_json
#undef gmb__status_to_table

static char *render_json(const Gmb__StatusReply *st)
{
	char *out = NULL;

	cr_assert(eq(i32, gmb__status_to_json(st, &out), 0));
	cr_assert(ne(ptr, out, NULL));
	return out;
}

/*
 * A strict RFC 8259 checker, independent of the code under test: one value,
 * then only whitespace. Strings must not hold raw controls or bad escapes,
 * and their bytes must be well-formed UTF-8 (lead byte, continuation bytes).
 */
static bool jv_value(const char **p, int depth);

static void jv_ws(const char **p)
{
	while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r')
		(*p)++;
}

static bool jv_utf8(const char **p)
{
	const unsigned char *s = (const unsigned char *)*p;
	int n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 3 : s[0] >= 0xe0 ? 2 : s[0] >= 0xc2 ? 1 : -1;

	if (n < 0 || s[0] > 0xf4)
		return false;
	for (int i = 1; i <= n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return false;
	*p += n + 1;
	return true;
}

static bool jv_string(const char **p)
{
	if (*(*p)++ != '"')
		return false;
	for (;;) {
		unsigned char c = (unsigned char)**p;

		if (c == '"')
			return (*p)++, true;
		if (c < 0x20)
			return false;
		if (c >= 0x80) {
			if (!jv_utf8(p))
				return false;
			continue;
		}
		(*p)++;
		if (c != '\\')
			continue;
		c = (unsigned char)*(*p)++;
		if (c == 'u') {
			for (int i = 0; i < 4; i++)
				if (!strchr("0123456789abcdefABCDEF", *(*p)++) || !(*p)[-1])
					return false;
		} else if (!c || !strchr("\"\\/bfnrt", c)) {
			return false;
		}
	}
}

static bool jv_digits(const char **p)
{
	const char *start = *p;

	while (**p >= '0' && **p <= '9')
		(*p)++;
	return *p > start;
}

static bool jv_number(const char **p)
{
	if (**p == '-')
		(*p)++;
	if (**p == '0')
		(*p)++;
	else if (!jv_digits(p))
		return false;
	if (**p == '.' && ((*p)++, !jv_digits(p)))
		return false;
	if (**p == 'e' || **p == 'E') {
		(*p)++;
		if (**p == '+' || **p == '-')
			(*p)++;
		return jv_digits(p);
	}
	return true;
}

/* An array (close ']') or an object (close '}', members "key": value). */
static bool jv_list(const char **p, char close, int depth)
{
	(*p)++;
	jv_ws(p);
	if (**p == close)
		return (*p)++, true;
	for (;;) {
		if (close == '}') {
			if (!jv_string(p))
				return false;
			jv_ws(p);
			if (*(*p)++ != ':')
				return false;
		}
		if (!jv_value(p, depth + 1))
			return false;
		if (**p == close)
			return (*p)++, true;
		if (*(*p)++ != ',')
			return false;
		jv_ws(p);
	}
}

static bool jv_value(const char **p, int depth)
{
	bool ok;

	if (depth > 64)
		return false;
	jv_ws(p);
	if (**p == '{' || **p == '[')
		ok = jv_list(p, **p == '{' ? '}' : ']', depth);
	else if (**p == '"')
		ok = jv_string(p);
	else if (!strncmp(*p, "true", 4) || !strncmp(*p, "null", 4))
		ok = (*p += 4, true);
	else if (!strncmp(*p, "false", 5))
		ok = (*p += 5, true);
	else
		ok = jv_number(p);
	jv_ws(p);
	return ok;
}

static bool json_valid(const char *s)
{
	return jv_value(&s, 0) && *s == '\0';
}

static const char small_json[] =
	"{\"backend\":\"host\",\"version\":\"0.1.0\",\"devices\":[{\"index\":0,\"name\":\"host0\","
	"\"total_bytes\":8589934592,\"budget_bytes\":8589934592,\"granularity\":2097152,"
	"\"pool_bytes\":2147483648,\"used_bytes\":1610612736,\"free_bytes\":536870912,\"chunks_created\":0,\"chunks_released\":0,\"chunks_handed_over\":0,\"held_bytes\":2147483648,\"lent_bytes\":1610612736,\"idle_bytes\":536870912,\"available_bytes\":6979321856,\"driver\":null,\"outside_bytes\":null}],"
	"\"clients\":[{\"id\":1,\"name\":\"w\",\"pid\":123,\"uid\":0,\"gid\":0,\"control\":true,"
	"\"group\":\"\",\"priority\":0,\"preemptible\":false,"
	"\"tags\":[{\"name\":\"kv\",\"device\":0,\"state\":\"active\",\"mode\":\"discard\","
	"\"allocations\":2,\"bytes\":1610612736}]}],\"waiters\":[],\"imports\":[],"
	"\"imports_total\":0,\"objects\":[],\"objects_total\":0}";

TestSuite(status_json, .timeout = 30);

Test(status_json, small_state_renders_exact_document)
{
	struct fixture f;
	char *json;

	fixture_small(&f);
	json = render_json(&f.st);
	cr_expect(eq(str, json, (char *)small_json));
	cr_expect(json_valid(json));
	free(json);
}

Test(status_json, hostile_names_are_escaped)
{
	struct fixture f;
	char *json;

	fixture_small(&f);
	f.cli.name = (char *)hostile;
	f.tag.name = "\t";
	json = render_json(&f.st);
	cr_expect(ne(ptr,
		     strstr(json, "\"name\":\"a\\\"b\\\\c\\u000ad\\u0001e\\u007f\\u001b[31m\""),
		     NULL),
		  "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"name\":\"\\u0009\""), NULL), "%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
}

Test(status_json, invalid_utf8_becomes_replacement_and_valid_utf8_stays)
{
	struct fixture f;
	char *json;

	fixture_small(&f);
	/* é, a lone continuation byte, an overlong '/', a surrogate, 0xff, a cut 3-byte seq. */
	f.cli.name = "\xc3\xa9|\x80|\xc0\xaf|\xed\xa0\x80|\xff|\xe2\x82";
	json = render_json(&f.st);
	cr_expect(ne(ptr,
		     strstr(json, "\"name\":\"\xc3\xa9|\\ufffd|\\ufffd\\ufffd|"
				  "\\ufffd\\ufffd\\ufffd|\\ufffd|\\ufffd\\ufffd\""),
		     NULL),
		  "%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
}

Test(status_json, empty_reply_has_empty_lists)
{
	Gmb__StatusReply st = GMB__STATUS_REPLY__INIT;
	struct fixture f;
	char *json;

	json = render_json(&st);
	cr_expect(eq(str, json,
		     "{\"backend\":\"\",\"version\":\"\",\"devices\":[],\"clients\":[],"
		     "\"waiters\":[],\"imports\":[],\"imports_total\":0,\"objects\":[],"
		     "\"objects_total\":0}"));
	free(json);

	/* A client without tags; NULL strings of a hand-built reply read as "". */
	fixture_small(&f);
	f.cli.n_tags = 0;
	f.cli.tags = NULL;
	f.st.backend = NULL;
	json = render_json(&f.st);
	cr_expect(ne(ptr, strstr(json, "\"preemptible\":false,\"tags\":[]}]"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "{\"backend\":\"\","), NULL), "%s", json);
	cr_expect(json_valid(json));
	free(json);
}

Test(status_json, values_keep_all_64_bits_and_signs)
{
	struct fixture f;
	char *json;

	fixture_small(&f);
	f.dev.total_bytes = UINT64_MAX;
	f.dev.index = UINT32_MAX;
	f.cli.id = UINT64_MAX - 1;
	f.cli.pid = -1;
	f.cli.uid = UINT32_MAX;
	f.cli.control = false;
	f.tag.device = -1;
	f.tag.bytes = (1ULL << 63) + 1;
	f.tag.mode = GMB__MODE__MODE_PRESERVE;
	json = render_json(&f.st);
	cr_expect(ne(ptr, strstr(json, "\"index\":4294967295,"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"total_bytes\":18446744073709551615,"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"id\":18446744073709551614,"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"pid\":-1,\"uid\":4294967295,"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"control\":false"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"device\":-1,"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"mode\":\"preserve\""), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"bytes\":9223372036854775809}"), NULL), "%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
}

Test(status_json, many_clients_and_null_entries)
{
	Gmb__ClientInfo cli[3] = { GMB__CLIENT_INFO__INIT, GMB__CLIENT_INFO__INIT,
				   GMB__CLIENT_INFO__INIT };
	Gmb__ClientInfo *clis[4] = { &cli[0], NULL, &cli[1], &cli[2] };
	Gmb__StatusReply st = GMB__STATUS_REPLY__INIT;
	char *json;

	for (int i = 0; i < 3; i++)
		cli[i].id = (uint64_t)i + 1;
	st.n_clients = 4;
	st.clients = clis;
	json = render_json(&st);
	cr_expect(ne(ptr, strstr(json, "\"tags\":[]},{\"id\":2,"), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"tags\":[]},{\"id\":3,"), NULL), "%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
}

Test(status_json, checker_rejects_broken_documents)
{
	static const char *const bad[] = {
		"{\"a\":1,}", "{\"a\" 1}",  "[1 2]",	"\"x\ny\"", "\"\\x41\"", "\"\\u12\"",
		"01",	      "{\"a\":1}x", "\"\xff\"", "[",	    "",
	};

	cr_expect(json_valid("{\"a\":[1,-2.5e3,true,null,\"\\u00e9\xc3\xa9\"],\"b\":{}}"));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect(not(json_valid(bad[i])), "accepted: %s", bad[i]);
}

/* Python's json decodes the document and gets the hostile name back intact. */
Test(status_json, python_json_decodes_hostile_names_back)
{
	char path[] = "/tmp/test_status_json.XXXXXX", cmd[256], hex[256] = "", want[256];
	struct fixture f;
	FILE *p;
	char *json;
	int fd;

	if (system("python3 -c 'import json' >/dev/null 2>&1") != 0)
		cr_skip_test("python3 not installed");
	fixture_small(&f);
	f.cli.name = (char *)hostile;
	json = render_json(&f.st);
	fd = mkstemp(path);
	cr_assert(ge(i32, fd, 0));
	cr_assert(eq(sz, (size_t)write(fd, json, strlen(json)), strlen(json)));
	close(fd);
	snprintf(cmd, sizeof(cmd),
		 "python3 -c 'import json,sys; d=json.load(open(sys.argv[1],encoding=\"utf-8\"));"
		 " print(d[\"clients\"][0][\"name\"].encode().hex())' %s",
		 path);
	p = popen(cmd, "r");
	cr_assert(ne(ptr, p, NULL));
	cr_expect(ne(ptr, fgets(hex, sizeof(hex), p), NULL));
	cr_expect(eq(i32, pclose(p), 0), "python3 rejected: %s", json);
	unlink(path);
	for (size_t i = 0; hostile[i]; i++)
		sprintf(want + 2 * i, "%02x", (unsigned char)hostile[i]);
	strcat(want, "\n");
	cr_expect(eq(str, hex, want));
	free(json);
}

Test(status_json, null_arguments_are_einval)
{
	Gmb__StatusReply st = GMB__STATUS_REPLY__INIT;
	char *out = NULL;

	cr_expect(eq(i32, gmb__status_to_json(NULL, &out), -EINVAL));
	cr_expect(eq(i32, gmb__status_to_json(&st, NULL), -EINVAL));
	cr_expect(eq(i32, gmb__status_to_table(NULL, &out), -EINVAL));
	cr_expect(eq(i32, gmb__status_to_table(&st, NULL), -EINVAL));
	cr_expect(eq(ptr, out, NULL));
}

/*
 * Fails each allocation in turn until the renderer succeeds: every failure
 * is -ENOMEM, leaves *out alone and holds no block; the success matches the
 * linked copy's output.
 */
static void expect_enomem_paths(int (*faulty)(const Gmb__StatusReply *, char **),
				int (*real)(const Gmb__StatusReply *, char **),
				const Gmb__StatusReply *st)
{
	char sentinel[] = "untouched", *out, *want = NULL;
	long k;
	int r;

	cr_assert(eq(i32, real(st, &want), 0));
	for (k = 0;; k++) {
		out = sentinel;
		fault_live = 0;
		fault_countdown = k;
		r = faulty(st, &out);
		fault_countdown = -1;
		if (r == 0)
			break;
		cr_assert(eq(i32, r, -ENOMEM), "allocation %ld", k);
		cr_assert(eq(ptr, out, sentinel), "allocation %ld", k);
		cr_assert(eq(i64, fault_live, 0), "leak after failing allocation %ld", k);
	}
	cr_expect(gt(i64, k, 2), "only %ld allocations: growth not exercised", k);
	cr_expect(eq(str, out, want));
	fault_free(out);
	cr_expect(eq(i64, fault_live, 0));
	free(want);
}

Test(status_json, enomem_at_every_allocation_leaks_nothing)
{
	char longname[3000];
	struct fixture f;

	/* Long names make every buffer grow more than once. */
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	fixture_small(&f);
	f.cli.name = longname;
	f.tag.name = longname;
	f.dev.name = longname;
	expect_enomem_paths(faulty_status_to_json, gmb__status_to_json, &f.st);
	expect_enomem_paths(faulty_status_to_table, gmb__status_to_table, &f.st);
}

/* gmbd's "missed" event: how many, in both forms, and valid JSON. */
Test(watch_format, missed_events_show_their_count)
{
	Gmb__WatchEvent we = GMB__WATCH_EVENT__INIT;
	char *json = NULL, *text = NULL;

	we.kind = "missed";
	we.device = -1;
	we.count = 18446744073709551615ULL;
	we.detail = "gmbd could not store its state record";
	cr_assert(eq(i32, gmb__watch_format(&we, true, &json), 0));
	cr_assert(eq(i32, gmb__watch_format(&we, false, &text), 0));
	cr_expect(json_valid(json), "%s", json);
	cr_expect(not(eq(ptr, strstr(json, ",\"count\":18446744073709551615,"), NULL)), "%s", json);
	cr_expect(not(eq(ptr, strstr(text, " missed count=18446744073709551615: gmbd could not"),
			 NULL)),
		  "%s", text);
	free(json);
	free(text);
	/* Other kinds: 0 in JSON, nothing in the text. */
	we.kind = "trim";
	we.count = 0;
	cr_assert(eq(i32, gmb__watch_format(&we, true, &json), 0));
	cr_assert(eq(i32, gmb__watch_format(&we, false, &text), 0));
	cr_expect(not(eq(ptr, strstr(json, ",\"count\":0,"), NULL)), "%s", json);
	cr_expect(eq(ptr, strstr(text, "count="), NULL), "%s", text);
	free(json);
	free(text);
}

Test(status_json, imports_say_who_maps_whose_allocation)
{
	Gmb__ImportInfo ii, *pii[2];
	struct fixture f;
	char *json;

	fixture_import(&f, &ii, pii);
	json = render_json(&f.st);
	cr_expect(ne(ptr,
		     strstr(json,
			    "\"imports\":[{\"importer_id\":2,\"importer\":\"engine\\u001b[2J\","
			    "\"importer_pid\":456,\"owner_id\":1,\"owner\":\"w\","
			    "\"owner_pid\":123,\"alloc_id\":7,\"device\":0,\"bytes\":4194304,"
			    "\"opens\":2,\"owner_freed\":true,\"mapped\":true,\"idle\":false"
			    "}],\"imports_total\":70,"),
		     NULL),
		  "%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
}

Test(status_json, objects_with_their_versions)
{
	struct fixture_objects x;
	struct fixture f;
	char *json;

	fixture_objects(&f, &x);
	json = render_json(&f.st);
	cr_expect(
		ne(ptr,
		   strstr(json,
			  "\"objects\":[{\"name\":\"weights\",\"owner_uid\":1000,\"latest\":2,"
			  "\"bytes\":134217728,\"paused\":false,\"discarded\":false,"
			  "\"grants\":[1001,1002],\"versions\":["
			  "{\"version\":1,\"bytes\":67108864,\"device\":0,\"readers\":2,"
			  "\"latest\":false,\"published_ns\":1700000000000000000,"
			  "\"publisher\":\"trainer\",\"publisher_pid\":77,\"meta_bytes\":0},"
			  "{\"version\":2,\"bytes\":67108864,\"device\":1,\"readers\":0,"
			  "\"latest\":true,\"published_ns\":0,\"publisher\":\"trainer\","
			  "\"publisher_pid\":77,\"meta_bytes\":12}]},"
			  "{\"name\":\"old\",\"owner_uid\":0,\"latest\":0,\"bytes\":2097152,"
			  "\"paused\":false,\"discarded\":false,\"grants\":[],\"versions\":[{\"version\":5,\"bytes\":2097152,"
			  "\"device\":0,\"readers\":1,\"latest\":false,\"published_ns\":0,"
			  "\"publisher\":\"p\\u001b[2J\",\"publisher_pid\":0,\"meta_bytes\":0}]}],"
			  "\"objects_total\":3}"),
		   NULL),
		"%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
	/* The objects alone (gmbctl objects --json): the same entries. */
	cr_assert(eq(i32, gmb__objects_to_json(&f.st, &json), 0));
	cr_expect(eq(i32, strncmp(json, "{\"objects\":[{\"name\":\"weights\",", 30), 0), "%s",
		  json);
	cr_expect(ne(ptr, strstr(json, "}]}],\"objects_total\":3}"), NULL), "%s", json);
	cr_expect(eq(ptr, strstr(json, "\"clients\""), NULL), "%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
	fixture_small(&f);
	cr_assert(eq(i32, gmb__objects_to_json(&f.st, &json), 0));
	cr_expect(eq(str, json, "{\"objects\":[],\"objects_total\":0}"));
	free(json);
	cr_expect(eq(i32, gmb__objects_to_json(NULL, &json), -EINVAL));
}

Test(status_json, an_import_of_a_version_names_the_object)
{
	Gmb__ImportInfo ii, *pii[2];
	struct fixture f;
	char *text;

	fixture_import(&f, &ii, pii);
	ii.object = "weights";
	ii.object_version = 3;
	text = render_json(&f.st);
	cr_expect(ne(ptr,
		     strstr(text, "\"idle\":false,\"object\":\"weights\",\"object_version\":3}"),
		     NULL),
		  "%s", text);
	cr_expect(json_valid(text), "%s", text);
	free(text);
	text = render_table(&f.st);
	cr_expect(ne(ptr,
		     strstr(text, "#2 engine\\x1b[2J  456  weights@3  123      7    0  4.0 MiB"
				  "      2  object   yes\n"),
		     NULL),
		  "%s", text);
	free(text);
}

Test(status_json, objects_survive_every_failed_allocation)
{
	struct fixture_objects x;
	struct fixture f;

	fixture_objects(&f, &x);
	expect_enomem_paths(faulty_status_to_json, gmb__status_to_json, &f.st);
	expect_enomem_paths(faulty_status_to_table, gmb__status_to_table, &f.st);
	expect_enomem_paths(faulty_objects_to_json, gmb__objects_to_json, &f.st);
	expect_enomem_paths(faulty_objects_to_table, gmb__objects_to_table, &f.st);
}

/* The events of named objects read as the others: who, device, bytes, "NAME vN". */
Test(watch_format, object_events_name_the_version)
{
	Gmb__WatchEvent we = GMB__WATCH_EVENT__INIT;
	char *text = NULL, *json = NULL;

	we.kind = "object_publish";
	we.time_ns = 1;
	we.client_id = 3;
	we.client = "trainer";
	we.pid = 42;
	we.tag = "";
	we.device = 0;
	we.bytes = 64 * MiB;
	we.detail = "weights v3";
	cr_assert(eq(i32, gmb__watch_format(&we, false, &text), 0));
	cr_expect(ne(ptr,
		     strstr(text, " object_publish client=trainer id=3 pid=42 device=0"
				  " bytes=64.0 MiB: weights v3"),
		     NULL),
		  "%s", text);
	cr_expect(eq(ptr, strstr(text, "tag="), NULL), "%s", text);
	free(text);
	we.kind = "object_drop";
	cr_assert(eq(i32, gmb__watch_format(&we, true, &json), 0));
	cr_expect(ne(ptr, strstr(json, "\"kind\":\"object_drop\""), NULL), "%s", json);
	cr_expect(ne(ptr, strstr(json, "\"detail\":\"weights v3\""), NULL), "%s", json);
	cr_expect(json_valid(json), "%s", json);
	free(json);
}

/*
 * Paused objects: "weights" paused with its bytes, "old" paused without
 * (discarded). JSON says both, the table's STATE and top's too; an object
 * not paused never says discarded, whatever the field holds.
 */
Test(status_json, paused_objects_say_so_everywhere)
{
	struct fixture_objects x;
	struct fixture f;
	char *text, want[160];

	fixture_objects(&f, &x);
	x.o[0].paused = true;
	x.o[1].paused = true;
	x.o[1].discarded = true;
	f.st.objects_total = 2; /* the NULL entry is none */
	text = render_json(&f.st);
	cr_expect(ne(ptr,
		     strstr(text, "{\"name\":\"weights\",\"owner_uid\":1000,\"latest\":2,"
				  "\"bytes\":134217728,\"paused\":true,\"discarded\":false,"
				  "\"grants\":[1001,1002],"),
		     NULL),
		  "%s", text);
	cr_expect(ne(ptr,
		     strstr(text, "{\"name\":\"old\",\"owner_uid\":0,\"latest\":0,"
				  "\"bytes\":2097152,\"paused\":true,\"discarded\":true,"),
		     NULL),
		  "%s", text);
	cr_expect(json_valid(text), "%s", text);
	free(text);
	cr_assert(eq(i32, gmb__objects_to_json(&f.st, &text), 0));
	cr_expect(ne(ptr, strstr(text, "\"paused\":true,\"discarded\":true,"), NULL), "%s", text);
	cr_expect(json_valid(text), "%s", text);
	free(text);

	/* The table: STATE as wide as its widest cell. */
	cr_assert(eq(i32, gmb__objects_to_table(&f.st, &text), 0));
	cr_expect(
		eq(str, text,
		   "OBJECT   OWNER  STATE               LATEST  VERSIONS      BYTES  READERS  GRANTS\n"
		   "weights   1000  paused                  v2         2  128.0 MiB        2  1001,1002\n"
		   "old          0  paused (discarded)       -         1    2.0 MiB        1  -\n"),
		"%s", text);
	free(text);
	text = render_table(&f.st);
	cr_expect(ne(ptr, strstr(text, "\nold          0  paused (discarded)       -  "), NULL),
		  "%s", text);
	free(text);

	/* top: "paused (disc)" fits its column; every line within the width. */
	cr_assert(eq(i32, gmb__status_to_top(&f.st, 80, &text), 0));
	snprintf(want, sizeof(want), "\n%-26s %7u %-13s %7s %4d %10s %7d\n", "weights", 1000,
		 "paused", "v2", 2, "128.0 MiB", 2);
	cr_expect(ne(ptr, strstr(text, want), NULL), "%s", text);
	snprintf(want, sizeof(want), "\n%-26s %7u %-13s %7s %4d %10s %7d\n", "old", 0,
		 "paused (disc)", "-", 1, "2.0 MiB", 1);
	cr_expect(ne(ptr, strstr(text, want), NULL), "%s", text);
	free(text);
	/* The object lines (the clients' have a minimum of their own). */
	cr_assert(eq(i32, gmb__status_to_top(&f.st, 60, &text), 0));
	cr_assert(ne(ptr, strstr(text, "\nOBJECT "), NULL), "%s", text);
	for (char *l = strstr(text, "\nOBJECT ") + 1, *e; *l; l = e + 1) {
		e = strchr(l, '\n');
		cr_assert(ne(ptr, e, NULL));
		cr_expect(le(sz, (size_t)(e - l), 60), "%.*s", (int)(e - l), l);
	}
	cr_expect(ne(ptr, strstr(text, "paused (disc)"), NULL), "%s", text);
	free(text);

	/* Active again: "discarded" left set means nothing. */
	x.o[1].paused = false;
	text = render_json(&f.st);
	cr_expect(ne(ptr, strstr(text, "\"bytes\":2097152,\"paused\":false,\"discarded\":false,"),
		     NULL),
		  "%s", text);
	free(text);
	cr_assert(eq(i32, gmb__objects_to_table(&f.st, &text), 0));
	cr_expect(ne(ptr, strstr(text, "\nold          0  active     "), NULL), "%s", text);
	free(text);
	expect_enomem_paths(faulty_objects_to_table, gmb__objects_to_table, &f.st);
}
