#!/usr/bin/env python3
"""Writes a C program that calls every function pdde.h declares with every pointer NULL and every
other argument zero (numbers, enums, structs passed by value), each call in a forked child with a
10 s alarm, and prints one line per function: "NAME exit N", "NAME signal N".
usage: api_null_sweep.py pdde.h OUT.c   (prints the number of functions it calls)
tests/test_api_null.sh builds and runs it: bad input gets an error, never a crash."""
import re
import sys

# Functions that cannot be called with zeros by design, and why. (A function that crashes is not one.)
SKIP = {
}


def split_params(params):
    """The parameters, split at the commas outside parentheses (a function pointer's own list)."""
    out, depth, cur = [], 0, ''
    for ch in params:
        if ch == ',' and depth == 0:
            out.append(cur.strip()); cur = ''
            continue
        depth += (ch == '(') - (ch == ')')
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return [] if out in ([], ['void']) else out


def zero_of(param):
    """A C expression for the parameter with everything NULL or zero."""
    if '*' in param or '[' in param:  # pointers, arrays, function pointers
        return 'NULL'
    words = param.split()
    # the type without the parameter's name: a compound literal zeroes a number, an enum or a struct
    ctype = ' '.join(w for w in words[:-1] if w != 'const') if len(words) > 1 else words[0]
    return '(%s){0}' % ctype


def declarations(header):
    src = re.sub(r'/\*.*?\*/', ' ', header, flags=re.S)
    src = re.sub(r'//[^\n]*', '', src)
    src = re.sub(r'(?ms)^#ifdef __cplusplus$.*?^#endif$', '', src)  # extern "C" { and its }
    src = re.sub(r'(?m)^\s*#(?:[^\n]*\\\n)*[^\n]*', '', src)  # preprocessor lines, continued ones too
    src = re.sub(r'__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)', '', src)
    # each top-level statement: a declaration ends with ';' outside braces (struct bodies hold fields)
    depth, stmt, stmts = 0, '', []
    for ch in src:
        if ch == '{':
            depth += 1
        elif ch == '}':
            depth -= 1
        elif ch == ';' and depth == 0:
            stmts.append(' '.join(stmt.split())); stmt = ''
            continue
        if depth == 0 and ch != '}':
            stmt += ch
    for s in stmts:
        m = re.fullmatch(r'(?:extern\s+)?([A-Za-z_][\w\s\*]*?)\b(pdde_\w+)\s*\((.*)\)', s)
        if not m or m.group(1).split()[0] == 'typedef':
            continue
        yield m.group(2), split_params(m.group(3))


def main():
    header, out = sys.argv[1], sys.argv[2]
    calls, seen = [], set()
    for name, params in declarations(open(header).read()):
        if name in seen or name in SKIP or '...' in params:  # (varargs: nothing to zero)
            continue
        seen.add(name)
        calls.append((name, '(void)%s(%s);' % (name, ', '.join(zero_of(p) for p in params))))
    lines = ['#define _GNU_SOURCE', '#include "pdde.h"', '#include <fcntl.h>', '#include <signal.h>',
             '#include <stdio.h>', '#include <stdlib.h>', '#include <sys/wait.h>', '#include <unistd.h>',
             '', 'static void call(int i) {', '    switch (i) {']
    lines += ['    case %d: %s break;' % (i, c) for i, (_, c) in enumerate(calls)]
    lines += ['    }', '}', '', 'static const char *const names[] = {']
    lines += ['    "%s",' % n for n, _ in calls]
    lines += ['};', '', '''int main(void) {
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) { /* what a function says of its bad input is not this test's business */
            int null_fd = open("/dev/null", O_WRONLY);
            if (null_fd >= 0) dup2(null_fd, 2);
            alarm(10);
            call(i);
            _exit(0);
        }
        int st = 0;
        if (waitpid(pid, &st, 0) < 0) { perror("waitpid"); return 1; }
        if (WIFSIGNALED(st)) printf("%s signal %d\\n", names[i], WTERMSIG(st));
        else printf("%s exit %d\\n", names[i], WEXITSTATUS(st));
    }
    return 0;
}''']
    with open(out, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    print(len(calls))


if __name__ == '__main__':
    main()
