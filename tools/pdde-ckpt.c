/* pdde-ckpt — looks into, checks, converts and compares checkpoints, without a model.
 *
 *   build/pdde-ckpt info CKPT            # step, data position, schedule, files; every tensor's dtype,
 *                                        # shape, dist attr and blocks (file, offset, bytes, CRC)
 *   build/pdde-ckpt verify CKPT          # every CRC; the blocks cover every tensor exactly once
 *   build/pdde-ckpt convert FROM TO      # a sharded directory into one file, or one file into a directory
 *   build/pdde-ckpt diff A B             # the same tensors, bit for bit, and the same step and data position
 *
 * CKPT is a sharded checkpoint (a directory with a manifest) or a single checkpoint file. Exit status 0
 * when all is well, 1 when a check fails or the checkpoints differ, 2 on bad usage. */
#define _GNU_SOURCE
#include "pdde.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: pdde-ckpt info CKPT | verify CKPT | convert FROM TO | diff A B\n"
               "  CKPT: a sharded checkpoint directory or a single checkpoint file\n"
               "  info     what it holds: step, data position, schedule, files, each tensor's shape, dist attr and blocks\n"
               "  verify   every CRC (manifest, shards, blocks) and that the blocks cover every tensor exactly once\n"
               "  convert  a directory into a single file, or a single file into a directory (one shard)\n"
               "  diff     every tensor of A equals B's bit for bit (any formats, any plans), and step and data position\n");
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* A single checkpoint file's records (format in pdde.h), read whole. */
typedef struct {
    char *buf;
    size_t size;
    uint64_t step, pos;
    uint32_t count, version;
} single;

static int single_open(pdde_context *ctx, const char *path, single *s, char *tmp, size_t tmpn) {
    memset(s, 0, sizeof *s);
    const char *file = path;
    if (is_dir(path)) { /* through a single file in a temporary place */
        snprintf(tmp, tmpn, "/tmp/pdde-ckpt.%d.%p.ckpt", (int)getpid(), (void *)s);
        if (pdde_checkpoint_convert(ctx, path, tmp)) {
            fprintf(stderr, "pdde-ckpt: %s\n", pdde_last_error(ctx));
            return -1;
        }
        file = tmp;
    } else if (pdde_checkpoint_verify(ctx, path)) {
        fprintf(stderr, "pdde-ckpt: %s\n", pdde_last_error(ctx));
        return -1;
    }
    FILE *f = fopen(file, "rb");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n > 0 && (s->buf = malloc((size_t)n)) && fseek(f, 0, SEEK_SET) == 0 && fread(s->buf, 1, (size_t)n, f) == (size_t)n) s->size = (size_t)n;
    if (f) fclose(f);
    if (!s->size) {
        fprintf(stderr, "pdde-ckpt: cannot read %s\n", file);
        return -1;
    }
    memcpy(&s->version, s->buf + 8, 4), memcpy(&s->count, s->buf + 12, 4), memcpy(&s->step, s->buf + 16, 8), memcpy(&s->pos, s->buf + 24, 8);
    return 0;
}

/* The next record at *at: name, dtype, ndim, shape, data (verified files: the bounds hold). */
typedef struct {
    char name[256];
    uint8_t dtype, ndim;
    int64_t shape[8];
    uint64_t nbytes;
    const char *data;
} record;

static void next_record(const single *s, size_t *at, record *r) {
    uint16_t len, attr_len;
    memcpy(&len, s->buf + *at, 2), *at += 2;
    memcpy(r->name, s->buf + *at, len < 255 ? len : 255), r->name[len < 255 ? len : 255] = 0, *at += len;
    r->dtype = (uint8_t)s->buf[*at], r->ndim = (uint8_t)s->buf[*at + 1], *at += 2;
    memcpy(r->shape, s->buf + *at, 8u * (r->ndim < 8 ? r->ndim : 8)), *at += 8u * r->ndim;
    if (s->version >= 2) memcpy(&attr_len, s->buf + *at, 2), *at += 2 + attr_len;
    memcpy(&r->nbytes, s->buf + *at, 8), *at += 8;
    r->data = s->buf + *at, *at += r->nbytes;
}

