"""CPU per job-file lookup (``JobMapReader.jobs``): what the daemon pays per GPU per poll to learn
that a GPU's job files did not change.

  python bench/jobmap_lookup.py            # this tree
  PYTHONPATH=<other tree> python3 bench/jobmap_lookup.py   # e.g. an older layout, side by side
"""

from __future__ import annotations

import sys
import tempfile
import timeit
from pathlib import Path

from benchstamp import emit

from wattclass.jobmap import JobAssignment, JobMapReader, write_job_file


def main() -> int:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="jobmap-") as tmp:
        spool = Path(tmp) / "spool"
        spool.mkdir(mode=0o755)
        reader = JobMapReader(spool)
        uuid = "GPU-5151{:04d}-0000-4000-8000-000000000000"
        write_job_file(spool, uuid.format(0), JobAssignment("1", "root", None))
        for g, name in ((0, "with_job_file_us"), (1, "without_job_file_us")):
            reader.jobs(uuid.format(g))  # first call lists and reads; then only the mtime checks
            n = 20000
            best = min(timeit.repeat(lambda g=g: reader.jobs(uuid.format(g)), number=n, repeat=5))
            out[name] = round(best / n * 1e6, 2)
    return emit({"lookup_cpu": out, "module": sys.modules["wattclass.jobmap"].__file__})


if __name__ == "__main__":
    sys.exit(main())
