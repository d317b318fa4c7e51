/*
 * prog_preload.c - a CUDA "application" for the preload shim's tests: it is
 * linked against the stand-in runtime (libfake_cudart.so), run with
 * LD_PRELOAD=libgmb_preload.so, and reaches libgmb only the way Python's
 * gmb module does, by dlopen($GMB_LIB) with RTLD_LOCAL.
 *
 * One command per line on stdin, one answer line "<rc> <text>" on stdout.
 * CUDA calls answer their cudaError_t (0 = success), libgmb calls 0 or a
 * negative errno. Commands:
 *   gmb                    dlopen $GMB_LIB and bind the gmb_* functions
 *   region TAG MODE        gmb_region_begin (TAG "-": plain; MODE discard|zero|preserve)
 *   end                    gmb_region_end
 *   malloc SIZE            cudaMalloc            -> "<err> <ptr>"
 *   free PTR               cudaFree
 *   amalloc SIZE           cudaMallocAsync(stream 0) -> "<err> <ptr>"
 *   afree PTR              cudaFreeAsync(stream 0)
 *   thread SIZE            cudaMalloc + cudaFree on a new thread -> "<err> <ptr>"
 *   device N | capture 0|1 | limit BYTES   steer the stand-in runtime
 *   fill PTR SIZE BYTE     memset (host memory on both sides here)
 *   check PTR SIZE BYTE    0 if every byte equals BYTE, else -EILSEQ
 *   stats                  the stand-in's counters
 *   ipcstats               its counts of cudaIpc*MemHandle calls served
 *   owns PTR               "0 1" if the default client owns PTR, "0 0" if not
 *   status                 gmb_status_json of the default client, on one line
 *   pause TAG|* / resume TAG|*   of the default client
 *   ipcgrant PTR UID / ipcrevoke PTR UID   gmb_ipc_grant / gmb_ipc_revoke
 *   tmalloc SIZE DEV       gmb_torch_malloc -> "0 <ptr>" or "-1 <why>"
 *   tfree PTR              gmb_torch_free
 *   shim                   "0 <version>" when libgmb_preload.so is preloaded
 *   error                  gmb_region_last_error() | gmb_preload_error()
 *   tms pause|resume TAG|-   torch_memory_saver's tms_pause/tms_resume ("-": NULL)
 *   tms get tag|interesting|cpu|backend|disk|retain   its getters -> "0 <value>"
 *   tms set tag|interesting|cpu|backend|disk|retain|dir VALUE   its setters
 *   tms copy PTR SIZE        tms_get_cpu_backup_pointer -> "0 <ptr>"
 *   (tms symbols come from the global scope: the shim's when preloaded)
 *   ipcget PTR             cudaIpcGetMemHandle -> "<err> <128 hex digits>"
 *   ipcopen HEX            cudaIpcOpenMemHandle(LazyEnablePeerAccess) -> "<err> <ptr>"
 *   ipcclose PTR           cudaIpcCloseMemHandle
 * The driver's calls (CUresult; the stand-in driver tests/fake_cuda.c is
 * loaded RTLD_LOCAL at the first of them, with two devices and device 0's
 * context current, as the stand-in runtime's entry points load it):
 *   driver                 load it RTLD_GLOBAL too, as a program linked against libcuda has it
 *   ctx N                  device N's context current on this thread (-1: none)
 *   rtversion N | byversion 0|1   the stand-in runtime's version; its lookup by version on or off
 *   cuget PTR ROUTE        cuIpcGetMemHandle -> "<err> <128 hex digits>"
 *   cuopen HEX ROUTE       cuIpcOpenMemHandle(LAZY_ENABLE_PEER_ACCESS) -> "<err> <ptr>"
 *   cuclose PTR ROUTE      cuIpcCloseMemHandle
 *     ROUTE: how the function is found: sym (dlsym(RTLD_DEFAULT), what a call
 *     linked against libcuda reaches: the open's cuda.h name, _v2), v1 (the
 *     open's unversioned symbol), gpa (cuGetProcAddress_v2 at CUDA_VERSION),
 *     gpa1 (cuGetProcAddress at 11030), ep (cudaGetDriverEntryPoint), epv
 *     (cudaGetDriverEntryPointByVersion at CUDA_VERSION)
 *   lookup ROUTE NAME VER  -> "<err> <status> <where>": the lookup's status (7 if
 *                          not written), where: shim:SYMBOL (the shim's function),
 *                          real (what the stand-in driver answers at VER), null, other
 *   drvstats               the stand-in driver's and runtime's counts of these calls
 *   loaded                 "0 1" if libgmb is in the process, "0 0" if not
 *   quit
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/gmb.h"
#include "tests/fake_cuda.h"
#include "tests/fake_cudart.h"

struct prog_gmb {
	int (*region_begin)(const char *, int);
	int (*region_end)(void);
	const char *(*region_last_error)(void);
	int (*owns)(gmb_client *, const void *);
	int (*default_client)(const char *, const char *, gmb_client **);
	int (*status_json)(gmb_client *, char **);
	int (*pause)(gmb_client *, const char *);
	int (*resume)(gmb_client *, const char *);
	void *(*torch_malloc)(ssize_t, int, void *);
	void (*torch_free)(void *, ssize_t, int, void *);
	int (*ipc_grant)(gmb_client *, const void *, uint32_t);
	int (*ipc_revoke)(gmb_client *, const void *, uint32_t);
};

static const char *const prog_gmb_names[] = {
	"gmb_region_begin", "gmb_region_end",	  "gmb_region_last_error",
	"gmb_owns",	    "gmb_default_client", "gmb_status_json",
	"gmb_pause",	    "gmb_resume",	  "gmb_torch_malloc",
	"gmb_torch_free",   "gmb_ipc_grant",	  "gmb_ipc_revoke",
};

static struct prog_gmb g;
static int g_bound;

/* Every field of struct prog_gmb is one function pointer, in name order. */
static int prog_bind(char *out, size_t cap)
{
	const char *path = getenv("GMB_LIB");
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
	void **slots = (void **)&g;

	if (!h) {
		snprintf(out, cap, "dlopen %s: %s", path ? path : "(GMB_LIB unset)", dlerror());
		return -ENOENT;
	}
	for (size_t i = 0; i < sizeof(prog_gmb_names) / sizeof(prog_gmb_names[0]); i++) {
		void *sym = dlsym(h, prog_gmb_names[i]);

		if (!sym) {
			snprintf(out, cap, "no %s", prog_gmb_names[i]);
			return -ENOSYS;
		}
		memcpy(&slots[i], &sym, sizeof(sym));
	}
	g_bound = 1;
	return 0;
}

