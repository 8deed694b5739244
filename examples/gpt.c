/* gpt — Demonstrates how to train a GPT-2-style model on any text file under any plan (data, tensor,
 * pipeline, ZeRO, or the planner's choice), checkpoint and resume it, then sample from it.
 *
 *   ./build/gpt                                   # small model on a fortunes file, all CPU threads
 *   ./build/gpt --data corpus.txt --layers 6 --width 256 --steps 2000 --ckpt-dir ckpt --resume
 *   ./build/gpt --device cuda                     # the whole step on the GPU (under pdde-run: each rank its own)
 *   ./build/gpt --blocks-on opencl                # embedding/head on the CPU, the blocks on OpenCL
 *   ./build/gpt --recompute                       # recompute the blocks in backward: less activation memory
 *   ./build/gpt --init-from gpt2_124M.bin --data 'fineweb_train_*.bin' --ctx 1024   # fine-tune OpenAI's GPT-2 (llm.c's files)
 *   ./build/gpt --init-from SmolLM2-135M --data notes.txt --save-hf tuned   # a Hugging Face LLaMA in, the tuned one out
 *   ./build/pdde-run -n 2 ./build/gpt --dp 2 --zero 1   # data parallel on 2 ranks, ZeRO-1
 *   ./build/pdde-run -n 4 ./build/gpt --dp 2 --tp 2     # data x tensor parallel from dist attributes
 *   ./build/pdde-run -n 4 ./build/gpt --dp 2 --pp 2 --micro 4   # data x pipeline parallel, 1F1B
 *
 * Text is tokenized byte by byte (vocabulary 256), or by a tokenizer.json (--tokenizer, or the
 * --init-from directory's: examples/hf_tokenizer.h). A token file (pdde's, or llm.c's GPT-2 / LLaMA 3
 * shards, or a glob of them: --vocab 50304 for GPT-2's tokens) is read as its ids, and the sample
 * prints ids. 90% of the tokens train, 10% validate; --val-data validates on other files instead. */
#define _GNU_SOURCE
#include "pdde.h"
#include "gpt.h"
#include "gpt_llmc.h"
#include "gpt_hf.h"
#include "hf_tokenizer.h"
#include "stop_signals.h" /* (under pdde-run --elastic the rank that sees a signal leaves at the next step boundary: pdde_elastic_request_leave) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* What --init-from names (init_from_kind) */
typedef enum { INIT_LLMC, INIT_HF, INIT_CHECKPOINT } init_kind;

typedef struct {
    gpt_config model;
    int steps, val_every, val_batches, sample_len, threads, ckpt_every, resume, recompute, show_program, comm_bf16, dp, tp, pp, pp_chunks, micro, gpipe, zero;
    int stop_after, reschedule, share_device, ckpt_async;
    int rope_base_given;   /* --rope-base was given (0 is refused, not taken as the default) */
    int32_t sample_from;   /* a token file's ids (not bytes): the sample's first token; -1 for text */
    int doc_token;         /* --doc-token: the token --doc-mask's documents start with (-1: the tokenizer.json's) */
    int doc_windows;       /* --doc-windows: every window starts where a document does (pdde_data_align_windows) */
    const char *prompt;    /* --prompt: what the sample goes on from (text, or a token file's ids) */
    int32_t *prompt_ids;   /* ... as tokens, n_prompt of them */
    int n_prompt;
    int ep;                /* --ep: the experts over groups of ep of the --dp ranks (1 < ep < dp) */
    int ft;                /* --ft-replicas: a lost replica's samples are dropped (no re-split of the batch) */
    float lr, weight_decay, clip;
    float temperature;     /* --temperature: the sample's softmax temperature (0: the likeliest token each time) */
    int top_k;             /* --top-k: the sample draws among the k likeliest tokens only (0: all) */
    float top_p;           /* --top-p: ... and among the likeliest whose probabilities sum to p (0 or 1: all) */
    float moe_bias_rate;   /* --moe-bias-rate: DeepSeek's balancing bias step (0 = off) */
    uint64_t seed;
    const char *init_from, *save_llmc; /* --init-from, --save-llmc: llm.c's GPT-2 model files */
    const char *save_hf;               /* --save-hf: a Hugging Face model directory */
    st_dtype save_dtype;               /* --save-dtype: --save-hf's and --save-peft's weights (F32 by default) */
    const char *save_peft;             /* --save-peft: a LoRA run's adapters as PEFT's directory */
    init_kind init;                    /* what --init-from names */
    const char *data, *val_data, *tokenizer, *ckpt_dir, *blocks_on, *plan, *cluster, *trace, *metrics, *device;
    pdde_dtype dtype;      /* --dtype: the matmuls' compute dtype (mixed precision) */
    pdde_plan parsed_plan; /* --plan: its stage cuts */
} options;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: gpt [--help] [--data FILE] [--val-data FILE] [--layers N] [--heads N] [--width N] [--ctx N] [--vocab N] [--batch N]\n"
            "                              (--data: text, its bytes the tokens or with a tokenizer.json its ids; or ids: llm.c's\n"
            "                              GPT-2 / LLaMA 3 shards, pdde's token files, with --vocab above the largest; a quoted glob:\n"
            "                              all its files; --val-data: validate there, else on --data's last 10%%)\n"
            "           [--tokenizer FILE] (llm.c's tokenizer file, gpt2_tokenizer.bin, or Hugging Face's tokenizer.json: the\n"
            "                              sample of a token file printed as text; tokenizer.json also encodes text --data and\n"
            "                              --prompt; default the --init-from directory's; --save-hf copies it; a .jsonl --data holds a\n"
            "                              \"text\" a line, or a \"prompt\" and a \"completion\": trained on the completions alone)\n"
            "           [--init-from PATH] (start from a Hugging Face model directory, config.json and safetensors: GPT-2,\n"
            "                              LLaMA (LLaMA 2, TinyLlama, SmolLM2), Qwen2 or Qwen3; or llm.c's GPT-2 model file, gpt2_124M.bin or\n"
            "                              _bf16.bin: the model's flags are the file's, --ctx at most its positions; or a pdde\n"
            "                              checkpoint's weights (a --ckpt-dir), this run's optimizer, schedule and data from their\n"
            "                              start; a checkpoint --resume finds wins)\n"
            "           [--save-hf DIR]    (after training, the model as a Hugging Face directory: config.json, model.safetensors)\n"
            "           [--save-dtype f32|bf16|f16]   (--save-hf's and --save-peft's weights, rounded to the nearest; default f32)\n"
            "           [--save-llmc FILE] (after training, the model as llm.c's model file, f32)\n"
            "                              (both save from one process, or --dp without --zero 3)\n"
            "           [--arch gpt|llama] (llama: RMSNorm, SwiGLU, RoPE, no biases nor position embedding)\n"
            "           [--kv-heads N]     (llama: grouped-query attention, N key/value heads dividing --heads; default --heads)\n"
            "           [--rope-base X]    (llama: RoPE's base, > 1; default 10000)\n"
            "           [--rope-scaling F,L,H,O]   (llama: LLaMA 3.1's long-context RoPE: factor F, low_freq L, high_freq H,\n"
            "                              original context O, as its config.json's rope_scaling; default none)\n"
            "           [--ffn N]          (hidden units of each MLP; default 4 x width, llama 8/3 x width rounded up)\n"
            "           [--norm-eps X]     (the layernorms' epsilon; default 1e-5)\n"
            "           [--untied-head]    (the head a parameter of its own, not the token embedding)\n"
            "           [--qkv-bias]       (llama: biases on q, k and v, as Qwen2's)\n"
            "           [--head-dim N] [--qk-norm]   (llama: each head N wide, not --width / --heads; an RMSNorm on each head of\n"
            "                              q and k before RoPE: Qwen3's)\n"
            "           [--doc-mask [--doc-token ID]]   (packed documents kept apart: attention inside each document of a window,\n"
            "                              GPT's positions restarting at each; a document starts at the tokenizer.json's start token, or\n"
            "                              ID)\n"
            "           [--doc-windows]    (every window starts where a document does: a short document, as a prompt and its completion,\n"
            "                              is never cut from its start; the rest of one longer than --ctx is never trained)\n"
            "           [--window W]       (sliding-window attention: each token attends to itself and the W - 1 before it, as\n"
            "                              Mistral's sliding_window; 0, the default: the whole context)\n"
            "           [--lora-rank R [--lora-alpha A]]   (with --init-from: train rank-R adapters beside every linear of the\n"
            "                              blocks, scaled by A / R (default A = R), the pretrained weights frozen; --save-hf and\n"
            "                              --save-llmc write the weights merged, --save-peft DIR the adapters alone as PEFT does)\n"
            "           [--steps N] [--lr X] [--weight-decay X] [--clip X] [--seed N] [--threads N]\n"
            "           [--val-every N] [--sample-len N] [--ckpt-dir DIR] [--ckpt-every N] [--resume]\n"
            "           [--temperature X] [--top-k N] [--top-p P] (the sample: softmax temperature, default 0.8, 0 the\n"
            "                              likeliest token each time; only the N likeliest tokens drawn from, default all; of\n"
            "                              those, only the likeliest whose probabilities sum to P, default 1: all)\n"
            "           [--prompt TEXT]    (the sample goes on from TEXT; for a token file, ids (\"464,2068\"), or text with a\n"
            "                              tokenizer.json)\n"
            "           [--ckpt-async]     (write checkpoints in the background from a host copy; visible at the next one)\n"
            "           [--stop-after N]   (save and stop after step N, as an interrupted run would; --resume goes on)\n"
            "                              (SIGTERM, SIGUSR1 or Ctrl-C: every rank stops after the same step, saved with --ckpt-dir;\n"
            "                              under pdde-run --elastic the signalled rank leaves at the next step boundary, exit\n"
            "                              128 + the signal, and the others go on; if all are signalled, or fewer than --min\n"
            "                              would remain, all stop so, saved, exit 128 + the largest signal; planned departures\n"
            "                              alone leaving fewer than --min: saved, exit 75)\n"
            "           [--reschedule]     (with --resume: follow this run's --steps/--lr schedule instead of the\n"
            "                              checkpoint's, which a resumed run keeps by default)\n"
            "           [--device cuda|opencl|level_zero|cpu|auto|BACKEND:N]   (where the whole step runs; default\n"
            "                              $PDDE_DEVICE, else auto: the device the cost model predicts fastest. Under a\n"
            "                              launcher each rank takes its local rank's device of the backend)\n"
            "           [--share-device]   (more ranks on a host than devices: they share them, local rank mod count)\n"
            "           [--recompute] [--blocks-on BACKEND] [--dp N] [--tp N] [--pp N] [--zero 0-3]   (run under pdde-run -n dp*tp*pp)\n"
            "           [--micro N] [--gpipe]   (micro-batches per step; pipeline schedule GPipe instead of 1F1B)\n"
            "           [--pp-chunks N]    (interleaved stages: N runs of layers per stage; --micro a multiple of --pp)\n"
            "           [--show-program]   (print each rank's local program: nodes, shapes, attributes, communication)\n"
            "           [--comm-bf16]      (tensor/pipeline/ZeRO collectives carry bf16 instead of f32)\n"
            "           [--dtype f32|bf16|f16]   (mixed precision: matmuls in bf16 or f16 with f32 accumulation, f32 master\n"
            "                              weights; f16 scales the loss dynamically, the log shows the scale and skipped steps)\n"
            "           [--trace FILE]     (a Chrome/Perfetto trace of every step; under pdde-run -n N each rank writes\n"
            "                              FILE.rank<R>: use pdde-run --trace FILE to get them merged into FILE)\n"
            "           [--metrics FILE]   (one JSON line per step: step, loss, lr, tokens/s, memory; build/pdde-plot\n"
            "                              draws the loss of one or several such files)\n"
            "           [--plan dp=2,tp=1,pp=2,mb=4,zero=1,recompute=0[,chunks=N][,stages=3:3][,rc=2:0][,blocks=1]]   (all of\n"
            "                              the above at once, stages = layers per pipeline stage of the layers + 2, rc = the\n"
            "                              first layers of each stage recomputed, blocks=1: stage s on ranks s*dp*tp.., as\n"
            "                              pdde-plan --auto prints; ,place=opencl[:A-B]: the blocks, or layers A..B, on that\n"
            "                              backend's device, as --blocks-on (with stages: those each stage holds);\n"
            "                              shares=3:1: dp index i (each of its stages) runs shares[i] x mb\n"
            "                              micro-batches, for devices of different speeds)\n"
            "           [--moe-experts E [--moe-topk K] [--moe-every N] [--moe-capacity F] [--moe-aux W] [--moe-bias-rate U] [--moe-ep]]\n"
            "                              (Mixture-of-Experts: E expert MLPs in every N-th block, K per token (default 2);\n"
            "                              capacity factor F drops the tokens past it (default 0: dropless); W weights the\n"
            "                              balance loss (default 0.01); U > 0 balances by a per-expert bias instead;\n"
            "                              --moe-ep with --dp: the experts split over the dp ranks, tokens exchanged all-to-all;\n"
            "                              with --tp: over the tp ranks, attention tensor parallel; --ep N instead of --moe-ep:\n"
            "                              the experts over groups of N of the --dp ranks, the tokens over all of them;\n"
            "                              with --tp: each expert's hidden units split over the tp ranks too)\n"
            "           [--plan auto [--cluster FILE]]   (the planner chooses for the ranks the launcher started, from the\n"
            "                              devices FILE describes; default build/cluster.json, written by pdde-bench;\n"
            "                              under pdde-run --elastic it re-plans at every change, data parallel; FILE's\n"
            "                              figures also time the devices of --device auto and give PDDE_PROFILE=device\n"
            "                              the peaks it measured: peaks=cluster)\n"
            "           [--ft-replicas]   (under pdde-run --elastic: fault-tolerant data parallelism without re-splitting the batch:\n"
            "                              each rank keeps its replica's rows of every batch; a lost replica's rows are dropped and\n"
            "                              the survivors average over the samples they have; a replica that comes back\n"
            "                              (pdde-run --restart, or --join) takes a missing replica's rows from a member's state)\n");
}

/* Whether this rank runs under `pdde-run --elastic` (which sets PDDE_ELASTIC=1) */
static bool under_elastic(void) {
    const char *v = getenv("PDDE_ELASTIC");
    return v && atoi(v);
}

/* Rank 0 of a job holds dir/gpt.lock (flock: the kernel lets it go when the process ends, however) so
 * that a second job given the same --ckpt-dir stops at its start, naming the first, rather than mixing
 * its checkpoints with the first's. (Not under pdde-run --elastic: its members may change rank 0.) */
static int lock_ckpt_dir(const char *dir) {
    char path[4200], holder[32] = "";
    snprintf(path, sizeof path, "%s/gpt.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) { fprintf(stderr, "gpt: --ckpt-dir %s: cannot create %s: %s\n", dir, path, strerror(errno)); return 1; }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        ssize_t n = read(fd, holder, sizeof holder - 1);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        fprintf(stderr, "gpt: --ckpt-dir %s is in use by another run (process %s): give each run a directory of its own\n", dir,
                holder[0] ? holder : "?");
        close(fd);
        return 1;
    }
    int len = snprintf(holder, sizeof holder, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, holder, (size_t)len, 0) != len) { /* (the lock holds without the number) */ }
    return 0; /* (fd stays open, the lock held, until the process ends) */
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* --rope-scaling as --help writes it: "none", or "FACTOR,LOW,HIGH,ORIGINAL" (buf: 160 bytes) */
static void rope_scaling_str(const gpt_config *c, char *buf) {
    if (!(c->rope_scaling[0] > 0)) { snprintf(buf, 160, "none"); return; }
    char v[4][32];
    for (int k = 0; k < 4; k++) gpt_hf_float(v[k], c->rope_scaling[k]);
    snprintf(buf, 160, "%s,%s,%s,%s", v[0], v[1], v[2], v[3]);
}

static bool flag_given(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag)) return true;
    return false;
}

