# pdde — `make` builds the library, examples and tools; `make test` runs every test; `make demo` trains.
# Optional dependencies are found with pkg-config / the compiler; NO_<DEP>=1 leaves one out.
CC       ?= cc
PREFIX   ?= /usr/local
BUILD    ?= build
OPT      ?= -O3 -march=native -fno-math-errno
CFLAGS   += -std=c11 $(OPT) -g -Wall -Wextra -Werror -fPIC -pthread -I.
LDLIBS   += -lm -ldl -pthread $(LDLIBS_EXTRA)

has_pc = $(shell pkg-config --exists $(1) 2>/dev/null && echo 1)
has_lib = $(shell echo 'int main(void){return 0;}' | $(CC) -include $(1) -x c - -o /dev/null $(2) 2>/dev/null && echo 1)

ifndef NO_OPENBLAS
  ifeq ($(call has_lib,cblas.h,-lopenblas),1)
    DEFS += -DPDDE_HAVE_OPENBLAS
    LDLIBS += -lopenblas
    HAVE_OPENBLAS = 1
  else ifeq ($(call has_lib,openblas/cblas.h,-lopenblas),1)
    DEFS += -DPDDE_HAVE_OPENBLAS -DPDDE_OPENBLAS_SUBDIR
    LDLIBS += -lopenblas
    HAVE_OPENBLAS = 1
  endif
endif
ifndef NO_CLBLAST
  ifeq ($(call has_lib,clblast_c.h,-lclblast),1)
    DEFS += -DPDDE_HAVE_CLBLAST
    LDLIBS += -lclblast
    HAVE_CLBLAST = 1
  endif
endif
ifndef NO_UCX
  ifeq ($(call has_pc,ucx),1)
    DEFS += -DPDDE_HAVE_UCX
    LDLIBS += $(shell pkg-config --libs ucx)
    HAVE_UCX = 1
  endif
endif
ifndef NO_HWLOC
  ifeq ($(call has_pc,hwloc),1)
    DEFS += -DPDDE_HAVE_HWLOC
    LDLIBS += $(shell pkg-config --libs hwloc)
    HAVE_HWLOC = 1
  endif
endif
ifndef NO_CJSON
  ifeq ($(call has_pc,libcjson),1)
    DEFS += -DPDDE_HAVE_CJSON
    CFLAGS += $(shell pkg-config --cflags libcjson)
    LDLIBS += $(shell pkg-config --libs libcjson)
    HAVE_CJSON = 1
  endif
endif
CFLAGS += $(DEFS)

LIB_SRC   := pdde.c $(wildcard backends/*.c backends/*.h backends/*.cu backends/*.cl comm/*.c comm/*.h planner/*.c planner/*.h) pdde.h
TESTS     := $(patsubst tests/%.c,$(BUILD)/%,$(wildcard tests/test_*.c)) $(patsubst tests/%.sh,$(BUILD)/%,$(wildcard tests/test_*.sh))
EXAMPLES  := $(patsubst examples/%.c,$(BUILD)/%,$(wildcard examples/*.c))
TOOLS     := $(patsubst tools/%.c,$(BUILD)/%,$(wildcard tools/pdde-*.c))
ifneq ($(HAVE_UCX),1)  # the launcher and the comm benchmark need comm/, which needs UCX
  TOOLS := $(filter-out $(BUILD)/pdde-run,$(TOOLS))
endif
# tools/bench/mpi_*.c are built with mpicc by the bench targets only (MPI is not a build dependency)
BENCHES   := $(patsubst tools/bench/%.c,$(BUILD)/%,$(filter-out tools/bench/mpi_%.c,$(wildcard tools/bench/*.c)))
ifneq ($(HAVE_UCX),1)
  BENCHES := $(filter-out $(BUILD)/bench_comm,$(BENCHES))
endif

.DEFAULT_GOAL := all

# Device kernels embedded in the library. The generated headers are committed, so a build needs no
# GPU toolchain; these rules regenerate them when the tools are found and the kernel source is newer.
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CLANG_SPIRV ?= $(shell command -v clang-15 2>/dev/null)
LLVM_SPIRV  ?= $(shell command -v llvm-spirv-15 2>/dev/null || command -v llvm-spirv 2>/dev/null)
# SPIR-V is emitted unoptimised (-O0): llvm-spirv-15 rejects the `freeze` instructions that LLVM's optimiser
# makes, and the Level Zero driver optimises when it builds the module anyway.
# PTX for the oldest architecture nvcc 13 targets; the driver JITs it for the device it runs on.
NVCC_PTX_ARCH ?= compute_75

ifneq ($(NVCC),)
backends/cuda_kernels_ptx.h: backends/cuda_kernels.cu
	@mkdir -p $(BUILD)
	$(NVCC) -ptx -arch=$(NVCC_PTX_ARCH) -O3 $< -o $(BUILD)/cuda_kernels.ptx
	@{ echo '/* Generated from backends/cuda_kernels.cu by `make` (nvcc -ptx -arch=$(NVCC_PTX_ARCH)); do not edit.'; \
	  echo ' * The PTX text in pieces of under 4095 characters (the longest string literal C requires). */'; \
	  awk 'BEGIN { n = 0; print "static const char *const pdde_cuda_ptx_parts[] = {" } \
	       { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); l = length($$0) + 1; \
	         if (n > 0 && n + l > 4000) { print "    ,"; n = 0 } \
	         printf "    \"%s\\n\"\n", $$0; n += l } \
	       END { print "    , 0};" }' $(BUILD)/cuda_kernels.ptx; } > $@.tmp && mv $@.tmp $@
