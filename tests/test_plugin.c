/* test_plugin.c — backend plugins through the loader, and the CPU fallback of ops a device lacks.
 *
 * The toy plugin (examples/toy_backend.c, built as build/libpdde_toy.so) runs a handful of ops on host
 * memory. Checked: PDDE_BACKEND_PLUGINS loads it; a plugin of another vtable version, a file that is
 * no library and a library without the entry symbol are refused by name with the reason; so are an entry
 * that declines (its own reason, or "gave no reason") and a vtable missing a required slot (named); a two-layer
 * MLP placed on the toy device (its GELU, sums and reductions are not the toy's) compiles, runs the
 * toy's ops on the toy and the others on the CPU with copies, says so in one line, and gives the
 * loss and every gradient of the same graph on the CPU alone; with no_cpu_fallback (or
 * PDDE_CPU_FALLBACK=0) the unsupported op is an error naming it. pdde_device_select's auto does not take
 * a plugin's device that does not run the step's in-place optimizer update, and matches a measured
 * cluster's devices by family and index (a calibration's context may have had other families). */
#define _GNU_SOURCE
#include "pdde.h"
#include "tests/test_util.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char plugin_dir[PATH_MAX];

static void plugin_path(char *out, size_t n, const char *file) { snprintf(out, n, "%s/%s", plugin_dir, file); }

/* The family of a context whose name is `name` (-1: none). */
static int family_of(pdde_context *ctx, const char *name) {
    for (int b = 0; b < pdde_backend_count(ctx); b++)
        if (!strcmp(pdde_backend_name(ctx, b), name)) return b;
    return -1;
}

static void test_loader(void) {
    char toy[4200], v99[4200], list[9000];
    plugin_path(toy, sizeof toy, "libpdde_toy.so");
    plugin_path(v99, sizeof v99, "libpdde_toy_v99.so");
    /* the environment variable is what a user sets; a bogus path and a library that is no plugin too */
    snprintf(list, sizeof list, "%s:%s:/nonexistent/libnothing.so:libm.so.6", toy, v99);
    setenv("PDDE_BACKEND_PLUGINS", list, 1);
    pdde_context *ctx;
    pdde_status st = pdde_context_init(NULL, &ctx);
    unsetenv("PDDE_BACKEND_PLUGINS");
    CHECK(st == PDDE_OK, "context with plugins: %s", pdde_status_str(st));
    if (st) return;
    const char *why = NULL;
    int b = family_of(ctx, "toy");
    CHECK(b >= 0 && pdde_backend_status(ctx, b, &why) == PDDE_OK, "the toy plugin is available (%s)", why ? why : "not listed");
    int dev = pdde_device_find(ctx, "toy", 0);
    pdde_device_props props = {0};
    CHECK(dev > 0 && pdde_device_get_props(ctx, dev, &props) == PDDE_OK && props.kind == PDDE_DEVICE_ACCEL &&
              !strcmp(props.backend, "toy"), "toy device: index %d, backend '%s'", dev, props.backend);
    b = family_of(ctx, "libpdde_toy_v99.so");
    st = b >= 0 ? pdde_backend_status(ctx, b, &why) : PDDE_OK;
    CHECK(st == PDDE_ERR_VERSION && strstr(why, "api_version 99") && strstr(why, "takes 1"), "v99 refused: %s (%s)", pdde_status_str(st),
          b >= 0 ? why : "not listed");
    b = family_of(ctx, "libnothing.so");
    st = b >= 0 ? pdde_backend_status(ctx, b, &why) : PDDE_OK;
    CHECK(st == PDDE_ERR_UNAVAILABLE && strstr(why, "does not load"), "missing file refused: %s", b >= 0 ? why : "not listed");
    b = family_of(ctx, "libm.so.6");
    st = b >= 0 ? pdde_backend_status(ctx, b, &why) : PDDE_OK;
    CHECK(st == PDDE_ERR_UNAVAILABLE && strstr(why, "entry symbol pdde_backend_plugin"), "libm refused: %s", b >= 0 ? why : "not listed");
    pdde_context_free(ctx);
}

