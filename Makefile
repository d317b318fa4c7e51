# gmbd - GPU memory broker. GNU make, non-recursive.
#   make deps    install the build and test dependencies (apt-get, as root)
#   make         build/gmbd, build/gmbctl, build/libgmb.so(.0), build/libgmb.a, build/man
#   make check   every test, then again under AddressSanitizer + UBSan; the
#                installed tree (DESTDIR), pip, completion and examples/ too
#   make run     gmbd in the foreground on ./run/gmbd.sock (--backend auto)
#   make demo    two workers alternating on one simulated device
#   make install            gmbd, gmbctl, libgmb, gmb.pc, Python module, man pages,
#                           completion, units, config (PREFIX, DESTDIR, PYTHON)
#   make uninstall          what install wrote, but the config (PURGE=1: that too)
#   make check-systemd      restart without loss under a real systemd (nspawn, root)
#   make fuzz               each libFuzzer harness for FUZZ_SECONDS (clang, build-fuzz/)
#   make bench-load         64 clients of mixed operations: ops/s, status latency
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
CPPFLAGS_ALL = -D_GNU_SOURCE -I. -I$(B) -I$(CUDA_HOME)/include
CFLAGS_ALL = -std=gnu11 -g -O2 -fPIC -fvisibility=hidden -pthread $(WARNINGS) $(EXTRA_CFLAGS) $(CFLAGS)
DEPFLAGS = -MMD -MP
# libgmb needs only protobuf-c; gmbd adds libuv and libsystemd.
LIB_LIBS := -lprotobuf-c -ldl -lpthread
LIBS := -luv -lsystemd $(LIB_LIBS)
TEST_LIBS := -lcriterion

COMMON_SRC := common/env.c common/err.c common/deadline.c common/spin.c common/log.c common/wire.c common/idmap.c common/size.c common/ratelog.c common/ipc_handle.c common/objname.c \
	common/backend/error.c common/backend/open.c common/backend/host.c common/backend/host_va.c \
	common/backend/cuda.c common/backend/cuda_error.c common/backend/cuda_contents.c common/backend/nvml.c
PROTO_SRC := proto/gmb.pb-c.c
# The daemon's layers, bottom up: core, persist, handlers, transport; the
# service (main) wires them; system is the service manager's glue.
DAEMON_SRC := daemon/core/pool.c daemon/core/broker.c daemon/core/lend.c daemon/core/rejoin.c \
	daemon/core/proc.c daemon/core/arb.c daemon/core/wait.c daemon/core/walk.c daemon/core/import.c daemon/core/import_export.c daemon/core/import_restore.c daemon/core/object.c daemon/core/object_restore.c daemon/core/event.c daemon/handlers/watch.c \
	daemon/persist/state.c daemon/persist/persist.c \
	daemon/handlers/reply.c daemon/handlers/dreq.c daemon/handlers/drops.c daemon/handlers/park.c \
	daemon/handlers/status.c daemon/handlers/switch.c daemon/handlers/control.c daemon/handlers/memory.c \
	daemon/handlers/hello.c daemon/handlers/orphans.c daemon/handlers/handlers.c \
	daemon/handlers/limits.c daemon/handlers/ipc.c daemon/handlers/ipc_pause.c daemon/handlers/objects.c daemon/handlers/object_pause.c \
	daemon/transport/sess.c daemon/transport/server.c \
	daemon/system/sd.c daemon/service/opts.c daemon/service/conf.c \
	daemon/metrics/metrics.c daemon/metrics/http.c
# The named objects' part of the status reply.
DAEMON_SRC += daemon/handlers/object_status.c
DAEMON_MAIN := daemon/service/main.c
# libgmb, top down: the API, the hooks above it (regions, the default client,
# the PyTorch entry points), memory, the tables, the connection. The LD_PRELOAD
# shim is a library of its own that loads libgmb at run time (no NEEDED on it).
LIB_SRC := client/lib/api/api.c client/lib/api/query.c client/lib/api/object.c client/lib/api/status_json.c \
	client/lib/api/status_table.c client/lib/api/status_top.c client/lib/api/watch_format.c \
	client/lib/hook/region.c client/lib/hook/default.c client/lib/hook/alloc.c \
	client/lib/hook/torch.c client/lib/hook/libpath.c client/lib/hook/tms.c client/lib/hook/ipc.c \
	client/lib/mem/mem.c client/lib/mem/allocs.c client/lib/mem/cycle.c client/lib/mem/rejoin.c client/lib/mem/backup.c client/lib/mem/pack.c \
	client/lib/ipc/ipc.c client/lib/cache/cache.c client/lib/conn/conn.c client/lib/conn/request.c client/lib/conn/reconnect.c
