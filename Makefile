# gmbd - GPU memory broker. GNU make, non-recursive.
#   make deps    install the build and test dependencies (apt-get, as root)
#   make         build/gmbd, build/gmbctl, build/libgmb.so, build/libgmb.a
#   make check   every test, then again under AddressSanitizer + UBSan
#   make run     gmbd in the foreground on ./run/gmbd.sock (--backend auto)
#   make demo    two workers alternating on one simulated device
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := all
.SUFFIXES:

CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif
CUDA_HOME ?= /usr/local/cuda
PREFIX ?= /usr/local
DESTDIR ?=
V ?= 0
ifeq ($(V),0)
Q := @
say = @printf '  %-7s %s\n' $(1) $(2);
else
Q :=
say =
endif

WARNINGS := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	-Wno-unused-parameter -Wformat=2 -Wno-format-nonliteral
CPPFLAGS_ALL = -D_GNU_SOURCE -I. -I$(B) -Iinclude -I$(CUDA_HOME)/include
CFLAGS_ALL = -std=gnu11 -g -O2 -fPIC -fvisibility=hidden -pthread $(WARNINGS) $(EXTRA_CFLAGS) $(CFLAGS)
DEPFLAGS = -MMD -MP
# libgmb needs only protobuf-c; gmbd adds libuv and libsystemd.
LIB_LIBS := -lprotobuf-c -ldl -lpthread
LIBS := -luv -lsystemd $(LIB_LIBS)
TEST_LIBS := -lcriterion

COMMON_SRC := common/log.c common/wire.c common/idmap.c common/backend.c \
	common/backend_host.c common/backend_cuda.c
PROTO_SRC := proto/gmb.pb-c.c
DAEMON_SRC := daemon/pool.c daemon/broker.c daemon/lend.c daemon/sess.c daemon/server.c \
	daemon/sd.c daemon/handlers.c daemon/handlers_ctl.c daemon/handlers_status.c daemon/opts.c
DAEMON_MAIN := daemon/main.c
LIB_SRC := client/conn.c client/cache.c client/mem.c client/cycle.c client/api.c client/status_json.c
CTL_SRC := client/gmbctl.c
TEST_SRC := $(wildcard tests/test_*.c)
TEST_HELPER_SRC := tests/util.c
TEST_PROG_SRC := $(wildcard tests/prog_*.c)

CUDA_H := $(CUDA_HOME)/include/cuda.h
# A fresh clone installs what it lacks once, before the first compile.
DEPS_STAMP := build/.deps-ok

# $(call objs,BUILD_DIR,SOURCES)
objs = $(addprefix $(1)/,$(2:.c=.o))

define build_tree
$(1)/proto/gmb.pb-c.c $(1)/proto/gmb.pb-c.h: proto/gmb.proto | $(DEPS_STAMP)
	$$(call say,PROTOC,$$<)mkdir -p $(1) && protoc-c --c_out=$(1) $$<

$(1)/proto/gmb.pb-c.o: $(1)/proto/gmb.pb-c.c
	$$(call say,CC,$$@)$$(CC) $$(CPPFLAGS_ALL) $$(CFLAGS_ALL) -Wno-missing-prototypes $$(DEPFLAGS) -c $$< -o $$@

$(1)/%.o: %.c | $(1)/proto/gmb.pb-c.h $(CUDA_H)
	@mkdir -p $$(@D)
	$$(call say,CC,$$@)$$(CC) $$(CPPFLAGS_ALL) $$(CFLAGS_ALL) $$(DEPFLAGS) -c $$< -o $$@

$(1)/libcommon.a: $(call objs,$(1),$(COMMON_SRC)) $(1)/proto/gmb.pb-c.o
	$$(call say,AR,$$@)rm -f $$@ && ar rcs $$@ $$^

$(1)/libgmbd.a: $(call objs,$(1),$(DAEMON_SRC))
	$$(call say,AR,$$@)rm -f $$@ && ar rcs $$@ $$^

$(1)/libgmb.a: $(call objs,$(1),$(LIB_SRC) $(COMMON_SRC)) $(1)/proto/gmb.pb-c.o
	$$(call say,AR,$$@)rm -f $$@ && ar rcs $$@ $$^

