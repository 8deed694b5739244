/* core/checkpoint.c — checkpoints: a session's parameters and optimizer state saved to one file and loaded back.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ================================================================================================
 * Checkpoints (format in pdde.h). Parameters and optimizer state are saved; gradient accumulators
 * are not (they are zero between steps). Loading checks every name, dtype and shape first, so a
 * mismatched file changes nothing. */

#define CKPT_MAGIC "PDDECKPT"
#define CKPT_VERSION 3u /* 2 added each tensor's dist attr, 3 the learning-rate schedule; 1 and 2 still load */
#define CKPT_SCHEDULE_BYTES 28u

static bool ckpt_saved(const pdde_tensor *t) {
    return t->op == PDDE_OP_NONE && (t->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_STATE)) && !(t->flags & (PDDE_TENSOR_GRAD | PDDE_TENSOR_SPARSE));
}

/* What a load of the weights only (pdde_checkpoint_extra.weights_only) restores: parameters and the
 * persistent inputs (MoE biases), not the optimizer's state */
static bool ckpt_weight(const pdde_tensor *t) { return (t->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_INPUT)) != 0; }

/* A saved tensor the step uses, on this rank or (another pipeline stage's) on others. */
static bool ckpt_in_step(const pdde_session *s, const pdde_tensor *t) {
    return ckpt_saved(t) && (local_of(s, t) || held_elsewhere(s, t));
}

/* A directory is a sharded checkpoint (core/snapshot.c). */
static bool ckpt_is_dir(const char *path);
static pdde_status ckpt_save_dir(pdde_session *s, const char *dir, const pdde_checkpoint_extra *extra);
static pdde_status ckpt_load_dir(pdde_session *s, const char *dir, pdde_checkpoint_extra *extra);

typedef struct { FILE *f; uint32_t crc; bool ok; } ckpt_writer;

static void ckpt_put(ckpt_writer *w, const void *p, size_t n) {
    if (w->ok && fwrite(p, 1, n, w->f) != n) w->ok = false;
    w->crc = crc32_update(w->crc, p, n);
}

/* Reads the whole of t into buf (global_nbytes): under SPMD execution its blocks are all-gathered
 * along every split dim (a collective over the mesh: every rank calls it for the same tensors). */
static pdde_status read_global(pdde_session *s, const pdde_tensor *user, void *buf) {
    const pdde_tensor *t = local_of(s, user);
    pdde_status st = read_local(s, t, buf, pdde_tensor_nbytes(t));
#ifdef PDDE_HAVE_COMM
    if (st || !s->world || !t->dist.mesh || t->dtype != PDDE_F32) return st;
    int64_t shape[PDDE_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    float *tmp = malloc(pdde_tensor_nbytes(user) + sizeof(float));
    if (!tmp) return pdde_error(s->ctx, PDDE_ERR_OOM, "checkpoint: out of memory");
    for (int d = 0; d < t->ndim && !st; d++) {
        int a = t->dist.dims_mapping[d];
        if (a < 0) continue;
        int64_t n = 1;
        for (int k = 0; k < t->ndim; k++) n *= shape[k];
        st = pdde_comm_allgather(s->axis_comm[program_axis(s->prog, t->dist.mesh, a)], buf, tmp, (size_t)n, PDDE_F32);
        shape[d] *= t->dist.mesh->shape[a];
        if (!st) blocks_along((char *)tmp, buf, shape, t->ndim, d, t->dist.mesh->shape[a], sizeof(float), false);
    }
    free(tmp);
#endif
    return st;
}

/* What kind of file a stat describes, for messages that refuse it. */
static const char *file_kind(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device" :
           S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* Opens path for reading if it is a regular file. The type is checked before opening (opening a
 * device can have effects of its own) and again on the descriptor (the path may change in between);
 * O_NONBLOCK keeps a FIFO from blocking the open. Returns the descriptor, or -1 with *st set. */
static int open_regular(pdde_context *ctx, const char *path, const char *what, struct stat *sb, pdde_status *st) {
    if (stat(path, sb) != 0) {
        *st = pdde_error(ctx, errno == ENOENT ? PDDE_ERR_NOT_FOUND : PDDE_ERR_IO, "%s: cannot open %s: %s", what, path, strerror(errno));
        return -1;
    }
    int fd = S_ISREG(sb->st_mode) ? open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
    if (fd >= 0 && fstat(fd, sb) != 0) close(fd), fd = -1;
    if (fd < 0 && S_ISREG(sb->st_mode)) {
        *st = pdde_error(ctx, errno == ENOENT ? PDDE_ERR_NOT_FOUND : PDDE_ERR_IO, "%s: cannot open %s: %s", what, path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(sb->st_mode)) {
        if (fd >= 0) close(fd);
        *st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s is %s, not a regular file", what, path, file_kind(sb->st_mode));
        return -1;
    }
    return fd;
}

/* Creates tmp to be renamed over path later: path, if it exists, and tmp must be regular files (a
 * rename over a device node or a FIFO would replace it; opening a FIFO would block). */
static pdde_status create_regular(pdde_context *ctx, const char *path, const char *tmp, FILE **out) {
    struct stat sb;
    for (int k = 0; k < 2; k++)
        if (stat(k ? tmp : path, &sb) == 0 && !S_ISREG(sb.st_mode))
            return pdde_error(ctx, PDDE_ERR_IO, "checkpoint: %s is %s, not a regular file", k ? tmp : path, file_kind(sb.st_mode));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) return pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return pdde_error(ctx, PDDE_ERR_IO, "checkpoint: %s is %s, not a regular file", tmp, file_kind(sb.st_mode));
    }
    if (!(*out = fdopen(fd, "wb"))) {
        close(fd);
        return pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
    }
    return PDDE_OK;
}

pdde_status pdde_checkpoint_save(pdde_session *s, const char *path, const pdde_checkpoint_extra *extra) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (!path) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "checkpoint_save: path is NULL");
    if (ckpt_is_dir(path)) return ckpt_save_dir(s, path, extra);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "checkpoint: path too long");
    /* under SPMD execution the file holds whole tensors, written by rank 0 after the others helped
     * gather them, so it loads under any other plan (or none) */
