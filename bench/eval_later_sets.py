"""Issue 13: each shipped model, as it is, on every recording made after it shipped, pooled.

Why: a model never trained on the sets recorded after it, so each of them is never-seen work for
it, and pooled they hold more jobs than one round's set. Over 80 jobs even a perfectly calibrated
model shows an ECE of about 0.08 (``calibration.ece_noise_floor``): one round cannot test the
issue's ECE target of 0.05; a pool of 200-300 jobs can.

For each commit (default: the models shipped since the GPM rule counts the integer pipe, issue 13
round 7), the model's files are taken from git (``git archive COMMIT classifier/models``), its
never-seen sets are the bundled recording folders (``training.BUNDLED_RECORDINGS``) absent from
its ``training_data.sources``, and they are scored as ``bench/eval_families.py --test <those> --model
<files>`` scores them (its functions, in this process), at the default threshold and with the memory
threshold at 0.9 and 0.95. Prints one line per
model (or ``--json``: everything eval_families reports).

    python bench/eval_later_sets.py [--commits a754df2 bc6e7dc a52c53c a146d33] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from benchstamp import emit

REPO = Path(__file__).resolve().parent.parent
#: h200-20261130-intpipe (round 7), -fresh6 (round 9), h200-20261201-evcap (round 10), -fresh7 (round 11)
DEFAULT_COMMITS = ("a754df2", "bc6e7dc", "a52c53c", "a146d33")
POLICIES = (("min_confidence_0.8", None), ("memory_from_0.9", 0.9), ("memory_from_0.95", 0.95))
#: The policy's default (deploy/policy.example.toml), as eval_families' ``--min-confidence``.
MIN_CONFIDENCE = 0.8


def model_files(commit: str, into: Path) -> Path:
    """The model folder of ``commit``, written under ``into``."""
    try:
        blob = subprocess.run(["git", "-C", str(REPO), "archive", commit, "classifier/models"],
                              capture_output=True, check=True).stdout
    except subprocess.CalledProcessError as exc:
        why = exc.stderr.decode()[-200:]
        raise SystemExit(f"commit {commit}: no classifier/models in git ({why})") from exc
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links and paths out of ``into``
            tar.extractall(into, filter="data")
        else:  # our own repository's archive
            tar.extractall(into)
    return into / "classifier" / "models"


def later_sets(model_dir: Path) -> list[str]:
    """The bundled recording folders the model at ``model_dir`` was not trained on."""
    from wattclass.classifier.training import BUNDLED_RECORDINGS

    meta = json.loads((model_dir / "model.json").read_text())
    sources = set(meta.get("training_data", {}).get("sources") or ())
    if not sources:
        raise SystemExit(f"{model_dir}/model.json: no training_data.sources (which folders did it see?)")
    return [name for name in BUNDLED_RECORDINGS if name not in sources]


def score(model_dir: Path, sets: list[str]) -> dict[str, Any]:
    """The pool of ``sets`` under each policy, and each set alone at the default threshold.

    The sets are replayed and the model scored once (``eval_families.saved_model``, as
    ``eval_families --test ... --model ...`` does); the policies only change what is acted on, so
    each is one ``summarize`` of the same predictions."""
    from eval_families import saved_model, summarize

    from wattclass.classifier.model import load_model
    from wattclass.classifier.training import job_families, training_set

    dirs = [REPO / "wattclass" / "data" / "h200" / s for s in sets]
    res = saved_model(model_dir, training_set(dirs, max_windows_per_job=0))
    families = job_families(dirs)
    version = load_model(model_dir).version
    out: dict[str, Any] = {}
    for name, memory in POLICIES:
        d = summarize(res, families, MIN_CONFIDENCE, {} if memory is None else {"memory": memory},
                      by_set=True)
        out[name] = {"model_version": version,
                     **{k: d[k] for k in ("all", "families", "truth_counts", "wrong")}}
        if memory is None:
            # per set: a pooled ECE can hide one set's miscalibration (errors in other bins cancel)
            out["per_set_min_confidence_0.8"] = d["sets"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", nargs="+", default=list(DEFAULT_COMMITS),
                    help="commits whose classifier/models to score (default: the models shipped "
                         "since round 7)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results: dict[str, Any] = {}
    doc = {"what": "each shipped model (its files from git: git archive COMMIT classifier/models) scored "
                   "as it is on every bundled recording folder its training_data.sources lack (recorded "
                   "after it shipped; sets it never trained on), pooled, under three policies, and each "
                   "set alone",
           "command": "python bench/eval_later_sets.py --commits " + " ".join(a.commits) + " --json",
           "models": results}
    with tempfile.TemporaryDirectory(prefix="wattclass-later-") as tmp:
        for commit in a.commits:
            mdir = model_files(commit, Path(tmp) / commit)
            sets = later_sets(mdir)
            if not sets:
                print(f"{commit}: trained on every bundled folder; nothing recorded after it",
                      file=sys.stderr)
                continue
            res = score(mdir, sets)
            version = res["min_confidence_0.8"]["model_version"]
            results[version] = {"commit": commit, "sets": sets, "results": res}
            if not a.json:
                b = res["min_confidence_0.8"]["all"]
                acted = " / ".join(str(res[p]["all"]["compute_called_memory_acted"]) for p, _ in POLICIES)
                print(f"{res['min_confidence_0.8']['model_version']} ({commit}) on {' + '.join(sets)}: "
                      f"{b['jobs']} jobs, accuracy {b['accuracy']:.3f}, compute called memory "
                      f"{b['compute_called_memory']}/{b['compute_jobs']} (acted at 0.8 / memory 0.9 / 0.95: "
                      f"{acted}), coverage {b['coverage']:.3f}, ECE {b['ece']:.3f} (a perfectly calibrated "
                      f"model: {b['ece_floor_mean']:.3f}, 95% under {b['ece_floor_p95']:.3f})")
    if a.json:
        emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
