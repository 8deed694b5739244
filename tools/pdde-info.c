/* pdde-info — lists every backend family pdde was built with, whether it is available here (and why
 * not), and every device with its properties.
 *
 *   pdde-info [-q]      -q: one line per device only */
#include "pdde.h"

#include <stdio.h>
#include <string.h>

static const char *kind_name(pdde_device_kind k) {
    switch (k) {
    case PDDE_DEVICE_CPU: return "cpu";
    case PDDE_DEVICE_GPU: return "gpu";
    case PDDE_DEVICE_ACCEL: return "accelerator";
    default: return "?";
    }
}

static void print_bytes(const char *label, uint64_t b) {
    if (!b) {
        printf("    %-16s unknown\n", label);
        return;
    }
    printf("    %-16s %.2f GiB (%llu bytes)\n", label, (double)b / (1024.0 * 1024.0 * 1024.0), (unsigned long long)b);
}

int main(int argc, char **argv) {
    int quiet = argc > 1 && !strcmp(argv[1], "-q");
    if (argc > 1 && !quiet) {
        fprintf(stderr, "usage: %s [-q]\n", argv[0]);
        return 2;
    }
    pdde_context *ctx;
    pdde_status st = pdde_context_init(NULL, &ctx);
    if (st != PDDE_OK) {
        fprintf(stderr, "pdde-info: context: %s\n", pdde_status_str(st));
        return 1;
    }
    printf("pdde %d.%d.%d, %d CPU threads\n", PDDE_VERSION_MAJOR, PDDE_VERSION_MINOR, PDDE_VERSION_PATCH,
           pdde_context_thread_count(ctx));
    if (!quiet) {
        printf("built with:");
        for (int i = 0; i < PDDE_FEATURE_COUNT; i++)
            if (pdde_features() & 1u << i) printf(" %s", pdde_feature_name(1u << i));
        printf("\n\nbackends:\n");
        for (int b = 0; b < pdde_backend_count(ctx); b++) {
            const char *why = "";
            pdde_status bs = pdde_backend_status(ctx, b, &why);
            int n = 0;
            for (int d = 0; d < pdde_device_count(ctx); d++) {
                pdde_device_props p;
                if (pdde_device_get_props(ctx, d, &p) == PDDE_OK && !strcmp(p.backend, pdde_backend_name(ctx, b))) n++;
            }
            if (bs == PDDE_OK) printf("  %-12s available, %d device%s\n", pdde_backend_name(ctx, b), n, n == 1 ? "" : "s");
            else printf("  %-12s unavailable (%s): %s\n", pdde_backend_name(ctx, b), pdde_status_str(bs), why);
        }
        printf("\ndevices:\n");
    }
    for (int d = 0; d < pdde_device_count(ctx); d++) {
        pdde_device_props p;
        if (pdde_device_get_props(ctx, d, &p) != PDDE_OK) {
            printf("  [%d] (no properties: %s)\n", d, pdde_last_error(ctx));
            continue;
        }
        if (quiet) {
            printf("%d %s %s %s %llu %d\n", d, p.backend, kind_name(p.kind), p.name, (unsigned long long)p.memory_total,
                   p.compute_units);
            continue;
        }
        printf("  [%d] %s\n", d, p.name);
        printf("    %-16s %s\n", "backend", p.backend);
        printf("    %-16s %s\n", "kind", kind_name(p.kind));
        print_bytes("memory", p.memory_total);
        if (p.memory_free) print_bytes("memory free", p.memory_free);
        printf("    %-16s %d\n", "compute units", p.compute_units);
        if (p.peak_flops_f32 > 0) printf("    %-16s %.1f GFLOP/s\n", "peak f32", p.peak_flops_f32 * 1e-9);
        else printf("    %-16s unknown\n", "peak f32");
        if (p.mem_bandwidth > 0) printf("    %-16s %.1f GB/s\n", "bandwidth", p.mem_bandwidth * 1e-9);
        else printf("    %-16s unknown\n", "bandwidth");
    }
    pdde_context_free(ctx);
    return 0;
}