#ifdef PDDE_HAVE_COMM
    bool writer = !s->world || pdde_comm_rank(s->world) == 0;
#else
    bool writer = true;
#endif
    ckpt_writer w = {NULL, 0, true};
    if (writer) {
        pdde_status cst = create_regular(s->ctx, path, tmp, &w.f);
        if (cst) return cst;
    }
    if (!writer) w.ok = false; /* nothing is written here */
    uint32_t version = CKPT_VERSION, count = 0;
    for (int i = 0; i < s->g->n; i++) count += ckpt_in_step(s, s->g->nodes[i]);
    uint64_t step = (uint64_t)s->step, pos = extra ? extra->data_position : 0, rng[2] = {s->ctx->seed, s->run_counter};
    ckpt_put(&w, CKPT_MAGIC, 8), ckpt_put(&w, &version, 4), ckpt_put(&w, &count, 4);
    ckpt_put(&w, &step, 8), ckpt_put(&w, &pos, 8), ckpt_put(&w, rng, 16);
    const pdde_optimizer_params *sc = &s->schedule;
    uint32_t kind = (uint32_t)sc->schedule;
    int64_t warmup = sc->warmup_steps, total = sc->total_steps;
    ckpt_put(&w, &kind, 4), ckpt_put(&w, &sc->lr, 4), ckpt_put(&w, &sc->min_lr_ratio, 4), ckpt_put(&w, &warmup, 8), ckpt_put(&w, &total, 8);
    void *buf = NULL;
    size_t cap = 0;
    pdde_status st = PDDE_OK;
    for (int i = 0; i < s->g->n && st == PDDE_OK; i++) {
        pdde_tensor *t = s->g->nodes[i];
        if (!ckpt_in_step(s, t)) continue;
        uint16_t name_len = (uint16_t)strlen(t->name);
        uint8_t dtype = (uint8_t)t->dtype, ndim = (uint8_t)t->ndim;
        uint64_t nbytes = pdde_tensor_nbytes(t); /* (the user's graph holds global shapes) */
        if (nbytes > cap) {
            void *nb = realloc(buf, nbytes);
            if (!nb) { st = pdde_error(s->ctx, PDDE_ERR_OOM, "checkpoint: out of memory"); break; }
            buf = nb, cap = nbytes;
        }
        if (local_of(s, t) && (st = read_global(s, t, buf))) break;
#ifdef PDDE_HAVE_COMM
        /* another pipeline stage's tensor: its mesh's first rank sends the whole of it to the writer */
        if (s->world && t->dist.mesh && mesh_index_of(t->dist.mesh, 0) < 0) {
            int holder = t->dist.mesh->ranks[0], tag = t->id & 0xfffff;
            size_t count = nbytes / pdde_dtype_size(t->dtype);
            if (s->prog->rank == holder) st = pdde_comm_send(s->world, buf, count, t->dtype, 0, tag);
            else if (writer) st = pdde_comm_recv(s->world, buf, count, t->dtype, holder, tag);
            if (st) break;
        }
#endif
        char attr[160] = ""; /* the layout it was saved from (the data is the whole tensor whatever it says) */
        if (t->dist.mesh) pdde_dist_attr_str(&t->dist, attr, sizeof attr);
        uint16_t attr_len = (uint16_t)strlen(attr);
        ckpt_put(&w, &name_len, 2), ckpt_put(&w, t->name, name_len), ckpt_put(&w, &dtype, 1), ckpt_put(&w, &ndim, 1);
        ckpt_put(&w, t->shape, 8 * (size_t)ndim), ckpt_put(&w, &attr_len, 2), ckpt_put(&w, attr, attr_len);
        ckpt_put(&w, &nbytes, 8), ckpt_put(&w, buf, nbytes);
    }
    free(buf);
    if (writer) {
        uint32_t crc = w.crc;
        if (w.ok) w.ok = fwrite(&crc, 1, 4, w.f) == 4;
        if (w.ok) w.ok = fflush(w.f) == 0 && fsync(fileno(w.f)) == 0;
        if (fclose(w.f) != 0) w.ok = false;
        if (st == PDDE_OK && !w.ok) st = pdde_error(s->ctx, PDDE_ERR_IO, "checkpoint: cannot write %s: %s", tmp, strerror(errno));
        if (st == PDDE_OK && rename(tmp, path) != 0) st = pdde_error(s->ctx, PDDE_ERR_IO, "checkpoint: cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (st != PDDE_OK) unlink(tmp);
    }
#ifdef PDDE_HAVE_COMM
    if (s->world && st == PDDE_OK) st = pdde_comm_barrier(s->world); /* the file exists for every rank */
#endif
    return st;
}

