"""Resident memory of a server as the benchmarks and the soak read it: its whole process tree
(the API process, vLLM's engine core, decode workers), since any of them can hold what leaks."""

from __future__ import annotations

import psutil


def tree_rss_bytes(pid: int) -> int:
    """RSS of `pid` and all its descendants; 0 when the process is gone (a server being restarted)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # a worker that ended between the listing and the read
            pass
    return total
