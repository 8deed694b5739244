/* core/data.c — the token loader: byte-level text, pdde's token files or llm.c's shards (one file or a
 * glob of them), shuffled windows whose position checkpoints keep.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ================================================================================================
 * Data: tokens read from their files as each window needs them (pread: no copy of the corpus in
 * memory, and a file that shrinks is an error, not a crash). Batches take windows of T+1 tokens inside
 * one file at positions from a seeded permutation of all window starts (an epoch), advancing a
 * position counter that checkpoints save, so a resumed run sees exactly the batches it would have seen. */

#include <glob.h>

#define TOKENS_MAGIC "PDDETOK1"
/* llm.c's token shards (written by its dev/data scripts): 256 int32 of header (magic, version, token
 * count), then the tokens: uint16 for GPT-2's tokenizer, uint32 for LLaMA 3's. */
#define LLMC_HEADER_BYTES 1024
static const struct { int32_t magic, version, width; const char *kind; } llmc_formats[] = {
    {20240520, 1, 2, "an llm.c shard of GPT-2 tokens"},
    {20240801, 7, 4, "an llm.c shard of LLaMA 3 tokens"},
};

typedef struct {
    char *path;
    int width;            /* bytes a token: 1 (text), 2 or 4 */
    bool signed_ids;      /* int32 ids (pdde's token files), else unsigned */
    const char *kind;     /* "text", "a pdde token file", an llm.c format's */
    int64_t header;       /* bytes before the first token */
    int64_t first, n;     /* this part's tokens: [first, first + n) of the file's */
    int64_t *starts, n_starts; /* pdde_data_align_windows: where the part's documents start, ascending */
} data_file;

struct pdde_data {
    pdde_context *ctx;
    data_file *files;
    int n_files;
    int64_t n;            /* tokens of the part, over all its files */
    int32_t max_token;    /* -1 until pdde_data_max_token reads them */
    uint64_t position;    /* windows handed out so far */
    bool aligned;         /* windows only at the files' starts (pdde_data_align_windows) */
    uint8_t *buf;         /* a window's bytes as read */
    size_t buf_cap;
    int fd;               /* the file read last (-1: none): one open at a time, as a glob may match thousands */
    const data_file *fd_of;
};

/* Reads count tokens from token `at` of f's part into out[], checking each is an id in [0, 2^31); a pdde token
 * file's negative value ~id stays as it is: id, read but no target (data_id, data_target). */
static pdde_status data_read(pdde_data *d, const data_file *f, int64_t at, int64_t count, int32_t *out) {
    size_t bytes = (size_t)count * (size_t)f->width;
    if (bytes > d->buf_cap) {
        uint8_t *b = realloc(d->buf, bytes);
        if (!b) return pdde_error(d->ctx, PDDE_ERR_OOM, "data: out of memory for a window of %lld tokens", (long long)count);
        d->buf = b, d->buf_cap = bytes;
    }
    if (d->fd_of != f) {
        struct stat sb;
        pdde_status st;
        if (d->fd >= 0) close(d->fd);
        d->fd_of = NULL;
        if ((d->fd = open_regular(d->ctx, f->path, "data", &sb, &st)) < 0) return st;
        d->fd_of = f;
    }
    off_t offset = (off_t)(f->header + (f->first + at) * f->width);
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = pread(d->fd, d->buf + got, bytes - got, offset + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return pdde_error(d->ctx, PDDE_ERR_IO, "data: cannot read %s at byte %lld: %s", f->path, (long long)(offset + (off_t)got),
                              r < 0 ? strerror(errno) : "the file is shorter than when it was opened");
        got += (size_t)r;
    }
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *t = d->buf + i * f->width; /* (little-endian) */
        uint32_t v = f->width == 1 ? t[0] : (uint32_t)t[0] | (uint32_t)t[1] << 8;
        if (f->width == 4) v |= (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
        if (v > INT32_MAX && !f->signed_ids)
            return pdde_error(d->ctx, PDDE_ERR_CORRUPT, "data: %s: token %lld is %s: expected an id in [0, 2^31)", f->path,
                              (long long)(f->first + at + i), "2^31 or more");
        out[i] = (int32_t)v;
    }
    return PDDE_OK;
}

/* f's format from the first bytes of path (head, of a file of size bytes), its token count checked
 * against its size. */
