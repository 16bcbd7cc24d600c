#!/usr/bin/env bash
# Issue 15 (branch daemon2): the node daemon before (main at 9cbd968) and after this branch, side by
# side on the H200 x2 over a ~7-minute job lifecycle (bench/daemon_lifecycle.py live), with the
# energy counter read every window (new_n1), every second window (new_n2, the default) and every
# third (new_n3), plus a 1 Hz timing of each NVML call (--nvml-probe).
#
# Two steps:
#   1. on the CPU machine, put both daemons' files under .carry/daemon2/ of a checkout of main:
#        bash /work/wt/daemon2/bench/device_daemon2.sh carry /work/main
#      (old/: telemetry/, wattclass/gpu/, wattclass/jobmap.py at 9cbd968; new/: the same from
#      branch daemon2, plus the bench files this run needs);
#   2. on the device (kind nvidia-h200-x2), from the repository root, with carry [".carry/daemon2"],
#      timeout 600 s:
#        bash .carry/daemon2/new/bench/device_daemon2.sh run
#      Writes two files to $OUT (the JSON result and the driver's stderr) and prints a summary;
#      about 7.5 minutes (420 s measured, plus start-up, loads and the final Parquet reads).
#      SECONDS_MEASURED=N changes the measured time.
set -euo pipefail

OLD_COMMIT=9cbd968
DAEMON_PATHS=(telemetry wattclass/gpu wattclass/jobmap.py)
BENCH_FILES=(bench/daemon_lifecycle.py bench/gpu_load.py bench/benchstamp.py bench/device_daemon2.sh)

case "${1:-}" in
carry)
    src=$(cd "$(dirname "$0")/.." && pwd)
    dest="${2:?usage: device_daemon2.sh carry MAIN_CHECKOUT}/.carry/daemon2"
    rm -rf "$dest"
    mkdir -p "$dest/old" "$dest/new"
    git -C "$src" archive "$OLD_COMMIT" "${DAEMON_PATHS[@]}" | tar -x -C "$dest/old"
    git -C "$src" archive HEAD "${DAEMON_PATHS[@]}" "${BENCH_FILES[@]}" | tar -x -C "$dest/new"
    echo "carry ready: $dest ($(du -sh "$dest" | cut -f1)); branch daemon2 at $(git -C "$src" rev-parse --short HEAD)"
    ;;
run)
    repo=$(pwd)
    carry="$repo/.carry/daemon2"
    out="${OUT:-/tmp/daemon2-out}"
    mkdir -p "$out"
    # The package as installed (pyproject's package-dir map): wattclass/ with telemetry/,
    # classifier/, plugin/, deploy/ inside it; main's tree, then the daemon files overlaid.
    layout() {  # $1 overlay folder, $2 target
        rm -rf "$2"
        mkdir -p "$2"
        cp -r "$repo/wattclass" "$2/wattclass"
        for p in telemetry classifier plugin deploy; do rm -rf "$2/wattclass/$p"; cp -r "$repo/$p" "$2/wattclass/$p"; done
        rm -rf "$2/wattclass/telemetry" "$2/wattclass/gpu"
        cp -r "$1/telemetry" "$2/wattclass/telemetry"
        cp -r "$1/wattclass/gpu" "$2/wattclass/gpu"
        cp "$1/wattclass/jobmap.py" "$2/wattclass/jobmap.py"
        python3 -m compileall -q "$2" >/dev/null || true  # start-up is excluded anyway
    }
    layout "$carry/old" /tmp/d2old
    layout "$carry/new" /tmp/d2new
    bench="$carry/new/bench"
    # BACKEND / LOAD_CMD / UUIDS / NO_PROBE only for a dry run off the GPU machine (filestate GPUs).
    run_daemon="python3 -m wattclass.cli telemetry run --backend ${BACKEND:-nvml} --roll-seconds 60"
    extra=()
    [ -n "${NO_PROBE:-}" ] || extra+=(--nvml-probe)
    [ -z "${UUIDS:-}" ] || extra+=(--uuids "$UUIDS")
    cd /tmp
    export CUDA_DEVICE_ORDER=PCI_BUS_ID  # a job's CUDA device N is NVML's GPU N (its job file's UUID)
    date -u +"start %FT%TZ" >&2
    nvidia-smi --query-gpu=index,name,driver_version,power.draw,power.limit --format=csv >&2 || true
    PYTHONPATH=/tmp/d2new python3 "$bench/daemon_lifecycle.py" live --seconds "${SECONDS_MEASURED:-420}" \
        --gpus 2 "${extra[@]}" \
        --daemon "old=env PYTHONPATH=/tmp/d2old $run_daemon" \
        --daemon "new_n1=env PYTHONPATH=/tmp/d2new $run_daemon --energy-every-windows 1" \
        --daemon "new_n2=env PYTHONPATH=/tmp/d2new $run_daemon --energy-every-windows 2" \
        --daemon "new_n3=env PYTHONPATH=/tmp/d2new $run_daemon --energy-every-windows 3" \
        --load-cmd "${LOAD_CMD:-python3 $bench/gpu_load.py}" \
        > "$out/h200x2-daemon2-lifecycle.json" 2> >(tee "$out/h200x2-daemon2-lifecycle.stderr" >&2)
    date -u +"end %FT%TZ" >&2
    python3 "$bench/daemon_lifecycle.py" summary "$out/h200x2-daemon2-lifecycle.json"
    ;;
*)
    echo "usage: $0 carry MAIN_CHECKOUT | run" >&2
    exit 2
    ;;
esac
