#!/usr/bin/python3
"""Write examples/unicode_classes.h: the code point ranges of Unicode's letters (\\p{L}: Lu Ll Lt Lm Lo)
and numbers (\\p{N}: Nd Nl No), which tokenizers' pre-tokenizing patterns split text by; and
examples/unicode_nfc.h: the tables and code of Normalization Form C (tokenizer.json's "NFC" normalizer).
From Python's unicodedata (its Unicode version is named in the headers). Run: /usr/bin/python3 tools/gen_unicode_classes.py
(tools/gen_nfc_golden.py writes the test cases of unicode_nfc.h)"""
import os
import unicodedata


def ranges(major):
    out, start = [], None
    for cp in range(0x110001):
        inside = cp < 0x110000 and unicodedata.category(chr(cp))[0] == major
        if inside and start is None:
            start = cp
        if not inside and start is not None:
            out.append((start, cp - 1))
            start = None
    return out


def pairs_c(name, pairs):
    cells = ["{0x%X, 0x%X}" % p for p in pairs]
    lines = ["    " + ", ".join(cells[i:i + 6]) + "," for i in range(0, len(cells), 6)]
    return "static const uint32_t %s[][2] = {\n%s\n};\n" % (name, "\n".join(lines))


HEADER = """/* unicode_classes.h — Demonstrates how to tell letters (\\p{L}), numbers (\\p{N}) and white space (\\s)
 * apart as tokenizers' pre-tokenizing patterns do (examples/hf_tokenizer.h), by ranges of code points.
 * Unicode %s, written by tools/gen_unicode_classes.py: do not edit. */
#ifndef PDDE_UNICODE_CLASSES_H
#define PDDE_UNICODE_CLASSES_H
#include <stddef.h>
#include <stdint.h>

"""

FOOTER = """
#define UNICODE_ROWS(table) (sizeof(table) / sizeof *(table))

/* The row of table[0 .. rows) that holds cp from its column 0 to its column last (last 0: the row whose
 * column 0 is cp), or NULL. Each row is stride uint32_t; the rows are sorted and do not overlap. (Each
 * table here and in unicode_nfc.h that is keyed by one code point is searched by it, through UNICODE_ROW.) */
static inline const uint32_t *unicode_row(const uint32_t *table, size_t rows, size_t stride, size_t last, uint32_t cp) {
    size_t lo = 0, hi = rows;
    while (lo < hi) { /* the first row that ends at or after cp */
        size_t mid = (lo + hi) / 2;
        if (table[mid * stride + last] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < rows && table[lo * stride] <= cp ? table + lo * stride : NULL;
}

/* unicode_row over a table declared as uint32_t table[][stride] */
#define UNICODE_ROW(table, last, cp) unicode_row(*(table), UNICODE_ROWS(table), UNICODE_ROWS(*(table)), last, cp)

static inline int unicode_is_letter(uint32_t cp) {
    return cp < 128 ? (cp | 32) - 'a' < 26 : UNICODE_ROW(unicode_letters, 1, cp) != NULL;
}

static inline int unicode_is_number(uint32_t cp) {
    return cp < 128 ? cp - '0' < 10 : UNICODE_ROW(unicode_numbers, 1, cp) != NULL;
}

/* Unicode's White_Space property (what \\s matches in the regex engines tokenizers use) */
static inline int unicode_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

#endif
"""

# ---- examples/unicode_nfc.h ----

def canonical_decomposition(cp):
    """The code points of cp's canonical decomposition mapping (one step, as UnicodeData.txt gives it), or []."""
    d = unicodedata.decomposition(chr(cp))
    return [] if not d or d.startswith("<") else [int(x, 16) for x in d.split()]


def full_decomposition(cp):
    d = canonical_decomposition(cp)
    return sum((full_decomposition(x) for x in d), []) if d else [cp]