/* What --init-from names: a Hugging Face model (a directory holding config.json, or a .safetensors file
 * beside one), a pdde checkpoint (another directory, or a file of pdde's format), else llm.c's model file */
static init_kind init_from_kind(const char *path) {
    size_t len = strlen(path);
    if (len > 12 && !strcmp(path + len - 12, ".safetensors")) return INIT_HF;
    if (is_dir(path)) {
        char *config = malloc(len + 13);
        int hf = config && (sprintf(config, "%s/config.json", path), !access(config, F_OK));
        free(config);
        return hf ? INIT_HF : INIT_CHECKPOINT;
    }
    char magic[8] = "";
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(magic, 1, sizeof magic, f) : 0;
    if (f) fclose(f);
    return got == 8 && !memcmp(magic, "PDDECKPT", 8) ? INIT_CHECKPOINT : INIT_LLMC;
}

/* The directory of the Hugging Face model at path (path itself, or a .safetensors file's folder), malloc'd */
static char *hf_dir(const char *path) {
    char *dir = strdup(path), *slash = dir && !is_dir(dir) ? strrchr(dir, '/') : NULL;
    if (slash) *slash = 0;
    else if (dir && !is_dir(dir)) strcpy(dir, "."); /* (a file in the working directory: its name is longer than ".") */
    return dir;
}

/* --init-from a model file: the model flags below are the file's (file); one of them given with another
 * value is refused naming both */
static int adopt_model(int argc, char **argv, options *o, const gpt_config *file) {
    static const char *const flag[] = {"--arch", "--layers", "--heads", "--width", "--vocab", "--kv-heads", "--ffn", "--rope-base", "--norm-eps",
                                       "--head-dim", "--window", "--qkv-bias", "--qk-norm", "--untied-head"}; /* (the last three: switches) */
    gpt_config *m = &o->model;
    const double mine[] = {m->arch, m->layers, m->heads, m->width, m->vocab, gpt_kv_heads(m), (double)gpt_ffn(m), gpt_rope_base(m), gpt_norm_eps(m),
                           gpt_head_dim(m), m->window, m->qkv_bias, m->qk_norm, m->untied_head};
    const double theirs[] = {file->arch, file->layers, file->heads, file->width, file->vocab, gpt_kv_heads(file), (double)gpt_ffn(file),
                             gpt_rope_base(file), gpt_norm_eps(file), gpt_head_dim(file), file->window, file->qkv_bias, file->qk_norm, file->untied_head};
    char a[160], b[160];
    rope_scaling_str(m, a), rope_scaling_str(file, b);
    if (flag_given(argc, argv, "--rope-scaling") && strcmp(a, b)) {
        fprintf(stderr, "gpt: --init-from %s: --rope-scaling %s, but the file's model has %s (leave the flag out: the file's is taken)\n", o->init_from, a, b);
        return -1;
    }
    for (size_t k = 0; k < sizeof flag / sizeof *flag; k++) {
        if (!flag_given(argc, argv, flag[k]) || mine[k] == theirs[k]) continue;
        gpt_hf_float(a, (float)mine[k]), gpt_hf_float(b, (float)theirs[k]);
        if (k == 0) snprintf(a, sizeof a, "%s", gpt_arch_name(m->arch)), snprintf(b, sizeof b, "%s", gpt_arch_name(file->arch));
        if (k + 3 >= sizeof flag / sizeof *flag) snprintf(a, sizeof a, "given"), snprintf(b, sizeof b, k + 1 == sizeof flag / sizeof *flag ? "a tied head" : "none");
        fprintf(stderr, "gpt: --init-from %s: %s %s, but the file's model has %s (leave the flag out: the file's is taken)\n", o->init_from, flag[k], a, b);
        return -1;
    }
    m->arch = file->arch, m->layers = file->layers, m->heads = file->heads, m->width = file->width, m->vocab = file->vocab;
    m->kv_heads = file->kv_heads, m->ffn = file->ffn, m->rope_base = file->rope_base, m->norm_eps = file->norm_eps, m->untied_head = file->untied_head;
    m->qkv_bias = file->qkv_bias, m->head_dim = file->head_dim, m->qk_norm = file->qk_norm, m->window = file->window;
    memcpy(m->rope_scaling, file->rope_scaling, sizeof m->rope_scaling);
    return 0;
}

/* --init-from llm.c's file or a Hugging Face model: its model, which must fit this run's (--ctx, no experts) */
static int adopt_file_model(int argc, char **argv, options *o) {
    char why[600];
    gpt_config file = o->model;
    int max_ctx = 0;
    if (o->init == INIT_HF) {
        char *dir = hf_dir(o->init_from); /* (a .safetensors file: config.json beside it) */
        int bad = !dir || gpt_hf_config(dir, &file, &max_ctx, why, sizeof why);
        free(dir);
        st_model weights; /* (its files' headers checked now, before the session is built) */
        if (!bad && !(bad = st_open(o->init_from, &weights, why, sizeof why))) st_close(&weights);
        if (bad) { fprintf(stderr, "gpt: --init-from %s: %s\n", o->init_from, why); return -1; }
        if (adopt_model(argc, argv, o, &file)) return -1;
        if (!gpt_hf_fits(&o->model, max_ctx, why, sizeof why)) return 0;
    } else {
        gpt_llmc_header h;
        if (gpt_llmc_read_header(o->init_from, &h, why, sizeof why)) { fprintf(stderr, "gpt: --init-from %s: %s\n", o->init_from, why); return -1; }
        file = (gpt_config){.arch = GPT_ARCH_GPT, .layers = h.layers, .heads = h.heads, .width = h.width, .vocab = h.vocab};
        if (adopt_model(argc, argv, o, &file)) return -1;
        if (!gpt_llmc_fits(&h, &o->model, why, sizeof why)) return 0;
    }
    fprintf(stderr, "gpt: --init-from %s: %s\n", o->init_from, why);
    return -1;
}

static int parse(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *iv = NULL;
        float *fv = NULL;
        if (!strcmp(a, "--resume")) { o->resume = 1; continue; }
        if (!strcmp(a, "--gpipe")) { o->gpipe = 1; continue; }
        if (!strcmp(a, "--recompute")) { o->recompute = 1; continue; }
        if (!strcmp(a, "--show-program")) { o->show_program = 1; continue; }
        if (!strcmp(a, "--comm-bf16")) { o->comm_bf16 = 1; continue; }
        if (!strcmp(a, "--reschedule")) { o->reschedule = 1; continue; }
        if (!strcmp(a, "--share-device")) { o->share_device = 1; continue; }
        if (!strcmp(a, "--moe-ep")) { o->model.moe_ep = 1; continue; }
        if (!strcmp(a, "--ckpt-async")) { o->ckpt_async = 1; continue; }
        if (!strcmp(a, "--ft-replicas")) { o->ft = 1; continue; }
        if (!strcmp(a, "--untied-head")) { o->model.untied_head = 1; continue; }
        if (!strcmp(a, "--qkv-bias")) { o->model.qkv_bias = 1; continue; }
        if (!strcmp(a, "--qk-norm")) { o->model.qk_norm = 1; continue; }
        if (!strcmp(a, "--doc-mask")) { o->model.doc_mask = 1; continue; }
        if (!strcmp(a, "--doc-windows")) { o->doc_windows = 1; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!v) { fprintf(stderr, "gpt: %s: no value after it, or no such flag (--help lists them)\n", a); return -1; }
        if (!strcmp(a, "--layers")) iv = &o->model.layers;
        else if (!strcmp(a, "--heads")) iv = &o->model.heads;
        else if (!strcmp(a, "--kv-heads")) iv = &o->model.kv_heads;
        else if (!strcmp(a, "--head-dim")) iv = &o->model.head_dim;
        else if (!strcmp(a, "--window")) iv = &o->model.window;
        else if (!strcmp(a, "--doc-token")) iv = &o->doc_token;
        else if (!strcmp(a, "--rope-base")) fv = &o->model.rope_base, o->rope_base_given = 1;
        else if (!strcmp(a, "--ffn")) iv = &o->model.ffn;
        else if (!strcmp(a, "--norm-eps")) fv = &o->model.norm_eps;
        else if (!strcmp(a, "--lora-rank")) iv = &o->model.lora_rank;
        else if (!strcmp(a, "--lora-alpha")) fv = &o->model.lora_alpha;
        else if (!strcmp(a, "--rope-scaling")) {
            float *r = o->model.rope_scaling;
            int at = 0;
            if (strcmp(v, "none") && (sscanf(v, "%f,%f,%f,%f%n", &r[0], &r[1], &r[2], &r[3], &at) != 4 || v[at] || !(r[0] >= 1 && r[1] > 0 &&
                                      r[2] > r[1] && r[3] > 0 && isfinite(r[0]) && isfinite(r[2]) && isfinite(r[3])))) {
                fprintf(stderr, "gpt: --rope-scaling wants FACTOR,LOW_FREQ,HIGH_FREQ,ORIGINAL_CONTEXT (LLaMA 3.1's: 8,1,4,8192; factor >= 1, "
                        "0 < low < high) or none, got '%s'\n", v);
                return -1;
            }
            if (!strcmp(v, "none")) memset(r, 0, sizeof o->model.rope_scaling);
        }
        else if (!strcmp(a, "--arch")) {
            if (strcmp(v, "gpt") && strcmp(v, "llama")) { fprintf(stderr, "gpt: --arch takes gpt or llama, got '%s'\n", v); return -1; }
            o->model.arch = strcmp(v, "llama") ? GPT_ARCH_GPT : GPT_ARCH_LLAMA;
        }
        else if (!strcmp(a, "--width")) iv = &o->model.width;
        else if (!strcmp(a, "--ctx")) iv = &o->model.ctx;
        else if (!strcmp(a, "--vocab")) iv = &o->model.vocab;
        else if (!strcmp(a, "--batch")) iv = &o->model.batch;
        else if (!strcmp(a, "--steps")) iv = &o->steps;
        else if (!strcmp(a, "--val-every")) iv = &o->val_every;
        else if (!strcmp(a, "--sample-len")) iv = &o->sample_len;
        else if (!strcmp(a, "--threads")) iv = &o->threads;
        else if (!strcmp(a, "--ckpt-every")) iv = &o->ckpt_every;
        else if (!strcmp(a, "--stop-after")) iv = &o->stop_after;
        else if (!strcmp(a, "--dp")) iv = &o->dp;
        else if (!strcmp(a, "--tp")) iv = &o->tp;
        else if (!strcmp(a, "--pp")) iv = &o->pp;
        else if (!strcmp(a, "--ep")) iv = &o->ep;
        else if (!strcmp(a, "--pp-chunks")) iv = &o->pp_chunks;
        else if (!strcmp(a, "--micro")) iv = &o->micro;
        else if (!strcmp(a, "--zero")) iv = &o->zero;
        else if (!strcmp(a, "--moe-experts")) iv = &o->model.moe_experts;
        else if (!strcmp(a, "--moe-topk")) iv = &o->model.moe_topk;
        else if (!strcmp(a, "--moe-every")) iv = &o->model.moe_every;
        else if (!strcmp(a, "--moe-capacity")) fv = &o->model.moe_capacity;
        else if (!strcmp(a, "--moe-aux")) fv = &o->model.moe_aux;
        else if (!strcmp(a, "--moe-bias-rate")) fv = &o->moe_bias_rate;
        else if (!strcmp(a, "--lr")) fv = &o->lr;
        else if (!strcmp(a, "--weight-decay")) fv = &o->weight_decay;
        else if (!strcmp(a, "--clip")) fv = &o->clip;
        else if (!strcmp(a, "--temperature")) fv = &o->temperature;
        else if (!strcmp(a, "--top-k")) iv = &o->top_k;
        else if (!strcmp(a, "--top-p")) fv = &o->top_p;
        else if (!strcmp(a, "--seed")) {
            char *end = NULL;
            o->seed = strtoull(v, &end, 10);
            if (end == v || *end || *v == '-') { fprintf(stderr, "gpt: --seed wants a non-negative integer, got '%s'\n", v); return -1; }
        }
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--val-data")) o->val_data = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--init-from")) o->init_from = v;
        else if (!strcmp(a, "--save-llmc")) o->save_llmc = v;
        else if (!strcmp(a, "--save-hf")) o->save_hf = v;
        else if (!strcmp(a, "--save-dtype")) {
            o->save_dtype = ST_OTHER;
            for (int k = 0; v && k < ST_OTHER; k++)
                if (!strcasecmp(v, st_dtype_names[k])) o->save_dtype = (st_dtype)k;
            if (o->save_dtype == ST_OTHER) { fprintf(stderr, "gpt: --save-dtype takes f32, bf16 or f16, got '%s'\n", v ? v : ""); return -1; }
        }
        else if (!strcmp(a, "--save-peft")) o->save_peft = v;
        else if (!strcmp(a, "--ckpt-dir")) o->ckpt_dir = v;
        else if (!strcmp(a, "--blocks-on")) o->blocks_on = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--plan")) o->plan = v;
        else if (!strcmp(a, "--cluster")) o->cluster = v;
        else if (!strcmp(a, "--dtype")) {
            o->dtype = v && !strcmp(v, "bf16") ? PDDE_BF16 : v && !strcmp(v, "f16") ? PDDE_F16 : PDDE_F32;
            if (!v || (strcmp(v, "f32") && o->dtype == PDDE_F32)) { fprintf(stderr, "gpt: --dtype takes f32, bf16 or f16\n"); return -1; }
        }
                else if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--metrics")) o->metrics = v;
        else { fprintf(stderr, "gpt: unknown flag %s\n", a); usage(stderr); return -1; }
        char *end = NULL;
        long x = 0;
        if (iv) { x = strtol(v, &end, 10); if (end == v || *end || x < 0) { fprintf(stderr, "gpt: %s wants a non-negative integer, got '%s'\n", a, v); return -1; } *iv = (int)x; }
        if (iv && x > 1 << 24) { fprintf(stderr, "gpt: %s %s is too large (at most 2^24)\n", a, v); return -1; }
        if (fv) {
            *fv = strtof(v, &end);
            if (end == v || *end || !isfinite(*fv) || *fv < 0) { fprintf(stderr, "gpt: %s wants a finite number >= 0, got '%s'\n", a, v); return -1; }
        }
        i++;
    }
    if (o->init_from) o->init = init_from_kind(o->init_from);
    if (o->init_from && o->init != INIT_CHECKPOINT && adopt_file_model(argc, argv, o)) return -1;
    if (o->top_p > 1) { fprintf(stderr, "gpt: --top-p wants a probability in [0, 1], got %g\n", o->top_p); return -1; }
    if (o->model.lora_rank > 0 && !o->init_from) {
        fprintf(stderr, "gpt: --lora-rank %d adapts a pretrained model: give --init-from (a Hugging Face directory, llm.c's file or a "
                "checkpoint of this model)\n", o->model.lora_rank);
        return -1;
    }
    if (o->save_peft && o->model.lora_rank <= 0) {
        fprintf(stderr, "gpt: --save-peft %s saves LoRA adapters: give --lora-rank (--save-hf saves a whole model)\n", o->save_peft);
        return -1;
    }
    if (o->save_dtype != ST_F32 && !o->save_hf && !o->save_peft) {
        fprintf(stderr, "gpt: --save-dtype %s is the dtype --save-hf and --save-peft write: give one of them\n", gpt_hf_torch_dtype(o->save_dtype));
        return -1;
    }
    /* under a launcher of N ranks with no plan given: data parallel over all of them (pdde-run --elastic
     * plans for itself) */
    bool plan_given = o->plan != NULL;
    for (int i = 1; i < argc; i++)
        plan_given |= !strcmp(argv[i], "--dp") || !strcmp(argv[i], "--tp") || !strcmp(argv[i], "--pp") || !strcmp(argv[i], "--ep");
    pdde_comm_env env;
    if (!plan_given && !under_elastic() && pdde_comm_env_read(NULL, &env) == PDDE_OK &&
        env.world_size > 1) {
        o->dp = env.world_size;
        if (env.rank == 0) printf("gpt: %d ranks and no plan given: data parallel over them (--dp %d)\n", env.world_size, env.world_size);
    }
    if (o->plan && strcmp(o->plan, "auto")) {
        pdde_plan *p = &o->parsed_plan;
        if (pdde_plan_parse(o->plan, p)) { fprintf(stderr, "gpt: --plan '%s': %s\n  want dp=N,tp=N,pp=N,mb=N,zero=0-3,recompute=0|1[,chunks=N][,stages=A:B:..][,rc=A:B:..][,comm=bf16][,sched=gpipe][,blocks=1][,place=BACKEND[:A-B]][,shares=A:B:..][,ep=N|tp|dp:N]\n  (shares: one per dp index, each >= 1)\n", o->plan, p->why); return -1; }
        o->dp = p->dp, o->tp = p->tp, o->pp = p->pp, o->micro = p->micro, o->zero = p->zero, o->recompute = p->recompute, o->pp_chunks = p->chunks;
        if (p->ep > 1) o->model.moe_ep = 1; /* (ep=N: the experts over tp, else dp, or groups of N dp ranks) */
        if (p->ep > 1 && p->ep < p->dp && (p->ep != p->tp || p->ep_dp)) o->ep = p->ep; /* (with tp: each expert split over tp too) */
        if (p->shares[0] && p->pp > 1 && p->zero >= 2) {
            fprintf(stderr, "gpt: --plan '%s': shares= with pipeline stages needs ZeRO 0 or 1 (2 and 3 have collectives in every micro-batch)\n", o->plan);
            return -1;
        }
        if (gpt_plan_place_outside(p, &o->model, "gpt: --plan")) return -1;
        if (p->place[0] && (p->chunks > 1 || o->blocks_on)) {
            fprintf(stderr, "gpt: --plan '%s': place= puts layers of each stage on a second device: not with chunks or --blocks-on\n", o->plan);
            return -1;
        }
    }
    if (o->resume && !o->ckpt_dir) { fprintf(stderr, "gpt: --resume reads the checkpoint of --ckpt-dir DIR: give it\n"); return -1; }
    static const struct { const char *name; int min; } at_least_one[] = {{"--dp", 1}, {"--tp", 1}, {"--pp", 1}, {"--micro", 1}};
    const int *plan_v[] = {&o->dp, &o->tp, &o->pp, &o->micro};
    for (int k = 0; k < 4; k++)
        if (*plan_v[k] < at_least_one[k].min) { fprintf(stderr, "gpt: %s must be >= 1, got %d\n", at_least_one[k].name, *plan_v[k]); return -1; }
    if ((double)o->dp * o->tp * o->pp > 1 << 16) { fprintf(stderr, "gpt: dp %d x tp %d x pp %d ranks: at most 2^16\n", o->dp, o->tp, o->pp); return -1; }
    /* the rank count first: a plan for other ranks breaks the rules below only by accident */
    pdde_comm_env world;
    long plan_ranks = (long)o->dp * o->tp * o->pp;
    bool plan_auto = o->plan && !strcmp(o->plan, "auto");
    if (!plan_auto && !under_elastic() && plan_ranks > 1 && pdde_comm_env_read(NULL, &world) == PDDE_OK && world.world_size > 1 &&
        plan_ranks != world.world_size) {
        if (o->plan) fprintf(stderr, "gpt: --plan '%s': dp %d x tp %d x pp %d = %ld ranks, but the launcher started %d: ", o->plan, o->dp, o->tp, o->pp, plan_ranks, world.world_size);
        else fprintf(stderr, "gpt: --dp %d x --tp %d x --pp %d = %ld ranks, but the launcher started %d: ", o->dp, o->tp, o->pp, plan_ranks, world.world_size);
        fprintf(stderr, "the plan must use exactly the ranks started (pdde-run -n %ld, or a plan for %d)\n", plan_ranks, world.world_size);
        return -1;
    }
    gpt_config *m = &o->model;
    /* each rule on its own, so the message names the flag that breaks it */
    static const char *const model_flag[] = {"--layers", "--heads", "--width", "--batch"};
    const int *model_v[] = {&m->layers, &m->heads, &m->width, &m->batch};
    for (int k = 0; k < 4; k++)
        if (*model_v[k] < 1) { fprintf(stderr, "gpt: %s must be >= 1, got %d\n", model_flag[k], *model_v[k]); return -1; }
    if (m->ctx < 2) { fprintf(stderr, "gpt: --ctx must be >= 2 (a token and the next), got %d\n", m->ctx); return -1; }
    if (m->vocab < 256) { fprintf(stderr, "gpt: --vocab must be >= 256 (the tokens are bytes), got %d\n", m->vocab); return -1; }
    if (m->head_dim < 0 || m->head_dim > 4096 || (!m->head_dim && m->width % m->heads)) {
        fprintf(stderr, "gpt: --width %d is not divisible by --heads %d (each head is width / heads wide), and no --head-dim (1 .. 4096, got %d) says "
                "otherwise\n", m->width, m->heads, m->head_dim);
        return -1;
    }
    if (m->arch != GPT_ARCH_LLAMA && (m->kv_heads || o->rope_base_given || m->rope_scaling[0] > 0 || m->head_dim || m->qk_norm || m->qkv_bias)) {
        fprintf(stderr, "gpt: --kv-heads, --rope-base, --rope-scaling, --head-dim, --qk-norm and --qkv-bias are LLaMA's: give --arch llama with them\n");
        return -1;
    }
    if (o->rope_base_given && !(m->rope_base > 1)) {
        fprintf(stderr, "gpt: --rope-base %g: RoPE's base must be > 1 (without the flag it is 10000)\n", m->rope_base);
        return -1;
    }
    if (m->arch == GPT_ARCH_LLAMA && (m->heads % gpt_kv_heads(m) || m->heads / gpt_kv_heads(m) > 64 || gpt_head_dim(m) % 2)) {
        fprintf(stderr, "gpt: --arch llama needs --kv-heads %d dividing --heads %d (at most 64 query heads a kv head) and an even head "
                "dim (--head-dim, or --width / --heads: %d, for RoPE)\n", gpt_kv_heads(m), m->heads, gpt_head_dim(m));
        return -1;
    }
    if (m->moe_experts == 1 || m->moe_experts > 4096 || (m->moe_experts > 1 && gpt_moe_topk(m) > m->moe_experts)) {
        fprintf(stderr, "gpt: --moe-experts %d --moe-topk %d: 2..4096 experts, top-k at most the experts\n", m->moe_experts, gpt_moe_topk(m));
        return -1;
    }
    int elastic = under_elastic(); /* (dp is the ranks there are; the experts' split follows them: elastic_experts) */
    if (o->ep > 1 && (m->moe_experts < 2 || (!elastic && (o->ep >= o->dp || o->dp % o->ep)) || m->moe_experts % o->ep)) {
        fprintf(stderr, "gpt: --ep %d splits the experts over groups of ep of the --dp %d ranks: it needs --moe-experts (now %d) divisible by it, "
                "ep < dp dividing dp\n", o->ep, o->dp, m->moe_experts);
        return -1;
    }
    int moe_blocks = 0;
    for (int l = 0; l < m->layers; l++) moe_blocks += gpt_block_is_moe(m, l);
    if (m->moe_experts > 1 && !moe_blocks) {
        fprintf(stderr, "gpt: --moe-experts %d: no block is MoE (--moe-every %d over --layers %d)\n", m->moe_experts, m->moe_every, m->layers);
        return -1;
    }
    if (o->ep > 1) m->moe_ep = 1;
    int ep_ranks = o->ep > 1 ? o->ep : o->tp > 1 ? o->tp : o->dp; /* --moe-ep: over the --tp ranks where there are some */
    if (m->moe_ep && m->moe_experts % ep_ranks && !elastic) {
        fprintf(stderr, "gpt: --moe-ep splits the %d experts over the %s %d ranks: they must divide them\n", m->moe_experts, o->tp > 1 ? "--tp" : "--dp", ep_ranks);
        return -1;
    }
    if (o->zero > 3 || (o->zero > 1 && o->dp < 2 && !elastic)) { fprintf(stderr, "gpt: --zero %d: stages are 0..3 (2 and 3 need --dp)\n", o->zero); return -1; }
    gpt_plan shares = {.dp = o->dp, .shares = o->plan && o->parsed_plan.shares[0] ? o->parsed_plan.shares : NULL};
    long units = gpt_plan_units(&shares); /* dp, or the sum of the shares */
    if (m->batch % (units * o->micro)) {
        if (o->plan && shares.shares)
            fprintf(stderr, "gpt: --plan '%s': the shares' sum %ld x mb %d = %ld must divide --batch %d (the global batch): give a --batch that is a multiple of %ld\n",
                    o->plan, units, o->micro, units * o->micro, m->batch, units * o->micro);
        else if (o->plan)
            fprintf(stderr, "gpt: --plan '%s': dp %d x mb %d = %ld must divide --batch %d (the global batch): give a --batch that is a multiple of %ld\n",
                    o->plan, o->dp, o->micro, units * o->micro, m->batch, units * o->micro);
        else
            fprintf(stderr, "gpt: --dp %d x --micro %d = %ld must divide --batch %d (the global batch): give a --batch that is a multiple of %ld\n",
                    o->dp, o->micro, units * o->micro, m->batch, units * o->micro);
        return -1;
    }
    if (o->pp > m->layers + 2) {
        fprintf(stderr, "gpt: %s %d: at most --layers + 2 = %d pipeline stages (the embedding, each block, the head)\n", o->plan ? "--plan's pp" : "--pp",
                o->pp, m->layers + 2);
        return -1;
    }
    return 0;
}

