"""Start N ranks of a `torch.distributed` program with torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) but without torchrun's agent, which kills the surviving ranks
when one dies and so hides what they do. Used by tests/test_distributed.py and
bench/bench_collective.py."""

import os
import socket
import subprocess
import sys
import time
from typing import List, Sequence, Tuple


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, argv: Sequence[str], timeout_s: float) -> Tuple[List[int], str]:
    """Runs `python argv...` as ranks 0..nproc-1 and waits for all of them, at most `timeout_s`
    in all (then every rank is killed and `subprocess.TimeoutExpired` raised). Returns the exit
    codes by rank and the tail of each rank's stderr."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, stderr=subprocess.PIPE, text=True))
    codes, errs = [], []
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            codes.append(p.returncode)
            errs.append(err[-2000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes, "\n".join(errs)
