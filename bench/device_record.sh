#!/usr/bin/env bash
# Issue 10's GPU measurements, one entry point for the device machine (run from the repo root):
#   bash bench/device_record.sh fidelity    # ground truth per line, nanoGPT shares, next to Kineto (~2 min)
#   bash bench/device_record.sh overhead    # nanoGPT 4 ways, --steps, timm resnet50       (~5-7 min)
#   bash bench/device_record.sh trainer     # HF Trainer, unprofiled + 10× dlpt record     (~3-4 min)
#   bash bench/device_record.sh cpu         # op-bound CPU loop + 100k-step memory check   (~2 min)
#   bash bench/device_record.sh all         # fidelity,overhead,trainer in one call, sharing the time
#   bash bench/device_record.sh fidelity,trainer   # any list: each part keeps back what the later ones need
#   bash bench/device_record.sh overhead nanogpt,steps --repeats 1   # a part's own options follow it
# Parts run in that order with the time left (TOTAL seconds, default 540, under the tool's 10
# minutes); each part skips the runs that would not fit and says so. Output under $OUT: tables.md
# (every table), runs.log (every run's lines, time-stamped), <part>.json, fidelity.dlpt, and this
# script's own log, device_record.log. Needs shared/programs/ in the repo root (the lead copies
# /work/shared/programs there) and, for dlpt's own dependencies the image lacks, their wheels in
# .whl/ (carried: `carry: [".whl"]`).
set -u -o pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export DLPT_BENCH_LOG="$OUT/runs.log"
export PYTHONUNBUFFERED=1
TOTAL=${TOTAL:-540}
start=$SECONDS
log="$OUT/device_record.log"
left() { echo $((TOTAL - (SECONDS - start))); }
say() { echo "$*" | tee -a "$log"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { say "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${DLPT_SKIP_INSTALL:-}" ]; then  # set it where dlpt is installed already (a try on a CPU machine)
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.txt" 2>&1 \
    || { cat "$OUT/pip.txt"; say "pip install -e . failed"; exit 1; }
  rm -f "$OUT/pip.txt"
fi
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
# What dlpt and the benchmarks import, checked once up front: a missing one is named here
# rather than as a traceback in the middle of a part.
(cd /tmp && python3 - <<'EOF') 2>&1 | tee -a "$log"
import importlib, sys
need = ["torch", "numpy", "msgspec", "dlpt", "transformers", "accelerate", "timm", "triton.profiler.proton"]
bad = []
for m in need:
    try:
        mod = importlib.import_module(m)
        print(f"  {m} {getattr(mod, '__version__', '')}")
    except Exception as e:  # a report, not a failure: the part that needs it will say so too
        bad.append(m); print(f"  {m}: MISSING ({type(e).__name__}: {e})")
import torch
print(f"  python {sys.version.split()[0]}, cuda {torch.version.cuda}, gpu {torch.cuda.is_available()}")
sys.exit(1 if set(bad) & {"torch", "numpy", "msgspec", "dlpt"} else 0)  # the rest: only their parts fail
EOF
[ $? -eq 0 ] || { say "a package dlpt needs is missing (carry its wheel in .whl/)"; exit 1; }
[ -d shared/programs/nanoGPT ] || say "WARNING: shared/programs/ is missing: overhead and fidelity's nanoGPT part will fail"

# dlpt builds its native part on first use: do that once here, so no measured run pays for it.
cat >/tmp/dlpt_warm.py <<'EOF'
import torch
x = torch.ones(1024, device="cuda")
for _ in range(10):
    x = x * 1.0001
torch.cuda.synchronize()
EOF
t0=$SECONDS
(cd /tmp && timeout 300 python3 -m dlpt record --force -o /tmp/dlpt_warm.dlpt /tmp/dlpt_warm.py) 2>&1 | tail -3 | tee -a "$log"
say "warm-up record (native build on first use): $((SECONDS - t0)) s"

run_part() {  # run_part NAME SECONDS_FOR_IT COMMAND...
  local name=$1 mine=$2; shift 2
  if [ "$mine" -lt 60 ]; then say "== $name: skipped, $(left) s left and $mine s for it"; return; fi
  say "== $name ($mine of $(left) s left)"
  "$@" 2>&1 | tee -a "$log"
}

# Seconds each part needs at the least, kept back for the parts still to come.
declare -A need=([fidelity]=120 [overhead]=240 [trainer]=150 [cpu]=120)
parts=${1:-all}
shift || true  # with one part, what follows goes to its script, e.g. `overhead nanogpt,steps --repeats 1`
[ "$parts" = all ] && parts=fidelity,overhead,trainer
IFS=, read -r -a list <<<"$parts"
[ ${#list[@]} -gt 1 ] && [ $# -gt 0 ] && { echo "options after the part go with one part only"; exit 2; }
for i in "${!list[@]}"; do
  p=${list[$i]}
  later=0
  for q in "${list[@]:$((i + 1))}"; do later=$((later + ${need[$q]:-0})); done
  b=$(( $(left) - later ))
  case "$p" in
  fidelity) run_part fidelity "$b" python3 bench/gpu_fidelity.py --budget "$b" "$@" ;;
  overhead) run_part overhead "$b" python3 bench/gpu_overhead.py --budget "$b" "$@" ;;
  trainer) run_part trainer "$b" python3 bench/gpu_trainer.py --budget "$b" "$@" ;;
  cpu) run_part cpu "$b" python3 bench/cpu_oploop.py --budget "$b" "$@" ;;
  *) echo "usage: bash bench/device_record.sh fidelity|overhead|trainer|cpu|all|PART,PART... [options of one part]"; exit 2 ;;
  esac
done
say "total $((SECONDS - start)) s"
echo
echo "################ tables"
cat "$OUT/tables.md" 2>/dev/null
