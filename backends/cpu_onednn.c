/* backends/cpu_onednn.c — the CPU backend's matmul through oneDNN (libdnnl 2.x, C API): f32, and bf16
 * inputs with f32 accumulation and output. Included by cpu.c when the build has PDDE_HAVE_DNNL; cpu.c
 * falls back to OpenBLAS or its portable GEMM for any matmul this file declines.
 *
 * Threads. Debian builds oneDNN with OpenMP. A oneDNN call on an OpenMP team would put a second set of
 * threads next to pdde's pool, and libgomp's idle team threads spin-wait (for milliseconds, by default)
 * while the pool already runs the next op. So oneDNN runs single-threaded on every pool thread
 * (omp_set_num_threads(1) on the thread that calls it: OpenMP keeps that per thread) and each matmul is
 * split into at most one tile per pool thread: the threads a context is given are all the threads.
 * It is also the faster of the two: `make bench-ops` on 2 threads of a loaded 2-core machine ran these
 * tiles at 0.95-2.0x (geometric mean 1.26x f32, 1.10x bf16) the speed of oneDNN on its own OpenMP team.
 *
 * Primitives are made on the first use of a tile shape and kept (key: dtype, dims and strides of the
 * three operands): the first training step creates them, later steps find them. The backend interface
 * has no per-node preparation slot, and a first-use cache also serves graphs built after a session.
 * Scratchpads belong to pdde (user mode), one per pool thread, so that threads can run one primitive
 * at once (with the library-owned one, two threads running one primitive crashed with Debian's 2.6). */

#include "backend_impl.h"

#include <dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#elif DNNL_CPU_THREADING_RUNTIME != DNNL_RUNTIME_SEQ
#error "pdde's oneDNN matmul needs a oneDNN built with OpenMP or sequential threading"
#endif

#define ONEDNN_MM_MAX_ENTRIES 512 /* shapes kept; past this the cache starts over */

typedef struct {
    int32_t dt, ndims;
    int64_t dims[3][3], strides[3][3]; /* A [b,m,k], B [b,k,n], C [b,m,n]; ndims 2 drops b */
} onednn_mm_key;

typedef struct {
    onednn_mm_key key;
    dnnl_primitive_t prim; /* NULL: oneDNN has no implementation for it (the fallback GEMM runs) */
    dnnl_memory_t *mem;    /* per pool thread: A, B, C, scratchpad; data handles set at each call */
    size_t scratch_bytes;
} onednn_mm_entry;

typedef struct {
    onednn_mm_entry *e;
    const char *a, *b;
    float *c;
} onednn_mm_tile;

typedef struct cpu_dnnl {
    dnnl_engine_t engine;
    int n_slots;             /* pool threads */
    dnnl_stream_t *streams;  /* one per pool thread */
    void **scratch;          /* one per pool thread */
    size_t *scratch_bytes;
    onednn_mm_entry **entries;
    int n_entries;
    onednn_mm_tile *tiles;     /* the current matmul's, at most one per pool thread */
    int failed;              /* set by a tile whose execution failed */
    pthread_mutex_t mu;      /* one matmul at a time owns tiles and the scratchpads */
} cpu_dnnl;

static void onednn_one_thread(void) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    omp_set_num_threads(1);
#endif
}

static void onednn_entry_free(cpu_dnnl *d, onednn_mm_entry *e) {
    if (!e) return;
    for (int i = 0; e->mem && i < 4 * d->n_slots; i++)
        if (e->mem[i]) dnnl_memory_destroy(e->mem[i]);
    free(e->mem);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    free(e);
}

static void cpu_dnnl_free(cpu_dnnl *d) {
    if (!d) return;
    for (int i = 0; i < d->n_entries; i++) onednn_entry_free(d, d->entries[i]);
    for (int i = 0; d->streams && i < d->n_slots; i++)
        if (d->streams[i]) dnnl_stream_destroy(d->streams[i]);
    for (int i = 0; d->scratch && i < d->n_slots; i++) free(d->scratch[i]);
    if (d->engine) dnnl_engine_destroy(d->engine);
    pthread_mutex_destroy(&d->mu);
    free(d->entries), free(d->streams), free(d->scratch), free(d->scratch_bytes), free(d->tiles);
    free(d);
}

