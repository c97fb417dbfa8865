#!/usr/bin/env bash
# The gate's drills, in a clone you can throw away: a commit on top of HEAD, then `tools/dev.py gate HEAD <it>`
# with the working tree left at HEAD (the suite from the working tree, the package from the commit, as asv does).
#   tools/drills.sh aa [GATE OPTIONS]                      an empty commit: identical code (A/A)
#   tools/drills.sh slowdown STRATEGY 0.05 [GATE OPTIONS]  STRATEGY's decode made 5 % slower (a busy wait)
#   tools/drills.sh work STRATEGY K [GATE OPTIONS]         K loop iterations per position more (194 instructions
#                                                          each on CPython 3.11); STRATEGY: benchmarks/common.py's
set -euo pipefail
cd "$(dirname "$0")/.."
kind=$1; shift
if [ "$kind" != aa ]; then
    name=$(python3 -c "import sys; sys.path.insert(0, '.'); from benchmarks.common import PUBLIC_FUNCTIONS as P; print(P['$1'])")
    amount=$2; shift 2
fi
case $kind in
    aa) snippet="" ;;
    slowdown) snippet="
import functools as _ft, time as _t
_unchanged_$name = $name
@_ft.wraps(_unchanged_$name)
def $name(*args, **kwargs):  # drill: $amount slower
    start = _t.perf_counter(); out = _unchanged_$name(*args, **kwargs)
    stop = start + (_t.perf_counter() - start) * (1 + $amount)
    while _t.perf_counter() < stop: pass
    return out
" ;;
    work) snippet="
import functools as _ft
_unchanged_$name = $name
@_ft.wraps(_unchanged_$name)
def $name(x, *args, **kwargs):  # drill: $amount loop iterations per position more
    out = _unchanged_$name(x, *args, **kwargs)
    for _ in range($amount * x.shape[-2]): pass
    return out
" ;;
    *) echo "usage: tools/drills.sh {aa | slowdown STRATEGY FRACTION | work STRATEGY K} [GATE OPTIONS]" >&2; exit 2 ;;
esac
base=$(git rev-parse HEAD)
git checkout -q --detach "$base"  # the commit on no branch
printf '%s' "$snippet" >> kv_attention/decode.py
git add kv_attention/decode.py  # the drill's change alone: other local changes stay in the working tree
git -c user.name=drill -c user.email=drill@localhost commit -q --allow-empty -m "drill: $kind"
head=$(git rev-parse HEAD)
git checkout -q --detach "$base"
echo "drill $kind: gate $base $head"
python3 tools/dev.py gate "$base" "$head" "$@"
