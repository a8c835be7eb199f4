#!/usr/bin/env bash
# Usage: bench/check_outputs.sh [REV]   (REV defaults to HEAD)
# A performance change must leave dlpt's outputs unchanged. This runs `dlpt report` (three views)
# and `dlpt export -f hotspots` on the six fixtures twice: with the working tree, and with the
# working tree where the files the reading path's performance work touches are taken from REV
# (so that other people's edits elsewhere are on both sides), then compares every byte.
set -euo pipefail
rev=${1:-HEAD}
root=$(cd "$(dirname "$0")/.." && pwd)
F=${DLPT_FIXTURES:-/work/shared/fixtures/kineto}
OWNED="collectors/kineto/__init__.py collectors/kineto/decode.py collectors/kineto/link.py dlpt/cct.py dlpt/transforms.py dlpt/views.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The reference: the package laid out as installed (dlpt, dlpt.collectors, dlpt.viewers).
mkdir -p "$tmp/ref"
cp -r "$root/dlpt" "$tmp/ref/dlpt"
cp -r "$root/collectors" "$tmp/ref/dlpt/collectors"
cp -r "$root/viewers" "$tmp/ref/dlpt/viewers"
for f in $OWNED; do
  dst="$tmp/ref/dlpt/${f#dlpt/}"
  git -C "$root" show "$rev:$f" > "$dst"
done
run() {  # run OUTDIR [PYTHONPATH]
  mkdir -p "$1"
  for f in "$F"/*.pt.trace.json.gz; do
    b=$(basename "$f" .pt.trace.json.gz)
    PYTHONPATH=${2:-} python3 -m dlpt report "$f" > "$1/$b.report.txt"
    PYTHONPATH=${2:-} python3 -m dlpt report "$f" --view flat --by line > "$1/$b.flat.txt"
    PYTHONPATH=${2:-} python3 -m dlpt report "$f" --view bottom-up > "$1/$b.bu.txt"
    PYTHONPATH=${2:-} python3 -m dlpt export -f hotspots -o - "$f" > "$1/$b.hot.json"
  done
}
cd "$tmp"  # not the checkout: python puts the working directory first on sys.path
run "$tmp/before" "$tmp/ref"
run "$tmp/after"
PYTHONPATH=$tmp/ref python3 -c "import dlpt.collectors.kineto.link as m, sys; sys.exit(0 if m.__file__.startswith('$tmp') else 1)" \
  || { echo "reference tree not used"; exit 1; }
diff -r "$tmp/before" "$tmp/after" && echo "outputs identical ($(ls "$tmp/after" | wc -l) files)"