static void *prog_ptr(const char *s)
{
	return (void *)(uintptr_t)strtoull(s, NULL, 0);
}

static int prog_mode(const char *s)
{
	return !strcmp(s, "zero")     ? GMB_MODE_ZERO :
	       !strcmp(s, "preserve") ? GMB_MODE_PRESERVE :
					GMB_MODE_DISCARD;
}

static int prog_bytes(const char *ptr, const char *size, const char *byte, int check)
{
	unsigned char *p = prog_ptr(ptr);
	size_t n = strtoull(size, NULL, 0);
	int b = (int)strtol(byte, NULL, 0);

	if (!check) {
		memset(p, b, n);
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)b)
			return -EILSEQ;
	return 0;
}

struct prog_thread {
	size_t size;
	void *ptr;
	cudaError_t rc;
};

static void *prog_thread_main(void *arg)
{
	struct prog_thread *t = arg;

	t->rc = cudaMalloc(&t->ptr, t->size);
	if (t->rc == cudaSuccess)
		t->rc = cudaFree(t->ptr);
	return NULL;
}

static int prog_thread(size_t size, char *out, size_t cap)
{
	struct prog_thread t = { .size = size };
	pthread_t th;

	if (pthread_create(&th, NULL, prog_thread_main, &t))
		return -EAGAIN;
	pthread_join(th, NULL);
	snprintf(out, cap, "%p", t.ptr);
	return (int)t.rc;
}

/* Handles travel as hex text: @n bytes of @h into @out, and back (the rest zero). */
static void prog_hex_out(const char *h, size_t n, char *out, size_t cap)
{
	for (size_t i = 0; i < n && 2 * i + 2 < cap; i++)
		snprintf(out + 2 * i, 3, "%02x", (unsigned char)h[i]);
}

