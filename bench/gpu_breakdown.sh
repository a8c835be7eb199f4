#!/usr/bin/env bash
# Where the collector's overhead goes on nanoGPT eager (one device call), interleaved rounds:
# unprofiled, dlpt, dlpt with the op callback returning at once (DLPT_DIAG=noop: torch's callback
# machinery + CUPTI), CUPTI alone with and without its callbacks or activities (DLPT_HOST=0),
# the op callback alone (DLPT_DEVICE=0), Proton; ops per step. Needs .whl/ and shared/programs/.
#   bash bench/gpu_breakdown.sh          # every configuration, 2 rounds
#   bash bench/gpu_breakdown.sh quick    # unprofiled, dlpt and Proton only, 3 rounds
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
python3 bench/percall.py 2>&1 | grep -v building
work=$(mktemp -d); cp -r shared/programs/nanoGPT "$work/"; python3 shared/programs/make_nanogpt_data.py "$work/nanoGPT" >/dev/null
ITERS=${ITERS:-150}
args="config/train_shakespeare_char.py --compile=False --max_iters=$ITERS --eval_interval=100000 --eval_iters=5 --log_interval=1 --always_save_checkpoint=False"
med() { python3 -c "import re,sys,statistics; t={int(m.group(1)): float(m.group(2)) for m in re.finditer(r'iter (\d+): .*?time ([\d.]+)ms', open(sys.argv[1]).read())}; v=[x for k,x in t.items() if k>=10]; print(f'{sys.argv[2]:>22}: median {statistics.median(v):.2f} ms over {len(v)}')" "$1" "$2"; }
run() { local name=$1; shift; env "$@" dlpt record --force -o /tmp/b.dlpt train.py $args > $OUT/$name.log 2>&1; med $OUT/$name.log "$name"; }
cd "$work/nanoGPT"
rounds="1 2"; [ "${1:-}" = quick ] && rounds="1 2 3"
for r in $rounds; do
  python3 train.py $args > $OUT/none.log 2>&1; med $OUT/none.log "none#$r"
  run dlpt#$r X=1
  if [ "${1:-}" = quick ]; then
    python3 -m triton.profiler.proton -c python train.py $args > $OUT/proton.log 2>&1; med $OUT/proton.log "proton#$r"
    continue
  fi
  run noop-host#$r DLPT_DIAG=noop
  run host-only#$r DLPT_DEVICE=0
  run cupti#$r DLPT_HOST=0
  run cupti-nocallbacks#$r DLPT_HOST=0 DLPT_DIAG=nocallbacks
  run cupti-noactivities#$r DLPT_HOST=0 DLPT_DIAG=noactivities
  python3 -m triton.profiler.proton -c python train.py $args > $OUT/proton.log 2>&1; med $OUT/proton.log "proton#$r"
done
dlpt record --force -o /tmp/b.dlpt train.py $args > /dev/null 2>&1
python3 -c "import dlpt; m=dlpt.load('/tmp/b.dlpt').meta; print('collector', m['collector'], 'steps', m['steps_seen'])"
