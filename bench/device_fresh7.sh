#!/usr/bin/env bash
# Issue 13 round 11: record the never-seen test families of tools/h200_collect/workloads/fresh7.py
# (FRESH7_TEST, weight 0 in the default plan) once, on one H200, as registered in
# docs/measurements/issue13-preregistration-round11-2026-12-01.md (written before any run).
#
# On the device (kind nvidia-h200), from the repository root, one call per seed (timeout 600 s):
#     bash bench/device_fresh7.sh                                             # SEED=71, fresh7_gpu0
#     SEED=72 TAG=fresh7_gpu0b JOB_BASE=71000 bash bench/device_fresh7.sh    # a second call, if any
# Writes $OUT/<TAG>_caps.json, _runs.csv, _samples_1hz.parquet, <TAG>.log and <TAG>_plan.txt (the
# plan as drawn, before any run). Read-only towards the GPU, as tools/h200_collect always is.
# A dry run here, without a GPU: OUT=/tmp/f7 DEVICE=cpu SMOKE=1 SWEEP=14 bash bench/device_fresh7.sh
set -uo pipefail
FAMILIES_FRESH7=ntt_modmul,ising_metropolis,md_neighbor,hash_join,tree_ensemble,dfa_scan,concurrent_streams,spgemm
out="$(realpath -m "${OUT:-/tmp/fresh7}")"
seed="${SEED:-71}"
tag="${TAG:-fresh7_gpu0}"
job_base="${JOB_BASE:-70000}"
deadline="${DEADLINE:-515}"
sweep="${SWEEP:-60}"
mkdir -p "$out"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
cd tools || exit 2
SWEEP="$sweep" SEED="$seed" FAMILIES="$FAMILIES_FRESH7" LIST=1 python3 -m h200_collect > "$out/${tag}_plan.txt"
date -u +"start %FT%TZ"
GPU=0 SWEEP="$sweep" SEED="$seed" TAG="$tag" JOB_BASE="$job_base" FAMILIES="$FAMILIES_FRESH7" GAP=1.5 \
  DEADLINE="$deadline" OUT="$out" timeout 560 python3 -m h200_collect > "$out/$tag.log" 2>&1
rc=$?
date -u +"end %FT%TZ rc=$rc"
grep -h '^OK\|^FAIL\|^done\|^SKIPPED' "$out/$tag.log" | tail -80
ls -la "$out"
exit "$rc"
