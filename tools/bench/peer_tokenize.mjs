// peer_tokenize.mjs: the peer of tools/bench/bench_tokenize.sh, transformers.js (@huggingface/transformers,
// the reference of examples/hf_tokenizer.h's goldens) encoding the same text with the same tokenizer.json:
//   node tools/bench/peer_tokenize.mjs TOKENIZER_JSON TEXT_FILE IDS_OUT REPEATS
// writes the ids (no start token) as one line to IDS_OUT and prints "seconds=<median of REPEATS encodes>
// ids=<count>". The module is found through $TRANSFORMERS_DIR (a folder where `npm install --ignore-scripts
// @huggingface/transformers` ran), else the working directory or NODE_PATH.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [file, textFile, idsOut, repeatsArg] = process.argv.slice(2);
const from = createRequire(path.join(process.env.TRANSFORMERS_DIR || process.cwd(), 'noop.js'));
let T;
try {
    T = await import(from.resolve('@huggingface/transformers'));
} catch (e) {
    console.log('peer unavailable: @huggingface/transformers not found (set TRANSFORMERS_DIR)');
    process.exit(2);
}
T.env.allowRemoteModels = false;
const tok = new T.PreTrainedTokenizer(JSON.parse(fs.readFileSync(file, 'utf8')), { clean_up_tokenization_spaces: false });
const text = fs.readFileSync(textFile, 'utf8');
const times = [];
let ids = [];
for (let r = 0; r < Number(repeatsArg || 3); r++) {
    const t0 = process.hrtime.bigint();
    ids = tok.encode(text, { add_special_tokens: false });
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
times.sort((a, b) => a - b);
fs.writeFileSync(idsOut, ids.join(' ') + '\n');
console.log(`seconds=${times[times.length >> 1].toFixed(4)} ids=${ids.length}`);
