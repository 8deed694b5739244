/* backends/registry.c — the built-in backend families and the devices they expose.
 *
 * Adding a device family: write backends/<name>.c defining `const pdde_backend_iface pdde_backend_<name>`,
 * include it in pdde.c, and add one line to builtin_backends below. Out-of-tree backends come in through
 * pdde_context_params.extra_backends, or as plugins (shared libraries named by PDDE_BACKEND_PLUGINS,
 * loaded here; backends/README.md is the guide). The registry is built once per context and then fixed;
 * pdde.c owns the context; the public queries of its devices and backends (pdde_device_*,
 * pdde_backend_*) read its registry here. */

#include "backend_impl.h"

#include <stdio.h>
#include <stdlib.h>
#ifndef PDDE_NO_PLUGINS
#include <dlfcn.h>
#endif


static const pdde_backend_iface *const builtin_backends[] = {
    &pdde_backend_cpu, /* first: device 0 is always the CPU */
#ifdef PDDE_HAVE_OPENCL_BACKEND
    &pdde_backend_opencl,
#endif
#ifndef PDDE_NO_CUDA
    &pdde_backend_cuda,
#endif
#ifndef PDDE_NO_LEVEL_ZERO
    &pdde_backend_level_zero,
#endif
};

/* The first thing that makes a backend's vtable unusable, or NULL: a struct smaller than version 1's
 * (slots past its struct_size count as NULL), an api_version under 1, or a required slot left NULL. */
static const char *iface_problem(const pdde_backend_iface *b) {
    if (!b) return "no vtable";
    if (b->api_version < 1) return "api_version below 1";
    if (b->struct_size < offsetof(pdde_backend_iface, event_create)) return "struct_size smaller than version 1's";
    /* the required slots, in the vtable's order: the message names the first one missing */
#define REQUIRE_SLOT(slot) \
    if (!b->slot) return #slot
    REQUIRE_SLOT(name);
    REQUIRE_SLOT(init);
    REQUIRE_SLOT(device_props);
    REQUIRE_SLOT(device_open);
    REQUIRE_SLOT(supports_op);
    REQUIRE_SLOT(buffer_alloc);
    REQUIRE_SLOT(buffer_free);
    REQUIRE_SLOT(write);
    REQUIRE_SLOT(read);
    REQUIRE_SLOT(stream_create);
    REQUIRE_SLOT(stream_sync);
    REQUIRE_SLOT(compute);
#undef REQUIRE_SLOT
    return NULL;
}

/* Whether a comma-separated list (NULL or "" = every backend) names a backend. */
static bool backend_wanted(const char *list, const char *name) {
    if (!list || !*list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p += len + (end != NULL);
    }
    return false;
}

/* The number of plugin paths in a ':'-separated list. */
static int plugin_count(const char *list) {
    int n = 0;
    for (const char *q = list; q && *q; q++)
        if (*q != ':' && (q == list || q[-1] == ':')) n++;
    return n;
}

#ifndef PDDE_NO_PLUGINS
/* Why this thread's plugin entry point declined to load: its entry runs before there is a family or a
 * context for it (its host->error(NULL, ...) lands here), and the context's last error is another
 * component's. */
static _Thread_local char plugin_decline_reason[512];