static void prog_hex_in(const char *a, char *h, size_t n)
{
	memset(h, 0, n);
	for (size_t i = 0; i < n && a[2 * i] && a[2 * i + 1]; i++) {
		char byte[3] = { a[2 * i], a[2 * i + 1], 0 };

		h[i] = (char)strtoul(byte, NULL, 16);
	}
}

/* The cudaIpc*MemHandle calls. */
static int prog_ipc(const char *verb, const char *a, char *out, size_t cap)
{
	cudaIpcMemHandle_t h;
	void *p = NULL;
	cudaError_t r;

	if (!strcmp(verb, "ipcget")) {
		memset(&h, 0, sizeof(h));
		r = cudaIpcGetMemHandle(&h, prog_ptr(a));
		prog_hex_out(h.reserved, sizeof(h.reserved), out, cap);
		return (int)r;
	}
	if (!strcmp(verb, "ipcopen")) {
		prog_hex_in(a, h.reserved, sizeof(h.reserved));
		r = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
		snprintf(out, cap, "%p", p);
		return (int)r;
	}
	if (!strcmp(verb, "ipcclose"))
		return (int)cudaIpcCloseMemHandle(prog_ptr(a));
	return -EINVAL;
}

/* The stand-in driver, loaded (RTLD_LOCAL) and set up at the first call; NULL if it is not there. */
static void *prog_drv(void)
{
	static void *h;
	void (*setup)(int, const uint64_t *);
	void (*current)(int);
	static const uint64_t gran[2] = { 2 << 20, 2 << 20 };
	char path[PATH_MAX];
	Dl_info info;
	void *sym;

	if (h || !dladdr((void *)fake_cudart_stats, &info) || !strrchr(info.dli_fname, '/'))
		return h;
	snprintf(path, sizeof(path), "%.*s/libfake_cuda.so",
		 (int)(strrchr(info.dli_fname, '/') - info.dli_fname), info.dli_fname);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return NULL;
	sym = dlsym(h, "fake_cuda_setup");
	memcpy(&setup, &sym, sizeof(sym));
	sym = dlsym(h, "fake_cuda_set_current");
	memcpy(&current, &sym, sizeof(sym));
	setup(2, gran);
	current(0);
	return h;
}

/* @name of the stand-in driver's hooks (tests/fake_cuda.h). */
static void *prog_drv_hook(const char *name)
{
	void *h = prog_drv();

	return h ? dlsym(h, name) : NULL;
}

typedef CUresult (*prog_gpa_fn)(const char *, void **, int, cuuint64_t,
				CUdriverProcAddressQueryResult *);