# The retained pinned copies made ahead of the first pause (backup.c's).
LIB_SRC += client/lib/mem/prep.c client/lib/mem/save.c
PRELOAD_SRC := client/preload/preload.c client/preload/ipc.c common/env.c common/err.c
# gmbctl, top down: main, the parser and its checks, the help, the tables,
# the commands (one-shot and live), connecting and reporting failures.
CTL_SRC := client/gmbctl/gmbctl.c client/gmbctl/parse.c client/gmbctl/args.c client/gmbctl/help.c \
	client/gmbctl/table.c client/gmbctl/cmds.c client/gmbctl/live.c client/gmbctl/connect.c
TEST_SRC := $(wildcard tests/test_*.c)
TEST_HELPER_SRC := tests/util.c tests/fake_sd.c tests/loadgen.c tests/raw_client.c
# gmbd's layers on a loop without a listener, for the handler tests and the
# daemon's fuzz harness: not in TEST_HELPER_SRC, as bench programs link
# those without the daemon's library.
HANDLERS_FX_SRC := tests/handlers_fx.c
# Each test's log files, shown when it fails (Criterion's report hooks):
# linked into the Criterion programs only.
TESTLOG_SRC := tests/testlog.c
# The client's messages over that fixture, with Criterion's asserts: linked
# only into the test binaries that use them.
HANDLERS_MSG_SRC := tests/handlers_msg.c
HANDLERS_MSG_TESTS := test_handlers test_control test_dreq
# The broker's unit tests' fixture (a broker over the host backend and the
# invariant checks after each step), with Criterion's asserts too.
BROKER_FX_SRC := tests/broker_fx.c
BROKER_FX_TESTS := test_broker test_arb test_walk
# The CUDA IPC integration tests' fixture (gmbd and prog_preload programs).
IPC_FX_SRC := tests/ipc_fx.c
IPC_FX_TESTS := test_ipc test_ipc_follow test_ipc_restart test_ipc_driver test_object test_object_pause
# The status renderers' replies built in memory, with Criterion's asserts
# too: their JSON test and their table test share them.
STATUS_FX_SRC := tests/status_fx.c
STATUS_FX_TESTS := test_status_json test_status_table
TEST_PROG_SRC := $(wildcard tests/prog_*.c)
# Fuzz harnesses (tests/fuzz/fuzz_<name>.c), each with a corpus in
# tests/fuzz/corpus/<name>/; fuzz_util.c holds their invariant checks.
FUZZ_HARNESSES := daemon state client
FUZZ_OBJS = $(call objs,$(1),tests/fuzz/fuzz_util.c $(HANDLERS_FX_SRC)) $(1)/libgmbd.a $(call objs,$(1),$(LIB_SRC)) $(1)/libcommon.a

CUDA_H := $(CUDA_HOME)/include/cuda.h
# A fresh clone installs what it lacks once, before the first compile.
DEPS_STAMP := build/.deps-ok

# $(call objs,BUILD_DIR,SOURCES)
objs = $(addprefix $(1)/,$(2:.c=.o))

define build_tree
# One run of protoc-c makes both files (a grouped target): two runs would
# rewrite the header after objects were compiled against it.
$(1)/proto/gmb.pb-c.c $(1)/proto/gmb.pb-c.h &: proto/gmb.proto | $(DEPS_STAMP)
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

# The file is named by its soname, as installed, so a program linked with
# -L$(1) -lgmb (through the libgmb.so link) starts with LD_LIBRARY_PATH=$(1).
$(1)/libgmb.so.0: $(call objs,$(1),$(LIB_SRC) $(COMMON_SRC)) $(1)/proto/gmb.pb-c.o
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -shared -Wl,-soname,libgmb.so.0 -Wl,--no-undefined -o $$@ $$^ $$(LIB_LIBS)

$(1)/libgmb.so: $(1)/libgmb.so.0
	$(Q)ln -sfn libgmb.so.0 $$@

# pkg-config for this tree: PKG_CONFIG_PATH=$(1) pkg-config --cflags --libs gmb
$(1)/gmb-uninstalled.pc: gmb.pc.in include/gmb.h
	$$(call say,GEN,$$@)mkdir -p $(1) && sed $$(call pc_sed,$$$${pcfiledir}/..,$$$${pcfiledir},$$$${pcfiledir}/../include) $$< > $$@

$(1)/libgmb_preload.so: $(call objs,$(1),$(PRELOAD_SRC))
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -shared -Wl,-soname,libgmb_preload.so -Wl,--no-undefined -o $$@ $$^ -Wl,--as-needed -ldl

# It loads the stand-in driver next to it for its driver entry points (as libcudart loads libcuda).
$(1)/tests/libfake_cudart.so: $(1)/tests/fake_cudart.o | $(1)/tests/libfake_cuda.so
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -shared -Wl,-soname,libfake_cudart.so -o $$@ $$^

# The stand-in driver: soname libcuda.so.1, so the cuda backend's dlopen finds it once loaded.
$(1)/tests/libfake_cuda.so: $(1)/tests/fake_cuda.o
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -shared -Wl,-soname,libcuda.so.1 -o $$@ $$^

