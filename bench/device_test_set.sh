#!/usr/bin/env bash
# Record one round's never-seen test families (issue 13) once, on one H200: the body the rounds'
# registered commands share (bench/device_fresh7.sh, bench/device_fresh8.sh set what differs).
# Read-only towards the GPU, as tools/h200_collect always is. Writes $OUT/<TAG>_caps.json,
# _runs.csv, _samples_1hz.parquet, <TAG>.log and <TAG>_plan.txt (the plan as drawn, before any run).
#   ROUND_FAMILIES  the families, comma-separated (required)
#   ROUND_NAME      fresh7, fresh8, ...: the default OUT (/tmp/<name>) and TAG (<name>_gpu0)
#   ROUND_SEED, ROUND_JOB_BASE   the defaults of SEED and JOB_BASE
# and, as every round registered them: SEED, TAG, JOB_BASE, OUT, DEADLINE (515), SWEEP (60).
set -uo pipefail
families="${ROUND_FAMILIES:?ROUND_FAMILIES: the families of the round, comma-separated}"
name="${ROUND_NAME:?ROUND_NAME: fresh7, fresh8, ...}"
out="$(realpath -m "${OUT:-/tmp/$name}")"
seed="${SEED:-${ROUND_SEED:?}}"
tag="${TAG:-${name}_gpu0}"
job_base="${JOB_BASE:-${ROUND_JOB_BASE:?}}"
deadline="${DEADLINE:-515}"
sweep="${SWEEP:-60}"
mkdir -p "$out"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
cd tools || exit 2
SWEEP="$sweep" SEED="$seed" FAMILIES="$families" LIST=1 python3 -m h200_collect > "$out/${tag}_plan.txt"
date -u +"start %FT%TZ"
GPU=0 SWEEP="$sweep" SEED="$seed" TAG="$tag" JOB_BASE="$job_base" FAMILIES="$families" GAP=1.5 \
  DEADLINE="$deadline" OUT="$out" timeout 560 python3 -m h200_collect > "$out/$tag.log" 2>&1
rc=$?
date -u +"end %FT%TZ rc=$rc"
grep -h '^OK\|^FAIL\|^done\|^SKIPPED' "$out/$tag.log" | tail -80
ls -la "$out"
exit "$rc"
