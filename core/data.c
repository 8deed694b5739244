/* core/data.c — the token loader: byte-level text or token files, shuffled windows whose position checkpoints keep.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ================================================================================================
 * Data: byte-level tokens from a text file, or a token file. Batches take windows of T+1 tokens at
 * positions from a seeded permutation of all window starts (an epoch), advancing a position counter
 * that checkpoints save, so a resumed run sees exactly the batches it would have seen. */

#define TOKENS_MAGIC "PDDETOK1"

struct pdde_data {
    pdde_context *ctx;
    int32_t *tokens;
    int64_t n;
    uint64_t position;    /* windows handed out so far */
};

static pdde_status load_tokens(pdde_context *ctx, const char *path, int32_t **tokens, int64_t *n) {
    size_t size = 0;
    pdde_status st;
    char *buf = read_file(ctx, path, "data", &size, &st);
    if (!buf) return st;
    if (size >= 16 && memcmp(buf, TOKENS_MAGIC, 8) == 0) {
        uint64_t count;
        memcpy(&count, buf + 8, 8);
        if (count > (size - 16) / 4) {
            free(buf);
            return pdde_error(ctx, PDDE_ERR_CORRUPT, "token file %s: header says %llu tokens, the file holds %zu", path,
                              (unsigned long long)count, (size - 16) / 4);
        }
        *tokens = malloc((size_t)count * 4 + 4);
        if (*tokens) memcpy(*tokens, buf + 16, (size_t)count * 4);
        *n = (int64_t)count;
    } else {
        *tokens = malloc(size * 4 + 4);
        for (size_t i = 0; *tokens && i < size; i++) (*tokens)[i] = (uint8_t)buf[i];
        *n = (int64_t)size;
    }
    free(buf);
    return *tokens ? PDDE_OK : pdde_error(ctx, PDDE_ERR_OOM, "data: out of memory for %s", path);
}

pdde_status pdde_data_open_part(pdde_context *ctx, const char *path, double begin, double end, pdde_data **out) {
    if (!ctx) return PDDE_ERR_INVALID_ARG;
    if (!path || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "data_open: %s is NULL", !path ? "path" : "out");
    if (!(begin >= 0 && end <= 1 && begin < end))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "data_open: the part [%g, %g) is not a non-empty part of [0, 1]", begin, end);
    *out = NULL;
    int32_t *tokens = NULL;
    int64_t n = 0;
    pdde_status st = load_tokens(ctx, path, &tokens, &n);
    if (st) return st;
    int64_t b = (int64_t)(begin * (double)n), e = (int64_t)(end * (double)n);
    pdde_data *d = calloc(1, sizeof *d);
    if (!d) { free(tokens); return pdde_error(ctx, PDDE_ERR_OOM, "data: out of memory"); }
    memmove(tokens, tokens + b, (size_t)(e - b) * sizeof *tokens);
    d->ctx = ctx, d->tokens = tokens, d->n = e - b;
    *out = d;
    return PDDE_OK;
}

pdde_status pdde_data_open(pdde_context *ctx, const char *path, pdde_data **out) { return pdde_data_open_part(ctx, path, 0, 1, out); }

void pdde_data_close(pdde_data *d) {
    if (!d) return;
    free(d->tokens);
    free(d);
}

int64_t pdde_data_token_count(const pdde_data *d) { return d ? d->n : 0; }
uint64_t pdde_data_position(const pdde_data *d) { return d ? d->position : 0; }
void pdde_data_set_position(pdde_data *d, uint64_t pos) { if (d) d->position = pos; }

/* The k-th element of a seeded permutation of [0, n) without storing it: a Feistel-style bijection on
 * the next power of two, cycle-walking until the value falls inside [0, n). */
static uint64_t permute_index(uint64_t k, uint64_t n, uint64_t seed) {
    int bits = 1;
    while ((1ull << bits) < n) bits++;
    int half = (bits + 1) / 2;
    uint64_t mask = (1ull << half) - 1, x = k;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (int round = 0; round < 4; round++) {
            uint64_t st = seed ^ (r * 0x9E3779B97F4A7C15ull) ^ (uint64_t)round;
            uint64_t f = splitmix64(&st) & mask;
            uint64_t nl = r, nr = (l ^ f) & mask;
            l = nl, r = nr;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

pdde_status pdde_data_next_batch(pdde_data *d, int batch, int T, uint64_t seed, int32_t *x, int32_t *y) {
    if (!d || batch < 1 || T < 1 || !x || !y) return PDDE_ERR_INVALID_ARG;
    if (d->n < T + 1)
        return pdde_error(d->ctx, PDDE_ERR_INVALID_ARG, "data: %lld tokens are fewer than one window of %d + 1", (long long)d->n, T);
    uint64_t windows = (uint64_t)(d->n - T - 1) + 1;
    for (int b = 0; b < batch; b++) {
        uint64_t k = d->position++;
        uint64_t epoch = k / windows, start = permute_index(k % windows, windows, seed + epoch * 0x632BE59BD9B4E019ull);
        memcpy(x + (size_t)b * T, d->tokens + start, (size_t)T * sizeof *x);
        memcpy(y + (size_t)b * T, d->tokens + start + 1, (size_t)T * sizeof *y);
    }
    return PDDE_OK;
}

pdde_status pdde_data_write_tokens(pdde_context *ctx, const char *text_path, const char *out_path) {
    if (!text_path || !out_path) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_data_write_tokens: no %s", text_path ? "output path" : "text path");
    int32_t *tokens = NULL;
    int64_t n = 0;
    pdde_status st = load_tokens(ctx, text_path, &tokens, &n);
    if (st) return st;
    FILE *f = fopen(out_path, "wb");
    uint64_t count = (uint64_t)n;
    bool ok = f && fwrite(TOKENS_MAGIC, 1, 8, f) == 8 && fwrite(&count, 8, 1, f) == 1 && fwrite(tokens, 4, (size_t)n, f) == (size_t)n;
    if (f && fclose(f) != 0) ok = false;
    free(tokens);
    return ok ? PDDE_OK : pdde_error(ctx, PDDE_ERR_IO, "cannot write %s: %s", out_path, strerror(errno));
}
