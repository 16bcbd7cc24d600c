#!/usr/bin/env bash
# Issue 15: the node daemon of this checkout over a job lifecycle on the H200 x2, as long as one
# device command allows with room for start-up and the result (bench/daemon_lifecycle.py live;
# default 450 s measured: the JSON is written only at the end, so a run cut by the limit returns nothing).
#
# On the device (kind nvidia-h200-x2), from the repository root, timeout 600 s:
#     bash bench/device_daemon.sh
# No carry is needed: the working tree travels. The package is laid out as pyproject's
# package-dir map installs it (wattclass/ with telemetry/, classifier/, plugin/, deploy/ inside)
# under /tmp/wcpkg, because wattclass is not installed there. One daemon with the defaults a site
# runs polls both GPUs through the lifecycle, beside a second poller as on a site with
# dcgm-exporter: the driver's --nvml-probe reads every NVML field the daemon reads, once a second
# per GPU. Writes the JSON result and the driver's stderr to $OUT and prints a summary.
# SECONDS_MEASURED=N changes the measured time. Read-only towards the GPUs: nothing here sets a
# limit, clock, MIG mode or persistence.
set -euo pipefail

repo=$(pwd)
out="${OUT:-/tmp/daemon-out}"
pkg=/tmp/wcpkg
mkdir -p "$out"
rm -rf "$pkg"
mkdir -p "$pkg"
cp -r "$repo/wattclass" "$pkg/wattclass"
for p in telemetry classifier plugin deploy; do rm -rf "$pkg/wattclass/$p"; cp -r "$repo/$p" "$pkg/wattclass/$p"; done
python3 -m compileall -q "$pkg" >/dev/null || true  # start-up is excluded anyway

run_daemon="env PYTHONPATH=$pkg python3 -m wattclass.cli telemetry run --backend nvml --roll-seconds 60"
cd /tmp
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # a job's CUDA device N is NVML's GPU N (its job file's UUID)
date -u +"start %FT%TZ" >&2
nvidia-smi --query-gpu=index,name,driver_version,power.draw,power.limit --format=csv >&2 || true
PYTHONPATH=$pkg python3 "$repo/bench/daemon_lifecycle.py" live --seconds "${SECONDS_MEASURED:-450}" \
    --gpus 2 --nvml-probe --daemon "head=$run_daemon" \
    --load-cmd "python3 $repo/bench/gpu_load.py" \
    > "$out/h200x2-daemon-lifecycle.json" 2> >(tee "$out/h200x2-daemon-lifecycle.stderr" >&2)
date -u +"end %FT%TZ" >&2
python3 "$repo/bench/daemon_lifecycle.py" summary "$out/h200x2-daemon-lifecycle.json"
