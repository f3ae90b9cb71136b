"""Dropout under context parallelism (attnops.torch.cp) at W = 2 and 3 gloo processes: the kernels
key the Philox counter by global positions (attnops/flash_attention_score_ex.h), so ring,
all-gather and Ulysses draw exactly the keep bits of the single-process op with the same seed.

Every output and gradient is compared with the single-process op on the whole sequence with the
same (keep_prob, seed): fp32 within 1e-5 relative (the CP rule; a different bit anywhere would
be off by O(1/keep_prob)); bf16 within 2x the single-process bf16 op's error against the fp32
single-process result (the same bits; the float64 reference does not know them), plus the
absolute term of reference.ABS_TOL. Also: the seed npu_fusion_attention draws is rank 0's on
every rank, and a run repeats bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

import cp_harness
from reference import ABS_TOL
from test_context_parallel import DEADLINE_S, N, SEQ_DIM, bits, global_inputs, tnd_lengths

KEEP, SEED = 0.8, 0x1234567


def single(q, k, v, dout, layout, causal, scale, cum):
    """The single-process op (autograd through attnops.torch._ops) with the test's dropout."""
    from attnops.torch import _ops
    from attnops.torch.flash_attn import _CAUSAL_MASK

    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, _ops.INT32_MAX, None)
    c = torch.tensor(cum) if cum is not None else None
    out = _ops.flash_attention_score(q, k, v, None, None, mask, c, c, None, None, None, None, scale, KEEP,
                                     _ops.INT32_MAX, nxt, N, layout, 0, mode, 1, SEED, 0)[0]
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def sharded(case, q, k, v, dout, scale, cum):
    from attnops.torch import cp

    dim = SEQ_DIM[case["layout"]]
    local = [cp.shard(t, seq_dim=dim, scheme=case["scheme"], cu_seqlens=cum).requires_grad_(i < 3)
             for i, t in enumerate((q, k, v, dout))]
    out = cp.attention(local[0], local[1], local[2], N, case["layout"], scale=scale, causal=case["causal"],
                       comm=case["comm"], scheme=case["scheme"], cu_seqlens=cum, keep_prob=KEEP, seed=SEED)[0]
    out.backward(local[3])
    return [out.detach(), local[0].grad, local[1].grad, local[2].grad]


def check(case, world, rank, failures):
    from attnops.torch import cp

    layout = case["layout"]
    lengths = tnd_lengths(world) if layout == "TND" else None
    cum = torch.tensor(lengths).cumsum(0).tolist() if lengths else None
    s = sum(lengths) if lengths else 2 * world * 3
    scale = 1 / math.sqrt(8)
    q, k, v, dout = global_inputs(layout, s, case["dtype"], seed=case["seed"])
    dim = SEQ_DIM[layout]

    def local(t):
        return cp.shard(t, seq_dim=dim, scheme=case["scheme"], cu_seqlens=cum)

    want = [local(t) for t in single(q, k, v, dout, layout, case["causal"], scale, cum)]
    got = sharded(case, q, k, v, dout, scale, cum)
    again = sharded(case, q, k, v, dout, scale, cum)
    tag = f"W={world} rank={rank} {case}"
    names = ["out", "dq", "dk", "dv"]
    for name, a, b in zip(names, got, again):
        if not torch.equal(bits(a), bits(b)):
            failures.append(f"{tag}: {name} differs between two runs")
    if case["dtype"] == torch.float32:
        for name, a, w in zip(names, got, want):
            bound = 1e-5 * max(1.0, w.abs().max().item())
            err = (a.double() - w.double()).abs().max().item()
            if not err <= bound:
                failures.append(f"{tag}: {name} error {err:.3e} against the single-process op > {bound:.3e}")
        return
    ref = [local(t) for t in single(*(t.float() for t in (q, k, v, dout)), layout, case["causal"], scale, cum)]
    for name, a, w, r in zip(names, got, want, ref):
        base = (w.double() - r.double()).abs().max().item()
        err = (a.double() - r.double()).abs().max().item()
        bound = 2 * base + ABS_TOL[case["dtype"]] * max(1.0, r.abs().max().item())
        if not err <= bound:
            failures.append(f"{tag}: {name} error {err:.3e} against fp32 > {bound:.3e} (single-process {base:.3e})")


def check_seed(world, rank, failures):
    """npu_fusion_attention draws the seed on rank 0 and broadcasts it."""
    import torch.distributed as dist
    from attnops.torch import cp

    torch.manual_seed(100 + rank)  # different generators: the broadcast must make them agree
    q, k, v, _ = global_inputs("BSND", 4 * world, torch.float32, seed=3)
    local = [cp.shard(t, seq_dim=1, scheme="zigzag") for t in (q, k, v)]
    res = cp.npu_fusion_attention(*local, N, "BSND", keep_prob=KEEP, scale=0.3)
    seeds = [None] * world
    dist.all_gather_object(seeds, res[4])
    if len(set(seeds)) != 1 or res[5] != 0 or res[6] != q.shape[0] * N * q.shape[1] ** 2:
        failures.append(f"W={world} rank={rank}: seeds {seeds}, offset {res[5]}, numels {res[6]}")


def cases():
    out, seed = [], 40
    for comm in ("ring", "allgather", "ulysses"):
        for layout, scheme, causal in (("BSND", "zigzag", True), ("SBH", "contiguous", False),
                                       ("TND", "zigzag", True), ("TND", "contiguous", False)):
            seed += 1
            out.append(dict(comm=comm, layout=layout, scheme=scheme, causal=causal, dtype=torch.float32, seed=seed))
        seed += 1
        out.append(dict(comm=comm, layout="BNSD", scheme="zigzag", causal=True, dtype=torch.bfloat16, seed=seed))
    return out


def check_seed_case(case, world, rank, failures):
    check_seed(world, rank, failures)


def worker(rank, world, store, out_dir, which):
    cases_run = [(check, c) for c in cases()] + [(check_seed_case, dict(kind="seed"))]
    cp_harness.run_cases(rank, world, store, out_dir, cases_run, deadline_s=DEADLINE_S)


@pytest.mark.parametrize("world", [2, 3])
def test_dropout_matches_single_process(tmp_path, world):
    cp_harness.run_world(worker, world, tmp_path, "default", DEADLINE_S)