/* What a bring-up's broken entry points and vtables are refused with: the reason the plugin gave
 * (host->error(NULL, ...) from its entry), "gave no reason" when it gave none (never another
 * component's last error, planted here first), and the required slot it left NULL, by name. */
static void test_refusal_reasons(void) {
    char declines[4200], silent[4200], nosync[4200], direct[4200], list[17000];
    plugin_path(declines, sizeof declines, "libpdde_toy_declines.so");
    plugin_path(silent, sizeof silent, "libpdde_toy_silent.so");
    plugin_path(nosync, sizeof nosync, "libpdde_toy_nosync.so");
    plugin_path(direct, sizeof direct, "libpdde_toy_direct.so");
    snprintf(list, sizeof list, "%s:%s:%s:%s", declines, silent, nosync, direct);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backend_plugins = list;
    pdde_context *ctx;
    pdde_status st = pdde_context_init(&cp, &ctx);
    CHECK(st == PDDE_OK, "context with refused plugins: %s", pdde_status_str(st));
    if (st) return;
    const char *why = NULL;
    int b = family_of(ctx, "libpdde_toy_declines.so");
    st = b >= 0 ? pdde_backend_status(ctx, b, &why) : PDDE_OK;
    CHECK(st == PDDE_ERR_UNAVAILABLE && why && strstr(why, "declined to load: toy: no toy card found (vendor code -3)"),
          "a plugin declining with a reason shows it: %s (%s)", pdde_status_str(st), b >= 0 ? why : "not listed");
    b = family_of(ctx, "libpdde_toy_silent.so");
    st = b >= 0 ? pdde_backend_status(ctx, b, &why) : PDDE_OK;
    CHECK(st == PDDE_ERR_UNAVAILABLE && why && strstr(why, "declined to load (gave no reason)") && !strstr(why, "toy card"),
          "a plugin declining silently says it gave no reason, not another's error: %s (%s)", pdde_status_str(st), b >= 0 ? why : "not listed");
    b = family_of(ctx, "libpdde_toy_nosync.so");
    st = b >= 0 ? pdde_backend_status(ctx, b, &why) : PDDE_OK;
    CHECK(st == PDDE_ERR_INVALID_ARG && why && strstr(why, "stream_sync is NULL"), "a NULL required slot is named: %s (%s)",
          pdde_status_str(st), b >= 0 ? why : "not listed");
    /* (this program links pdde statically: a plugin calling pdde_op_name itself finds no such symbol) */
    b = family_of(ctx, "libpdde_toy_direct.so");
    st = b >= 0 ? pdde_backend_status(ctx, b, &why) : PDDE_OK;
    CHECK(st == PDDE_ERR_UNAVAILABLE && why && strstr(why, "undefined symbol: pdde_op_name") && strstr(why, "through the host table"),
          "a plugin calling pdde directly is refused, told to use the host table: %s (%s)", pdde_status_str(st), b >= 0 ? why : "not listed");
    pdde_context_free(ctx);
    /* a stale error of this thread's (as a backend that probed and failed leaves one) is not the silent plugin's reason */
    pdde_context *ctx2;
    if (pdde_context_init(NULL, &ctx2) == PDDE_OK) {
        pdde_error(ctx2, PDDE_ERR_UNAVAILABLE, "no Level Zero driver (a stale message)");
        cp.backend_plugins = silent;
        pdde_context *ctx3;
        st = pdde_context_init(&cp, &ctx3);
        if (st == PDDE_OK) {
            b = family_of(ctx3, "libpdde_toy_silent.so");
            pdde_backend_status(ctx3, b, &why);
            CHECK(b >= 0 && why && !strstr(why, "Level Zero") && strstr(why, "gave no reason"), "no stale reason: %s", b >= 0 ? why : "not listed");
            pdde_context_free(ctx3);
        }
        pdde_context_free(ctx2);
    }
}

