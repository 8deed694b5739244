/* planner/dist_attr.c — small helpers on dist attrs: making, comparing, printing, and naming the
 * reshard between what a producer gives and what a consumer requires. */

#include "planner_impl.h"

PDDE_PRIVATE pdde_dist_attr attr_replicated(const pdde_mesh *mesh, int ndim) {
    pdde_dist_attr a = {.mesh = mesh, .ndim = (int8_t)ndim};
    memset(a.dims_mapping, -1, sizeof a.dims_mapping);
    return a;
}

/* Bit a set when some dim of a is split over mesh axis a. */
PDDE_PRIVATE unsigned attr_split_axes(const pdde_dist_attr *a) {
    unsigned used = 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims_mapping[d] >= 0) used |= 1u << a->dims_mapping[d];
    return used;
}

PDDE_PRIVATE int attr_dim_of_axis(const pdde_dist_attr *a, int axis) {
    for (int d = 0; d < a->ndim; d++)
        if (a->dims_mapping[d] == axis) return d;
    return -1;
}

PDDE_PRIVATE bool attr_equal(const pdde_dist_attr *a, const pdde_dist_attr *b) {
    if (a->ndim != b->ndim || !mesh_same(a->mesh, b->mesh) || a->partial != b->partial || a->partial_avg != b->partial_avg)
        return false;
    return memcmp(a->dims_mapping, b->dims_mapping, (size_t)a->ndim) == 0;
}

/* Bits of a per-axis set with axis p removed (the axes after it move down one). */
static unsigned attr_bits_without(unsigned bits, int p) {
    return (bits & ((1u << p) - 1)) | (bits >> (p + 1)) << p;
}

/* An attr moved onto another mesh. Onto a slice of its mesh (a pipeline stage of the job's mesh) it
 * is the same data seen by fewer ranks: the sliced axis drops out of the mapping (a tensor split or
 * partial over that axis would need the other slices' data; the executor refuses it). Onto a mesh of
 * the same shape (another stage) the mapping stays and the data moves by send/recv. Otherwise the
 * tensor arrives replicated. */
PDDE_PRIVATE pdde_dist_attr attr_on_mesh(const pdde_dist_attr *a, const pdde_mesh *mesh) {
    return mesh_same(a->mesh, mesh) ? *a : attr_on_mesh_at(a, mesh, mesh_sub_axis(a->mesh, mesh));
}

/* attr_on_mesh for a mesh that is not a's, where p = mesh_sub_axis(a->mesh, mesh) is known. */
PDDE_PRIVATE pdde_dist_attr attr_on_mesh_at(const pdde_dist_attr *a, const pdde_mesh *mesh, int p) {
    pdde_dist_attr r = attr_replicated(mesh, a->ndim);
    if (p >= 0) {
        for (int d = 0; d < a->ndim; d++) {
            int ax = a->dims_mapping[d];
            r.dims_mapping[d] = (int8_t)(ax < 0 || ax == p ? -1 : ax > p ? ax - 1 : ax);
        }
        r.partial = (uint8_t)attr_bits_without(a->partial, p), r.partial_avg = (uint8_t)attr_bits_without(a->partial_avg, p);
        return r;
    }
    bool same_shape = a->mesh && a->mesh->ndim == mesh->ndim;
    for (int i = 0; same_shape && i < mesh->ndim; i++) same_shape = a->mesh->shape[i] == mesh->shape[i];
    if (same_shape) {
        memcpy(r.dims_mapping, a->dims_mapping, sizeof r.dims_mapping);
        r.partial = a->partial, r.partial_avg = a->partial_avg;
    }
    return r;
}

PDDE_PRIVATE const char *attr_axis_name(const pdde_mesh *m, int axis) {
    return m && axis >= 0 && axis < m->ndim ? m->names[axis] : "?";
}

/* Appends with snprintf semantics: k counts what would have been written, buf stays terminated. */
#define ATTR_PUT(buf, n, k, ...) \
    ((k) += snprintf((size_t)(k) < (n) ? (buf) + (k) : NULL, (size_t)(k) < (n) ? (n) - (size_t)(k) : 0, __VA_ARGS__))

