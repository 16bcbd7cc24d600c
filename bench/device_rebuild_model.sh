#!/usr/bin/env bash
# Issue 13: does the shipped model rebuild byte for byte on another machine (another CPU, numpy,
# SciPy and pandas)? Run on the device (kind nvidia-h200; no GPU is used) from the repository
# root, with LightGBM carried as a wheel (its image has none):
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/lightgbm-*.whl
#     PYTHONPATH=/tmp/site bash bench/device_rebuild_model.sh
# Prints the CPU, the versions, and whether model.txt and model.json equal classifier/models'.
set -uo pipefail
repo=$(pwd)
out="${OUT:-/tmp/rebuild-out}"
pkg=/tmp/wcpkg
mkdir -p "$out"
rm -rf "$pkg" && mkdir -p "$pkg"
cp -r "$repo/wattclass" "$pkg/wattclass"
for p in telemetry classifier plugin deploy; do rm -rf "$pkg/wattclass/$p"; cp -r "$repo/$p" "$pkg/wattclass/$p"; done
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
lscpu | grep -m1 "Model name"
grep -o -m1 -w 'avx512f' /proc/cpuinfo | head -1 | sed 's/^/cpu flag: /'
python3 - <<'PY'
import lightgbm, numpy, pandas, pyarrow, scipy, sys
from numpy._core._multiarray_umath import __cpu_features__ as f
print("python", sys.version.split()[0], "numpy", numpy.__version__, "scipy", scipy.__version__, "pandas",
      pandas.__version__, "pyarrow", pyarrow.__version__, "lightgbm", lightgbm.__version__)
print("numpy dispatch:", [k for k in ("X86_V3", "X86_V4", "AVX512F", "AVX512_SKX", "AVX512_SPR") if f.get(k)])
PY
version=$(python3 -c "import json; print(json.load(open('classifier/models/model.json'))['model_version'])")
created=$(python3 -c "import json; print(json.load(open('classifier/models/model.json'))['created'])")
start=$(date +%s)
out=$(realpath -m "$out")
# from another folder: ``python3 -m`` puts the working folder first on the path, and the
# repository root's wattclass/ is not the assembled package
(cd /tmp && python3 -m wattclass.cli -q model train --out "$out/m" --version "$version" --created "$created") || exit 3
echo "model train: $(( $(date +%s) - start )) s"
rc=0
for f in model.txt model.json; do
  if cmp -s "$out/m/$f" "classifier/models/$f"; then echo "$f: byte-identical"; else echo "$f: DIFFERS"; rc=1; fi
done
diff <(python3 -m json.tool --sort-keys classifier/models/model.json) <(python3 -m json.tool --sort-keys "$out/m/model.json") | head -60
exit "$rc"
