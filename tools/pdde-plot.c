/* pdde-plot — draws the loss curves of one or several metrics files (gpt --metrics) as one SVG chart.
 *
 *   build/pdde-plot run1.jsonl run2.jsonl -o loss.svg [--title TEXT]
 *
 * A metrics file has one JSON object per line; lines with "step" and "loss" make a run's training
 * curve (solid), lines with "step" and "val_loss" its validation points (dashed, same colour). Each file
 * is one run, named by its file name in the legend. No dependency beyond libc: the lines are read
 * for those keys only, as gpt writes them. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { double *x, *y; size_t n, cap; } series;
typedef struct { const char *path; series loss, val; } run;

static void usage(FILE *f) {
    fprintf(f, "usage: pdde-plot [-o OUT.svg] [--title TEXT] METRICS.jsonl [METRICS.jsonl ...]\n"
               "  draws the training loss (solid) and validation loss (dashed) of each metrics file (gpt --metrics)\n"
               "  in one chart; OUT defaults to stdout\n");
}

static int push(series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof *nx), *ny = nx ? realloc(s->y, cap * sizeof *ny) : NULL;
        if (nx) s->x = nx;
        if (!nx || !ny) return -1;
        s->y = ny, s->cap = cap;
    }
    s->x[s->n] = x, s->y[s->n++] = y;
    return 0;
}

/* The number after "key": in line; 0 when the key is absent or its value is not a finite number. */
static int field(const char *line, const char *key, double *out) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return 0;
    char *end;
    *out = strtod(p + strlen(pat), &end);
    return end != p + strlen(pat) && isfinite(*out);
}

static int read_run(run *r) {
    FILE *f = fopen(r->path, "r");
    if (!f) {
        fprintf(stderr, "pdde-plot: %s: %s\n", r->path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, bad = 0;
    while (getline(&line, &cap, f) > 0) {
        double step, v;
        lineno++;
        if (!field(line, "step", &step)) continue;
        if (field(line, "loss", &v) && push(&r->loss, step, v)) bad = 1;
        if (field(line, "val_loss", &v) && push(&r->val, step, v)) bad = 1;
    }
    free(line);
    fclose(f);
    if (bad) fprintf(stderr, "pdde-plot: %s: out of memory\n", r->path);
    else if (!r->loss.n && !r->val.n) fprintf(stderr, "pdde-plot: %s: no line with \"step\" and \"loss\" (%d lines)\n", r->path, lineno);
    return bad || (!r->loss.n && !r->val.n) ? -1 : 0;
}

/* A round tick spacing giving about n ticks over span. */
static double tick_step(double span, int n) {
    double raw = span / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

int main(int argc, char **argv) {
    const char *out_path = NULL, *title = "loss";
    run runs[64];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "-o") || !strcmp(a, "--title")) {
            if (i + 1 >= argc) { fprintf(stderr, "pdde-plot: %s needs a value\n", a); return 2; }
            if (!strcmp(a, "-o")) out_path = argv[++i];
            else title = argv[++i];
            continue;
        }
        if (a[0] == '-' && a[1]) { fprintf(stderr, "pdde-plot: unknown option '%s' (see --help)\n", a); return 2; }
        if (n == 64) { fprintf(stderr, "pdde-plot: at most 64 files\n"); return 2; }
        runs[n++] = (run){.path = a};
    }
    if (!n) { fprintf(stderr, "pdde-plot: no metrics file given (see --help)\n"); return 2; }
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int r = 0; r < n; r++) {
        if (read_run(&runs[r])) return 1;
        series *ss[2] = {&runs[r].loss, &runs[r].val};
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < ss[k]->n; i++) {
                x0 = fmin(x0, ss[k]->x[i]), x1 = fmax(x1, ss[k]->x[i]);
                y0 = fmin(y0, ss[k]->y[i]), y1 = fmax(y1, ss[k]->y[i]);
            }
    }
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1;
    double pad = 0.05 * (y1 - y0);
    y0 -= pad, y1 += pad;

    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    if (!f) { fprintf(stderr, "pdde-plot: %s: %s\n", out_path, strerror(errno)); return 1; }
    const double W = 800, H = 500, L = 70, R = 20, T = 40, B = 50; /* size and margins */
    double pw = W - L - R, ph = H - T - B;
#define PX(v) (L + ((v) - x0) / (x1 - x0) * pw)
#define PY(v) (T + (y1 - (v)) / (y1 - y0) * ph)
    static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">", W / 2);
    xml_text(f, title);
    fprintf(f, "</text>\n");
    double xs = tick_step(x1 - x0, 8), ys = tick_step(y1 - y0, 6);
    for (double v = ceil(x0 / xs) * xs; v <= x1 + 1e-9 * xs; v += xs)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                PX(v), T, PX(v), T + ph, PX(v), T + ph + 16, v);
    for (double v = ceil(y0 / ys) * ys; v <= y1 + 1e-9 * ys; v += ys)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                L, PY(v), L + pw, PY(v), L - 6, PY(v) + 4, v);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n", L, T, pw, ph);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n", L + pw / 2, H - 10);
    for (int r = 0; r < n; r++) {
        const char *color = colors[r % 8];
        series *ss[2] = {&runs[r].loss, &runs[r].val};
        for (int k = 0; k < 2; k++) {
            if (!ss[k]->n) continue;
            fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", k ? "val_loss" : "loss", color,
                    k ? " stroke-dasharray=\"6 4\"" : "");
            for (size_t i = 0; i < ss[k]->n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", PX(ss[k]->x[i]), PY(ss[k]->y[i]));
            fprintf(f, "\"/>\n");
        }
        const char *base = strrchr(runs[r].path, '/');
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"/><text x=\"%.0f\" y=\"%.0f\">", L + pw - 190,
                T + 16 + 16.0 * r, L + pw - 165, T + 16 + 16.0 * r, color, L + pw - 160, T + 20 + 16.0 * r);
        xml_text(f, base ? base + 1 : runs[r].path);
        fprintf(f, "</text>\n");
        free(runs[r].loss.x), free(runs[r].loss.y), free(runs[r].val.x), free(runs[r].val.y);
    }
    fprintf(f, "</svg>\n");
    if (out_path && fclose(f)) { fprintf(stderr, "pdde-plot: %s: %s\n", out_path, strerror(errno)); return 1; }
    return 0;
}