enum { B = 6, D_IN = 16, D_HID = 24, D_OUT = 5 };

typedef struct {
    pdde_graph *g;
    pdde_tensor *x, *w1, *w2, *loss;
} mlp;

/* loss = sum((gelu(x W1) W2)^2) / 2, every node in layer 0 (the layer placed on the toy) */
static pdde_status mlp_build(pdde_context *ctx, mlp *m) {
    pdde_status st = pdde_graph_init(ctx, &m->g);
    if (st) return st;
    pdde_graph *g = m->g;
    pdde_graph_set_layer(g, 0);
    m->x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){B, D_IN});
    m->w1 = pdde_param(g, "w1", 2, (int64_t[]){D_IN, D_HID}, 0.3f);
    m->w2 = pdde_param(g, "w2", 2, (int64_t[]){D_HID, D_OUT}, 0.3f);
    pdde_tensor *y = pdde_matmul(g, pdde_gelu(g, pdde_matmul(g, m->x, m->w1, 0, 0)), m->w2, 0, 0);
    m->loss = pdde_scale(g, pdde_sum(g, pdde_mul(g, y, y), -1, 0), 0.5f);
    pdde_backward(g, m->loss);
    return pdde_graph_status(g);
}

typedef struct { float loss, gw1[D_IN * D_HID], gw2[D_HID * D_OUT]; } mlp_result;

/* Runs forward and backward on `device` (layer 0 placed there); the same seed gives the same weights. */
static pdde_status mlp_run(pdde_context *ctx, int device, int no_fallback, mlp_result *r, int *on_device, int *on_cpu_gelu) {
    mlp m;
    pdde_status st = mlp_build(ctx, &m);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    int layer_dev[1] = {device};
    sp.layer_devices = layer_dev, sp.n_layer_devices = 1;
    sp.no_cpu_fallback = no_fallback;
    pdde_session *s = NULL;
    if (!st) st = pdde_session_init(m.g, &sp, &s);
    if (!st) {
        float x[B * D_IN];
        for (int i = 0; i < B * D_IN; i++) x[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
        st = pdde_session_write(s, m.x, x, sizeof x);
    }
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_session_read(s, m.w1->grad, r->gw1, sizeof r->gw1);
    if (!st) st = pdde_session_read(s, m.w2->grad, r->gw2, sizeof r->gw2);
    if (!st) r->loss = pdde_session_loss(s);
    *on_device = *on_cpu_gelu = 0;
    for (int i = 0; !st && i < pdde_session_node_count(s); i++) {
        const pdde_tensor *t = pdde_session_node(s, i);
        *on_device += t->device == device && t->op != PDDE_OP_NONE && t->op != PDDE_OP_COPY;
        *on_cpu_gelu += t->device == 0 && (t->op == PDDE_OP_GELU || t->op == PDDE_OP_GELU_BACK);
    }
    pdde_session_free(s);
    pdde_graph_free(m.g);
    return st;
}

/* stderr of fn() while it runs, into buf */
static void capture_stderr(char *buf, size_t n, pdde_status (*fn)(void *), void *arg, pdde_status *st) {
    char path[] = "/tmp/pdde-test-plugin.XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    *st = fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t len = pread(fd, buf, n - 1, 0);
    buf[len > 0 ? len : 0] = 0;
    close(fd);
    unlink(path);
}

typedef struct { pdde_context *ctx; int device; mlp_result r; int on_device, on_cpu_gelu; } fallback_run;
static pdde_status fallback_fn(void *arg) {
    fallback_run *f = arg;
    return mlp_run(f->ctx, f->device, 0, &f->r, &f->on_device, &f->on_cpu_gelu);
}

/* The same plugin listed twice is loaded once: the second entry is left out, saying why. */
static void test_listed_twice(void) {
    char toy[4200], twice[8500];
    plugin_path(toy, sizeof toy, "libpdde_toy.so");
    snprintf(twice, sizeof twice, "%s:%s", toy, toy);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backend_plugins = twice;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) { CHECK(0, "context"); return; }
    int toys = 0, refused = 0;
    for (int b = 0; b < pdde_backend_count(ctx); b++) {
        const char *why = NULL, *name = pdde_backend_name(ctx, b);
        toys += name && !strcmp(name, "toy") && pdde_backend_status(ctx, b, &why) == PDDE_OK;
        refused += pdde_backend_status(ctx, b, &why) != PDDE_OK && why && strstr(why, "a second backend named toy");
    }
    CHECK(toys == 1 && refused == 1 && pdde_device_find(ctx, "toy", 1) < 0, "a plugin listed twice: one toy backend (%d), one refusal (%d)", toys,
          refused);
    pdde_context_free(ctx);
}