static pdde_status data_file_format(pdde_context *ctx, const char *path, const uint8_t head[16], int64_t size, data_file *f) {
    int32_t header[3];
    memcpy(header, head, sizeof header);
    for (size_t k = 0; k < sizeof llmc_formats / sizeof *llmc_formats && size >= LLMC_HEADER_BYTES; k++) {
        if (header[0] != llmc_formats[k].magic) continue;
        int64_t width = llmc_formats[k].width, held = (size - LLMC_HEADER_BYTES) / width;
        f->width = (int)width, f->kind = llmc_formats[k].kind, f->header = LLMC_HEADER_BYTES, f->n = held;
        if (header[1] != llmc_formats[k].version)
            return pdde_error(ctx, PDDE_ERR_CORRUPT, "data: %s (%s): header[1], the version, is %d: expected %d", path, f->kind, header[1],
                              llmc_formats[k].version);
        if (header[2] < 0 || header[2] != held || (size - LLMC_HEADER_BYTES) % width)
            return pdde_error(ctx, PDDE_ERR_CORRUPT, "data: %s (%s): header[2] says %d tokens, the file holds %lld bytes of tokens (%lld of %lld "
                              "bytes each)", path, f->kind, header[2], (long long)(size - LLMC_HEADER_BYTES), (long long)held, (long long)width);
        return PDDE_OK;
    }
    if (size >= 16 && memcmp(head, TOKENS_MAGIC, 8) == 0) {
        uint64_t count;
        memcpy(&count, head + 8, 8);
        f->width = 4, f->signed_ids = true, f->kind = "a pdde token file", f->header = 16, f->n = (int64_t)count;
        if (count > (uint64_t)(size - 16) / 4)
            return pdde_error(ctx, PDDE_ERR_CORRUPT, "data: %s (%s): its header says %llu tokens, the file holds %lld", path, f->kind,
                              (unsigned long long)count, (long long)(size - 16) / 4);
        return PDDE_OK;
    }
    f->n = size;
    return PDDE_OK;
}

/* Opens path as one file of tokens (closed again: data_read opens it when a window needs it). */
static pdde_status data_file_open(pdde_context *ctx, const char *path, data_file *f) {
    struct stat sb;
    pdde_status st;
    *f = (data_file){.width = 1, .kind = "text"};
    int fd = open_regular(ctx, path, "data", &sb, &st);
    if (fd < 0) return st;
    int64_t size = (int64_t)sb.st_size;
    uint8_t head[16] = {0};
    if (!(f->path = strdup(path))) st = pdde_error(ctx, PDDE_ERR_OOM, "data: out of memory");
    else if (pread(fd, head, sizeof head, 0) != (ssize_t)(size < 16 ? size : 16))
        st = pdde_error(ctx, PDDE_ERR_IO, "data: cannot read %s: %s", path, strerror(errno));
    else st = data_file_format(ctx, path, head, size, f);
    close(fd);
    return st;
}

void pdde_data_close(pdde_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n_files; i++) free(d->files[i].path), free(d->files[i].starts);
    if (d->fd >= 0) close(d->fd);
    free(d->files), free(d->buf), free(d);
}

/* The files path names: itself, or where it holds a glob pattern and names no file, its matches in
 * name order (llm.c's shards: "fineweb_train_*.bin"). */
static pdde_status data_paths(pdde_context *ctx, const char *path, glob_t *g, bool *globbed) {
    struct stat sb;
    *globbed = strpbrk(path, "*?[") && stat(path, &sb) != 0;
    if (!*globbed) return PDDE_OK;
    int r = glob(path, GLOB_ERR, NULL, g);
    if (r == GLOB_NOMATCH) return pdde_error(ctx, PDDE_ERR_NOT_FOUND, "data: no file matches %s", path);
    if (r) return pdde_error(ctx, PDDE_ERR_IO, "data: cannot list the files of %s", path);
    return PDDE_OK;
}

pdde_status pdde_data_open_part(pdde_context *ctx, const char *path, double begin, double end, pdde_data **out) {
    if (!ctx) return PDDE_ERR_INVALID_ARG;
    if (!path || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "data_open: %s is NULL", !path ? "path" : "out");
    if (!(begin >= 0 && end <= 1 && begin < end))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "data_open: the part [%g, %g) is not a non-empty part of [0, 1]", begin, end);
    *out = NULL;
    glob_t g = {0};
    bool globbed;
    pdde_status st = data_paths(ctx, path, &g, &globbed);
    if (st) return st;
    int n_files = globbed ? (int)g.gl_pathc : 1;
    pdde_data *d = calloc(1, sizeof *d);
    if (d) d->ctx = ctx, d->max_token = -1, d->fd = -1, d->files = calloc((size_t)n_files, sizeof *d->files);
    if (!d || !d->files) st = pdde_error(ctx, PDDE_ERR_OOM, "data: out of memory");
    for (int i = 0; !st && i < n_files; i++) {
        st = data_file_open(ctx, globbed ? g.gl_pathv[i] : path, &d->files[i]);
        d->n_files = i + 1;
        if (!st && strcmp(d->files[i].kind, d->files[0].kind))
            st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "data: %s: %s is %s but %s is %s: one tokenizer's files only", path, d->files[0].path,
                            d->files[0].kind, d->files[i].path, d->files[i].kind);
        if (!st) d->n += d->files[i].n;
    }
    if (globbed) globfree(&g);
    if (st) {
        pdde_data_close(d);
        return st;
    }
    /* the part: [b, e) of the files' tokens one after the other */
    int64_t b = (int64_t)(begin * (double)d->n), e = (int64_t)(end * (double)d->n), at = 0;
    for (int i = 0; i < d->n_files; i++) {
        data_file *f = &d->files[i];
        int64_t lo = b - at < 0 ? 0 : b - at > f->n ? f->n : b - at, hi = e - at < 0 ? 0 : e - at > f->n ? f->n : e - at;
        at += f->n;
        f->first = lo, f->n = hi - lo;
    }
    d->n = e - b;
    *out = d;
    return PDDE_OK;
}

