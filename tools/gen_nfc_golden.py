#!/usr/bin/python3
"""Write tests/data/nfc_golden.txt: the cases tests/test_unicode_nfc.c checks examples/unicode_nfc.h by, with
the NFC that Python's unicodedata gives them (run with the python whose Unicode version unicode_nfc.h names:
/usr/bin/python3 tools/gen_nfc_golden.py). Deterministic: the random strings come from a fixed seed.

Each line is a case: its input code points, "|", their NFC, in hex ("0041 0301 | 00C1"); "#" starts a comment.
The cases: hand-picked ones (singletons, composition exclusions, reordering, blocking, Hangul, Greek, Indic
and Tibetan vowel signs), every composition pair (each primary composite's decomposition), every canonical
decomposition (each code point that has one, alone), then random mixes of letters and combining marks."""
import os
import random
import unicodedata

HAND_PICKED = [
    ("a starter and a mark", "0041 0301"),
    ("two marks onto one letter in turn (e, circumflex, acute)", "0065 0302 0301"),
    ("a composite as the first of a pair (C cedilla, acute)", "00C7 0301"),
    ("composed already", "00C1 1EBF 1E08"),
    ("singletons: Angstrom sign, ohm sign, kelvin sign", "212B 2126 212A"),
    ("singletons: en quad, combining grave and acute tone marks, Greek question mark, Greek ano teleia", "2000 0340 0341 037E 0387"),
    ("singletons: Greek tonos spelled as oxia, CJK compatibility ideographs", "1F71 F900 FA10 2F800 2FA1D"),
    ("a singleton onto a letter (combining grave tone mark)", "0061 0340"),
    ("composition exclusions stay decomposed: Devanagari qa, its decomposition", "0958 0915 093C"),
    ("composition exclusions: Hebrew yod with hiriq, forking, musical half note", "FB1D 2ADC 1D15E 1D160"),
    ("what composes with nukta that is not excluded (Devanagari nnna)", "0928 093C"),
    ("a non-starter that decomposes to two marks", "0344"),
    ("the same after a letter", "0061 0344"),
    ("Tibetan vowel signs that decompose (excluded)", "0F73 0F75 0F81"),
    ("Tibetan vowel signs out of order", "0F40 0F72 0F71"),
    ("Tibetan gha stays decomposed", "0F43 0F42 0FB7"),
    ("reordering: dot below after circumflex", "0061 0302 0323"),
    ("reordering: dot below before circumflex", "0061 0323 0302"),
    ("Vietnamese e with circumflex and dot below, both orders and precomposed parts", "0065 0323 0302 0065 0302 0323 1EB9 0302 00EA 0323"),
    ("reordering on a letter without composites", "0071 0307 0323"),
    ("dot above and dot below on D", "1E0A 0323 0044 0307 0323"),
    ("blocked by a mark of the same class", "0061 0305 0301"),
    ("not blocked by a mark of a lower class (ogonek 202, acute 230)", "0061 0328 0301"),
    ("a second acute is blocked by the first", "0061 0301 0301"),
    ("horn (216) then acute: both compose (o with horn and acute)", "006F 031B 0301"),
    ("acute then horn: reordered, the same", "006F 0301 031B"),
    ("a class 232 mark after grave: reordered, grave composes", "0061 0315 0300"),
    ("a starter blocks: the acute stays", "0041 0062 0301"),
    ("non-starters with no starter before them", "0301 0323 0041"),
    ("a starter that composes with a starter: Oriya", "0B47 0B3E 0B47 0B56 0B47 0B57"),
    ("the same, blocked by a mark between", "0B47 0300 0B3E"),
    ("Bengali, Tamil, Kannada, Malayalam, Sinhala two-part vowels", "09C7 09BE 0BC6 0BBE 0CC6 0CC2 0CC6 0CC2 0CD5 0D46 0D3E 0DD9 0DCF 0DD9 0DCF 0DCA"),
    ("Myanmar, Balinese, Chakma two-part vowels", "1025 102E 1B05 1B35 11131 11127"),
    ("kana with voiced and semi-voiced marks", "304B 3099 306F 309A 30A6 3099 3046 3099"),
    ("Hangul L + V", "1100 1161"),
    ("Hangul L + V + T", "1100 1161 11A8"),
    ("Hangul LV + T", "AC00 11A8"),
    ("Hangul LVT + T does not compose", "AC01 11A8"),
    ("Hangul LV + the T base (not a trailing jamo)", "AC00 11A7"),
    ("Hangul, the last syllable's jamo", "1112 1175 11C2"),
    ("Hangul syllables as they are", "AC00 D7A3 B098"),
    ("standalone jamo: V, T, then L at the end", "1161 11A8 0041 1100"),
    ("Hangul L L V", "1100 1100 1161"),
    ("Hangul L, mark, V: blocked", "1100 0300 1161"),
    ("Greek with several accents", "03B1 0313 0301 0345"),
    ("Greek, the marks in another order", "03B1 0345 0301 0313"),
    ("Greek capital with psili, varia, prosgegrammeni", "0391 0313 0300 0345"),
    ("Greek omega with ypogegrammeni, perispomeni, dasia", "03C9 0345 0342 0314"),
    ("Greek iota with dialytika and tonos, and decomposed", "0390 03B9 0308 0301"),
    ("Greek dialytika and oxia alone (a singleton to a composite)", "1FEE"),
    ("Hebrew points out of order", "05D1 05BC 05B7 05D1 05B7 05BC"),
    ("Arabic marks out of order", "0628 0650 0651 0628 0651 0650"),
    ("a long run of marks of several classes (counting sort)",
     "0061 0301 0323 0302 0328 0300 0331 0308 0327 0303 0324 0304 0345 031B 0306 0330 0307 0315 0316 0309 0335 030A 0334 030B"),
    ("several long runs separated by starters",
     "0065 0301 0323 0302 0323 0301 0302 0323 0301 0302 0323 0045 0300 0316 0300 0316 0300 0316 0300 0316 0300 0316 0300 0316"),
    ("a word", "0041 006E 0067 0073 0074 0072 006F 0308 006D 0020 212B"),
]