$(1)/libgmb.so: $(call objs,$(1),$(LIB_SRC) $(COMMON_SRC)) $(1)/proto/gmb.pb-c.o
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -shared -Wl,-soname,libgmb.so.0 -Wl,--no-undefined -o $$@ $$^ $$(LIB_LIBS)

$(1)/gmbd: $(call objs,$(1),$(DAEMON_MAIN)) $(1)/libgmbd.a $(1)/libcommon.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIBS)

$(1)/gmbctl: $(call objs,$(1),$(CTL_SRC)) $(1)/libgmb.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIB_LIBS)

$(1)/tests/prog_%: $(1)/tests/prog_%.o $(1)/libgmb.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIB_LIBS)

$(1)/tests/test_%: $(1)/tests/test_%.o $(call objs,$(1),$(TEST_HELPER_SRC)) $(1)/libgmbd.a $(call objs,$(1),$(LIB_SRC)) $(1)/libcommon.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(TEST_LIBS) $$(LIBS)

$(1)/bin: $(1)/gmbd $(1)/gmbctl $(1)/libgmb.so $(1)/libgmb.a
$(1)/tests: $(patsubst tests/%.c,$(1)/tests/%,$(TEST_SRC) $(TEST_PROG_SRC))

-include $(shell find $(1) -name '*.d' 2>/dev/null)
endef

B := build
$(eval $(call build_tree,build))
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
build-asan/%: B := build-asan
build-asan/%: EXTRA_CFLAGS += $(ASAN_FLAGS) -O1
$(eval $(call build_tree,build-asan))
# The same sources must build clean with clang too (compiled and linked, not run).
build-clang/%: B := build-clang
build-clang/%: CC := clang
$(eval $(call build_tree,build-clang))

all: build/bin ## build gmbd, gmbctl, libgmb.so, libgmb.a

$(CUDA_H):
	@echo "error: $(CUDA_H) not found: gmbd builds against the CUDA Toolkit's cuda.h (no GPU needed); set CUDA_HOME" >&2; exit 1

# Each test binary prints Criterion's synthesis; the run fails on any failure.
# Criterion does not fail a test whose worker LeakSanitizer flags at exit, so
# any sanitizer report in the output fails the run too.
define run_tests
	@set -e; for t in $(patsubst tests/%.c,$(1)/tests/%,$(TEST_SRC)); do \
		echo "== $$t"; GMB_BUILD_DIR=$(1) $(2) $$t --jobs 1 $(CRITERION_ARGS) 2>&1 | tee $$t.log; \
		if grep -q 'ERROR: .*Sanitizer\|SUMMARY: .*Sanitizer\|runtime error:' $$t.log; then \
			echo "$$t: sanitizer report above" >&2; exit 1; fi; done
endef

check: build/bin build/tests build-asan/bin build-asan/tests build-clang/bin build-clang/tests ## run every test, then under ASan+UBSan
	$(call run_tests,build,)
	$(call run_tests,build-asan,ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
	@echo "check: all tests passed (build and build-asan; clang build clean)"

RUN_DIR := $(CURDIR)/run
run: build/bin ## gmbd in the foreground on ./run/gmbd.sock
	@mkdir -p $(RUN_DIR)
	@echo "gmbd on $(RUN_DIR)/gmbd.sock; in another shell: GMB_SOCKET=$(RUN_DIR)/gmbd.sock build/gmbctl status"
	build/gmbd --socket $(RUN_DIR)/gmbd.sock --backend auto $(GMBD_ARGS)

demo: build/bin build/tests/prog_worker ## two workers alternating on one simulated device
	tests/demo.sh

$(DEPS_STAMP):
	@$(MAKE) --no-print-directory deps
	@mkdir -p $(@D) && touch $@

DEPS_DEB := libuv1-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libcriterion-dev pkg-config util-linux clang
deps: ## install build/test dependencies with apt-get (needs root)
	@missing=$$(for p in $(DEPS_DEB); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all installed"; else \
		echo "deps: installing $$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "deps: run as root (apt-get)" >&2; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

clean: ## remove build folders
	rm -rf build build-asan build-clang run

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

.PHONY: all check run demo deps clean help build/bin build/tests build-asan/bin build-asan/tests \
	build-clang/bin build-clang/tests
.SECONDARY:
