// gen_tokenizer_golden.mjs: writes the test fixtures that check examples/hf_tokenizer.h (tokenizer.json
// encoding in C) against the reference implementation, transformers.js (@huggingface/transformers).
//
// Why: hf_tokenizer.h re-implements Hugging Face's tokenizer.json encoding (added tokens, normalizers,
// pre-tokenizers, BPE). CI cannot run the reference, so the ids it gives are computed here once and
// committed; the C test encodes the same texts with the same files and compares the ids.
//
// What it writes, into tests/data/tokenize/ (found from this script's own path, not from the cwd):
//   gpt2.json       GPT-2: ByteLevel pre-tokenizer (GPT-2's regex), ByteLevel post-processor, merges "a b"
//   llama3.json     LLaMA 3.1: Split by LLaMA 3's regex + ByteLevel (no regex), Sequence[ByteLevel,
//                   TemplateProcessing <|begin_of_text|> $A], ignore_merges, merges as ["a", "b"] arrays
//   smollm2.json    SmolLM2: Sequence[Digits (individual), ByteLevel], ByteLevel post-processor
//   llama2.json     LLaMA 2 / Mistral: normalizer Sequence[Prepend "▁", Replace " " -> "▁"], no
//                   pre-tokenizer, TemplateProcessing <s> $A, byte_fallback, fuse_unk, <unk>
//   metaspace.json  the same model, newer conversion: no normalizer, Metaspace pre-tokenizer
//                   (prepend_scheme "first", split false)
//   text.txt        about 3 KB of UTF-8 text built to exercise the corner cases (contractions, runs of
//                   white space, CRLF, Unicode letters/numbers/marks, CJK, emoji, added tokens' texts, ...):
//                   a hand-written part and a part drawn by a seeded PRNG (mulberry32), so deterministic
//   short.txt       exactly "Hello world! It's 2024." (no newline)
//   golden.txt      the reference ids, one line per case:
//                     <fixture> <add_special> <count> <id> <id> ...        ids of text.txt
//                     <fixture>:short <add_special> <count> <id> ...       ids of short.txt
//                   <fixture> is the fixture's file name without ".json"; <add_special> is 1 when encoded
//                   with add_special_tokens true (the post-processor's template puts its start token
//                   first: <|begin_of_text|> for llama3, <s> for llama2 and metaspace; gpt2 and smollm2
//                   have none, so their 0 and 1 lines are equal), else 0; fields are separated by one
//                   space, lines end with "\n", and a line with <count> 0 has no ids.
//
// The fixtures are small valid tokenizer.json files (vocab is a map, so ids may be sparse): the first 1000
// merges of the source model, and as vocab every token those merges combine or make plus the single
// characters needed (all 256 byte characters for byte-level; for the Mistral model <unk> <s> </s>, the 256
// "<0xNN>" tokens and the characters of the merges' parts and of the texts), each with its id in the
// source (Mistral's merges also combine tokens that only a later merge makes: those are kept too).
// llama3.json's vocab also has a few whole words of GPT-2's (" quick", " brown", ...) that no kept merge
// makes, so that its ignore_merges (a word that is a token is taken whole) changes ids. Only data from
// GPT-2's tokenizer.json (MIT) and Mistral-7B's (Apache 2.0) is copied; the rest (pre-tokenizer types,
// the LLaMA 3 regex, templates, special token names) is configuration.
//
// Where transformers.js differs from Rust `tokenizers` the text avoids the difference: JS's \s has U+FEFF
// and lacks U+0085 (neither is in the text); JS's Digits splits ASCII digits only, Rust's any numeric
// character (the text has Arabic-Indic digits and ½ ² ① Ⅻ, but no kept merge makes the ids differ).
//
// Checks (it fails loudly): every fixture loads in transformers.js; decoding the ids of text.txt
// (add_special 0, special tokens kept) gives back text.txt exactly for gpt2, llama3 and smollm2 (for
// llama2 and metaspace it only prints whether the round trip is exact, and where it is not: llama2's
// normalizer puts a "▁" before each piece between added tokens, and a "▁" of the text decodes as a space).
//
// Run, from the repository root or anywhere:
//   npm install --ignore-scripts @huggingface/transformers        (once, in a folder of your choice, DIR)
//   TRANSFORMERS_DIR=DIR node tools/gen_tokenizer_golden.mjs GPT2_TOKENIZER_JSON MISTRAL_TOKENIZER_JSON
// GPT2_TOKENIZER_JSON is openai-community/gpt2's tokenizer.json, MISTRAL_TOKENIZER_JSON is
// mistralai/Mistral-7B-v0.1's. @huggingface/transformers is resolved (require, so NODE_PATH works too)
// from $TRANSFORMERS_DIR if set, else from the current directory (i.e. DIR/node_modules, or any
// node_modules above it). It was generated with @huggingface/transformers 4.3.2 and Node 20. Running it
// twice writes identical bytes.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const N_MERGES = 1000;
const SEED = 0x5eed2024;
const OUT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'tests', 'data', 'tokenize');

