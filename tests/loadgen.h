/*
 * loadgen.h - many libgmb clients in one process, each on its own thread,
 * making a seeded mix of operations against one gmbd: alloc (2 MiB, into
 * an active tag: "kv" discard or "w" preserve), free, pause and resume of
 * a tag, and status. Used by tests/test_load.c (every call must succeed)
 * and bench/load.c (operations per second).
 *
 * Each client checks its own bytes: an allocation of the preserve tag
 * holds its id in its first and last word, checked after every resume.
 */
#ifndef GMB_TEST_LOADGEN_H
#define GMB_TEST_LOADGEN_H

#include <pthread.h>
#include <stdint.h>

struct loadgen {
	const char *sock;
	unsigned clients;
	unsigned ops; /* per client */
	unsigned seed;
	/* Out, once loadgen_run() returned: */
	uint64_t done;	       /* operations that succeeded */
	uint64_t failed;       /* calls that returned an error */
	uint64_t bad_bytes;    /* preserved words that came back wrong */
	char first_error[256]; /* what the first failure said */
	pthread_mutex_t lock;
};

/*
 * loadgen_run() - connect every client, run the mix, free and close.
 * Return: 0 when every call of every client succeeded and every byte came
 * back; -EIO otherwise (@g says how many and the first reason).
 */
int loadgen_run(struct loadgen *g);

#endif
