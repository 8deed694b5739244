/* dlrm — Demonstrates how to train a recommender with parameter servers: the DLRM-style CTR model of
 * dlrm.h on Criteo-format data (or synthetic data from a known logistic ground truth), its sparse
 * table on server ranks.
 *
 *   ./build/dlrm --synthetic 100000                      one process (in-process table)
 *   ./build/pdde-run -n 4 ./build/dlrm --servers 2 --mode sync --synthetic 100000
 *                                                         ranks 0-1 serve the table, 2-3 train
 *   ./build/dlrm --data day_0.tsv --epochs 1             a Criteo file
 *   ./build/dlrm --device cuda --synthetic 100000        the dense network on the GPU (under a launcher:
 *                                                         each rank its local rank's)
 * Reports loss, samples/s and an ETA while training, then AUC and logloss on the held-out part (and,
 * on synthetic data, those of the ground truth: the best any model can do). SIGTERM, SIGINT or SIGUSR1
 * (examples/stop_signals.h) stop every worker after the same step (--pipeline: at its next checkpoint
 * boundary), with a checkpoint there under --checkpoint; every rank then exits with 128 + the signal. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/dlrm.h"
#include "examples/stop_signals.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

typedef struct {
    const char *data, *save_dir, *load_dir, *dense_on, *ckpt_dir, *cluster, *device;
    long ckpt_every;
    long synthetic;
    int vocab, epochs, servers, staleness, geo_steps;
    double test_fraction;
    pdde_ps_mode mode;
    int local, dense_on_servers, pipeline, share_device;
    pdde_ps_optimizer optimizer;
    float table_lr;
    dlrm_config cfg;
} options;

static void usage(void) {
    puts("usage: dlrm [--data FILE | --synthetic N [--vocab V]] [--epochs E] [--batch B] [--dim D] [--hidden H]\n"
         "            [--lr X] [--table-lr X] [--optimizer sgd|adagrad|adam] [--test-fraction F]\n"
         "            [--mode local|sync|async|geo] [--servers N] [--staleness K] [--geo-steps K]\n"
         "            [--save DIR] [--load DIR] [--checkpoint DIR --checkpoint-every N]\n"
         "            [--device cuda|opencl|level_zero|cpu|auto|BACKEND:N [--share-device]] [--dense-on BACKEND]\n"
         "            [--dense-on-servers 0|1] [--pipeline SLOTS [--cluster FILE]]\n"
         "Under pdde-run (or mpirun), ranks 0..servers-1 serve the table and the others train\n"
         "(--servers, or PDDE_PS_SERVERS in the environment; without a launcher --mode trains in one process).\n"
         "--save DIR: the table's shards and the dense network (DIR/dense.ckpt) at the end; --load DIR starts\n"
         "from them (under any --servers count: the table is re-partitioned). --checkpoint DIR: every N steps\n"
         "(default 1000) and at the end, the whole model (table, dense network\n"
         "with its optimizer state, the data position) in DIR/samples-S (S samples trained on), named by DIR/latest\n"
         "once complete; --load DIR on such a DIR resumes there (sync: the model an uninterrupted run ends with).\n"
         "SIGTERM, SIGUSR1 or Ctrl-C: every worker stops after the same step (--pipeline: at its next checkpoint,\n"
         "every --checkpoint-every steps and at each epoch's end), saved there with --checkpoint; exit 128 + the signal.\n--pipeline: train "
         "through the asynchronous pipeline (pull, dense, push on their own threads) with SLOTS batches in flight;\n"
         "--cluster: its stages sized by the cost model on a pdde-bench cluster file (else a measured balance).\n"
         "--device: where the dense network runs (the table and its rows stay in host memory); default\n"
         "$PDDE_DEVICE, else auto (the device the cost model predicts fastest, with --cluster's or\n"
         "build/cluster.json's figures); under a launcher each rank takes its local rank's device of that\n"
         "backend; --share-device lets more ranks than devices share them. --dense-on BACKEND: the same,\n"
         "shared where a host has fewer devices than ranks.");
}

/* The pipeline's stage 1 source: batch k of this worker (epochs wrap around). */
typedef struct { const dlrm_sample *samples; long per_epoch; int nw, w, batch; } worker_batches;
static pdde_status worker_batch(void *u, int64_t k, dlrm_sample *out) {
    const worker_batches *b = u;
    memcpy(out, b->samples + ((k % b->per_epoch) * b->nw + b->w) * b->batch, (size_t)b->batch * sizeof *out);
    return PDDE_OK;
}

