/* core/data.c — the token loader: byte-level text, pdde's token files or llm.c's shards, shuffled windows whose position checkpoints keep.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ================================================================================================
 * Data: byte-level tokens from a text file, or a token file of ids. Batches take windows of T+1 tokens at
 * positions from a seeded permutation of all window starts (an epoch), advancing a position counter
 * that checkpoints save, so a resumed run sees exactly the batches it would have seen. */

#define TOKENS_MAGIC "PDDETOK1"
/* llm.c's token shards (written by its dev/data scripts): 256 int32 of header (magic, version, token
 * count), then the tokens: uint16 for GPT-2's tokenizer, uint32 for LLaMA 3's. */
#define LLMC_HEADER_BYTES 1024
static const struct { int32_t magic, version, width; const char *tokenizer; } llmc_formats[] = {
    {20240520, 1, 2, "GPT-2"},
    {20240801, 7, 4, "LLaMA 3"},
};

struct pdde_data {
    pdde_context *ctx;
    int32_t *tokens;
    int64_t n;
    int32_t max_token;
    uint64_t position;    /* windows handed out so far */
};

/* An llm.c shard buf[size] (its magic already matched format k) into *tokens, *n. */
static pdde_status load_llmc(pdde_context *ctx, const char *path, const char *buf, size_t size, int k, int32_t **tokens, int64_t *n) {
    int32_t header[3];
    memcpy(header, buf, sizeof header);
    const char *what = llmc_formats[k].tokenizer;
    size_t width = (size_t)llmc_formats[k].width, held = (size - LLMC_HEADER_BYTES) / width;
    if (header[1] != llmc_formats[k].version)
        return pdde_error(ctx, PDDE_ERR_CORRUPT, "token file %s (llm.c's format, %s tokens): header[1], the version, is %d: expected %d", path, what,
                          header[1], llmc_formats[k].version);
    if (header[2] < 0 || (size_t)header[2] != held || (size - LLMC_HEADER_BYTES) % width)
        return pdde_error(ctx, PDDE_ERR_CORRUPT, "token file %s (llm.c's format, %s tokens): header[2] says %d tokens, the file holds %zu bytes of "
                          "tokens (%zu of %zu bytes each)", path, what, header[2], size - LLMC_HEADER_BYTES, held, width);
    if (!(*tokens = malloc(held * 4 + 4))) return pdde_error(ctx, PDDE_ERR_OOM, "data: out of memory for %s", path);
    const unsigned char *p = (const unsigned char *)buf + LLMC_HEADER_BYTES;
    for (size_t i = 0; i < held; i++) {
        const unsigned char *t = p + i * width; /* (little-endian) */
        uint32_t v = (uint32_t)t[0] | (uint32_t)t[1] << 8;
        if (width == 4) v |= (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
        (*tokens)[i] = v > INT32_MAX ? -1 : (int32_t)v; /* (past int32: refused below as negative) */
    }
    *n = (int64_t)held;
    return PDDE_OK;
}

/* A text file (its bytes are the tokens), a PDDETOK1 file or an llm.c shard into *tokens, *n; every
 * token checked >= 0, the largest into *max. */
static pdde_status load_tokens(pdde_context *ctx, const char *path, int32_t **tokens, int64_t *n, int32_t *max) {
    size_t size = 0;
    pdde_status st;
    char *buf = read_file(ctx, path, "data", &size, &st);
    if (!buf) return st;
    int32_t magic = 0;
    if (size >= LLMC_HEADER_BYTES) memcpy(&magic, buf, sizeof magic);
    int llmc = -1;
    for (int k = 0; k < (int)(sizeof llmc_formats / sizeof *llmc_formats); k++)
        if (magic == llmc_formats[k].magic) llmc = k;
    *tokens = NULL;
    if (llmc >= 0) {
        st = load_llmc(ctx, path, buf, size, llmc, tokens, n);
    } else if (size >= 16 && memcmp(buf, TOKENS_MAGIC, 8) == 0) {
        uint64_t count;
        memcpy(&count, buf + 8, 8);
        if (count > (size - 16) / 4)
            st = pdde_error(ctx, PDDE_ERR_CORRUPT, "token file %s: header says %llu tokens, the file holds %zu", path, (unsigned long long)count,
                            (size - 16) / 4);
        else if ((*tokens = malloc((size_t)count * 4 + 4)))
            memcpy(*tokens, buf + 16, (size_t)count * 4), *n = (int64_t)count;
    } else {
        *tokens = malloc(size * 4 + 4);
        for (size_t i = 0; *tokens && i < size; i++) (*tokens)[i] = (uint8_t)buf[i];
        *n = (int64_t)size;
    }
    free(buf);
    if (!st && !*tokens) st = pdde_error(ctx, PDDE_ERR_OOM, "data: out of memory for %s", path);
    *max = 0;
    for (int64_t i = 0; !st && i < *n; i++) {
        if ((*tokens)[i] < 0)
            st = pdde_error(ctx, PDDE_ERR_CORRUPT, "token file %s: token %lld is %s: expected an id in [0, 2^31)", path, (long long)i,
                            llmc >= 0 ? "2^31 or more" : "negative");
        else if ((*tokens)[i] > *max) *max = (*tokens)[i];
    }
    if (st) free(*tokens), *tokens = NULL;
    return st;
}

pdde_status pdde_data_open_part(pdde_context *ctx, const char *path, double begin, double end, pdde_data **out) {
    if (!ctx) return PDDE_ERR_INVALID_ARG;
    if (!path || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "data_open: %s is NULL", !path ? "path" : "out");
    if (!(begin >= 0 && end <= 1 && begin < end))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "data_open: the part [%g, %g) is not a non-empty part of [0, 1]", begin, end);
    *out = NULL;
    int32_t *tokens = NULL, max = 0;
    int64_t n = 0;
    pdde_status st = load_tokens(ctx, path, &tokens, &n, &max);
    if (st) return st;
    int64_t b = (int64_t)(begin * (double)n), e = (int64_t)(end * (double)n);
    pdde_data *d = calloc(1, sizeof *d);
    if (!d) { free(tokens); return pdde_error(ctx, PDDE_ERR_OOM, "data: out of memory"); }
    memmove(tokens, tokens + b, (size_t)(e - b) * sizeof *tokens);
    d->ctx = ctx, d->tokens = tokens, d->n = e - b, d->max_token = max; /* (the whole file's: both parts train one vocabulary) */
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
int32_t pdde_data_max_token(const pdde_data *d) { return d ? d->max_token : -1; }
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
    int32_t *tokens = NULL, max;
    int64_t n = 0;
    pdde_status st = load_tokens(ctx, text_path, &tokens, &n, &max);
    if (st) return st;
    FILE *f = fopen(out_path, "wb");
    uint64_t count = (uint64_t)n;
    bool ok = f && fwrite(TOKENS_MAGIC, 1, 8, f) == 8 && fwrite(&count, 8, 1, f) == 1 && fwrite(tokens, 4, (size_t)n, f) == (size_t)n;
    if (f && fclose(f) != 0) ok = false;
    free(tokens);
    return ok ? PDDE_OK : pdde_error(ctx, PDDE_ERR_IO, "cannot write %s: %s", out_path, strerror(errno));
}