/* --plan auto: the planner's best plan for the ranks the launcher started (all of them), on the devices
 * of the cluster file. Every rank computes the same plan from the same file; rank 0 says what it chose
 * and what came next. */
static int choose_plan(pdde_context *ctx, options *o) {
    pdde_comm_env env = {.world_size = 1};
#ifdef PDDE_HAVE_UCX
    if (pdde_comm_env_read(ctx, &env)) env.world_size = 1, env.rank = 0; /* no launcher: one process */
#endif
    const char *path = o->cluster ? o->cluster : "build/cluster.json";
    pdde_plan_devices d;
    pdde_plan plans[8];
    int nf = 0, nr = 0;
    pdde_status st = gpt_plan_devices(ctx, path, &o->model, env.world_size, &d);
    if (st) {
        gpt_say_cluster_unusable(ctx, "gpt: --plan auto", path);
        return 1;
    }
    st = gpt_plan_search(ctx, &o->model, &d, 1, plans, 8, &nf, &nr);
    pdde_plan_devices_free(&d);
    if (st) {
        fprintf(stderr, "gpt: --plan auto: %s\n", pdde_last_error(ctx));
        return 1;
    }
    o->parsed_plan = plans[0];
    pdde_plan *p = &o->parsed_plan;
    o->dp = p->dp, o->tp = p->tp, o->pp = p->pp, o->micro = p->micro, o->zero = p->zero, o->recompute = p->recompute, o->pp_chunks = p->chunks;
    if (p->ep > 1) o->model.moe_ep = 1; /* the search split the experts */
    if (env.rank == 0) {
        char s[256];
        pdde_plan_str(p, s, sizeof s);
        printf("gpt: the planner chose %s for %d rank%s: predicted %.3g s/step, %.3g MB on the fullest device (%s)\n", s, env.world_size,
               env.world_size > 1 ? "s" : "", p->step_s, p->peak_bytes / 1e6, path);
        for (int i = 1; i < nf && i < 4; i++) {
            pdde_plan_str(&plans[i], s, sizeof s);
            printf("gpt:   next: %s, %.3g s/step (%+.1f%%)\n", s, plans[i].step_s, 100 * (plans[i].step_s / p->step_s - 1));
        }
    }
    if (o->model.moe_experts > 1 && o->dp > 1 && o->tp == 1 && !o->model.moe_ep) { /* (ep: any that divides dp and the experts) */
        int ep;
        double pred[2];
        if (gpt_moe_choose_ep(ctx, path, &o->model, o->dp, o->zero, &ep, pred)) {
            fprintf(stderr, "gpt: --plan auto: expert parallelism: %s\n", pdde_last_error(ctx));
            return 1;
        }
        o->model.moe_ep = ep > 1;
        if (ep > 1 && ep < o->dp) o->ep = o->parsed_plan.ep = ep; /* (groups of ep of the dp ranks) */
        if (env.rank == 0)
            printf("gpt: the MoE blocks: %s (their exchange, experts and expert gradients predicted %.3g s/step with ep %d, %.3g s with ep 1)\n",
                   ep > 1 ? "expert parallel" : "data parallel", pred[1], ep, pred[0]);
    }
    return 0;
}

/* Under pdde-run --elastic, the experts' split for the data-parallel ranks there are: over groups of --ep
 * (ep0 > 1) or over all of them (--moe-ep) while that divides them and the experts, else over the largest
 * groups that do (none: every rank holds every expert). */
static void elastic_experts(options *o, int ep0) {
    int want = ep0 > 1 && ep0 < o->dp ? ep0 : o->dp, E = o->model.moe_experts, ep = 1;
    for (int e = want; e > 1 && ep == 1; e--)
        if (o->dp % e == 0 && E % e == 0) ep = e;
    o->model.moe_ep = ep > 1;
    o->ep = ep > 1 && ep < o->dp ? ep : 0;
}

#ifdef PDDE_HAVE_UCX
/* Under pdde-run --elastic with --plan auto: the planner's plan for the world's ranks (pdde_plan_replan
 * from old, NULL at the start), within what in-memory snapshots hold (data parallel, any ZeRO stage:
 * no tp, no pp). Rank 0 plans, everyone takes its plan (one
 * broadcast), so the ranks cannot disagree. */
static int elastic_plan(pdde_context *ctx, options *o, pdde_comm *comm, const pdde_plan *old, pdde_plan *out) {
    int rank = pdde_comm_rank(comm), ranks = pdde_comm_size(comm);
    pdde_plan p;
    memset(&p, 0, sizeof p);
    char why[512] = "";
    if (rank == 0) {
        const char *path = o->cluster ? o->cluster : "build/cluster.json";
        pdde_plan_devices d;
        pdde_graph *g = NULL;
        gpt_model m;
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
        pp.batch = o->model.batch, pp.tp_divisor = gpt_tp_divisor(&o->model), pp.no_tp = pp.no_pp = 1;
        pdde_status st = gpt_plan_devices(ctx, path, &o->model, ranks, &d);
        if (!st) {
            st = pdde_graph_init(ctx, &g);
            if (!st) st = gpt_build(g, &o->model, &m);
            if (!st) st = pdde_backward(g, m.loss);
            if (!st) st = pdde_optimizer_adamw(g, &op);
            if (!st) st = pdde_plan_replan(g, &d, &pp, old, &p);
            pdde_graph_free(g);
            pdde_plan_devices_free(&d);
        }
        if (st || p.why[0] || p.dp != ranks) {
            snprintf(why, sizeof why, "%s (%s)", st ? pdde_last_error(ctx) : p.why[0] ? p.why : "the plan does not use every rank", path);
            memset(&p, 0, sizeof p), snprintf(p.why, sizeof p.why, "%.150s", why);
        }
    }
    /* (pdde_plan is a multiple of 8 bytes: doubles) */
    if (pdde_comm_broadcast(comm, &p, sizeof p / 4, PDDE_I32, 0)) {
        fprintf(stderr, "gpt: elastic: the plan of rank 0 did not arrive: %s\n", pdde_last_error(ctx));
        return -1;
    }
    if (p.dp != ranks) { fprintf(stderr, "gpt: elastic: --plan auto: no plan for %d ranks: %s\n", ranks, p.why); return 1; }
    *out = p;
    o->dp = p.dp, o->tp = 1, o->pp = 1, o->micro = p.micro, o->zero = p.zero, o->recompute = p.recompute, o->pp_chunks = p.chunks;
    if (rank == 0) {
        char s[256];
        pdde_plan_str(&p, s, sizeof s);
        printf("gpt: elastic: the planner chose %s for %d rank%s: predicted %.3g s/step, %.3g MB on the fullest device\n", s, ranks,
               ranks > 1 ? "s" : "", p.step_s, p.peak_bytes / 1e6);
    }
    return 0;
}
#else
static int elastic_plan(pdde_context *ctx, options *o, pdde_comm *comm, const pdde_plan *old, pdde_plan *out) {
    (void)ctx, (void)o, (void)comm, (void)old, (void)out;
    return 1;
}
#endif

