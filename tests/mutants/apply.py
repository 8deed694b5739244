#!/usr/bin/env python3
"""Applies one planted bug (a .mut file) to the source tree in DIR: exit 0 applied, 2 stale (the
snippet is not in the file exactly once: the code moved; refresh the mutant), 1 a malformed mutant.
Format: '#' comment lines, 'file: <path>', 'tests: <test binaries to run first>', then '--- find',
the exact snippet, '--- replace', its replacement (to the end of the file)."""
import sys

def parse(path):
    head, find, repl, part = {}, [], [], None
    for line in open(path).read().split('\n'):
        if line == '--- find': part = find
        elif line == '--- replace': part = repl
        elif part is not None: part.append(line)
        elif ':' in line and not line.startswith('#'):
            k, v = line.split(':', 1)
            head[k.strip()] = v.strip()
    while repl and repl[-1] == '': repl.pop()
    return head, '\n'.join(find), '\n'.join(repl)

def main():
    mut, root = sys.argv[1], sys.argv[2]
    head, find, repl = parse(mut)
    if 'file' not in head or not find or find == repl:
        print(f'{mut}: malformed (needs file:, --- find and a different --- replace)')
        return 1
    if len(sys.argv) > 3 and sys.argv[3] == '--tests':
        print(head.get('tests', ''))
        return 0
    path = f"{root}/{head['file']}"
    try: src = open(path).read()
    except OSError: src = ''
    n = src.count(find)
    if n != 1:
        print(f"STALE {mut}: the snippet occurs {n} times in {head['file']}")
        return 2
    open(path, 'w').write(src.replace(find, repl))
    return 0

sys.exit(main())