/* The host table's error: pdde_error on a context; with none (the entry point declining), the reason. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static pdde_status plugin_host_error(pdde_context *ctx, pdde_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (ctx) error_vset(ctx, fmt, ap);
    else vsnprintf(plugin_decline_reason, sizeof plugin_decline_reason, fmt, ap);
    va_end(ap);
    return status;
}

/* Loads one plugin into f: its vtable, or (refused) a reason in f->why and a line on stderr. */
static void plugin_load(registry_family *f, const char *path) {
    const char *base = strrchr(path, '/');
    snprintf(f->label, sizeof f->label, "%.63s", base ? base + 1 : path);
    f->status = PDDE_ERR_UNAVAILABLE;
    static const pdde_backend_host host = {PDDE_BACKEND_API_VERSION, sizeof(pdde_backend_host), plugin_host_error, pdde_op_name,
                                           pdde_tensor_numel, pdde_dtype_size};
    const char *problem;
    pdde_backend_plugin_fn entry = NULL;
    const pdde_backend_iface *b = NULL;
    if (!(f->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        const char *err = dlerror();
        /* (a plugin that calls pdde_* itself loads only into programs linking libpdde.so) */
        snprintf(f->why, sizeof f->why, "plugin %.400s does not load: %.450s%s", path, err,
                 strstr(err, "undefined symbol: pdde_") ? " (a plugin calls pdde only through the host table its entry receives: host->error, "
                                                          "host->op_name, ...; backends/README.md, \"Plugins\")"
                 : strchr(path, '/')                    ? ""
                                                        : " (a name without '/' is looked up on the library path: write ./NAME for a file here)");
    } else if (!(*(void **)&entry = dlsym(f->dl, PDDE_BACKEND_PLUGIN_ENTRY))) {
        snprintf(f->why, sizeof f->why, "plugin %.400s has no entry symbol %s (backends/README.md)", path, PDDE_BACKEND_PLUGIN_ENTRY);
    } else if ((plugin_decline_reason[0] = 0, !(b = entry(&host)))) {
        if (plugin_decline_reason[0]) snprintf(f->why, sizeof f->why, "plugin %.400s declined to load: %.500s", path, plugin_decline_reason);
        else snprintf(f->why, sizeof f->why, "plugin %.400s declined to load (gave no reason)", path);
    } else if (b->api_version != PDDE_BACKEND_API_VERSION) {
        f->status = PDDE_ERR_VERSION;
        snprintf(f->why, sizeof f->why, "plugin %.400s (%.64s) has backend api_version %u; this pdde takes %d", path, b->name ? b->name : "?",
                 b->api_version, PDDE_BACKEND_API_VERSION);
    } else if ((problem = iface_problem(b))) {
        f->status = PDDE_ERR_INVALID_ARG;
        snprintf(f->why, sizeof f->why, "plugin %.400s (%.64s): invalid vtable (struct_size %u): %s%s", path, b->name ? b->name : "?",
                 b->struct_size, problem, strchr(problem, ' ') ? "" : " is NULL, a required slot (backends/README.md)");
    } else {
        f->iface = b;
        f->status = PDDE_OK;
        return;
    }
    pdde_log(PDDE_LOG_WARN, "pdde: %s\n", f->why);
}
#endif

PDDE_PRIVATE pdde_status registry_init(pdde_context *ctx, const pdde_context_params *p, pdde_registry **out) {
    int n_builtin = (int)(sizeof builtin_backends / sizeof builtin_backends[0]);
    int n_extra = p && p->n_extra_backends > 0 ? p->n_extra_backends : 0;
    const char *plugins = p && p->backend_plugins ? p->backend_plugins : getenv("PDDE_BACKEND_PLUGINS");
    int n = n_builtin + n_extra + plugin_count(plugins);
    pdde_registry *r = calloc(1, sizeof *r);
    if (!r || !(r->families = calloc((size_t)n, sizeof *r->families))) {
        free(r);
        return pdde_error(ctx, PDDE_ERR_OOM, "registry: out of memory");
    }
    *out = r;
    const char *next_plugin = plugins;
    for (int i = 0; i < n; i++) {
        registry_family *f = &r->families[r->n_families++];
        if (i >= n_builtin + n_extra) { /* the next path of the plugin list */
            while (*next_plugin == ':') next_plugin++;
            size_t len = strcspn(next_plugin, ":");
            char path[4096];
            snprintf(path, sizeof path, "%.*s", (int)len, next_plugin);
            next_plugin += len;
#ifndef PDDE_NO_PLUGINS
            plugin_load(f, path);
#else
            snprintf(f->label, sizeof f->label, "plugin");
            snprintf(f->why, sizeof f->why, "plugin %.400s: pdde was built with PDDE_NO_PLUGINS", path);
            f->status = PDDE_ERR_UNAVAILABLE;
#endif
            if (!f->iface) continue;
        } else {
            f->iface = i < n_builtin ? builtin_backends[i] : p->extra_backends[i - n_builtin];
        }
        const char *problem = iface_problem(f->iface);
        if (problem) {
            f->status = PDDE_ERR_INVALID_ARG;
            snprintf(f->why, sizeof f->why, "backend %d: invalid interface: %s%s", i, problem, strchr(problem, ' ') ? "" : " is NULL, a required slot");
            continue;
        }
        int same = 0; /* (the same plugin listed twice, or a second backend of a name already taken) */
        for (int k = 0; k < r->n_families - 1 && !same; k++) same = r->families[k].iface && !strcmp(r->families[k].iface->name, f->iface->name);
        if (same) {
            f->status = PDDE_ERR_INVALID_ARG;
            snprintf(f->why, sizeof f->why, "a second backend named %.64s (listed twice?): this one is left out", f->iface->name);
            f->iface = NULL;
            continue;
        }
        if (i > 0 && !backend_wanted(p ? p->backends : NULL, f->iface->name)) {
            f->status = PDDE_ERR_UNAVAILABLE;
            snprintf(f->why, sizeof f->why, "not in the context's backend list");
            continue;
        }
        int n_dev = 0;
        f->status = f->iface->init(ctx, &f->family, &n_dev);
        if (f->status != PDDE_OK) {
            const char *why = pdde_last_error(ctx);
            snprintf(f->why, sizeof f->why, "%s", why[0] ? why : pdde_status_str(f->status));
            f->family = NULL;
            if (i == 0) return f->status; /* no CPU backend: nothing can run */
            continue;
        }
        registry_device *devs = realloc(r->devices, (size_t)(r->n_devices + n_dev) * sizeof *devs);
        if (!devs) return pdde_error(ctx, PDDE_ERR_OOM, "registry: out of memory");
        r->devices = devs;
        f->first_device = r->n_devices;
        f->n_devices = n_dev;
        for (int d = 0; d < n_dev; d++) r->devices[r->n_devices++] = (registry_device){.family = r->n_families - 1, .index = d};
        for (int d = 0; d < n_dev && f->dl; d++) { /* (a plugin's devices must carry its name: selection goes by it) */
            pdde_device_props props = {0};
            if (f->iface->device_props(f->family, d, &props) == PDDE_OK && strncmp(props.backend, f->iface->name, sizeof props.backend)) {
                pdde_log(PDDE_LOG_WARN, "pdde: plugin backend %.64s: its device %d says backend '%.16s' (device_props.backend must be the backend's "
                                "name): a choice of device by backend name will not find it\n", f->iface->name, d, props.backend);
                break;
            }
        }
    }
    return PDDE_OK;
}

PDDE_PRIVATE void registry_free(pdde_registry *r) {
    if (!r) return;
    for (int i = 0; i < r->n_devices; i++) {
        const pdde_backend_iface *b = r->families[r->devices[i].family].iface;
        if (r->devices[i].dev && b->device_close) b->device_close(r->devices[i].dev);
    }
    for (int i = 0; i < r->n_families; i++)
        if (r->families[i].family && r->families[i].iface->free) r->families[i].iface->free(r->families[i].family);
#ifndef PDDE_NO_PLUGINS
    for (int i = 0; i < r->n_families; i++)
        if (r->families[i].dl) dlclose(r->families[i].dl);
#endif
    free(r->devices);
    free(r->families);
    free(r);
}

static void context_destroy(pdde_context *ctx) {
    registry_free(ctx->registry);
    error_fini(ctx);
    free(ctx);
}

/* One atomic word, so that exactly one thread frees the context: the one whose change leaves "freed,
 * no graph" (the graph's last free or pdde_context_free, whichever comes last). */
PDDE_PRIVATE void context_graph_count(pdde_context *ctx, int change) {
    unsigned long left = change > 0 ? __atomic_add_fetch(&ctx->graphs_and_freed, 2, __ATOMIC_ACQ_REL)
                                    : __atomic_sub_fetch(&ctx->graphs_and_freed, 2, __ATOMIC_ACQ_REL);
    if (change < 0 && left == 1) context_destroy(ctx);
}

PDDE_PRIVATE void context_release(pdde_context *ctx) {
    if (__atomic_fetch_or(&ctx->graphs_and_freed, 1, __ATOMIC_ACQ_REL) == 0) context_destroy(ctx);
}

/* The backend and opened device handle of a global device index. */
PDDE_PRIVATE pdde_status registry_device_get(pdde_context *ctx, pdde_registry *r, int device, const pdde_backend_iface **iface, void **dev) {
    if (device < 0 || device >= r->n_devices)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "device %d does not exist (%d devices)", device, r->n_devices);
    registry_device *d = &r->devices[device];
    registry_family *f = &r->families[d->family];
    if (!d->dev) {
        pdde_status st = f->iface->device_open(f->family, d->index, &d->dev);
        if (st != PDDE_OK) return st;
    }
    *iface = f->iface;
    *dev = d->dev;
    return PDDE_OK;
}