static void test_fallback(void) {
    char toy[4200];
    plugin_path(toy, sizeof toy, "libpdde_toy.so");
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backend_plugins = toy;
    cp.seed = 7;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) { CHECK(0, "context"); return; }
    int dev = pdde_device_find(ctx, "toy", 0);
    CHECK(dev > 0, "toy device found through backend_plugins");
    if (dev <= 0) { pdde_context_free(ctx); return; }

    mlp_result ref;
    int n_dev, n_gelu;
    pdde_status st = mlp_run(ctx, 0, 0, &ref, &n_dev, &n_gelu);
    CHECK(st == PDDE_OK, "the MLP on the CPU: %s", pdde_last_error(ctx));

    fallback_run f = {.ctx = ctx, .device = dev};
    char err[4096];
    capture_stderr(err, sizeof err, fallback_fn, &f, &st);
    CHECK(st == PDDE_OK, "the MLP on the toy with fallback: %s (%s)", pdde_status_str(st), pdde_last_error(ctx));
    CHECK(f.on_device >= 5, "the toy runs its ops (matmuls, mul, scale): %d nodes on it", f.on_device);
    CHECK(f.on_cpu_gelu == 2, "gelu and gelu_back run on the CPU: %d", f.on_cpu_gelu);
    const char *line = strstr(err, "pdde: ");
    CHECK(line && strstr(line, "run on the CPU") && strstr(line, "gelu (device") && strstr(line, "gelu_back (device") &&
              strchr(line, '\n') == strrchr(err, '\n'),
          "one notice line naming the ops: '%s'", err);
    if (st == PDDE_OK) {
        CHECK(test_close(f.r.loss, ref.loss, 1e-5, 0), "loss with fallback %.9g, on the CPU %.9g", f.r.loss, ref.loss);
        test_close_all("grad w1 (fallback vs CPU)", f.r.gw1, ref.gw1, D_IN * D_HID, 1e-3, 1e-4);
        test_close_all("grad w2 (fallback vs CPU)", f.r.gw2, ref.gw2, D_HID * D_OUT, 1e-3, 1e-4);
    }

    /* without the fallback: the op the device lacks is an error naming it */
    mlp_result r;
    st = mlp_run(ctx, dev, 1, &r, &n_dev, &n_gelu);
    CHECK(st == PDDE_ERR_UNSUPPORTED && strstr(pdde_last_error(ctx), "gelu"), "no_cpu_fallback: %s (%s)", pdde_status_str(st),
          pdde_last_error(ctx));
    setenv("PDDE_CPU_FALLBACK", "0", 1);
    st = mlp_run(ctx, dev, 0, &r, &n_dev, &n_gelu);
    CHECK(st == PDDE_ERR_UNSUPPORTED, "PDDE_CPU_FALLBACK=0: %s", pdde_status_str(st));
    /* the predictions of that session's program (pdde_lower_dump, pdde_predict_memory) lower it as the
     * session does: the op left on the device (which the session refuses), no copies to the CPU */
    mlp m;
    int layer_dev[1] = {dev};
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.layer_devices = layer_dev, sp.n_layer_devices = 1;
    char *env_dump = NULL, *asked_dump = NULL, *fallback_dump = NULL;
    size_t len = 0;
    pdde_memory_stats env_mem = {0}, fallback_mem = {0};
    if (mlp_build(ctx, &m) == PDDE_OK) {
        FILE *f = open_memstream(&env_dump, &len);
        CHECK(pdde_lower_dump(m.g, &sp, 0, 0, f) == PDDE_OK && pdde_predict_memory(m.g, &sp, 0, 0, &env_mem) == PDDE_OK, "%s", pdde_last_error(ctx));
        fclose(f);
        unsetenv("PDDE_CPU_FALLBACK");
        f = open_memstream(&fallback_dump, &len);
        CHECK(pdde_lower_dump(m.g, &sp, 0, 0, f) == PDDE_OK && pdde_predict_memory(m.g, &sp, 0, 0, &fallback_mem) == PDDE_OK, "%s", pdde_last_error(ctx));
        fclose(f);
        sp.no_cpu_fallback = 1;
        f = open_memstream(&asked_dump, &len);
        CHECK(pdde_lower_dump(m.g, &sp, 0, 0, f) == PDDE_OK, "%s", pdde_last_error(ctx));
        fclose(f);
        CHECK(env_dump && asked_dump && !strcmp(env_dump, asked_dump), "pdde_lower_dump under PDDE_CPU_FALLBACK=0 is the no_cpu_fallback program:\n%s\nvs\n%s",
              env_dump, asked_dump);
        CHECK(fallback_dump && env_dump && strcmp(fallback_dump, env_dump) && strstr(fallback_dump, "copy") && !strstr(env_dump, "copy"),
              "with the fallback the program copies to the CPU, under PDDE_CPU_FALLBACK=0 not:\n%s\nvs\n%s", fallback_dump, env_dump);
        CHECK(env_mem.activation_bytes < fallback_mem.activation_bytes, "pdde_predict_memory under PDDE_CPU_FALLBACK=0: %zu activation bytes, "
              "with the copies of the fallback %zu", env_mem.activation_bytes, fallback_mem.activation_bytes);
    } else {
        CHECK(0, "mlp_build: %s", pdde_last_error(ctx));
    }
    unsetenv("PDDE_CPU_FALLBACK");
    free(env_dump), free(asked_dump), free(fallback_dump);
    pdde_graph_free(m.g);
    pdde_context_free(ctx);
}

