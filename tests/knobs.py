"""The table of test hooks and A/B knobs of common/core/testing.h, read from the header (the
one list): the harnesses use it to pick the test build for a process given one, and
tests/tools/test_release_strings.py to check that no release binary holds one."""
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
HEADER = os.path.join(ROOT, "common", "core", "testing.h")

_ROW = re.compile(r'X\((\w+),\s*"(TSR_[A-Z0-9_]+)",\s*(CRASH|SLEEP|AB),\s*((?:"[^"]*"\s*)+),'
                  r'\s*((?:"[^"]*"\s*)+)\)')


def _joined(literals):
    return "".join(re.findall(r'"([^"]*)"', literals))


def table(header=HEADER):
    """[(id, variable, kind, [values], meaning)] in the header's order."""
    with open(header) as f:
        text = f.read().replace("\\\n", "\n")
    start = text.index("#define TSR_TEST_KNOBS(X)")
    end = text.index("/* clang-format on */", start)
    body = re.sub(r"/\*.*?\*/", "", text[start:end], flags=re.S)
    rows = [(m.group(1), m.group(2), m.group(3), _joined(m.group(4)).split(),
             _joined(m.group(5))) for m in _ROW.finditer(body)]
    if len(rows) != body.count("X("):
        raise ValueError("%s: %d rows parsed of %d" % (header, len(rows), body.count("X(")))
    return rows


def variables():
    return [r[1] for r in table()]