# The stand-in runtime, never libgmb: it dlopens libgmb as Python does.
$(1)/tests/prog_preload: $(1)/tests/prog_preload.o $(1)/tests/libfake_cudart.so
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$< -L$(1)/tests -lfake_cudart -Wl,-rpath,'$$$$ORIGIN' -ldl

$(1)/gmbd: $(call objs,$(1),$(DAEMON_MAIN)) $(1)/libgmbd.a $(1)/libcommon.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIBS)

$(1)/gmbctl: $(call objs,$(1),$(CTL_SRC)) $(1)/libgmb.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIB_LIBS)

$(1)/tests/prog_%: $(1)/tests/prog_%.o $(1)/libgmb.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIB_LIBS)

$(1)/tests/test_%: $(1)/tests/test_%.o $(call objs,$(1),$(TEST_HELPER_SRC) $(TESTLOG_SRC) $(HANDLERS_FX_SRC)) $(1)/libgmbd.a $(call objs,$(1),$(LIB_SRC)) $(1)/libcommon.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(TEST_LIBS) $$(LIBS)

$(addprefix $(1)/tests/,$(HANDLERS_MSG_TESTS)): $(call objs,$(1),$(HANDLERS_MSG_SRC))
$(addprefix $(1)/tests/,$(BROKER_FX_TESTS)): $(call objs,$(1),$(BROKER_FX_SRC))
$(addprefix $(1)/tests/,$(IPC_FX_TESTS)): $(call objs,$(1),$(IPC_FX_SRC))
$(addprefix $(1)/tests/,$(STATUS_FX_TESTS)): $(call objs,$(1),$(STATUS_FX_SRC))

# A harness with a plain main that replays its corpus (make check).
$(1)/fuzz/replay_%: $(1)/tests/fuzz/fuzz_%.o $(1)/tests/fuzz/replay.o $$(call FUZZ_OBJS,$(1))
	@mkdir -p $$(@D)
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIBS)

$(1)/fuzz/seeds: $(1)/tests/fuzz/seeds.o $$(call FUZZ_OBJS,$(1))
	@mkdir -p $$(@D)
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIBS)

$(1)/bench/load: $(1)/bench/load.o $(call objs,$(1),$(TEST_HELPER_SRC)) $(1)/libgmb.a
	$$(call say,LD,$$@)$$(CC) $$(CFLAGS_ALL) -o $$@ $$^ $$(LIB_LIBS)

$(1)/bin: $(1)/gmbd $(1)/gmbctl $(1)/libgmb.so.0 $(1)/libgmb.so $(1)/libgmb.a $(1)/gmb-uninstalled.pc
$(1)/tests: $(patsubst tests/%.c,$(1)/tests/%,$(TEST_SRC) $(TEST_PROG_SRC))
$(1)/tests: $(patsubst %,$(1)/fuzz/replay_%,$(FUZZ_HARNESSES))
$(1)/bin: $(1)/libgmb_preload.so
$(1)/tests: $(1)/tests/libfake_cuda.so

# (The nspawn tree of check-systemd lives under build/ and is full of *.d.)
-include $(shell find $(1) -path '$(1)/nspawn-root*' -prune -o -name '*.d' -type f -print 2>/dev/null)
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
# libFuzzer harnesses: clang, every object instrumented for coverage.
FUZZ_FLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer
build-fuzz/%: B := build-fuzz
build-fuzz/%: CC := clang
build-fuzz/%: EXTRA_CFLAGS += $(FUZZ_FLAGS) -O1
$(eval $(call build_tree,build-fuzz))
build-fuzz/fuzz/fuzz_%: build-fuzz/tests/fuzz/fuzz_%.o $(call FUZZ_OBJS,build-fuzz)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) $(CFLAGS_ALL) -fsanitize=fuzzer -o $@ $^ $(LIBS)

MAN_PAGES := build/man/gmbd.8 build/man/gmbctl.1 build/man/libgmb.3
all: build/bin $(MAN_PAGES) ## build gmbd, gmbctl, libgmb.so, libgmb.a, the man pages

# Man pages: scdoc(5) sources under doc/.
build/man/%: doc/%.scd | $(DEPS_STAMP)
	@command -v scdoc >/dev/null || { echo "error: scdoc not found (make deps)" >&2; exit 1; }
	$(call say,SCDOC,$@)mkdir -p $(@D) && scdoc < $< > $@.tmp && mv $@.tmp $@

# The examples, built as their comments say (-Lbuild -lgmb, nothing else).
build/examples/%: examples/%.c include/gmb.h build/libgmb.so
	$(call say,CC,$@)mkdir -p $(@D) && $(CC) -std=gnu11 -Wall -Wextra -Werror -Iinclude $< -Lbuild -lgmb -o $@

