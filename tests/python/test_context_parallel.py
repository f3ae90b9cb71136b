"""attnops.torch.cp (context parallelism) over W = 1, 2, 3, 4 gloo processes on one machine.

Every output, statistic and gradient of a sharded run is compared with the single-process attnops
op on the whole sequence (the same dtype), sharded the same way:
- fp32: max |cp - single| <= 1e-5 max |single|;
- bf16/fp16: error against a float64 dense reference at most 2x the single-process op's error
  (plus the small absolute term of reference.ABS_TOL), the design's tolerance rule;
- W = 1: bit for bit equal to the plain op; any W: a second run gives the same bits;
- the number of transfers per step is the schedule's (comm_stats).
Each W runs its whole matrix in one set of processes (start-up dominates these small shapes),
joined by cp_harness (deadline, per-rank reports). Long runs (bigger shapes) need ATTNOPS_TEST_LONG=1.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist

import cp_harness
from reference import ABS_TOL, from_bnsd, to_bnsd

B, N, NK, D, DV = 2, 12, 4, 8, 6   # GQA (3 query heads per K/V head), Dv != D
LAYOUTS = ["BSND", "BNSD", "BSH", "SBH"]
COMMS = ["ring", "allgather", "ulysses"]
SEQ_DIM = {"BSND": 1, "BNSD": 2, "BSH": 1, "SBH": 0, "TND": 0}
DEADLINE_S = 600


def layout_tensor(layout, b, n, s, d, dtype, g):
    if layout == "TND":  # packed sequences: B is 1
        return torch.randn(s, n, d, generator=g, dtype=torch.float64).to(dtype)
    x = torch.randn(b, n, s, d, generator=g, dtype=torch.float64)
    return from_bnsd(x, layout).contiguous().to(dtype)


def tnd_lengths(world):
    """Uneven packed sequences, one empty (its shards are empty on every rank)."""
    return [2 * world, 6 * world, 0, 4 * world]


def global_inputs(layout, s, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = layout_tensor(layout, B, N, s, D, dtype, g)
    k = layout_tensor(layout, B, NK, s, D, dtype, g)
    v = layout_tensor(layout, B, NK, s, DV, dtype, g)
    dout = layout_tensor(layout, B, N, s, DV, dtype, g)
    return q, k, v, dout


def dense64(q, k, v, dout, layout, causal, scale, lengths=None):
    """Out and gradients of the whole sequence in float64 (an independent reference); TND:
    attention inside each packed sequence."""
    qq, kk, vv = (t.double().detach().requires_grad_() for t in (q, k, v))
    if layout == "TND":
        qb, kb, vb = (t.permute(1, 0, 2)[None] for t in (qq, kk, vv))
    else:
        qb, kb, vb = to_bnsd(qq, layout, N), to_bnsd(kk, layout, NK), to_bnsd(vv, layout, NK)
    kb, vb = kb.repeat_interleave(N // NK, 1), vb.repeat_interleave(N // NK, 1)
    s = scale * qb @ kb.transpose(-1, -2)
    n = s.shape[-1]
    allowed = torch.ones(n, n, dtype=torch.bool)
    if lengths is not None:
        seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        allowed = seq[:, None] == seq[None, :]
    if causal:
        allowed &= torch.ones(n, n, dtype=torch.bool).tril()
    s = s.masked_fill(~allowed, -math.inf)
    o = s.softmax(-1) @ vb
    out = o[0].permute(1, 0, 2) if layout == "TND" else from_bnsd(o, layout)
    out.backward(dout.double())
    return out.detach(), qq.grad, kk.grad, vv.grad


def single_process(q, k, v, dout, layout, causal, scale, cum=None):
    from attnops.torch import npu_fusion_attention

    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1) if causal else None
    extra = dict(actual_seq_qlen=cum, actual_seq_kvlen=cum, softmax_layout="TND") if layout == "TND" else {}
    out, smax, ssum = npu_fusion_attention(q, k, v, N, layout, atten_mask=mask, scale=scale,
                                           sparse_mode=3 if causal else 0, **extra)[:3]
    out.backward(dout)
    return out.detach(), smax, ssum, q.grad, k.grad, v.grad


def bits(t):
    t = t.detach().contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).clone()


def run_cp(case, q, k, v, dout, scale, cum=None):
    from attnops.torch import cp

    layout, dim = case["layout"], SEQ_DIM[case["layout"]]
    local = [cp.shard(t, seq_dim=dim, scheme=case["scheme"], cu_seqlens=cum).requires_grad_(i < 3)
             for i, t in enumerate((q, k, v, dout))]
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1) if case["causal"] else None
    cp.comm_stats.reset()
    if case.get("api") == "flash":
        out, lse, _ = cp.flash_attn_func(local[0], local[1], local[2], softmax_scale=scale, causal=case["causal"],
                                         return_attn_probs=True, comm=case["comm"], scheme=case["scheme"])
        smax, ssum = lse, None
    else:
        extra = dict(actual_seq_qlen=cum, actual_seq_kvlen=cum, softmax_layout="TND") if layout == "TND" else {}
        out, smax, ssum = cp.npu_fusion_attention(local[0], local[1], local[2], N, layout, atten_mask=mask,
                                                  scale=scale, sparse_mode=3 if case["causal"] else 0,
                                                  comm=case["comm"], scheme=case["scheme"], **extra)[:3]
    fwd_counts = dict(cp.comm_stats.transfers)
    out.backward(local[3])
    counts = (fwd_counts, dict(cp.comm_stats.transfers))
    return [out.detach(), smax, ssum, local[0].grad, local[1].grad, local[2].grad], counts


def expected_counts(comm, world, layout):
    """(forward, forward + backward) transfers of one call."""
    if world == 1:
        return {}, {}
    if layout == "TND" and comm == "ulysses":
        return {"alltoall": 5}, {"alltoall": 9}
    if comm == "ring":
        return {"kv": world - 1}, {"kv": 2 * (world - 1), "dkv": world}
    if comm == "allgather":
        return {"allgather_kv": 1}, {"allgather_kv": 2, "reduce_scatter_dkv": 1}
    return {"alltoall": 5}, {"alltoall": 9}  # q, k, v, stats, out; then dout and dq, dk, dv


def check_case(case, world, rank, failures):
    from attnops.torch import cp

    dtype, layout, causal = case["dtype"], case["layout"], case["causal"]
    lengths = tnd_lengths(world) if layout == "TND" else None
    cum = torch.tensor(lengths).cumsum(0).tolist() if lengths else None
    s = sum(lengths) if lengths else 2 * world * case["chunk"]
    scale = 1 / math.sqrt(D)
    q, k, v, dout = global_inputs(layout, s, dtype, seed=case["seed"])
    ref = single_process(q, k, v, dout, layout, causal, scale, cum)
    got, counts = run_cp(case, q, k, v, dout, scale, cum)
    again, _ = run_cp(case, q, k, v, dout, scale, cum)
    tag = f"W={world} rank={rank} {case}"
    dim = SEQ_DIM[layout]
    stat_dim = 0 if layout == "TND" else 2  # [T, N, 8] or [B, N, S, 8]

    def local(t, seq_dim):
        return cp.shard(t, seq_dim=seq_dim, scheme=case["scheme"], cu_seqlens=cum)

    names = ["out", "softmax_max", "softmax_sum", "dq", "dk", "dv"]
    if case.get("api") == "flash":
        lse = ref[1][..., 0] + torch.log(ref[2][..., 0])
        want = [local(ref[0], dim), local(lse, 2), None] + [local(t, dim) for t in ref[3:]]
        names[1] = "softmax_lse"
    else:
        want = [local(ref[0], dim), local(ref[1], stat_dim), local(ref[2], stat_dim)] + \
               [local(t, dim) for t in ref[3:]]
    for name, a, b in zip(names, got, again):
        if a is not None and not torch.equal(bits(a), bits(b)):
            failures.append(f"{tag}: {name} differs between two runs")
    if counts != expected_counts(case["comm"], world, layout):
        failures.append(f"{tag}: transfers {counts}, expected {expected_counts(case['comm'], world, layout)}")
    if world == 1:
        for name, a, w in zip(names, got, want):
            if a is not None and not torch.equal(bits(a), bits(w)):
                failures.append(f"{tag}: {name} is not bit-identical to the plain op")
        return
    # Statistics are fp32 whatever the input dtype: the fp32 rule; so are fp32 outputs and gradients.
    for i in range(6) if dtype == torch.float32 else (1, 2):
        a, w = got[i], want[i]
        if a is None:
            continue
        bound = 1e-5 * max(1.0, w.double().abs().max().item())
        err = (a.double() - w.double()).abs().max().item()
        if not err <= bound:
            failures.append(f"{tag}: {names[i]} error {err:.3e} against the single-process op > {bound:.3e}")
    if dtype != torch.float32:
        ref64 = dense64(q, k, v, dout, layout, causal, scale, lengths)
        for i, r64 in zip((0, 3, 4, 5), ref64):
            w64 = local(r64, dim)
            base = (want[i].double() - w64).abs().max().item()
            err = (got[i].double() - w64).abs().max().item()
            bound = 2 * base + ABS_TOL[dtype] * max(1.0, w64.abs().max().item())
            if not err <= bound:
                failures.append(f"{tag}: {names[i]} error {err:.3e} against float64 > {bound:.3e} "
                                f"(single-process error {base:.3e})")


def default_cases(world):
    """The whole fp32 matrix at W = 2; two layouts at the other sizes (each layout runs at two
    sizes), to keep the default suite fast."""
    layouts = {1: ["BSND", "SBH"], 2: LAYOUTS, 3: ["BNSD", "SBH"], 4: ["BSND", "BSH"]}[world]
    cases, seed = [], 0
    for comm in COMMS:
        for scheme in ("zigzag", "contiguous"):
            for layout in layouts:
                for causal in (True, False):
                    seed += 1
                    cases.append(dict(comm=comm, scheme=scheme, layout=layout, causal=causal, dtype=torch.float32,
                                      chunk=3, seed=seed))
        for dtype in (torch.bfloat16, torch.float16):
            seed += 1
            cases.append(dict(comm=comm, scheme="zigzag", layout=layouts[-1], causal=True, dtype=dtype, chunk=3,
                              seed=seed))
        seed += 1
        cases.append(dict(comm=comm, scheme="zigzag", layout="BSND", causal=True, dtype=torch.float32, chunk=2,
                          seed=seed, api="flash"))
    # Packed sequences (TND): every sequence sharded on its own, one of them empty.
    for comm in COMMS:
        for scheme in ("zigzag", "contiguous"):
            for causal in (True, False):
                seed += 1
                cases.append(dict(comm=comm, scheme=scheme, layout="TND", causal=causal, dtype=torch.float32,
                                  chunk=0, seed=seed))
        seed += 1
        cases.append(dict(comm=comm, scheme="zigzag", layout="TND", causal=True, dtype=torch.bfloat16, chunk=0,
                          seed=seed))
    return cases


def long_cases(world):
    cases = []
    for comm in COMMS:
        for dtype in (torch.float32, torch.bfloat16):
            cases.append(dict(comm=comm, scheme="zigzag", layout="BSND", causal=True, dtype=dtype, chunk=96, seed=7))
    return cases


CASES = {"default": default_cases, "long": long_cases}


def worker(rank, world, store, out_dir, which):
    cp_harness.run_cases(rank, world, store, out_dir, [(check_case, c) for c in CASES[which](world)],
                         deadline_s=DEADLINE_S)


def run_world(world, tmp_path, which="default"):
    cp_harness.run_world(worker, world, tmp_path, which, DEADLINE_S)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_context_parallel_matches_single_process(tmp_path, world):
    run_world(world, tmp_path)


@pytest.mark.skipif(not os.environ.get("ATTNOPS_TEST_LONG"), reason="long run: set ATTNOPS_TEST_LONG=1")
@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_long(tmp_path, world):
    run_world(world, tmp_path, "long")


def test_shard_index_rules():
    from attnops.torch import cp

    assert cp.shard_index(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp.shard_index(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert cp.shard_index(6, 3, 2, "contiguous").tolist() == [4, 5]
    every = torch.cat([cp.shard_index(24, 4, r) for r in range(4)])
    assert sorted(every.tolist()) == list(range(24))  # every position held exactly once
    with pytest.raises(ValueError, match="divisible by 6"):
        cp.shard_index(8, 3, 0)
    with pytest.raises(ValueError, match="scheme = 'stripe'"):
        cp.shard_index(8, 2, 0, "stripe")
    # Packed sequences: each sharded on its own (lengths 4, 0, 8; a leading 0 changes nothing).
    assert cp.shard_index(12, 2, 1, cu_seqlens=[4, 4, 12]).tolist() == [1, 2, 6, 7, 8, 9]
    assert cp.shard_index(12, 2, 1, cu_seqlens=torch.tensor([0, 4, 4, 12])).tolist() == [1, 2, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="length of sequence 1 6: must be divisible by 4"):
        cp.shard_index(10, 2, 0, cu_seqlens=[4, 10])
    with pytest.raises(ValueError, match="ending at the sequence length 12"):
        cp.shard_index(12, 2, 0, cu_seqlens=[4, 8])


def test_requires_initialized_group():
    from attnops.torch import cp

    q = torch.randn(1, 4, 2, 8)
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        cp.flash_attn_func(q, q, q)


def test_argument_errors_name_the_culprit(tmp_path):
    """Checked before any communication, in a group of one process (this one)."""
    from attnops.torch import cp

    with cp_harness.one_process_group(tmp_path):
        q = torch.randn(1, 8, 4, 8)
        with pytest.raises(ValueError, match="comm = 'tree'"):
            cp.flash_attn_func(q, q, q, comm="tree")
        with pytest.raises(ValueError, match="scheme = 'stripe'"):
            cp.flash_attn_func(q, q, q, scheme="stripe")
        with pytest.raises(ValueError, match="dropout_p = 1.5"):  # dropout itself: test_cp_dropout.py
            cp.flash_attn_func(q, q, q, dropout_p=1.5)
        with pytest.raises(ValueError, match="key: dtype torch.float64"):
            cp.attention(q, q.double(), q, 4, "BSND", scale=1.0)
        with pytest.raises(ValueError, match="input_layout = 'NSD'"):
            cp.attention(q, q, q, 4, "NSD", scale=1.0)
        with pytest.raises(ValueError, match="local sequence length 7: must be even"):
            cp.attention(q[:, :7], q[:, :7], q[:, :7], 4, "BSND", scale=1.0)
        with pytest.raises(ValueError, match="sparse_mode = 7: modes 7 and 8"):  # bands etc.: test_context_parallel_masks
            cp.attention(q, q, q, 4, "BSND", scale=1.0, sparse_mode=7)
        with pytest.raises(ValueError, match="keep_prob = 0.0"):
            cp.npu_fusion_attention(q, q, q, 4, "BSND", keep_prob=0.0)
        t = torch.randn(12, 4, 8)
        with pytest.raises(ValueError, match="cu_seqlens: None: required for input_layout TND"):
            cp.attention(t, t, t, 4, "TND", scale=1.0)
        with pytest.raises(ValueError, match="length of sequence 0 5: must be divisible by 2"):
            cp.attention(t, t, t, 4, "TND", scale=1.0, cu_seqlens=[5, 12])
        with pytest.raises(ValueError, match="actual_seq_qlen = \\[12\\], actual_seq_kvlen = None"):
            cp.npu_fusion_attention(t, t, t, 4, "TND", actual_seq_qlen=[12])