typedef CUresult (*prog_gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef cudaError_t (*prog_ep_fn)(const char *, void **, unsigned long long,
				  enum cudaDriverEntryPointQueryResult *);
typedef cudaError_t (*prog_epv_fn)(const char *, void **, unsigned int, unsigned long long,
				   enum cudaDriverEntryPointQueryResult *);

/*
 * The lookup @route of @name at @version into *@p; *@status is 7 unless
 * the lookup wrote it. Returns its status (CUresult or cudaError_t).
 */
static int prog_lookup(const char *route, const char *name, int version, void **p, int *status)
{
	static const char *const fns[][2] = { { "gpa", "cuGetProcAddress_v2" },
					      { "gpa1", "cuGetProcAddress" },
					      { "ep", "cudaGetDriverEntryPoint" },
					      { "epv", "cudaGetDriverEntryPointByVersion" } };
	CUdriverProcAddressQueryResult q = (CUdriverProcAddressQueryResult)7;
	enum cudaDriverEntryPointQueryResult e = (enum cudaDriverEntryPointQueryResult)7;
	void *sym = NULL;
	prog_gpa_fn gpa;
	prog_gpa1_fn gpa1;
	prog_ep_fn ep;
	prog_epv_fn epv;
	int rc = -EINVAL;

	*p = NULL;
	*status = 7;
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
		if (!strcmp(route, fns[i][0]))
			sym = dlsym(RTLD_DEFAULT, fns[i][1]);
	if (!sym)
		return -ENOENT;
	memcpy(&gpa, &sym, sizeof(sym));
	memcpy(&gpa1, &sym, sizeof(sym));
	memcpy(&ep, &sym, sizeof(sym));
	memcpy(&epv, &sym, sizeof(sym));
	if (!strcmp(route, "gpa"))
		rc = (int)gpa(name, p, version, CU_GET_PROC_ADDRESS_DEFAULT, &q);
	else if (!strcmp(route, "gpa1"))
		rc = (int)gpa1(name, p, version, CU_GET_PROC_ADDRESS_DEFAULT);
	else if (!strcmp(route, "ep"))
		rc = (int)ep(name, p, cudaEnableDefault, &e);
	else
		rc = (int)epv(name, p, (unsigned int)version, cudaEnableDefault, &e);
	*status = route[0] == 'g' ? (int)q : (int)e;
	return rc;
}

/* The driver's function @name as @route finds it (sym and v1: @sym's symbol), or NULL. */
static void *prog_drv_fn(const char *route, const char *name, const char *sym)
{
	void *p = NULL;
	int st;

	if (!strcmp(route, "sym") || !strcmp(route, "v1"))
		return dlsym(RTLD_DEFAULT, route[0] == 'v' ? name : sym);
	prog_lookup(route, name, strcmp(route, "gpa1") ? CUDA_VERSION : 11030, &p, &st);
	return p;
}

/* Where @p is: the shim's SYMBOL, the stand-in driver's answer for @name at @version, ... */
static void prog_where(void *p, const char *name, int version, char *out, size_t cap)
{
	void *(*real)(const char *, int);
	void *sym = prog_drv_hook("fake_cuda_lookup");
	Dl_info info;

	memcpy(&real, &sym, sizeof(sym));
	if (!p)
		snprintf(out, cap, "null");
	else if (dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "libgmb_preload"))
		snprintf(out, cap, "shim:%s", info.dli_sname ? info.dli_sname : "?");
	else
		snprintf(out, cap, "%s", sym && p == real(name, version) ? "real" : "other");
}

/* cuget, cuopen, cuclose: the IPC calls through @route. */
static int prog_cu_ipc(const char *verb, const char *a, const char *route, char *out, size_t cap)
{
	CUresult (*get)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*open)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*close)(CUdeviceptr);
	CUdeviceptr d = 0;
	CUipcMemHandle h;
	void *fn;
	int r;

	if (!strcmp(verb, "cuget"))
		fn = prog_drv_fn(route, "cuIpcGetMemHandle", "cuIpcGetMemHandle");
	else if (!strcmp(verb, "cuopen"))
		fn = prog_drv_fn(route, "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2");
	else
		fn = prog_drv_fn(route, "cuIpcCloseMemHandle", "cuIpcCloseMemHandle");
	if (!fn)
		return -ENOENT;
	memcpy(&get, &fn, sizeof(fn));
	memcpy(&open, &fn, sizeof(fn));
	memcpy(&close, &fn, sizeof(fn));
	if (!strcmp(verb, "cuget")) {
		memset(&h, 0, sizeof(h));
		r = (int)get(&h, (CUdeviceptr)(uintptr_t)prog_ptr(a));
		prog_hex_out(h.reserved, sizeof(h.reserved), out, cap);
		return r;
	}
	if (!strcmp(verb, "cuopen")) {
		prog_hex_in(a, h.reserved, sizeof(h.reserved));
		r = (int)open(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		snprintf(out, cap, "%p", (void *)(uintptr_t)d);
		return r;
	}
	return (int)close((CUdeviceptr)(uintptr_t)prog_ptr(a));
}

static int prog_drvstats(char *out, size_t cap)
{
	void *sym = prog_drv_hook("fake_cuda_stats");
	void (*stats)(struct fake_cuda_stats *);
	struct fake_cuda_stats d;
	struct fake_stats rt;

	if (!sym)
		return -ENOENT;
	memcpy(&stats, &sym, sizeof(sym));
	stats(&d);
	fake_cudart_stats(&rt);
	snprintf(out, cap,
		 "gets=%d opens=%d opens_v1=%d closes=%d flags=%u ctx=%d ctx_v2=%d lookups=%d "
		 "ep=%d epv=%d",
		 d.ipc_gets, d.ipc_opens, d.ipc_opens_v1, d.ipc_closes, d.ipc_flags, d.ctx_devs,
		 d.ctx_devs_v2, d.lookups, rt.entry_lookups, rt.entry_lookups_by_version);
	return 0;
}

