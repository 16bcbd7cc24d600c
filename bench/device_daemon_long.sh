#!/usr/bin/env bash
# Issue 15: the node daemon of this checkout over a job lifecycle longer than one device command
# (10 minutes): the lifecycle runs in the background, detached from the command that starts it,
# and later commands wait for it while the machine is held (it goes back 30 s after a command
# ends, so they follow one another at once). Measures what bench/device_daemon.sh measures (one
# daemon with a site's defaults, the NVML probe beside it as a second poller), plus the daemon's
# CPU every 120 s, to show whether the cost stays flat over the run.
#
# On the device, from the repository root:
#     SECONDS_MEASURED=1320 bash bench/device_daemon_long.sh start 560   # starts it, waits 560 s
#     bash bench/device_daemon_long.sh wait 580                           # again, until it ends
# Each call prints its progress; the one that sees the end writes the JSON result and the
# driver's stderr to $OUT and prints a summary. GPUS=N (default: all NVML sees). ROLL_SECONDS=N
# (default 60, a stress: the daemon's own default is 3600). Read-only towards
# the GPUs: nothing here sets a limit, clock, MIG mode or persistence. A dry run off the GPU
# machine: BACKEND=filestate:DIR UUIDS=... LOAD_CMD="sleep 1000" NO_PROBE=1.
set -euo pipefail

work=/tmp/wc-daemon-long
pkg=/tmp/wcpkg-long
out="${OUT:-$work/out}"

finish() {  # $1: seconds to wait at most
    local until=$((SECONDS + $1))
    while [ ! -e "$work/rc" ] && [ "$SECONDS" -lt "$until" ]; do sleep 5; done
    tail -n 3 "$work/stderr" 2>/dev/null || true
    if [ ! -e "$work/rc" ]; then
        if pgrep -f "daemon_lifecycle.py live" >/dev/null; then
            echo "still running ($(date -u +%T)); call wait again"
        else
            echo "the lifecycle is not running and left no result: it did not survive the command that started it"
        fi
        return 0
    fi
    mkdir -p "$out"
    cp "$work/result.json" "$out/h200-daemon-lifecycle-long.json"
    cp "$work/stderr" "$out/h200-daemon-lifecycle-long.stderr"
    local rc
    rc=$(cat "$work/rc")
    echo "exit $rc"
    if [ "$rc" = 0 ]; then
        python3 "$pkg/bench/daemon_lifecycle.py" summary "$work/result.json"
    else
        tail -n 30 "$work/stderr"
    fi
}

case "${1:-}" in
start)
    repo=$(pwd)
    rm -rf "$work" "$pkg"
    mkdir -p "$work" "$pkg"
    cp -r "$repo/wattclass" "$pkg/wattclass"
    for p in telemetry classifier plugin deploy; do rm -rf "$pkg/wattclass/$p"; cp -r "$repo/$p" "$pkg/wattclass/$p"; done
    mkdir -p "$pkg/bench"
    cp "$repo/bench/daemon_lifecycle.py" "$repo/bench/gpu_load.py" "$repo/bench/benchstamp.py" "$pkg/bench/"
    python3 -m compileall -q "$pkg" >/dev/null || true  # start-up is excluded anyway
    gpus="${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)}"
    extra=(--cpu-every 120)
    [ -n "${NO_PROBE:-}" ] || extra+=(--nvml-probe)
    [ -z "${UUIDS:-}" ] || extra+=(--uuids "$UUIDS")
    daemon="env PYTHONPATH=$pkg python3 -m wattclass.cli telemetry run --backend ${BACKEND:-nvml} --roll-seconds ${ROLL_SECONDS:-60}"
    {
        date -u +"start %FT%TZ"
        nvidia-smi --query-gpu=index,name,driver_version,power.draw,power.limit --format=csv || true
    } > "$work/stderr" 2>&1
    # setsid + nohup: the lifecycle outlives this command; its output goes to files, not to it.
    (cd /tmp && CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONPATH=$pkg setsid nohup bash -c \
        'python3 "$0/bench/daemon_lifecycle.py" live --seconds "$1" --gpus "$2" "${@:5}" \
             --daemon "head=$3" --load-cmd "$4" > "'"$work"'/result.json" 2>> "'"$work"'/stderr";
         echo $? > "'"$work"'/rc"; date -u +"end %FT%TZ" >> "'"$work"'/stderr"' \
        "$pkg" "${SECONDS_MEASURED:-1320}" "$gpus" "$daemon" "${LOAD_CMD:-python3 $pkg/bench/gpu_load.py}" \
        "${extra[@]}" < /dev/null > /dev/null 2>&1 &)
    echo "started: $gpus GPU(s), ${SECONDS_MEASURED:-1320} s measured ($(date -u +%T))"
    finish "${2:-0}"
    ;;
wait)
    finish "${2:-580}"
    ;;
*)
    echo "usage: $0 start [WAIT_S] | wait [WAIT_S]" >&2
    exit 2
    ;;
esac
