#!/usr/bin/env bash
# Issue 13 round 10: the GPM-less model on jobs of real length from families it never trained on.
# Runs a randomised sweep plan (tools/h200_collect, SWEEP) over ALL recorded workload families,
# every run RUN_DUR seconds long instead of the sweep's 8-12 s (the probe's development jobs, and
# real jobs, last 30 s and more). bench/eval_long_families.py then holds each family out of
# training and scores its long runs, and the same runs cut to their first 10 s, side by side.
#
# On the device (kind nvidia-h200 or -x2), from the repository root, timeout 600 s, one call per seed:
#     SEED=1001 bash bench/device_long_families.sh
# Writes $OUT/longfam_s<SEED>.tar.gz (caps.json, runs.csv, samples_1hz.parquet) and the log.
# Read-only towards the GPU, as tools/h200_collect always is. Job ids 800000 + 100 x (SEED - 1000).
set -uo pipefail
out="${OUT:-/tmp/long-families}"
seed="${SEED:?SEED=<plan seed> (1001, 1002, ...)}"
dur="${RUN_DUR:-30}"
deadline="${DEADLINE:-560}"
rec="$out/rec"
mkdir -p "$rec"
fams=$(cd tools && python3 -c 'from h200_collect.workloads.sweep import FAMILIES; print(",".join(FAMILIES))')
date -u +"start %FT%TZ"
(cd tools && CUDA_VISIBLE_DEVICES=0 GPU=0 SWEEP=60 SEED="$seed" FAMILIES="$fams" RUN_DUR="$dur" \
  GAP=1.5 DEADLINE="$deadline" TAG="longfam_s$seed" JOB_BASE=$((800000 + (seed - 1000) * 100)) \
  OUT="$rec" python3 -m h200_collect) > "$out/longfam_s$seed.log" 2>&1
date -u +"end %FT%TZ"
grep -h '^OK\|^FAIL\|^done\|^SKIPPED' "$out/longfam_s$seed.log" | tail -80
tar -C "$rec" -czf "$out/longfam_s$seed.tar.gz" . && rm -rf "$rec"
ls -la "$out"