pdde_status pdde_data_open(pdde_context *ctx, const char *path, pdde_data **out) { return pdde_data_open_part(ctx, path, 0, 1, out); }

int64_t pdde_data_token_count(const pdde_data *d) { return d ? d->n : 0; }
int pdde_data_is_text(const pdde_data *d) {
    for (int i = 0; d && i < d->n_files; i++)
        if (strcmp(d->files[i].kind, "text")) return 0;
    return d && d->n_files > 0;
}
uint64_t pdde_data_position(const pdde_data *d) { return d ? d->position : 0; }
void pdde_data_set_position(pdde_data *d, uint64_t pos) { if (d) d->position = pos; }

/* Calls each(arg, tokens, count) on d's tokens in order, a chunk at a time. */
static pdde_status data_each_chunk(pdde_data *d, pdde_status (*each)(void *arg, const int32_t *tokens, int64_t count), void *arg) {
    enum { CHUNK = 1 << 16 };
    int32_t *chunk = malloc(CHUNK * sizeof *chunk);
    pdde_status st = chunk ? PDDE_OK : pdde_error(d->ctx, PDDE_ERR_OOM, "data: out of memory");
    for (int i = 0; i < d->n_files && !st; i++)
        for (int64_t at = 0; at < d->files[i].n && !st; at += CHUNK) {
            int64_t count = d->files[i].n - at < CHUNK ? d->files[i].n - at : CHUNK;
            st = data_read(d, &d->files[i], at, count, chunk);
            if (!st) st = each(arg, chunk, count);
        }
    free(chunk);
    return st;
}

/* A token as read: its id, and the target it gives the token before it (-1: none, ignored by the loss: a
 * prompt's, stored as ~id) */
static int32_t data_id(int32_t token) { return token < 0 ? ~token : token; }
static int32_t data_target(int32_t token) { return token < 0 ? -1 : token; }

static pdde_status note_max(void *arg, const int32_t *tokens, int64_t count) {
    int32_t *max = arg;
    for (int64_t i = 0; i < count; i++) *max = data_id(tokens[i]) > *max ? data_id(tokens[i]) : *max;
    return PDDE_OK;
}

int32_t pdde_data_max_token(pdde_data *d) {
    if (!d) return -1;
    int32_t max = 0;
    if (d->max_token < 0 && data_each_chunk(d, note_max, &max) == PDDE_OK) d->max_token = max;
    return d->max_token;
}

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

/* The windows of T + 1 tokens inside file f's part: at every token, or (aligned) at the documents' starts that
 * have T tokens after them */
static uint64_t file_windows(const pdde_data *d, const data_file *f, int T) {
    if (!d->aligned) return f->n > T ? (uint64_t)(f->n - T) : 0;
    int64_t lo = 0, hi = f->n_starts; /* (the starts at or before n - T - 1: a binary search of the ascending starts) */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (f->starts[mid] + T < f->n) lo = mid + 1;
        else hi = mid;
    }
    return (uint64_t)lo;
}

