"""Run ``wattclass ARGS...`` under cProfile with a CPU-time clock and write the profile on exit.

For the daemon on the GPU machine: where its *CPU* goes (process time, so time blocked in
sleeps and fsync waits is not counted), NVML calls included (they show as ctypes calls).

  python bench/daemon_profile.py /tmp/daemon.pstats telemetry run --backend nvml ...
  python -c "import pstats; pstats.Stats('/tmp/daemon.pstats').sort_stats('tottime').print_stats(30)"
"""

from __future__ import annotations

import cProfile
import sys
import time


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    import wattclass.cli as cli

    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        return cli.main(args)
    finally:
        prof.disable()
        prof.dump_stats(out)


if __name__ == "__main__":
    sys.exit(main())