/* NULL when oneDNN cannot start (no CPU engine): the CPU backend then runs without it. */
static cpu_dnnl *cpu_dnnl_create(int n_slots) {
    cpu_dnnl *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    pthread_mutex_init(&d->mu, NULL);
    d->n_slots = n_slots;
    d->streams = calloc((size_t)n_slots, sizeof *d->streams);
    d->scratch = calloc((size_t)n_slots, sizeof *d->scratch);
    d->scratch_bytes = calloc((size_t)n_slots, sizeof *d->scratch_bytes);
    d->tiles = calloc((size_t)n_slots, sizeof *d->tiles);
    d->entries = calloc(ONEDNN_MM_MAX_ENTRIES, sizeof *d->entries);
    bool ok = d->streams && d->scratch && d->scratch_bytes && d->tiles && d->entries &&
              dnnl_engine_create(&d->engine, dnnl_cpu, 0) == dnnl_success;
    for (int i = 0; ok && i < n_slots; i++)
        ok = dnnl_stream_create(&d->streams[i], d->engine, dnnl_stream_default_flags) == dnnl_success;
    if (!ok) { cpu_dnnl_free(d); return NULL; }
    return d;
}

static onednn_mm_entry *onednn_entry_create(cpu_dnnl *d, const onednn_mm_key *key) {
    onednn_mm_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->key = *key;
    dnnl_memory_desc_t md[3];
    dnnl_data_type_t dts[3] = {key->dt, key->dt, dnnl_f32};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    bool ok = true;
    for (int i = 0; ok && i < 3; i++) {
        dnnl_dims_t dims = {0}, strides = {0}; /* the API reads whole dnnl_dims_t arrays */
        memcpy(dims, key->dims[i] + (3 - key->ndims), (size_t)key->ndims * sizeof dims[0]);
        memcpy(strides, key->strides[i] + (3 - key->ndims), (size_t)key->ndims * sizeof strides[0]);
        ok = dnnl_memory_desc_init_by_strides(&md[i], key->ndims, dims, dts[i], strides) == dnnl_success;
    }
    ok = ok && dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) == dnnl_success &&
         dnnl_primitive_attr_create(&attr) == dnnl_success &&
         dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
         dnnl_primitive_desc_create(&pd, &desc, attr, d->engine, NULL) == dnnl_success &&
         dnnl_primitive_create(&e->prim, pd) == dnnl_success;
    static const dnnl_memory_desc_t no_scratch; /* a zero descriptor: the primitive needs none */
    const dnnl_memory_desc_t *smd = ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    if (!smd) smd = &no_scratch;
    e->scratch_bytes = dnnl_memory_desc_get_size(smd);
    if (ok) {
        e->mem = calloc((size_t)(4 * d->n_slots), sizeof *e->mem);
        ok = e->mem != NULL;
        for (int s = 0; ok && s < d->n_slots; s++)
            for (int i = 0; ok && i < 4; i++)
                ok = dnnl_memory_create(&e->mem[4 * s + i], i < 3 ? &md[i] : smd, d->engine, DNNL_MEMORY_NONE) == dnnl_success;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) { /* remembered as declined, so that the fallback runs without asking again */
        onednn_mm_entry *declined = calloc(1, sizeof *declined);
        if (declined) declined->key = *key;
        onednn_entry_free(d, e);
        return declined;
    }
    return e;
}

static onednn_mm_entry *onednn_entry_find(cpu_dnnl *d, const onednn_mm_key *key) {
    for (int i = 0; i < d->n_entries; i++)
        if (!memcmp(&d->entries[i]->key, key, sizeof *key)) return d->entries[i];
    onednn_mm_entry *e = onednn_entry_create(d, key);
    if (e) d->entries[d->n_entries++] = e;
    return e;
}

/* Runs tile [begin, end) of the current matmul on the calling pool thread; the range's first index
 * names the thread's stream and scratchpad (the pool gives each thread one contiguous range). */
static void onednn_mm_task(void *arg, int64_t begin, int64_t end) {
    cpu_dnnl *d = arg;
    int slot = (int)begin;
    onednn_one_thread();
    for (int64_t t = begin; t < end; t++) {
        onednn_mm_tile *tl = &d->tiles[t];
        dnnl_memory_t *m = tl->e->mem + 4 * slot;
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]},
                                   {DNNL_ARG_SCRATCHPAD, m[3]}};
        bool ok = dnnl_memory_set_data_handle(m[0], (void *)tl->a) == dnnl_success &&
                  dnnl_memory_set_data_handle(m[1], (void *)tl->b) == dnnl_success &&
                  dnnl_memory_set_data_handle(m[2], tl->c) == dnnl_success &&
                  dnnl_memory_set_data_handle(m[3], d->scratch[slot]) == dnnl_success &&
                  dnnl_primitive_execute(tl->e->prim, d->streams[slot], 4, args) == dnnl_success &&
                  dnnl_stream_wait(d->streams[slot]) == dnnl_success;
        if (!ok) __atomic_store_n(&d->failed, 1, __ATOMIC_RELAXED);
    }
}