/* --ft-replicas: the rows of the replicas still here, in the new ranks' order. x holds the batch of
 * all dp0 replicas (each micro-batch: dp0 blocks of `rows` rows); block ids[k] of each micro-batch
 * becomes block k (a replica that rejoined may sit after those of higher ids: copied through tmp). */
static void ft_keep_rows(int32_t *x, int32_t *tmp, int micro, int dp0, int rows, int ctx, const int *ids, int n) {
    size_t blk = (size_t)rows * (size_t)ctx;
    memcpy(tmp, x, (size_t)micro * dp0 * blk * sizeof *x);
    for (int i = 0; i < micro; i++)
        for (int k = 0; k < n; k++) memcpy(x + ((size_t)i * n + k) * blk, tmp + ((size_t)i * dp0 + ids[k]) * blk, blk * sizeof *x);
}

#define TRY(call)                                                                              \
    do {                                                                                       \
        pdde_status st_ = (call);                                                              \
        if (st_ != PDDE_OK) {                                                                  \
            const char *why_ = pdde_last_error(ctx);                                           \
            if (why_ && *why_) fprintf(stderr, "gpt: %s (%s)\n", why_, pdde_status_str(st_));   \
            else fprintf(stderr, "gpt: %s failed: %s\n", #call, pdde_status_str(st_));           \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* What a rank writes its batches with: its plan and data-parallel index (gpt_write_batch). */
typedef struct {
    const gpt_plan *plan;
    int dp_index, batch; /* batch: the global batch's rows */
} feeder;

/* A tokenizer: llm.c's file (a header of 256 int32: magic 20240328, version 1 or 2, the vocabulary
 * size, in version 2 the end-of-text id; then each token's length (u8) and bytes), read to print a
 * token file's sample as text; or Hugging Face's tokenizer.json, which also encodes a text --prompt. */
typedef struct {
    int n;
    char **bytes;      /* token id -> its bytes, NUL-terminated */
    hf_tokenizer *hf;  /* tokenizer.json's (which holds the bytes), or NULL */
} tokenizer;

static void tokenizer_free(tokenizer *t) {
    for (int i = 0; !t->hf && t->bytes && i < t->n; i++) free(t->bytes[i]);
    if (!t->hf) free(t->bytes);
    hf_tokenizer_close(t->hf), *t = (tokenizer){0};
}

/* 0, or 1 with why the file is not one (naming the field); a .json file is Hugging Face's tokenizer.json */
static int tokenizer_load(const char *path, tokenizer *t, char *why, size_t why_size) {
    *t = (tokenizer){0};
    size_t len = strlen(path);
    if (len >= 5 && !strcmp(path + len - 5, ".json")) {
        if (hf_tokenizer_open(path, &t->hf, why, why_size)) return 1;
        return t->n = t->hf->n, t->bytes = t->hf->bytes, 0;
    }
    FILE *f = fopen(path, "rb");
    int32_t header[256];
    if (!f) return snprintf(why, why_size, "%s", strerror(errno)), 1;
    int bad = fread(header, sizeof header, 1, f) != 1;
    if (bad) snprintf(why, why_size, "shorter than its 1024-byte header");
    else if (header[0] != 20240328) bad = 1, snprintf(why, why_size, "header[0] is %d: expected 20240328 (llm.c's tokenizer file)", header[0]);
    else if (header[1] != 1 && header[1] != 2) bad = 1, snprintf(why, why_size, "header[1], the version, is %d: expected 1 or 2", header[1]);
    else if (header[2] < 1 || header[2] > 1 << 24) bad = 1, snprintf(why, why_size, "header[2], the vocabulary, is %d: expected 1 to 2^24", header[2]);
    else if (!(t->bytes = calloc((size_t)header[2], sizeof *t->bytes))) bad = 1, snprintf(why, why_size, "out of memory");
    for (int i = 0; !bad && i < header[2]; i++, t->n = i) {
        unsigned char len;
        bad = fread(&len, 1, 1, f) != 1 || !(t->bytes[i] = calloc((size_t)len + 1, 1)) || fread(t->bytes[i], 1, len, f) != len;
        if (bad) snprintf(why, why_size, "token %d of %d: its bytes end past the end of the file", i, header[2]);
    }
    fclose(f);
    if (bad) tokenizer_free(t);
    return bad;
}

/* Text --data (or --val-data) for a model with a tokenizer.json: its files (each a document, a glob's in
 * name order) tokenized into a temporary token file (removed at exit), opened in *train and *val as
 * the text was; 0, or -1 said */
static char token_file[2][4200]; /* (--data's and --val-data's) */
static void remove_token_files(void) {
    for (int k = 0; k < 2; k++)
        if (token_file[k][0]) unlink(token_file[k]);
}

static int tokenize_text_data(pdde_context *ctx, const options *o, const tokenizer *tok, pdde_data **train, pdde_data **val) {
    pdde_comm_env env = {0};
    int print = pdde_comm_env_read(NULL, &env) != PDDE_OK || env.rank == 0; /* (every rank tokenizes, rank 0 says so) */
    const char *tmpdir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    for (int k = 0; k < 2; k++) {
        const char *path = k ? o->val_data : o->data;
        if (!path || !pdde_data_is_text(k ? *val : *train)) continue; /* (no --val-data: --data's file holds both) */
        glob_t g;
        char why[1024];
        if (glob(path, 0, NULL, &g) || !g.gl_pathc) { fprintf(stderr, "gpt: %s %s: no such file\n", k ? "--val-data" : "--data", path); return -1; }
        snprintf(token_file[k], sizeof token_file[k], "%s/gpt-tokens-XXXXXX", tmpdir);
        int fd = mkstemp(token_file[k]);
        if (fd < 0) { fprintf(stderr, "gpt: %s: %s\n", token_file[k], strerror(errno)); token_file[k][0] = 0; return globfree(&g), -1; }
        close(fd);
        if (!token_file[!k][0]) atexit(remove_token_files);
        hf_tokenize_stats stats;
        int bad = hf_tokenizer_write_tokens(tok->hf, g.gl_pathv, (int)g.gl_pathc, hf_tokenizer_doc_start(tok->hf), hf_tokenizer_doc_end(tok->hf, o->tokenizer),
                                            token_file[k], &stats, why, sizeof why);
        char prompts[96] = ""; /* (JSON Lines of prompts and completions) */
        if (stats.prompt_tokens) snprintf(prompts, sizeof prompts, ", %llu of them prompts' (no targets)", (unsigned long long)stats.prompt_tokens);
        if (bad) fprintf(stderr, "gpt: %s %s: %s\n", k ? "--val-data" : "--data", path, why);
        else if (print)
            printf("gpt: %s %s is text: %zu document%s, %zu bytes -> %llu tokens%s by %s\n", k ? "--val-data" : "--data", path, stats.documents,
                   stats.documents == 1 ? "" : "s", stats.bytes, (unsigned long long)stats.tokens, prompts, o->tokenizer);
        globfree(&g);
        if (bad) return -1;
    }
    pdde_data_close(*train), pdde_data_close(*val), *train = *val = NULL;
    const char *data = token_file[0][0] ? token_file[0] : o->data, *val_data = token_file[1][0] ? token_file[1] : o->val_data;
    pdde_status st = pdde_data_open_part(ctx, data, 0.0, val_data ? 1.0 : 0.9, train);
    if (!st) st = val_data ? pdde_data_open(ctx, val_data, val) : pdde_data_open_part(ctx, data, 0.9, 1.0, val);
    if (st) fprintf(stderr, "gpt: %s\n", pdde_last_error(ctx));
    return st ? -1 : 0;
}

/* --save-hf's directory gets the tokenizer the model was trained with: tokenizer.json, and the
 * tokenizer_config.json and special_tokens_map.json beside it where there are; 0, or -1 said */
static int copy_tokenizer(const char *tokenizer_json, const char *dir) {
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
    const char *slash = strrchr(tokenizer_json, '/');
    int beside = slash ? (int)(slash - tokenizer_json) : 0;
    for (int k = 0; k < 3; k++) {
        char from[4300], to[4300], tmp[4310];
        if (k) snprintf(from, sizeof from, "%.*s%s%s", beside, tokenizer_json, slash ? "/" : "", names[k]);
        else snprintf(from, sizeof from, "%s", tokenizer_json);
        snprintf(to, sizeof to, "%s/%s", dir, names[k]), snprintf(tmp, sizeof tmp, "%s.tmp", to);
        FILE *in = fopen(from, "rb"), *out = in ? fopen(tmp, "wb") : NULL;
        if (!in && k) continue;
        char buf[1 << 16];
        size_t n;
        int bad = !in || !out;
        while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, n, out) != n;
        bad |= in && ferror(in);
        if (out) bad |= fclose(out) != 0;
        if (in) fclose(in);
        if (!bad && rename(tmp, to)) bad = 1;
        if (bad) return fprintf(stderr, "gpt: --save-hf: copying %s to %s: %s\n", from, to, strerror(errno)), remove(tmp), -1;
    }
    return 0;
}

/* --prompt into o->prompt_ids: its bytes; with a tokenizer.json its ids, after the start token its
 * template puts first (LLaMA's <s>); for another token file (sample_from >= 0) the ids it lists
 * (separated by commas or spaces), each below --vocab; 0, or -1 said */
static int prompt_tokens(options *o, const tokenizer *tok) {
    size_t n = strlen(o->prompt), count = 0;
    if (tok->hf) {
        if (hf_tokenizer_encode(tok->hf, o->prompt, n, 1, &o->prompt_ids, &count)) { fprintf(stderr, "gpt: --prompt: out of memory\n"); return -1; }
        for (size_t k = 0; k < count; k++)
            if (o->prompt_ids[k] >= o->model.vocab) {
                fprintf(stderr, "gpt: --prompt '%s': %s gives id %d, past the model's vocabulary of %d: the tokenizer of another model?\n", o->prompt,
                        o->tokenizer, o->prompt_ids[k], o->model.vocab);
                return -1;
            }
        o->n_prompt = (int)count;
    } else o->prompt_ids = malloc((n + 1) * sizeof *o->prompt_ids);
    for (const char *p = o->prompt; !tok->hf && o->prompt_ids && *p;) {
        if (o->sample_from < 0) { o->prompt_ids[o->n_prompt++] = (unsigned char)*p++; continue; }
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || id < 0 || id >= o->model.vocab) {
            fprintf(stderr, "gpt: --prompt '%s': the data is token ids: give ids below --vocab %d separated by commas ('464,2068'), got '%.*s'\n",
                    o->prompt, o->model.vocab, (int)strcspn(p, ", "), p);
            return -1;
        }
        o->prompt_ids[o->n_prompt++] = (int32_t)id;
        p = end + strspn(end, ", ");
    }
    if (!o->n_prompt) { fprintf(stderr, "gpt: --prompt is empty\n"); return -1; }
    return 0;
}

/* Where some of the global batch's n targets are ignored (a prompt's: -1), their count for the session, so that
 * every micro-batch on every rank takes its part of the mean over them all (pdde_session_set_loss_tokens); else 0,
 * each micro-batch's own mean (the same then). The count of valid targets into *valid. */
static pdde_status set_loss_tokens(pdde_session *s, const int32_t *y, size_t n, int64_t *valid) {
    *valid = 0;
    for (size_t i = 0; i < n; i++) *valid += y[i] >= 0;
    return pdde_session_set_loss_tokens(s, *valid < (int64_t)n ? *valid : 0);
}

/* Mean loss over the targets of a few validation batches (forward only). */
static float validate(pdde_session *s, gpt_model *m, pdde_data *val, int batches, const feeder *f, int32_t *x, int32_t *y) {
    uint64_t pos = pdde_data_position(val);
    double sum = 0, targets = 0;
    int64_t valid;
    pdde_data_set_position(val, 0); /* the same validation windows every time */
    for (int i = 0; i < batches; i++) {
        pdde_data_next_batch(val, f->batch, m->cfg.ctx, 99, x, y);
        if (set_loss_tokens(s, y, (size_t)f->batch * (size_t)m->cfg.ctx, &valid) || gpt_write_batch(s, m, f->plan, f->dp_index, x, y) != PDDE_OK ||
            pdde_session_run(s, PDDE_RUN_FORWARD) != PDDE_OK)
            return NAN;
        sum += valid ? pdde_session_loss(s) * (double)valid : 0, targets += (double)valid; /* (a batch of prompts alone: none) */
    }
    pdde_data_set_position(val, pos);
    return targets > 0 ? (float)(sum / targets) : NAN;
}

/* The whole vocab row `row` of the logits at sampling: under vocab-parallel tensor parallelism each
 * rank holds `cols` = V / tp consecutive columns of it (in tp order), gathered from the ranks of this
 * rank's tp group (mesh rank ((d * tp) + t) * pp + s, on process pdde_plan_process_of_rank(plan, .)); every
 * rank takes part (those without the logits, other pipeline stages, send zeros). */
static void gather_vocab_row(pdde_comm *comm, const options *o, const float *row, int cols, float *all, float *whole) {
#ifdef PDDE_HAVE_UCX
    int ranks = o->dp * o->tp * o->pp, me = pdde_comm_rank(comm), mine = 0;
    const pdde_plan *plan = o->plan ? &o->parsed_plan : NULL;
    if (pdde_comm_allgather(comm, row, all, (size_t)cols, PDDE_F32) != PDDE_OK) return;
    for (int r = 0; r < ranks; r++)
        if ((plan ? pdde_plan_process_of_rank(plan, r) : r) == me) mine = r;
    int s = mine % o->pp, d = mine / o->pp / o->tp;
    for (int t = 0; t < o->tp; t++) {
        int r = (d * o->tp + t) * o->pp + s, proc = plan ? pdde_plan_process_of_rank(plan, r) : r;
        memcpy(whole + (size_t)t * cols, all + (size_t)proc * cols, (size_t)cols * sizeof *whole);
    }
#else
    (void)comm, (void)o, (void)row, (void)cols, (void)all, (void)whole;
#endif
}

/* Samples n bytes (or a token file's ids, printed as ids or through `tok`'s bytes): the context fills
 * every row of the batch, the next comes from the logits at the last filled position (temperature 0.8). Every rank runs it; under pipeline stages only the last
 * stage holds the logits: its first rank's choice goes to every rank, so the first stage feeds it in
 * next (the sample one process gives). `print` says which rank prints. */
static int descending(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The next token from the logits row[0 .. n): the likeliest at temperature 0, else drawn from
 * softmax(row / temperature) over the top_k likeliest (0: all; ties with the k-th kept), of those the
 * likeliest whose probabilities sum to top_p (0 or 1: all), with the
 * generator *seed; sorted: scratch of n */
static int sample_next(const float *row, int n, float temperature, int top_k, float top_p, float *sorted, uint64_t *seed) {
    int best = 0;
    for (int v = 1; v < n; v++) best = row[v] > row[best] ? v : best;
    if (temperature == 0) return best;
    float floor = -INFINITY;
    int nucleus = top_p > 0 && top_p < 1;
    if ((top_k > 0 && top_k < n) || nucleus) {
        memcpy(sorted, row, (size_t)n * sizeof *sorted);
        qsort(sorted, (size_t)n, sizeof *sorted, descending);
        if (top_k > 0 && top_k < n) floor = sorted[top_k - 1];
    }
    if (nucleus) { /* the likeliest of those above the floor whose probabilities reach top_p (nucleus sampling) */
        double z = 0, acc = 0;
        for (int i = 0; i < n && sorted[i] >= floor; i++) z += exp((sorted[i] - sorted[0]) / temperature);
        for (int i = 0; i < n && sorted[i] >= floor; i++)
            if ((acc += exp((sorted[i] - sorted[0]) / temperature)) >= top_p * z) { floor = sorted[i]; break; }
    }
    double sum = 0, acc = 0;
    for (int v = 0; v < n; v++) sum += row[v] >= floor ? exp((row[v] - row[best]) / temperature) : 0;
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    double r = (double)(*seed >> 11) / 9007199254740992.0 * sum;
    for (int v = 0; v < n; v++)
        if (row[v] >= floor && (acc += exp((row[v] - row[best]) / temperature)) >= r) return v;
    return best;
}

/* A rank that holds every parameter (one process, or data parallel without ZeRO-3 or experts split
 * over the ranks: rank 0 alone) samples on a model of batch 1 whose context is the first power of 2 (from
 * 16, at most --ctx) holding the tokens so far: position i's logits read tokens 0..i only, so a token
 * costs a forward of about its context, not one of the training batch at full context. Each model is
 * compiled as the context grows, with the trained parameters (and MoE biases) copied in from the
 * training session `from` (wpe: its first rows); the previous one is freed. */
typedef struct {
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
    int ctx;
} sampler;

static void sampler_free(sampler *z) { pdde_session_free(z->s), pdde_graph_free(z->g), *z = (sampler){0}; }

static pdde_status sampler_grow(sampler *z, pdde_session *from, pdde_graph *tg, const gpt_model *trained, pdde_dtype dtype,
                                const pdde_session_params *train_sp, int filled) {
    int ctx = 16;
    while (ctx < filled) ctx *= 2;
    if (ctx > trained->cfg.ctx) ctx = trained->cfg.ctx;
    if (z->s && z->ctx == ctx) return PDDE_OK;
    sampler_free(z);
    gpt_config c = trained->cfg;
    c.batch = 1, c.ctx = ctx;
    pdde_session_params sp = *train_sp;
    sp.trace = NULL, sp.world = NULL; /* (the training's trace file stays the training's; one process samples) */
    pdde_status st = pdde_graph_init(pdde_graph_context(tg), &z->g);
    if (!st) st = pdde_graph_set_compute_dtype(z->g, dtype);
    if (!st) st = gpt_build(z->g, &c, &z->m);
    if (!st) pdde_mark_output(z->m.logits), st = pdde_session_init(z->g, &sp, &z->s);
    float *buf = NULL;
    for (int i = 0; !st && i < pdde_graph_tensor_count(z->g); i++) {
        pdde_tensor *t = pdde_graph_tensor(z->g, i), *was = pdde_graph_find(tg, t->name);
        if (!was || t == z->m.ids || t == z->m.targets || t == z->m.starts || t == z->m.positions || !(t->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_INPUT)))
            continue;
        size_t whole = pdde_tensor_nbytes(was);
        float *more = realloc(buf, whole);
        st = !more ? PDDE_ERR_OOM : pdde_session_read(from, was, buf = more, whole);
        if (!st) st = pdde_session_write(z->s, t, buf, pdde_tensor_nbytes(t)); /* (wpe: the first rows) */
    }
    free(buf);
    z->ctx = ctx;
    if (st) sampler_free(z);
    return st;
}

static void sample(pdde_session *s, pdde_graph *g, gpt_model *m, pdde_comm *comm, const options *o, const pdde_session_params *sp, const tokenizer *tok,
                   const feeder *f, int n, int print) {
    int T = m->cfg.ctx, V = m->cfg.vocab, BT = f->batch * T;
    uint64_t seed = o->seed;
    int32_t *ids = calloc((size_t)BT, sizeof *ids);
    const pdde_tensor *block = pdde_session_tensor(s, m->logits); /* this rank's (NULL: another stage's) */
    size_t bytes = block ? pdde_tensor_nbytes(block) : sizeof(float);
    /* this rank's columns of a row: V, or V / tp under vocab-parallel tensor parallelism */
    int cols = block ? (int)block->shape[block->ndim - 1] : V / o->tp, split = comm && o->tp > 1 && V % o->tp == 0;
    float *logits = malloc(bytes), *zeros = calloc((size_t)V, sizeof *zeros), *whole = malloc((size_t)V * sizeof *whole);
    float *all = malloc((size_t)(split ? o->dp * o->tp * o->pp : 1) * cols * sizeof *all), *sorted = malloc((size_t)V * sizeof *sorted);
    /* text: the next byte among the first 256 logits, from a newline; a token file's ids: among all V */
    int ids_out = o->sample_from >= 0, choices = ids_out ? V : 256;
    char *text = malloc((size_t)(n + o->n_prompt) * (ids_out ? 256 : 1) + 2); /* (an id as text: at most 255 bytes) */
    int len = 0, filled = 1, first = o->n_prompt > T ? o->n_prompt - T : 0; /* (a prompt longer than the context: its end) */
    ids[0] = ids_out ? o->sample_from : '\n';
    if (o->n_prompt) memcpy(ids, o->prompt_ids + first, (size_t)(filled = o->n_prompt - first) * sizeof *ids);
    for (int k = 0; k < o->n_prompt && (tok || !ids_out); k++) /* (the text the sample goes on from) */
        len += tok ? (o->prompt_ids[k] < tok->n ? sprintf(text + len, "%s", tok->bytes[o->prompt_ids[k]]) : sprintf(text + len, "<%d>", o->prompt_ids[k]))
                   : sprintf(text + len, "%c", (char)o->prompt_ids[k]);
    sampler one = {0};
    bool alone = !comm || (o->tp * o->pp == 1 && o->zero < 3 && !o->model.moe_ep);
    int32_t end = ids_out && tok && tok->hf ? hf_tokenizer_doc_end(tok->hf, o->tokenizer) : -1; /* (the sample stops there, as an answer does) */
    int ended = 0;
    for (int k = 0; k < n && (print || !alone) && !ended; k++) {
        const float *row = zeros;
        if (alone) { /* (the rest of ids stays as it was: positions after filled - 1 do not reach its logits) */
            if (sampler_grow(&one, s, g, m, o->dtype, sp, filled) || gpt_write_micro(one.s, &one.m, 0, ids, NULL, 1) ||
                pdde_session_run(one.s, PDDE_RUN_FORWARD) || pdde_session_read(one.s, one.m.logits, logits, (size_t)one.ctx * V * sizeof *logits)) {
                fprintf(stderr, "gpt: the sample stopped after %d tokens: %s\n", k, pdde_last_error(pdde_graph_context(g)));
                break;
            }
            row = logits + (size_t)(filled - 1) * V;
        } else {
            for (int r = 1; r < BT / T; r++) memcpy(ids + r * T, ids, (size_t)T * sizeof *ids);
            if (gpt_write_batch(s, m, f->plan, f->dp_index, ids, NULL) != PDDE_OK || pdde_session_run(s, PDDE_RUN_FORWARD) != PDDE_OK) break;
            if (block && pdde_session_read(s, m->logits, logits, bytes) == PDDE_OK) row = logits + (size_t)(filled - 1) * cols;
        }
        if (split) gather_vocab_row(comm, o, row, cols, all, whole), row = whole;
        int next = sample_next(row, choices, o->temperature, o->top_k, o->top_p, sorted, &seed);
        if (comm && o->pp > 1) { /* the last stage's choice (mesh rank pp - 1: dp 0, tp 0) */
            int32_t chosen = next;
            const pdde_plan *plan = o->plan ? &o->parsed_plan : NULL;
            int root = plan ? pdde_plan_process_of_rank(plan, o->pp - 1) : o->pp - 1;
            if (pdde_comm_broadcast(comm, &chosen, 1, PDDE_I32, root) != PDDE_OK) break;
            next = chosen;
        }
        if ((ended = next == end)) break; /* (every rank chose the same) */
        if (ids_out && tok && next < tok->n && tok->bytes[next]) len += sprintf(text + len, "%s", tok->bytes[next]);
        else if (ids_out && tok) len += sprintf(text + len, "<%d>", next); /* (an id the tokenizer has no bytes for) */
        else if (ids_out) len += sprintf(text + len, "%s%d", k ? " " : "", next);
        else text[len++] = (char)next;
        if (filled == T) { memmove(ids, ids + 1, (size_t)(T - 1) * sizeof *ids); filled--; }
        ids[filled++] = next;
    }
    text[len] = 0;
    char after[64];
    if (o->n_prompt) snprintf(after, sizeof after, "the prompt's %d", o->n_prompt);
    else snprintf(after, sizeof after, "token %d", o->sample_from);
    if (ended) snprintf(after + strlen(after), sizeof after - strlen(after), ", to the end token %d", end);
    if (print && ids_out && tok) printf("---- sample (after %s, decoded by %s) ----\n%s\n----------------\n", after, o->tokenizer, text);
    else if (print && ids_out) printf("---- sample (token ids after %s: --tokenizer FILE prints them as text) ----\n%s\n----------------\n", after, text);
    else if (print) printf("---- sample ----\n%s\n----------------\n", text);
    sampler_free(&one);
    free(ids), free(logits), free(zeros), free(whole), free(all), free(text), free(sorted);
}

/* The cluster file's figures (--cluster, else build/cluster.json where there is one) into *out, NULL
 * without: auto --device times the step by them, and PDDE_PROFILE=device takes its peaks from them. A
 * --cluster that is there but does not load is an error (as for --plan auto), naming the file and the
 * field; one that is not there, or a build/cluster.json that does not load, is said, and the run goes
 * on without (devices timed by kind). */
static int measured_cluster(pdde_context *ctx, const options *o, pdde_cluster **out) {
    const char *path = o->cluster ? o->cluster : "build/cluster.json";
    *out = NULL;
    if (access(path, F_OK)) {
        if (o->cluster) fprintf(stderr, "gpt: --cluster %s: %s (going on without it)\n", path, strerror(errno));
        return 0;
    }
    if (pdde_cluster_load(ctx, path, out) == PDDE_OK) return 0;
    fprintf(stderr, "gpt: %s%s (build/pdde-bench -o FILE writes one, --check FILE reads one back)%s\n", o->cluster ? "--cluster: " : "",
            pdde_last_error(ctx), o->cluster ? "" : ": going on without it"); /* (the library's message names the file) */
    return o->cluster != NULL;
}

/* --device (else $PDDE_DEVICE, else auto) for this rank, auto timing the step g on each candidate with
 * the figures of the measured cluster where there is one. */
static int rank_device(pdde_context *ctx, const options *o, const pdde_graph *g, const pdde_cluster *measured, pdde_device_choice *out) {
    pdde_device_select_params ds = PDDE_DEVICE_SELECT_PARAMS_INIT;
    ds.backend = o->device, ds.share = o->share_device, ds.graph = g;
    ds.cluster = measured;
    pdde_status st = pdde_device_select(ctx, &ds, out);
    if (st) fprintf(stderr, "gpt: %s: %s\n", o->device ? "--device" : "PDDE_DEVICE", pdde_last_error(ctx));
    return st != PDDE_OK;
}

/* 1, saying so, when a launcher started more ranks than the given plan's one: each would train its own
 * copy of the model (and write the same --ckpt-dir). Expert parallelism needs them as an ep group too:
 * its experts split over the --dp (or --tp) ranks. (With no plan given, dp is the launcher's ranks.) */
static int world_too_large(pdde_context *ctx, const options *o) {
    pdde_comm_env env;
    if (pdde_comm_env_read(ctx, &env) != PDDE_OK || env.world_size <= 1) return 0; /* (no launcher: one process) */
    /* (every rank says it: the launcher may stop the others when the first one ends) */
    fprintf(stderr, "gpt: the launcher started %d ranks but the plan (--dp 1 x --tp 1 x --pp 1) uses one: each would train its own copy%s. "
            "Give --dp %d (or --tp, --pp, --plan) to use them%s\n", env.world_size, o->ckpt_dir ? " into the same --ckpt-dir" : "",
            env.world_size, o->model.moe_ep ? " (--moe-ep splits the experts over the --dp ranks)" : "");
    return 1;
}

/* The model flags that the tensors' shapes do not show, kept beside the checkpoint in --ckpt-dir (the
 * file MODEL_FLAGS_FILE): a resume with other heads, kv heads, rope base or scaling, top-k, capacity,
 * norm epsilon, LoRA alpha or window would load the tensors silently and train another function. The training
 * data (--data and its token count) is kept there too: the checkpoint's data position means nothing in
 * other data. */
#define MODEL_FLAGS_FILE "gpt-model-flags.txt"
enum { MODEL_FLAGS = 10 };
/* Each model flag's name and value as --help writes it */
static void model_flags(const gpt_config *c, const char *name[MODEL_FLAGS], char value[MODEL_FLAGS][160]) {
    static const char *const names[MODEL_FLAGS] = {"--arch", "--heads", "--kv-heads", "--rope-base", "--moe-topk", "--moe-capacity", "--norm-eps",
                                                   "--rope-scaling", "--lora-alpha", "--window"};
    int moe = c->moe_experts > 1; /* (without experts the MoE flags change nothing: 0) */
    for (int k = 0; k < MODEL_FLAGS; k++) name[k] = names[k];
    snprintf(value[0], 160, "%s", gpt_arch_name(c->arch));
    snprintf(value[1], 160, "%d", c->heads), snprintf(value[2], 160, "%d", gpt_kv_heads(c));
    snprintf(value[3], 160, "%.9g", gpt_rope_base(c));
    snprintf(value[4], 160, "%d", moe ? gpt_moe_topk(c) : 0), snprintf(value[5], 160, "%.9g", moe ? c->moe_capacity : 0.0f);
    gpt_hf_float(value[6], gpt_norm_eps(c));
    rope_scaling_str(c, value[7]);
    snprintf(value[8], 160, "%.9g", c->lora_rank > 0 ? gpt_lora_alpha(c) : 0.0f);
    snprintf(value[9], 160, "%d", gpt_window(c));
}

/* The training data as the flags file keeps it: "PATH (N tokens)", and with --doc-windows ", windows at
 * token T" (the windows are other ones: the checkpoint's data position means nothing in them) */
static void data_said(char *out, size_t size, const char *data, int64_t tokens, int windows_at) {
    int n = snprintf(out, size, "%s (%lld tokens", data, (long long)tokens);
    if (n > 0 && (size_t)n < size) snprintf(out + n, size - n, windows_at >= 0 ? ", windows at token %d)" : ")", windows_at);
}

/* Writes dir/MODEL_FLAGS_FILE (through a temporary file: a crash leaves the old one), after a save: a
 * crash between leaves the flags of the run before, which refuses a resume rather than passing one.
 * windows_at: --doc-windows' start token, -1 without. */
static int save_model_flags(const char *dir, const gpt_config *c, const char *data, int64_t tokens, int windows_at) {
    char path[4200], tmp[4210];
    snprintf(path, sizeof path, "%s/%s", dir, MODEL_FLAGS_FILE), snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const char *name[MODEL_FLAGS];
    char value[MODEL_FLAGS][160];
    model_flags(c, name, value);
    FILE *f = fopen(tmp, "w");
    if (!f) { fprintf(stderr, "gpt: cannot write %s: %s\n", tmp, strerror(errno)); return 1; }
    fprintf(f, "# the model flags of the checkpoint here that its tensors' shapes do not show (gpt --resume checks them)\n");
    for (int k = 0; k < MODEL_FLAGS; k++) fprintf(f, "%s %s\n", name[k] + 2, value[k]);
    fprintf(f, "windows-at %d\n", windows_at);
    fprintf(f, "data %lld %s\n", (long long)tokens, data); /* (last: the path may hold spaces) */
    int bad = fflush(f) || fsync(fileno(f));
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) { fprintf(stderr, "gpt: cannot write %s: %s\n", path, strerror(errno)); return 1; }
    return 0;
}

