#!/usr/bin/env bash
# Issue 13 round 13: record runs of every sweep family (all 71 of tools/h200_collect/workloads/
# sweep.py FAMILIES, drawn uniformly) once, on one H200, now with the HBM's own average power
# (NVML POWER_AVERAGE at scope MEMORY) and temperature in every 1 Hz poll, as registered in
# docs/measurements/issue13-preregistration-round13-2026-12-01.md (written before any run).
#
# On the device (kind nvidia-h200), from the repository root, one call per seed (timeout 600 s):
#     bash bench/device_mempower.sh                                                # SEED=91
#     SEED=92 TAG=mempower_gpu0b JOB_BASE=91000 bash bench/device_mempower.sh     # a second call
# Read-only towards the GPU, as tools/h200_collect always is. The body is bench/device_test_set.sh.
families=$(cd "$(dirname "$0")/../tools" && python3 -c \
  "from h200_collect.workloads.sweep import FAMILIES; print(','.join(FAMILIES))") || exit 2
ROUND_FAMILIES=$families ROUND_NAME=mempower ROUND_SEED=91 ROUND_JOB_BASE=90000 \
  exec bash "$(dirname "$0")/device_test_set.sh"
