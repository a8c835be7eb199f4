#!/usr/bin/env bash
# Quick A/B of the collector on nanoGPT eager: unprofiled, dlpt, Proton (python context),
# interleaved, 2 rounds; plus per-call costs (bench/percall.py). Needs .whl/ and shared/programs/.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
python3 bench/percall.py 2>&1 | grep -v building
work=$(mktemp -d); cp -r shared/programs/nanoGPT "$work/"; python3 shared/programs/make_nanogpt_data.py "$work/nanoGPT" >/dev/null
args="config/train_shakespeare_char.py --compile=False --max_iters=${ITERS:-150} --eval_interval=100000 --eval_iters=5 --log_interval=1 --always_save_checkpoint=False"
med() { python3 -c "import re,sys,statistics; t={int(m.group(1)): float(m.group(2)) for m in re.finditer(r'iter (\d+): .*?time ([\d.]+)ms', open(sys.argv[1]).read())}; v=[x for k,x in t.items() if k>=10]; print(f'{sys.argv[2]:>12}: median {statistics.median(v):.2f} ms over {len(v)}')" "$1" "$2"; }
cd "$work/nanoGPT"
for r in 1 2 3; do
  python3 train.py $args > $OUT/none_$r.log 2>&1; med $OUT/none_$r.log "none#$r"
  dlpt record --force -o $OUT/nano.dlpt train.py $args > $OUT/dlpt_$r.log 2>&1; med $OUT/dlpt_$r.log "dlpt#$r"
  python3 -m triton.profiler.proton -c python train.py $args > $OUT/proton_$r.log 2>&1; med $OUT/proton_$r.log "proton#$r"
done