/* The training data the checkpoint in dir was saved from (was[], as data_said writes it): 1 when it is
 * not this run's (current[]), 0 when it is or the flags file does not say. A file without a windows-at line
 * was saved by a gpt without --doc-windows: windows at any token. */
static int data_changed(const char *dir, const char *current, char *was, size_t was_size) {
    char path[4200], line[4200];
    snprintf(path, sizeof path, "%s/%s", dir, MODEL_FLAGS_FILE);
    FILE *f = fopen(path, "r");
    int changed = 0, windows_at = -1;
    long long n = 0;
    int at = 0;
    while (f && !changed && fgets(line, sizeof line, f)) {
        if (sscanf(line, "windows-at %d", &windows_at) == 1) continue;
        if (sscanf(line, "data %lld %n", &n, &at) != 1 || !at) continue;
        line[strcspn(line, "\n")] = 0;
        data_said(was, was_size, line + at, n, windows_at);
        changed = strcmp(was, current) != 0;
    }
    if (f) fclose(f);
    return changed;
}

/* After a resume: 1, naming the flag and both values, when dir/MODEL_FLAGS_FILE holds other flags than
 * c's; a checkpoint without the file (saved before gpt wrote it) is said and kept. */
static int check_model_flags(const char *dir, const gpt_config *c, int say, const char *use) {
    char path[4200], line[256];
    snprintf(path, sizeof path, "%s/%s", dir, MODEL_FLAGS_FILE);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (say) printf("gpt: %s has no %s (a checkpoint of an older gpt): --heads, --kv-heads, --rope-base, --rope-scaling, --moe-topk, "
                        "--moe-capacity, --norm-eps, --lora-alpha and --window are taken as given, unchecked\n", dir, MODEL_FLAGS_FILE);
        return 0;
    }
    const char *name[MODEL_FLAGS];
    char value[MODEL_FLAGS][160];
    model_flags(c, name, value);
    int bad = 0;
    while (!bad && fgets(line, sizeof line, f)) {
        char key[64], saved[160];
        if (line[0] == '#' || sscanf(line, "%63s %159s", key, saved) != 2) continue;
        for (int k = 0; k < MODEL_FLAGS; k++) {
            if (strcmp(key, name[k] + 2)) continue;
            if (strcmp(saved, value[k])) {
                fprintf(stderr, "gpt: cannot %s: %s holds another model's checkpoint: saved with %s %s, this run has %s %s: give the model "
                        "flags that saved it\n", use, dir, name[k], saved, name[k], value[k]);
                bad = 1;
            }
        }
    }
    fclose(f);
    return bad;
}