/* Appends the axes of a bit set by name: "{dp,tp:avg}" (":avg" for the bits also in avg_bits). */
static int attr_put_axes(const pdde_mesh *m, unsigned bits, unsigned avg_bits, char *buf, size_t n, int k) {
    ATTR_PUT(buf, n, k, "{");
    for (int a = 0, first = 1; a < 8; a++) {
        if (!(bits >> a & 1)) continue;
        ATTR_PUT(buf, n, k, "%s%s%s", first ? "" : ",", attr_axis_name(m, a), avg_bits >> a & 1 ? ":avg" : "");
        first = 0;
    }
    return ATTR_PUT(buf, n, k, "}");
}

int pdde_dist_attr_str(const pdde_dist_attr *a, char *buf, size_t n) {
    int k = 0;
    if (n) buf[0] = 0;
    if (!a || !a->mesh) return ATTR_PUT(buf, n, k, "unannotated");
    const pdde_mesh *m = a->mesh;
    ATTR_PUT(buf, n, k, "mesh[");
    for (int i = 0; i < m->ndim; i++) ATTR_PUT(buf, n, k, i ? ",%d" : "%d", m->shape[i]);
    ATTR_PUT(buf, n, k, "]");
    bool first_ranks = true; /* other ranks than 0..n-1 (a pipeline stage): listed */
    for (int i = 0; i < m->n_ranks; i++) first_ranks &= m->ranks[i] == i;
    for (int i = 0; !first_ranks && i < m->n_ranks; i++) ATTR_PUT(buf, n, k, i ? ",%d" : "@%d", m->ranks[i]);
    ATTR_PUT(buf, n, k, " dims[");
    for (int d = 0; d < a->ndim; d++)
        ATTR_PUT(buf, n, k, "%s%s", d ? "," : "", a->dims_mapping[d] < 0 ? "-1" : attr_axis_name(m, a->dims_mapping[d]));
    ATTR_PUT(buf, n, k, "]");
    if (a->partial) {
        ATTR_PUT(buf, n, k, " partial");
        k = attr_put_axes(m, a->partial, a->partial_avg, buf, n, k);
    }
    unsigned marker = a->partial_avg & ~a->partial; /* a local mean: see pdde_dist_attr */
    if (marker) {
        ATTR_PUT(buf, n, k, " avg");
        k = attr_put_axes(m, marker, 0, buf, n, k);
    }
    return k;
}

/* The communication that turns `from` into `to`, per mesh axis: "allreduce(tp)", "allgather(dp)",
 * "reduce_scatter(dp:avg)", "slice(tp)" (free), "alltoall(tp)", "to_partial(tp)" (free: the value
 * stays on one rank of the axis, zeros elsewhere; for an average every rank keeps it), or
 * "send/recv" between meshes. */
PDDE_PRIVATE int attr_reshard_str(const pdde_dist_attr *from, const pdde_dist_attr *to, char *buf, size_t n) {
    int k = 0;
    if (n) buf[0] = 0;
    if (!mesh_same(from->mesh, to->mesh) && mesh_sub_axis(from->mesh, to->mesh) < 0) return ATTR_PUT(buf, n, k, "send/recv");
    if (!mesh_same(from->mesh, to->mesh)) { /* a slice of its mesh: the local data, then as below */
        pdde_dist_attr view = attr_on_mesh(from, to->mesh);
        return attr_reshard_str(&view, to, buf, n);
    }
    const pdde_mesh *m = to->mesh;
    for (int a = 0; m && a < m->ndim; a++) {
        int fd = attr_dim_of_axis(from, a), td = attr_dim_of_axis(to, a);
        bool fp = from->partial >> a & 1, tp = to->partial >> a & 1;
        const char *what = NULL;
        if (fp && !tp) what = td >= 0 ? "reduce_scatter" : "allreduce";
        else if (!fp && tp) what = fd >= 0 ? "allgather+to_partial" : "to_partial";
        else if (fd != td) what = fd < 0 ? "slice" : td < 0 ? "allgather" : "alltoall";
        if (what)
            ATTR_PUT(buf, n, k, "%s%s(%s%s)", k ? " " : "", what, m->names[a], fp && !tp && (from->partial_avg >> a & 1) ? ":avg" : "");
    }
    return k;
}
