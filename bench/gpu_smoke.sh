#!/usr/bin/env bash
# First GPU check of the collector (one device call): build with CUPTI, ground truth and hard
# cases (bench/gpu_proof.py, bench/gpu_cases.py), and nanoGPT eager step time unprofiled /
# dlpt / Proton over 60 iterations. Needs the msgspec wheel in .whl/ and shared/programs/.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import sys; print(sys.version)"
python3 - <<'PY'
import time
t = time.time()
from dlpt.collectors.record import native
m = native.load()
print("collector built in", round(time.time() - t, 1), "s", m.capabilities(), native.cupti())
PY
work=$(mktemp -d); cp -r shared/programs/nanoGPT "$work/"; python3 shared/programs/make_nanogpt_data.py "$work/nanoGPT" >/dev/null
args="config/train_shakespeare_char.py --compile=False --max_iters=${ITERS:-60} --eval_interval=1000 --eval_iters=5 --log_interval=1 --always_save_checkpoint=False"
med() { python3 -c "import re,sys,statistics; t=[float(m.group(2)) for m in re.finditer(r'iter (\d+): .*?time ([\d.]+)ms', open(sys.argv[1]).read()) if int(m.group(1))>=10]; print(sys.argv[2], 'median step', round(statistics.median(t),2) if t else None, 'ms over', len(t))" "$1" "$2"; }
(cd "$work/nanoGPT" && for r in 1 2; do
  python3 train.py $args > $OUT/nano_none_$r.log 2>&1; med $OUT/nano_none_$r.log "none#$r"
  dlpt record --force -o $OUT/nano.dlpt train.py $args > $OUT/nano_dlpt_$r.log 2>&1; med $OUT/nano_dlpt_$r.log "dlpt#$r"; tail -2 $OUT/nano_dlpt_$r.log
  DLPT_FRAMES=gil dlpt record --force -o $OUT/nano_gil.dlpt train.py $args > $OUT/nano_gil_$r.log 2>&1; med $OUT/nano_gil_$r.log "dlpt-gil#$r"
  python3 -m triton.profiler.proton -c python train.py $args > $OUT/nano_proton_$r.log 2>&1; med $OUT/nano_proton_$r.log "proton#$r"
done)
dlpt report $OUT/nano.dlpt --view flat --by line --top 12 2>&1 | tail -16
dlpt export $OUT/nano.dlpt -f hotspots -o $OUT/nano_hot.json && python3 -c "import json; s=json.load(open('$OUT/nano_hot.json'))['summary']; print({k: s[k] for k in ('gpu_time','attributed_to_source','backward_time','unattributed')})"
case "${1:-}" in proof)
  python3 bench/gpu_cases.py 2>&1 | tail -30
  python3 bench/gpu_proof.py 2>&1 | tail -40;;
esac