static const char *const prog_driver_verbs[] = { "loaded",  "rtversion", "byversion", "driver",
						 "ctx",	    "drvstats",	 "cuget",     "cuopen",
						 "cuclose", "lookup" };

/* The driver's commands, or -EINVAL for another verb. */
static int prog_driver(const char *verb, const char *a, const char *b, const char *c, char *out,
		       size_t cap)
{
	void (*current)(int);
	const char *lib = getenv("GMB_LIB");
	bool known = false;
	Dl_info info;
	void *sym, *p;
	int rc, st;

	for (size_t i = 0; i < sizeof(prog_driver_verbs) / sizeof(prog_driver_verbs[0]); i++)
		known |= !strcmp(verb, prog_driver_verbs[i]);
	if (!known)
		return -EINVAL;
	if (!strcmp(verb, "loaded")) {
		p = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
		snprintf(out, cap, "%d", p != NULL);
		if (p)
			dlclose(p);
		return 0;
	}
	if (!strcmp(verb, "rtversion") || !strcmp(verb, "byversion")) {
		(verb[0] == 'r' ? fake_cudart_set_version : fake_cudart_set_by_version)(atoi(a));
		return 0;
	}
	if (!prog_drv())
		return -ENOENT;
	if (!strcmp(verb, "driver")) {
		if (!dladdr(prog_drv_hook("fake_cuda_setup"), &info) || !info.dli_fname)
			return -ENOENT;
		/* The same file, now in the global scope as well (a reference, kept). */
		return dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL) ? 0 : -ENOENT;
	}
	if (!strcmp(verb, "ctx")) {
		sym = prog_drv_hook("fake_cuda_set_current");
		memcpy(&current, &sym, sizeof(sym));
		current(atoi(a));
		return 0;
	}
	if (!strcmp(verb, "drvstats"))
		return prog_drvstats(out, cap);
	if (!strcmp(verb, "cuget") || !strcmp(verb, "cuopen") || !strcmp(verb, "cuclose"))
		return prog_cu_ipc(verb, a, b, out, cap);
	if (!strcmp(verb, "lookup")) {
		rc = prog_lookup(a, b, atoi(c), &p, &st);
		snprintf(out, cap, "%d ", st);
		prog_where(p, b, atoi(c), out + strlen(out), cap - strlen(out));
		return rc;
	}
	return -EINVAL;
}

static int prog_cuda(const char *verb, const char *a, char *out, size_t cap)
{
	void *p = NULL;
	cudaError_t r;

	if (!strcmp(verb, "malloc") || !strcmp(verb, "amalloc")) {
		r = verb[0] == 'a' ? cudaMallocAsync(&p, strtoull(a, NULL, 0), 0) :
				     cudaMalloc(&p, strtoull(a, NULL, 0));
		snprintf(out, cap, "%p", p);
		return (int)r;
	}
	if (!strcmp(verb, "free"))
		return (int)cudaFree(prog_ptr(a));
	if (!strcmp(verb, "afree"))
		return (int)cudaFreeAsync(prog_ptr(a), 0);
	if (!strcmp(verb, "thread"))
		return prog_thread(strtoull(a, NULL, 0), out, cap);
	if (!strcmp(verb, "ipcget") || !strcmp(verb, "ipcopen") || !strcmp(verb, "ipcclose"))
		return prog_ipc(verb, a, out, cap);
	return -EINVAL;
}

