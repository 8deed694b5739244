/* tokenize — Demonstrates how to turn text into a pretrained model's token ids with its Hugging Face
 * tokenizer.json (examples/hf_tokenizer.h), to fine-tune it with gpt on your own text:
 *
 *   ./build/tokenize --tokenizer SmolLM2-135M --out mine.tok a.txt b.txt   # each file a document
 *   ./build/tokenize --tokenizer SmolLM2-135M --out mine.tok data.jsonl    # each line's "text" a document
 *   ./build/tokenize --tokenizer SmolLM2-135M --out sft.tok pairs.jsonl    # each line's "prompt" and "completion"
 *   ./build/gpt --init-from SmolLM2-135M --data mine.tok --prompt "The cat"
 *   ./build/tokenize --tokenizer SmolLM2-135M --text "Hello world"         # prints the ids
 *
 * --tokenizer takes tokenizer.json or the model directory that holds it. Each document starts with the
 * tokenizer's start token (the one its template puts first: LLaMA's <s> or <|begin_of_text|>), or,
 * where the template puts none, with "<|endoftext|>" if the tokenizer has it (GPT-2's and SmolLM2's
 * documents, as llm.c's shards separate them); --doc-start ID or none chooses another. A JSON Lines record
 * holds a "text", or a "prompt" and a "completion" (instruction tuning): the start token and the prompt are
 * stored as no targets (the loss ignores predicting them), then the completion and the end token
 * (tokenizer_config.json's eos_token, else "<|endoftext|>" or "</s>"; --doc-end ID or none) as targets. The output is a
 * pdde token file ("PDDETOK1", the count as u64, the ids as i32), written through a temporary and a
 * rename. Bytes that are not UTF-8 are kept (a byte-level BPE spells each as its byte; SentencePiece's
 * falls back to "<0xNN>"). */
#define _POSIX_C_SOURCE 200809L /* (clock_gettime) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "hf_tokenizer.h"

static int usage(FILE *f) {
    fprintf(f, "usage: tokenize --tokenizer FILE|DIR (--out FILE.tok TEXT_FILE... | --text TEXT) [--doc-start ID|none] [--doc-end ID|none]\n"
               "       (each TEXT_FILE one document, at most 256 MiB, after the start token; a .jsonl file one on each line, its\n"
               "       record's \"text\", or its \"prompt\" (no targets) and \"completion\" (then the end token); --text: print its ids)\n");
    return f == stdout ? 0 : 2;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *tokenizer_path = NULL, *out = NULL, *text = NULL, *doc_start = NULL, *doc_end = NULL;
    int first_file = argc;
    for (int i = 1; i < argc; i += 2) { /* (flags and their values, then the text files) */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout);
        if (a[0] != '-') { first_file = i; break; }
        if (!v) { fprintf(stderr, "tokenize: %s needs a value\n", a); return usage(stderr); }
        if (!strcmp(a, "--tokenizer")) tokenizer_path = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--doc-start")) doc_start = v;
        else if (!strcmp(a, "--doc-end")) doc_end = v;
        else { fprintf(stderr, "tokenize: unknown flag %s\n", a); return usage(stderr); }
    }
    if (!tokenizer_path || (!text && (!out || first_file == argc)) || (text && (out || first_file < argc))) return usage(stderr);
    char path[4200], why[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s%s", tokenizer_path, !stat(tokenizer_path, &st) && S_ISDIR(st.st_mode) ? "/tokenizer.json" : "");
    hf_tokenizer *t;
    if (hf_tokenizer_open(path, &t, why, sizeof why)) { fprintf(stderr, "tokenize: %s: %s\n", path, why); return 1; }
    int32_t *ids;
    size_t n;
    if (text) { /* the ids of one text, after the template's start token */
        if (hf_tokenizer_encode(t, text, strlen(text), 1, &ids, &n)) { fprintf(stderr, "tokenize: out of memory\n"); return 1; }
        for (size_t k = 0; k < n; k++) printf(k ? " %d" : "%d", ids[k]);
        printf("\n");
        return free(ids), hf_tokenizer_close(t), 0;
    }
    int32_t bound[2] = {hf_tokenizer_doc_start(t), hf_tokenizer_doc_end(t, path)};
    const char *given[2] = {doc_start, doc_end};
    for (int k = 0; k < 2; k++) {
        char *end;
        long id = given[k] ? strtol(given[k], &end, 10) : 0;
        if (!given[k]) continue;
        if (!strcmp(given[k], "none")) bound[k] = -1;
        else if (end == given[k] || *end || id < 0 || id >= t->n) {
            fprintf(stderr, "tokenize: %s %s: an id below the vocabulary's %d, or none\n", k ? "--doc-end" : "--doc-start", given[k], t->n);
            return hf_tokenizer_close(t), 2;
        }
        else bound[k] = (int32_t)id;
    }
    hf_tokenize_stats stats;
    double began = now();
    if (hf_tokenizer_write_tokens(t, argv + first_file, argc - first_file, bound[0], bound[1], out, &stats, why, sizeof why)) {
        fprintf(stderr, "tokenize: %s\n", why);
        return hf_tokenizer_close(t), 1;
    }
    double s = now() - began;
    printf("tokenize: %zu document%s, %zu bytes -> %llu tokens (%.2f bytes a token) in %s, %.1f s (%.1f MB/s)\n", stats.documents,
           stats.documents == 1 ? "" : "s", stats.bytes, (unsigned long long)stats.tokens, stats.tokens ? (double)stats.bytes / (double)stats.tokens : 0.0,
           out, s, s > 0 ? (double)stats.bytes / s / 1e6 : 0.0);
    if (stats.prompt_tokens) printf("tokenize: %llu of them prompts' (no targets)\n", (unsigned long long)stats.prompt_tokens);
    hf_tokenizer_close(t);
    return 0;
}
