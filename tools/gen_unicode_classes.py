#!/usr/bin/python3
"""Write examples/unicode_classes.h: the code point ranges of Unicode's letters (\\p{L}: Lu Ll Lt Lm Lo)
and numbers (\\p{N}: Nd Nl No), which tokenizers' pre-tokenizing patterns split text by. From Python's
unicodedata (its Unicode version is named in the header). Run: /usr/bin/python3 tools/gen_unicode_classes.py"""
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
static inline int unicode_in(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) { /* the first range that ends at or after cp */
        size_t mid = (lo + hi) / 2;
        if (r[mid][1] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && r[lo][0] <= cp;
}

static inline int unicode_is_letter(uint32_t cp) {
    return cp < 128 ? (cp | 32) - 'a' < 26 : unicode_in(unicode_letters, sizeof unicode_letters / sizeof *unicode_letters, cp);
}

static inline int unicode_is_number(uint32_t cp) {
    return cp < 128 ? cp - '0' < 10 : unicode_in(unicode_numbers, sizeof unicode_numbers / sizeof *unicode_numbers, cp);
}

/* Unicode's White_Space property (what \\s matches in the regex engines tokenizers use) */
static inline int unicode_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

#endif
"""

if __name__ == "__main__":

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "unicode_classes.h")
    with open(out, "w") as f:
        f.write(HEADER % unicodedata.unidata_version)
        f.write(pairs_c("unicode_letters", ranges("L")) + "\n" + pairs_c("unicode_numbers", ranges("N")))
        f.write(FOOTER)