static int prog_fake(const char *verb, const char *a, char *out, size_t cap)
{
	struct fake_stats st;

	if (!strcmp(verb, "device"))
		fake_cudart_set_device(atoi(a));
	else if (!strcmp(verb, "capture"))
		fake_cudart_set_capturing(atoi(a));
	else if (!strcmp(verb, "limit"))
		fake_cudart_set_limit(strtoull(a, NULL, 0));
	else if (!strcmp(verb, "stats")) {
		fake_cudart_stats(&st);
		snprintf(out, cap,
			 "mallocs=%d frees=%d bad_frees=%d syncs=%d amallocs=%d afrees=%d",
			 st.mallocs, st.frees, st.bad_frees, st.syncs, st.amallocs, st.afrees);
	} else if (!strcmp(verb, "ipcstats")) {
		fake_cudart_stats(&st);
		snprintf(out, cap, "gets=%d opens=%d closes=%d", st.ipc_gets, st.ipc_opens,
			 st.ipc_closes);
	} else
		return -EINVAL;
	return 0;
}

static int prog_status(char *out, size_t cap)
{
	gmb_client *c;
	char *json = NULL;
	int rc = g.default_client(NULL, NULL, &c);

	if (rc >= 0)
		rc = g.status_json(c, &json);
	if (rc < 0)
		return rc;
	for (char *s = json; *s; s++)
		if (*s == '\n')
			*s = ' ';
	snprintf(out, cap, "%s", json);
	free(json);
	return 0;
}

static int prog_cycle(const char *verb, const char *tag)
{
	gmb_client *c;
	int rc = g.default_client(NULL, NULL, &c);

	if (rc < 0)
		return rc;
	tag = strcmp(tag, "*") ? tag : NULL;
	return verb[0] == 'p' ? g.pause(c, tag) : g.resume(c, tag);
}

static int prog_torch(const char *verb, const char *a, const char *b, char *out, size_t cap)
{
	void *p;

	if (!strcmp(verb, "tfree")) {
		g.torch_free(prog_ptr(a), 0, 0, NULL);
		return 0;
	}
	p = g.torch_malloc((ssize_t)strtoll(a, NULL, 0), atoi(b), NULL);
	snprintf(out, cap, "%p %s", p, p ? "" : g.region_last_error());
	return p ? 0 : -1;
}

static int prog_shim(const char *verb, char *out, size_t cap)
{
	const char *(*fn)(void);
	void *sym =
		dlsym(RTLD_DEFAULT, verb[0] == 's' ? "gmb_preload_version" : "gmb_preload_error");

	if (!sym)
		return -ENOENT;
	memcpy(&fn, &sym, sizeof(sym));
	if (verb[0] == 's')
		snprintf(out, cap, "%s", fn());
	else
		snprintf(out, cap, "%s | %s", g_bound ? g.region_last_error() : "", fn());
	return 0;
}

/* torch_memory_saver's entry points, looked up as its C callers find them. */
static void *prog_tms_sym(const char *fmt, const char *what)
{
	char name[64];

	if (snprintf(name, sizeof(name), fmt, what) >= (int)sizeof(name))
		return NULL; /* no such entry point */
	return dlsym(RTLD_DEFAULT, name);
}

/* tms_@verb_ of the setting @what: tag, interesting, backend, cpu, disk,
 * dir, or X for X_cpu_backup. */
static void *prog_tms_prop(const char *verb, const char *what)
{
	static const char *const names[][2] = {
		{ "tag", "current_tag" },
		{ "interesting", "interesting_region" },
		{ "backend", "cpu_backup_backend" },
		{ "cpu", "enable_cpu_backup" },
		{ "disk", "enable_disk_backup" },
		{ "dir", "disk_backup_dir" },
	};
	char fmt[64];

	snprintf(fmt, sizeof(fmt), "tms_%s_%%s_cpu_backup", verb);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(what, names[i][0]))
			snprintf(fmt, sizeof(fmt), "tms_%s_%s", verb, names[i][1]);
	return prog_tms_sym(fmt, what);
}

static int prog_tms_get(const char *what, char *out, size_t cap)
{
	bool text = !strcmp(what, "tag") || !strcmp(what, "backend");
	void *sym = prog_tms_prop("get", what);
	const char *(*ftext)(void);
	bool (*fbool)(void);

	if (!sym)
		return -ENOENT;
	if (text) {
		memcpy(&ftext, &sym, sizeof(sym));
		snprintf(out, cap, "%s", ftext());
	} else {
		memcpy(&fbool, &sym, sizeof(sym));
		snprintf(out, cap, "%d", fbool());
	}
	return 0;
}