/* v as a whole number (long) or a finite number (double) into *out; -1, saying which flag, when it is not one */
static int flag_long(const char *flag, const char *v, long *out) {
    char *end;
    errno = 0;
    *out = strtol(v, &end, 10);
    if (end != v && !*end && !errno) return 0;
    fprintf(stderr, "dlrm: %s wants a whole number, got '%s'\n", flag, v);
    return -1;
}
static int flag_double(const char *flag, const char *v, double *out) {
    char *end;
    *out = strtod(v, &end);
    if (end != v && !*end && isfinite(*out)) return 0;
    fprintf(stderr, "dlrm: %s wants a number, got '%s'\n", flag, v);
    return -1;
}

static int parse(int argc, char **argv, options *o) {
    const char *env_servers = getenv("PDDE_PS_SERVERS"); /* (what a launcher's --servers would set) */
    long env_n = 1;
    if (env_servers && flag_long("PDDE_PS_SERVERS", env_servers, &env_n)) return -1;
    *o = (options){.vocab = 1000, .epochs = 1, .servers = (int)env_n, .staleness = 2, .geo_steps = 4, .test_fraction = 0.1,
                   .mode = PDDE_PS_SYNC, .local = 1, .optimizer = PDDE_PS_ADAGRAD, .table_lr = 0.05f,
                   .cfg = DLRM_CONFIG_INIT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) { usage(); exit(0); }
        if (!strcmp(a, "--share-device")) { o->share_device = 1; continue; }
        if (!v) { fprintf(stderr, "dlrm: %s needs a value\n", a); return -1; }
        i++;
        long n = 0;
        double x = 0;
        int bad = 0; /* (each numeric flag read whole: "64x" or "abc" is refused, not read as 64 or 0) */
        if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--synthetic")) bad = flag_long(a, v, &n), o->synthetic = n;
        else if (!strcmp(a, "--vocab")) bad = flag_long(a, v, &n), o->vocab = (int)n;
        else if (!strcmp(a, "--epochs")) bad = flag_long(a, v, &n), o->epochs = (int)n;
        else if (!strcmp(a, "--batch")) bad = flag_long(a, v, &n), o->cfg.batch = (int)n;
        else if (!strcmp(a, "--dim")) bad = flag_long(a, v, &n), o->cfg.dim = (int)n;
        else if (!strcmp(a, "--hidden")) bad = flag_long(a, v, &n), o->cfg.hidden = (int)n;
        else if (!strcmp(a, "--lr")) bad = flag_double(a, v, &x), o->cfg.lr = (float)x;
        else if (!strcmp(a, "--table-lr")) bad = flag_double(a, v, &x), o->table_lr = (float)x;
        else if (!strcmp(a, "--test-fraction")) bad = flag_double(a, v, &x), o->test_fraction = x;
        else if (!strcmp(a, "--servers")) bad = flag_long(a, v, &n), o->servers = (int)n;
        else if (!strcmp(a, "--staleness")) bad = flag_long(a, v, &n), o->staleness = (int)n;
        else if (!strcmp(a, "--geo-steps")) bad = flag_long(a, v, &n), o->geo_steps = (int)n;
        else if (!strcmp(a, "--save")) o->save_dir = v;
        else if (!strcmp(a, "--load")) o->load_dir = v;
        else if (!strcmp(a, "--dense-on")) o->dense_on = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--checkpoint")) o->ckpt_dir = v;
        else if (!strcmp(a, "--dense-on-servers")) bad = flag_long(a, v, &n), o->dense_on_servers = (int)n;
        else if (!strcmp(a, "--pipeline")) bad = flag_long(a, v, &n), o->pipeline = (int)n;
        else if (!strcmp(a, "--cluster")) o->cluster = v;
        else if (!strcmp(a, "--checkpoint-every")) bad = flag_long(a, v, &n), o->ckpt_every = n;
        else if (!strcmp(a, "--optimizer")) {
            if (!strcmp(v, "sgd")) o->optimizer = PDDE_PS_SGD;
            else if (!strcmp(v, "adagrad")) o->optimizer = PDDE_PS_ADAGRAD;
            else if (!strcmp(v, "adam")) o->optimizer = PDDE_PS_ADAM;
            else { fprintf(stderr, "dlrm: --optimizer %s: expected sgd, adagrad or adam\n", v); return -1; }
        } else if (!strcmp(a, "--mode")) {
            o->local = !strcmp(v, "local");
            if (!strcmp(v, "sync")) o->mode = PDDE_PS_SYNC;
            else if (!strcmp(v, "async")) o->mode = PDDE_PS_ASYNC;
            else if (!strcmp(v, "geo")) o->mode = PDDE_PS_GEO;
            else if (!o->local) { fprintf(stderr, "dlrm: --mode %s: expected local, sync, async or geo\n", v); return -1; }
        } else { fprintf(stderr, "dlrm: unknown option %s (--help lists them)\n", a); return -1; }
        if (bad) return -1;
    }
    if (o->data && o->synthetic) { /* (synthetic data is written to a file: it would replace the data) */
        fprintf(stderr, "dlrm: --data %s and --synthetic: one or the other\n", o->data);
        return -1;
    }
    if (o->synthetic < 0 || o->staleness < 0 || o->geo_steps < 1 || o->ckpt_every < 0) {
        fprintf(stderr, "dlrm: --synthetic, --staleness and --checkpoint-every must be >= 0, --geo-steps >= 1\n");
        return -1;
    }
    /* (here, not at the first checkpoint or after the whole run) */
    if (o->ckpt_dir && mkdir(o->ckpt_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "dlrm: --checkpoint %s: %s\n", o->ckpt_dir, strerror(errno));
        return -1;
    }
    if (o->save_dir && mkdir(o->save_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "dlrm: --save %s: %s\n", o->save_dir, strerror(errno));
        return -1;
    }
    if (o->pipeline < 0 || o->pipeline > 16) { fprintf(stderr, "dlrm: --pipeline %d: expected 0 (off) to 16 slots\n", o->pipeline); return -1; }
    if (o->cfg.batch <= 0 || o->cfg.dim <= 0 || o->cfg.hidden <= 0 || o->epochs <= 0 || o->servers <= 0 ||
        o->vocab <= 0 || o->test_fraction < 0 || o->test_fraction >= 1) {
        fprintf(stderr, "dlrm: batch, dim, hidden, epochs, servers and vocab must be positive, test-fraction in [0, 1)\n");
        return -1;
    }
    if (!o->data && !o->synthetic) o->synthetic = 100000;
    return 0;
}

