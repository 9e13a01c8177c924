#!/usr/bin/env bash
# The engine's tests under valgrind: fails if any block the engine allocated is
# definitely lost. Python allocates with malloc (PYTHONMALLOC=malloc) so that valgrind
# sees every object; CPython's own leftovers at exit are ignored: only a loss record
# whose allocation stack runs through _engine*.so counts, and an invalid read or write
# in such a stack too.
# Usage: bench/engine/leaks.sh [pytest arguments]   (default: the engine's crypto and
# frames tests; about 2 minutes on a busy 2-core machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "leaks.sh: needs valgrind (apt-get install valgrind)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ $# -gt 0 ] || set -- tests/test_engine_crypto.py tests/test_engine_frames.py
PYTHONMALLOC=malloc valgrind -q --leak-check=full --show-leak-kinds=definite \
    --num-callers=40 --xml=yes --xml-file="$out/vg.xml" \
    .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
.venv/bin/python - "$out/vg.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

counted = {"Leak_DefinitelyLost", "InvalidRead", "InvalidWrite", "InvalidFree"}
found = 0
for error in ET.parse(sys.argv[1]).getroot().iter("error"):
    frames = error.find("stack").findall("frame")
    if error.findtext("kind") not in counted:
        continue
    if not any("_engine" in (f.findtext("obj") or "") for f in frames):
        continue
    found += 1
    what = error.find("xwhat") if error.find("xwhat") is not None else error
    print(what.findtext("text") or error.findtext("what"))
    for f in frames[:12]:
        file = f"{f.findtext('file')}:{f.findtext('line')}" if f.findtext("file") else ""
        print(f"    {f.findtext('fn') or f.findtext('ip')} {file or f.findtext('obj')}")
print(f"leaks.sh: {found} engine leak or memory error records")
sys.exit(1 if found else 0)
PY
