/*
 * test_robust.c - what one client, one user or a flood can do must not
 * break gmbd for the others: each test drives a real gmbd (host backend)
 * with raw protocol clients and libgmb clients, and checks that the
 * others keep their memory, their status and their service.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/wire.h"
#include "include/gmb.h"
#include "tests/raw_client.h"
#include "tests/util.h"

#define KiB 1024ULL
#define MiB (1024ULL * 1024)

static struct gmbd_proc gmbd;

static void stop(void)
{
	cr_expect(eq(i32, gmbd_stop(&gmbd), 0), "gmbd did not exit cleanly (leak or crash)");
}

TestSuite(robust, .fini = stop, .timeout = 120);

static void start(const char *const *args)
{
	cr_assert(eq(i32, gmbd_start(&gmbd, args), 0), "gmbd did not start");
}

/* ---- a raw client ---- */

struct raw {
	int fd;
	uint64_t next_id;
	uint64_t client_id;
};

/* One reply's parts as they come, the last one kept (the others freed). */
struct raw_reply {
	Gmb__Envelope *last;
	size_t parts, fds;
	uint64_t chunk_ids[64]; /* of the first lend seen */
	size_t nchunks;
	uint64_t alloc_id;
};

static void raw_connect(struct raw *r)
{
	*r = (struct raw){ .fd = -1 };
	cr_assert(eq(i32, wire_connect(gmbd.sock, &r->fd), 0));
}

/* Sends @env as a new request, reads every part of its reply. */
static int raw_request(struct raw *r, Gmb__Envelope *env, struct raw_reply *rep)
{
	int fds[WIRE_MAX_FDS], nfds, rc;
	Gmb__Envelope *e = NULL;

	memset(rep, 0, sizeof(*rep));
	env->id = ++r->next_id;
	rc = wire_send(r->fd, env, NULL, 0);
	if (rc < 0)
		return rc;
	do {
		if (e)
			gmb__envelope__free_unpacked(e, NULL);
		rc = wire_recv(r->fd, &e, fds, &nfds);
		if (rc < 0)
			return rc;
		wire_close_fds(fds, nfds);
		rep->parts++;
		rep->fds += (size_t)nfds;
		if (e->body_case == GMB__ENVELOPE__BODY_ALLOC_REPLY && e->alloc_reply->lend &&
		    !rep->alloc_id) {
			const Gmb__Lend *l = e->alloc_reply->lend;

			rep->alloc_id = l->alloc_id;
			for (size_t i = 0; i < l->n_chunk_ids && i < 64; i++)
				rep->chunk_ids[rep->nchunks++] = l->chunk_ids[i];
		}
	} while (e->more || e->reply_to != env->id);
	rep->last = e;
	return e->status;
}

static void raw_reply_free(struct raw_reply *rep)
{
	if (rep->last)
		gmb__envelope__free_unpacked(rep->last, NULL);
	rep->last = NULL;
}

static int raw_hello(struct raw *r, const char *name, uint64_t rejoin_id, bool tool)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__Hello h = GMB__HELLO__INIT;
	struct raw_reply rep;
	int rc;

	h.version = GMB_PROTOCOL_VERSION;
	h.name = (char *)name;
	h.control = true;
	h.tool = tool;
	h.rejoin_id = rejoin_id;
	env.body_case = GMB__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	rc = raw_request(r, &env, &rep);
	if (rc == 0 && rep.last->body_case == GMB__ENVELOPE__BODY_HELLO_REPLY)
		r->client_id = rep.last->hello_reply->client_id;
	raw_reply_free(&rep);
	return rc;
}

static int raw_alloc(struct raw *r, uint64_t size, const char *tag, struct raw_reply *rep)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__AllocRequest a = GMB__ALLOC_REQUEST__INIT;

	a.size = size;
	a.tag = (char *)tag;
	env.body_case = GMB__ENVELOPE__BODY_ALLOC;
	env.alloc = &a;
	return raw_request(r, &env, rep);
}

/* True once gmbd closed @fd (EOF within 5 s). */
static bool raw_closed(int fd)
{
	return raw_client_wait_closed(fd, 5000) == 0;
}

