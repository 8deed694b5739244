/* planner/planner.c — the planning layer's entry point, included by pdde.c after the graph, autodiff
 * and optimizer code (it reads struct pdde_graph directly) and before the executor. It holds the
 * per-graph planner state and includes the planner's other files, one purpose each:
 *   mesh.c        process meshes (owned by the graph)
 *   dist_attr.c   dist attr helpers: printing, comparing, naming the reshard between two attrs
 *   spmd_rules.c  one SPMD rule per op family (what an op gives and requires)
 *   completion.c  annotations (pdde_shard) and completion over the whole graph, the program dump
 *   strategy.c    helpers emitting the annotations of data parallel, ZeRO, tensor, vocab and pipeline
 *                 parallelism
 *   search.c      the planner search: degrees, micro-batches, ZeRO, recompute, stage cuts per device
 * (partition.c, SPMD execution, is included by pdde.c's executor: it works on the session.) */

/* A conflict that completion resolved by an op's rule (kept for the dump and the tests). */
typedef struct {
    int node, input;
    char msg[224];
} planner_conflict;

/* Per-graph planner state, made on first use and freed with the graph. */
struct planner_graph {
    pdde_mesh **meshes;            /* owned; each allocation holds its ranks after the struct */
    int n_meshes, cap_meshes;
    const pdde_mesh *mesh;         /* the graph's mesh: unannotated inputs and parameters live here */
    const pdde_mesh **layer_mesh;  /* by layer id: the sub-mesh its ops run on (pipeline stage), or NULL */
    int n_layer_mesh;
    uint8_t *annotated;            /* by tensor id: 1 when pdde_shard set its attr */
    int n_annotated;
    /* results of the last pdde_complete */
    int n_completed;               /* nodes it covered (0 = not completed) */
    pdde_dist_attr *required;      /* [n_completed * PDDE_MAX_SRC]: what each op requires of input k */
    planner_conflict *conflicts;
    int n_conflicts, cap_conflicts;
    bool oom;                      /* a conflict could not be recorded */
};

static void planner_graph_free(struct planner_graph *p) {
    if (!p) return;
    for (int i = 0; i < p->n_meshes; i++) free(p->meshes[i]);
    free(p->meshes);
    free(p->layer_mesh);
    free(p->annotated);
    free(p->required);
    free(p->conflicts);
    free(p);
}

/* The graph's planner state, made on first use (NULL and an error on ctx when out of memory). */
static struct planner_graph *planner_of(pdde_graph *g) {
    if (!g->planner) {
        g->planner = calloc(1, sizeof *g->planner);
        if (!g->planner) pdde_error(g->ctx, PDDE_ERR_OOM, "planner: out of memory");
    }
    return g->planner;
}

#include <assert.h>

#include "planner/mesh.c"
#include "planner/dist_attr.c"
#include "planner/spmd_rules.c"
#include "planner/completion.c"
#include "planner/strategy.c"
#include "planner/search.c"
