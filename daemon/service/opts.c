/*
 * opts.c - gmbd's command line: one table feeds getopt_long() and --help.
 *
 * Each row names an option, its argument, the default as --help prints it,
 * the help text, and the setter that checks and stores the value. Setters
 * never print: they write one sentence to the caller's buffer, and main()
 * decides what to do with it (exit status 2).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/backend/backend.h"
#include "common/err.h"
#include "common/log.h"
#include "common/size.h"
#include "common/spin.h"
#include "common/wire.h"
#include "daemon/service/conf.h"
#include "daemon/service/opts.h"
#include "include/gmb.h"

#define OPTS_HELP_COL	 32
#define OPTS_MAX_TIMEOUT 86400
#define OPTS_MAX_FDSTORE (1u << 20)
#define OPTS_MAX_CHUNKS	 (1ul << 30)

struct opts_entry {
	const char *name;
	int short_name;	  /* 0: long only */
	const char *arg;  /* argument name; NULL: takes none */
	const char *def;  /* default as --help shows it; NULL: none */
	const char *help; /* '\n' starts an indented continuation line */
	int (*set)(struct gmbd_opts *o, const char *name, const char *arg, char *err);
};

static int opts_set_socket(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_backend(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_socket_mode(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_socket_group(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_host_devices(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_host_memory(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_host_granularity(struct gmbd_opts *o, const char *name, const char *arg,
				     char *err);
static int opts_set_max_chunk(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_pool_keep(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_budget(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_reserve(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_admin_group(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_control_timeout(struct gmbd_opts *o, const char *name, const char *arg,
				    char *err);
static int opts_set_log_level(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_fdstore_max(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_rejoin_grace(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_config(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_hello_timeout(struct gmbd_opts *o, const char *name, const char *arg,
				  char *err);
static int opts_set_max_conns(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_spin_us(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_max_chunks(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_help(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_host_outside(struct gmbd_opts *o, const char *name, const char *arg, char *err);
static int opts_set_metrics_listen(struct gmbd_opts *o, const char *name, const char *arg,
				   char *err);
static int opts_set_version(struct gmbd_opts *o, const char *name, const char *arg, char *err);

static const struct opts_entry opts_table[] = {
	{ "socket", 0, "PATH", "$GMB_SOCKET or /run/gmbd/gmbd.sock",
	  "listen on PATH, a Unix SOCK_SEQPACKET socket\n"
	  "(see socket-mode); missing directories are\n"
	  "created 0755, whatever the umask",
	  opts_set_socket },
	{ "socket-mode", 0, "OCTAL", "0660",
	  "permissions of the socket gmbd creates (not\n"
	  "under socket activation): who may connect at\n"
	  "all; 0666 lets any local user in",
	  opts_set_socket_mode },
	{ "socket-group", 0, "NAME", "gmbd's group",
	  "group of the socket gmbd creates (not under\n"
	  "socket activation): with socket-mode 0660, the\n"
	  "users who may use the broker; gmbd does not\n"
	  "start if it cannot set it",
	  opts_set_socket_group },
	{ "backend", 0, "auto|cuda|host", "auto",
	  "where memory comes from: cuda (the CUDA\n"
	  "driver), host (memfd host memory, for machines\n"
	  "without a GPU), or auto: cuda when a driver\n"
	  "and a GPU answer, else host",
	  opts_set_backend },
	{ "host-devices", 0, "N", "1", "host backend: simulated devices (1-64)",
	  opts_set_host_devices },
	{ "host-memory", 0, "BYTES", "8GiB", "host backend: memory of each simulated device",
	  opts_set_host_memory },
	{ "host-granularity", 0, "BYTES", "2MiB",
	  "host backend: allocation granularity, a power\n"
	  "of two of at least 4KiB and the page size;\n"
	  "chunk sizes are multiples of it",
	  opts_set_host_granularity },
	{ "max-chunk", 0, "BYTES", "1GiB",
	  "largest chunk gmbd creates (rounded down to\n"
	  "the granularity); an allocation uses the\n"
	  "fewest, largest chunks",
	  opts_set_max_chunk },
	{ "pool-keep", 0, "BYTES|unlimited", "0: a pause gives memory to the driver",
	  "free memory kept warm per device for the next\n"
	  "request; free chunks beyond it go back to the\n"
	  "driver. 0: a pause returns once its memory is\n"
	  "the driver's (others on the GPU can have it);\n"
	  "more: clients keep paused memory mapped-ready\n"
	  "and resume skips the driver's create",
	  opts_set_pool_keep },
	{ "budget", 0, "BYTES", "the device's total minus --reserve",
	  "most memory gmbd holds on each device", opts_set_budget },
	{ "reserve", 0, "BYTES", "2GiB on cuda, 0 on host",
	  "memory of each device left out of the default\n"
	  "budget (CUDA contexts, NCCL, other processes)",
	  opts_set_reserve },
	{ "admin-group", 0, "NAME", "gmb-admin",
	  "members may pause/resume any client and trim\n"
	  "the pools (root, gmbd's user and a client's\n"
	  "own user always may); operators, not every\n"
	  "user of the socket; a group that does not\n"
	  "exist turns this off",
	  opts_set_admin_group },
	{ "control-timeout", 0, "SECONDS", "30",
	  "how long a remote pause/resume waits for the\n"
	  "client before the operator gets ETIMEDOUT\n"
	  "(1-86400)",
	  opts_set_control_timeout },
	{ "log-level", 0, "LEVEL", "info",
	  "err, warning, notice, info or debug (debug\n"
	  "logs every message in and out)",
	  opts_set_log_level },
	{ "fdstore-max", 0, "N", "16384",
	  "the unit's FileDescriptorStoreMax=: under\n"
	  "systemd, gmbd keeps its state and up to N-1\n"
	  "chunks in the fd store so that a restart\n"
	  "loses no memory, and creates no chunk beyond\n"
	  "that (ENOSPC); a lower unit limit (read at\n"
	  "start) is kept instead, with a warning; 0\n"
	  "turns the fd store off",
	  opts_set_fdstore_max },
	{ "rejoin-grace", 0, "SECONDS", "30",
	  "after a restart, how long a client whose\n"
	  "process is still alive has to reconnect\n"
	  "before gmbd takes its memory back (0-86400)",
	  opts_set_rejoin_grace },
	{ "hello-timeout", 0, "SECONDS", "10",
	  "close a connection that has not said hello\n"
	  "after this long (0-3600; 0: never); at a\n"
	  "connection limit, one that holds no memory\n"
	  "and sent nothing this long is closed first",
	  opts_set_hello_timeout },
	{ "spin-us", 0, "MICROSECONDS", "200",
	  "after each request, poll this long without\n"
	  "blocking for the client's next (0-100000;\n"
	  "0: never): on a VM a blocked gmbd is woken\n"
	  "late, which slows a burst of allocations; at\n"
	  "most this much CPU per request",
	  opts_set_spin_us },
	{ "max-connections-per-uid", 0, "N", "256",
	  "connections one uid may hold open at once;\n"
	  "the next is closed at once (0: no limit).\n"
	  "root, gmbd's user and the admin group may\n"
	  "open 16 more, and 16 past what gmbd's\n"
	  "open-file limit leaves to others",
	  opts_set_max_conns },
	{ "max-chunks-per-uid", 0, "N|auto", "auto (from RLIMIT_NOFILE)",
	  "chunks one uid's clients may have lent at\n"
	  "once, over every device; past it a request\n"
	  "fails with ENOSPC (0: no limit). auto: of\n"
	  "the chunks gmbd's open-file limit leaves\n"
	  "once its own fds and those it keeps free are\n"
	  "taken off (on the host backend every chunk\n"
	  "is an open fd), an eighth is root's and a\n"
	  "uid may hold the rest divided by the other\n"
	  "uids holding chunks plus two",
	  opts_set_max_chunks },
	{ "config", 0, "PATH", OPTS_DEFAULT_CONFIG " if it exists",
	  "read 'name = value' settings from PATH first,\n"
	  "one per line, for any option above; the\n"
	  "command line wins; a PATH that cannot be read\n"
	  "is an error",
	  opts_set_config },
	{ "host-used-outside", 0, "BYTES", "0",
	  "host backend: memory of each simulated device\n"
	  "that its driver counts as used by other\n"
	  "processes (what status shows as outside gmbd)",
	  opts_set_host_outside },
	{ "metrics-listen", 0, "ADDR:PORT", "off",
	  "serve Prometheus metrics over HTTP at\n"
	  "http://ADDR:PORT/metrics, e.g. 127.0.0.1:9464\n"
	  "or [::1]:9464 (the unit must then allow\n"
	  "AF_INET/AF_INET6); port 0 picks a free one,\n"
	  "logged at start",
	  opts_set_metrics_listen },
	{ "help", 'h', NULL, NULL, "print this help and exit", opts_set_help },
	{ "version", 'V', NULL, NULL, "print the version and exit", opts_set_version },
};

#define OPTS_N		 (sizeof(opts_table) / sizeof(opts_table[0]))
/* getopt_long() val of a long-only option: past every char. */
#define OPTS_LONG_VAL(i) (0x100 + (int)(i))

static int opts_fail(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int opts_fail(char *err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	err_vfmt(err, OPTS_ERR_MAX, -EINVAL, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* A size option: a positive size unless @zero_ok. */
static int opts_size_arg(const char *name, const char *arg, bool zero_ok, uint64_t *out, char *err)
{
	int r = size_parse(arg, out);

	if (r == -ERANGE)
		return opts_fail(err, "--%s: '%s' is too large (the most is 2^64 - 1 bytes)", name,
				 arg);
	if (r == -EDOM)
		return opts_fail(err, "--%s: '%s' is not a whole number of bytes", name, arg);
	if (r < 0)
		return opts_fail(
			err, "--%s: '%s' is not a size (for example 8GiB, 1.5GiB, 512M or 4096)",
			name, arg);
	if (*out == 0 && !zero_ok)
		return opts_fail(err, "--%s: must be more than 0 bytes", name);
	return 0;
}

static int opts_uint_arg(const char *name, const char *arg, unsigned long min, unsigned long max,
			 unsigned long *out, char *err)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = isdigit((unsigned char)arg[0]) ? strtoul(arg, &end, 10) : 0;
	if (!isdigit((unsigned char)arg[0]) || *end || errno == ERANGE || v < min || v > max)
		return opts_fail(err, "--%s: '%s' is not a whole number from %lu to %lu", name, arg,
				 min, max);
	*out = v;
	return 0;
}

static int opts_set_socket(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	struct sockaddr_un sun;

	if (!arg[0])
		return opts_fail(err, "--%s: the path is empty", name);
	if (strlen(arg) >= sizeof(sun.sun_path))
		return opts_fail(err, "--%s: the path is longer than %zu bytes", name,
				 sizeof(sun.sun_path) - 1);
	o->socket = arg;
	return 0;
}

static int opts_set_hello_timeout(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	unsigned long v;

	if (opts_uint_arg(name, arg, 0, 3600, &v, err) < 0)
		return -EINVAL;
	o->hello_timeout = (unsigned)v;
	return 0;
}

static int opts_set_spin_us(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	unsigned long v;

	if (opts_uint_arg(name, arg, 0, SPIN_MAX_US, &v, err) < 0)
		return -EINVAL;
	o->spin_us = (unsigned)v;
	return 0;
}

static int opts_set_max_conns(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	unsigned long v;

	if (opts_uint_arg(name, arg, 0, 1000000, &v, err) < 0)
		return -EINVAL;
	o->max_conns_per_uid = (unsigned)v;
	return 0;
}

static int opts_set_max_chunks(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	unsigned long v;

	if (strcmp(arg, "auto") == 0) {
		o->max_chunks_per_uid_set = false;
		return 0;
	}
	if (opts_uint_arg(name, arg, 0, OPTS_MAX_CHUNKS, &v, err) < 0)
		return -EINVAL;
	o->max_chunks_per_uid = v;
	o->max_chunks_per_uid_set = true;
	return 0;
}

/* Octal permission bits only: no file type, no set-id or sticky bits. */
static int opts_set_socket_mode(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	char *end = NULL;
	unsigned long v;

	errno = 0;
	v = strtoul(arg, &end, 8);
	if (!arg[0] || *end || errno || v > 0777 || arg[0] == '-' || arg[0] == '+')
		return opts_fail(err, "--%s: '%s' is not an octal mode from 0 to 0777", name, arg);
	if (!(v & 0600))
		return opts_fail(err, "--%s: %04lo lets not even gmbd's own user connect", name, v);
	o->socket_mode = (unsigned)v;
	return 0;
}

static int opts_set_socket_group(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	if (!arg[0])
		return opts_fail(err, "--%s: the group name is empty", name);
	o->socket_group = arg;
	return 0;
}

static int opts_set_backend(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	if (strcmp(arg, "auto") != 0 && strcmp(arg, "cuda") != 0 && strcmp(arg, "host") != 0)
		return opts_fail(err, "--%s: '%s' is not auto, cuda or host", name, arg);
	o->backend = arg;
	return 0;
}

static int opts_set_host_devices(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	unsigned long v;
	int r = opts_uint_arg(name, arg, 1, BACKEND_MAX_DEVICES, &v, err);

	if (r == 0)
		o->host_devices = (int)v;
	return r;
}

static int opts_set_host_memory(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	return opts_size_arg(name, arg, false, &o->host_memory, err);
}

/* Checked here too, so that the refusal quotes the value as it was written. */
static int opts_set_host_granularity(struct gmbd_opts *o, const char *name, const char *arg,
				     char *err)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t g;

	if (opts_size_arg(name, arg, false, &g, err) < 0)
		return -EINVAL;
	if (g < 4096 || (g & (g - 1)) || (page > 0 && g % (uint64_t)page))
		return opts_fail(err,
				 "--%s: '%s' is not a power of two of at least 4KiB and the page"
				 " size (%ld bytes), for example 64KiB or 2MiB",
				 name, arg, page);
	o->host_granularity = g;
	return 0;
}

static int opts_set_max_chunk(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	return opts_size_arg(name, arg, false, &o->max_chunk, err);
}

static int opts_set_pool_keep(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	if (strcmp(arg, "unlimited") == 0) {
		o->pool_keep = UINT64_MAX;
		return 0;
	}
	return opts_size_arg(name, arg, true, &o->pool_keep, err);
}

static int opts_set_budget(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	return opts_size_arg(name, arg, false, &o->budget, err);
}

static int opts_set_reserve(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	int r = opts_size_arg(name, arg, true, &o->reserve, err);

	if (r == 0)
		o->reserve_set = true;
	return r;
}

static int opts_set_host_outside(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	return opts_size_arg(name, arg, true, &o->host_outside, err);
}

/* Checked for its shape here; the address itself when gmbd binds it. */
static int opts_set_metrics_listen(struct gmbd_opts *o, const char *name, const char *arg,
				   char *err)
{
	const char *colon = strrchr(arg, ':');
	unsigned long v;

	if (strcmp(arg, "off") == 0) {
		o->metrics_listen = NULL;
		return 0;
	}
	if (!colon || colon == arg)
		return opts_fail(err, "--%s: '%s' is not ADDR:PORT", name, arg);
	if (opts_uint_arg(name, colon + 1, 0, 65535, &v, err) < 0)
		return -EINVAL;
	o->metrics_listen = arg;
	return 0;
}

static int opts_set_admin_group(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	if (!arg[0])
		return opts_fail(err, "--%s: the group name is empty", name);
	o->admin_group = arg;
	return 0;
}

static int opts_set_control_timeout(struct gmbd_opts *o, const char *name, const char *arg,
				    char *err)
{
	unsigned long v;
	int r = opts_uint_arg(name, arg, 1, OPTS_MAX_TIMEOUT, &v, err);

	if (r == 0)
		o->control_timeout = (unsigned)v;
	return r;
}

static int opts_set_log_level(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	int lvl = log_parse_level(arg);

	if (lvl < 0)
		return opts_fail(err, "--%s: '%s' is not err, warning, notice, info or debug", name,
				 arg);
	o->log_level = lvl;
	return 0;
}

static int opts_set_fdstore_max(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	unsigned long v;
	int r = opts_uint_arg(name, arg, 0, OPTS_MAX_FDSTORE, &v, err);

	if (r == 0)
		o->fdstore_max = (unsigned)v;
	return r;
}

static int opts_set_rejoin_grace(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	unsigned long v;
	int r = opts_uint_arg(name, arg, 0, OPTS_MAX_TIMEOUT, &v, err);

	if (r == 0)
		o->rejoin_grace = (unsigned)v;
	return r;
}

/* Read before the command line (opts_load_config()); nothing to do here. */
static int opts_set_config(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	return 0;
}

static int opts_set_help(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	return OPTS_HELP;
}

static int opts_set_version(struct gmbd_opts *o, const char *name, const char *arg, char *err)
{
	return OPTS_VERSION;
}

static void opts_defaults(struct gmbd_opts *o)
{
	*o = (struct gmbd_opts){
		.socket = wire_default_socket(),
		.backend = "auto",
		.socket_mode = 0660,
		.host_devices = 1,
		.host_memory = 8ULL << 30,
		.host_granularity = 2ULL << 20,
		.max_chunk = 1ULL << 30,
		.pool_keep = 0,
		.budget = 0,
		.reserve = 0,
		.reserve_set = false,
		.admin_group = "gmb-admin",
		.control_timeout = 30,
		.log_level = LOG_LVL_INFO,
		.fdstore_max = OPTS_FDSTORE_MAX,
		.rejoin_grace = 30,
		.hello_timeout = 10,
		.spin_us = SPIN_DEFAULT_US,
		.max_conns_per_uid = 256,
	};
}

/* getopt_long()'s tables, built from opts_table. */
static void opts_build(struct option *lopts, char *sopts)
{
	size_t n = 0;

	/* ':' first: a missing argument returns ':' instead of '?'. */
	sopts[n++] = ':';
	for (size_t i = 0; i < OPTS_N; i++) {
		const struct opts_entry *e = &opts_table[i];

		lopts[i] = (struct option){ e->name, e->arg ? required_argument : no_argument, NULL,
					    e->short_name ? e->short_name : OPTS_LONG_VAL(i) };
		if (e->short_name) {
			sopts[n++] = (char)e->short_name;
			if (e->arg)
				sopts[n++] = ':';
		}
	}
	lopts[OPTS_N] = (struct option){ 0 };
	sopts[n] = '\0';
}

static const struct opts_entry *opts_find(int val)
{
	for (size_t i = 0; i < OPTS_N; i++) {
		if (opts_table[i].short_name ? opts_table[i].short_name == val :
					       OPTS_LONG_VAL(i) == val)
			return &opts_table[i];
	}
	return NULL;
}

/* getopt_long() said '?' or ':'; say which option in one sentence. */
static int opts_bad_option(int c, int argc, char **argv, char *err)
{
	const char *word = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
	const struct opts_entry *e = optopt ? opts_find(optopt) : NULL;

	if (c == ':')
		return opts_fail(err, "option '%s' needs an argument", word);
	if (e) /* known, so the complaint is "--help=x" */
		return opts_fail(err, "option '--%s' takes no argument", e->name);
	if (optopt > 0 && optopt < 0x100)
		return opts_fail(err, "unknown option -- '%c'", optopt);
	return opts_fail(err, "unknown or ambiguous option '%s'", word);
}

/* One "name = value" of the configuration file: the option's own setter. */
static int opts_conf_set(void *arg, const char *name, const char *value, char *msg, size_t len)
{
	struct gmbd_opts *o = arg;
	char err[OPTS_ERR_MAX];
	const struct opts_entry *e = NULL;
	int r;

	for (size_t i = 0; i < OPTS_N && !e; i++)
		if (strcmp(opts_table[i].name, name) == 0)
			e = &opts_table[i];
	if (!e || !e->arg || e->set == opts_set_config) {
		snprintf(msg, len,
			 "'%s' is not a setting (the settings are gmbd's long options"
			 " that take a value, but config)",
			 name);
		return -EINVAL;
	}
	r = e->set(o, e->name, value, err);
	if (r < 0)
		snprintf(msg, len, "%s", err);
	return r < 0 ? r : 0;
}

/*
 * A first pass over @argv finds --config (and whether --help or --version
 * make the file moot); getopt_long() is used so that abbreviations such as
 * --conf work as they do in the real pass. Errors are left to that pass.
 */
static const char *opts_find_config(int argc, char **argv, const struct option *lopts,
				    const char *sopts, bool *explicit, bool *moot)
{
	const char *path = OPTS_DEFAULT_CONFIG;
	int c;

	*explicit = *moot = false;
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, sopts, lopts, NULL)) != -1) {
		const struct opts_entry *e = opts_find(c);

		if (!e)
			continue;
		if (e->set == opts_set_config) {
			path = optarg;
			*explicit = true;
		} else if (e->set == opts_set_help || e->set == opts_set_version) {
			*moot = true;
		}
	}
	return path;
}

static int opts_load_config(struct gmbd_opts *o, int argc, char **argv, const struct option *lopts,
			    const char *sopts, char *err)
{
	bool explicit, moot;
	const char *path = opts_find_config(argc, argv, lopts, sopts, &explicit, &moot);
	int r;

	if (moot)
		return 0;
	r = conf_load(path, explicit, opts_conf_set, o, &o->storage, err, OPTS_ERR_MAX);
	if (r < 0)
		return r;
	if (o->storage)
		o->config = path;
	return 0;
}

void opts_deinit(struct gmbd_opts *o)
{
	free(o->storage);
	o->storage = NULL;
}

int opts_parse(struct gmbd_opts *o, int argc, char **argv, char *err)
{
	struct option lopts[OPTS_N + 1];
	char sopts[2 * OPTS_N + 2];
	int c, rc;

	opts_defaults(o);
	opts_build(lopts, sopts);
	err[0] = '\0';
	rc = opts_load_config(o, argc, argv, lopts, sopts, err);
	if (rc < 0)
		return rc;
	/* 0, not 1: glibc then starts over, so that tests can parse again. */
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, sopts, lopts, NULL)) != -1) {
		const struct opts_entry *e = opts_find(c);
		int r;

		if (c == '?' || c == ':' || !e)
			return opts_bad_option(c, argc, argv, err);
		r = e->set(o, e->name, optarg, err);
		if (r != 0)
			return r;
	}
	if (optind < argc)
		return opts_fail(err, "unexpected argument '%s'", argv[optind]);
	return OPTS_RUN;
}

/* One row: "  -h, --help" or "      --socket=PATH", then the help text. */
static void opts_print_entry(FILE *f, const struct opts_entry *e)
{
	const char *p = e->help;
	int col;

	if (e->short_name)
		col = fprintf(f, "  -%c, --%s", e->short_name, e->name);
	else
		col = fprintf(f, "      --%s", e->name);
	if (e->arg)
		col += fprintf(f, "=%s", e->arg);
	if (col >= OPTS_HELP_COL - 1) {
		fputc('\n', f);
		col = 0;
	}
	for (;;) {
		const char *nl = strchr(p, '\n');
		int n = nl ? (int)(nl - p) : (int)strlen(p);

		fprintf(f, "%*s%.*s\n", OPTS_HELP_COL - col, "", n, p);
		col = 0;
		if (!nl)
			break;
		p = nl + 1;
	}
	if (e->def)
		fprintf(f, "%*s(default: %s)\n", OPTS_HELP_COL, "", e->def);
}

void opts_print_help(FILE *f)
{
	fputs("Usage: gmbd [OPTION]...\n"
	      "gmbd, the GPU memory broker: owns the node's GPU memory and lends it to\n"
	      "clients (libgmb) over a Unix socket. Runs in the foreground; stops on\n"
	      "SIGINT or SIGTERM.\n\n"
	      "Options:\n",
	      f);
	for (size_t i = 0; i < OPTS_N; i++)
		opts_print_entry(f, &opts_table[i]);
	fputs("\nBYTES: a number with an optional suffix K, M, G or T (or KiB, MiB, GiB,\n"
	      "TiB), all powers of 1024; a plain number is bytes. A decimal fraction\n"
	      "(1.5GiB) is taken where it comes to whole bytes.\n"
	      "Configuration: every option above but help, version and config can also\n"
	      "be set in " OPTS_DEFAULT_CONFIG " (or the file --config names), one\n"
	      "'name = value' per line, '#' starting a comment line; the command line\n"
	      "wins over the file.\n"
	      "Exit status: 0 after SIGINT/SIGTERM, 1 when gmbd cannot start, 2 for a bad\n"
	      "option or configuration file.\n",
	      f);
}