/* A protocol error gmbd answers by ending the connection: a client sends an fd. */
static void raw_send_fd(struct raw *r)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uint64_t id = 1, size = 1;

	cr_assert(ge(i32, fd, 0));
	env.id = ++r->next_id;
	env.n_fd_chunks = env.n_fd_sizes = 1;
	env.fd_chunks = &id;
	env.fd_sizes = &size;
	cr_assert(eq(i32, wire_send(r->fd, &env, &fd, 1), 0));
	close(fd);
}

/* ---- a child process that holds memory through a raw client ---- */

struct child {
	pid_t pid;
	int to[2], from[2]; /* parent -> child, child -> parent */
};

static void child_say(struct child *ch, char c)
{
	if (write(ch->from[1], &c, 1) != 1)
		_exit(90);
}

static char child_wait_word(int fd)
{
	char c = 0;

	return read(fd, &c, 1) == 1 ? c : 0;
}

/*
 * The child: a raw client allocates 4 MiB, then breaks the protocol and
 * waits for gmbd to hang up (says 'd'). With @rejoin it then reconnects as
 * itself and claims the allocation mapped (says 'r' once accepted). It
 * exits when the parent says so.
 */
static void child_main(struct child *ch, bool rejoin)
{
	struct raw r;
	struct raw_reply rep;
	uint64_t id, alloc_id, chunks[64];
	size_t nchunks;

	raw_connect(&r);
	if (raw_hello(&r, "holder", 0, false) != 0 || raw_alloc(&r, 4 * MiB, "t", &rep) != 0 ||
	    rep.nchunks != 2)
		_exit(91);
	alloc_id = rep.alloc_id;
	nchunks = rep.nchunks;
	memcpy(chunks, rep.chunk_ids, sizeof(chunks));
	raw_reply_free(&rep);
	id = r.client_id;
	child_say(ch, 'a');
	raw_send_fd(&r);
	if (!raw_closed(r.fd))
		_exit(92);
	close(r.fd);
	child_say(ch, 'd');
	if (rejoin) {
		Gmb__Envelope env = GMB__ENVELOPE__INIT;
		Gmb__RejoinRequest req = GMB__REJOIN_REQUEST__INIT;
		Gmb__RejoinTag tag = GMB__REJOIN_TAG__INIT, *ptag = &tag;
		Gmb__RejoinAlloc ra = GMB__REJOIN_ALLOC__INIT, rb, *pra[2] = { &ra, &rb };

		raw_connect(&r);
		r.next_id = 100;
		if (raw_hello(&r, "holder", id, false) != 0)
			_exit(93);
		tag.name = "t";
		ra.alloc_id = alloc_id;
		ra.tag = "t";
		ra.size = 4 * MiB;
		ra.mapped = true;
		/* In two pieces, as a lend too long for one part is claimed. */
		ra.n_chunk_ids = 1;
		ra.chunk_ids = chunks;
		rb = ra;
		rb.first_chunk = 1;
		rb.n_chunk_ids = nchunks - 1;
		rb.chunk_ids = chunks + 1;
		req.n_tags = 1;
		req.tags = &ptag;
		req.n_allocs = 2;
		req.allocs = pra;
		req.n_held_chunk_ids = nchunks;
		req.held_chunk_ids = chunks;
		req.last = true;
		env.body_case = GMB__ENVELOPE__BODY_REJOIN;
		env.rejoin = &req;
		if (raw_request(&r, &env, &rep) != 0)
			_exit(94);
		raw_reply_free(&rep);
		child_say(ch, 'r');
	}
	child_wait_word(ch->to[0]);
	_exit(0);
}

static void child_start(struct child *ch, bool rejoin)
{
	cr_assert(eq(i32, pipe(ch->to), 0));
	cr_assert(eq(i32, pipe(ch->from), 0));
	ch->pid = fork();
	cr_assert(ge(i32, ch->pid, 0));
	if (ch->pid == 0) {
		close(ch->to[1]);
		close(ch->from[0]);
		child_main(ch, rejoin);
	}
	close(ch->to[0]);
	close(ch->from[1]);
}

static int child_end(struct child *ch)
{
	int st = 0;

	close(ch->to[1]);
	waitpid(ch->pid, &st, 0);
	close(ch->from[0]);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int other_alloc_ok(void *arg)
{
	gmb_client *c = arg;
	void *p = NULL;

	if (gmb_malloc(c, &p, 4 * MiB, 0, "o") != 0)
		return 0;
	gmb_free(c, p);
	return 1;
}

/* A client gmbd hung up on keeps its memory while its process lives. */
static void doomed_client_keeps_memory(bool rejoin)
{
	static const char *const args[] = {
		"--host-memory",  "64MiB", "--budget",	  "4MiB", "--max-chunk", "2MiB",
		"--rejoin-grace", "60",	   "--log-level", "err",  NULL
	};
	struct child ch;
	gmb_client *other;
	void *p = NULL;

	start(args);
	child_start(&ch, rejoin);
	cr_assert(eq(chr, child_wait_word(ch.from[0]), 'a'));
	cr_assert(eq(chr, child_wait_word(ch.from[0]), 'd'), "gmbd did not hang up");
	if (rejoin)
		cr_assert(eq(chr, child_wait_word(ch.from[0]), 'r'), "the rejoin was refused");
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "other", &other), 0));
	/* Same uid: before, the 4 MiB the holder still maps were lent to us. */
	cr_expect(eq(i32, gmb_malloc(other, &p, 4 * MiB, 0, "o"), -ENOMEM),
		  "memory of a live client gmbd hung up on was lent again");
	if (p)
		gmb_free(other, p);
	cr_assert(eq(i32, child_end(&ch), 0));
	cr_expect(eq(i32, wait_until(other_alloc_ok, other, 5000), 0),
		  "the memory did not come back once the holder was gone");
	gmb_close(other);
}

Test(robust, client_gmbd_hung_up_on_keeps_its_memory_until_gone)
{
	doomed_client_keeps_memory(false);
}

Test(robust, client_gmbd_hung_up_on_rejoins)
{
	doomed_client_keeps_memory(true);
}

/* ---- lends too long for one packet ---- */

/* Raises this process's fd limit to @want (gmbd inherits it); false if it cannot. */
static bool fd_limit_at_least(rlim_t want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return false;
	if (rl.rlim_cur >= want)
		return true;
	/* Root may raise the hard limit too. */
	if (rl.rlim_max < want)
		rl.rlim_max = want;
	rl.rlim_cur = want;
	return setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

/* 15,000 chunks of 16 KiB: ids and sizes over 64 KiB packed (5 bytes a
 * chunk), within a 20,000-fd limit on each side (one uid may have all). */
Test(robust, lend_of_15000_chunks_travels_in_pieces)
{
	static const char *const args[] = { "--host-memory",
					    "256MiB",
					    "--host-granularity",
					    "16KiB",
					    "--max-chunk",
					    "16KiB",
					    "--fdstore-max",
					    "0",
					    "--log-level",
					    "err",
					    "--max-chunks-per-uid",
					    "0",
					    NULL };
	const size_t n = 15000, g = 16 * KiB, size = n * g;
	gmb_client *c;
	unsigned char *p = NULL;
	char *json = NULL;

	/* Each side keeps one fd a chunk (host backend handles are memfds). */
	if (!fd_limit_at_least(n + 4096))
		cr_skip_test("needs RLIMIT_NOFILE of %zu", n + 4096);
	start(args);
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "long", &c), 0));
	cr_assert(eq(i32, gmb_tag_set_mode(c, "big", GMB_MODE_PRESERVE), 0));
	cr_assert(eq(i32, gmb_malloc(c, (void **)&p, size, 0, "big"), 0),
		  "an allocation of %zu chunks: %s", n, gmb_last_error(c));
	for (size_t i = 0; i < size; i += g)
		p[i] = (unsigned char)(i / g);
	cr_assert(eq(i32, gmb_pause(c, "big"), 0), "%s", gmb_last_error(c));
	cr_assert(eq(i32, gmb_resume(c, "big"), 0), "resume of %zu chunks: %s", n,
		  gmb_last_error(c));
	for (size_t i = 0; i < size; i += g)
		cr_assert(eq(u8, p[i], (unsigned char)(i / g)), "byte %zu", i);
	cr_assert(eq(i32, gmb_status_json(c, &json), 0), "%s", gmb_last_error(c));
	cr_expect(eq(i64, json_i64(json, "used_bytes"), (int64_t)size));
	free(json);
	cr_expect(eq(i32, gmb_free(c, p), 0));
	gmb_close(c);
}

/* ---- a status entry larger than a packet ---- */

static size_t count_of(const char *hay, const char *needle)
{
	size_t n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

static int gmbctl_status(bool json, char *out, char *err, size_t cap)
{
	char bin[256];
	char *argv[] = { bin, "-s", gmbd.sock, "status", json ? "--json" : NULL, NULL };

	snprintf(bin, sizeof(bin), "%s/gmbctl", test_build_dir());
	return run_capture(argv, NULL, out, err, cap);
}

/* 256 tags of 128-byte names, an allocation in each on each of 2 devices. */
Test(robust, status_lists_a_client_larger_than_a_packet)
{
	static const char *const args[] = {
		"--host-devices", "2", "--host-memory", "2GiB", "--log-level", "err", NULL
	};
	const size_t cap = 4 << 20;
	char *out = malloc(cap), *err = malloc(cap);
	char tag[129], *json = NULL;
	gmb_client *c;

	cr_assert(out && err);
	start(args);
	cr_assert(eq(i32, gmb_connect(gmbd.sock, "many-tags", &c), 0));
	for (int t = 0; t < 256; t++) {
		/* "tag-NNN-" then x up to 128 bytes, the longest name gmbd takes. */
		memset(tag, 'x', sizeof(tag) - 1);
		tag[sizeof(tag) - 1] = '\0';
		memcpy(tag, "tag-", 4);
		tag[4] = (char)('0' + t / 100);
		tag[5] = (char)('0' + t / 10 % 10);
		tag[6] = (char)('0' + t % 10);
		tag[7] = '-';
		for (int d = 0; d < 2; d++) {
			void *p;

			cr_assert(eq(i32, gmb_malloc(c, &p, 2 * MiB, d, tag), 0), "%s",
				  gmb_last_error(c));
		}
	}
	cr_assert(eq(i32, gmb_status_json(c, &json), 0), "%s", gmb_last_error(c));
	cr_expect(eq(sz, count_of(json, "\"tag-"), 512), "rows of the client's own status");
	cr_expect(eq(sz, count_of(json, "many-tags"), 1), "one client, not one per entry");
	free(json);
	cr_assert(eq(i32, gmbctl_status(true, out, err, cap), 0), "%s", err);
	cr_expect(eq(sz, count_of(out, "\"tag-"), 512), "gmbctl status --json lists every row");
	cr_assert(eq(i32, gmbctl_status(false, out, err, cap), 0), "%s", err);
	for (int t = 0; t < 256; t++) {
		snprintf(tag, sizeof(tag), "tag-%03d-", t);
		cr_expect(ge(sz, count_of(out, tag), 1), "gmbctl status lists %s", tag);
	}
	gmb_close(c);
	free(out);
	free(err);
}

/* ---- a client that says it is a tool ---- */

static int raw_resume(struct raw *r, const char *tag, struct raw_reply *rep)
{
	Gmb__Envelope env = GMB__ENVELOPE__INIT;
	Gmb__ResumeRequest q = GMB__RESUME_REQUEST__INIT;

	q.tag = (char *)tag;
	env.body_case = GMB__ENVELOPE__BODY_RESUME;
	env.resume = &q;
	return raw_request(r, &env, rep);
}

static bool reply_says(const struct raw_reply *rep, const char *needle)
{
	return rep->last && rep->last->error && strstr(rep->last->error, needle);
}

Test(robust, a_tool_holds_no_memory)
{
	struct raw t, j;
	struct raw_reply rep;

	start(NULL);
	raw_connect(&t);
	cr_assert(eq(i32, raw_hello(&t, "sly", 0, true), 0));
	cr_assert(eq(i32, raw_alloc(&t, 2 * MiB, "hidden", &rep), -EPERM),
		  "a tool (invisible in status, never paused, not recorded) got memory");
	cr_assert(eq(sz, rep.fds, 0));
	cr_assert(reply_says(&rep, "a tool may not allocate"), "%s",
		  rep.last && rep.last->error ? rep.last->error : "(no error)");
	raw_reply_free(&rep);
	cr_assert(eq(i32, raw_resume(&t, "", &rep), -EPERM));
	cr_assert(reply_says(&rep, "a tool may not resume"));
	raw_reply_free(&rep);
	close(t.fd);
	/* Nor can it claim memory back after a restart as a tool. */
	raw_connect(&j);
	cr_assert(eq(i32, raw_hello(&j, "sly", 12345, true), -EPERM));
	close(j.fd);
}

/* ---- who may connect at all ---- */

static unsigned socket_mode_of(const char *path)
{
	struct stat st;
	bool sock;

	cr_assert(eq(i32, stat(path, &st), 0), "%s: %s", path, strerror(errno));
	sock = S_ISSOCK(st.st_mode);
	cr_assert(sock, "%s is not a socket", path);
	return (unsigned)(st.st_mode & 07777);
}

Test(robust_socket, gmbd_s_own_socket_admits_its_user_and_group_only)
{
	static const char *const narrow[] = { "--socket-mode", "0600", NULL };
	struct gmbd_proc d;
	struct group *gr = getgrgid(getgid());
	const char *group[] = { "--socket-group", gr ? gr->gr_name : "root", NULL };
	struct stat st;

	cr_assert(eq(i32, gmbd_start(&d, NULL), 0));
	cr_assert(eq(u32, socket_mode_of(d.sock), 0660), "any local user could connect");
	cr_assert(eq(i32, gmbd_stop(&d), 0));
	cr_assert(eq(i32, gmbd_start(&d, narrow), 0));
	cr_assert(eq(u32, socket_mode_of(d.sock), 0600));
	cr_assert(eq(i32, gmbd_stop(&d), 0));
	cr_assert(not(eq(ptr, gr, NULL)));
	cr_assert(eq(i32, gmbd_start(&d, group), 0));
	cr_assert(eq(i32, stat(d.sock, &st), 0));
	cr_assert(eq(u32, (unsigned)st.st_gid, (unsigned)getgid()));
	cr_assert(eq(i32, gmbd_stop(&d), 0));
}

Test(robust_socket, a_socket_group_that_cannot_be_set_stops_gmbd)
{
	static const char *const bad[] = { "--socket-group", "no-such-group-gmb", NULL };
	struct gmbd_proc d;
	struct stat st;

	char log[4096];
	FILE *f;
	size_t n;

	cr_assert(lt(i32, gmbd_start(&d, bad), 0), "gmbd served a socket of the wrong group");
	cr_assert(not(eq(i32, gmbd_stop(&d), 0)));
	cr_assert(lt(i32, stat(d.sock, &st), 0), "the socket was left behind");
	/* Said as what it is: no such group, not a missing file. */
	f = fopen(d.log, "r");
	cr_assert(not(eq(ptr, f, NULL)), "%s", d.log);
	n = fread(log, 1, sizeof(log) - 1, f);
	fclose(f);
	log[n] = '\0';
	cr_assert(not(eq(ptr, strstr(log, "no such group"), NULL)), "%s", log);
	cr_assert(not(eq(ptr, strstr(log, "group=no-such-group-gmb"), NULL)), "%s", log);
	cr_assert(eq(ptr, strstr(log, "No such file or directory"), NULL), "%s", log);
}

/* ---- connections that say nothing, and floods of them ---- */

static bool log_count_is(const char *needle, size_t want)
{
	char buf[65536];
	FILE *f = fopen(gmbd.log, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = 0;
	return count_of(buf, needle) == want;
}

Test(robust, a_connection_without_hello_is_closed_and_logged_once)
{
	static const char *const args[] = { "--hello-timeout", "1", NULL };
	struct raw a, b, c;

	start(args);
	raw_connect(&a);
	raw_connect(&b);
	raw_connect(&c);
	cr_assert(eq(i32, raw_hello(&c, "talks", 0, false), 0));
	cr_assert(raw_closed(a.fd), "a silent connection was kept");
	cr_assert(raw_closed(b.fd));
	cr_assert(not(raw_closed(c.fd)), "a client that said hello was closed");
	/* Two closed, one line (the second at debug, below the default level). */
	cr_assert(log_count_is("no hello within 1 s", 1), "not logged exactly once");
	close(a.fd);
	close(b.fd);
	close(c.fd);
}