/* The MoE log line: the balance loss (1 = even), tokens per expert of the first MoE block, the busiest
 * expert over the mean in any block, and the tokens a capacity dropped in all of them. Under pipeline
 * stages each rank reads its own stage's blocks and the balance (on the last stage): every rank takes
 * part in a max-reduce to rank 0 (a block not read is -1; ranks of one stage read the same counts), so
 * rank 0 prints the whole model's line. */
static pdde_status print_moe(pdde_session *s, pdde_graph *g, const gpt_model *m, pdde_comm *stages, int print) {
    const gpt_config *c = &m->cfg;
    int E = c->moe_experts, k = gpt_moe_topk(c), L = c->layers;
    int64_t N = (int64_t)c->batch * c->ctx, cap = pdde_moe_capacity(N, k, E, c->moe_capacity), dropped = 0, routed = 0;
    size_t n = (size_t)L * E;
    int32_t *counts = malloc(n * sizeof *counts), *all = malloc(n * sizeof *all);
    float balance = -1, best = -1; /* (the balance loss is >= 0: -1 = not on this rank) */
    pdde_status st = counts && all ? PDDE_OK : PDDE_ERR_OOM;
    for (size_t i = 0; i < n && !st; i++) counts[i] = -1;
    if (!st && pdde_session_tensor(s, m->moe_balance)) st = pdde_session_read(s, m->moe_balance, &balance, sizeof balance);
    for (int l = 0; l < L && !st; l++) {
        char name[64];
        snprintf(name, sizeof name, "h%d.moe.counts", l);
        pdde_tensor *t = gpt_block_is_moe(c, l) ? pdde_graph_find(g, name) : NULL;
        if (t && pdde_session_tensor(s, t)) st = pdde_session_read(s, t, counts + (size_t)l * E, (size_t)E * sizeof *counts);
    }
#ifdef PDDE_HAVE_UCX
    if (!st && stages) st = pdde_comm_reduce(stages, counts, all, n, PDDE_I32, PDDE_REDUCE_MAX, 0);
    if (!st && stages) st = pdde_comm_reduce(stages, &balance, &best, 1, PDDE_F32, PDDE_REDUCE_MAX, 0);
#endif
    if (!stages && !st) memcpy(all, counts, n * sizeof *all), best = balance;
    char first[1024] = "";
    double worst = 0;
    for (int l = 0; l < L && !st && print; l++) {
        const int32_t *cl = all + (size_t)l * E;
        if (cl[0] < 0) continue; /* (not an MoE block) */
        int most = 0, sum = 0;
        for (int e = 0; e < E; e++) most = cl[e] > most ? cl[e] : most, sum += cl[e];
        worst = fmax(worst, most / ((double)sum / E));
        dropped += pdde_moe_dropped(cl, E, cap), routed += sum;
        if (!first[0]) {
            size_t w = (size_t)snprintf(first, sizeof first, "h%d", l);
            for (int e = 0; e < E && e < 64 && w < sizeof first; e++) w += (size_t)snprintf(first + w, sizeof first - w, " %d", cl[e]);
        }
    }
    if (!st && print && best < 0) printf("      moe  (balance: on the last stage)");
    else if (!st && print) printf("      moe  balance %.4f", best);
    if (!st && print)
        printf("  tokens per expert %s  busiest/mean %.2f  dropped %lld of %lld\n", first, worst, (long long)dropped, (long long)routed);
    free(counts), free(all);
    return st;
}

int main(int argc, char **argv) {
    options o = {
        .model = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8},
        .steps = 600, .val_every = 100, .val_batches = 8, .sample_len = 300, .ckpt_every = 200,
        .model.moe_aux = 0.01f,
        .lr = 3e-3f, .weight_decay = 0.1f, .temperature = 0.8f, .clip = 1.0f, .seed = 1337, .dp = 1, .tp = 1, .pp = 1, .micro = 1,
        .data = "/usr/share/games/fortunes/songs-poems", .doc_token = -1,
    };
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse(argc, argv, &o)) return 2;
    o.model.moe_bias = o.moe_bias_rate > 0;

    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = o.threads;
    cp.seed = o.seed;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) { fprintf(stderr, "gpt: cannot create a context\n"); return 1; }
    tokenizer tok = {0}; /* (read now: a bad file is said before training, not after) */
    char why[512], beside[4200];
    if (!o.tokenizer && o.init_from && o.init == INIT_HF) { /* (a Hugging Face model's own tokenizer.json) */
        char *dir = hf_dir(o.init_from);
        if (dir) snprintf(beside, sizeof beside, "%s/tokenizer.json", dir);
        if (dir && !access(beside, R_OK)) o.tokenizer = beside;
        free(dir);
    }
    if (o.tokenizer && tokenizer_load(o.tokenizer, &tok, why, sizeof why)) {
        fprintf(stderr, "gpt: --tokenizer %s: %s\n", o.tokenizer, why);
        return 2;
    }
    pdde_data *train, *val;
    TRY(pdde_data_open_part(ctx, o.data, 0.0, o.val_data ? 1.0 : 0.9, &train));
    TRY(o.val_data ? pdde_data_open(ctx, o.val_data, &val) : pdde_data_open_part(ctx, o.data, 0.9, 1.0, &val));
    if (tok.hf && (pdde_data_is_text(train) || pdde_data_is_text(val)) && tokenize_text_data(ctx, &o, &tok, &train, &val)) return 1;
    for (int k = 0; k < 2; k++) { /* (an id past the vocabulary would stop the first step, at the embedding) */
        pdde_data *d = k ? val : train;
        if (pdde_data_max_token(d) < 0) { fprintf(stderr, "gpt: %s\n", pdde_last_error(ctx)); return 1; }
        if (pdde_data_max_token(d) < o.model.vocab) continue;
        fprintf(stderr, "gpt: %s %s holds token id %d, past --vocab %d: give a --vocab above it (GPT-2's tokens: 50304)\n",
                k ? "--val-data" : "--data", k && o.val_data ? o.val_data : o.data, pdde_data_max_token(d), o.model.vocab);
        return 1;
    }
    o.sample_from = -1;
    if (pdde_data_max_token(train) > 255) { /* ids, not bytes: the sample starts from a validation token */
        int32_t *x = malloc((size_t)o.model.ctx * 2 * sizeof *x);
        if (x && pdde_data_next_batch(val, 1, o.model.ctx, o.seed, x, x + o.model.ctx) == PDDE_OK) o.sample_from = x[0];
        pdde_data_set_position(val, 0), free(x);
    }
    if (o.prompt && prompt_tokens(&o, &tok)) return 2;
    o.model.doc_token = o.doc_token >= 0 ? o.doc_token : tok.hf ? hf_tokenizer_doc_start(tok.hf) : -1;
    if ((o.model.doc_mask || o.doc_windows) && (o.model.doc_token < 0 || o.model.doc_token >= o.model.vocab)) {
        fprintf(stderr, "gpt: %s needs the token each document starts with, below --vocab %d: a tokenizer.json's (--tokenizer, or "
                "--init-from's) or --doc-token ID (llm.c's GPT-2 shards: 50256), got %d\n", o.model.doc_mask ? "--doc-mask" : "--doc-windows",
                o.model.vocab, o.model.doc_token);
        return 2;
    }
    if (o.doc_windows && (pdde_data_align_windows(train, o.model.doc_token) || pdde_data_align_windows(val, o.model.doc_token))) {
        fprintf(stderr, "gpt: --doc-windows: %s\n", pdde_last_error(ctx));
        return 1;
    }
    int windows_at = o.doc_windows ? o.model.doc_token : -1;
    char data_now[4300];
    data_said(data_now, sizeof data_now, o.data, pdde_data_token_count(train), windows_at);
    if (o.val_data && pdde_data_token_count(val) <= o.model.ctx) {
        fprintf(stderr, "gpt: --val-data %s: %lld tokens, must be longer than --ctx %d\n", o.val_data, (long long)pdde_data_token_count(val), o.model.ctx);
        return 1;
    }
    if (pdde_data_token_count(val) <= o.model.ctx) { /* (the validation windows are --ctx + 1 tokens) */
        int64_t have = pdde_data_token_count(train) + pdde_data_token_count(val), need = o.model.ctx + 1;
        while (need - (int64_t)(0.9 * (double)need) <= o.model.ctx) need++; /* (the split as pdde_data_open_part makes it) */
        fprintf(stderr, "gpt: --data %s: %lld tokens (bytes of text): its last 10%%, the validation split (%lld tokens), must be longer than "
                "--ctx %d: it needs at least %lld tokens (or a smaller --ctx)\n", o.data, (long long)have, (long long)pdde_data_token_count(val),
                o.model.ctx, (long long)need);
        return 1;
    }

    /* Several ranks: every parallelism comes from distributed attributes — one global graph (of one
     * micro-batch), annotated for the plan, completed, and run SPMD by each rank. */
    pdde_comm *comm = NULL;
    int el_auto = o.plan && !strcmp(o.plan, "auto") && under_elastic(); /* (planned below) */
    if (o.plan && !strcmp(o.plan, "auto") && !el_auto && choose_plan(ctx, &o)) return 1;
    int rank = 0, ranks = o.dp * o.tp * o.pp;
    /* under pdde-run --elastic: data parallel over whatever ranks there are; a lost rank is recovered
     * from in process (the survivors re-form the world, rebuild for dp = the ranks left, restore the
     * in-memory snapshot and go on) */
    pdde_elastic *el = NULL;
    char el_plan[256] = "", ep_text[24];
    int el_tp0 = 1, el_pp0 = 1, el_ep0 = 0, el_moe_ep0 = 0; /* --tp, --pp, --ep, --moe-ep asked for: kept while the ranks there are allow them */
    int ft_dp0 = 0, ft_me = 0, ft_global = 0, ft_rows = 0, ft_moved = 0, ft_ids[4096]; /* --ft-replicas: the replicas started, mine, rows */
    if (under_elastic()) {
        if (o.plan && !el_auto) { fprintf(stderr, "gpt: under pdde-run --elastic the plan is --dp (the ranks there are), --tp, --pp and --zero, or --plan auto\n"); return 2; }
        if (o.ft && (el_auto || o.tp * o.pp > 1)) { fprintf(stderr, "gpt: --ft-replicas keeps the plan of the ranks started, data parallel: no --plan auto, --tp, --pp\n"); return 2; }
        el_tp0 = o.tp, el_pp0 = o.pp, el_ep0 = o.ep, el_moe_ep0 = o.model.moe_ep;
        int joiner = getenv("PDDE_ELASTIC_JOIN") && atoi(getenv("PDDE_ELASTIC_JOIN"));
        TRY(pdde_elastic_init(ctx, NULL, &el));
        comm = pdde_elastic_world(el);
        if (o.ft && !joiner) { /* each replica's rows of the global batch (per micro-batch) */
            ft_dp0 = pdde_comm_size(comm), ft_me = pdde_comm_rank(comm), ft_global = o.model.batch;
            if (ft_global % (ft_dp0 * o.micro)) { fprintf(stderr, "gpt: --ft-replicas: %d ranks x --micro %d do not divide --batch %d\n", ft_dp0, o.micro, ft_global); return 2; }
            ft_rows = ft_global / (ft_dp0 * o.micro);
        } else if (o.ft) {
            ft_me = -1; /* a replica that (re)joins: it takes a replica not held, told below */
        }
    }
    if (o.ft && !el) { fprintf(stderr, "gpt: --ft-replicas needs pdde-run --elastic\n"); return 2; }
    int64_t job_first = -1; /* the step this process started at (an elastic re-form starts the loop again) */
    double job_t0 = 0;