/* Removes dir/name: a file, or a folder of files (a checkpoint's). */
static void remove_entry(const char *dir, const char *name) {
    char path[1024], file[1400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) snprintf(file, sizeof file, "%s/%s", path, e->d_name), unlink(file);
    if (d) closedir(d), rmdir(path);
    else unlink(path);
}

/* Where --load DIR's model is: DIR/<what DIR/latest names> for a --checkpoint folder (*resume = 1),
 * else DIR itself (a --save folder). -1 (said) when `latest` names no checkpoint. */
static int load_source(const char *dir, char *out, size_t n, int *resume) {
    char path[600], name[256] = "";
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    *resume = f != NULL;
    if (!f) return snprintf(out, n, "%s", dir), 0;
    int ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\n")] = 0;
    if (!ok || !name[0] || strchr(name, '/')) { fprintf(stderr, "dlrm: --load %s: %s does not name a checkpoint\n", dir, path); return -1; }
    snprintf(out, n, "%s/%s", dir, name);
    return 0;
}

/* A whole checkpoint into dir once `position` samples (of every worker) are trained on: the servers'
 * table shards and the dense network with its optimizer state and the position go to
 * dir/samples-N.tmp, renamed dir/samples-N once complete; then dir/latest (written, then renamed)
 * names it and the older ones are removed. A kill at any moment leaves latest naming a whole
 * checkpoint. (Named by the position, not the step: a run resumed with other workers or batches
 * writes only positions past the one latest names.) */