/* Reads a whole regular file; NULL with an error on failure. */
static char *read_file(pdde_context *ctx, const char *path, const char *what, size_t *size, pdde_status *st) {
    struct stat sb;
    int fd = open_regular(ctx, path, what, &sb, st);
    if (fd < 0) return NULL;
    size_t len = (size_t)sb.st_size, got = 0;
    int err = 0;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        *st = pdde_error(ctx, PDDE_ERR_OOM, "%s: no memory for the %zu bytes of %s", what, len, path);
        return NULL;
    }
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) err = errno;
        if (n <= 0) break; /* an error, or the file shrank while we read it */
        got += (size_t)n;
    }
    close(fd);
    if (got != len) {
        *st = pdde_error(ctx, PDDE_ERR_IO, "%s: cannot read %s: %s", what, path, err ? strerror(err) : "it shrank while being read");
        free(buf);
        return NULL;
    }
    *size = len, *st = PDDE_OK;
    return buf;
}

pdde_status pdde_checkpoint_load(pdde_session *s, const char *path, pdde_checkpoint_extra *extra) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (!path) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "checkpoint_load: path is NULL");
    if (ckpt_is_dir(path)) return ckpt_load_dir(s, path, extra);
    size_t size = 0;
    pdde_status st;
    char *buf = read_file(s->ctx, path, "checkpoint", &size, &st);
    if (!buf) return st;
    size_t header = 8 + 4 + 4 + 8 + 8 + 16;
    uint32_t version, count, crc;
    if (size < header + 4 || memcmp(buf, CKPT_MAGIC, 8) != 0) {
        free(buf);
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "checkpoint %s: not a pdde checkpoint (bad magic or too short)", path);
    }
    memcpy(&version, buf + 8, 4), memcpy(&count, buf + 12, 4), memcpy(&crc, buf + size - 4, 4);
    if (version < 1 || version > CKPT_VERSION) {
        free(buf);
        return pdde_error(s->ctx, PDDE_ERR_VERSION, "checkpoint %s: version %u, this build reads versions 1 to %u", path, version, CKPT_VERSION);
    }
    if (version >= 3) header += CKPT_SCHEDULE_BYTES;
    if (size < header + 4) {
        free(buf);
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "checkpoint %s: too short for its version %u header", path, version);
    }
    if (crc32_update(0, buf, size - 4) != crc) {
        free(buf);
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "checkpoint %s: checksum mismatch (truncated or damaged)", path);
    }
    /* pass 0 validates every record against the session (each of its tensors exactly once), pass 1
     * writes the data */
    bool *seen = calloc((size_t)s->g->n + 1, sizeof *seen), weights_only = extra && extra->weights_only;
    if (!seen) { free(buf); return pdde_error(s->ctx, PDDE_ERR_OOM, "checkpoint: out of memory"); }
    for (int pass = 0; pass < 2; pass++) {
        size_t at = header;
        for (uint32_t k = 0; k < count; k++) {
            uint16_t name_len;
            uint8_t dtype, ndim;
            uint64_t nbytes;
            int64_t shape[PDDE_MAX_DIMS];
            char name[sizeof ((pdde_tensor *)0)->name];
            if (at + 2 > size - 4) goto truncated;
            memcpy(&name_len, buf + at, 2), at += 2;
            if (name_len >= sizeof name || at + name_len + 2 > size - 4) goto truncated;
            memcpy(name, buf + at, name_len), name[name_len] = 0, at += name_len;
            dtype = (uint8_t)buf[at], ndim = (uint8_t)buf[at + 1], at += 2;
            if (ndim > PDDE_MAX_DIMS || at + 8u * ndim + 8 > size - 4) goto truncated;
            memcpy(shape, buf + at, 8u * ndim), at += 8u * ndim;
            if (version >= 2) { /* the saving plan's attr: informative, loading reshards to this plan */
                uint16_t attr_len;
                memcpy(&attr_len, buf + at, 2), at += 2;
                if (at + attr_len + 8 > size - 4) goto truncated;
                at += attr_len;
            }
            memcpy(&nbytes, buf + at, 8), at += 8;
            if (nbytes > size - 4 - at) goto truncated;
            pdde_tensor *t = pdde_graph_find(s->g, name);
            /* the loss scale goes with f16 training: a file of another precision's run loads without it */
            if ((!t || !ckpt_in_step(s, t)) && strcmp(name, "loss.grad_seed") == 0) { at += nbytes; continue; }
            if (weights_only && (!t || !ckpt_weight(t))) { at += nbytes; continue; } /* (the saving run's optimizer state) */
            if (!t || !ckpt_in_step(s, t)) {
                free(buf), free(seen);
                return pdde_error(s->ctx, PDDE_ERR_MISMATCH, "checkpoint %s: tensor %s is not in this model", path, name);
            }
            if (pass == 0 && seen[t->id]) {
                free(buf), free(seen);
                return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "checkpoint %s: tensor %s is stored twice", path, name);
            }
            seen[t->id] = true;
            bool same = t->ndim == ndim && t->dtype == dtype && pdde_tensor_nbytes(t) == nbytes;
            for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
            if (!same) {
                char want[96], have[96];
                shape_str(t, want, sizeof want), dims_str(ndim, shape, have, sizeof have);
                free(buf), free(seen);
                return pdde_error(s->ctx, PDDE_ERR_MISMATCH, "checkpoint %s: tensor %s is %s %s there, the model's is %s %s (another model's checkpoint?)",
                                  path, name, pdde_dtype_name(dtype), have, pdde_dtype_name(t->dtype), want);
            }
            if (pass == 1 && (st = pdde_session_write_global(s, t, buf + at, nbytes))) { free(buf), free(seen); return st; } /* (ignored by other stages) */
            at += nbytes;
        }
        if (at != size - 4) {
            free(buf), free(seen);
            return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "checkpoint %s: %zu bytes after the last of its %u records", path, size - 4 - at, count);
        }
        for (int i = 0; pass == 0 && i < s->g->n; i++)
            if (ckpt_in_step(s, s->g->nodes[i]) && !seen[i] && s->g->nodes[i] != s->g->grad_seed && (!weights_only || ckpt_weight(s->g->nodes[i]))) {
                free(buf), free(seen);
                return pdde_error(s->ctx, PDDE_ERR_MISMATCH, "checkpoint %s: tensor %s of the model is missing", path, s->g->nodes[i]->name);
            }
    }
    free(seen);
    if (weights_only) return free(buf), PDDE_OK; /* (step, schedule, position and loss scale: the session's own) */
    uint64_t step, pos, rng[2];
    memcpy(&step, buf + 16, 8), memcpy(&pos, buf + 24, 8), memcpy(rng, buf + 32, 16);
    s->step = (int64_t)step;
    s->run_counter = (uint32_t)rng[1];
    pdde_optimizer_params saved = s->g->opt; /* (a file without a schedule: the graph's) */
    if (version >= 3) {
        const char *at = buf + 48;
        uint32_t kind;
        memcpy(&kind, at, 4), memcpy(&saved.lr, at + 4, 4), memcpy(&saved.min_lr_ratio, at + 8, 4);
        memcpy(&saved.warmup_steps, at + 12, 8), memcpy(&saved.total_steps, at + 20, 8);
        saved.schedule = (pdde_lr_schedule)kind;
    }
    const pdde_optimizer_params *now = &s->g->opt;
    bool differs = s->g->has_optimizer && (saved.lr != now->lr || saved.schedule != now->schedule || saved.warmup_steps != now->warmup_steps ||
                                           saved.total_steps != now->total_steps || saved.min_lr_ratio != now->min_lr_ratio);
    s->schedule = extra && extra->use_graph_schedule ? *now : saved;
    if (extra) extra->data_position = pos, extra->schedule = saved, extra->schedule_differs = differs;
    free(buf);
    return s->loss_scaling ? scaler_load(s) : PDDE_OK;
truncated:
    free(buf), free(seen);
    return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "checkpoint %s: a tensor record runs past the end of the file", path);
}