endif

ifneq ($(CLANG_SPIRV),)
ifneq ($(LLVM_SPIRV),)
backends/level_zero_kernels_spv.h: backends/level_zero_kernels.cl
	@mkdir -p $(BUILD)
	$(CLANG_SPIRV) -cl-std=CL2.0 -target spir64 -O0 -emit-llvm -c $< -o $(BUILD)/level_zero_kernels.bc
	$(LLVM_SPIRV) $(BUILD)/level_zero_kernels.bc -o $(BUILD)/level_zero_kernels.spv
	@{ echo '/* Generated from backends/level_zero_kernels.cl by `make` (clang -target spir64, llvm-spirv); do not edit. */'; \
	  echo 'static const unsigned char pdde_level_zero_spv[] = {'; \
	  od -An -v -tx1 $(BUILD)/level_zero_kernels.spv | sed -e 's/ *$$//' -e 's/^ *//' -e 's/ /, 0x/g' -e 's/^/    0x/' -e 's/$$/,/'; \
	  echo '};'; } > $@.tmp && mv $@.tmp $@
endif
endif

.PHONY: all deps-report test test-installed test-asan test-fuzz demo bench-gpt bench-comm bench-ops bench-parallel install uninstall clean
all: deps-report $(BUILD)/libpdde.a $(BUILD)/libpdde.so $(EXAMPLES) $(TOOLS) $(BENCHES)

deps-report:
	@printf 'pdde optional dependencies:'; \
	for d in OPENBLAS:$(HAVE_OPENBLAS) CLBLAST:$(HAVE_CLBLAST) UCX:$(HAVE_UCX) HWLOC:$(HAVE_HWLOC) CJSON:$(HAVE_CJSON); do \
	  n=$${d%%:*}; v=$${d#*:}; if [ "$$v" = 1 ]; then printf ' ✓%s' $$n; else printf ' ✗%s' $$n; fi; done; echo

$(BUILD):
	@mkdir -p $(BUILD)

$(BUILD)/pdde.o: $(LIB_SRC) | $(BUILD)
	$(CC) $(CFLAGS) -c pdde.c -o $@

$(BUILD)/libpdde.a: $(BUILD)/pdde.o
	ar rcs $@ $^

$(BUILD)/libpdde.so: $(BUILD)/pdde.o
	$(CC) -shared -Wl,-soname,libpdde.so.$(SOVERSION) -o $@ $^ $(LDLIBS)

$(BUILD)/%: tests/%.c tests/test_util.h $(wildcard examples/*.h) $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

$(BUILD)/%: tests/%.sh | $(BUILD)
	cp $< $@ && chmod +x $@

$(BUILD)/%: examples/%.c $(wildcard examples/*.h) $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

$(BUILD)/%: tools/%.c $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

$(BUILD)/%: tools/bench/%.c $(wildcard tools/bench/*.h) $(wildcard examples/*.h) $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

# The portable build (no OpenBLAS: pdde's own GEMM; no UCX: the library without comm/) runs the numerical tests too.
PORTABLE_TESTS := $(BUILD)/portable/test_gpt_golden $(BUILD)/portable/test_grad
# make test first installs what is missing (as make demo does), then reads this Makefile again so
# that the optional dependencies it just installed are found.
test:
	@bash tools/install-deps.sh
	@$(MAKE) --no-print-directory test-installed

# ...and a 10 s smoke run of the graph fuzzer's seeded driver (test-fuzz is the long one).
test-installed: all $(TESTS) $(BUILD)/fuzz_graph
	@$(MAKE) -s BUILD=$(BUILD)/portable NO_OPENBLAS=1 NO_UCX=1 $(PORTABLE_TESTS) >/dev/null
	@bash tests/run_tests.sh $(BUILD) $(TESTS) $(PORTABLE_TESTS) $(BUILD)/fuzz_graph

# The same tests under AddressSanitizer and UndefinedBehaviorSanitizer, in their own build folder.
test-asan:
	$(MAKE) BUILD=build/asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDLIBS_EXTRA=-fsanitize=address,undefined test-installed

# The graph-building fuzzer (tests/fuzz_graph.c) for FUZZ_SECONDS (600) under AddressSanitizer and
# UBSan, on the portable library (pdde's own kernels, all instrumented): clang's libFuzzer where
# $(FUZZ_CC) has it (corpus and crashing inputs in build/fuzz), else the seeded random driver.
FUZZ_SECONDS ?= 600
FUZZ_CC ?= $(or $(shell command -v clang-14 2>/dev/null),$(shell command -v clang 2>/dev/null),$(CC))
FUZZ_FLAGS := -std=c11 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -pthread -I.
test-fuzz:
	@mkdir -p build/fuzz/corpus
	@if echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { (void)d; (void)n; return 0; }' | \
	    $(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then \
	  set -ex; \
	  $(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c pdde.c -o build/fuzz/pdde.o; \
	  $(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -DFUZZ_LIBFUZZER tests/fuzz_graph.c build/fuzz/pdde.o -o build/fuzz/fuzz_graph -lm -ldl; \
	  build/fuzz/fuzz_graph -max_total_time=$(FUZZ_SECONDS) -max_len=512 -rss_limit_mb=2048 -timeout=60 -print_final_stats=1 \
	    -artifact_prefix=build/fuzz/ build/fuzz/corpus; \
	else \
	  set -ex; \
	  $(FUZZ_CC) $(FUZZ_FLAGS) tests/fuzz_graph.c pdde.c -o build/fuzz/fuzz_graph -lm -ldl; \
	  build/fuzz/fuzz_graph $(FUZZ_SECONDS) $$(date +%s); \
	fi

demo:
	@bash tools/demo.sh

bench-gpt: all
	@bash tools/bench/bench_gpt.sh $(BUILD)

# GEMM and row kernels through pdde (OpenCL, CPU) against CLBlast and OpenBLAS called directly.
bench-ops: all
	@$(BUILD)/bench_ops $(BENCH_OPS_ARGS)

# pdde allreduce against OpenMPI's (needs mpicc/mpirun); BENCH_COMM_MAX limits the largest message.
bench-comm: all
	mpicc -O3 -Itools/bench tools/bench/mpi_allreduce.c -o $(BUILD)/mpi_allreduce
	@$(BUILD)/bench_comm $(BUILD) $(or $(BENCH_COMM_MAX),268435456)

# GPT-small under each parallel strategy on 2 and 4 ranks against one process; BENCH_PARALLEL_STEPS timed steps.
bench-parallel: all
	@$(BUILD)/bench_parallel $(or $(BENCH_PARALLEL_STEPS),15)

# Installed like a Debian library: versioned .so with a SONAME, DESTDIR for staging, and a pdde.pc whose
# Cflags carry the feature macros this build was made with (examples test PDDE_HAVE_UCX, say).
VERSION   := 0.1.0
SOVERSION := 0
LIBDIR     = $(DESTDIR)$(PREFIX)/lib
install: all
	install -d $(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(BUILD)/libpdde.a $(LIBDIR)/
	install -m 755 $(BUILD)/libpdde.so $(LIBDIR)/libpdde.so.$(VERSION)
	ln -sf libpdde.so.$(VERSION) $(LIBDIR)/libpdde.so.$(SOVERSION)
	ln -sf libpdde.so.$(SOVERSION) $(LIBDIR)/libpdde.so
	install -m 644 pdde.h $(DESTDIR)$(PREFIX)/include/
	for t in $(TOOLS); do install -m 755 $$t $(DESTDIR)$(PREFIX)/bin/; done
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: pdde\nDescription: adaptive distributed training engine\nVersion: %s\nLibs: -L$${libdir} -lpdde\nLibs.private: %s\nCflags: -I$${includedir} %s\n' \
	  '$(PREFIX)' '$(VERSION)' '$(strip $(LDLIBS))' '$(strip $(DEFS))' > $(LIBDIR)/pkgconfig/pdde.pc

uninstall:
	rm -f $(LIBDIR)/libpdde.a $(LIBDIR)/libpdde.so $(LIBDIR)/libpdde.so.$(SOVERSION) $(LIBDIR)/libpdde.so.$(VERSION) \
	  $(LIBDIR)/pkgconfig/pdde.pc $(DESTDIR)$(PREFIX)/include/pdde.h $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(notdir $(TOOLS)))

clean:
	rm -rf $(BUILD)
