# kungfu_tf developer Makefile.
#
#   make install   .venv with requirements.txt at the versions of constraints.txt
#                  + editable install that builds kungfu_tf/libkungfu_tf.so and
#                  kungfu_tf/proto stubs
#   make constraints  re-pin constraints.txt to what .venv holds
#   make test      C++ runtime tests (tests/cpp/test_*.cc) then pytest
#   make sanitize  C++ runtime tests under AddressSanitizer + UBSan
#   make demo      4-worker training demo (models/train.py)
#   make bench     allreduce benchmark: ours, MWMS, Open MPI, raw transport
#   make bench-frame-auth  cost of per-frame HMAC authentication vs memcpy
#   make bench-training    training throughput: ours, MWMS, no-comm ceiling
#   make bench-strategies  strategy builders x models, one host and two (root)
#   make lint      ruff
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

# Runs every program in $(1); fails at the end if any failed.
define run_cpp_tests
@failed=""; for t in $(1); do \
	echo "== $$t"; \
	timeout $(CPP_TEST_TIMEOUT) $$t || failed="$$failed $$t"; \
done; \
if [ -n "$$failed" ]; then echo "FAILED C++ tests:$$failed"; exit 1; fi; \
echo "C++ tests: $(words $(1)) programs passed"
endef

# ---------------------------------------------------------------- targets
.PHONY: install constraints sysdeps test cpp-test sanitize demo bench bench-frame-auth bench-training bench-strategies lint clean distclean

install: sysdeps $(INSTALL_STAMP) $(SO)

# libssl-dev: OpenSSL's libcrypto (headers, libcrypto.a for libkungfu_tf.so,
# libcrypto.so for the C++ tests). Required: the build fails without it.
# Then, best effort only (root + apt-get): iproute2 for the multi-host tests
# (network namespaces, `ip netns`); Open MPI (mpirun, mpicc) for the
# benchmark's MPI_Allreduce anchor and its test.
sysdeps:
	@if [ ! -f /usr/include/openssl/evp.h ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing libssl-dev (OpenSSL's libcrypto, for the handshake)"; \
			( export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
			  apt-get install -y -qq libssl-dev ) || \
			{ echo "error: could not install libssl-dev"; exit 1; }; \
		else \
			echo "error: OpenSSL headers not found: install libssl-dev (apt-get install libssl-dev)"; \
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
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing$$missing"; \
			( export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
			  apt-get install -y -qq $$missing ) || \
			echo "warning: could not install$$missing; multi-host tests or the MPI benchmark may not run"; \
		else \
			echo "warning: not installed:$$missing (needs root and apt-get); multi-host tests or the MPI benchmark may not run"; \
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

test: install cpp-test
	$(PY) -m pytest -x -q -p no:cacheprovider tests

cpp-test: $(CPP_TESTS)
	$(call run_cpp_tests,$(CPP_TESTS))

sanitize: $(SAN_TESTS)
	$(call run_cpp_tests,$(SAN_TESTS))
sanitize: export UBSAN_OPTIONS := halt_on_error=1:print_stacktrace=1

demo: install
	$(VENV)/bin/kungfu-run -np 4 $(PY) models/train.py

bench: install
	$(PY) benchmarks/allreduce.py

# Per-frame authentication cost (frame_auth.h) against memcpy, per MiB.
FRAME_AUTH_BENCH := build/bench/frame_auth_cost
FRAME_AUTH_OBJS := $(addprefix build/cpp/obj/,secret.o hmac.o frame_auth.o)
$(FRAME_AUTH_BENCH): benchmarks/frame_auth_cost.cc $(FRAME_AUTH_OBJS) Makefile
	@mkdir -p $(@D)
	$(CXX) $(CPP_FLAGS) $< $(FRAME_AUTH_OBJS) $(CPP_LIBS) -o $@

bench-frame-auth: $(FRAME_AUTH_BENCH)
	$(FRAME_AUTH_BENCH)

bench-training: install
	$(PY) benchmarks/training.py

bench-strategies: install
	$(PY) benchmarks/strategies.py

lint: $(DEPS_STAMP)
	$(VENV)/bin/ruff check kungfu_tf tests benchmarks models

clean:
	rm -rf build *.egg-info kungfu_tf/*.egg-info $(SO) \
		kungfu_tf/proto/*_pb2.py kungfu_tf/proto/*_pb2_grpc.py kungfu_tf/proto/*_pb2.pyi

distclean: clean
	rm -rf $(VENV)
