/*
 * status_fx.c - the replies of the renderers' tests (see status_fx.h):
 * every pointer in them points into the caller's struct or at a constant
 * string, so the caller frees nothing but render_table()'s text.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdbool.h>
#include <stddef.h>

#include "client/lib/api/status_json.h"
#include "tests/status_fx.h"

const char hostile[] = "a\"b\\c\nd\x01"
		       "e\x7f\x1b[31m";

void fixture_small(struct fixture *f)
{
	*f = (struct fixture){ .st = GMB__STATUS_REPLY__INIT,
			       .dev = GMB__DEVICE_INFO__INIT,
			       .cli = GMB__CLIENT_INFO__INIT,
			       .tag = GMB__TAG_INFO__INIT };
	f->st.backend = "host";
	f->st.version = "0.1.0";
	f->dev = (Gmb__DeviceInfo){ .base = f->dev.base,
				    .index = 0,
				    .name = "host0",
				    .total_bytes = 8 * GiB,
				    .budget_bytes = 8 * GiB,
				    .granularity = 2 * MiB,
				    .pool_bytes = 2 * GiB,
				    .used_bytes = 1536 * MiB,
				    .free_bytes = 512 * MiB };
	f->devs[0] = &f->dev;
	f->st.n_devices = 1;
	f->st.devices = f->devs;
	f->cli.id = 1;
	f->cli.name = "w";
	f->cli.pid = 123;
	f->cli.control = true;
	f->tag.name = "kv";
	f->tag.state = "active";
	f->tag.mode = GMB__MODE__MODE_DISCARD;
	f->tag.allocations = 2;
	f->tag.bytes = 1536 * MiB;
	f->tags[0] = &f->tag;
	f->cli.n_tags = 1;
	f->cli.tags = f->tags;
	f->clis[0] = &f->cli;
	f->st.n_clients = 1;
	f->st.clients = f->clis;
}

void fixture_import(struct fixture *f, Gmb__ImportInfo *ii, Gmb__ImportInfo **pii)
{
	fixture_small(f);
	gmb__import_info__init(ii);
	ii->importer_id = 2;
	ii->importer = "engine\x1b[2J";
	ii->importer_pid = 456;
	ii->owner_id = 1;
	ii->owner = "w";
	ii->owner_pid = 123;
	ii->alloc_id = 7;
	ii->bytes = 4 * MiB;
	ii->opens = 2;
	ii->owner_freed = true;
	pii[0] = ii;
	pii[1] = NULL; /* a NULL entry is skipped */
	f->st.n_imports = 2;
	f->st.imports = pii;
	f->st.imports_total = 70;
}

void fixture_objects(struct fixture *f, struct fixture_objects *x)
{
	fixture_small(f);
	*x = (struct fixture_objects){ .grants = { 1001, 1002 } };
	for (int i = 0; i < 3; i++) {
		gmb__object_version_info__init(&x->v[i]);
		x->pv[i] = &x->v[i];
	}
	x->v[0].version = 1;
	x->v[0].bytes = 64 * MiB;
	x->v[0].readers = 2;
	x->v[0].published_ns = 1700000000000000000ULL;
	x->v[0].publisher = "trainer";
	x->v[0].publisher_pid = 77;
	x->v[1].version = 2;
	x->v[1].bytes = 64 * MiB;
	x->v[1].device = 1;
	x->v[1].latest = true;
	x->v[1].publisher = "trainer";
	x->v[1].publisher_pid = 77;
	x->v[1].meta_bytes = 12;
	x->v[2].version = 5;
	x->v[2].bytes = 2 * MiB;
	x->v[2].readers = 1;
	x->v[2].publisher = "p\x1b[2J";
	for (int i = 0; i < 2; i++)
		gmb__object_info__init(&x->o[i]);
	x->o[0].name = "weights";
	x->o[0].owner_uid = 1000;
	x->o[0].latest = 2;
	x->o[0].bytes = 128 * MiB;
	x->o[0].n_versions = 2;
	x->o[0].versions = &x->pv[0];
	x->o[0].n_grants = 2;
	x->o[0].grants = x->grants;
	x->o[1].name = "old";
	x->o[1].owner_uid = 0;
	x->o[1].latest = 0;
	x->o[1].bytes = 2 * MiB;
	x->o[1].n_versions = 1;
	x->o[1].versions = &x->pv[2];
	x->po[0] = &x->o[0];
	x->po[1] = NULL; /* a NULL entry is skipped */
	x->po[2] = &x->o[1];
	f->st.n_objects = 3;
	f->st.objects = x->po;
	f->st.objects_total = 3;
}

char *render_table(const Gmb__StatusReply *st)
{
	char *out = NULL;

	cr_assert(eq(i32, gmb__status_to_table(st, &out), 0));
	cr_assert(ne(ptr, out, NULL));
	return out;
}