PDDE_PRIVATE pdde_status registry_device_props(const pdde_registry *r, int device, pdde_device_props *out) {
    if (device < 0 || device >= r->n_devices) return PDDE_ERR_INVALID_ARG;
    const registry_family *f = &r->families[r->devices[device].family];
    memset(out, 0, sizeof *out); /* (a plugin built before a field was appended leaves it 0) */
    return f->iface->device_props(f->family, r->devices[device].index, out);
}

PDDE_PRIVATE bool registry_device_is_host(const pdde_registry *r, int device) {
    return device >= 0 && device < r->n_devices && strcmp(r->families[r->devices[device].family].iface->name, "cpu") == 0;
}

PDDE_PRIVATE const char *registry_device_backend(const pdde_registry *r, int device) {
    return r && device >= 0 && device < r->n_devices ? registry_family_name(&r->families[r->devices[device].family]) : NULL;
}

PDDE_PRIVATE int registry_device_find(const pdde_registry *r, const char *backend, int index) {
    for (int i = 0; i < r->n_families; i++)
        if (r->families[i].family && strcmp(r->families[i].iface->name, backend) == 0)
            return index >= 0 && index < r->families[i].n_devices ? r->families[i].first_device + index : -1;
    return -1;
}

PDDE_PRIVATE bool registry_device_supports(pdde_context *ctx, pdde_registry *r, int device, const pdde_tensor *node) {
    const pdde_backend_iface *b = NULL;
    void *dev = NULL;
    if (registry_device_is_host(r, device) || registry_device_get(ctx, r, device, &b, &dev) != PDDE_OK) return true;
    return b->supports_op(dev, node) != 0;
}

