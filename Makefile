# kungfu_tf developer Makefile.
#
#   make install   .venv with requirements.txt at the versions of constraints.txt
#                  + editable install that builds kungfu_tf/libkungfu_tf.so and
#                  kungfu_tf/proto stubs
#   make constraints  re-pin constraints.txt to what .venv holds
#   make test      C++ runtime tests (tests/cpp/test_*.cc) then pytest
#   make sanitize  C++ runtime tests under AddressSanitizer + UBSan
#   make tsan      C++ runtime tests under ThreadSanitizer (tests/cpp/tsan.supp)
#   make fuzz      libFuzzer targets (tests/fuzz/fuzz_*.cc), FUZZ_SECONDS each
#   make demo      4-worker training demo (models/train.py)
#   make bench     allreduce benchmark: ours, MWMS, Open MPI, raw transport
#   make bench-scaling  the runtime alone at 32, 64 and 128 simulated workers: resources,
#                  latency, resize times, and what they predict for 1,024 (~5-10 min)
#   make bench-frame-auth  cost of per-frame authentication (GMAC, HMAC) vs memcpy
#   make bench-training    training throughput: ours, MWMS, no-comm ceiling
#   make bench-strategies  strategy builders and builders.Auto x models, one host and two (root)
#   make bench-adaptive    the three adaptive-training experiments: GNS batch size vs static
#                  batches, monitoring overhead, adaptive topology (the last needs root)
#   make bench-listing-one  KungFu's Listing 1: GNSResizePolicy grows an elastic job 1 -> 4 workers
#                  with the GNS, beside static 1 and static 4 (digits MLP; ~3 min)
#   make bench-monitoring  training throughput with GNS / gradient-variance monitoring vs none
#   make bench-adaptive-topology  static topology vs AdaptiveTopologyPolicy under
#                  link contention on two emulated hosts (root, ~7 min)
#   make bench-elastic  idle time of elastic shrink/grow/crash vs checkpoint-restart, 3 models (~45 min)
#   make bench-strategy-resize  what a membership change costs a job with a strategy (re-build, re-trace; ~5 min)
#   make bench-strategy-policy  StrategyPolicy vs each candidate strategy held static while the link between
#                  two emulated hosts is throttled 1 Gbit/s -> 100 Mbit/s -> 1 Gbit/s (root, ~5 min)
#   make bench-auto-probe  AUTO's probe across a 100 Mbit/s link between two emulated hosts: its cost and
#                  choice, pruned and not, against every fixed topology (root, ~8 min)
#   make bench-step-completion  a parameter-server step with and without the wait that completes it on every
#                  rank or on none (np 2 and 4, two MLPs, loopback; ~2 min)
#   make bench-slot-replicas  an elastic job's step with and without replicas of the parameter servers'
#                  optimizer slots (KUNGFU_SLOT_REPLICAS), np 3, three strategies, momentum and Adam (~2 min)
#   make bench-autoscaling  AutoscalingPolicy vs static sizes, StragglerPolicy vs a slowed worker,
#                  utility vs cost across prices (cgroup CPU quotas: root; ~14 min)
#   make lint      ruff, then mypy over the public API and the launcher ([tool.mypy] in pyproject.toml; ~10 s),
#                  and cpp-format
#   make cpp-format  clang-format --dry-run over the C++ sources (.clang-format; < 1 s;
#                  also run by `make test`); `make format` rewrites them in place
#   make docs      documentation site in build/docs/ (Sphinx: API reference from the docstrings,
#                  guide pages from README.md, benchmark pages from benchmarks/results/)
#   make clean     build outputs (keeps .venv); distclean also removes .venv
#
# Dependencies are installed only when requirements.txt or constraints.txt changes and the package
# is reinstalled only when setup.py/pyproject.toml change (stamp files in
# .venv/). Editing a .cc/.h/.proto makes the next `make test` (or `make
# install`) run `setup.py build_ext --inplace`, which recompiles only the
# changed objects (cache in build/obj/).

