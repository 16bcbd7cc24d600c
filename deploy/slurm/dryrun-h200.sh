#!/bin/sh
# Run the wattclass Prolog in dry-run mode against the real GPUs of this machine: it reads each
# GPU's current/default/min/max power limit through NVML, computes the cap a memory-labelled job
# would get, and prints the plan as JSON. It sets NOTHING (no power limit, clock or MIG change).
# Usage: sh deploy/slurm/dryrun-h200.sh [PYTHON]   (no Slurm needed; output goes to stdout)
set -eu
PY=${1:-python3}
MAP=$(mktemp)
# Slurm index i -> PCI bus id, as gres.conf File=/dev/nvidia[0-N] numbers them (minor i).
nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader |
  "$PY" -c 'import json,sys; print(json.dumps({l.split(",")[0].strip(): l.split(",")[1].strip() for l in sys.stdin if l.strip()}))' > "$MAP"
GPUS=$("$PY" -c 'import json,sys; print(",".join(sorted(json.load(open(sys.argv[1])), key=int)))' "$MAP")
for CAP in 60% 350W 100%; do
  SLURM_JOB_ID=1 SLURM_JOB_GPUS="$GPUS" SLURM_JOB_USER=dryrun \
    "$PY" -m wattclass.plugin.prolog prolog --backend nvml --gpu-map "$MAP" --dry-run --log /dev/null \
    --admin-comment "wattclass:label=memory;conf=0.95;cap=$CAP;src=rule;mode=enforce"
done
rm -f "$MAP"
