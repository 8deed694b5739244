/* planner/planner.c — the planning layer's entry point, included by pdde.c after the graph and
 * autodiff code (it reads struct pdde_graph directly). It includes the planner's other files. */

/* Per-graph planner state: meshes owned by the graph, ops' required input attributes. */
struct planner_graph {
    int unused;
};

static void planner_graph_free(struct planner_graph *p) { free(p); }