def nfc_tables():
    """(combining class ranges, two-code-point decompositions, singletons, composing indexes, unstable ranges)
    for unicode_nfc.h."""
    classes, pairs, singles, unstable = [], [], [], set()
    for cp in range(0x110000):
        c = chr(cp)
        ccc = unicodedata.combining(c)
        if ccc:
            if classes and classes[-1][1] == cp - 1 and classes[-1][2] == ccc:
                classes[-1][1] = cp
            else:
                classes.append([cp, cp, ccc])
            unstable.add(cp)
        d = canonical_decomposition(cp)
        if d:
            (pairs if len(d) == 2 else singles).append((cp, *d))
            if unicodedata.normalize("NFC", c) != c:  # NFC_Quick_Check=No: a singleton, an exclusion, a non-starter's
                unstable.add(cp)
    # the pairs NFC composes: two-code-point mappings whose composite NFC keeps (not a composition exclusion)
    composing = [i for i, (cp, first, second) in enumerate(pairs) if unicodedata.normalize("NFC", chr(cp)) == chr(cp)]
    composing.sort(key=lambda i: pairs[i][1:])
    for i in composing:  # NFC_Quick_Check=Maybe: what may compose with the code point before it
        unstable.add(pairs[i][2])
    unstable.update(range(0x1161, 0x1161 + 21), range(0x11A8, 0x11A7 + 28))  # Hangul's vowel and trailing jamo
    unstable_ranges = []
    for cp in sorted(unstable):
        if unstable_ranges and unstable_ranges[-1][1] == cp - 1:
            unstable_ranges[-1][1] = cp
        else:
            unstable_ranges.append([cp, cp])
    # what the C code below relies on
    assert all(unicodedata.combining(chr(pairs[i][1])) == 0 for i in composing), "a composition's first is a starter"
    assert len(pairs) < 65536, "composing indexes fit uint16_t"
    assert pairs[0][0] < singles[0][0], "unicode_nfc_decompose's shortcut"
    assert max(len(full_decomposition(d[0])) for d in pairs + singles) <= 4, "UNICODE_NFC_MAX_DECOMPOSITION"
    return classes, pairs, singles, composing, unstable_ranges


def cells_c(cells, width=127):
    """cells as the lines of a C initializer, as many to a line as fit in width columns."""
    lines, line = [], "   "
    for cell in cells:
        if len(line) + len(cell) + 2 > width:
            lines.append(line)
            line = "   "
        line += " " + cell + ","
    return "\n".join(lines + [line])


NFC_HEADER = """/* unicode_nfc.h — Demonstrates how to put text in Unicode's Normalization Form C (NFC), as tokenizers whose
 * tokenizer.json has "normalizer": {"type": "NFC"} (Qwen2, Qwen3) do before they split it: canonical
 * decomposition, canonical ordering of combining marks, canonical composition (UAX #15), on code points.
 * Unicode %s, written by tools/gen_unicode_classes.py: do not edit. Tested by tests/test_unicode_nfc.c
 * against Python's unicodedata (tests/data/nfc_golden.txt, from tools/gen_nfc_golden.py). */
#ifndef PDDE_UNICODE_NFC_H
#define PDDE_UNICODE_NFC_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "unicode_classes.h"

"""