pdde_status pdde_data_align_windows(pdde_data *d, int32_t start_token) {
    if (!d) return PDDE_ERR_INVALID_ARG;
    if (start_token < 0) return pdde_error(d->ctx, PDDE_ERR_INVALID_ARG, "data_align_windows: start token %d: an id >= 0 expected", start_token);
    enum { CHUNK = 1 << 16 };
    int32_t *chunk = malloc(CHUNK * sizeof *chunk);
    pdde_status st = chunk ? PDDE_OK : pdde_error(d->ctx, PDDE_ERR_OOM, "data: out of memory");
    for (int i = 0; i < d->n_files && !st; i++) {
        data_file *f = &d->files[i];
        int64_t cap = 0, pending = -1; /* (a run of start tokens, as one document's end token and the next's start token of
                                          the same id: the document starts at the last of them) */
        free(f->starts), f->starts = NULL, f->n_starts = 0;
        for (int64_t at = 0; at < f->n && !st; at += CHUNK) {
            int64_t count = f->n - at < CHUNK ? f->n - at : CHUNK;
            st = data_read(d, f, at, count, chunk);
            for (int64_t k = 0; k < count && !st; k++) {
                if (data_id(chunk[k]) == start_token) { pending = at + k; continue; }
                if (pending < 0) continue;
                if (f->n_starts == cap) {
                    int64_t *grown = realloc(f->starts, (size_t)(cap = cap ? 2 * cap : 1024) * sizeof *grown);
                    if (!grown) { st = pdde_error(d->ctx, PDDE_ERR_OOM, "data: out of memory for %s's document starts", f->path); break; }
                    f->starts = grown;
                }
                f->starts[f->n_starts++] = pending, pending = -1;
            }
        }
    }
    free(chunk);
    if (!st) d->aligned = true, d->position = 0;
    return st;
}

pdde_status pdde_data_next_batch(pdde_data *d, int batch, int T, uint64_t seed, int32_t *x, int32_t *y) {
    if (!d || batch < 1 || T < 1 || !x || !y) return PDDE_ERR_INVALID_ARG;
    uint64_t windows = 0;
    for (int i = 0; i < d->n_files; i++) windows += file_windows(d, &d->files[i], T);
    if (!windows && d->aligned) {
        int64_t starts = 0;
        for (int i = 0; i < d->n_files; i++) starts += d->files[i].n_starts;
        return pdde_error(d->ctx, PDDE_ERR_INVALID_ARG, "data: windows at documents' starts: none of the %lld starts in %s%s has %d + 1 tokens "
                          "after it in its file", (long long)starts, d->files[0].path, d->n_files > 1 ? " and the files after it" : "", T);
    }
    if (!windows)
        return pdde_error(d->ctx, PDDE_ERR_INVALID_ARG, "data: %lld tokens %sare fewer than one window of %d + 1", (long long)d->n,
                          d->n_files > 1 ? "(no file holds more) " : "", T);
    int32_t *window = malloc(((size_t)T + 1) * sizeof *window);
    pdde_status st = window ? PDDE_OK : pdde_error(d->ctx, PDDE_ERR_OOM, "data: out of memory");
    for (int b = 0; b < batch && !st; b++) {
        uint64_t k = d->position, epoch = k / windows;
        uint64_t w = permute_index(k % windows, windows, seed + epoch * 0x632BE59BD9B4E019ull);
        int i = 0;
        while (w >= file_windows(d, &d->files[i], T)) w -= file_windows(d, &d->files[i++], T);
        if ((st = data_read(d, &d->files[i], d->aligned ? d->files[i].starts[w] : (int64_t)w, T + 1, window))) break;
        for (int k = 0; k < T; k++) x[(size_t)b * T + k] = data_id(window[k]), y[(size_t)b * T + k] = data_target(window[k + 1]);
        d->position++;
    }
    free(window);
    return st;
}

typedef struct {
    FILE *f;
    pdde_context *ctx;
    const char *path;
} token_writer;

static pdde_status write_chunk(void *arg, const int32_t *tokens, int64_t count) {
    token_writer *w = arg;
    if (fwrite(tokens, 4, (size_t)count, w->f) == (size_t)count) return PDDE_OK;
    return pdde_error(w->ctx, PDDE_ERR_IO, "cannot write %s: %s", w->path, strerror(errno));
}

pdde_status pdde_data_write_tokens(pdde_context *ctx, const char *text_path, const char *out_path) {
    if (!text_path || !out_path) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_data_write_tokens: no %s", text_path ? "output path" : "text path");
    pdde_data *d = NULL;
    pdde_status st = pdde_data_open(ctx, text_path, &d);
    if (st) return st;
    token_writer w = {fopen(out_path, "wb"), ctx, out_path};
    uint64_t count = (uint64_t)d->n;
    if (!w.f || fwrite(TOKENS_MAGIC, 1, 8, w.f) != 8 || fwrite(&count, 8, 1, w.f) != 1)
        st = pdde_error(ctx, PDDE_ERR_IO, "cannot write %s: %s", out_path, strerror(errno));
    if (!st) st = data_each_chunk(d, write_chunk, &w);
    if (w.f && fclose(w.f) != 0 && !st) st = pdde_error(ctx, PDDE_ERR_IO, "cannot write %s: %s", out_path, strerror(errno));
    pdde_data_close(d);
    return st;
}
