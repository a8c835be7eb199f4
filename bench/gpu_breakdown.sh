#!/usr/bin/env bash
# Where the collector's overhead goes on nanoGPT eager (one device call): step time unprofiled,
# dlpt, dlpt without CUPTI (DLPT_DEVICE=0), dlpt without the op callback (DLPT_HOST=0), and
# Proton's python context, interleaved; then --steps 10:20 before/during/after, and a program
# that runs torch.profiler itself. Needs .whl/ (msgspec) and shared/programs/.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
python3 -c "from dlpt.collectors.record import native; native.load(quiet=True)"
work=$(mktemp -d); cp -r shared/programs/nanoGPT "$work/"; python3 shared/programs/make_nanogpt_data.py "$work/nanoGPT" >/dev/null
ITERS=${ITERS:-150}
args="config/train_shakespeare_char.py --compile=False --max_iters=$ITERS --eval_interval=100000 --eval_iters=5 --log_interval=1 --always_save_checkpoint=False"
med() { python3 - "$@" <<'PY'
import re, statistics, sys
t = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"iter (\d+): .*?time ([\d.]+)ms", open(sys.argv[1]).read())}
def m(a, b):
    v = [x for k, x in t.items() if a <= k < b]
    return round(statistics.median(v), 2) if v else None
print(f"{sys.argv[2]:>14}: median {m(10, 10**9)} ms (iters 10+: {len([k for k in t if k >= 10])}); 2-9 {m(2, 10)}, 10-19 {m(10, 20)}, 40+ {m(40, 10**9)}; max {max(t.values()) if t else None}")
PY
}
cd "$work/nanoGPT"
for r in 1 2; do
  python3 train.py $args > $OUT/none_$r.log 2>&1; med $OUT/none_$r.log "none#$r"
  dlpt record --force -o $OUT/nano.dlpt train.py $args > $OUT/dlpt_$r.log 2>&1; med $OUT/dlpt_$r.log "dlpt#$r"
  DLPT_DEVICE=0 dlpt record --force -o /tmp/h.dlpt train.py $args > $OUT/host_$r.log 2>&1; med $OUT/host_$r.log "host-only#$r"
  DLPT_HOST=0 dlpt record --force -o /tmp/d.dlpt train.py $args > $OUT/dev_$r.log 2>&1; med $OUT/dev_$r.log "device-only#$r"
  python3 -m triton.profiler.proton -c python train.py $args > $OUT/proton_$r.log 2>&1; med $OUT/proton_$r.log "proton#$r"
done
grep "profile saved" $OUT/dlpt_1.log
args120="config/train_shakespeare_char.py --compile=False --max_iters=120 --eval_interval=100000 --eval_iters=5 --log_interval=1 --always_save_checkpoint=False"
python3 train.py $args120 > $OUT/none120.log 2>&1; med $OUT/none120.log "none-120"
dlpt record --force --steps 10:20 -o $OUT/steps.dlpt train.py $args120 > $OUT/steps.log 2>&1; med $OUT/steps.log "steps10:20"
grep "dlpt:" $OUT/steps.log
cd - >/dev/null
cd "$work" && dlpt record --force -o $OUT/wtp.dlpt $OLDPWD/bench/gpu_cases/with_torch_profiler.py 2>&1 | tail -4
dlpt report $OUT/wtp.dlpt --view flat --by line --top 6 2>&1 | tail -8
