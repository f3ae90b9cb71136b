"""Runs a test module's `worker(rank, world, store, out_dir, which)` on `world` gloo processes
(run_world), and a worker's cases in its process (run_cases).

Each worker saves its list of failure messages to out_dir/rank<r>.pt (in a `finally`, so a rank
that raises still reports); the test fails with those messages, with "no report" for a rank that
saved none, or naming the ranks still running past the deadline (a deadlock), or the rank killed
by a signal and in which phase (checks, process-group teardown, interpreter exit); faulthandler
prints that rank's Python stacks to stderr. A rank whose checks all ran exits with os._exit(0),
skipping the interpreter's finalization (see run_cases).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
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
    except mp.ProcessExitedException as e:
        # A rank killed by a signal (a crash, or std::terminate in a library): say where it was.
        # Its stderr holds faulthandler's traceback of every thread (run_cases enables it).
        rank = e.error_index
        phase = ("after its checks and the process group's teardown (interpreter exit)"
                 if (tmp_path / f"rank{rank}.done").exists() else
                 "after its checks, in the process group's teardown" if (tmp_path / f"rank{rank}.pt").exists()
                 else "during its checks")
        pytest.fail(f"W={world}: rank {rank} exited with {e.signal_name or e.exit_code} {phase}")
    failures = []
    for rank in range(world):
        path = tmp_path / f"rank{rank}.pt"
        if path.exists():
            failures += torch.load(path)
        else:
            failures.append(f"W={world} rank {rank}: no report")
    assert not failures, "\n".join(failures[:40]) + (f"\n... {len(failures)} failures" if len(failures) > 40 else "")


@contextlib.contextmanager
def one_process_group(tmp_path):
    """A gloo group of this process alone (rank 0 of 1), for the argument checks that run before
    any communication; destroyed on the way out. Skips if this process already has a group."""
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def in_run(which, world):
    """The cases a run takes: "default" those whose case["w"] lists this world, "long" the others."""
    return lambda case: (world in case["w"]) == (which == "default")


def run_cases(rank, world, store, out_dir, cases, wanted=lambda case: True, deadline_s=600):
    """One rank of a gloo group of `world`: runs each (check, case) pair that `wanted` takes as
    check(case, world, rank, failures), one thread per rank, and saves the failures for run_world.
    ATTNOPS_CP_CASE=i,j runs only those indexes of `cases`."""
    import faulthandler

    import attnops

    faulthandler.enable()  # a fatal signal prints every thread's Python stack (see run_world)
    attnops.set_threads(1)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=deadline_s))
    failures = []
    only = os.environ.get("ATTNOPS_CP_CASE")
    in_step = False
    try:
        for n, (check, case) in enumerate(cases):
            if (only is not None and str(n) not in only.split(",")) or not wanted(case):
                continue
            try:
                check(case, world, rank, failures)
            except Exception as e:  # report, and stop (the ranks may be out of step)
                failures.append(f"W={world} rank={rank} {case}: {type(e).__name__}: {e}")
                raise
        in_step = True
    finally:
        torch.save(failures, os.path.join(out_dir, f"rank{rank}.pt"))
        if in_step:
            _wait_for_every_rank(f"{store}.end", world, deadline_s)
        dist.destroy_process_group()
        open(os.path.join(out_dir, f"rank{rank}.done"), "w").close()
    # Every check ran and its report is saved: leave without the interpreter's finalization. There,
    # gloo worker threads that still hold work objects with Python tensors can abort the process
    # ("terminate called without an active exception", SIGABRT, after destroy_process_group; seen in
    # CI on 2026-12-06, and pytorch/pytorch#179291), a torch teardown race outside what these tests
    # check. attnops' own exit is covered by the tests that run it in a plain subprocess.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _wait_for_every_rank(path, world, deadline_s):
    """Returns once every rank has finished its checks, counted in a FileStore of its own rather
    than through gloo: a rank then tears its gloo pairs down only when no peer has a transfer
    with it still in flight (tearing a gloo context down right after the last exchange can fail
    on the slower peer, pytorch/gloo#155; CI once saw a rank abort with "terminate called
    without an active exception" there)."""
    store = dist.FileStore(path, world)
    store.add("finished", 1)
    deadline = time.monotonic() + deadline_s
    while store.add("finished", 0) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank of {world} finished its checks within {deadline_s} s")
        time.sleep(0.005)