PDDE_PRIVATE const char *registry_family_name(const registry_family *f) {
    return f->iface && f->iface->name ? f->iface->name : f->label[0] ? f->label : "?";
}

/* ------------------------------------------------------------------------------------------------
 * The public view of a context's registry */

int pdde_device_count(pdde_context *ctx) { return ctx && ctx->registry ? ctx->registry->n_devices : 0; }

pdde_status pdde_device_get_props(pdde_context *ctx, int device, pdde_device_props *out) {
    if (!ctx || !out) return PDDE_ERR_INVALID_ARG;
    if (device < 0 || device >= ctx->registry->n_devices)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "device %d does not exist (%d devices)", device, ctx->registry->n_devices);
    return registry_device_props(ctx->registry, device, out);
}

int pdde_device_find(pdde_context *ctx, const char *backend, int index) {
    if (!ctx || !ctx->registry || !backend) return -1;
    return registry_device_find(ctx->registry, backend, index);
}

pdde_status pdde_device_backend(pdde_context *ctx, int device, const pdde_backend_iface **iface, void **dev) {
    if (!ctx || !iface || !dev) return PDDE_ERR_INVALID_ARG;
    return registry_device_get(ctx, ctx->registry, device, iface, dev);
}

int pdde_backend_count(pdde_context *ctx) { return ctx ? ctx->registry->n_families : 0; }

const char *pdde_backend_name(pdde_context *ctx, int backend) {
    if (!ctx || backend < 0 || backend >= ctx->registry->n_families) return NULL;
    return registry_family_name(&ctx->registry->families[backend]);
}

pdde_status pdde_backend_status(pdde_context *ctx, int backend, const char **why) {
    if (!ctx || backend < 0 || backend >= ctx->registry->n_families) return PDDE_ERR_INVALID_ARG;
    registry_family *f = &ctx->registry->families[backend];
    if (why) *why = f->status == PDDE_OK ? "" : f->why;
    return f->status;
}