NFC_FOOTER = """
#define UNICODE_NFC_MAX_DECOMPOSITION 4 /* code points one code point's full decomposition may have */

/* Hangul syllables decompose and compose by arithmetic instead of tables (The Unicode Standard, 3.12) */
#define UNICODE_NFC_S_BASE 0xAC00u
#define UNICODE_NFC_L_BASE 0x1100u
#define UNICODE_NFC_V_BASE 0x1161u
#define UNICODE_NFC_T_BASE 0x11A7u
#define UNICODE_NFC_L_COUNT 19u
#define UNICODE_NFC_V_COUNT 21u
#define UNICODE_NFC_T_COUNT 28u
#define UNICODE_NFC_N_COUNT (UNICODE_NFC_V_COUNT * UNICODE_NFC_T_COUNT)
#define UNICODE_NFC_S_COUNT (UNICODE_NFC_L_COUNT * UNICODE_NFC_N_COUNT)

/* Whether NFC leaves cp as it is and nothing after it can combine with what comes before it (UAX #15's
 * "stable": NFC_Quick_Check=Yes and combining class 0), so that text may be normalized in pieces split there. */
static inline int unicode_nfc_is_stable(uint32_t cp) {
    return cp < unicode_nfc_unstable[0][0] || !UNICODE_ROW(unicode_nfc_unstable, 1, cp); /* (all of ASCII is stable) */
}

static inline uint8_t unicode_nfc_class(uint32_t cp) {
    const uint32_t *row = cp < unicode_nfc_classes[0][0] ? NULL : UNICODE_ROW(unicode_nfc_classes, 1, cp); /* (ASCII: none) */
    return row ? (uint8_t)row[2] : 0;
}

/* cp's full canonical decomposition into to[] (at most UNICODE_NFC_MAX_DECOMPOSITION code points); how many */
static inline size_t unicode_nfc_decompose(uint32_t cp, uint32_t *to) {
    uint32_t s = cp - UNICODE_NFC_S_BASE;
    if (s < UNICODE_NFC_S_COUNT) {
        to[0] = UNICODE_NFC_L_BASE + s / UNICODE_NFC_N_COUNT, to[1] = UNICODE_NFC_V_BASE + s % UNICODE_NFC_N_COUNT / UNICODE_NFC_T_COUNT;
        if (s % UNICODE_NFC_T_COUNT == 0) return 2; /* LV */
        return to[2] = UNICODE_NFC_T_BASE + s % UNICODE_NFC_T_COUNT, 3;
    }
    if (cp < unicode_nfc_pairs[0][0]) return to[0] = cp, 1; /* (Latin-1's letters are the first) */
    const uint32_t *pair = UNICODE_ROW(unicode_nfc_pairs, 0, cp), *single = pair ? NULL : UNICODE_ROW(unicode_nfc_singles, 0, cp);
    if (pair) { /* (the mappings are one step: apply them again) */
        size_t n = unicode_nfc_decompose(pair[1], to);
        return n + unicode_nfc_decompose(pair[2], to + n);
    }
    if (single) return unicode_nfc_decompose(single[1], to);
    return to[0] = cp, 1;
}

/* The primary composite of first and second, or 0 when they do not compose */
static inline uint32_t unicode_nfc_compose(uint32_t first, uint32_t second) {
    uint32_t l = first - UNICODE_NFC_L_BASE, v = second - UNICODE_NFC_V_BASE, s = first - UNICODE_NFC_S_BASE, t = second - UNICODE_NFC_T_BASE;
    if (l < UNICODE_NFC_L_COUNT && v < UNICODE_NFC_V_COUNT) return UNICODE_NFC_S_BASE + (l * UNICODE_NFC_V_COUNT + v) * UNICODE_NFC_T_COUNT;
    if (s < UNICODE_NFC_S_COUNT && s % UNICODE_NFC_T_COUNT == 0 && t - 1 < UNICODE_NFC_T_COUNT - 1) return first + t; /* LV + T */
    size_t lo = 0, hi = UNICODE_ROWS(unicode_nfc_composing);
    while (lo < hi) { /* the first pair at or after (first, second) */
        size_t mid = (lo + hi) / 2;
        const uint32_t *pair = unicode_nfc_pairs[unicode_nfc_composing[mid]];
        if (pair[1] < first || (pair[1] == first && pair[2] < second)) lo = mid + 1;
        else hi = mid;
    }
    if (lo == UNICODE_ROWS(unicode_nfc_composing)) return 0;
    const uint32_t *pair = unicode_nfc_pairs[unicode_nfc_composing[lo]];
    return pair[1] == first && pair[2] == second ? pair[0] : 0;
}

/* Sorts each run of non-starters (class != 0) of cps[0 .. n) by class, keeping the order of equal classes
 * (canonical ordering). Runs are short in text, where insertion sorts them best; a long one (text that stacks
 * marks on purpose) goes through a counting sort instead, so that no text takes quadratic time. spare holds n. */
static inline void unicode_nfc_reorder(uint32_t *cps, uint8_t *classes, size_t n, uint32_t *spare) {
    for (size_t start = 0, end; start < n; start = end) {
        for (end = start; end < n && classes[end]; end++) {}
        if (end == start) {
            end++;
            continue;
        }
        if (end - start <= 8) {
            for (size_t i = start + 1; i < end; i++) {
                uint32_t cp = cps[i];
                uint8_t cls = classes[i];
                size_t j = i;
                for (; j > start && classes[j - 1] > cls; j--) cps[j] = cps[j - 1], classes[j] = classes[j - 1];
                cps[j] = cp, classes[j] = cls;
            }
            continue;
        }
        size_t next_of_class[256] = {0}, at = 0;
        for (size_t i = start; i < end; i++) next_of_class[classes[i]]++;
        for (int cls = 0; cls < 256; cls++) {
            size_t count = next_of_class[cls];
            next_of_class[cls] = at, at += count;
        }
        for (size_t i = start; i < end; i++) spare[i - start] = cps[i] | (uint32_t)classes[i] << 24; /* (marks are below 1 << 21) */
        for (size_t i = 0; i < end - start; i++) {
            size_t to = start + next_of_class[spare[i] >> 24]++;
            cps[to] = spare[i] & 0xFFFFFF, classes[to] = (uint8_t)(spare[i] >> 24);
        }
    }
}

/* Canonical composition of cps[0 .. n), in place: each code point joins the last starter before it when
 * the two have a primary composite and nothing between them blocks it (a code point of class 0, or of a
 * class at least its own); how many code points are left */
static inline size_t unicode_nfc_compose_all(uint32_t *cps, const uint8_t *classes, size_t n) {
    size_t kept = 0, starter = SIZE_MAX; /* (none before the first starter) */
    uint8_t last_class = 0;              /* of cps[kept - 1] */
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i], composite;
        if (starter != SIZE_MAX && (kept == starter + 1 || last_class < classes[i]) && (composite = unicode_nfc_compose(cps[starter], cp))) {
            cps[starter] = composite;
            continue;
        }
        if (classes[i] == 0) starter = kept;
        last_class = classes[i];
        cps[kept++] = cp;
    }
    return kept;
}

/* The NFC form of in[0 .. n) into *out (malloc'd, *out_n code points); 0, or -1 when out of memory.
 * Code points above 0x10FFFF (a tokenizer's stand-ins for bytes that are not UTF-8) pass unchanged and
 * block composition across them. *out is never NULL after 0 (free it), NULL after -1. */
static inline int unicode_nfc(const uint32_t *in, size_t n, uint32_t **out, size_t *out_n) {
    *out = NULL, *out_n = 0;
    if (n > SIZE_MAX / (16 * UNICODE_NFC_MAX_DECOMPOSITION * sizeof(uint32_t))) return -1;
    size_t capacity = n ? n : 1, len = 0, spare_capacity = 0;
    uint32_t *text = malloc(capacity * sizeof *text), *spare = NULL; /* spare: a sort's room, then the classes */
    for (size_t i = 0; text && i < n;) {
        size_t first_unstable = i;
        while (first_unstable < n && unicode_nfc_is_stable(in[first_unstable])) first_unstable++;
        /* the piece to normalize runs from the stable code point before the first unstable one (it may compose
         * with what follows) to the next stable code point; what comes before it is copied as it is (all of
         * the text, when nothing in it is unstable) */
        size_t start = first_unstable > i ? first_unstable - 1 : first_unstable, end = first_unstable + 1;
        if (first_unstable == n) start = end = n;
        while (end < n && !unicode_nfc_is_stable(in[end])) end++;
        size_t most = (end - start) * UNICODE_NFC_MAX_DECOMPOSITION;
        if (capacity - len < start - i + most) { /* (what came before grew) */
            capacity = capacity * 2 > len + start - i + most ? capacity * 2 : len + start - i + most;
            uint32_t *bigger = realloc(text, capacity * sizeof *text);
            if (!bigger) free(text);
            text = bigger;
        }
        if (text && spare_capacity < most) {
            free(spare);
            spare_capacity = most;
            spare = malloc(spare_capacity * (sizeof *spare + 1));
            if (!spare) free(text), text = NULL;
        }
        if (!text) break;
        memcpy(text + len, in + i, (start - i) * sizeof *text), len += start - i;
        i = end;
        if (start == end) break; /* (nothing unstable was left) */
        uint32_t *piece = text + len;
        uint8_t *classes = (uint8_t *)(spare + spare_capacity);
        size_t piece_len = 0;
        for (size_t k = start; k < end; k++) piece_len += unicode_nfc_decompose(in[k], piece + piece_len);
        for (size_t k = 0; k < piece_len; k++) classes[k] = unicode_nfc_class(piece[k]);
        unicode_nfc_reorder(piece, classes, piece_len, spare);
        len += unicode_nfc_compose_all(piece, classes, piece_len);
    }
    free(spare);
    if (!text) return -1;
    *out = text, *out_n = len;
    return 0;
}

#endif
"""


