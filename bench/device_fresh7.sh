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
# The body is bench/device_test_set.sh (shared by the rounds since 2026-12-01; the commands and
# what they record are unchanged).
ROUND_FAMILIES=ntt_modmul,ising_metropolis,md_neighbor,hash_join,tree_ensemble,dfa_scan,concurrent_streams,spgemm \
  ROUND_NAME=fresh7 ROUND_SEED=71 ROUND_JOB_BASE=70000 \
  exec bash "$(dirname "$0")/device_test_set.sh"
