/* planner/planner.c — the per-graph planner state (struct planner_graph in planner_impl.h): made on
 * first use, freed with the graph. The planner's other files, one purpose each (pdde.c includes them
 * in this order):
 *   mesh.c        process meshes (owned by the graph)
 *   dist_attr.c   dist attr helpers: printing, comparing, naming the reshard between two attrs
 *   spmd_rules.c  one SPMD rule per op family (what an op gives and requires)
 *   completion.c  annotations (pdde_shard) and completion over the whole graph, the program dump
 *   strategy.c    helpers emitting the annotations of data parallel, ZeRO, tensor, vocab and pipeline
 *                 parallelism
 *   cluster.c     the unified cluster object: machines, devices, links; JSON; detection
 *   cost.c        the cost model
 *   plan_text.c   a plan's text form (pdde_plan_str, pdde_plan_parse)
 *   search.c      the planner search: degrees, layouts, micro-batches, interleaving, ZeRO, bf16
 *                 collectives, recompute per layer, stage cuts per device
 *   lower.c       lowering: a rank's local program of a completed graph (pure: no communicator,
 *                 device or tensor memory, the graph unchanged)
 *   memplan.c     the memory plan of a local program (the session allocates by it, pdde_predict_memory
 *                 predicts from it)
 *   simulate.c    the cost model on a plan's lowered programs */

#include "planner_impl.h"

PDDE_PRIVATE void planner_graph_free(struct planner_graph *p) {
    if (!p) return;
    for (int i = 0; i < p->n_meshes; i++) free(p->meshes[i]);
    free(p->meshes);
    free(p->layer_mesh);
    free(p->shares);
    free(p->annotated);
    free(p->required);
    free(p->conflicts);
    free(p);
}

/* The graph object itself (struct pdde_graph, planner_impl.h) is made and freed here, below the
 * executor: the planner builds candidate plans' graphs (simulate.c) and the core adds nodes to them. */
pdde_status pdde_graph_init(pdde_context *ctx, pdde_graph **out) {
    if (!ctx || !out) return PDDE_ERR_INVALID_ARG;
    pdde_graph *g = calloc(1, sizeof *g);
    if (!g) return pdde_error(ctx, PDDE_ERR_OOM, "graph: out of memory");
    g->ctx = ctx;
    g->layer = -1;
    context_graph_count(ctx, +1);
    *out = g;
    return PDDE_OK;
}

void pdde_graph_free(pdde_graph *g) {
    if (!g) return;
    /* the live session reads the graph's tensors (the caller's handles to them stay valid too) */
    if (g->session) { g->free_pending = true; return; }
    planner_graph_free(g->planner);
    for (int i = 0; i < g->n; i++) free(g->nodes[i]);
    free(g->nodes);
    free(g->recompute);
    free(g->cast_of);
    pdde_context *ctx = g->ctx;
    free(g);
    context_graph_count(ctx, -1); /* (the last, after pdde_context_free: frees the context) */
}

/* The graph's planner state, made on first use (NULL and an error on ctx when out of memory). */
PDDE_PRIVATE struct planner_graph *planner_of(pdde_graph *g) {
    if (!g->planner) {
        g->planner = calloc(1, sizeof *g->planner);
        if (!g->planner) pdde_error(g->ctx, PDDE_ERR_OOM, "planner: out of memory");
    }
    return g->planner;
}