def write_nfc_header(path):
    classes, pairs, singles, composing, unstable = nfc_tables()
    with open(path, "w") as f:
        f.write(NFC_HEADER % unicodedata.unidata_version)
        f.write("/* {first, last, canonical combining class}: the code points of a class other than 0 (combining marks) */\n")
        f.write("static const uint32_t unicode_nfc_classes[][3] = {\n%s\n};\n\n" % cells_c(["{0x%X, 0x%X, %d}" % tuple(r) for r in classes]))
        f.write("/* {code point, first, second}: canonical decomposition mappings to two code points (one step: the first may\n"
                " * decompose again), by code point */\n")
        f.write("static const uint32_t unicode_nfc_pairs[][3] = {\n%s\n};\n\n" % cells_c(["{0x%X, 0x%X, 0x%X}" % d for d in pairs]))
        f.write("/* {code point, replacement}: canonical decomposition mappings to one code point (singletons), by code point */\n")
        f.write("static const uint32_t unicode_nfc_singles[][2] = {\n%s\n};\n\n" % cells_c(["{0x%X, 0x%X}" % d for d in singles]))
        f.write("/* The rows of unicode_nfc_pairs that NFC composes again (not composition exclusions or mappings of\n"
                " * non-starters), by (first, second) */\n")
        f.write("static const uint16_t unicode_nfc_composing[] = {\n%s\n};\n\n" % cells_c(["%d" % i for i in composing]))
        f.write("/* {first, last}: code points that are not stable (see unicode_nfc_is_stable): combining marks, what NFC\n"
                " * replaces, what may compose with the code point before it (NFC_Quick_Check No, Maybe) */\n")
        f.write("static const uint32_t unicode_nfc_unstable[][2] = {\n%s\n};\n" % cells_c(["{0x%X, 0x%X}" % tuple(r) for r in unstable]))
        f.write(NFC_FOOTER)


if __name__ == "__main__":

    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    with open(os.path.join(examples, "unicode_classes.h"), "w") as f:
        f.write(HEADER % unicodedata.unidata_version)
        f.write(pairs_c("unicode_letters", ranges("L")) + "\n" + pairs_c("unicode_numbers", ranges("N")))
        f.write(FOOTER)
    write_nfc_header(os.path.join(examples, "unicode_nfc.h"))
