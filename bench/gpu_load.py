"""A job's GPU work for ``bench/daemon_lifecycle.py live``: runs until SIGTERM.

Even SLURM_JOB_ID: bf16 GEMMs (compute-bound, near the power limit); odd: an HBM copy loop
(memory-bound, lower power). So consecutive jobs differ in power, and a job change inside a
window is a real power step for the daemon's energy split. Needs torch and one visible GPU
(CUDA_VISIBLE_DEVICES, set by the driver).
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    import torch

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    dev = torch.device("cuda", 0)
    if int(os.environ.get("SLURM_JOB_ID", "0").split("_")[0]) % 2 == 0:
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)

        def step() -> None:
            for _ in range(4):
                torch.matmul(a, b, out=c)
    else:
        src = torch.ones(2**28, device=dev, dtype=torch.float32)  # 1 GiB
        dst = torch.empty_like(src)

        def step() -> None:
            for _ in range(4):
                dst.copy_(src)
    while not stop:
        step()
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
