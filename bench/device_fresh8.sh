#!/usr/bin/env bash
# Issue 13 round 12: record the never-seen test families of tools/h200_collect/workloads/fresh8.py
# (FRESH8_TEST, weight 0 in the default plan) once, on one H200, as registered in
# docs/measurements/issue13-preregistration-round12-2026-12-01.md (written before any run).
#
# On the device (kind nvidia-h200), from the repository root, one call per seed (timeout 600 s):
#     bash bench/device_fresh8.sh                                             # SEED=81, fresh8_gpu0
#     SEED=82 TAG=fresh8_gpu0b JOB_BASE=81000 bash bench/device_fresh8.sh    # a second call, if any
# Writes $OUT/<TAG>_caps.json, _runs.csv, _samples_1hz.parquet, <TAG>.log and <TAG>_plan.txt (the
# plan as drawn, before any run). Read-only towards the GPU, as tools/h200_collect always is.
# A dry run here, without a GPU: OUT=/tmp/f8 DEVICE=cpu SMOKE=1 SWEEP=16 bash bench/device_fresh8.sh
# (SEED=81's first 16 runs draw seven of the eight families; SWEEP=27, or SEED=82 with SWEEP=16, all eight.)
set -uo pipefail
FAMILIES_FRESH8=lora_finetune,lattice_boltzmann,pointnet_fps,pinn_train,sparse_conv3d,rl_rollout,particle_filter,qat_finetune
out="$(realpath -m "${OUT:-/tmp/fresh8}")"
seed="${SEED:-81}"
tag="${TAG:-fresh8_gpu0}"
job_base="${JOB_BASE:-80000}"
deadline="${DEADLINE:-515}"
sweep="${SWEEP:-60}"
mkdir -p "$out"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
cd tools || exit 2
SWEEP="$sweep" SEED="$seed" FAMILIES="$FAMILIES_FRESH8" LIST=1 python3 -m h200_collect > "$out/${tag}_plan.txt"
date -u +"start %FT%TZ"
GPU=0 SWEEP="$sweep" SEED="$seed" TAG="$tag" JOB_BASE="$job_base" FAMILIES="$FAMILIES_FRESH8" GAP=1.5 \
  DEADLINE="$deadline" OUT="$out" timeout 560 python3 -m h200_collect > "$out/$tag.log" 2>&1
rc=$?
date -u +"end %FT%TZ rc=$rc"
grep -h '^OK\|^FAIL\|^done\|^SKIPPED' "$out/$tag.log" | tail -80
ls -la "$out"
exit "$rc"