elastic_rebuild:
    if (el) {
        rank = pdde_comm_rank(comm), ranks = o.dp = pdde_comm_size(comm);
        o.tp = el_tp0, o.pp = el_pp0; /* (tp x pp must divide the ranks, and dp x micro the batch; else data parallel) */
        if (ranks % (o.tp * o.pp) || o.model.batch % (ranks / (o.tp * o.pp) * o.micro)) o.tp = o.pp = 1;
        o.dp = ranks / (o.tp * o.pp);
        if (o.tp == 1 && (el_ep0 > 1 || el_moe_ep0)) elastic_experts(&o, el_ep0);
        if (el_auto) { /* the planner's plan for these ranks (re-planned from the last one at a change) */
            int had = o.parsed_plan.dp > 0, bad = elastic_plan(ctx, &o, comm, had ? &o.parsed_plan : NULL, &o.parsed_plan);
            if (bad) return 1;
        }
        if (o.ft) { /* no re-plan: each rank keeps its replica's rows; the batch is the rows of those here */
            if (ranks > (int)(sizeof ft_ids / sizeof *ft_ids)) { fprintf(stderr, "gpt: --ft-replicas: at most %d ranks\n", (int)(sizeof ft_ids / sizeof *ft_ids)); return 1; }
            int32_t head[3] = {ft_dp0, ft_rows, ft_global}; /* (rank 0 is a member that was here before: joiners come last) */
            TRY(pdde_comm_broadcast(comm, head, 3, PDDE_I32, 0));
            ft_dp0 = head[0], ft_rows = head[1], ft_global = head[2];
            TRY(pdde_comm_allgather(comm, &ft_me, ft_ids, 1, PDDE_I32));
            for (int k = 0; k < ranks; k++) { /* joiners take the replicas no rank holds, the lowest first, in rank order */
                for (int d = 0; d < ft_dp0 && ft_ids[k] < 0; d++) {
                    int held = 0;
                    for (int j = 0; j < ranks; j++) held |= ft_ids[j] == d;
                    if (!held) ft_ids[k] = d;
                }
                if (ft_ids[k] < 0) { fprintf(stderr, "gpt: --ft-replicas: rank %d joined but all %d replicas are held\n", k, ft_dp0); return 1; }
                if (k == rank) ft_me = ft_ids[k];
            }
            ft_moved = ranks < ft_dp0;
            for (int k = 0; k < ranks; k++) ft_moved |= ft_ids[k] != k;
            o.model.batch = ft_rows * o.micro * ranks;
        }
        if (o.model.batch % (o.dp * o.micro)) { fprintf(stderr, "gpt: elastic: %d ranks x --micro %d do not divide --batch %d: stopping\n", o.dp, o.micro, o.model.batch); return 1; }
        if (el_auto) pdde_plan_str(&o.parsed_plan, el_plan, sizeof el_plan);
        else snprintf(el_plan, sizeof el_plan, "dp=%d,tp=%d,pp=%d,mb=%d,zero=%d%s", o.dp, o.tp, o.pp, o.micro, o.dp > 1 ? o.zero : 0,
                      !o.model.moe_ep ? "" : o.ep > 1 ? (snprintf(ep_text, sizeof ep_text, ",ep=%d", o.ep), ep_text) : ",ep=dp");
        if (o.ft) { /* the batch is not re-split: each rank keeps its replica's rows; say whose are dropped */
            size_t n = strlen(el_plan);
            n += (size_t)snprintf(el_plan + n, sizeof el_plan - n, ", each replica's rows kept (the batch not re-split)");
            if (ranks < ft_dp0 && n < sizeof el_plan) n += (size_t)snprintf(el_plan + n, sizeof el_plan - n, ", batch %d: the samples of replica", o.model.batch);
            for (int d = 0; d < ft_dp0 && ranks < ft_dp0 && n < sizeof el_plan; d++) {
                int held = 0;
                for (int k = 0; k < ranks; k++) held |= ft_ids[k] == d;
                if (!held) n += (size_t)snprintf(el_plan + n, sizeof el_plan - n, " %d", d);
            }
            if (ranks < ft_dp0 && n < sizeof el_plan) snprintf(el_plan + n, sizeof el_plan - n, " dropped");
        }
    } else if (ranks == 1 && world_too_large(ctx, &o)) {
        return 2;
    } else if (ranks > 1) {
#ifdef PDDE_HAVE_UCX
        pdde_comm_params pp = PDDE_COMM_PARAMS_INIT;
        TRY(pdde_comm_init(ctx, &pp, &comm));
        if (pdde_comm_size(comm) != ranks) {
            fprintf(stderr, "gpt: --dp %d x --tp %d x --pp %d is %d ranks but the launcher started %d: start it with pdde-run -n %d, "
                    "or choose --dp/--tp/--pp whose product is %d\n", o.dp, o.tp, o.pp, ranks, pdde_comm_size(comm), ranks, pdde_comm_size(comm));
            return 1;
        }
        rank = pdde_comm_rank(comm);
#else
        fprintf(stderr, "gpt: --dp needs pdde built with UCX\n");
        return 1;
#endif
    }
    pdde_graph *g;
    gpt_model m;
    TRY(pdde_graph_init(ctx, &g));
    TRY(pdde_graph_set_compute_dtype(g, o.dtype));
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = o.lr, op.weight_decay = o.weight_decay, op.clip_norm = o.clip;
    op.schedule = o.steps > 0 ? PDDE_LR_COSINE : PDDE_LR_CONSTANT; /* (--steps 0: nothing to decay over; a sample) */
    op.warmup_steps = o.steps / 20, op.total_steps = o.steps, op.min_lr_ratio = 0.1f;
    /* recompute: only the residual stream between blocks is kept for backward */
    gpt_plan plan = {.dp = o.dp, .tp = o.tp, .pp = o.pp, .micro = o.micro, .zero = o.zero, .recompute = o.recompute, .pp_chunks = o.pp_chunks, .ep = o.ep};
    if (o.plan) plan = gpt_plan_of(&o.parsed_plan);
    const char *dev = o.device ? o.device : getenv("PDDE_DEVICE"); /* (auto may pick a CUDA device) */
    if (!dev || !strcmp(dev, "auto")) dev = pdde_device_find(ctx, "cuda", 0) >= 0 ? "cuda" : NULL;
    o.model.separate_qkv = gpt_separate_qkv(dev) || gpt_separate_qkv(o.blocks_on) || gpt_separate_qkv(o.plan);
    TRY(gpt_build_plan(g, &o.model, &plan, &op, &m));
    pdde_mark_output(m.logits);

    /* placement: with --blocks-on, the transformer blocks (layers 1..L) go to that backend's device 0 */
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = el && ranks == 1 ? NULL : comm; /* (an elastic world of one rank runs as one process) */
    sp.pipeline_schedule = o.gpipe || (o.plan && o.parsed_plan.schedule == PDDE_PIPELINE_GPIPE) ? PDDE_PIPELINE_GPIPE : PDDE_PIPELINE_1F1B;
    if (o.comm_bf16 || (o.plan && o.parsed_plan.comm_dtype == PDDE_BF16)) sp.comm_dtype = PDDE_BF16;
    sp.trace = o.trace;
    /* the rank's device (its local rank's of the backend asked for) runs the whole step */
    pdde_device_choice dc;
    pdde_cluster *measured = NULL;
    if (measured_cluster(ctx, &o, &measured)) return 1;
    sp.cluster = measured; /* (PDDE_PROFILE=device's peaks, read at the session's start) */
    if (rank_device(ctx, &o, g, measured, &dc)) { pdde_cluster_free(measured); return 1; }
    sp.device = dc.device;
    printf("gpt: rank %d: device %d, %s:%d (%s): %s\n", rank, dc.device, dc.backend, dc.index, dc.name, dc.why);
    int L = o.model.layers + 2, *layer_dev = malloc((size_t)L * sizeof *layer_dev);
    const char *where = dc.backend;
    int placed_device = -1; /* the device --blocks-on (or a plan's place=) puts layers on */
    const pdde_plan *placed = o.plan && o.parsed_plan.place[0] ? &o.parsed_plan : NULL; /* --plan ...,place=B: the plan's layers */
    for (int l = 0; l < L; l++) layer_dev[l] = -1; /* the rank's device */
    if (o.blocks_on || placed) {
        const char *backend = o.blocks_on ? o.blocks_on : placed->place;
        pdde_device_select_params ds = PDDE_DEVICE_SELECT_PARAMS_INIT;
        pdde_device_choice pc;
        ds.backend = backend, ds.share = 1; /* a placement target: shared when a host has fewer than its ranks */
        if (pdde_device_select(ctx, &ds, &pc)) {
            fprintf(stderr, "gpt: %s %s: %s (see build/pdde-info)\n", o.blocks_on ? "--blocks-on" : "--plan place=", backend, pdde_last_error(ctx));
            return 1;
        }
        for (int l = 0; l < L; l++)
            if (o.blocks_on ? l >= 1 && l <= o.model.layers : pdde_plan_layer_on_device(placed, L, l)) layer_dev[l] = pc.device;
            else if (o.blocks_on) layer_dev[l] = 0; /* the embedding and the head on the CPU */
        sp.layer_devices = layer_dev, sp.n_layer_devices = L;
        where = backend;
        placed_device = pc.device;
    } else if (o.tp > 1 && dc.device != 0) {
        /* the vocab-parallel embedding and head (the vocab split over tp) run in their CPU form */
        layer_dev[0] = layer_dev[L - 1] = 0;
        sp.layer_devices = layer_dev, sp.n_layer_devices = L;
        if (rank == 0) printf("gpt: tp %d: the vocab-parallel embedding and head run on the CPU, the blocks on %s\n", o.tp, dc.backend);
    }
    pdde_session *s;
    TRY(pdde_session_init(g, &sp, &s));
    pdde_cluster_free(measured), sp.cluster = NULL;
    if (placed_device >= 0 && rank == 0) { /* what the placed device itself runs (a device that runs little leaves it to the CPU) */
        int on = 0, all = 0;
        for (int i = 0; i < pdde_session_node_count(s); i++) {
            const pdde_tensor *t = pdde_session_node(s, i);
            if (t->op == PDDE_OP_NONE || t->op == PDDE_OP_COPY) continue;
            all++, on += t->device == placed_device;
        }
        printf("gpt: %d of the step's %d nodes run on %s (device %d)\n", on, all, where, placed_device);
    }
    int restored = 0; /* the state came from a snapshot or a checkpoint */
    if (el && pdde_elastic_generation(el) > 0) {
        uint64_t pos = 0;
        TRY(pdde_elastic_restore(el, s, el_plan, &pos));
        pdde_data_set_position(train, pos);
        restored = 1;
    }
    if (o.show_program) pdde_session_dump(s, stdout);
    pdde_memory_stats ms;
    pdde_session_memory(s, &ms);
    char scaling[160];
    rope_scaling_str(&o.model, scaling);
    char heads[64] = "";
    if (o.model.head_dim) snprintf(heads, sizeof heads, ", heads %d wide", o.model.head_dim);
    if (o.model.arch == GPT_ARCH_LLAMA) printf("gpt: LLaMA-style blocks, %d kv heads, rope base %g%s%s, ffn %lld%s%s%s\n", gpt_kv_heads(&o.model),
                                               gpt_rope_base(&o.model), o.model.rope_scaling[0] > 0 ? ", LLaMA 3 scaling " : "",
                                               o.model.rope_scaling[0] > 0 ? scaling : "", (long long)gpt_ffn(&o.model), o.model.qkv_bias ? ", qkv bias" : "",
                                               heads, o.model.qk_norm ? ", q and k normed per head" : "");
    if (o.model.lora_rank > 0)
        printf("gpt: LoRA rank %d, alpha %g: %.2fM parameters trained, the pretrained weights frozen\n", o.model.lora_rank, gpt_lora_alpha(&o.model),
               (double)gpt_n_lora_params(&o.model) / 1e6);
    if (gpt_window(&o.model)) printf("gpt: sliding-window attention: each token sees itself and the %d before it\n", gpt_window(&o.model) - 1);
    if (o.model.untied_head || gpt_norm_eps(&o.model) != 1e-5f || (o.model.arch != GPT_ARCH_LLAMA && gpt_ffn(&o.model) != 4LL * o.model.width))
        printf("gpt: %s head, norm epsilon %g, ffn %lld\n", o.model.untied_head ? "an untied" : "a tied", gpt_norm_eps(&o.model), (long long)gpt_ffn(&o.model));
    printf("gpt: %d layers, %d heads, width %d, context %d, batch %d: %.2fM parameters; blocks on %s%s, %d thread%s",
           o.model.layers, o.model.heads, o.model.width, o.model.ctx, o.model.batch, (double)gpt_n_params(&o.model) / 1e6,
           where, o.recompute ? " (recomputed)" : "", pdde_context_thread_count(ctx), pdde_context_thread_count(ctx) > 1 ? "s" : "");
    if (ranks > 1) printf("; %d ranks: dp %d x tp %d x pp %d%s%s", ranks, o.dp, o.tp, o.pp, o.zero ? ", ZeRO-" : "", o.zero ? (const char *[]){"", "1", "2", "3"}[o.zero] : "");
    if (ranks > 1 && o.model.moe_ep) /* (expert parallelism: each rank holds its part of every MoE block's experts) */
        printf(", the experts split over %s %d", o.ep > 1 ? "groups of ep" : o.tp > 1 ? "tp" : "dp", o.ep > 1 ? o.ep : o.tp > 1 ? o.tp : o.dp);
    if (o.micro > 1) printf("; %d micro-batches%s", o.micro, o.pp > 1 ? (o.gpipe ? " (GPipe)" : " (1F1B)") : "");
    if (plan.shares && o.dp > 1) { /* (uneven shares: this rank's part of each step) */
        int all = 0;
        for (int d = 0; d < o.dp; d++) all += plan.shares[d];
        printf("; uneven shares: this rank runs %d of the step's %d micro-batches", plan.shares[rank / (o.tp * o.pp)] * o.micro, all * o.micro);
    }
    printf("\n");
    /* the arena holds one micro-batch's activations per micro-batch in flight (pipeline stages keep
     * several), with the memory plan's reuse; the sum is one pass's tensors as if none shared memory */
    char frozen[64] = "";
    if (o.model.lora_rank > 0) snprintf(frozen, sizeof frozen, ", frozen weights and inputs %.1f MB", ms.input_bytes / 1e6);
    printf("gpt: data %s (%lld training tokens); memory: params %.1f MB, grads %.1f MB, adam %.1f MB%s, activations %.1f MB (the memory plan's "
           "arenas, one a micro-batch in flight: %.1f MB alive at most in each; %.1f MB a micro-batch's tensors summed without reuse)\n",
           o.data, (long long)pdde_data_token_count(train), ms.param_bytes / 1e6, ms.grad_bytes / 1e6, ms.optimizer_bytes / 1e6, frozen,
           ms.arena_bytes / 1e6, ms.activation_peak_bytes / 1e6, ms.activation_bytes / 1e6);

    char ckpt[4096] = "";
    if (o.ckpt_dir) {
        if (mkdir(o.ckpt_dir, 0755) && errno != EEXIST) { /* (here, not at the first save steps later) */
            fprintf(stderr, "gpt: --ckpt-dir %s: %s\n", o.ckpt_dir, strerror(errno));
            return 1;
        }
        /* a sharded checkpoint (each rank writes its blocks; it loads under any plan) in the directory */
        snprintf(ckpt, sizeof ckpt, "%s", o.ckpt_dir);
        if (o.resume) {
            pdde_checkpoint_extra ex = {.use_graph_schedule = o.reschedule};
            pdde_status st = pdde_checkpoint_load(s, ckpt, &ex);
            char single[4200]; /* (or a single file that an older run saved there) */
            snprintf(single, sizeof single, "%s/gpt.ckpt", o.ckpt_dir);
            const char *from = ckpt;
            if (st == PDDE_ERR_NOT_FOUND && (st = pdde_checkpoint_load(s, single, &ex)) == PDDE_OK) from = single;
            if (st == PDDE_OK && check_model_flags(o.ckpt_dir, &o.model, rank == 0, "resume")) return 1;
            if (st == PDDE_OK) {
                restored = 1;
                char trained_on[4300] = "";
                if (data_changed(o.ckpt_dir, data_now, trained_on, sizeof trained_on)) {
                    if (rank == 0)
                        printf("gpt: --resume: the checkpoint's run trained on %s; this one on %s: its batches start at the beginning of "
                               "this data (weights, optimizer state, step and schedule are the checkpoint's)\n", trained_on, data_now);
                    ex.data_position = 0;
                }
                pdde_data_set_position(train, ex.data_position);
                if (rank == 0) printf("gpt: resumed from %s at step %lld (data position %llu)\n", from, (long long)pdde_session_step(s), (unsigned long long)ex.data_position);
                const pdde_optimizer_params *was = &ex.schedule;
                if (ex.schedule_differs && rank == 0)
                    printf("gpt: the checkpoint's run scheduled lr %.3g over %lld steps (warmup %lld); this one asks for lr %.3g over %lld "
                           "(warmup %lld): %s (lr of the next step %.3g)\n", was->lr, (long long)was->total_steps,
                           (long long)was->warmup_steps, op.lr, (long long)op.total_steps, (long long)op.warmup_steps,
                           o.reschedule ? "--reschedule: CHANGING to this run's schedule" : "keeping the checkpoint's schedule (--reschedule changes it)",
                           pdde_session_lr(s));
            } else if (st != PDDE_ERR_NOT_FOUND) {
                fprintf(stderr, "gpt: cannot resume: %s\n", pdde_last_error(ctx));
                if (st == PDDE_ERR_MISMATCH) /* (nothing was loaded: the checkpoint stays as it is) */
                    fprintf(stderr, "gpt: %s holds another model's checkpoint: resume with the model flags that saved it (--arch %s now, "
                            "--kv-heads, --layers, --heads, --width, --head-dim, --qk-norm, --ctx, --vocab, --moe-*)\n", o.ckpt_dir, gpt_arch_name(o.model.arch));
                return 1;
            } else if (rank == 0) /* (a job restarted with the same flags finds its checkpoint; its first start has none) */
                printf("gpt: --resume: no checkpoint in %s yet: starting from step 0\n", o.ckpt_dir);
        }
        if (!el && rank == 0 && lock_ckpt_dir(o.ckpt_dir)) return 1; /* (after a resume refused: that writes nothing there) */
    }

    int from_file = o.init_from && !restored; /* (a resumed run goes on from its checkpoint: the file was its start) */
    if (from_file && o.init == INIT_CHECKPOINT) { /* a trained model's weights: this run's optimizer, schedule and data from their start */
        pdde_checkpoint_extra weights = {.weights_only = 1};
        if (is_dir(o.init_from) && check_model_flags(o.init_from, &o.model, rank == 0, "start from it")) return 1;
        if (pdde_checkpoint_load(s, o.init_from, &weights)) {
            fprintf(stderr, "gpt: --init-from %s: %s\n", o.init_from, pdde_last_error(ctx));
            return 1;
        }
    } else if (from_file) {
        TRY(o.init == INIT_HF ? gpt_hf_load(s, g, &o.model, o.init_from) : gpt_llmc_load(s, g, &o.model, o.init_from));
    }
    char partial[64];
    if ((o.save_llmc || o.save_hf || o.save_peft) && rank == 0 && gpt_partial(s, g, partial, sizeof partial)) { /* (said now, not after training) */
        const char *flag = o.save_llmc ? "--save-llmc" : o.save_hf ? "--save-hf" : "--save-peft";
        fprintf(stderr, "gpt: %s %s: rank 0 holds a part of parameter %s, or none, under this plan: save from one process, or --dp without "
                "--zero 3 (a checkpoint loads under any plan: --resume it on one process with %s)\n", flag,
                o.save_llmc ? o.save_llmc : o.save_hf ? o.save_hf : o.save_peft, partial, flag);
        return 1;
    }
    FILE *metrics = NULL; /* rank 0 writes it: the loss and the schedule are the same on every rank */
    if (o.metrics && rank == 0 && !metrics && !(metrics = fopen(o.metrics, o.resume || (el && pdde_elastic_generation(el) > 0) ? "a" : "w"))) {
        fprintf(stderr, "gpt: --metrics %s: cannot open it for writing\n", o.metrics);
        return 1;
    }
    size_t bt = (size_t)o.model.batch * o.model.ctx;
    feeder feed = {&plan, rank / (o.tp * o.pp), o.model.batch}; /* (mesh [dp, tp, pp]: pp innermost) */
    size_t read_bt = o.ft ? (size_t)ft_global * o.model.ctx : bt; /* (--ft-replicas: every replica's rows are read) */
    int32_t *x = malloc(read_bt * sizeof *x), *y = malloc(read_bt * sizeof *y), *ft_tmp = o.ft ? malloc(read_bt * sizeof *ft_tmp) : NULL;
    float *moe_bias = NULL; /* --moe-bias-rate: each MoE block's bias, from zeros (a resumed run's: the checkpoint's) */
    if (o.model.moe_experts > 1 && o.model.moe_bias && restored) {
        moe_bias = calloc((size_t)o.model.layers * o.model.moe_experts, sizeof *moe_bias);
        TRY(moe_bias ? gpt_moe_read_bias(s, g, &o.model, moe_bias) : PDDE_ERR_OOM);
    } else if (o.model.moe_experts > 1 && o.model.moe_bias) {
        moe_bias = calloc((size_t)o.model.layers * o.model.moe_experts, sizeof *moe_bias);
        for (int l = 0, b = 0; l < o.model.layers; l++) {
            char name[64];
            snprintf(name, sizeof name, "h%d.moe.bias", l);
            if (gpt_block_is_moe(&o.model, l)) TRY(pdde_session_write_global(s, pdde_graph_find(g, name), moe_bias + (size_t)b++ * o.model.moe_experts, (size_t)o.model.moe_experts * sizeof *moe_bias));
        }
    }
    if (from_file) { /* where training starts from: the file's model on this validation data */
        float vloss = validate(s, &m, val, o.val_batches, &feed, x, y);
        if (rank == 0) printf("step     0  validation loss %.4f (the weights of %s)\n", vloss, o.init_from);
    }
    double t0 = now(), tlast = t0;
    int64_t first = pdde_session_step(s);
    if (job_first < 0) job_first = first, job_t0 = t0;
    float ema_tps = 0;
    int64_t last = o.stop_after > 0 && o.stop_after < o.steps ? o.stop_after : o.steps;
    int stopped_by = 0; /* the signal training stopped for (catch_stop_signals), agreed by every rank */
    int left_by = 0;    /* under --elastic: the signal this rank left the job for while the others go on */
    int below_min = 0;  /* under --elastic: every rank stopped because departures would leave fewer than --min */
    if (!stop_signal) catch_stop_signals(); /* (after an elastic re-form too; once one came, a second ends the process) */
    pdde_checkpoint_writer *writer = NULL; /* --ckpt-async: the save in progress */
    double ckpt_s = 0; /* what saving made the loop wait */
    int n_ckpt = 0;
    for (int64_t step = first; step < last; step++) {
        int change = 0;
        if (el && stop_signal) pdde_elastic_request_leave(el, stop_signal); /* (the step is agreed at the boundary: every member learns it there) */
        if (el) TRY(pdde_elastic_step_begin(el, s, pdde_data_position(train), &change));
        if (change == PDDE_ELASTIC_LEAVE) {
            printf("gpt: rank %d leaves the job at step %lld%s%s\n", rank, (long long)step, stop_signal ? ", asked by " : "", stop_signal ? strsignal(stop_signal) : "");
            last = step, o.sample_len = 0, left_by = stop_signal;
            if (left_by) o.save_llmc = o.save_hf = o.save_peft = NULL; /* (preempted: the others save at the end) */
            break;
        }
        if (change == PDDE_ELASTIC_STOP) { /* every rank leaves (the whole job preempted), or too few would stay: stop and save as without --elastic */
            TRY(pdde_elastic_stop_reason(el, &stopped_by, &below_min)); /* (the largest signal any rank left for: all exit alike) */
            last = step;
            if (!stopped_by && !below_min && rank == 0) /* (below --min: the library's line says why) */ printf("gpt: every rank leaves the job at step %lld: it stops\n", (long long)step);
            pdde_checkpoint_writer *was = writer;
            writer = NULL;
            if (was) TRY(pdde_checkpoint_writer_finish(was));
            pdde_checkpoint_extra ex = {.data_position = pdde_data_position(train)};
            if (ckpt[0]) TRY(pdde_checkpoint_save(s, ckpt, &ex));
            if (ckpt[0] && rank == 0 && save_model_flags(o.ckpt_dir, &o.model, o.data, pdde_data_token_count(train), windows_at)) return 1;
            break;
        }
        if (change) goto elastic_recover;
        TRY(pdde_data_next_batch(train, o.ft ? ft_global : o.model.batch, o.model.ctx, o.seed, x, y)); /* the global batch */
        if (o.ft && ft_moved) /* the lost replicas' rows are dropped; a rejoined replica's rows go to its rank */
            ft_keep_rows(x, ft_tmp, o.micro, ft_dp0, ft_rows, o.model.ctx, ft_ids, ranks), ft_keep_rows(y, ft_tmp, o.micro, ft_dp0, ft_rows, o.model.ctx, ft_ids, ranks);
        float lr = pdde_session_lr(s); /* this step's (the schedule of the run a resume continues) */
        int64_t valid;
        if (!o.ft) TRY(set_loss_tokens(s, y, (size_t)o.model.batch * (size_t)o.model.ctx, &valid)); /* (--ft-replicas: each part's mean) */
        /* under SPMD every rank gets its block of each micro-batch from its attributes (uneven shares:
         * its share of the micro-batches) */
        TRY(gpt_write_batch(s, &m, &plan, feed.dp_index, x, y));
        pdde_status run = pdde_session_run(s, PDDE_RUN_STEP);
        if (el && (run = pdde_elastic_step_end(el, s, run)) == PDDE_ERR_PEER_LOST) goto elastic_recover;
        TRY(run);
        float loss = pdde_session_loss(s); /* the step's loss, the same on every rank */
        int32_t stop = el ? 0 : stop_signal; /* (the largest any rank saw: each stops after this step; --elastic: the boundary agrees) */
        if (!el && comm && ranks > 1) TRY(pdde_comm_allreduce(comm, &stop, &stop, 1, PDDE_I32, PDDE_REDUCE_MAX));
        if (stop) last = step + 1, stopped_by = stop;
        double t = now(), dt = t - tlast;
        tlast = t;
        float tps = (float)(bt / dt);
        ema_tps = step == first ? tps : 0.9f * ema_tps + 0.1f * tps;
        double eta = (double)(o.steps - step - 1) * bt / ema_tps;
        pdde_loss_scale_stats sc;
        pdde_session_loss_scale(s, &sc);
        char scaling[64] = "";
        if (sc.enabled) snprintf(scaling, sizeof scaling, "  scale %g%s (%lld skipped)", sc.scale, sc.last_skipped ? " SKIPPED" : "", (long long)sc.skipped_steps);
        if (rank == 0 && (step % 10 == 0 || step + 1 == o.steps || sc.last_skipped))
            printf("step %5lld/%d  loss %.4f  lr %.2e  %7.0f tok/s  ETA %4.0fs%s\n", (long long)step + 1, o.steps,
                   loss, lr, ema_tps, eta, scaling);
        if (m.moe_balance && (step % 10 == 0 || step + 1 == o.steps) && (rank == 0 || (o.pp > 1 && !el)))
            TRY(print_moe(s, g, &m, o.pp > 1 && !el ? comm : NULL, rank == 0));
        if (moe_bias) TRY(gpt_moe_update_bias(s, g, &o.model, o.moe_bias_rate, moe_bias));
        if (metrics) {
            pdde_session_memory(s, &ms);
            fprintf(metrics, "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.6g,\"tokens_per_s\":%.1f,\"step_s\":%.6f,\"memory_bytes\":%zu,\"time_s\":%.3f}\n",
                    (long long)step + 1, loss, lr, tps, dt, ms.allocated_bytes, t - t0);
            fflush(metrics);
        }
        if (((o.val_every && (step + 1) % o.val_every == 0) || step + 1 == last) && !stopped_by) {
            float vloss = validate(s, &m, val, o.val_batches, &feed, x, y);
            if (rank == 0) printf("step %5lld  validation loss %.4f\n", (long long)step + 1, vloss);
            if (metrics) fprintf(metrics, "{\"step\":%lld,\"val_loss\":%.6g}\n", (long long)step + 1, vloss), fflush(metrics);
        }
        if (ckpt[0] && ((o.ckpt_every && (step + 1) % o.ckpt_every == 0) || step + 1 == last)) {
            pdde_checkpoint_extra ex = {.data_position = pdde_data_position(train)};
            pdde_checkpoint_writer *was = writer; /* the previous one becomes visible */
            double c0 = now();
            writer = NULL;
            if (was) TRY(pdde_checkpoint_writer_finish(was));
            if (was && rank == 0 && save_model_flags(o.ckpt_dir, &o.model, o.data, pdde_data_token_count(train), windows_at)) return 1;
            if (step + 1 == last && rank == 0 && n_ckpt) /* (the last one is written before the program ends, either way) */
                printf("gpt: the %d checkpoint%s before the last held the training loop %.3f s\n", n_ckpt, n_ckpt > 1 ? "s" : "", ckpt_s + now() - c0);
            if (o.ckpt_async && step + 1 < last) TRY(pdde_checkpoint_writer_start(s, ckpt, &ex, &writer));
            else {
                TRY(pdde_checkpoint_save(s, ckpt, &ex));
                if (rank == 0 && save_model_flags(o.ckpt_dir, &o.model, o.data, pdde_data_token_count(train), windows_at)) return 1;
            }
            ckpt_s += now() - c0, n_ckpt++;
        }
    }
    if (0) {
    elastic_recover: /* free what uses the old world, re-form it, rebuild for the ranks there are */
        pdde_session_free(s), pdde_graph_free(g), free(x), free(y), free(ft_tmp), free(layer_dev);
        TRY(pdde_elastic_recover(el, NULL));
        comm = pdde_elastic_world(el);
        goto elastic_rebuild;
    }
    release_stop_signals(!stopped_by && !left_by);
    if (stopped_by || below_min) { /* (the checkpoint above holds the run; the saves and the sample wait for the run's end) */
        if (rank == 0)
            printf("gpt: %s: stopped after step %lld%s%s%s%s\n", stopped_by ? strsignal(stopped_by) : "fewer than --min ranks would remain",
                   (long long)last, stopped_by && below_min ? " (fewer than --min ranks would remain)" : "", ckpt[0] ? ", saved a checkpoint in " : "",
                   ckpt[0] ? o.ckpt_dir : " (no --ckpt-dir: nothing saved)", ckpt[0] ? " (--resume goes on from it)" : "");
        o.save_llmc = o.save_hf = o.save_peft = NULL, o.sample_len = 0;
    }
    if (rank == 0 && first != job_first) /* (re-formed: the job's steps, and those since the last re-form) */
        printf("gpt: trained %lld steps in %.1f s, %lld of them since the re-form at step %lld%s\n", (long long)(last > job_first ? last - job_first : 0),
               now() - job_t0, (long long)(last > first ? last - first : 0), (long long)first, last < o.steps && !stopped_by && !left_by && !below_min ? " (--stop-after: --resume continues)" : "");
    else if (rank == 0)
        printf("gpt: trained %lld steps in %.1f s%s\n", (long long)(last - first > 0 ? last - first : 0), now() - t0,
               last < o.steps && !stopped_by && !left_by && !below_min ? " (--stop-after: --resume continues)" : "");
    if (metrics) fclose(metrics);
    pdde_elastic_stats es;
    if (el && rank == 0 && pdde_elastic_stats_get(el, &es) == PDDE_OK && es.snapshots)
        printf("gpt: elastic: %lld snapshots of %.2f MB, %.3f ms each in the step, %.3f ms copying beside it\n", (long long)es.snapshots,
               es.snapshot_bytes / 1e6, 1e3 * es.snapshot_s / (double)es.snapshots, 1e3 * es.copy_s / (double)es.snapshots);
    if (o.save_llmc && rank == 0) {
        TRY(gpt_llmc_save(s, g, &o.model, o.save_llmc));
        printf("gpt: saved the model as llm.c's model file %s (f32)\n", o.save_llmc);
    }
    if (o.save_hf && rank == 0) {
        TRY(gpt_hf_save(s, g, &o.model, o.save_hf, o.save_dtype));
        if (tok.hf && copy_tokenizer(o.tokenizer, o.save_hf)) return 1;
        printf("gpt: saved the model as a Hugging Face directory %s (config.json, model.safetensors, %s%s)\n", o.save_hf,
               gpt_hf_torch_dtype(o.save_dtype), tok.hf ? "; its tokenizer" : "");
    }
    if (o.save_peft && rank == 0) {
        TRY(gpt_hf_save_peft(s, g, &o.model, o.init_from, o.save_peft, o.save_dtype));
        printf("gpt: saved the LoRA adapters as PEFT's directory %s (adapter_config.json, adapter_model.safetensors, %s)\n", o.save_peft,
               gpt_hf_torch_dtype(o.save_dtype));
    }
    if (o.sample_len > 0) sample(s, g, &m, comm, &o, &sp, o.tokenizer ? &tok : NULL, &feed, o.sample_len, rank == 0);
    tokenizer_free(&tok);
    free(x), free(y), free(ft_tmp), free(layer_dev), free(moe_bias), free(o.prompt_ids);
    pdde_session_free(s);
    pdde_graph_free(g);
#ifdef PDDE_HAVE_UCX
    if (el) pdde_elastic_free(el);
    else pdde_comm_free(comm);
#endif
    pdde_data_close(train), pdde_data_close(val);
    pdde_context_free(ctx);
    /* (stopped below --min by planned departures alone: EX_TEMPFAIL, the job did not finish) */
    return stopped_by || left_by ? 128 + (stopped_by ? stopped_by : left_by) : below_min ? 75 : 0;
}