/* A step of y = x w (the toy's op) whose loss needs the CPU, with AdamW (in place) when optimizer. */
static pdde_graph *auto_graph(pdde_context *ctx, int optimizer) {
    pdde_graph *g = NULL;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){64, 64}), *w = pdde_param(g, "w", 2, (int64_t[]){64, 64}, 0.1f);
    pdde_tensor *y = pdde_matmul(g, x, w, 0, 0);
    if (!optimizer) { pdde_mark_output(y); return g; }
    pdde_backward(g, pdde_mean(g, y, -1, 0));
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_optimizer_adamw(g, &op);
    return g;
}

/* pdde_device_select's auto with the toy plugins: a training step whose optimizer update the toy does not
 * run (in place: it cannot go to the CPU) is not given the toy; and a measured cluster matches devices by
 * family and index, not by id: measured in a context of the CPU and the toy (the toy its device 1, then
 * toy2 added as device 2), auto in a context of the CPU, toy2 and the toy (toy2 device 1, the toy 2)
 * times each by its own figures: the toy, measured 1000x the others, is taken. */
static void test_auto_device(void) {
    char plugins[8500], toy[4200];
    plugin_path(toy, sizeof toy, "libpdde_toy.so");
    plugin_path(plugins, sizeof plugins, "libpdde_toy2.so");
    snprintf(plugins + strlen(plugins), sizeof plugins - strlen(plugins), ":%s", toy);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backend_plugins = plugins, cp.backends = "cpu,toy2,toy"; /* (another family's devices before the toy's) */
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) { CHECK(0, "context: %s", pdde_last_error(NULL)); return; }
    int lr = 0, toy_here = pdde_device_find(ctx, "toy", 0);
    CHECK(toy_here == 2 && pdde_device_find(ctx, "toy2", 0) == 1, "toy2 device 1 (%d), the toy device 2 (%d)", pdde_device_find(ctx, "toy2", 0), toy_here);
    pdde_device_select_params ds = PDDE_DEVICE_SELECT_PARAMS_INIT;
    pdde_device_choice choice;
    ds.backend = "auto", ds.local_rank = &lr, ds.graph = auto_graph(ctx, 1);
    pdde_status st = pdde_device_select(ctx, &ds, &choice);
    CHECK(st == PDDE_OK && !strcmp(choice.backend, "cpu") && strstr(choice.why, "not toy: it does not run adamw_update"),
          "auto with an AdamW step: %s, the CPU, saying why not the toy (%s)", choice.backend, st ? pdde_last_error(ctx) : choice.why);
    pdde_graph_free((pdde_graph *)ds.graph);

    pdde_context_params cp2 = PDDE_CONTEXT_PARAMS_INIT;
    cp2.backend_plugins = toy, cp2.backends = "cpu,toy";
    pdde_context *ctx2;
    pdde_cluster *measured = NULL;
    if (pdde_context_init(&cp2, &ctx2) == PDDE_OK) pdde_cluster_detect(ctx2, &measured);
    int toy_id = -1;
    for (int s = 0; measured && s < measured->n_specs; s++) {
        pdde_device_spec *sp = &measured->specs[s];
        double scale = strcmp(sp->backend, "toy") ? 1 : 1000;
        sp->n_gemm = 0, sp->peak_flops = 1e10 * scale, sp->mem_bandwidth = 1e10 * scale;
        memset(sp->n_curve, 0, sizeof sp->n_curve);
        if (scale > 1) { /* toy2: the toy's spec at the others' speed, as device 2 */
            pdde_device_spec other = *sp;
            snprintf(other.name, sizeof other.name, "toy2");
            snprintf(other.backend, sizeof other.backend, "toy2");
            other.peak_flops = other.mem_bandwidth = 1e10;
            for (int d = 0; d < measured->machines[0].n_devices; d++)
                if (measured->machines[0].devices[d].spec == s) toy_id = measured->machines[0].devices[d].id;
            pdde_cluster_device dev = {.id = 2, .spec = pdde_cluster_add_spec(measured, &other), .memory = 1 << 30};
            pdde_cluster_add_device(measured, 0, &dev);
            break;
        }
    }
    CHECK(measured && toy_id == 1, "the measured cluster has the toy as device 1 (%d)", toy_id);
    ds.graph = auto_graph(ctx, 0), ds.cluster = measured;
    st = pdde_device_select(ctx, &ds, &choice);
    CHECK(st == PDDE_OK && choice.device == toy_here && strstr(choice.why, "predicted"),
          "auto with the measured cluster: device %d (%s), want the toy, device %d here (%s)", choice.device, choice.backend, toy_here,
          st ? pdde_last_error(ctx) : choice.why);
    pdde_graph_free((pdde_graph *)ds.graph);
    pdde_cluster_free(measured);
    pdde_context_free(ctx2);
    pdde_context_free(ctx);
}

int main(int argc, char **argv) {
    (void)argc;
    /* the plugins are built next to this test */
    if (!realpath(argv[0], plugin_dir)) { CHECK(0, "realpath %s", argv[0]); return test_finish(); }
    *strrchr(plugin_dir, '/') = 0;
    test_loader();
    test_refusal_reasons();
    test_fallback();
    test_listed_twice();
    test_auto_device();
    return test_finish();
}
