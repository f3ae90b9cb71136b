#!/usr/bin/env python3
# Usage: cpu_time_efficiency.py ATTNOPS_BINARY WORKLOAD DTYPE fwd/bwd [IMPLEMENTATION]
# CPU-time efficiency of one bench case: FLOPs per task-clock second over (r2 - r1) extra runs, 1 thread.
import json, subprocess, sys, re, os
binary, work, dtype, direction = sys.argv[1:5]
impl = sys.argv[5] if len(sys.argv) > 5 else ""
r1, r2 = 1, 4
env = dict(os.environ)
if impl: env["ATTNOPS_FORCE_IMPL"] = impl
def run(r):
    p = subprocess.run(["perf", "stat", "-x,", "-e", "task-clock", binary, "bench", "-w", work, "--dtypes", dtype,
                        "--directions", direction, "--repeat", str(r), "--threads", "1", "--no-peaks", "--json"]
                       + (["--sweep", work.split("-s")[1].split("-")[0]] if work.startswith("sweep") else []),
                       capture_output=True, text=True, env=env)
    ms = float(p.stderr.strip().splitlines()[-1].split(",")[0])
    doc = json.loads(p.stdout)
    return ms, doc["results"][0]
a, _ = run(r1)
b, res = run(r2)
flops = res["flops"]
print(f"{work} {dtype} {direction} {res['implementation']}: {flops*(r2-r1)/((b-a)*1e-3)/1e9:.1f} GFLOP/s per CPU-second")
