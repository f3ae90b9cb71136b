"""Runs a test module's `worker(rank, world, store, out_dir, which)` on `world` gloo processes.

Each worker saves its list of failure messages to out_dir/rank<r>.pt (in a `finally`, so a rank
that raises still reports); the test fails with those messages, with "no report" for a rank that
saved none, or naming the ranks still running past the deadline (a deadlock).
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp


def run_world(worker, world, tmp_path, which="default", deadline_s=600):
    ctx = mp.start_processes(worker, args=(world, str(tmp_path / "store"), str(tmp_path), which), nprocs=world,
                             start_method="spawn", join=False)
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"W={world}: ranks {alive} still running after {deadline_s} s (deadlock?)")
    except mp.ProcessRaisedException:
        pass  # the failure was saved by the worker
    failures = []
    for rank in range(world):
        path = tmp_path / f"rank{rank}.pt"
        if path.exists():
            failures += torch.load(path)
        else:
            failures.append(f"W={world} rank {rank}: no report")
    assert not failures, "\n".join(failures[:40]) + (f"\n... {len(failures)} failures" if len(failures) > 40 else "")
