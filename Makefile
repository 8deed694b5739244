# pdde — `make` builds the library, examples and tools; `make test` runs every test; `make demo` trains.
# Optional dependencies are found with pkg-config / the compiler; NO_<DEP>=1 leaves one out.
CC       ?= cc
PREFIX   ?= /usr/local
BUILD    ?= build
# Portable by default (an installed library runs on any x86-64); NATIVE=1 compiles for this machine's
# CPU only. No trapping math: the kernels' NaN-aware clamps and selects then vectorise without AVX-512 masks.
OPT      ?= -O3 -fno-math-errno -fno-trapping-math $(if $(NATIVE),-march=native -DPDDE_NATIVE_BUILD)
WERROR   ?= -Werror # (WERROR= builds where a newer compiler warns of more: tools/gpu-check.sh)
CFLAGS   += -std=c11 $(OPT) -g -Wall -Wextra $(WERROR) -fPIC -pthread -I.
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
# oneDNN (Debian: libdnnl-dev) for the CPU matmul, f32 and bf16; OpenBLAS stays the fallback. Its
# OpenMP runtime is linked too: pdde runs oneDNN single-threaded on each of its own pool threads.
ifndef NO_DNNL
  ifeq ($(call has_lib,dnnl.h,-ldnnl),1)
    DEFS += -DPDDE_HAVE_DNNL
    LDLIBS += -ldnnl -lgomp
    HAVE_DNNL = 1
  endif
endif
ifndef NO_CLBLAST
  ifeq ($(call has_lib,clblast_c.h,-lclblast),1)
    DEFS += -DPDDE_HAVE_CLBLAST
    LDLIBS += -lclblast
    HAVE_CLBLAST = 1
  endif
endif
# UCX: UCX_DIR names one outside the system's paths (UCX_DIR/include, UCX_DIR/lib), else pkg-config's,
# else the one tools/gpu-carry.sh put in .gpu-carry/ucx (a machine that cannot install it); NO_UCX=1 wins.
ifndef NO_UCX
  ifndef UCX_DIR
    ifneq ($(call has_pc,ucx),1)
      UCX_DIR := $(if $(wildcard .gpu-carry/ucx/include/ucp/api/ucp.h),$(CURDIR)/.gpu-carry/ucx)
    endif
  endif
  ifneq ($(UCX_DIR),)
    DEFS += -DPDDE_HAVE_UCX
    CFLAGS += -I$(UCX_DIR)/include
    LDLIBS += -L$(UCX_DIR)/lib -Wl,-rpath,$(UCX_DIR)/lib -lucp -luct -lucs -lucm
    HAVE_UCX = 1
  else ifeq ($(call has_pc,ucx),1)
    DEFS += -DPDDE_HAVE_UCX
    LDLIBS += $(shell pkg-config --libs ucx)
    HAVE_UCX = 1
  endif
endif
# An optional dependency pkg-config finds (NAME, its pkg-config module): -DPDDE_HAVE_NAME, its flags and
# HAVE_NAME = 1; NO_NAME=1 leaves it out.
define optional_pc
ifndef NO_$(1)
  ifeq ($$(call has_pc,$(2)),1)
    DEFS += -DPDDE_HAVE_$(1)
    CFLAGS += $$(shell pkg-config --cflags $(2))
    LDLIBS += $$(shell pkg-config --libs $(2))
    HAVE_$(1) = 1
  endif
endif
endef
$(eval $(call optional_pc,HWLOC,hwloc))
$(eval $(call optional_pc,CJSON,libcjson))
# libcurl (Debian: libcurl4-openssl-dev) for etcd as the store (comm/etcd.c: elastic jobs' membership)
$(eval $(call optional_pc,CURL,libcurl))
CFLAGS += $(DEFS)

LIB_SRC   := pdde.c pdde_extension.h $(wildcard core/*.c backends/*.c backends/*.h backends/*.cu backends/*.cl comm/*.c comm/*.h planner/*.c planner/*.h) pdde.h
TESTS     := $(patsubst tests/%.c,$(BUILD)/%,$(wildcard tests/test_*.c)) $(patsubst tests/%.sh,$(BUILD)/%,$(wildcard tests/test_*.sh))
EXAMPLES  := $(filter-out $(BUILD)/toy_backend,$(patsubst examples/%.c,$(BUILD)/%,$(wildcard examples/*.c)))
# The toy backend plugin (examples/toy_backend.c), and the same built with another vtable version,
# which the loader must refuse (test_plugin).
PLUGINS   := $(BUILD)/libpdde_toy.so $(BUILD)/libpdde_toy_v99.so $(BUILD)/libpdde_toy_misnamed.so $(BUILD)/libpdde_toy_badmul.so \
             $(BUILD)/libpdde_toy2.so $(BUILD)/libpdde_toy_wrongmul.so $(BUILD)/libpdde_toy_claims_gelu.so $(BUILD)/libpdde_toy_declines.so \
             $(BUILD)/libpdde_toy_silent.so $(BUILD)/libpdde_toy_nosync.so $(BUILD)/libpdde_toy_mmfails.so \
             $(BUILD)/libpdde_toy_noscale.so $(BUILD)/libpdde_toy_direct.so $(BUILD)/libpdde_toy_nomem.so
TOOLS     := $(patsubst tools/%.c,$(BUILD)/%,$(wildcard tools/pdde-*.c))
ifneq ($(HAVE_UCX),1)  # the launcher and the comm benchmark need comm/, which needs UCX
  TOOLS := $(filter-out $(BUILD)/pdde-run,$(TOOLS))
endif
# tools/bench/mpi_*.c are built with mpicc by the bench targets only (MPI is not a build dependency)
BENCHES   := $(patsubst tools/bench/%.c,$(BUILD)/%,$(filter-out tools/bench/mpi_%.c tools/bench/peer_%.c,$(wildcard tools/bench/*.c)))
ifneq ($(HAVE_UCX),1)  # (dlrm and bench_dlrm run their table in-process there: one process, no servers)
  BENCHES := $(filter-out $(BUILD)/bench_comm $(BUILD)/bench_ps_remote,$(BENCHES))
  TESTS := $(filter-out $(BUILD)/test_ps $(BUILD)/test_ps_remote,$(TESTS))
endif

.DEFAULT_GOAL := all

# Device kernels embedded in the library. The generated headers are committed, so a build needs no
# GPU toolchain; these rules regenerate them when the tools are found and the kernel source is newer.
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CLANG_SPIRV ?= $(shell command -v clang-15 2>/dev/null)
LLVM_SPIRV  ?= $(shell command -v llvm-spirv-15 2>/dev/null || command -v llvm-spirv 2>/dev/null)
# SPIR-V is emitted unoptimised (-O0): llvm-spirv-15 rejects the `freeze` instructions that LLVM's optimiser
# makes, and the Level Zero driver optimises when it builds the module anyway.
# PTX for the oldest architecture nvcc 13 targets; the driver JITs it for the device it runs on. A second
# PTX for compute capability 8.0 carries the tensor-core kernels (bf16 mma); the backend loads it on
# devices of 8.0 and later.
NVCC_PTX_ARCH ?= compute_75
NVCC_PTX_ARCH_MMA ?= compute_80

# A text file as a C array of string pieces (NULL-terminated), each under 4095 characters. ("&&": the
# backslash doubled, in every awk; a replacement of "\\\\" writes one backslash in mawk.)
text_to_c = awk 'BEGIN { n = 0; print "static const char *const $(1)[] = {" } \
	       { gsub(/\\/, "&&"); gsub(/"/, "\\\""); l = length($$0) + 1; \
	         if (n > 0 && n + l > 4000) { print "    ,"; n = 0 } \
	         printf "    \"%s\\n\"\n", $$0; n += l } \
	       END { print "    , 0};" }'

# The two generated headers that are tracked (the tools that make them are not everywhere) carry a stamp of
# what they are made from: make regenerates one only when its stamp differs (a fresh checkout's timestamps
# say nothing), and `make check-generated` (run by make test) says which one is stale without the tools.
CUDA_SOURCES = backends/cuda_kernels.cu backends/cuda_flash_f32.cuh backends/flash_f32_tiles.h backends/cuda_convert.cuh \
	       backends/cuda_gemm_tile.cuh backends/cuda_flash.cuh backends/cuda_att_layout.cuh backends/cuda_flash2.cuh backends/cuda_moe.cuh \
	       backends/cuda_mem.cuh backends/cuda_embedding.cuh backends/cuda_norm.cuh backends/cuda_rope.cuh
ptx_stamp = sources cksum $$(cat $(CUDA_SOURCES) | cksum | tr ' ' .), $(NVCC_PTX_ARCH) and $(NVCC_PTX_ARCH_MMA)
spv_stamp = sources cksum $$(cksum <backends/gpu_kernels.cl | tr ' ' .)
# the header's stamp line is the current one: touch it and do nothing (a shell condition)
stamp_current = grep -qxF " * $(1)" $@ 2>/dev/null && touch $@

ifneq ($(NVCC),)
backends/cuda_kernels_ptx.h: $(CUDA_SOURCES)
	@stamp="$(ptx_stamp)"; $(call stamp_current,$$stamp) && exit 0; mkdir -p $(BUILD); \
	echo "$(NVCC) -ptx -arch=$(NVCC_PTX_ARCH) (and $(NVCC_PTX_ARCH_MMA)) -O3 $< -> $@"; \
	$(NVCC) -ptx -arch=$(NVCC_PTX_ARCH) -O3 $< -o $(BUILD)/cuda_kernels.ptx && \
	$(NVCC) -ptx -arch=$(NVCC_PTX_ARCH_MMA) -O3 $< -o $(BUILD)/cuda_kernels_mma.ptx && \
	{ echo '/* Generated from backends/cuda_kernels.cu by `make` (nvcc -ptx -arch=$(NVCC_PTX_ARCH), and -arch=$(NVCC_PTX_ARCH_MMA)'; \
	  echo ' * for pdde_cuda_ptx_mma_parts); do not edit. The PTX texts in pieces of under 4095 characters (the longest'; \
	  echo ' * string literal C requires). Made from:'; \
	  echo " * $$stamp"; \
	  echo ' */'; \
	  $(call text_to_c,pdde_cuda_ptx_parts) $(BUILD)/cuda_kernels.ptx; \
	  $(call text_to_c,pdde_cuda_ptx_mma_parts) $(BUILD)/cuda_kernels_mma.ptx; } > $@.tmp && mv $@.tmp $@
endif

# The OpenCL backend builds backends/gpu_kernels.cl at run time: its text is embedded (needs only awk).
backends/gpu_kernels_cl.h: backends/gpu_kernels.cl
	@{ echo '/* Generated from backends/gpu_kernels.cl by `make`; do not edit.'; \
	  echo ' * The OpenCL C text in pieces of under 4095 characters (the longest string literal C requires). */'; \
	  $(call text_to_c,pdde_gpu_kernels_cl_parts) $<; } > $@.tmp && mv $@.tmp $@

ifneq ($(CLANG_SPIRV),)
ifneq ($(LLVM_SPIRV),)
backends/gpu_kernels_spv.h: backends/gpu_kernels.cl
	@stamp="$(spv_stamp)"; $(call stamp_current,$$stamp) && exit 0; mkdir -p $(BUILD); \
	echo "$(CLANG_SPIRV) -target spir64, $(LLVM_SPIRV): $< -> $@"; \
	$(CLANG_SPIRV) -cl-std=CL2.0 -target spir64 -O0 -emit-llvm -c $< -o $(BUILD)/gpu_kernels.bc && \
	$(LLVM_SPIRV) $(BUILD)/gpu_kernels.bc -o $(BUILD)/gpu_kernels.spv && \
	{ echo '/* Generated from backends/gpu_kernels.cl by `make` (clang -target spir64, llvm-spirv); do not edit. Made from:'; \
	  echo " * $$stamp"; \
	  echo ' */'; \
	  echo 'static const unsigned char pdde_gpu_kernels_spv[] = {'; \
	  od -An -v -tx1 $(BUILD)/gpu_kernels.spv | sed -e 's/ *$$//' -e 's/^ *//' -e 's/ /, 0x/g' -e 's/^/    0x/' -e 's/$$/,/'; \
	  echo '};'; } > $@.tmp && mv $@.tmp $@
endif
endif

.PHONY: all deps-report check-parts check-generated test test-installed test-asan test-fuzz test-mutants demo bench-gpt bench-llmc bench-lora bench-tokenize bench-comm bench-ops bench-dispatch bench-ocl-gemm bench-parallel bench-dlrm bench-ps-remote bench-costmodel bench-lower bench-hetero bench-planner bench-planner-moe bench-attention bench-moe install uninstall clean bench-checkpoint bench-elastic bench-elastic-sim
all: deps-report $(BUILD)/libpdde.a $(BUILD)/libpdde.so $(EXAMPLES) $(TOOLS) $(BENCHES) $(PLUGINS)

deps-report:
	@printf 'pdde optional dependencies:'; \
	for d in DNNL:$(HAVE_DNNL) OPENBLAS:$(HAVE_OPENBLAS) CLBLAST:$(HAVE_CLBLAST) UCX:$(HAVE_UCX) HWLOC:$(HAVE_HWLOC) CJSON:$(HAVE_CJSON) CURL:$(HAVE_CURL); do \
	  n=$${d%%:*}; v=$${d#*:}; if [ "$$v" = 1 ]; then printf ' ✓%s' $$n; else printf ' ✗%s' $$n; fi; done; echo

$(BUILD):
	@mkdir -p $(BUILD)

# The compiler and flags of this build, rewritten only when they change (a dependency installed since the
# last build, NO_<DEP>=1, another OPT): the library is then compiled again with them, never linked stale.
$(BUILD)/build-flags: FORCE | $(BUILD)
	@echo '$(CC) $(strip $(CFLAGS))' | cmp -s - $@ || echo '$(CC) $(strip $(CFLAGS))' >$@
FORCE:

$(BUILD)/pdde.o: $(LIB_SRC) $(BUILD)/build-flags | $(BUILD)
	$(CC) $(CFLAGS) -c pdde.c -o $@

$(BUILD)/libpdde.a: $(BUILD)/pdde.o
	ar rcs $@ $^

$(BUILD)/libpdde.so: $(BUILD)/pdde.o
	$(CC) -shared -Wl,-soname,libpdde.so.$(SOVERSION) -o $@ $^ $(LDLIBS)

$(BUILD)/%: tests/%.c $(wildcard tests/*.h) $(wildcard examples/*.h) $(wildcard tools/*.h) $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

$(BUILD)/%: tests/%.sh | $(BUILD)
	cp $< $@ && chmod +x $@

# A plugin links nothing of pdde's: what it calls comes through the host table its entry point gets.
$(BUILD)/libpdde_toy.so: examples/toy_backend.c pdde.h | $(BUILD)
	$(CC) $(CFLAGS) -shared $< -o $@
$(BUILD)/libpdde_toy_v99.so: examples/toy_backend.c pdde.h | $(BUILD)
	$(CC) $(CFLAGS) -DTOY_API_VERSION=99 -shared $< -o $@
# the toy as a second family, "toy2" (test_plugin: device indices that differ between contexts); the
# conformance suite's wrong plugins (test_plugin_ops): devices that report another backend than the
# plugin's name, and a mul off by 1e-4
$(BUILD)/libpdde_toy2.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/"toy"/"toy2"/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@
$(BUILD)/libpdde_toy_misnamed.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/strcpy(out->backend, "toy")/strcpy(out->backend, "toyaccel")/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@
$(BUILD)/libpdde_toy_badmul.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/y\[i\] = a\[i\] \* b\[i\];/y[i] = a[i] * b[i] * 1.0001f;/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@
# the ways a bring-up breaks (test_plugin, test_plugin_ops, test_bench_plugin): a mul plainly wrong; gelu claimed by
# supports_op but not in compute; an entry that declines with a reason, and one that gives none; the required
# stream_sync left NULL; a matmul whose every launch fails
$(BUILD)/libpdde_toy_wrongmul.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/y\[i\] = a\[i\] \* b\[i\];/y[i] = a[i] * b[i] + (i == 3 ? 0.5f : 0.0f);/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@
$(BUILD)/libpdde_toy_claims_gelu.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/^    case PDDE_OP_RESHAPE:$$/    case PDDE_OP_GELU: case PDDE_OP_RESHAPE:/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@
$(BUILD)/libpdde_toy_declines.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/^    toy_host = host;$$/    return host->error(NULL, PDDE_ERR_UNAVAILABLE, "toy: no toy card found (vendor code -3)"), NULL;/' $< | \
	    $(CC) $(CFLAGS) -shared -x c - -o $@
$(BUILD)/libpdde_toy_silent.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/^    toy_host = host;$$/    return NULL;/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@
$(BUILD)/libpdde_toy_nosync.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/^    .stream_sync = toy_stream_sync,$$//' $< | $(CC) $(CFLAGS) -Wno-unused-function -shared -x c - -o $@
$(BUILD)/libpdde_toy_mmfails.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/^    int64_t n = f->host->numel(t);$$/&\n    if (t->op == PDDE_OP_MATMUL) return f->host->error(f->ctx, PDDE_ERR_BACKEND, "toy: matmul launch failed: vendor code -9");/' $< | \
	    $(CC) $(CFLAGS) -shared -x c - -o $@

# a device without scale (test_bench_plugin: its host <-> device link is measured through an op it runs)
$(BUILD)/libpdde_toy_noscale.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/^    case PDDE_OP_SCALE: case PDDE_OP_RELU:$$/    case PDDE_OP_RELU:/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@
# a device that reports no memory (pdde-bench refuses it before measuring)
$(BUILD)/libpdde_toy_nomem.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/out->memory_total = (uint64_t)1 << 30;/out->memory_total = 0;/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@

# a plugin that calls pdde_op_name itself instead of host->op_name (test_plugin: refused in a static program, saying why)
$(BUILD)/libpdde_toy_direct.so: examples/toy_backend.c pdde.h | $(BUILD)
	sed 's/f->host->op_name(t->op)/pdde_op_name(t->op)/' $< | $(CC) $(CFLAGS) -shared -x c - -o $@

# (the tests that load them build them: test_plugin, and the conformance run through --plugin)
$(BUILD)/test_plugin $(BUILD)/test_plugin_ops: $(PLUGINS)
$(BUILD)/test_plugin_ops: $(BUILD)/test_backend_ops $(BUILD)/gpt
# (test_api_null compiles the calls tests/api_null_sweep.py writes as the C tests are built: this build's
# compiler and flags, and the libraries after libpdde.a, in a file beside it)
$(BUILD)/test_api_null: tests/test_api_null.sh tests/api_null_sweep.py pdde.h $(BUILD)/libpdde.a | $(BUILD)
	cp $< $@ && chmod +x $@
	printf '%s\n' '$(CC) $(strip $(CFLAGS))' '$(strip $(LDLIBS))' >$@.flags
# (test_cxx_header links a C++ program against this build: the libraries after libpdde.a, beside it)
$(BUILD)/test_cxx_header: tests/test_cxx_header.sh pdde.h pdde_extension.h $(BUILD)/libpdde.a | $(BUILD)
	cp $< $@ && chmod +x $@
	printf '%s\n' '$(CC) $(strip $(CFLAGS))' '$(strip $(LDLIBS))' >$@.flags
# (test_examples checks that make built every example and runs mlp_dp under pdde-run)
$(BUILD)/test_examples: $(EXAMPLES) $(PLUGINS) $(TOOLS)
# (test_rank_devices runs gpt and dlrm, under pdde-run where comm is built)
$(BUILD)/test_rank_devices: $(BUILD)/gpt $(BUILD)/dlrm $(if $(filter 1,$(HAVE_UCX)),$(BUILD)/pdde-run)
# (test_zero3_run trains gpt under pdde-run and compares checkpoints with pdde-ckpt)
$(BUILD)/test_zero3_run: $(BUILD)/gpt $(BUILD)/pdde-ckpt $(if $(filter 1,$(HAVE_UCX)),$(BUILD)/pdde-run)
$(BUILD)/test_zero3_device: $(BUILD)/gpt $(BUILD)/pdde-ckpt $(BUILD)/pdde-info $(if $(filter 1,$(HAVE_UCX)),$(BUILD)/pdde-run)
# (test_costmodel_gpu runs tools/bench/costmodel_gpu.sh on the OpenCL device)
$(BUILD)/test_costmodel_gpu: $(BUILD)/pdde-bench $(BUILD)/bench_cuda
$(BUILD)/test_bench_plugin: $(BUILD)/pdde-bench $(BUILD)/pdde-plan $(PLUGINS)
# (test_pdde_bench runs pdde-bench --check and --quick)
$(BUILD)/test_pdde_bench: $(BUILD)/pdde-bench
# (these run gpt, examples/elastic or pdde-run, built from the same library as the test: a test of a
# library change must not run the binaries of an older one)
RUN_TOOL := $(if $(filter 1,$(HAVE_UCX)),$(BUILD)/pdde-run)
$(BUILD)/test_elastic: $(BUILD)/gpt $(BUILD)/elastic $(RUN_TOOL)
$(BUILD)/test_elastic_ft $(BUILD)/test_elastic_reshard $(BUILD)/test_elastic_netns $(BUILD)/test_etcd: $(BUILD)/gpt $(RUN_TOOL)
$(BUILD)/test_comm_fail $(BUILD)/test_launcher $(BUILD)/test_comm_netns: $(RUN_TOOL)
# (the checkpoint tests compare checkpoints with pdde-ckpt)
$(BUILD)/test_checkpoint_shard $(BUILD)/test_pdde_ckpt: $(BUILD)/pdde-ckpt

$(BUILD)/%: examples/%.c $(wildcard examples/*.h) $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

$(BUILD)/%: tools/%.c $(wildcard examples/*.h) $(wildcard tools/*.h) $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

$(BUILD)/%: tools/bench/%.c $(wildcard tools/bench/*.h) $(wildcard examples/*.h) $(BUILD)/libpdde.a
	$(CC) $(CFLAGS) $< -o $@ $(BUILD)/libpdde.a $(LDLIBS)

# Each part compiles on its own from its own includes: the private headers and the layers below it
# (PDDE_PRIVATE empty: what the amalgamation shares as static is external here), and the library
# exports no symbol without the pdde_ prefix (a program that vendors pdde cannot clash with it; names
# starting with __ are the compiler's, e.g. the sanitizers' __odr_asan.*).
# backends/cpu_onednn.c is a section of cpu.c (its oneDNN matmul, on cpu.c's thread pool and GEMM
# job) and is checked with it. A comm/ part includes the comm/ parts below it, whose static helpers
# it may leave unused: those are not warned about here (the library build warns about them).
PARTS := backends/base.c backends/env_values.c backends/cpu.c backends/opencl.c backends/cuda.c backends/level_zero.c backends/registry.c \
         $(wildcard planner/*.c)
ifeq ($(HAVE_UCX),1)
  COMM_PARTS := $(wildcard comm/*.c)
endif
# The tracked generated headers made from today's sources (their stamps; the tools that make them are not needed)
check-generated:
	@for h in "backends/cuda_kernels_ptx.h:$(ptx_stamp)" "backends/gpu_kernels_spv.h:$(spv_stamp)"; do \
	  f=$${h%%:*}; want=$${h#*:}; grep -qxF " * $$want" $$f || { echo "check-generated: $$f is not made from today's sources" \
	  "(want \"$$want\", it has \"$$(sed -n 's/^ \* sources cksum/sources cksum/p' $$f)\"): run make where nvcc, clang-15 and llvm-spirv are"; exit 1; }; \
	done; echo "check-generated: backends/cuda_kernels_ptx.h and backends/gpu_kernels_spv.h are made from today's sources"

check-parts: $(BUILD)/pdde.o
	@for f in $(PARTS); do $(CC) $(CFLAGS) -DPDDE_PRIVATE= -Wpedantic -fsyntax-only $$f || { echo "check-parts: $$f does not compile alone"; exit 1; }; done
	@for f in $(COMM_PARTS); do $(CC) $(CFLAGS) -DPDDE_PRIVATE= -Wpedantic -Wno-unused-function -fsyntax-only $$f || { echo "check-parts: $$f does not compile alone"; exit 1; }; done
	@leaks=$$(nm -g --defined-only $(BUILD)/pdde.o | awk '$$3 !~ /^pdde_/ && $$3 !~ /^__/ {print $$3}'); \
	  if [ -n "$$leaks" ]; then echo "check-parts: global symbols without the pdde_ prefix:" $$leaks; exit 1; fi
	@echo "check-parts: $(words $(PARTS) $(COMM_PARTS)) parts compile alone; every global symbol has the pdde_ prefix"

# The fallback GEMMs run the numerical tests too: the OpenBLAS build (no oneDNN) and the portable build
# (neither library: pdde's own GEMM; no UCX either: the library without comm/; no cJSON: cluster files
# read by pdde's own JSON reader).
OPENBLAS_TESTS := $(addprefix $(BUILD)/openblas/,test_matmul test_backend_ops test_gpt_golden test_amp)
PORTABLE_TESTS := $(addprefix $(BUILD)/portable/,test_matmul test_backend_ops test_gpt_golden test_grad test_amp test_cluster)
# What tools/gpu-check.sh builds, compiled (not run) there too: a GPU node may have none of these libraries.
GPU_CHECK_BUILDS := $(addprefix $(BUILD)/portable/,test_cuda test_gpu_attention bench_cuda gpt pdde-bench test_dp test_casts test_direct_grads test_session_threads \
                    test_moe_device test_nccl test_device_buckets test_embedding_back bench_embedding_back)
# make test first installs what is missing (as make demo does), then reads this Makefile again so
# that the optional dependencies it just installed are found.
test:
	@bash tools/install-deps.sh
	@$(MAKE) --no-print-directory test-installed

# TEST_FIRST="test_x ..." runs those first (the mutation suite: the tests likeliest to fail)
FIRST_TESTS := $(filter $(addprefix $(BUILD)/,$(TEST_FIRST)),$(TESTS))
# The last tests are 10 s smoke runs of the fuzzers' seeded drivers (test-fuzz is the long run).
test-installed: all $(TESTS) check-parts check-generated $(BUILD)/fuzz_graph $(BUILD)/fuzz_parse
	@$(MAKE) -s BUILD=$(BUILD)/openblas NO_DNNL=1 NO_UCX=1 $(OPENBLAS_TESTS) >/dev/null
	@$(MAKE) -s BUILD=$(BUILD)/portable NO_DNNL=1 NO_OPENBLAS=1 NO_UCX=1 NO_CJSON=1 $(PORTABLE_TESTS) $(GPU_CHECK_BUILDS) >/dev/null
	@bash tests/run_tests.sh $(BUILD) $(FIRST_TESTS) $(filter-out $(FIRST_TESTS),$(TESTS)) $(OPENBLAS_TESTS) $(PORTABLE_TESTS) \
	  $(BUILD)/fuzz_graph $(BUILD)/fuzz_parse

# Planted bugs (tests/mutants/*.mut), each applied to a scratch copy: `make test` must fail for each.
# Not part of `make test` (it builds and tests once per mutant). MUTANTS="name ..." picks some.
test-mutants:
	@bash tests/mutants/run.sh

# The same tests under AddressSanitizer and UndefinedBehaviorSanitizer, in their own build folder.
# Sanitized binaries run 2-5x slower: each test gets 15 minutes, and test_install links its
# pkg-config builds with the sanitizers too (an instrumented libpdde.so needs them in the program).
test-asan:
	PDDE_TEST_TIMEOUT=900 PDDE_TEST_SANITIZE="-fsanitize=address,undefined" $(MAKE) BUILD=build/asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDLIBS_EXTRA=-fsanitize=address,undefined test-installed

# The tests whose threads share a parameter-server table (test_dlrm_pipe), a context (test_session_threads: two
# sessions trained at once; test_core: the log) or client and server (test_ps_remote) under ThreadSanitizer, on the
# portable library (no ifunc kernels: their resolvers run before TSan starts).
TSAN_TESTS := test_dlrm_pipe test_session_threads test_core
test-tsan:
	@mkdir -p $(BUILD)/tsan
	$(CC) -std=c11 -O1 -g -fsanitize=thread -DPDDE_NO_MULTIVERSION -pthread -I. -c pdde.c -o $(BUILD)/tsan/pdde.o
	set -e; for t in $(TSAN_TESTS); do \
	  $(CC) -std=c11 -O1 -g -fsanitize=thread -DPDDE_NO_MULTIVERSION -pthread -I. tests/$$t.c $(BUILD)/tsan/pdde.o -o $(BUILD)/tsan/$$t -lm -ldl; \
	  TSAN_OPTIONS=halt_on_error=1 $(BUILD)/tsan/$$t; \
	done
ifeq ($(HAVE_UCX),1)
# and a worker's threads on one client of a remote server (the store in a process of its own: TSan cannot
# follow a fork of a process with threads; UCX's memory hooks off: they clash with TSan's)
	$(CC) -std=c11 -O1 -g -fsanitize=thread -DPDDE_NO_MULTIVERSION -DPDDE_HAVE_UCX $(if $(UCX_DIR),-I$(UCX_DIR)/include) -pthread -I. \
	  tests/test_ps_remote.c pdde.c -o $(BUILD)/tsan/test_ps_remote -lm -ldl $(filter -L% -Wl% -luc%,$(LDLIBS))
	PDDE_TEST_STORE_PROCESS=1 PDDE_TEST_SLOW=1 UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none TSAN_OPTIONS=halt_on_error=1 \
	  $(BUILD)/tsan/test_ps_remote
endif

# The fuzzers for FUZZ_SECONDS (600) each under AddressSanitizer and UBSan, on the portable library
# (pdde's own kernels, all instrumented): tests/fuzz_graph.c builds graphs, tests/fuzz_parse.c feeds the
# readers of plan text, cluster files, checkpoints, table and token files and peers' snapshots. clang's
# libFuzzer where $(FUZZ_CC) has it (corpora and crashing inputs in build/fuzz), else the seeded random drivers.
FUZZ_SECONDS ?= 600
FUZZ_CC ?= $(or $(shell command -v clang-14 2>/dev/null),$(shell command -v clang 2>/dev/null),$(CC))
FUZZ_FLAGS := -std=c11 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -pthread -I.
test-fuzz:
	@mkdir -p build/fuzz/corpus build/fuzz/corpus_parse
	@if echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { (void)d; (void)n; return 0; }' | \
	    $(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then \
	  set -ex; \
	  $(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c pdde.c -o build/fuzz/pdde.o; \
	  for t in graph:corpus:512 parse:corpus_parse:65536; do \
	    name=$${t%%:*}; rest=$${t#*:}; \
	    $(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -DFUZZ_LIBFUZZER tests/fuzz_$$name.c build/fuzz/pdde.o -o build/fuzz/fuzz_$$name -lm -ldl; \
	    build/fuzz/fuzz_$$name -max_total_time=$(FUZZ_SECONDS) -max_len=$${rest#*:} -rss_limit_mb=2048 -timeout=60 -print_final_stats=1 \
	      -artifact_prefix=build/fuzz/ build/fuzz/$${rest%%:*}; \
	  done; \
	else \
	  set -ex; \
	  for name in graph parse; do \
	    $(FUZZ_CC) $(FUZZ_FLAGS) tests/fuzz_$$name.c pdde.c -o build/fuzz/fuzz_$$name -lm -ldl; \
	    build/fuzz/fuzz_$$name $(FUZZ_SECONDS) $$(date +%s); \
	  done; \
	fi

demo:
	@bash tools/demo.sh

bench-gpt: all
	@bash tools/bench/bench_gpt.sh $(BUILD)

# pdde against llm.c's CPU trainer on the same GPT-2 124M file, shards and update (LLMC_DIR: an llm.c checkout)
bench-llmc: all
	@bash tools/bench/bench_llmc.sh $(BUILD)

bench-lora: all
	@bash tools/bench/bench_lora.sh $(BUILD)

# Text to ids with tokenizer.json: build/tokenize against transformers.js (TRANSFORMERS_DIR; see the script).
bench-tokenize: all
	@bash tools/bench/bench_tokenize.sh $(BUILD)

# Sharded checkpoints every few steps of gpt on 2 ranks: written synchronously against in the background.
bench-checkpoint: all
	@bash tools/bench/bench_checkpoint.sh $(BUILD)

# The host's cost per executed op (a deep, narrow MLP: tiny kernels) against PyTorch eager on the CPU;
# BENCH_DISPATCH_ARGS="--device opencl --no-torch" for the OpenCL launch path.
bench-dispatch: $(BUILD)/bench_dispatch
	@$(BUILD)/bench_dispatch $(BENCH_DISPATCH_ARGS)

# The host's cost of a GEMM on OpenCL: CLBlast against the built-in k_gemm (PDDE_OPENCL_GEMM=builtin).
bench-ocl-gemm: $(BUILD)/bench_ocl_gemm
	@$(BUILD)/bench_ocl_gemm $(BENCH_OCL_GEMM_ARGS)

# Fused causal attention against the unfused reference at T = 256, 1024, 4096 on the CPU and OpenCL.
bench-attention: $(BUILD)/bench_attention
	@$(BUILD)/bench_attention $(BENCH_ATTENTION_ARGS)

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

# DLRM samples/s: CPU only, accelerator only, the heterogeneous pipeline; the table's bytes per id.
# the pipelines are sized by the cost model on this machine's measurements (pdde-bench, once)
bench-dlrm: all
	@test -f $(BUILD)/cluster.json || $(BUILD)/pdde-bench --quick --no-comm -o $(BUILD)/cluster.json
	@$(BUILD)/bench_dlrm --cluster $(BUILD)/cluster.json $(BENCH_DLRM_ARGS)

# A remote parameter server's client with 1, 2, 4 threads: one request at a time, in flight at once, in-process.
bench-ps-remote: all
	@$(BUILD)/bench_ps_remote $(BENCH_PS_REMOTE_ARGS)

# Installed like a Debian library: versioned .so with a SONAME, DESTDIR for staging, and a pdde.pc whose
# Cflags carry the feature macros this build was made with (examples test PDDE_HAVE_UCX, say).
VERSION   := 0.1.0
SOVERSION := 0
LIBDIR     = $(DESTDIR)$(PREFIX)/lib
# The cost model against measured training steps of 1-4 ranks under pdde-run (two GPT sizes, DP, ZeRO,
# TP, PP, recompute, PoCL, a cgroup-throttled rank), calibrated by pdde-bench at the start; needs root
# for its cgroups (without, it runs unprioritised and without the throttled configurations).
# BENCH_COSTMODEL_ARGS="--reps 5" for more repeats. bench-hetero: the planner's plan for a throttled
# rank and for the CPU with the PoCL device against the best uniform plan.
# MoE layer against the dense one, alltoallv against Open MPI's on 2 and 4 ranks, the cost model's error.
bench-moe: all
	mpicc -O3 -Itools/bench tools/bench/mpi_alltoallv.c -o $(BUILD)/mpi_alltoallv
	@$(BUILD)/bench_moe --build $(BUILD) $(BENCH_MOE_ARGS)

bench-costmodel: all
	@$(BUILD)/bench_costmodel --build $(BUILD) $(BENCH_COSTMODEL_ARGS)

bench-hetero: all
	@$(BUILD)/bench_costmodel --build $(BUILD) --hetero $(BENCH_COSTMODEL_ARGS)

# The planner on simulated clusters of 8 to 4096 devices (files written by gen_clusters.py --scale), five
# models from 1.3B to 260B, and the predicted weak scaling of the 260B one; BENCH_PLANNER_REPEATS (3).
bench-planner: $(BUILD)/bench_planner
	@python3 tools/clusters/gen_clusters.py --scale $(BUILD)/clusters
	@$(BUILD)/bench_planner $(BUILD)/clusters $(or $(BENCH_PLANNER_REPEATS),3)

# Mixtral-8x22B's shape planned on the 128-H100 cluster file (ep by the MoE cost model).
bench-planner-moe: $(BUILD)/bench_planner
	@$(BUILD)/bench_planner --moe tools/clusters/h100_128.json $(or $(BENCH_PLANNER_REPEATS),3)

# A lost rank under pdde-run --elastic: GPT-small on 4 ranks, one killed, one frozen (detect, recover,
# lost steps, snapshot overhead); BENCH_ELASTIC_REPEATS runs (3). bench-elastic-sim: a 16,384-device job
# replayed with failures at Llama 3's rate and at one a minute, elastic against checkpoint-restart
# (BENCH_ELASTIC_SIM_ARGS: the measured costs, see the script's --help).
bench-elastic: $(BUILD)/bench_elastic $(BUILD)/pdde-run $(BUILD)/gpt
	@$(BUILD)/bench_elastic $(BUILD) $(or $(BENCH_ELASTIC_REPEATS),3)

bench-elastic-sim:
	@python3 tools/bench/bench_elastic_sim.py $(BENCH_ELASTIC_SIM_ARGS)

# Lowering every rank of GPT-3 175B's shape under dp=8 x tp=8 x pp=16 (1024 ranks) in one process.
bench-lower: $(BUILD)/bench_lower
	@$(BUILD)/bench_lower

# ZeRO-3's regathering against the forward copy kept to backward (PDDE_ZERO3_REGATHER=0): arena and step time.
bench-zero3: $(BUILD)/gpt $(BUILD)/pdde-run
	@bash tools/bench/bench_zero3.sh $(BUILD)

install: all
	install -d $(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(BUILD)/libpdde.a $(LIBDIR)/
	install -m 755 $(BUILD)/libpdde.so $(LIBDIR)/libpdde.so.$(VERSION)
	ln -sf libpdde.so.$(VERSION) $(LIBDIR)/libpdde.so.$(SOVERSION)
	ln -sf libpdde.so.$(SOVERSION) $(LIBDIR)/libpdde.so
	install -m 644 pdde.h pdde_extension.h $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)$(PREFIX)/include/pdde/backends
	install -m 644 backends/op_params.h $(DESTDIR)$(PREFIX)/include/pdde/backends/
	for t in $(TOOLS); do install -m 755 $$t $(DESTDIR)$(PREFIX)/bin/; done
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: pdde\nDescription: adaptive distributed training engine\nVersion: %s\nLibs: -L$${libdir} -lpdde\nLibs.private: %s\nCflags: -I$${includedir} -I$${includedir}/pdde %s\n' \
	  '$(PREFIX)' '$(VERSION)' '$(strip $(LDLIBS))' '$(strip $(DEFS))' > $(LIBDIR)/pkgconfig/pdde.pc

uninstall:
	rm -f $(LIBDIR)/libpdde.a $(LIBDIR)/libpdde.so $(LIBDIR)/libpdde.so.$(SOVERSION) $(LIBDIR)/libpdde.so.$(VERSION) \
	  $(LIBDIR)/pkgconfig/pdde.pc $(DESTDIR)$(PREFIX)/include/pdde.h $(DESTDIR)$(PREFIX)/include/pdde_extension.h \
	  $(DESTDIR)$(PREFIX)/include/pdde/backends/op_params.h $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(notdir $(TOOLS)))
	-rmdir $(DESTDIR)$(PREFIX)/include/pdde/backends $(DESTDIR)$(PREFIX)/include/pdde 2>/dev/null

clean:
	rm -rf $(BUILD)
