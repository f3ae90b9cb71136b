#!/usr/bin/env python3
# PyTorch SDPA backward, BNSD B=1 N=16 S=1024 D=128 (sweep-s1024-d128), 1 thread: GFLOP/s per CPU-second
# (time.process_time), counting the 5 GEMMs as attnops bench does. Usage: torch_bwd_cpu_time.py fp32|bf16 ROUNDS
import sys, time, torch
torch.set_num_threads(1)
dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
q, k, v = (torch.randn(1, 16, 1024, 128, dtype=dt, requires_grad=True) for _ in range(3))
out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
dy = torch.randn_like(out)
out.backward(dy, retain_graph=True)
flops = 5 * 2 * 1024 * 1024 * 128 * 16
res = []
for r in range(int(sys.argv[2])):
    t0 = time.process_time()
    for _ in range(3):
        q.grad = k.grad = v.grad = None
        out.backward(dy, retain_graph=True)
    res.append(3 * flops / (time.process_time() - t0) / 1e9)
print(sys.argv[1], "torch:", " ".join("%.1f" % x for x in res))
