#!/usr/bin/env bash
# The GPU runs behind docs/BENCHMARKS.md, as one device call each:
#   bash bench/device_session.sh record   # native vs Python fold, post-processing per 100k GPU events
#   bash bench/device_session.sh proof    # hard cases, ground truth, examples, overhead
# Output under $OUT. Needs the msgspec wheel in .whl/ (the device has no index).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "from dlpt.collectors import record_native as r; print('native reader:', r.load() is not None)"
case "${1:-record}" in
record)
  python3 bench/gpu_native_check.py 2>&1 | tail -20
  python3 bench/bench_record.py --native --workloads flat,deep --sizes 25000 --repeats 2 --json "$OUT/record_fd.json" 2>&1 | tail -24
  python3 bench/bench_record.py --native --workloads train --sizes 2000 --repeats 2 --json "$OUT/record_train.json" 2>&1 | tail -12
  python3 bench/bench_record.py --workloads flat,deep --sizes 25000 --repeats 1 --free now --json "$OUT/record_free_now.json" 2>&1 | tail -8
  ;;
proof)
  python3 bench/gpu_cases.py 2>&1 | tail -40
  python3 bench/gpu_proof.py 2>&1 | tail -40
  ;;
esac