static int diff(pdde_context *ctx, const char *a, const char *b) {
    single sa = {0}, sb = {0};
    char ta[256] = "", tb[256] = "";
    int bad = 0;
    if (single_open(ctx, a, &sa, ta, sizeof ta) || single_open(ctx, b, &sb, tb, sizeof tb)) bad = -1;
    if (!bad && (sa.step != sb.step || sa.pos != sb.pos)) {
        printf("differ: step %llu / %llu, data position %llu / %llu\n", (unsigned long long)sa.step, (unsigned long long)sb.step,
               (unsigned long long)sa.pos, (unsigned long long)sb.pos);
        bad++;
    }
    size_t at = sa.version >= 3 ? 76 : 48, hb = sb.version >= 3 ? 76 : 48;
    for (uint32_t i = 0; bad >= 0 && i < sa.count; i++) {
        record ra, rb = {0};
        next_record(&sa, &at, &ra);
        size_t pos = hb;
        int found = 0;
        for (uint32_t k = 0; k < sb.count && !found; k++) {
            next_record(&sb, &pos, &rb);
            found = strcmp(rb.name, ra.name) == 0;
        }
        if (!found) {
            printf("differ: %s is in %s only\n", ra.name, a);
            bad++;
        } else if (ra.dtype != rb.dtype || ra.ndim != rb.ndim || ra.nbytes != rb.nbytes || memcmp(ra.shape, rb.shape, 8u * ra.ndim)) {
            printf("differ: %s has another dtype or shape\n", ra.name);
            bad++;
        } else if (memcmp(ra.data, rb.data, ra.nbytes)) {
            size_t first = 0;
            while (ra.data[first] == rb.data[first]) first++;
            printf("differ: %s (first at byte %zu of %llu)\n", ra.name, first, (unsigned long long)ra.nbytes);
            bad++;
        }
    }
    if (bad >= 0 && sa.count != sb.count) printf("differ: %u tensors in %s, %u in %s\n", sa.count, a, sb.count, b), bad++;
    if (!bad) printf("identical: %u tensors bit for bit, step %llu, data position %llu\n", sa.count, (unsigned long long)sa.step, (unsigned long long)sa.pos);
    if (ta[0]) unlink(ta);
    if (tb[0]) unlink(tb);
    free(sa.buf), free(sb.buf);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    int want = !strcmp(cmd, "info") || !strcmp(cmd, "verify") ? 3 : !strcmp(cmd, "convert") || !strcmp(cmd, "diff") ? 4 : 0;
    if (!want || argc != want) {
        usage(stderr);
        return 2;
    }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    cp.n_threads = 1;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) {
        fprintf(stderr, "pdde-ckpt: cannot create a context\n");
        return 1;
    }
    int rc = 0;
    pdde_status st = PDDE_OK;
    if (!strcmp(cmd, "info")) st = pdde_checkpoint_print(ctx, argv[2], stdout);
    else if (!strcmp(cmd, "verify")) {
        st = pdde_checkpoint_verify(ctx, argv[2]);
        if (!st) printf("%s: ok (every CRC; every tensor covered exactly once)\n", argv[2]);
    } else if (!strcmp(cmd, "convert")) {
        st = pdde_checkpoint_convert(ctx, argv[2], argv[3]);
        if (!st) printf("%s -> %s (%s)\n", argv[2], argv[3], is_dir(argv[3]) ? "sharded" : "single file");
    } else rc = diff(ctx, argv[2], argv[3]);
    if (st) {
        fprintf(stderr, "pdde-ckpt: %s: %s\n", pdde_status_str(st), pdde_last_error(ctx));
        rc = 1;
    }
    pdde_context_free(ctx);
    return rc;
}
