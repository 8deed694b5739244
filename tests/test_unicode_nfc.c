/* test_unicode_nfc — examples/unicode_nfc.h against Python's unicodedata: every case of
 * tests/data/nfc_golden.txt (tools/gen_nfc_golden.py: hand-picked ones, every composition pair, every
 * canonical decomposition, random mixes of letters and marks) comes out as Python's NFC, which NFC then
 * leaves as it is; a tokenizer's stand-ins for bytes (code points above 0x10FFFF) pass unchanged and
 * block composition and reordering across them; empty text stays empty; text with nothing NFC changes
 * is copied; a long run of marks is sorted in linear time. Runs from the repository root; another
 * file of cases may be named as the first argument. */
#define _POSIX_C_SOURCE 200809L /* (fileno, in tests/test_util.h) */
#include "examples/unicode_nfc.h"
#include "tests/test_util.h"

#define STAND_IN(byte) (0x110000u + (byte)) /* (examples/hf_tokenizer.h's code point for a byte that is not UTF-8) */

/* The hex code points of s into cps (at most cap); how many, or -1 at anything else. */
static int parse_hex(const char *s, uint32_t *cps, int cap) {
    int n = 0;
    for (;;) {
        while (*s == ' ') s++;
        if (!*s || *s == '\n') return n;
        char *end;
        unsigned long cp = strtoul(s, &end, 16);
        if (end == s || n == cap || cp > 0x10FFFF) return -1;
        cps[n++] = (uint32_t)cp, s = end;
    }
}

static int same(const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "tests/data/nfc_golden.txt";
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s: cannot open (tests run from the repository root)", path);
    if (!f) return test_finish();
    static char line[65536];
    static uint32_t input[4096], want[4096], doubled[8192], want_doubled[8192];
    int cases = 0, line_no = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        line_no++;
        if (line[0] == '#' || line[0] == '\n') continue;
        char *bar = strchr(line, '|'), *newline = strchr(line, '\n');
        CHECK(bar && newline, "%s:%d: not \"input | output\" (or too long)", path, line_no);
        if (!bar || !newline) continue;
        *bar = 0, *newline = 0;
        int n_in = parse_hex(line, input, 4096), n_want = parse_hex(bar + 1, want, 4096);
        CHECK(n_in >= 0 && n_want >= 0, "%s:%d: not hex code points", path, line_no);
        if (n_in < 0 || n_want < 0) continue;
        cases++;
        uint32_t *got = NULL, *again = NULL;
        size_t n_got = 0, n_again = 0;
        if (unicode_nfc(input, (size_t)n_in, &got, &n_got) || unicode_nfc(got, n_got, &again, &n_again)) {
            CHECK(0, "%s:%d: out of memory", path, line_no);
            free(got);
            continue;
        }
        if (!same(got, n_got, want, (size_t)n_want)) {
            bad++;
            fprintf(stderr, "FAIL %s:%d: %s|%s, got", path, line_no, line, bar + 1);
            for (size_t k = 0; k < n_got; k++) fprintf(stderr, " %04X", got[k]);
            fprintf(stderr, "\n");
        }
        if (!same(again, n_again, got, n_got)) bad++, fprintf(stderr, "FAIL %s:%d: NFC changes its own output\n", path, line_no);
        /* the case twice with a stand-in between: nothing crosses it, so each half is the case's NFC */
        memcpy(doubled, input, (size_t)n_in * 4), doubled[n_in] = STAND_IN(0xC3), memcpy(doubled + n_in + 1, input, (size_t)n_in * 4);
        memcpy(want_doubled, want, (size_t)n_want * 4), want_doubled[n_want] = STAND_IN(0xC3);
        memcpy(want_doubled + n_want + 1, want, (size_t)n_want * 4);
        free(got), free(again);
        if (unicode_nfc(doubled, 2 * (size_t)n_in + 1, &got, &n_got) == 0) {
            if (!same(got, n_got, want_doubled, 2 * (size_t)n_want + 1))
                bad++, fprintf(stderr, "FAIL %s:%d: twice, with a stand-in between, is not the NFC twice\n", path, line_no);
            free(got);
        }
    }
    fclose(f);
    CHECK(cases >= 300, "%s: %d cases (the file is short)", path, cases);
    CHECK(bad == 0, "%d of %d cases differ from Python's NFC (above)", bad, cases);
    printf("%d cases of %s\n", cases, path);

    /* stand-ins pass unchanged and block composition, and reordering, across them */
    struct { uint32_t in[6], want[6]; size_t n_in, n_want; const char *what; } stand_ins[] = {
        {{0x41, STAND_IN(0xCC), 0x301}, {0x41, STAND_IN(0xCC), 0x301}, 3, 3, "a stand-in between A and acute"},
        {{STAND_IN(0x41), 0x301}, {STAND_IN(0x41), 0x301}, 2, 2, "acute after a stand-in"},
        {{0x61, 0x302, STAND_IN(0xFF), 0x323}, {0xE2, STAND_IN(0xFF), 0x323}, 4, 3, "marks on either side of a stand-in"},
        {{0x1100, STAND_IN(0x80), 0x1161}, {0x1100, STAND_IN(0x80), 0x1161}, 3, 3, "Hangul L and V apart"},
        {{0xFFFFFFFFu, 0x212B, 0x110000u}, {0xFFFFFFFFu, 0xC5, 0x110000u}, 3, 3, "the largest and least stand-ins"},
    };
    for (size_t i = 0; i < sizeof stand_ins / sizeof *stand_ins; i++) {
        uint32_t *got = NULL;
        size_t n_got = 0;
        int rc = unicode_nfc(stand_ins[i].in, stand_ins[i].n_in, &got, &n_got);
        CHECK(rc == 0 && same(got, n_got, stand_ins[i].want, stand_ins[i].n_want), "%s: %zu code points, the first %X", stand_ins[i].what,
              n_got, n_got ? got[0] : 0);
        free(got);
    }

    /* empty text: empty, and an array to free */
    uint32_t *got = NULL;
    size_t n_got = 99;
    CHECK(unicode_nfc(NULL, 0, &got, &n_got) == 0 && got && n_got == 0, "empty text: %zu code points", n_got);
    free(got);

    /* text that NFC leaves alone (ASCII, CJK, a precomposed letter, stand-ins) comes back as it is */
    const uint32_t plain[] = {'H', 'i', ' ', 0x4E2D, 0x6587, 0xE9, 0xAC00, STAND_IN(0x99), 0x1F600};
    CHECK(unicode_nfc(plain, sizeof plain / sizeof *plain, &got, &n_got) == 0 && same(got, n_got, plain, sizeof plain / sizeof *plain),
          "text without anything to normalize changed");
    free(got);

    /* a long run of marks (acute, dot below alternately) after a: the dots below first, one composed into
     * the a; in linear time (an insertion sort would take seconds) */
    size_t run = 200000;
    uint32_t *marks = malloc((run + 1) * sizeof *marks);
    marks[0] = 'a';
    for (size_t i = 1; i <= run; i++) marks[i] = i % 2 ? 0x301 : 0x323;
    int ok = unicode_nfc(marks, run + 1, &got, &n_got) == 0 && n_got == run && got[0] == 0x1EA1;
    for (size_t i = 1; ok && i < n_got; i++) ok = got[i] == (i < run / 2 ? 0x323u : 0x301u);
    CHECK(ok, "a long run of marks: %zu code points", n_got);
    free(got), free(marks);
    return test_finish();
}
