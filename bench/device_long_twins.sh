#!/usr/bin/env bash
# Issue 13 round 9: do longer jobs separate the "twins"? Re-runs four recorded compute~memory twin
# pairs (jobs of opposite GPM truth whose NVML fingerprints sat closer than two runs of one job;
# docs/measurements/cpu2-eval-ceiling-issue13-round9-2026-11-30.json, "examples") for RUN_DUR
# seconds each instead of their recorded 8-12 s, the same runs on both GPUs at once, so every run
# has a re-run on the other GPU. bench/eval_long_twins.py reads the result.
#
# On the device (kind nvidia-h200-x2), from the repository root, timeout 600 s:
#     bash bench/device_long_twins.sh
# Writes $OUT/long_twins.tar.gz (the recordings: caps.json, runs.csv, samples_1hz.parquet per seed
# and GPU) and the logs. Read-only towards the GPUs, as tools/h200_collect always is.
set -uo pipefail
out="${OUT:-/tmp/long-twins}"
dur="${RUN_DUR:-40}"
rec="$out/rec"
mkdir -p "$rec"
F4=transpose_permute,bmm_small,transcendental,rng_fill,conv_transpose,linalg_solver,unet_train,sampling_step
F5=norm_softmax,topk_select,complex_gemm,conv1d_audio,einsum_contract,pooling,grid_sample,grouped_conv
# seed, families, runs (fresh4 = F4, fresh5 = F5; plan(seed, 60, families) as recorded)
plans=(
  "42 $F4 transpose_permute_s42_002,transcendental_s42_009,rng_fill_s42_035"
  "54 $F5 complex_gemm_s54_017,norm_softmax_s54_018"
  "53 $F5 grid_sample_s53_030"
  "55 $F5 pooling_s55_029"
  "43 $F4 conv_transpose_s43_002"
)
one_gpu() {
  local g=$1
  for p in "${plans[@]}"; do
    read -r seed fam only <<<"$p"
    (cd tools && CUDA_VISIBLE_DEVICES=$g GPU=$g SWEEP=60 SEED=$seed FAMILIES=$fam ONLY=$only \
      RUN_DUR=$dur GAP=1.5 DEADLINE=0 TAG=long_s${seed}_gpu$g JOB_BASE=$((700000 + g * 10000 + seed * 100)) \
      OUT=$rec python3 -m h200_collect) >> "$out/gpu$g.log" 2>&1
  done
}
date -u +"start %FT%TZ"
one_gpu 0 & one_gpu 1 & wait
date -u +"end %FT%TZ"
grep -h '^OK\|^FAIL\|^done' "$out"/gpu*.log
tar -C "$rec" -czf "$out/long_twins.tar.gz" . && rm -rf "$rec"
ls -la "$out"
