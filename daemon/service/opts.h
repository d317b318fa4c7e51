/*
 * opts.h - gmbd's command line.
 *
 * One table (daemon/service/opts.c) lists every option with its argument name,
 * default and help text; it feeds both getopt_long() and --help, so the help
 * cannot drift from what the parser accepts. Sizes take K, M, G, T (powers
 * of 1024, also spelled KiB, MiB, GiB, TiB) or plain bytes.
 */
#ifndef GMB_OPTS_H
#define GMB_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What opts_parse() tells main() to do. */
enum opts_action {
	OPTS_RUN = 0,
	OPTS_HELP = 1,
	OPTS_VERSION = 2,
};

#define OPTS_RESERVE_CUDA   (2ULL << 30) /* --reserve default on cuda */
#define OPTS_ERR_MAX	    256
#define OPTS_DEFAULT_CONFIG "/etc/gmbd/gmbd.conf"
#define OPTS_FDSTORE_MAX    16384 /* the shipped unit's FileDescriptorStoreMax= */

struct gmbd_opts {
	const char *socket;	  /* argv or wire_default_socket(); not owned */
	unsigned socket_mode;	  /* of the socket gmbd creates (not an activated one) */
	const char *socket_group; /* its group by name; NULL: gmbd's own */
	const char *backend;	  /* "auto", "cuda" or "host" */
	int host_devices;
	uint64_t host_memory; /* bytes per simulated device */
	uint64_t host_granularity;
	uint64_t host_outside;	    /* simulated use by other processes, per device */
	const char *metrics_listen; /* "ADDR:PORT" or NULL: no metrics server */
	uint64_t max_chunk;
	uint64_t pool_keep; /* UINT64_MAX: keep every free chunk */
	uint64_t budget;    /* 0: device total minus reserve */
	uint64_t reserve;
	bool reserve_set; /* else: OPTS_RESERVE_CUDA on cuda, 0 on host */
	const char *admin_group;
	unsigned control_timeout;    /* seconds */
	int log_level;		     /* LOG_LVL_* */
	unsigned fdstore_max;	     /* the unit's FileDescriptorStoreMax=; 0: no fd store */
	unsigned rejoin_grace;	     /* seconds a restored client has to come back */
	unsigned hello_timeout;	     /* seconds a connection may stay without hello; 0: any */
	unsigned spin_us;	     /* polled without blocking after each request; 0: never */
	unsigned max_conns_per_uid;  /* connections one uid may hold open; 0: any number */
	uint64_t max_chunks_per_uid; /* chunks one uid may have lent; 0: any number */
	bool max_chunks_per_uid_set; /* else derived from RLIMIT_NOFILE at start */
	const char *config;	     /* the file read, or NULL */
	char *storage;		     /* the file's text (values point into it); owned */
};

/**
 * opts_parse() - fill @o with the defaults, then the configuration file
 * (--config PATH, else OPTS_DEFAULT_CONFIG if it exists), then @argv: the
 * command line wins. Every long option but help, version and config can be
 * set in the file as "name = value".
 * @argv is permuted by getopt_long(); strings in @o point into it, into
 * o->storage or to static storage: opts_deinit() frees o->storage. @err
 * (OPTS_ERR_MAX bytes) receives one sentence on failure.
 * Return: an enum opts_action, or -EINVAL for a bad option or value (or a
 * negative errno for a configuration file that cannot be read).
 */
int opts_parse(struct gmbd_opts *o, int argc, char **argv, char *err);
void opts_deinit(struct gmbd_opts *o);

/** opts_print_help() - the usage text, generated from the option table. */
void opts_print_help(FILE *f);

#endif