static void onednn_key_init(onednn_mm_key *k, const gemm_job *j, int dt, int64_t nb, int64_t m, int64_t n) {
    memset(k, 0, sizeof *k); /* keys are compared with memcmp */
    k->dt = dt, k->ndims = nb > 1 || j->batch > 1 ? 3 : 2;
    int64_t bA = j->strideA ? nb : 1, bB = j->strideB ? nb : 1; /* a shared operand broadcasts */
    int64_t dims[3][3] = {{bA, m, j->K}, {bB, j->K, n}, {nb, m, n}};
    int64_t strides[3][3] = {{j->strideA ? j->strideA : m * j->K, j->ta ? 1 : j->lda, j->ta ? j->lda : 1},
                             {j->strideB ? j->strideB : j->K * n, j->tb ? 1 : j->ldb, j->tb ? j->ldb : 1},
                             {j->M * j->N, j->N, 1}};
    memcpy(k->dims, dims, sizeof dims), memcpy(k->strides, strides, sizeof strides);
}

/* C = op(A) op(B) for the job cpu_matmul has set up (A and B of element type dt). Returns 0 when done,
 * -1 when oneDNN declined (no implementation, out of memory, a failed execution): the caller's GEMM
 * then computes the whole product. */
static int cpu_dnnl_matmul(cpu_dnnl *d, pdde_threadpool *pool, const gemm_job *j, pdde_dtype dtype) {
    int dt = dtype == PDDE_BF16 ? dnnl_bf16 : dnnl_f32;
    size_t es = pdde_dtype_size(dtype);
    int threads = d->n_slots;
    double flops = 2.0 * (double)j->M * (double)j->N * (double)j->K * (double)j->batch;
    /* tiles: batch chunks first, then rows (or columns when C is wide) of each, one per thread */
    int64_t per = j->batch, tm = j->M, tn = j->N;
    if (flops >= 2e5 && threads > 1) {
        int64_t chunks = j->batch < threads ? j->batch : threads;
        per = (j->batch + chunks - 1) / chunks;
        chunks = (j->batch + per - 1) / per;
        int64_t f = threads / chunks;
        if (f > 1 && j->M >= j->N && j->M >= 32) tm = ((j->M + f - 1) / f + 15) / 16 * 16;
        else if (f > 1 && j->N >= 128) tn = ((j->N + f - 1) / f + 63) / 64 * 64;
    }
    pthread_mutex_lock(&d->mu);
    if (d->n_entries + 4 > ONEDNN_MM_MAX_ENTRIES) { /* more shapes than a model has: start over */
        for (int i = 0; i < d->n_entries; i++) onednn_entry_free(d, d->entries[i]);
        d->n_entries = 0;
    }
    int prev_threads = 1;
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    prev_threads = omp_get_max_threads(); /* the caller's own OpenMP setting, restored below */
#endif
    onednn_one_thread(); /* primitives are made for the one thread that runs each */
    int n = 0, rc = 0;
    size_t scratch = 0;
    for (int64_t b0 = 0; b0 < j->batch && rc == 0; b0 += per)
        for (int64_t i0 = 0; i0 < j->M && rc == 0; i0 += tm)
            for (int64_t j0 = 0; j0 < j->N && rc == 0; j0 += tn) {
                int64_t nb = j->batch - b0 < per ? j->batch - b0 : per;
                int64_t m = j->M - i0 < tm ? j->M - i0 : tm, nn = j->N - j0 < tn ? j->N - j0 : tn;
                onednn_mm_key key;
                onednn_key_init(&key, j, dt, nb, m, nn);
                onednn_mm_entry *e = onednn_entry_find(d, &key);
                if (!e || !e->prim) { rc = -1; break; }
                onednn_mm_tile *tl = &d->tiles[n++];
                tl->e = e;
                tl->a = (const char *)j->A + (size_t)(b0 * j->strideA + i0 * (j->ta ? 1 : j->lda)) * es;
                tl->b = (const char *)j->B + (size_t)(b0 * j->strideB + j0 * (j->tb ? j->ldb : 1)) * es;
                tl->c = j->C + b0 * j->M * j->N + i0 * j->N + j0;
                if (e->scratch_bytes > scratch) scratch = e->scratch_bytes;
            }
    for (int s = 0; rc == 0 && s < threads; s++) /* scratchpads grow before the threads start */
        if (d->scratch_bytes[s] < scratch) {
            free(d->scratch[s]);
            d->scratch_bytes[s] = 0;
            if (posix_memalign(&d->scratch[s], 64, scratch) != 0) { d->scratch[s] = NULL; rc = -1; }
            else d->scratch_bytes[s] = scratch;
        }
    if (rc == 0) {
        d->failed = 0;
        parallel_for(pool, n, 2, onednn_mm_task, d);
        rc = d->failed ? -1 : 0;
    }
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    omp_set_num_threads(prev_threads);
#else
    (void)prev_threads;
#endif
    pthread_mutex_unlock(&d->mu);
    return rc;
}
