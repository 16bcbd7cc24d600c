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
# The body is bench/device_test_set.sh (shared by the rounds since 2026-12-01; the commands and
# what they record are unchanged).
ROUND_FAMILIES=lora_finetune,lattice_boltzmann,pointnet_fps,pinn_train,sparse_conv3d,rl_rollout,particle_filter,qat_finetune \
  ROUND_NAME=fresh8 ROUND_SEED=81 ROUND_JOB_BASE=80000 \
  exec bash "$(dirname "$0")/device_test_set.sh"