static pdde_status write_checkpoint(pdde_context *ctx, pdde_session *s, pdde_ps_client *c, const char *dir, uint64_t position) {
    char name[64], tmp[700], final[700], path[800];
    snprintf(name, sizeof name, "samples-%llu", (unsigned long long)position);
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name), snprintf(final, sizeof final, "%s/%s", dir, name);
    snprintf(path, sizeof path, "%s.tmp", name);
    remove_entry(dir, path); /* (what a killed attempt left) */
    if (mkdir(tmp, 0755)) return pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
    pdde_status st = pdde_ps_client_flush(c); /* (geo: this worker's pending deltas into the table) */
    if (!st) st = pdde_ps_client_save(c, tmp);
    pdde_checkpoint_extra extra = {.data_position = position};
    snprintf(path, sizeof path, "%s/dense.ckpt", tmp);
    if (!st) st = pdde_checkpoint_save(s, path, &extra);
    if (st) return st;
    remove_entry(dir, name); /* (one of this position that latest never named) */
    if (rename(tmp, final)) return pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot rename %s: %s", tmp, strerror(errno));
    snprintf(path, sizeof path, "%s/latest.tmp", dir);
    FILE *f = fopen(path, "w");
    int ok = f && fprintf(f, "%s\n", name) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f)) ok = 0;
    char latest[700];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    if (!ok || rename(path, latest)) return pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot write %s: %s", latest, strerror(errno));
    DIR *d = opendir(dir); /* the checkpoints before it */
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "samples-", 8) && strcmp(e->d_name, name)) remove_entry(dir, e->d_name);
    if (d) closedir(d);
    return PDDE_OK;
}

/* The signal to stop after this step for (0: none): the largest any worker caught (catch_stop_signals), agreed
 * over the workers (one 4-byte allreduce; NULL: one worker) so that every worker stops after the same step. */
static pdde_status agree_stop(pdde_comm *workers, int *stopped_by) {
    int32_t stop = stop_signal;
    pdde_status st = workers && pdde_comm_size(workers) > 1 ? pdde_comm_allreduce(workers, &stop, &stop, 1, PDDE_I32, PDDE_REDUCE_MAX) : PDDE_OK;
    if (!st) *stopped_by = stop;
    return st;
}

/* The signal the job stopped for, the same on the servers and the lead worker (the servers see no step):
 * the largest of theirs, agreed once the servers have served every worker (servers_lead: those ranks;
 * NULL: one process) so that every process exits with 128 + it. */
static int job_stop_signal(pdde_comm *servers_lead, int own) {
    int32_t sig = own;
    if (servers_lead && pdde_comm_status(servers_lead) == PDDE_OK &&
        pdde_comm_allreduce(servers_lead, &sig, &sig, 1, PDDE_I32, PDDE_REDUCE_MAX))
        sig = own;
    return sig;
}