static int prog_tms_set(const char *what, const char *v)
{
	bool text = !strcmp(what, "tag") || !strcmp(what, "backend") || !strcmp(what, "dir");
	void *sym = prog_tms_prop("set", what);
	void (*ftext)(const char *);
	void (*fbool)(bool);

	if (!sym)
		return -ENOENT;
	if (text) {
		memcpy(&ftext, &sym, sizeof(sym));
		ftext(v);
	} else {
		memcpy(&fbool, &sym, sizeof(sym));
		fbool(atoi(v) != 0);
	}
	return 0;
}

static int prog_tms(const char *verb, const char *a, const char *b, char *out, size_t cap)
{
	uint8_t *(*fcopy)(const uint8_t *, uint64_t);
	int (*fcycle)(const char *);
	void *sym;

	if (!strcmp(verb, "get"))
		return prog_tms_get(a, out, cap);
	if (!strcmp(verb, "set"))
		return prog_tms_set(a, b);
	if (!strcmp(verb, "copy")) {
		sym = dlsym(RTLD_DEFAULT, "tms_get_cpu_backup_pointer");
		if (!sym)
			return -ENOENT;
		memcpy(&fcopy, &sym, sizeof(sym));
		snprintf(out, cap, "%p", (void *)fcopy(prog_ptr(a), strtoull(b, NULL, 0)));
		return 0;
	}
	sym = prog_tms_sym("tms_%s", verb);
	if (!sym || (strcmp(verb, "pause") && strcmp(verb, "resume")))
		return -ENOENT;
	memcpy(&fcycle, &sym, sizeof(sym));
	return fcycle(strcmp(a, "-") ? a : NULL);
}

/* Commands that need libgmb bound. */
static int prog_gmb(const char *verb, const char *a, const char *b, char *out, size_t cap)
{
	if (!g_bound)
		return -ENOPKG;
	if (!strcmp(verb, "region"))
		return g.region_begin(strcmp(a, "-") ? a : NULL, prog_mode(b));
	if (!strcmp(verb, "end"))
		return g.region_end();
	if (!strcmp(verb, "owns")) {
		snprintf(out, cap, "%d", g.owns(NULL, prog_ptr(a)));
		return 0;
	}
	if (!strcmp(verb, "status"))
		return prog_status(out, cap);
	if (!strcmp(verb, "pause") || !strcmp(verb, "resume"))
		return prog_cycle(verb, a);
	if (!strcmp(verb, "tmalloc") || !strcmp(verb, "tfree"))
		return prog_torch(verb, a, b, out, cap);
	if (!strcmp(verb, "ipcgrant"))
		return g.ipc_grant(NULL, prog_ptr(a), (uint32_t)strtoul(b, NULL, 0));
	if (!strcmp(verb, "ipcrevoke"))
		return g.ipc_revoke(NULL, prog_ptr(a), (uint32_t)strtoul(b, NULL, 0));
	return -EINVAL;
}

static int prog_run(char *line, char *out, size_t cap)
{
	char verb[32] = "", a[160] = "", b[64] = "", c[64] = "";
	int n = sscanf(line, "%31s %159s %63s %63s", verb, a, b, c);
	int rc;

	if (n < 1)
		return -EINVAL;
	if (!strcmp(verb, "gmb"))
		return prog_bind(out, cap);
	if (!strcmp(verb, "fill") || !strcmp(verb, "check"))
		return prog_bytes(a, b, c, verb[0] == 'c');
	if (!strcmp(verb, "shim") || !strcmp(verb, "error"))
		return prog_shim(verb, out, cap);
	if (!strcmp(verb, "tms"))
		return prog_tms(a, b, c, out, cap);
	rc = prog_driver(verb, a, b, c, out, cap);
	if (rc == -EINVAL)
		rc = prog_cuda(verb, a, out, cap);
	if (rc == -EINVAL)
		rc = prog_fake(verb, a, out, cap);
	if (rc == -EINVAL)
		rc = prog_gmb(verb, a, b, out, cap);
	return rc;
}

int main(void)
{
	static char out[1 << 16];
	char line[512];

	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		if (!strncmp(line, "quit", 4))
			break;
		out[0] = 0;
		printf("%d %s\n", prog_run(line, out, sizeof(out)), out);
	}
	return 0;
}
