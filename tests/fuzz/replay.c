/*
 * replay.c - a fuzz harness without the fuzzer: runs LLVMFuzzerTestOneInput
 * once on every file named, or on every file of every folder named (a
 * corpus). make check builds each harness with this main in every build
 * tree, so the corpora replay under gcc's ASan/UBSan too. Exit status 0
 * when every input ran (a broken invariant aborts), 1 when a file cannot
 * be read.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

#define REPLAY_MAX_INPUT (1u << 20)

__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

static int replay_file(const char *path, unsigned *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = malloc(REPLAY_MAX_INPUT);
	size_t len;

	if (!f || !buf) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		if (f)
			fclose(f);
		free(buf);
		return -1;
	}
	len = fread(buf, 1, REPLAY_MAX_INPUT, f);
	fclose(f);
	LLVMFuzzerTestOneInput(buf, len);
	free(buf);
	(*n)++;
	return 0;
}

static int replay_path(const char *path, unsigned *n)
{
	struct stat st;
	struct dirent **names;
	int count, rc = 0;

	if (stat(path, &st) < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode))
		return replay_file(path, n);
	count = scandir(path, &names, NULL, alphasort);
	if (count < 0)
		return -1;
	for (int i = 0; i < count; i++) {
		char sub[4096];

		if (names[i]->d_name[0] != '.') {
			snprintf(sub, sizeof(sub), "%s/%s", path, names[i]->d_name);
			rc |= replay_file(sub, n);
		}
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	unsigned n = 0;
	int rc = 0;

	LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++)
		rc |= replay_path(argv[i], &n);
	printf("replay: %u inputs, no invariant broken\n", n);
	return rc ? 1 : 0;
}