int main(int argc, char **argv) {
    options o = {0}; /* (parse fills it; zeroed for the compilers that cannot see that) */
    if (parse(argc, argv, &o)) return 2;
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) { fprintf(stderr, "dlrm: no context\n"); return 1; }
    pdde_comm *world = NULL, *workers = NULL, *servers_lead = NULL;
    int rank = 0, size = 1;
    if (getenv("PDDE_WORLD_SIZE") || getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) {
        if (pdde_comm_init(ctx, NULL, &world)) { fprintf(stderr, "dlrm: %s\n", pdde_last_error(ctx)); return 1; }
        rank = pdde_comm_rank(world), size = pdde_comm_size(world);
        o.local = size == 1;
    }
    if (!world && !o.local) { /* (as a launcher's single rank does) */
        fprintf(stderr, "dlrm: no launcher: one process, its table in-process (server ranks: ./build/pdde-run -n N ./build/dlrm --servers S ..., N > S)\n");
        o.local = 1;
    }
    if (!o.local && size <= o.servers) {
        fprintf(stderr, "dlrm: %d ranks leave no worker beside %d servers: start more ranks than --servers (pdde-run -n %d or more) or pass fewer\n",
                size, o.servers, o.servers + 1);
        return 2;
    }
    char load_dir[600];
    int resume = 0;
    if (o.load_dir && load_source(o.load_dir, load_dir, sizeof load_dir, &resume)) return 2;
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.mode = o.mode, pp.n_servers = o.local ? 1 : o.servers, pp.staleness = o.staleness, pp.geo_steps = o.geo_steps;
    pp.table.dim = o.cfg.dim, pp.table.optimizer = o.optimizer, pp.table.lr = o.table_lr, pp.table.init_std = 0.01f;
    pp.table.seed = 1;
    pp.load_dir = o.load_dir ? load_dir : NULL;
    long ckpt_every = o.ckpt_every > 0 ? o.ckpt_every : 1000; /* (the worker that leads writes them, servers' shards included) */
    int rc = 0;
    if (world && !o.local) {
        pdde_comm_split(world, rank < o.servers ? PDDE_COMM_NO_COLOR : 1, rank, &workers);
        pdde_comm_split(world, rank <= o.servers ? 1 : PDDE_COMM_NO_COLOR, rank, &servers_lead); /* (the lead: rank o.servers) */
    }
    if (!o.local && rank < o.servers) { /* a server */
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &pp, rank, &srv);
        /* a signal to every rank (a scheduler's, pdde-run's): served on until the workers have stopped and saved
         * (a server's alone: until they end; a second one ends it at once) */
        catch_stop_signals();
        if (!st) st = pdde_ps_server_run(srv, world);
        pdde_ps_server_stats ss;
        if (!st) {
            pdde_ps_server_stats_get(srv, &ss);
            printf("server %d: %lld rows, %.1f bytes per row, %lld pushes, %lld pulls, max staleness %lld\n", rank,
                   (long long)ss.table.rows, ss.table.rows ? (double)ss.table.bytes / (double)ss.table.rows : 0.0,
                   (long long)ss.pushes, (long long)ss.pulls, (long long)ss.max_staleness);
        } else fprintf(stderr, "dlrm: server %d: %s\n", rank, pdde_last_error(ctx));
        pdde_ps_server_free(srv);
        int sig = job_stop_signal(servers_lead, stop_signal);
        pdde_comm_free(servers_lead);
        pdde_comm_free(world);
        pdde_context_free(ctx);
        return st ? 1 : sig ? 128 + sig : 0;
    }
    int w = o.local ? 0 : rank - o.servers, nw = o.local ? 1 : size - o.servers, lead = w == 0;

    /* data */
    char path[512];
    double *p_true = NULL;
    if (o.synthetic) {
        /* every rank writes its own copy (the same data), in a file of its own removed once read: no rank
         * waits for another's file, and a second run at once, or one from any folder, reads only its samples */
        const char *tmpdir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/pdde-dlrm-synthetic.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
        int fd = mkstemp(path);
        if (fd < 0) {
            fprintf(stderr, "dlrm: cannot create %s for the synthetic samples: %s (TMPDIR names a writable folder)\n", path, strerror(errno));
            return 1;
        }
        close(fd);
        p_true = malloc((size_t)o.synthetic * sizeof *p_true);
        if (!p_true || dlrm_synthesize(path, o.synthetic, o.vocab, 1, p_true)) return unlink(path), 1;
    } else snprintf(path, sizeof path, "%s", o.data);
    long n = 0, malformed = 0;
    double t_read = dlrm_seconds(CLOCK_MONOTONIC);
    dlrm_sample *samples = dlrm_load(path, &n, &malformed);
    if (o.synthetic) unlink(path), snprintf(path, sizeof path, "synthetic (--vocab %d)", o.vocab);
    if (!samples || n < 2L * o.cfg.batch) { fprintf(stderr, "dlrm: %s: %ld samples, need at least 2 batches\n", path, n); return 1; }
    long n_test = (long)((double)n * o.test_fraction), n_train = n - n_test;
    if (lead) printf("data: %s: %ld samples (%ld malformed lines skipped), %ld for training, %ld held out; read in %.1f s\n",
                     path, n, malformed, n_train, n_test, dlrm_seconds(CLOCK_MONOTONIC) - t_read);

    /* model */
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_sparse_batch *sb = NULL;
    pdde_ps_client *c = NULL;
    dlrm_model m = {0};
    pdde_graph_init(ctx, &g);
    if (o.dense_on_servers) o.cfg.dense = DLRM_DENSE_ON_SERVERS;
    pdde_status st = dlrm_build(g, &o.cfg, &m);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    int layer_dev[2] = {0, 0};
    if (!st) {
        /* this rank's device for the dense layers: --dense-on's backend (shared where the host has fewer),
         * else --device's, $PDDE_DEVICE's or auto's (as gpt --device), auto timing this graph with the
         * cluster file's figures where there is one */
        pdde_device_select_params ds = PDDE_DEVICE_SELECT_PARAMS_INIT;
        pdde_device_choice dc;
        pdde_cluster *measured = NULL;
        const char *cpath = o.cluster ? o.cluster : "build/cluster.json";
        FILE *cf = o.dense_on ? NULL : fopen(cpath, "r");
        if (cf) fclose(cf), pdde_cluster_load(ctx, cpath, &measured); /* (unreadable: timed by kind) */
        ds.backend = o.dense_on ? o.dense_on : o.device, ds.share = o.dense_on ? 1 : o.share_device;
        ds.graph = g, ds.cluster = measured;
        /* the servers use no device: a worker counts among its host's workers (the servers are the first
         * ranks, on the first host) */
        pdde_comm_env env;
        int worker_lr = 0;
        if (!o.local && !pdde_comm_env_read(ctx, &env) && env.local_rank >= 0) {
            worker_lr = env.rank == env.local_rank && env.local_rank >= o.servers ? env.local_rank - o.servers : env.local_rank;
            ds.local_rank = &worker_lr;
        }
        if (!(st = pdde_device_select(ctx, &ds, &dc))) {
            layer_dev[1] = dc.device;
            if (lead || !o.local) printf("dlrm: rank %d: the dense layers on device %d, %s:%d (%s): %s\n", rank, dc.device, dc.backend, dc.index, dc.name, dc.why);
        } else fprintf(stderr, "dlrm: --device: %s\n", pdde_last_error(ctx));
        pdde_cluster_free(measured);
        sp.layer_devices = layer_dev, sp.n_layer_devices = 2;
    }
    if (!st) st = pdde_session_init(g, &sp, &s);
    if (!st) st = pdde_sparse_batch_init(m.emb, &sb);
    if (!st) st = pdde_ps_client_init(ctx, o.local ? NULL : world, &pp, &c);
    if (!st && o.dense_on_servers) { /* worker 0 seeds the servers (unless they loaded a checkpoint holding them) */
        st = pdde_sparse_batch_hold_dense(sb, s, c, lead && !o.load_dir);
        if (!st && workers) st = pdde_comm_barrier(workers);
    }
    char dense_path[700];
    long per_epoch = n_train / o.cfg.batch / nw; /* steps per worker and epoch (equal on every worker) */
    long total = per_epoch * o.epochs, start = 0, step_samples = (long)o.cfg.batch * nw;
    if (!st && o.load_dir) { /* the dense network (the table is loaded by its servers) */
        pdde_checkpoint_extra extra = {0};
        snprintf(dense_path, sizeof dense_path, "%s/dense.ckpt", load_dir);
        st = pdde_checkpoint_load(s, dense_path, &extra);
        if (!st && resume) { /* a checkpoint goes on where it was: the global sample it had reached */
            start = (long)(extra.data_position / (uint64_t)step_samples);
            if (extra.data_position % (uint64_t)step_samples)
                st = pdde_error(ctx, PDDE_ERR_MISMATCH, "%s was written at sample %llu, not a whole step of %ld samples (--batch %d x %d workers): resume with its batch and workers",
                                dense_path, (unsigned long long)extra.data_position, step_samples, o.cfg.batch, nw);
            else if (lead) printf("resuming %s at step %ld of %ld\n", load_dir, start < total ? start : total, total);
        }
    }
    uint64_t *ids = malloc((size_t)o.cfg.batch * DLRM_SPARSE * sizeof *ids);
    long step = start, last_ckpt = start;
    int stopped_by = 0; /* the signal training stopped for (agree_stop), the same on every worker */
    double t0 = dlrm_seconds(CLOCK_MONOTONIC), loss_avg = 0;
    if (!st) catch_stop_signals();
    if (o.pipeline && !st) { /* every epoch in one run of the pipeline */
        worker_batches src = {samples, per_epoch, nw, w, o.cfg.batch};
        dlrm_stages d = {&m, s, c, o.dense_on_servers ? NULL : workers, worker_batch, &src};
        pdde_pipeline_stage stages[3];
        dlrm_stages_fill(&d, stages);
        dlrm_slot slots[16];
        void *slot_ptr[16];
        int made = 0;
        for (; made < o.pipeline && !st; made++) {
            st = dlrm_slot_init(&slots[made], &m), slot_ptr[made] = &slots[made];
            if (!st && o.dense_on_servers) st = pdde_sparse_batch_hold_dense(slots[made].sb, s, c, 0);
        }
        pdde_cluster *cluster = NULL;
        if (!st && o.cluster && !(st = pdde_cluster_load(ctx, o.cluster, &cluster))) {
            pdde_device_props dp;
            int cpu_id = dlrm_cluster_device(cluster, "cpu"), dense_id = cpu_id;
            if (!pdde_device_get_props(ctx, layer_dev[1], &dp)) dense_id = dlrm_cluster_device(cluster, dp.backend);
            if (dlrm_stages_predict(ctx, cluster, g, &m, o.optimizer, cpu_id, dense_id, 0, stages) < 3 && lead)
                printf("pipeline: %s cannot time every stage (run pdde-bench on this machine): sized from a measured balance\n", o.cluster);
        }
        pdde_cluster_free(cluster);
        pdde_pipeline_params plp = PDDE_PIPELINE_PARAMS_INIT;
        plp.n_stages = 3, plp.stages = stages, plp.slots = slot_ptr, plp.n_slots = o.pipeline;
        pdde_pipeline *pl = NULL;
        if (!st) st = pdde_pipeline_init(ctx, &plp, &pl);
        for (int e = per_epoch ? (int)(start / per_epoch) : o.epochs; e < o.epochs && !st; e++) {
            long end = (e + 1) * per_epoch;
            /* to the epoch's end or the next checkpoint boundary (the pipeline drains there: the one place it can stop) */
            while (step < end && !st && !stopped_by) {
                long to = (step / ckpt_every + 1) * ckpt_every < end ? (step / ckpt_every + 1) * ckpt_every : end;
                st = pdde_pipeline_run(pl, step, to - step);
                step = to;
                if (!st) st = agree_stop(workers, &stopped_by);
                if (!st && o.ckpt_dir && lead && (step % ckpt_every == 0 || stopped_by))
                    st = write_checkpoint(ctx, s, c, o.ckpt_dir, (uint64_t)(step * step_samples)), last_ckpt = step;
            }
            if (stopped_by) break;
            double el = dlrm_seconds(CLOCK_MONOTONIC) - t0, rate = (double)(step - start) * o.cfg.batch * nw / el;
            if (lead && !st) printf("epoch %d (pipelined, %d slots)  loss %.4f  %.0f samples/s  ETA %.0f s\n", e, o.pipeline, pdde_session_loss(s), rate,
                                    (double)(o.epochs - e - 1) * per_epoch * o.cfg.batch * nw / rate);
            fflush(stdout);
        }
        if (pl && lead) dlrm_pipeline_report(stdout, "pipeline ", pl, stages);
        pdde_pipeline_free(pl);
        for (int i = 0; i < made; i++) dlrm_slot_free(&slots[i]);
    }
    for (; step < total && !st && !o.pipeline && !stopped_by; step++) {
        long e = step / per_epoch, k = step % per_epoch;
        st = dlrm_train_step(s, &m, sb, c, o.dense_on_servers ? NULL : workers, samples + (k * nw + w) * o.cfg.batch, ids);
        float loss = pdde_session_loss(s);
        loss_avg = step > start ? 0.98 * loss_avg + 0.02 * loss : loss;
        if (lead && !st && (step % 100 == 0 || step + 1 == total)) {
            double el = dlrm_seconds(CLOCK_MONOTONIC) - t0, rate = (double)(step + 1 - start) * o.cfg.batch * nw / el;
            printf("epoch %ld step %ld/%ld  loss %.4f  %.0f samples/s  ETA %.0f s\n", e, step + 1, total, loss_avg, rate,
                   (double)(total - step - 1) * o.cfg.batch * nw / rate);
            fflush(stdout);
        }
        if (!st) st = agree_stop(workers, &stopped_by);
        /* (after the step's push is acknowledged: in sync mode the servers have applied it) */
        if (!st && o.ckpt_dir && lead && ((step + 1) % ckpt_every == 0 || stopped_by))
            st = write_checkpoint(ctx, s, c, o.ckpt_dir, (uint64_t)((step + 1) * step_samples)), last_ckpt = step + 1;
    }
    if (!st && o.ckpt_dir && lead && last_ckpt < total && !stopped_by) /* the last steps */
        st = write_checkpoint(ctx, s, c, o.ckpt_dir, (uint64_t)(total * step_samples));
    if (st) fprintf(stderr, "dlrm: training: %s\n", pdde_last_error(ctx)), rc = 1;
    if (stopped_by) { /* (the checkpoint above holds the run; the evaluation and --save wait for the run's end) */
        if (lead && !st)
            printf("dlrm: %s: stopped after step %ld of %ld%s%s%s\n", strsignal(stopped_by), step, total,
                   o.ckpt_dir ? ", saved a checkpoint in " : "", o.ckpt_dir ? o.ckpt_dir : " (no --checkpoint: nothing saved)",
                   o.ckpt_dir ? " (--load goes on from it)" : "");
        fflush(stdout);
        /* no worker leaves before the checkpoint is whole (a launcher stops the others when one exits) */
        pdde_status b = workers && pdde_comm_size(workers) > 1 ? pdde_comm_barrier(workers) : PDDE_OK;
        if (b && !st) fprintf(stderr, "dlrm: stopping: %s\n", pdde_last_error(ctx)), rc = 1;
        n_test = 0, o.save_dir = NULL; /* (the signals stay caught: the cleanup left is not cut short by the launcher's) */
    } else release_stop_signals(1);
    double train_s = dlrm_seconds(CLOCK_MONOTONIC) - t0;

    if (!st && lead && n_test > 0) {
        long nt = n_test; /* (all of them: dlrm_predict fills up the last batch) */
        double *p = malloc((size_t)nt * sizeof *p);
        int *y = malloc((size_t)nt * sizeof *y);
        for (long i = 0; i < nt; i++) y[i] = samples[n_train + i].label;
        st = dlrm_predict(s, &m, sb, c, samples + n_train, nt, p, ids);
        if (!st) {
            printf("held out (%ld samples): AUC %.4f  logloss %.4f", nt, dlrm_auc(p, y, nt), dlrm_logloss(p, y, nt));
            if (p_true) printf("  (ground truth: AUC %.4f  logloss %.4f)", dlrm_auc(p_true + n_train, y, nt), dlrm_logloss(p_true + n_train, y, nt));
            printf("\ntraining: %.0f samples/s over %d worker(s)\n", (double)(total - start) * o.cfg.batch * nw / train_s, nw);
        } else fprintf(stderr, "dlrm: evaluation: %s\n", pdde_last_error(ctx)), rc = 1;
        free(p), free(y);
    }
    if (!st && o.save_dir && lead) {
        snprintf(dense_path, sizeof dense_path, "%s/dense.ckpt", o.save_dir);
        pdde_checkpoint_extra extra = {.data_position = (uint64_t)(total * step_samples)};
        st = pdde_ps_client_save(c, o.save_dir);
        if (!st) st = pdde_checkpoint_save(s, dense_path, &extra);
        if (st) fprintf(stderr, "dlrm: save: %s\n", pdde_last_error(ctx)), rc = 1;
        else printf("table shards and %s saved\n", dense_path);
    }
    pdde_ps_client_free(c);
    int sig = lead ? job_stop_signal(servers_lead, stopped_by) : stopped_by;
    if (!rc && sig) rc = 128 + sig;
    pdde_sparse_batch_free(sb);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(m.emb);
    free(ids), free(samples), free(p_true);
    pdde_comm_free(workers);
    pdde_comm_free(servers_lead);
    pdde_comm_free(world);
    pdde_context_free(ctx);
    return rc;
}
