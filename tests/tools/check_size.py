#!/usr/bin/env python3
"""check_size -- no source file over FILE_MAX lines, no function over FN_MAX lines.

The house style puts a function's opening and closing braces at column 0, so a function
spans from the first line of its signature (the line that holds its name, after a blank
line, a comment or a previous definition) to the '}' at column 0. Exit 1 with one line
per offender:  check-size: FILE:LINE: function NAME is N lines (limit 150)

    check_size.py [--file-max N] [--fn-max N] FILE.c...
"""
import argparse
import re
import sys

NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def signature_start(lines, brace):
    """Index of the first line of the signature whose body opens at lines[brace]."""
    j = brace - 1
    while j > 0 and "(" not in lines[j]:
        j -= 1
    while j > 0:
        prev = lines[j - 1].rstrip()
        if not prev or prev.endswith((";", "}", "*/")) or prev.startswith(("#", "/*", " *")):
            break
        j -= 1
    return j


def offenders(path, file_max, fn_max):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    out = []
    if len(lines) - 1 > file_max:
        out.append("check-size: %s: %d lines (limit %d)" % (path, len(lines) - 1, file_max))
    i = 0
    while i < len(lines):
        if lines[i].startswith("{"):
            j = signature_start(lines, i)
            k = i + 1
            while k < len(lines) and not lines[k].startswith("}"):
                k += 1
            m = NAME.search(" ".join(lines[j:i]))
            n = k - j + 1
            if n > fn_max:
                out.append("check-size: %s:%d: function %s is %d lines (limit %d)"
                           % (path, j + 1, m.group(1) if m else "?", n, fn_max))
            i = k
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file-max", type=int, default=1500)
    ap.add_argument("--fn-max", type=int, default=150)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    bad = []
    for p in a.files:
        bad += offenders(p, a.file_max, a.fn_max)
    for b in bad:
        print(b)
    if bad:
        return 1
    print("check-size: %d files, none over %d lines, no function over %d lines"
          % (len(a.files), a.file_max, a.fn_max))
    return 0


if __name__ == "__main__":
    sys.exit(main())