function fail(msg) {
    console.error(`gen_tokenizer_golden: ${msg}`);
    process.exit(1);
}

function loadTransformers() {
    const base = process.env.TRANSFORMERS_DIR || process.cwd();
    const req = createRequire(path.join(path.resolve(base), 'noop.js'));
    try {
        return req('@huggingface/transformers');
    } catch (e) {
        fail(`cannot load @huggingface/transformers from ${base} (set TRANSFORMERS_DIR to the folder where it is installed): ${e.message}`);
    }
}

// ---- the test texts ----

function mulberry32(a) {
    return () => {
        a = (a + 0x6d2b79f5) | 0;
        let t = Math.imul(a ^ (a >>> 15), 1 | a);
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

const HAND = [
    'Hello world! It\'s 2024. The quick brown fox jumps over the lazy dog.\n',
    'Contractions: it\'s IT\'S we\'ll WE\'LL they\'re THEY\'Re we\'ve WE\'VE I\'d I\'D I\'m I\'M don\'t DON\'T;',
    ' none: \'x \'X \'z. Glued: IT\'Squick YOU\'REdog \'Sure \'LLama \'REd \'VEx \'Dog \'Max \'Tom. Alone: \'s \'S \'ll \'LL \'Re \'ve \'d \'m \'t and \'\'quoted\'\'.\n',
    'One space. Two  spaces. Three   spaces.   Lead three. Trailing one \n',
    'Trailing two  \n',
    'Trailing three   \n',
    '   \n',
    '\tTab start\tmid\t\ttwo tabs \t mixed\t\n',
    'Windows line\r\nnext line\r\n\r\nafter a blank CRLF line\r\n',
    'Unix blank line below\n\n',
    'Three breaks\n\n\nand spaces before a break   \n  \n',
    'No-break: 100\u00a0km, a\u00a0\u00a0b, ideographic\u3000space\u3000\u3000here.\n',
    'Accents: caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c6r\u00f8sk\u00f8bing fa\u00e7ade \u00fcber Stra\u00dfe \u00c9COLE.',
    ' Combining: cafe\u0301 n\u0303o a\u0308\u0301 \u0301lead.\n',
    'Greek: \u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5, \u03b1\u03b2\u03b3 \u0391\u0392\u0393.',
    ' Cyrillic: \u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u043b\u043a\u0430.\n',
    'CJK: \u4f60\u597d\uff0c\u4e16\u754c\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca\u3002',
    ' Hangul: \uc548\ub155\ud558\uc138\uc694 \uc138\uacc4.\n',
    'Arabic-Indic: \u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669 and \u06f1\u06f2\u06f3;',
    ' other numbers: \u00bd x\u00b2 \u2460 \u2461 \u216b \u217b \u00be\u00b3 7\u00bd 2\u00b2.\n',
    'Digits: 1 12 123 1234 12345 123456 1234567 3.14 -0.5 1,000,000 2024-01-31 10:45pm v1.2.3 x86_64 0x1F.\n',
    'Punctuation: !!! ??? ... ,,, ;;; --- ((( ))) [[ ]] {{ }} <<>> @#$%^&*_+=|\\/~` "quoted" \'single\' !?!\n',
    'Dashes and quotes: a\u2014b \u2013 c \u2018curly\u2019 \u201cdouble\u201d \u00abguillemets\u00bb \u2026 \u2022 \u2014\u2014.\n',
    'Emoji: \ud83d\ude00 \ud83d\udc4d\ud83c\udffd \u2764\ufe0f \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 \ud83c\uddeb\ud83c\uddf7 ok\ud83d\udc4d\ud83c\udffdok\n',
    'Zero\u200bwidth and a control\u0001char.\n',
    'Added: x<|endoftext|>y <s>inside</s>word a<unk>b pre<|begin_of_text|>post <|end_of_text|> <|reserved_special_token_0|>mid.\n',
    '<|endoftext|> at a line start\n',
    '<s> at a line start\n',
    '</s>\n',
    '<|begin_of_text|>line\n',
    '<unk> line\n',
    '  <s>  spaced  </s>  \n',
    'Literal markers: \u2581 \u2581\u2581word \u0120 \u0120the word\u2581 \u0120\u0120 \u2581 \u2581x\n',
];

const PIECES = [
    'a', 'is', 'in', 'to', 'for', 'with', 'that', 'this', 'from', 'text', 'model', 'token', 'words', 'number',
    'space', 'line', 'first', 'second', 'people', 'time', 'years', 'after', 'before', 'under', 'over', 'the', 'The', 'THE', 'of', 'and', 'tokenizer', 'encoding', 'merge', 'rank', 'byte', 'fallback', 'Hello',
    'world', 'it\'s', 'IT\'S', 'we\'ll', 'WE\'LL', 'they\'Re', 'you\'ve', 'I\'d', 'I\'m', 'can\'t', '\'x',
    '\'s', '\'LL', 'O\'Neil', 'rock\'n\'roll', 'caf\u00e9', 'cafe\u0301', 'na\u00efve', 'Stra\u00dfe',
    '\u03ba\u03cc\u03c3\u03bc\u03b5', '\u041c\u043e\u0441\u043a\u0432\u0430', '\u4e16\u754c', '\u6771\u4eac\u90fd',
    '\uc548\ub155', '\u0661\u0662\u0663', '\u00bd', 'x\u00b2', '\u2460', '\u216b', '3.14', '1234567', '42',
    '007', '2024', '!!', '?!', '...', '\u2014', '\u201cquote\u201d', '\u2018it\u2019s\u2019', '(a)', '[b]',
    '{c}', '#tag', '@user', 'a_b', 'snake_case', 'CamelCase', 'e-mail', 'http://example.com/a?b=c',
    '\ud83d\ude00', '\ud83d\udc4d\ud83c\udffd', 'ok\ud83d\ude00ok', 'zero\u200bwidth', 'ctl\u0001x',
    '<|endoftext|>', 'a<|endoftext|>b', '<s>', 'x<s>y', '</s>', '<unk>', '<|begin_of_text|>', '<|end_of_text|>',
    '<|reserved_special_token_0|>', '\u2581', '\u2581word', '\u0120', '\u0120the', '<', '|', '<|', 'end',
];
const SEPS = [' ', ' ', ' ', ' ', ' ', ' ', '  ', '   ', '\n', '\t', '\r\n', '\n\n', '', ' \n', '  \n',
    '\u00a0', '\u3000', ' \t ', '\n   '];

function makeText() {
    const rand = mulberry32(SEED);
    const pick = a => a[Math.floor(rand() * a.length)];
    const hand = HAND.join('');
    const parts = [hand, 'Random part:\n'];
    let size = Buffer.byteLength(parts.join(''));
    while (size < 3100) {
        const words = 3 + Math.floor(rand() * 8);
        let s = '';
        for (let i = 0; i < words; i++) {
            if (rand() < 0.15) { /* a digit run of length 1 to 7 */
                const len = 1 + Math.floor(rand() * 7);
                for (let k = 0; k < len; k++) s += String(Math.floor(rand() * 10));
            } else s += pick(PIECES);
            s += i + 1 < words ? pick(SEPS) : pick(['.', '!', '?', ',', '']);
        }
        s += pick(['\n', '\n', ' ', '\r\n', '\n\n', '  \n']);
        parts.push(s);
        size += Buffer.byteLength(s);
    }
    let text = parts.join('');
    if (!text.endsWith('\n')) text += '\n';
    return text;
}

const SHORT = 'Hello world! It\'s 2024.';

// ---- the fixtures ----

const LLAMA3_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_PATTERN = LLAMA3_PATTERN.replace('\\p{N}{1,3}', '\\p{N}');

// GPT-2 tokens put into llama3.json's vocab only (words of text.txt's first line that the kept merges don't make)
const LLAMA3_WHOLE_WORDS = ['\u0120quick', '\u0120brown', '\u0120fox', '\u0120jumps', '\u0120lazy', '\u0120dog', 'quick', 'dog'];

const added = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const byteLevel = (add_prefix_space, trim_offsets, use_regex) => ({ type: 'ByteLevel', add_prefix_space, trim_offsets, use_regex });

function readSource(file) {
    try {
        return JSON.parse(fs.readFileSync(file, 'utf8'));
    } catch (e) {
        fail(`cannot read ${file}: ${e.message}`);
    }
}

const splitMerge = m => (Array.isArray(m) ? m : m.split(' '));

// The first N_MERGES merges of src and the vocab they need: {vocab: Map token -> id (sorted by id), merges: [[a, b]]}
function truncate(src, single, name) {
    const sv = src.model.vocab;
    const merges = src.model.merges.slice(0, N_MERGES).map(splitMerge);
    if (merges.length !== N_MERGES || merges.some(m => m.length !== 2)) fail(`${name}: expected ${N_MERGES} merges of two parts`);
    const keep = new Set(single);
    for (const [a, b] of merges) {
        keep.add(a + b);
        for (const ch of a + b) if (Object.hasOwn(sv, ch)) keep.add(ch);
    }
    // A merge's parts: a part no kept merge makes (in SentencePiece conversions several merges make the
    // same token, so a part may come from a later merge) is kept too, so that every merge's parts exist
    let parts = 0;
    for (const [a, b] of merges)
        for (const p of [a, b])
            if (!keep.has(p)) keep.add(p), parts++;
    const vocab = new Map();
    for (const t of keep) {
        if (!Object.hasOwn(sv, t)) fail(`${name}: "${t}" is not in the source vocab`);
        vocab.set(t, sv[t]);
    }
    for (const [a, b] of merges)
        if (!vocab.has(a) || !vocab.has(b) || !vocab.has(a + b)) fail(`${name}: merge "${a} ${b}" lacks a token`);
    const sorted = new Map([...vocab].sort((x, y) => x[1] - y[1]));
    return { vocab: sorted, merges, parts };
}

function gpt2Fixtures(src) {
    const v = src.model.vocab;
    if (v['<|endoftext|>'] !== 50256 || v['\u0120the'] !== 262) fail('the first argument is not GPT-2\'s tokenizer.json');
    const bytes = [];
    for (const [t, id] of Object.entries(v)) if (id < 256) bytes.push(t);
    if (bytes.length !== 256 || bytes.some(t => [...t].length !== 1)) fail('GPT-2: ids 0-255 are not the 256 byte characters');
    const { vocab, merges } = truncate(src, bytes, 'gpt2');
    const eot = added(50256, '<|endoftext|>');
    const withEot = new Map([...vocab, ['<|endoftext|>', 50256]]);
    const bpe = (extra, vocabMap, mergeList) => ({ type: 'BPE', dropout: null, unk_token: null, ...extra, vocab: vocabMap, merges: mergeList });
    const asStrings = merges.map(m => m.join(' '));
    const llama3Vocab = new Map(vocab);
    for (const t of LLAMA3_WHOLE_WORDS) {
        if (!Object.hasOwn(v, t) || vocab.has(t)) fail(`GPT-2: "${t}" is not a token beyond the kept merges`);
        llama3Vocab.set(t, v[t]);
    }
    const bos = '<|begin_of_text|>';
    return {
        gpt2: {
            added_tokens: [eot],
            normalizer: null,
            pre_tokenizer: byteLevel(false, true, true),
            post_processor: byteLevel(true, false, true),
            decoder: byteLevel(true, true, true),
            model: bpe({ continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false }, withEot, asStrings),
        },
        llama3: {
            added_tokens: [added(50257, bos), added(50258, '<|end_of_text|>'), added(50259, '<|reserved_special_token_0|>')],
            normalizer: null,
            pre_tokenizer: {
                type: 'Sequence',
                pretokenizers: [
                    { type: 'Split', pattern: { Regex: LLAMA3_PATTERN }, behavior: 'Isolated', invert: false },
                    byteLevel(false, true, false),
                ],
            },
            post_processor: {
                type: 'Sequence',
                processors: [
                    byteLevel(true, false, true),
                    {
                        type: 'TemplateProcessing',
                        single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
                        pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                            { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
                        special_tokens: { [bos]: { id: bos, ids: [50257], tokens: [bos] } },
                    },
                ],
            },
            decoder: byteLevel(true, true, true),
            model: bpe({ continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true },
                new Map([...llama3Vocab].sort((x, y) => x[1] - y[1])), merges),
        },
        qwen2: {
            added_tokens: [eot, added(50257, '<|im_start|>'), added(50258, '<|im_end|>')],
            normalizer: { type: 'NFC' },
            pre_tokenizer: {
                type: 'Sequence',
                pretokenizers: [{ type: 'Split', pattern: { Regex: QWEN2_PATTERN }, behavior: 'Isolated', invert: false }, byteLevel(false, false, false)],
            },
            post_processor: byteLevel(false, false, false),
            decoder: byteLevel(false, false, false),
            model: bpe({ continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false },
                withEot, merges),
        },
        smollm2: {
            added_tokens: [eot],
            normalizer: null,
            pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, byteLevel(false, true, true)] },
            post_processor: byteLevel(true, false, true),
            decoder: byteLevel(true, true, true),
            model: bpe({ continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false },
                withEot, asStrings),
        },
    };
}

function mistralFixtures(src, texts) {
    const v = src.model.vocab;
    if (v['<unk>'] !== 0 || v['<s>'] !== 1 || v['</s>'] !== 2 || v['<0x00>'] !== 3 || v['\u2581Hello'] !== 22557 || !src.model.byte_fallback)
        fail('the second argument is not Mistral-7B\'s tokenizer.json');
    const single = ['<unk>', '<s>', '</s>'];
    for (let b = 0; b < 256; b++) single.push(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
    for (const text of texts) for (const ch of text) if (Object.hasOwn(v, ch)) single.push(ch);
    const { vocab, merges, parts } = truncate(src, single, 'mistral');
    const model = {
        type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
        fuse_unk: true, byte_fallback: true, vocab, merges: merges.map(m => m.join(' ')),
    };
    const post = {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
            { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
    };
    const decoder = {
        type: 'Sequence',
        decoders: [{ type: 'Replace', pattern: { String: '\u2581' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' },
            { type: 'Strip', content: ' ', start: 1, stop: 0 }],
    };
    const addedTokens = [added(0, '<unk>'), added(1, '<s>'), added(2, '</s>')];
    return {
        parts,
        llama2: {
            added_tokens: addedTokens,
            normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '\u2581' }, { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
            pre_tokenizer: null,
            post_processor: post,
            decoder,
            model,
        },
        metaspace: {
            added_tokens: addedTokens,
            normalizer: null,
            pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false },
            post_processor: post,
            decoder,
            model,
        },
    };
}

// Items joined by "," into lines of at most 100 characters (a long item alone)
function packed(items) {
    const lines = [];
    let line = '';
    for (const [i, item] of items.entries()) {
        const piece = item + (i + 1 < items.length ? ',' : '');
        if (line && Buffer.byteLength(line) + Buffer.byteLength(piece) > 100) lines.push(line), line = '';
        line += piece;
    }
    if (line) lines.push(line);
    return lines;
}

// tokenizer.json text: pretty at the top, vocab and merges packed (the file stays small)
function serialize(fx) {
    const L = ['{', '  "version": "1.0",', '  "truncation": null,', '  "padding": null,', '  "added_tokens": ['];
    fx.added_tokens.forEach((t, i) => L.push(`    ${JSON.stringify(t)}${i + 1 < fx.added_tokens.length ? ',' : ''}`));
    L.push('  ],');
    for (const k of ['normalizer', 'pre_tokenizer', 'post_processor', 'decoder']) L.push(`  "${k}": ${JSON.stringify(fx[k])},`);
    L.push('  "model": {');
    for (const [k, val] of Object.entries(fx.model)) if (k !== 'vocab' && k !== 'merges') L.push(`    "${k}": ${JSON.stringify(val)},`);
    L.push('    "vocab": {', ...packed([...fx.model.vocab].map(([t, id]) => `${JSON.stringify(t)}:${id}`)), '    },');
    L.push('    "merges": [', ...packed(fx.model.merges.map(m => JSON.stringify(m))), '    ]', '  }', '}', '');
    return L.join('\n');
}

function main() {
    const args = process.argv.slice(2);
    if (args.length !== 2) fail('usage: node tools/gen_tokenizer_golden.mjs GPT2_TOKENIZER_JSON MISTRAL_TOKENIZER_JSON');
    const T = loadTransformers();
    T.env.allowRemoteModels = false;
    T.env.allowLocalModels = true;

    const text = makeText();
    const texts = { '': text, ':short': SHORT };
    const fixtures = { ...gpt2Fixtures(readSource(args[0])) };
    const mistral = mistralFixtures(readSource(args[1]), [text, SHORT]);
    fixtures.llama2 = mistral.llama2;
    fixtures.metaspace = mistral.metaspace;
    const classes = { gpt2: 'GPT2Tokenizer', llama3: 'PreTrainedTokenizer', qwen2: 'PreTrainedTokenizer', smollm2: 'GPT2Tokenizer', llama2: 'LlamaTokenizer',
        metaspace: 'LlamaTokenizer' };

    fs.mkdirSync(OUT, { recursive: true });
    fs.writeFileSync(path.join(OUT, 'text.txt'), text);
    fs.writeFileSync(path.join(OUT, 'short.txt'), SHORT);
    const golden = [];
    for (const name of ['gpt2', 'llama3', 'qwen2', 'smollm2', 'llama2', 'metaspace']) {
        const json = serialize(fixtures[name]);
        const file = path.join(OUT, `${name}.json`);
        fs.writeFileSync(file, json);
        // the tokenizer as transformers.js builds it from the written file (the config only picks the class;
        // the template is the tokenizer.json's post_processor)
        const config = { tokenizer_class: classes[name], clean_up_tokenization_spaces: false };
        let tok;
        try {
            tok = new T[classes[name]](JSON.parse(fs.readFileSync(file, 'utf8')), config);
        } catch (e) {
            fail(`${name}.json does not load in transformers.js: ${e.message}`);
        }
        for (const [suffix, t] of Object.entries(texts))
            for (const special of [0, 1]) {
                const ids = tok.encode(t, { add_special_tokens: !!special });
                if (!ids.length || ids.some(id => !Number.isInteger(id) || id < 0)) fail(`${name}${suffix}: bad ids`);
                golden.push([`${name}${suffix}`, special, ids.length, ...ids].join(' '));
                if (suffix || special) continue;
                const back = tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
                const exact = back === t;
                const byteLevel = name === 'gpt2' || name === 'llama3' || name === 'smollm2'; /* (qwen2's NFC changes the text) */
                if (byteLevel && !exact) fail(`${name}: decoding the ids of text.txt does not give text.txt back`);
                if (name === 'llama3') { /* the whole words must change the ids: else ignore_merges is not tested */
                    const j = JSON.parse(json);
                    j.model.ignore_merges = false;
                    const merged = new T[classes[name]](j, config).encode(t, { add_special_tokens: false });
                    if (merged.join(' ') === ids.join(' ')) fail('llama3: ignore_merges does not change the ids of text.txt');
                }
                let at = 0;
                while (at < t.length && back[at] === t[at]) at++;
                const where = exact ? '' : ` (from char ${at}: ${JSON.stringify(t.slice(at, at + 12))} -> ${JSON.stringify(back.slice(at, at + 12))})`;
                console.log(`${name}.json: ${Buffer.byteLength(json)} bytes, vocab ${fixtures[name].model.vocab.size}, text.txt ${ids.length} ids, round trip ${exact ? 'exact' : 'NOT exact'}${where}`);
            }
    }
    fs.writeFileSync(path.join(OUT, 'golden.txt'), golden.join('\n') + '\n');
    console.log(`text.txt: ${Buffer.byteLength(text)} bytes; Mistral merge parts kept beyond the merges' results: ${mistral.parts}`);
    console.log(`wrote ${OUT}`);
}

main();