SHELL := /bin/bash
.DEFAULT_GOAL := test
.DELETE_ON_ERROR:

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

SO := kungfu_tf/libkungfu_tf.so
DEPS_STAMP := $(VENV)/.kungfu-deps.stamp
INSTALL_STAMP := $(VENV)/.kungfu-install.stamp
# Inputs of the .so and of the proto stubs. The directories are listed too so
# that adding or deleting a file triggers a rebuild (wildcard: git does not
# keep empty directories, so one may be missing in a fresh clone).
BUILD_INPUTS := $(wildcard ops/runtime/*.cc ops/runtime/*.h ops/kernels/*.cc \
	ops/kernels/*.h proto/*.proto ops/runtime ops/kernels proto) setup.py

# ---------------------------------------------------------------- C++ tests
# Each tests/cpp/test_X.cc is a standalone program linked with all of
# ops/runtime/*.cc (no TensorFlow) and the system's libcrypto (OpenSSL 3,
# Debian's libssl-dev) into build/cpp/test_X. libkungfu_tf.so links libcrypto
# statically instead (setup.py says why).
RUNTIME_SRCS := $(wildcard ops/runtime/*.cc)
CPP_TEST_SRCS := $(wildcard tests/cpp/test_*.cc)
CPP_TEST_TIMEOUT ?= 300
CPP_COMMON := -std=c++17 -Wall -Wextra -pthread -Iops/runtime
CPP_FLAGS := $(CPP_COMMON) -O2 -Werror
# No -Werror here: GCC documents that -fsanitize can cause spurious warnings.
SAN_FLAGS := $(CPP_COMMON) -fsanitize=address,undefined -fno-omit-frame-pointer -g -O1
CPP_LIBS := -lcrypto

# $(call cpp_rules,BUILD_DIR,FLAGS,TESTS_VAR): objects + test binaries.
define cpp_rules
$(3) := $$(patsubst tests/cpp/%.cc,$(1)/%,$$(CPP_TEST_SRCS))
$(1)_OBJS := $$(patsubst ops/runtime/%.cc,$(1)/obj/%.o,$$(RUNTIME_SRCS))
$$($(1)_OBJS): $(1)/obj/%.o: ops/runtime/%.cc Makefile
	@mkdir -p $$(@D)
	$$(CXX) $(2) -MMD -MP -c $$< -o $$@
$$($(3)): $(1)/%: tests/cpp/%.cc $$($(1)_OBJS) Makefile
	@mkdir -p $$(@D)
	$$(CXX) $(2) -MMD -MP $$< $$($(1)_OBJS) $$(CPP_LIBS) -o $$@
-include $$($(1)_OBJS:.o=.d) $$($(3):=.d)
endef
$(eval $(call cpp_rules,build/cpp,$(CPP_FLAGS),CPP_TESTS))
$(eval $(call cpp_rules,build/cpp-san,$(SAN_FLAGS),SAN_TESTS))
# ThreadSanitizer. KUNGFU_FLOOD_CONNECTIONS lowers test_flood's minimum of
# 2,560 connections (40 x its handshake slots), slow under TSAN.
TSAN_FLAGS := $(CPP_COMMON) -fsanitize=thread -fno-omit-frame-pointer -g -O1
$(eval $(call cpp_rules,build/cpp-tsan,$(TSAN_FLAGS),TSAN_TESTS))
TSAN_FLOOD_CONNECTIONS ?= 1000

# ---------------------------------------------------------------- fuzzing
# One libFuzzer program per parser (tests/fuzz/fuzz_X.cc, linked with the
# runtime built by clang with the same sanitizers) in build/fuzz/. Seeds are
# in tests/fuzz/corpus/fuzz_X/ (tests/fuzz/make_seeds.py writes them; crash
# regressions are added there by hand). New inputs the fuzzer finds go to
# build/fuzz/corpus/fuzz_X/, not into git. An input that makes a worker
# allocate more than FUZZ_MALLOC_MB at once or FUZZ_RSS_MB in all is a failure.
FUZZ_CXX ?= clang++
FUZZ_SECONDS ?= 60
FUZZ_RSS_MB ?= 512
FUZZ_MALLOC_MB ?= 256
FUZZ_SMOKE_RUNS ?= 2000
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.cc)
FUZZ_COMMON := -std=c++17 -Wall -Wextra -pthread -Iops/runtime -g -O1 -fno-omit-frame-pointer \
	-fno-sanitize-recover=undefined
FUZZ_OPTS = -rss_limit_mb=$(FUZZ_RSS_MB) -malloc_limit_mb=$(FUZZ_MALLOC_MB) -timeout=20 -print_final_stats=1
FUZZ_BINS := $(patsubst tests/fuzz/%.cc,build/fuzz/%,$(FUZZ_SRCS))
FUZZ_OBJS := $(patsubst ops/runtime/%.cc,build/fuzz/obj/%.o,$(RUNTIME_SRCS))
$(FUZZ_OBJS): build/fuzz/obj/%.o: ops/runtime/%.cc Makefile | fuzz-compiler
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_COMMON) -fsanitize=fuzzer-no-link,address,undefined -MMD -MP -c $< -o $@
$(FUZZ_BINS): build/fuzz/%: tests/fuzz/%.cc $(FUZZ_OBJS) Makefile | fuzz-compiler
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_COMMON) -fsanitize=fuzzer,address,undefined -MMD -MP $< $(FUZZ_OBJS) $(CPP_LIBS) -o $@
-include $(FUZZ_OBJS:.o=.d) $(FUZZ_BINS:=.d)

# Runs every program in $(1); fails at the end if any failed.
define run_cpp_tests
@failed=""; for t in $(1); do \
	echo "== $$t"; \
	timeout $(CPP_TEST_TIMEOUT) $$t || failed="$$failed $$t"; \
done; \
if [ -n "$$failed" ]; then echo "FAILED C++ tests:$$failed"; exit 1; fi; \
echo "C++ tests: $(words $(1)) programs passed"
endef

# ---------------------------------------------------------------- C++ format
# Every C++ source and header of ops/, tests/ and benchmarks/, checked against
# .clang-format by clang-format (Debian 12's clang-format 14; `make sysdeps`
# installs it). Another version may break lines differently: CI uses that one.
CLANG_FORMAT ?= clang-format
CPP_FORMAT_SRCS = $(sort $(shell find ops tests benchmarks -type f \( -name '*.cc' -o -name '*.h' \)))

# ---------------------------------------------------------------- targets
.PHONY: install constraints sysdeps test cpp-test sanitize tsan fuzz fuzz-smoke demo bench bench-frame-auth bench-training bench-strategies bench-adaptive bench-listing-one bench-monitoring bench-adaptive-topology bench-elastic bench-strategy-resize bench-strategy-policy bench-auto-probe bench-step-completion bench-slot-replicas bench-config-store bench-etcd-security bench-autoscaling bench-scaling lint cpp-format format docs clean distclean

install: sysdeps $(INSTALL_STAMP) $(SO)

# libssl-dev: OpenSSL's libcrypto (headers, libcrypto.a for libkungfu_tf.so,
# libcrypto.so for the C++ tests) and libxxhash-dev (xxhash.h, compiled into
# the elastic state digest; its shared library is the tests' reference).
# Required: the build fails without them.
# Then, best effort only (root + apt-get): iproute2 for the multi-host tests
# (network namespaces, `ip netns`); Open MPI (mpirun, mpicc) for the mpirun launch tests and the
# benchmark's MPI_Allreduce anchor and its test; clang (libFuzzer) for
# `make fuzz` and the fuzz smoke run of `make cpp-test`; clang-format for
# `make cpp-format` (run by `make test` and `make lint`); etcd-server (the
# `etcd` binary) for the --config-store tests, which start real etcd members.
sysdeps:
	@required=""; \
	if [ ! -f /usr/include/openssl/evp.h ]; then required="libssl-dev"; fi; \
	if [ ! -f /usr/include/xxhash.h ]; then required="$$required libxxhash-dev"; fi; \
	if [ -n "$$required" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing$$required (OpenSSL's libcrypto for the handshake, xxHash for the elastic state digest)"; \
			( export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
			  apt-get install -y -qq $$required ) || \
			{ echo "error: could not install$$required"; exit 1; }; \
		else \
			echo "error: headers not found: install$$required (apt-get install$$required)"; \
			exit 1; \
		fi; \
	fi
	@missing=""; \
	if ! command -v ip >/dev/null 2>&1 && [ ! -x /sbin/ip ] && [ ! -x /usr/sbin/ip ]; then \
		missing="iproute2"; \
	fi; \
	if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then \
		missing="$$missing openmpi-bin libopenmpi-dev"; \
	fi; \
	if ! command -v $(FUZZ_CXX) >/dev/null 2>&1; then \
		missing="$$missing clang"; \
	fi; \
	if ! command -v $(CLANG_FORMAT) >/dev/null 2>&1; then \
		missing="$$missing clang-format"; \
	fi; \
	if ! command -v etcd >/dev/null 2>&1; then \
		missing="$$missing etcd-server"; \
	fi; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing$$missing"; \
			( export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
			  apt-get install -y -qq $$missing ) || \
			echo "warning: could not install$$missing; multi-host tests, the MPI benchmark, the fuzzers, the C++ format check or the etcd tests may not run"; \
		else \
			echo "warning: not installed:$$missing (needs root and apt-get); multi-host tests, the MPI benchmark, the fuzzers, the C++ format check or the etcd tests may not run"; \
		fi; \
	fi

$(PY):
	$(PYTHON) -m venv $(VENV)

# constraints.txt pins every package (transitive ones too) to the version CI
# tested; requirements.txt says which packages we need.
$(DEPS_STAMP): requirements.txt constraints.txt | $(PY)
	$(PIP) install -r requirements.txt -c constraints.txt
	touch $@

# Re-pin constraints.txt to what .venv holds now (after a deliberate upgrade).
constraints: $(DEPS_STAMP)
	{ sed -n '/^#/p' constraints.txt; \
	  $(PIP) freeze --all --exclude-editable | grep -v -i -E '^(pip|kungfu[-_]tf)=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

# Editable install against .venv's TensorFlow (pyproject.toml explains
# --no-build-isolation). The .so is built by the next rule, not by pip, so
# compiler errors show up unwrapped and do not force a pip re-run.
$(INSTALL_STAMP): setup.py pyproject.toml $(DEPS_STAMP)
	KUNGFU_SKIP_EXT_BUILD=1 $(PIP) install -q --no-build-isolation -e .
	touch $@

# Builds kungfu_tf/libkungfu_tf.so and kungfu_tf/proto stubs in place;
# incremental (only changed objects are recompiled, cache in build/obj/).
$(SO): $(BUILD_INPUTS) | $(INSTALL_STAMP)
	$(PY) setup.py -q build_ext --inplace
	touch $@

test: install lint cpp-test
	$(PY) -m pytest -x -q -p no:cacheprovider --durations=15 tests

cpp-test: $(CPP_TESTS) fuzz-smoke
	$(call run_cpp_tests,$(CPP_TESTS))

sanitize: $(SAN_TESTS)
	$(call run_cpp_tests,$(SAN_TESTS))
sanitize: export UBSAN_OPTIONS := halt_on_error=1:print_stacktrace=1

tsan: $(TSAN_TESTS)
	$(call run_cpp_tests,$(TSAN_TESTS))
tsan: export TSAN_OPTIONS := halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/cpp/tsan.supp
tsan: export KUNGFU_FLOOD_CONNECTIONS := $(TSAN_FLOOD_CONNECTIONS)

.PHONY: fuzz-compiler
fuzz-compiler:
	@command -v $(FUZZ_CXX) >/dev/null 2>&1 || { \
		echo "error: $(FUZZ_CXX) not found: the fuzz targets need clang's libFuzzer; run \`make sysdeps\` (apt-get install clang)"; \
		exit 1; }

# Each target for FUZZ_SECONDS, growing build/fuzz/corpus/<target>/ from the seeds.
fuzz: $(FUZZ_BINS)
	@for b in $(FUZZ_BINS); do \
		t=$$(basename $$b); mkdir -p build/fuzz/corpus/$$t; \
		echo "== $$t for $(FUZZ_SECONDS) s"; \
		$$b $(FUZZ_OPTS) -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=build/fuzz/$$t- \
			build/fuzz/corpus/$$t tests/fuzz/corpus/$$t || exit 1; \
	done

# The suite's short run: every seed and crash regression, then FUZZ_SMOKE_RUNS mutations.
fuzz-smoke: $(FUZZ_BINS)
	@for b in $(FUZZ_BINS); do \
		t=$$(basename $$b); echo "== $$t: $(FUZZ_SMOKE_RUNS) runs"; \
		rm -rf build/fuzz/smoke/$$t; mkdir -p build/fuzz/smoke/$$t; \
		$$b $(FUZZ_OPTS) -runs=$(FUZZ_SMOKE_RUNS) -seed=1 -artifact_prefix=build/fuzz/$$t- \
			build/fuzz/smoke/$$t tests/fuzz/corpus/$$t 2>&1 | tail -n 12; \
		[ $${PIPESTATUS[0]} = 0 ] || { echo "FAILED: $$t"; exit 1; }; \
	done

demo: install
	$(VENV)/bin/kungfu-run -np 4 $(PY) models/train.py

bench: install
	$(PY) -m benchmarks.allreduce

# Per-frame authentication cost (frame_auth.h) against memcpy, per MiB.
FRAME_AUTH_BENCH := build/bench/frame_auth_cost
FRAME_AUTH_OBJS := $(addprefix build/cpp/obj/,secret.o hmac.o libcrypto.o frame_auth.o)
$(FRAME_AUTH_BENCH): benchmarks/frame_auth/cost.cc $(FRAME_AUTH_OBJS) Makefile
	@mkdir -p $(@D)
	$(CXX) $(CPP_FLAGS) $< $(FRAME_AUTH_OBJS) $(CPP_LIBS) -o $@

bench-frame-auth: $(FRAME_AUTH_BENCH)
	$(FRAME_AUTH_BENCH)

# How the runtime alone scales to 32, 64 and 128 simulated workers (4-byte
# messages, one process each): resources per worker, all-reduce and consensus
# latency, resize times, a power-law fit and what it predicts for 1,024
# (benchmarks/scaling/run.py; ~5-10 min on 2 cores).
SCALING_BENCH := build/bench/runtime_scaling
$(SCALING_BENCH): benchmarks/scaling/runtime_scaling.cc $(build/cpp_OBJS) Makefile
	@mkdir -p $(@D)
	$(CXX) $(CPP_FLAGS) $< $(build/cpp_OBJS) $(CPP_LIBS) -o $@

bench-scaling: $(SCALING_BENCH)
	$(PY) -m benchmarks.scaling

bench-training: install
	$(PY) -m benchmarks.training

bench-strategies: install
	$(PY) -m benchmarks.strategies

# The issue's three adaptive-training experiments in one go: GNSBatchSizePolicy
# against a static small and large batch (benchmarks/adaptive_batch/run.py,
# time-to-accuracy; plot in benchmarks/results/), the monitoring overhead, and
# the adaptive topology under contention (root).
bench-adaptive: install
	$(PY) -m benchmarks.adaptive_batch
	$(PY) -m benchmarks.monitoring_overhead
	$(PY) -m benchmarks.adaptive_topology

# KungFu's Listing 1 end to end: kungfu-run --elastic -np 1 --max-np 4 with GNSResizePolicy beside
# static 1 and static 4 workers (benchmarks/listing_one/run.py; table and plot in benchmarks/results/).
bench-listing-one: install
	$(PY) -m benchmarks.listing_one

bench-monitoring: install
	$(PY) -m benchmarks.monitoring_overhead
	$(PY) -m benchmarks.monitoring_overhead --model digits-mlp --steps 64 --rounds 64

# Static topology vs AdaptiveTopologyPolicy under link contention, two emulated hosts (root).
bench-adaptive-topology: install
	$(PY) -m benchmarks.adaptive_topology

# Training idle time of elastic transitions (shrink, grow with pre-warmed joiners,
# crash) beside checkpoint-restart of the same job, measured in one run
# (benchmarks/elastic/run.py; table in benchmarks/results/elastic.md).
bench-elastic: install
	$(PY) -m benchmarks.elastic

bench-strategy-resize: install
	$(PY) -m benchmarks.strategy_resize

# StrategyPolicy against each of its candidates held static, np=4 on two emulated hosts whose link is
# throttled by tc mid-run (benchmarks/strategy_policy/run.py; root).
bench-strategy-policy: install
	$(PY) -m benchmarks.strategy_policy

bench-auto-probe: install
	$(PY) -m benchmarks.auto_probe --json benchmarks/results/auto_probe.json

bench-step-completion: install
	$(PY) -m benchmarks.step_completion

bench-slot-replicas: install
	$(PY) -m benchmarks.slot_replicas

# Recovery times of an elastic job whose state is in etcd (--config-store):
# 3 real etcd members on loopback, launchers killed, the etcd leader killed,
# a majority lost; and a membership change beside the embedded service's.
bench-config-store: install
	$(PY) -m benchmarks.config_store --repeats 5

# What etcd's TLS and user/password cost a --config-store client (one put, a
# new client's first put), four single-member etcd clusters side by side.
bench-etcd-security: install
	$(PY) -m benchmarks.etcd_security --rounds 9

# Autoscaling on a job whose efficient size is known (a CPU quota over the
# whole job), straggler replacement (one worker in a small quota), utility vs
# cost (benchmarks/autoscaling/run.py; tables and a plot in benchmarks/results/).
bench-autoscaling: install
	$(PY) -m benchmarks.autoscaling

lint: $(DEPS_STAMP) cpp-format
	$(VENV)/bin/ruff check kungfu_tf tests benchmarks models
	$(VENV)/bin/mypy

# Fails, listing each misformatted line, if clang-format would change a C++
# source; `make format` applies what it would change.
cpp-format: | clang-format-tool
	@$(CLANG_FORMAT) --dry-run --Werror $(CPP_FORMAT_SRCS)
	@echo "cpp-format: $(words $(CPP_FORMAT_SRCS)) C++ files formatted as .clang-format says"

format: | clang-format-tool
	$(CLANG_FORMAT) -i $(CPP_FORMAT_SRCS)

.PHONY: clang-format-tool
clang-format-tool:
	@command -v $(CLANG_FORMAT) >/dev/null 2>&1 || { \
		echo "error: $(CLANG_FORMAT) not found: run \`make sysdeps\` (apt-get install clang-format)"; \
		exit 1; }

# The documentation site: docs/conf.py (Sphinx + MyST) and the pages of docs/;
# docs/_ext/generated_pages.py writes the guide pages (README.md's sections),
# the benchmark pages (benchmarks/results/) and the `kungfu-run --help` page
# first. Read afresh (-E) with warnings as errors, as tests/test_docs.py builds it.
docs: install
	$(PY) -m sphinx -E -W --keep-going -q -b html docs build/docs
	@echo "docs: build/docs/index.html"

clean:
	rm -rf build *.egg-info kungfu_tf/*.egg-info $(SO) \
		kungfu_tf/proto/*_pb2.py kungfu_tf/proto/*_pb2_grpc.py kungfu_tf/proto/*_pb2.pyi

distclean: clean
	rm -rf $(VENV)
