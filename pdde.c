/* pdde.c — the single compilation unit of the library: it includes every enabled part in layer order
 * (backends/, comm/, planner/, core/), so `cc -c pdde.c` builds everything; PDDE_NO_<X> leaves part X
 * out, and pdde_features() says what a build contains. */
#define _GNU_SOURCE
#include "planner/planner_impl.h" /* the internal structs and prototypes every part shares */

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Error messages are cut to their buffers on purpose (a message quoting another). gcc at -O3 without
 * -fPIC inlines pdde_last_error and warns of each such cut: keep a vendored -O3 -Werror build clean. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* ================================================================================================
 * The bottom part, then the backends (each one file; the registry lists them) */

#include "backends/base.c"
#include "backends/env_values.c"
#include "backends/cpu.c"
#ifndef PDDE_NO_OPENCL
#include "backends/opencl.c"
#endif
#ifndef PDDE_NO_CUDA
#include "backends/cuda.c"
#endif
#ifndef PDDE_NO_LEVEL_ZERO
#include "backends/level_zero.c"
#endif
#include "backends/registry.c"

/* (after the parts: each says whether it is in) */
uint32_t pdde_features(void) {
    uint32_t f = 0;
#ifdef PDDE_HAVE_COMM
    f |= PDDE_FEATURE_COMM;
#endif
#ifdef PDDE_HAVE_OPENCL_BACKEND
    f |= PDDE_FEATURE_OPENCL;
#endif
#ifndef PDDE_NO_CUDA
    f |= PDDE_FEATURE_CUDA;
#endif
#ifndef PDDE_NO_LEVEL_ZERO
    f |= PDDE_FEATURE_LEVEL_ZERO;
#endif
#ifdef PDDE_HAVE_OPENBLAS
    f |= PDDE_FEATURE_OPENBLAS;
#endif
#ifdef PDDE_HAVE_DNNL
    f |= PDDE_FEATURE_DNNL;
#endif
#ifdef PDDE_HAVE_CLBLAST
    f |= PDDE_FEATURE_CLBLAST;
#endif
#ifdef PDDE_HAVE_HWLOC
    f |= PDDE_FEATURE_HWLOC;
#endif
    f |= PDDE_FEATURE_CJSON; /* (cluster files are read with cJSON where it is, else with planner/json_read.c) */
#ifndef PDDE_NO_PLUGINS
    f |= PDDE_FEATURE_PLUGINS;
#endif
#ifdef PDDE_NATIVE_BUILD
    f |= PDDE_FEATURE_NATIVE;
#endif
    return f;
}

const char *pdde_feature_name(uint32_t feature) {
    static const char *const names[PDDE_FEATURE_COUNT] = {"comm", "opencl", "cuda", "level_zero", "openblas", "dnnl",
                                                          "clblast", "hwloc", "cjson", "plugins", "native"};
    for (int i = 0; i < PDDE_FEATURE_COUNT; i++)
        if (feature == 1u << i) return names[i];
    return NULL;
}

/* ================================================================================================
 * Communication (comm/): store, transport, communicators and collectives; the parameter server */

#ifdef PDDE_HAVE_COMM
#include "comm/comm.c"
#include "comm/alltoall_hier.c"
#endif
/* (in every build that has it: one process's in-process table needs no communication; servers and
 * remote clients fail at their first message where there is no comm/) */
#ifdef PDDE_HAVE_PS
#include "comm/ps.c"
#endif
/* (in every build that has the file: without comm/'s transport or CUDA its init says why it is
 * unavailable; a copy without the comm/ folder gets one that says only that) */
#if __has_include("comm/nccl.c")
#include "comm/nccl.c"
#else
static pdde_status nccl_missing(const pdde_device_collectives_params *p, void **impl) {
    if (impl) *impl = NULL;
    return pdde_error(p ? p->ctx : NULL, PDDE_ERR_UNAVAILABLE, "nccl: this copy of pdde has no comm/ folder");
}
static pdde_status nccl_missing_allreduce(void *impl, void *stream, void *handle, size_t offset, size_t count, pdde_dtype t,
                                          pdde_reduce_op op) {
    (void)impl, (void)stream, (void)handle, (void)offset, (void)count, (void)t, (void)op;
    return PDDE_ERR_UNAVAILABLE;
}
static void nccl_missing_free(void *impl) { (void)impl; }
static const pdde_device_collectives_iface nccl_missing_iface = {.api_version = PDDE_DEVICE_COLLECTIVES_API_VERSION,
    .struct_size = sizeof(pdde_device_collectives_iface), .name = "nccl", .backend = "cuda", .init = nccl_missing,
    .allreduce = nccl_missing_allreduce, .free = nccl_missing_free};
const pdde_device_collectives_iface *pdde_nccl_collectives(void) { return &nccl_missing_iface; }
#endif

/* ================================================================================================
 * Planner (planner/): meshes, distributed attributes, completion, lowering */

#include "planner/planner.c"
#include "planner/mesh.c"
#include "planner/dist_attr.c"
#include "planner/spmd_rules.c"
#include "planner/completion.c"
#include "planner/strategy.c"
#include "planner/cluster.c"
#include "planner/cost.c"
#include "planner/plan_text.c"
#include "planner/search.c"
#include "planner/lower.c"
#include "planner/memplan.c"
#include "planner/simulate.c"
#include "planner/moe_cost.c"

/* ================================================================================================
 * The core (core/): the context, the graph, autodiff, the optimizers, the session and its executor,
 * then what builds on them: checkpoints, the token loader, plan application, the parameter-server
 * worker side and the asynchronous pipeline */

#include "core/context.c"
#include "core/graph.c"
#include "core/autodiff.c"
#include "core/optimizer.c"
#include "core/rank_agreement.c"
#include "core/session.c"
#include "core/checkpoint.c"
#include "core/snapshot.c"
#include "core/elastic.c"
#include "core/data.c"
#include "core/plan_apply.c"
#include "core/device_select.c"
#include "core/ps_worker.c"
#include "core/pipeline.c"