def hexes(cps):
    return " ".join("%04X" % cp for cp in cps)


def nfc(cps):
    return [ord(c) for c in unicodedata.normalize("NFC", "".join(map(chr, cps)))]


def case(cps):
    return "%s | %s\n" % (hexes(cps), hexes(nfc(cps)))


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "nfc_golden.txt")
    canonical = {}  # code point -> its canonical decomposition mapping (one step)
    for cp in range(0x110000):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<"):
            canonical[cp] = [int(x, 16) for x in d.split()]
    composites = [cp for cp, d in sorted(canonical.items()) if len(d) == 2 and nfc([cp]) == [cp]]
    marks = [cp for cp in range(0x110000) if unicodedata.combining(chr(cp))]
    firsts = sorted({canonical[cp][0] for cp in composites})
    seconds = sorted({canonical[cp][1] for cp in composites})
    letters = [ord(c) for c in "aeiouyAEIOUcnszgkqwxhtOS"] + [0x3B1, 0x3B5, 0x3B7, 0x3B9, 0x3BF, 0x3C5, 0x3C9, 0x391, 0x3A9,
                                                              0x430, 0x438, 0x435, 0x5D0, 0x627, 0x915, 0x304B, 0x20, 0x4E2D]
    hangul = [0x1100, 0x1112, 0x1161, 0x1175, 0x11A7, 0x11A8, 0x11C2, 0xAC00, 0xAC01, 0xD7A3]

    rng = random.Random(20240607)
    lines = ["# NFC cases for tests/test_unicode_nfc.c (examples/unicode_nfc.h), from Python's unicodedata, Unicode %s.\n"
             % unicodedata.unidata_version,
             "# Written by tools/gen_nfc_golden.py: do not edit. Each line: input code points | their NFC, in hex.\n"]
    for what, cps in HAND_PICKED:
        lines += ["# %s\n" % what, case([int(x, 16) for x in cps.split()])]
    lines.append("# every composition pair: the decompositions of the primary composites, 24 to a line\n")
    for i in range(0, len(composites), 24):
        lines.append(case(sum((nfd_of(cp, canonical) for cp in composites[i:i + 24]), [])))
    lines.append("# every canonical decomposition: each code point that has one, 48 to a line\n")
    decomposing = sorted(canonical)
    for i in range(0, len(decomposing), 48):
        lines.append(case(decomposing[i:i + 48]))
    lines.append("# random mixes of letters, composition pairs' parts, Hangul and combining marks (seeded)\n")
    for _ in range(200):
        cps = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            if kind < 0.3:
                cps += nfd_of(rng.choice(composites), canonical)
            elif kind < 0.5:
                cps.append(rng.choice(letters))
            elif kind < 0.6:
                cps.append(rng.choice(firsts))
            elif kind < 0.7:
                cps.append(rng.choice(hangul))
            elif kind < 0.8:
                cps.append(rng.choice(decomposing))
            cps += [rng.choice(seconds if rng.random() < 0.5 else marks) for _ in range(rng.choice([0, 1, 1, 2, 3, 12]))]
        lines.append(case(cps))
    with open(path, "w") as f:
        f.writelines(lines)


def nfd_of(cp, canonical):
    """cp's full canonical decomposition (Hangul syllables are not in canonical: not asked for here)"""
    return sum((nfd_of(x, canonical) for x in canonical[cp]), []) if cp in canonical else [cp]


if __name__ == "__main__":
    main()
