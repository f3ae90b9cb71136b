#!/usr/bin/env python3
"""Context parallelism (attnops.torch.cp) on one machine: time per training step (forward +
backward of one causal attention) for W = 1, 2, 4 gloo processes with ring, all-gather and
Ulysses, the fraction of that time spent waiting for communication to finish (what compute did
not hide), and the bytes each rank sends per step.

Threads per rank = cores / W (at least 1). Each configuration runs a warm-up step, then --steps
timed steps; the median is reported, with the rank that waited longest. "hybrid" (W even, W >= 4)
runs Ulysses inside groups of 2 and the ring across them. The load average before and after each
configuration is recorded (a shared machine's other work slows every figure).

  PYTHONPATH=python python3 bench/cp_bench.py --seq 4096 --heads 8 --dim 64 --dtype fp32 \
      --json bench/results/<machine>/cp_bench.json   (<machine>: a slug naming the CPU)

--quick: W = 1 and 2 with ring, all-gather and Ulysses on a shorter sequence (S = 2048, N = 8,
D = 64, fp32, 2 timed steps): four process groups, a few seconds each on an idle machine (the
process start-up and the first kernel call are most of it), well under 3 minutes in all; any
option given beside it wins over its preset. It prints the total wall time at the end.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# Defaults, and the --quick preset (options given explicitly win over both).
FULL = dict(seq=4096, worlds="1,2,4", comms="ring,allgather,ulysses,hybrid", steps=3)
QUICK = dict(seq=2048, worlds="1,2", comms="ring,allgather,ulysses", steps=2)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"preset for a short check: {', '.join(f'--{k} {v}' for k, v in QUICK.items())}")
    ap.add_argument("--seq", type=int, default=None, help=f"global sequence length (default {FULL['seq']})")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--worlds", default=None, help=f"process counts (default {FULL['worlds']})")
    ap.add_argument("--comms", default=None, help=f"schemes for W > 1 (default {FULL['comms']})")
    ap.add_argument("--steps", type=int, default=None, help=f"timed steps after a warm-up (default {FULL['steps']})")
    ap.add_argument("--no-accumulate", action="store_true",
                    help="ring backward: per-block gradients added in Python instead of the kernel adding into the "
                         "fp32 accumulators (accumulateGrads); for the before/after comparison")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def worker(rank, world, comm, args, store, out_dir):
    import attnops
    from attnops.torch import cp

    cp._RING_ACCUMULATE = not args.no_accumulate
    threads = max(1, (os.cpu_count() or 1) // world)
    attnops.set_threads(threads)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=1800))
    group = ulysses_group = None
    if comm == "hybrid":  # Ulysses inside pairs of ranks, ring across: flat rank = ring rank * 2 + inner rank
        inner = [dist.new_group([2 * j, 2 * j + 1]) for j in range(world // 2)]
        rings = [dist.new_group(list(range(i, world, 2))) for i in range(2)]
        group, ulysses_group, comm = rings[rank % 2], inner[rank // 2], "ring"
    g = torch.Generator().manual_seed(rank)
    s = args.seq // world
    dt = DTYPES[args.dtype]
    q = torch.randn(args.batch, s, args.heads, args.dim, generator=g).to(dt).requires_grad_()
    k = torch.randn(args.batch, s, args.kv_heads, args.dim, generator=g).to(dt).requires_grad_()
    v = torch.randn(args.batch, s, args.kv_heads, args.dim, generator=g).to(dt).requires_grad_()
    dout = torch.randn(args.batch, s, args.heads, args.dim, generator=g).to(dt)
    times, waits, sent = [], [], 0
    for step in range(args.steps + 1):
        dist.barrier()
        cp.comm_stats.reset()
        t0 = time.perf_counter()
        out = cp.flash_attn_func(q, k, v, causal=True, comm=comm, scheme="zigzag", group=group,
                                 ulysses_group=ulysses_group)
        out.backward(dout)
        elapsed = time.perf_counter() - t0
        if step:  # step 0 warms up
            times.append(elapsed)
            waits.append(cp.comm_stats.wait_s)
            sent = sum(cp.comm_stats.bytes.values())
    result = dict(rank=rank, time_s=statistics.median(times), wait_s=statistics.median(waits), sent_bytes=sent,
                  threads=threads)
    torch.save(result, os.path.join(out_dir, f"{'hybrid' if ulysses_group is not None else comm}-{world}-{rank}.pt"))
    dist.destroy_process_group()


def main():
    args = parse_args()
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in (int(w) for w in args.worlds.split(",")):
            for comm in (args.comms.split(",") if world > 1 else ["plain"]):
                if comm == "hybrid" and (world < 4 or world % 2):
                    continue
                load_before = os.getloadavg()[0]
                store = os.path.join(tmp, f"store-{comm}-{world}")
                mp.start_processes(worker, args=(world, comm if world > 1 else "ring", args, store, tmp),
                                   nprocs=world, start_method="spawn", join=True)
                ranks = [torch.load(os.path.join(tmp, f"{comm if world > 1 else 'ring'}-{world}-{r}.pt"))
                         for r in range(world)]
                step = max(r["time_s"] for r in ranks)
                wait = max(r["wait_s"] for r in ranks)
                row = dict(world=world, comm=comm, step_s=step, wait_s=wait, wait_fraction=wait / step,
                           sent_mib_per_rank=max(r["sent_bytes"] for r in ranks) / 2**20,
                           threads_per_rank=ranks[0]["threads"], load_before=load_before,
                           load_after=os.getloadavg()[0])
                rows.append(row)
                print(f"W={world} {comm:9s} step {step * 1e3:9.1f} ms  waiting {wait * 1e3:8.1f} ms "
                      f"({100 * wait / step:5.1f}%)  sent {row['sent_mib_per_rank']:8.2f} MiB/rank/step  "
                      f"threads/rank {row['threads_per_rank']}  load {load_before:.1f}/{row['load_after']:.1f}",
                      flush=True)
    print(f"total wall time {time.perf_counter() - start:.1f} s (S = {args.seq}, N = {args.heads}, Nk = "
          f"{args.kv_heads}, D = {args.dim}, {args.dtype}, {args.steps} timed steps; CPU: {_cpu_name()}, "
          f"{os.cpu_count()} logical CPUs)", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), cpu=_cpu_name(), cpu_count=os.cpu_count(), torch=torch.__version__,
                           results=rows), f, indent=1)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
