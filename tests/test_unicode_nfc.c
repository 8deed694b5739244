/* test_unicode_nfc — examples/unicode_nfc.h against Python's unicodedata: every case of
 * tests/data/nfc_golden.txt (tools/gen_nfc_golden.py: hand-picked ones, every composition pair, every
 * canonical decomposition, random mixes of letters and marks) comes out as Python's NFC, which NFC then
 * leaves as it is; a tokenizer's stand-ins for bytes (code points above 0x10FFFF) pass unchanged and
 * block composition and reordering across them; empty text stays empty; text with nothing NFC changes
 * is copied; a long run of marks is sorted in linear time. And unicode_classes.h's search, which every
 * code point table goes through, at the ends of rows (a small table's, the letters' and the numbers').
 * Runs from the repository root; another file of cases may be named as the first argument. */
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

    /* the search every code point table goes through (unicode_classes.h): a range holds its first and last
     * code points and those between, a gap and what lies before the first row or after the last are in
     * none, and rows of three are found by their first column */
    static const uint32_t ranges[][2] = {{0x10, 0x10}, {0x20, 0x2F}, {0x40, 0x41}};
    static const uint32_t rows3[][3] = {{0x10, 1, 2}, {0x20, 3, 4}, {0x30, 5, 6}};
    static const struct { uint32_t cp; int range, row3; } probes[] = {
        {0, -1, -1}, {0x0F, -1, -1}, {0x10, 0, 0}, {0x11, -1, -1}, {0x20, 1, 1}, {0x25, 1, -1}, {0x2F, 1, -1},
        {0x30, -1, 2}, {0x40, 2, -1}, {0x41, 2, -1}, {0x42, -1, -1}, {0xFFFFFFFFu, -1, -1},
    };
    for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {
        const uint32_t *range = UNICODE_ROW(ranges, 1, probes[i].cp), *row3 = UNICODE_ROW(rows3, 0, probes[i].cp);
        CHECK(range == (probes[i].range < 0 ? NULL : ranges[probes[i].range]) && row3 == (probes[i].row3 < 0 ? NULL : rows3[probes[i].row3]),
              "code point %X: range row %d (want %d), row of three %d (want %d)", probes[i].cp, range ? (int)(range - ranges[0]) / 2 : -1,
              probes[i].range, row3 ? (int)(row3 - rows3[0]) / 3 : -1, probes[i].row3);
    }
    CHECK(unicode_row(NULL, 0, 2, 1, 0x10) == NULL, "an empty table holds a code point");
    /* each range of letters and numbers holds its ends, and its neighbours are not of its class (the
     * generator joins adjacent code points into one range) */
    int wrong = 0;
    for (size_t i = 0; i < UNICODE_ROWS(unicode_letters); i++)
        wrong += !unicode_is_letter(unicode_letters[i][0]) + !unicode_is_letter(unicode_letters[i][1]) + unicode_is_letter(unicode_letters[i][0] - 1) +
                 unicode_is_letter(unicode_letters[i][1] + 1);
    for (size_t i = 0; i < UNICODE_ROWS(unicode_numbers); i++)
        wrong += !unicode_is_number(unicode_numbers[i][0]) + !unicode_is_number(unicode_numbers[i][1]) + unicode_is_number(unicode_numbers[i][0] - 1) +
                 unicode_is_number(unicode_numbers[i][1] + 1);
    CHECK(wrong == 0, "%d ends of the letters' and numbers' ranges misjudged", wrong);

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