$(CUDA_H):
	@echo "error: $(CUDA_H) not found: gmbd builds against the CUDA Toolkit's cuda.h (no GPU needed); set CUDA_HOME" >&2; exit 1

# Each test binary prints Criterion's synthesis; the run fails on any failure.
# gmbd's logs go to $(1)/tests/logs/PROGRAM/ (tests/testlog.c), shown for a
# failing test only. Criterion does not fail a test whose worker
# LeakSanitizer flags at exit, nor one whose gmbd's does, so a sanitizer
# report in the output or in those logs fails the run too, and so does a
# gmbd's log line (its timestamp and level) in the output of a passing program.
SANITIZER_RE := 'ERROR: .*Sanitizer\|SUMMARY: .*Sanitizer\|runtime error:'
GMBD_LOG_RE := '^20[0-9][0-9]-[01][0-9]-[0-3][0-9] [0-9:.]* *\(err\|warning\|notice\|info\|debug\) '
define run_tests
	@set -e; for t in $(patsubst tests/%.c,$(1)/tests/%,$(TEST_SRC)); do \
		echo "== $$t"; GMB_BUILD_DIR=$(1) $(2) $$t --jobs 1 $(CRITERION_ARGS) 2>&1 | tee $$t.log; \
		if grep -q $(SANITIZER_RE) $$t.log; then \
			echo "$$t: sanitizer report above" >&2; exit 1; fi; \
		if logs=$$(grep -l $(SANITIZER_RE) $(1)/tests/logs/$${t##*/}/* 2>/dev/null); then \
			for l in $$logs; do echo "---- $$l"; grep -A40 $(SANITIZER_RE) $$l | head -80; done; \
			echo "$$t: sanitizer report in a gmbd's log above" >&2; exit 1; fi; \
		if grep -m3 $(GMBD_LOG_RE) $$t.log; then \
			echo "$$t: gmbd's log reached the output of a passing run (above): keep it in" \
				"test_log_path()'s file" >&2; exit 1; fi; done
endef

# The Python module's tests against a tree's libgmb.so and gmbd (no torch needed).
define run_python_tests
	@echo "== tests/python ($(1)/libgmb.so)"; GMB_BUILD_DIR=$(1) GMB_LIB=$(CURDIR)/$(1)/libgmb.so \
		PYTHONPATH=$(CURDIR)/client/python PYTHONDONTWRITEBYTECODE=1 \
		python3 -m unittest discover -s tests/python -p 'test_*.py' -v
endef

check: check-format build/bin build/tests build-asan/bin build-asan/tests build-clang/bin build-clang/tests $(MAN_PAGES) build/examples/pause_resume ## run every test, then under ASan+UBSan
	$(call run_tests,build,)
	$(call run_python_tests,build)
	$(call run_fuzz_replay,build,)
	$(call run_tests,build-asan,ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
	$(call run_fuzz_replay,build-asan,ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
	$(Q)for t in $(PACKAGING_CHECKS) check-rebuild; do $(MAKE) --no-print-directory $$t; done
	@echo "check: all tests passed (build and build-asan; clang build clean)"

# Every fuzz corpus once through its harness (a plain main, no fuzzer).
define run_fuzz_replay
	@set -e; for h in $(FUZZ_HARNESSES); do echo "== $(1)/fuzz/replay_$$h tests/fuzz/corpus/$$h"; \
		$(2) $(1)/fuzz/replay_$$h tests/fuzz/corpus/$$h 2>&1 | tee $(1)/fuzz/replay_$$h.log; \
		if grep -q 'ERROR: .*Sanitizer\|SUMMARY: .*Sanitizer\|runtime error:' $(1)/fuzz/replay_$$h.log; then \
			echo "replay_$$h: sanitizer report above" >&2; exit 1; fi; done
endef

# ---- fuzzing (clang 14's libFuzzer) ----
# Each harness for FUZZ_SECONDS, one job, niced; new inputs go to
# build-fuzz/corpus/<name> (the committed corpus is read, not written),
# crashes to build-fuzz/artifacts/. FUZZ_ARGS adds libFuzzer options.
FUZZ_SECONDS ?= 60
FUZZ_ARGS ?=
fuzz: $(patsubst %,build-fuzz/fuzz/fuzz_%,$(FUZZ_HARNESSES)) ## each fuzz harness for FUZZ_SECONDS (default 60)
	@set -e; for h in $(FUZZ_HARNESSES); do mkdir -p build-fuzz/corpus/$$h build-fuzz/artifacts; \
		echo "== fuzz_$$h for $(FUZZ_SECONDS) s"; \
		nice build-fuzz/fuzz/fuzz_$$h -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-timeout=10 -rss_limit_mb=4096 -artifact_prefix=build-fuzz/artifacts/$$h- $(FUZZ_ARGS) \
			build-fuzz/corpus/$$h tests/fuzz/corpus/$$h 2>&1 | tee build-fuzz/fuzz_$$h.log | \
			grep -E '^#[0-9]+ +(INITED|DONE|pulse)|stat::|ERROR|invariant' || true; \
		if grep -q 'ERROR: \|invariant broken\|==ERROR\|deadly signal' build-fuzz/fuzz_$$h.log; then \
			echo "fuzz_$$h: failure above; the input is in build-fuzz/artifacts/" >&2; exit 1; fi; done

# The seed corpora from packets and records made with protobuf-c.
fuzz-seeds: build/fuzz/seeds ## write tests/fuzz/corpus/* again from tests/fuzz/seeds.c
	build/fuzz/seeds tests/fuzz/corpus

# ---- load benchmark ----
bench-load: build/bin build/bench/load build/tests/prog_worker ## 64 clients of mixed operations: ops/s, status p50/p99
	GMB_BUILD_DIR=build build/bench/load $(BENCH_ARGS)

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

# systemd: systemd-socket-activate for tests/test_sd.c (no need for it as PID 1).
# scdoc: the man pages; python3-venv and python3-wheel-whl: pip installs the
# Python module into a fresh venv offline; man-db: man -l in the checks;
# bash-completion: a new shell loads gmbctl's completion (check-completion).
DEPS_DEB := libuv1-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libcriterion-dev pkg-config util-linux clang \
	systemd clang-format scdoc python3-venv python3-wheel-whl man-db prometheus tmux curl libclang-rt-14-dev \
	bash-completion
deps: ## install build/test dependencies with apt-get (needs root)
	@missing=$$(for p in $(DEPS_DEB); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all installed"; else \
		echo "deps: installing $$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "deps: run as root (apt-get)" >&2; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

# ---- install ----
# Programs under PREFIX; the configuration under SYSCONFDIR (/etc, whatever
# PREFIX is: gmbd reads /etc/gmbd/gmbd.conf); units and sysusers.d where
# systemd looks for PREFIX (/usr/local/lib/systemd/system is on its path);
# the Python module where the system's python3 looks for PREFIX.
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
DOCDIR ?= $(DATADIR)/doc/gmbd
MANDIR ?= $(DATADIR)/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
# bash-completion looks in $XDG_DATA_DIRS (/usr/local/share:/usr/share).
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
# The system's python3, not the first one on PATH (a pyenv or a venv).
PYTHON ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
# The Python module (it finds libgmb through $GMB_LIB or libgmb.so.0 on the
# library path). PYTHON is asked which of its own sys.path entries lies
# under $(PREFIX)/lib (Debian: /usr/local/lib/python3.X/dist-packages for
# /usr/local, /usr/lib/python3/dist-packages for /usr); for a PREFIX it
# does not search, its scheme's site-packages there (set PYTHONPATH).
PYTHONDIR_ASK := import sys, sysconfig; p = sys.argv[1].rstrip("/") + "/lib/"; \
	print(next((d for d in sys.path if d.startswith(p) and d.endswith("-packages")), \
	sysconfig.get_paths("posix_prefix", vars={"base": sys.argv[1], "platbase": sys.argv[1]})["purelib"]))
PYTHONDIR ?= $(eval PYTHONDIR := $(shell $(PYTHON) -c '$(PYTHONDIR_ASK)' '$(PREFIX)'))$(PYTHONDIR)
GMB_VERSION := $(shell sed -n 's/^\#define GMB_VERSION "\(.*\)"/\1/p' include/gmb.h)
# The units name /usr/local; another PREFIX is written into them.
UNIT_SED := s|/usr/local/sbin/gmbd|$(SBINDIR)/gmbd|; s|/usr/local/share/doc/gmbd|$(DOCDIR)|
# $(call pc_sed,PREFIX,LIBDIR,INCLUDEDIR): gmb.pc.in's sed arguments.
pc_sed = -e 's|@PREFIX@|$(1)|; s|@LIBDIR@|$(2)|; s|@INCLUDEDIR@|$(3)|; s|@VERSION@|$(GMB_VERSION)|'

PY_MODULES := $(notdir $(wildcard client/python/gmb/*.py))
EXAMPLES := examples/pause_resume.c examples/pause_resume.py
# Every file install writes (without DESTDIR), so uninstall and the DESTDIR
# check use the same list; the configuration file is not in it.
INSTALLED = $(SBINDIR)/gmbd $(BINDIR)/gmbctl $(LIBDIR)/libgmb.so.0 $(LIBDIR)/libgmb.so \
	$(LIBDIR)/libgmb.a $(LIBDIR)/libgmb_preload.so $(INCLUDEDIR)/gmb.h $(PKGCONFIGDIR)/gmb.pc \
	$(addprefix $(PYTHONDIR)/gmb/,$(PY_MODULES)) \
	$(UNITDIR)/gmbd.service $(UNITDIR)/gmbd.socket $(SYSUSERSDIR)/gmbd.conf \
	$(MANDIR)/man8/gmbd.8 $(MANDIR)/man1/gmbctl.1 $(MANDIR)/man3/libgmb.3 $(BASHCOMPDIR)/gmbctl \
	$(DOCDIR)/gmbd.conf.sample $(DOCDIR)/gmbd-daemonset.yaml $(DOCDIR)/README.md \
	$(addprefix $(DOCDIR)/examples/,$(notdir $(EXAMPLES)))

# $(call install_sed,SED,SRC,DEST): a rewritten copy, mode 0644, in place at once.
install_sed = sed $(1) $(2) > $(3).tmp && chmod 0644 $(3).tmp && mv $(3).tmp $(3)

# The folders install makes (and their parents). uninstall removes those it
# leaves empty, climbing to the parents: under a DESTDIR all the way (the
# staged tree is install's), on the live system not past the folders PREFIX
# and /etc have anyway.
INSTALL_DIRS = $(BINDIR) $(SBINDIR) $(LIBDIR) $(INCLUDEDIR) $(PKGCONFIGDIR) $(DOCDIR)/examples \
	$(UNITDIR) $(SYSUSERSDIR) $(SYSCONFDIR)/gmbd $(PYTHONDIR)/gmb $(MANDIR)/man1 $(MANDIR)/man3 \
	$(MANDIR)/man8 $(BASHCOMPDIR)
UNINSTALL_KEEP = $(if $(DESTDIR),,$(PREFIX) $(BINDIR) $(SBINDIR) $(LIBDIR) $(INCLUDEDIR) $(DATADIR) \
	$(DATADIR)/doc $(MANDIR) $(MANDIR)/man1 $(MANDIR)/man3 $(MANDIR)/man8 $(PKGCONFIGDIR) \
	$(PYTHONDIR) $(SYSCONFDIR))

install: build/bin $(MAN_PAGES) ## install (PREFIX=/usr/local, DESTDIR=, PYTHON=); keeps an existing gmbd.conf
	$(call say,INSTALL,$(DESTDIR)$(PREFIX))install -d $(addprefix $(DESTDIR),$(INSTALL_DIRS))
	$(Q)install -m 0755 build/gmbd $(DESTDIR)$(SBINDIR)/gmbd
	$(Q)install -m 0755 build/gmbctl $(DESTDIR)$(BINDIR)/gmbctl
	$(Q)install -m 0755 build/libgmb.so.0 $(DESTDIR)$(LIBDIR)/libgmb.so.0
	$(Q)ln -sfn libgmb.so.0 $(DESTDIR)$(LIBDIR)/libgmb.so
	$(Q)install -m 0644 build/libgmb.a $(DESTDIR)$(LIBDIR)/libgmb.a
	$(Q)install -m 0755 build/libgmb_preload.so $(DESTDIR)$(LIBDIR)/libgmb_preload.so
	$(Q)install -m 0644 include/gmb.h $(DESTDIR)$(INCLUDEDIR)/gmb.h
	$(Q)$(call install_sed,$(call pc_sed,$(PREFIX),$(LIBDIR),$(INCLUDEDIR)),gmb.pc.in,$(DESTDIR)$(PKGCONFIGDIR)/gmb.pc)
	$(Q)install -m 0644 $(addprefix client/python/gmb/,$(PY_MODULES)) $(DESTDIR)$(PYTHONDIR)/gmb/
	$(Q)for u in gmbd.service gmbd.socket; do \
		$(call install_sed,'$(UNIT_SED)',deploy/$$u,$(DESTDIR)$(UNITDIR)/$$u); done
	$(Q)install -m 0644 deploy/gmbd.sysusers $(DESTDIR)$(SYSUSERSDIR)/gmbd.conf
	$(Q)install -m 0644 build/man/gmbd.8 $(DESTDIR)$(MANDIR)/man8/
	$(Q)install -m 0644 build/man/gmbctl.1 $(DESTDIR)$(MANDIR)/man1/
	$(Q)install -m 0644 build/man/libgmb.3 $(DESTDIR)$(MANDIR)/man3/
	$(Q)install -m 0644 deploy/gmbctl.bash-completion $(DESTDIR)$(BASHCOMPDIR)/gmbctl
	$(Q)install -m 0644 deploy/gmbd.conf $(DESTDIR)$(DOCDIR)/gmbd.conf.sample
	$(Q)install -m 0644 deploy/kubernetes/gmbd-daemonset.yaml README.md $(DESTDIR)$(DOCDIR)/
	$(Q)install -m 0644 $(EXAMPLES) $(DESTDIR)$(DOCDIR)/examples/
	$(Q)[ -e $(DESTDIR)$(SYSCONFDIR)/gmbd/gmbd.conf ] || \
		install -m 0644 deploy/gmbd.conf $(DESTDIR)$(SYSCONFDIR)/gmbd/gmbd.conf
ifeq ($(DESTDIR),)
	@# The live system only: a staged tree gets its users from sysusers.d
	@# when it is installed, and its linker cache from its own ldconfig.
	$(Q)if command -v systemd-sysusers >/dev/null; then systemd-sysusers $(SYSUSERSDIR)/gmbd.conf; fi
	$(Q)ldconfig
	$(Q)ldconfig -p | grep -F '$(LIBDIR)/libgmb.so.0' >/dev/null || \
		echo "install: note: $(LIBDIR) is not on the linker's path; add it to /etc/ld.so.conf.d/"
	$(Q)if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
endif
	@echo "install: Python module gmb for $(PYTHON) ($$($(PYTHON) -c 'import platform; print(platform.python_version())')) in $(PYTHONDIR)/gmb; PYTHON=/path/to/python3 installs it for another"
	$(Q)if ! $(PYTHON) -c 'import sys; sys.exit("$(PYTHONDIR)" not in sys.path)'; then \
		echo "install: note: $(PYTHON) does not search $(PYTHONDIR); set PYTHONPATH=$(PYTHONDIR)"; \
	elif p=$$(command -v python3) && ! $$p -c 'import sys; sys.exit("$(PYTHONDIR)" not in sys.path)' 2>/dev/null; then \
		echo "install: note: python3 on PATH is $$p ($$($$p -c 'import sys; print(sys.executable)' 2>/dev/null)), which does not search $(PYTHONDIR): import gmb fails there; make install PYTHON=$$p installs the module for it"; fi
	@echo "install: done; enable with: systemctl enable --now gmbd.socket"

# Removes what install wrote; the configuration stays unless PURGE=1, and
# the gmb group and gmbd user stay (files may still belong to them).
uninstall: ## remove what install wrote (PREFIX, DESTDIR); PURGE=1 also removes /etc/gmbd
ifeq ($(DESTDIR),)
	$(Q)if [ -d /run/systemd/system ]; then systemctl disable --now gmbd.socket gmbd.service 2>/dev/null || true; fi
endif
	$(call say,RM,$(DESTDIR)$(PREFIX))rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	$(Q)rm -rf $(DESTDIR)$(PYTHONDIR)/gmb/__pycache__
ifeq ($(PURGE),1)
	$(Q)rm -f $(DESTDIR)$(SYSCONFDIR)/gmbd/gmbd.conf
endif
	$(Q)for d in $(INSTALL_DIRS); do \
		while [ "$$d" != / ] && [ -n "$$d" ]; do \
			case " $(UNINSTALL_KEEP) " in *" $$d "*) break ;; esac; \
			rmdir "$(DESTDIR)$$d" 2>/dev/null || break; d=$${d%/*}; done; done
ifeq ($(DESTDIR),)
	$(Q)ldconfig
	$(Q)if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
endif
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/gmbd/gmbd.conf ]; then \
		echo "uninstall: done; kept $(DESTDIR)$(SYSCONFDIR)/gmbd/gmbd.conf (PURGE=1 removes it)"; \
	else echo "uninstall: done"; fi

# ---- packaging checks (part of check; no root needed) ----
# Each runs a real gmbd (host backend) on a socket of its own.
PKG_CHECK_ENV = MAKE="$(MAKE)" PYTHON="$(PYTHON)" CC="$(CC)"
check-install: build/bin $(MAN_PAGES) ## make install DESTDIR= checked file by file, then used; uninstall
	$(Q)$(PKG_CHECK_ENV) tests/install/check_install.sh
check-pip: build/bin ## pip install ./client/python offline in a fresh venv; the module's tests there
	$(Q)$(PKG_CHECK_ENV) tests/install/check_pip.sh
check-completion: build/bin build/tests/prog_worker $(MAN_PAGES) ## gmbctl's bash completion against a live gmbd, and in a new shell
	$(Q)$(PKG_CHECK_ENV) tests/install/check_completion.sh
check-examples: build/bin build/examples/pause_resume ## examples/ built as the README says and run
	$(Q)$(PKG_CHECK_ENV) tests/install/check_examples.sh
# Nothing is rebuilt once everything is built (protoc runs once; no header
# is rewritten after its objects).
BUILD_GOALS := build/bin build/tests build-asan/bin build-asan/tests build-clang/bin build-clang/tests \
	$(MAN_PAGES) build/examples/pause_resume
check-rebuild: $(BUILD_GOALS) ## a second make of every build target does nothing
	$(Q)if ! $(MAKE) --no-print-directory -q $(BUILD_GOALS); then \
		echo "check-rebuild: FAILED: these would be rebuilt:" >&2; \
		$(MAKE) --no-print-directory -n $(BUILD_GOALS) | grep -v 'Nothing to be done' | head -20 >&2; exit 1; fi
	$(Q)n=$$($(MAKE) --no-print-directory V=1 -W proto/gmb.proto -n build/proto/gmb.pb-c.c \
		build/proto/gmb.pb-c.h | grep -c 'protoc-c'); [ "$$n" = 1 ] || \
		{ echo "check-rebuild: FAILED: protoc-c would run $$n times for one tree" >&2; exit 1; }
	$(Q)if $(MAKE) --no-print-directory help | grep -v '^[a-z-]*'$$'\t'; then \
		echo "check-rebuild: FAILED: make help prints more than 'target<TAB>text' (above)" >&2; exit 1; fi
	@echo "check-rebuild: PASS (nothing to rebuild; protoc-c runs once per tree; make help clean)"
PACKAGING_CHECKS := check-install check-pip check-completion check-examples
check-packaging: $(PACKAGING_CHECKS)

# make print-VAR: a variable's value (for the checks).
print-%:
	@echo '$($*)'

# ---- check-systemd: a real systemd 252 in systemd-nspawn ----
# A debootstrap'd Debian 12 tree, built once and kept under build/, boots
# with gmbd installed into it and a unit that runs tests/systemd/scenario.sh
# and powers off; the scenario's verdict comes back through a file.
NSPAWN_ROOT := build/nspawn-root
NSPAWN_STAMP := $(NSPAWN_ROOT)/.gmbd-tree
NSPAWN_SUITE := bookworm
# debootstrap's own default mirror unless NSPAWN_MIRROR names another.
NSPAWN_MIRROR ?=
# gmbd and the test client link libuv and protobuf-c dynamically.
# man-db: the units' Documentation=man: pages are checked there (systemd-analyze verify).
NSPAWN_INCLUDE := systemd,dbus,libuv1,libprotobuf-c1,man-db
NSPAWN_DEB := debootstrap systemd-container

nspawn-deps: ## debootstrap and systemd-nspawn on this machine (apt-get, as root)
	@if [ "$$(id -u)" != 0 ]; then echo "check-systemd: run as root (debootstrap, nspawn)" >&2; exit 1; fi
	@missing=$$(for p in $(NSPAWN_DEB); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "nspawn-deps: installing $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

$(NSPAWN_STAMP):
	@$(MAKE) --no-print-directory nspawn-deps
	@echo "  DEBOOTSTRAP $(NSPAWN_ROOT) ($(NSPAWN_SUITE), once)"
	$(Q)rm -rf $(NSPAWN_ROOT) $(NSPAWN_ROOT).tmp && mkdir -p build
	$(Q)debootstrap --variant=minbase --include=$(NSPAWN_INCLUDE) $(NSPAWN_SUITE) \
		$(NSPAWN_ROOT).tmp $(NSPAWN_MIRROR) > build/nspawn-debootstrap.log 2>&1 || \
		{ tail -20 build/nspawn-debootstrap.log; exit 1; }
	$(Q)mv $(NSPAWN_ROOT).tmp $(NSPAWN_ROOT) && echo '$(NSPAWN_INCLUDE)' > $@
# A tree made with other packages is made again.
ifneq ($(shell cat $(NSPAWN_STAMP) 2>/dev/null),$(NSPAWN_INCLUDE))
$(NSPAWN_STAMP): nspawn-tree-outdated
endif
.PHONY: nspawn-tree-outdated

check-systemd: build/bin build/tests/prog_worker nspawn-deps $(NSPAWN_STAMP) ## gmbd under systemd 252 in nspawn: socket, notify, restart without loss
	$(Q)$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(NSPAWN_ROOT) PREFIX=/usr/local
	$(Q)tests/systemd/boot.sh $(NSPAWN_ROOT) build/tests/prog_worker

# Every tracked C file, formatted by the committed .clang-format (clang-format 14).
FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format: ## format the C sources in place with .clang-format
	$(Q)clang-format -i $(FORMAT_SRC)

check-format: ## fail if a C source differs from what .clang-format makes of it
	$(Q)clang-format --dry-run -Werror $(FORMAT_SRC) 2>&1 | head -40; \
		[ "$${PIPESTATUS[0]}" = 0 ] || { echo "check-format: run 'make format'" >&2; exit 1; }
	@echo "check-format: clean"

clean: ## remove build folders
	rm -rf build build-asan build-clang build-fuzz run

# (MAKEFILE_LIST also holds every included .d file.)
help: ## this list
	@grep -hE '^[a-z-]+:.*## ' $(firstword $(MAKEFILE_LIST)) | sed 's/:.*## /\t/'

.PHONY: fuzz fuzz-seeds bench-load format check-format all check run demo deps clean help install uninstall check-install check-pip check-completion \
	check-examples check-rebuild check-packaging nspawn-deps check-systemd build/bin build/tests build-asan/bin build-asan/tests \
	build-clang/bin build-clang/tests
.SECONDARY:
