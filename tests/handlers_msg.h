/*
 * handlers_msg.h - the client's side of the handler tests: one fixture
 * (tests/handlers_fx.h) per test, on the host backend (8 GiB, 2 MiB
 * granularity, 1 GiB chunks), and the messages a client sends and reads
 * through it with wire_send()/wire_recv() while the loop turns. Every
 * function asserts with Criterion: only Criterion test binaries link it.
 */
#ifndef GMB_TEST_HANDLERS_MSG_H
#define GMB_TEST_HANDLERS_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/wire.h"
#include "proto/gmb.pb-c.h"
#include "tests/handlers_fx.h"

#define GiB	   (1ULL << 30)
#define MiB	   (1ULL << 20)
#define HM_WAIT_MS 5000

/* The running test's fixture, and the id its next request gets. */
extern struct hfx hm_fx;
extern uint64_t hm_next_id;

/* Starts the fixture with @pool_keep bytes kept warm per pool. */
void hm_start(uint64_t pool_keep);

/* A suite's .init (everything kept warm) and .fini: the latter checks that
 * every client left and that the loop closed with no handle left. */
void hm_setup(void);
void hm_teardown(void);

/* A new client: the test keeps one end (returned), a session serves the other. */
int hm_client(void);

/* A packet as read: the envelope and its fds, both the holder's. */
struct hm_msg {
	Gmb__Envelope *env;
	int fds[WIRE_MAX_FDS];
	int nfds;
};

void hm_msg_free(struct hm_msg *m);

/* Next packet for @fd, turning the loop meanwhile. 0 or -ECONNRESET. */
int hm_recv(int fd, struct hm_msg *m);

/* The session must close: every packet before the end is dropped; @fd is closed. */
void hm_expect_eof(int fd);

/* Nothing is waiting for @fd after the loop turned. */
void hm_expect_no_packet(int fd);

/* Sends a request with body @bc (every oneof member is a pointer); its id. */
uint64_t hm_send_req(int fd, Gmb__Envelope__BodyCase bc, void *body);

void hm_send_reply(int fd, uint64_t reply_to, int status);

/* The final part of the reply to @id; earlier parts go to @parts (if any). */
void hm_recv_reply(int fd, uint64_t id, struct hm_msg *last, struct hm_msg *parts, int *nparts);

uint64_t hm_send_hello(int fd, uint32_t version, const char *name, bool control, bool tool);

/* A client that said hello; returns its socket. */
int hm_hello_client(const char *name, bool control, bool tool);

uint64_t hm_send_alloc(int fd, uint64_t size, const char *tag);

/* A PauseRequest or a ResumeRequest (@bc) of @tag. */
uint64_t hm_send_tag_req(int fd, Gmb__Envelope__BodyCase bc, const char *tag);

uint64_t hm_send_control(int fd, const char *target, int op, const char *tag);

/* Alloc @size in @tag; fds imported or not, the id of the allocation. */
uint64_t hm_alloc_ok(int fd, uint64_t size, const char *tag);

/* The reply to @id's status; its error sentence to @err (if any). */
int hm_status_only(int fd, uint64_t id, char *err, size_t len);

/* Asserts that status, asked on @fd, shows the first tag of its first
 * client in state @want ("active", "pausing", ...). */
void hm_expect_first_tag_state(int fd, const char *want);

#endif
