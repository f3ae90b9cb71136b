"""attnops.torch.cp beyond "no mask or causal", over W = 1..4 gloo processes: sparse modes 0-8
(bands, prefixes, the TND split modes 7/8, explicit global masks), learnable sinks, alibi slopes and
dense pse on global positions, the Ulysses-inside ring-across hybrid (W = 4 as 2 x 2), and
whole-sequence spreading of packed sequences (uneven lengths, empty ranks).

Every output, statistic and gradient (dsink included) is compared with the single-process attnops
op on the whole sequence, sharded the same way, by the rules of test_context_parallel.py (fp32
within 1e-5 relative; bf16/fp16 within 2x the single-process error against a float64 reference;
W = 1 bit for bit; a second run gives the same bits). The float64 reference here is built from the
spec's predicates (shared/spec/flash-attention-score.md 2.4, 2.6), not from the code under test.
Fully masked blocks make no kernel call: asserted by counting calls for a narrow band.
Long runs (bigger shapes) need ATTNOPS_TEST_LONG=1.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist

import cp_harness
from reference import ABS_TOL
from test_context_parallel import bits, layout_tensor

B, N, NK, D, DV = 2, 12, 4, 8, 6  # N, NK divisible by the hybrid's 2; NK not by 3 (Ulysses repeats K/V)
SEQ_DIM = {"BSND": 1, "BNSD": 2, "BSH": 1, "SBH": 0, "TND": 0}
DEADLINE_S = 600
INT32_MAX = 2147483647
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
PREFIX_MASK = torch.zeros(3072, 2048, dtype=torch.bool)


def tnd_lengths(world, scheme):
    if scheme == "whole":  # uneven, one empty; some ranks get nothing at W = 3, 4
        return [5, 0, 13, 2]
    return [2 * world, 6 * world, 0, 4 * world]


# ---------------------------------------------------------------------------------------------
# Inputs and the float64 reference (independent of the code under test)


def make_inputs(case, world):
    layout, dtype = case["layout"], case["dtype"]
    g = torch.Generator().manual_seed(case["seed"])
    lengths = tnd_lengths(world, case.get("scheme")) if layout == "TND" else None
    s = sum(lengths) if lengths else 2 * 2 * world * case.get("chunk", 3)  # divisible by 2W and by 4W (hybrid)
    b = 1 if layout == "TND" else B
    q = layout_tensor(layout, B, N, s, D, dtype, g)
    k = layout_tensor(layout, B, NK, s, D, dtype, g)
    v = layout_tensor(layout, B, NK, s, DV, dtype, g)
    dout = layout_tensor(layout, B, N, s, DV, dtype, g)
    extra = {}
    if case.get("sink"):
        extra["sink"] = torch.randn(N, generator=g, dtype=torch.float64).float()
    if case.get("alibi"):
        extra["pse"] = (torch.rand(N, generator=g, dtype=torch.float64) * 0.5).float()
        extra["pse_type"] = case["alibi"]
    if case.get("dense_pse"):
        extra["pse"] = torch.randn(b, N, s, s, generator=g, dtype=torch.float64).to(dtype)
        extra["pse_type"] = 1
    mode = case["mode"]
    if mode in (0, 1, 5) and layout != "TND":
        shape = (b, 1, s, s) if case.get("mask4d") else (s, s)
        m = torch.rand(shape, generator=g, dtype=torch.float64) < 0.3
        extra["atten_mask"] = m
    elif mode in (2, 3, 4, 7, 8):
        extra["atten_mask"] = CAUSAL
    elif mode == 6:
        extra["atten_mask"] = PREFIX_MASK
    if mode in (5, 6):
        count = len(lengths) if lengths else b
        top = lengths if lengths else [s] * count
        extra["prefix"] = [int(torch.randint(0, t + 1, (1,), generator=g)) for t in top]
    return q, k, v, dout, lengths, s, extra


def keep_matrix(case, s, lengths, extra):
    """[b, 1|N, S, S] True = the key is seen (spec 2.6 with Sq = Skv, so d = 0)."""
    mode, pre, nxt = case["mode"], case.get("pre", INT32_MAX), case.get("next", INT32_MAX)
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    if lengths is None:
        seq = torch.zeros(s, dtype=torch.long)
        start = torch.zeros(s, dtype=torch.long)
        nseq = 1
    else:
        seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        starts = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)[:-1]))
        start = starts[seq]
        nseq = len(lengths)
    same = seq[:, None] == seq[None, :]
    li, lj = i - start[:, None], j - start[None, :]  # positions in the sequence
    diff = lj - li
    full = torch.ones(s, s, dtype=torch.bool)
    causal = diff <= 0
    band = (diff >= -pre) & (diff <= nxt)
    if mode == 1:
        rule = full
    elif mode == 0:
        rule = band
    elif mode in (2, 3):
        rule = causal
    elif mode == 4:
        rule = band
    elif mode in (5, 6):
        pref = torch.tensor(extra["prefix"])
        if lengths is None:  # per batch
            rule = (causal[None] | (lj[None] < pref.view(-1, 1, 1)))[:, None]
        else:
            rule = causal | (lj < pref[seq][None, :])
    else:
        live = [x for x in range(nseq) if lengths[x] > 0]
        special = live[-1] if mode == 7 else live[0]
        rule = torch.where((seq == special)[:, None], band, causal)
    keep = rule & same
    if keep.dim() == 2:
        keep = keep[None, None]
    if "atten_mask" in extra and mode in (0, 1, 5):
        m = extra["atten_mask"]
        keep = keep & ~(m if m.dim() == 4 else m[None, None])
    return keep


def dense64(case, q, k, v, dout, lengths, s, extra, scale):
    layout = case["layout"]
    from reference import from_bnsd, to_bnsd

    qq, kk, vv = (t.double().detach().requires_grad_() for t in (q, k, v))
    sink = extra.get("sink")
    sk = sink.double().detach().requires_grad_() if sink is not None else None
    if layout == "TND":
        qb, kb, vb = (t.permute(1, 0, 2)[None] for t in (qq, kk, vv))
    else:
        qb, kb, vb = to_bnsd(qq, layout, N), to_bnsd(kk, layout, NK), to_bnsd(vv, layout, NK)
    kb, vb = kb.repeat_interleave(N // NK, 1), vb.repeat_interleave(N // NK, 1)
    r = qb @ kb.transpose(-1, -2)
    pse = extra.get("pse")
    if pse is not None and extra["pse_type"] >= 2:
        i = torch.arange(s)[:, None]
        j = torch.arange(s)[None, :]
        if lengths is not None:
            seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
            starts = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)[:-1]))
            i, j = i - starts[seq][:, None], j - starts[seq][None, :]
        dist_ = (j - i).abs().double()
        if extra["pse_type"] == 3:
            dist_ = dist_.sqrt()
        sc = scale * r - pse.double().view(1, -1, 1, 1) * dist_
    elif pse is not None:
        sc = scale * (r + pse.double())
    else:
        sc = scale * r
    keep = keep_matrix(case, s, lengths, extra)
    sc = sc.masked_fill(~keep, -math.inf)
    if sk is not None:
        col = sk.view(1, -1, 1, 1).expand(sc.shape[0], -1, s, 1)
        sc = torch.cat([sc, col], -1)
    m = sc.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(sc - m)
    den = e.sum(-1, keepdim=True)
    p = torch.where(den > 0, e / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(e))
    if sk is not None:
        p = p[..., :s]
    o = p @ vb
    out = o[0].permute(1, 0, 2) if layout == "TND" else from_bnsd(o, layout)
    out.backward(dout.double())
    grads = [qq.grad, kk.grad, vv.grad] + ([sk.grad] if sk is not None else [])
    return [out.detach()] + grads


# ---------------------------------------------------------------------------------------------
# The runs


def single_process(case, q, k, v, dout, lengths, extra, scale):
    from attnops.torch import npu_fusion_attention

    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    kw = dict(extra)
    if "sink" in kw:
        kw["sink"] = kw["sink"].clone().requires_grad_()
    if lengths is not None:
        cum = torch.tensor(lengths).cumsum(0).tolist()
        kw.update(actual_seq_qlen=cum, actual_seq_kvlen=cum, softmax_layout="TND")
    out, smax, ssum = npu_fusion_attention(q, k, v, N, case["layout"], scale=scale, sparse_mode=case["mode"],
                                           pre_tockens=case.get("pre", INT32_MAX),
                                           next_tockens=case.get("next", INT32_MAX), **kw)[:3]
    out.backward(dout)
    res = [out.detach(), smax, ssum, q.grad, k.grad, v.grad]
    if "sink" in kw:
        res.append(kw["sink"].grad)
    return res


def groups(case, world):
    """(group, ulysses_group) of a case: the hybrid splits W = 4 into 2 rings of 2 across 2
    Ulysses groups; flat rank = ring rank * 2 + inner rank equals the global rank."""
    if not case.get("hybrid"):
        return None, None
    rank = dist.get_rank()
    inner = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    ring = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    return ring[rank % 2], inner[rank // 2]


def run_cp(case, q, k, v, dout, lengths, extra, scale, grp):
    from attnops.torch import _cp_general, cp

    group, ug = grp
    layout, dim = case["layout"], SEQ_DIM[case["layout"]]
    cum = torch.tensor(lengths).cumsum(0).tolist() if lengths is not None else None
    scheme = case.get("scheme", "zigzag")
    local = [cp.shard(t, group, seq_dim=dim, scheme=scheme, cu_seqlens=cum, ulysses_group=ug).requires_grad_(i < 3)
             for i, t in enumerate((q, k, v, dout))]
    kw = dict(extra)
    if "sink" in kw:
        kw["sink"] = kw["sink"].clone().requires_grad_()
    if lengths is not None:
        kw.update(actual_seq_qlen=cum, actual_seq_kvlen=cum, softmax_layout="TND")
    cp.comm_stats.reset()
    _cp_general.kernel_calls.clear()
    out, smax, ssum = cp.npu_fusion_attention(local[0], local[1], local[2], N, layout, scale=scale,
                                              sparse_mode=case["mode"], pre_tockens=case.get("pre", INT32_MAX),
                                              next_tockens=case.get("next", INT32_MAX), group=group,
                                              ulysses_group=ug, comm=case["comm"], scheme=scheme, **kw)[:3]
    fwd = (dict(cp.comm_stats.transfers), dict(_cp_general.kernel_calls))
    out.backward(local[3])
    res = [out.detach(), smax, ssum, local[0].grad, local[1].grad, local[2].grad]
    if "sink" in kw:
        res.append(kw["sink"].grad)
    return res, (fwd, dict(cp.comm_stats.transfers))


def expected_counts(case, world):
    if world == 1 or case.get("hybrid") or case.get("scheme") == "whole":
        return None
    sink = {"allgather_dsink": 1} if case.get("sink") else {}
    if case["comm"] == "ring":
        return {"kv": world - 1}, {"kv": 2 * (world - 1), "dkv": world, **sink}
    if case["comm"] == "allgather":
        return {"allgather_kv": 1}, {"allgather_kv": 2, "reduce_scatter_dkv": 1, **sink}
    return None


def check_case(case, world, rank, failures):
    from attnops.torch import cp

    if case.get("hybrid") and world != 4:
        return
    dtype, layout = case["dtype"], case["layout"]
    scale = 1 / math.sqrt(D)
    q, k, v, dout, lengths, s, extra = make_inputs(case, world)
    grp = groups(case, world)
    ref = single_process(case, q, k, v, dout, lengths, extra, scale)
    got, counts = run_cp(case, q, k, v, dout, lengths, extra, scale, grp)
    again, _ = run_cp(case, q, k, v, dout, lengths, extra, scale, grp)
    tag = f"W={world} rank={rank} {dict((k, v) for k, v in case.items() if k not in ('w', 'calls'))}"
    dim = SEQ_DIM[layout]
    stat_dim = 0 if layout == "TND" else 2
    cum = torch.tensor(lengths).cumsum(0).tolist() if lengths is not None else None
    scheme = case.get("scheme", "zigzag")

    def local(t, seq_dim):
        return cp.shard(t, grp[0], seq_dim=seq_dim, scheme=scheme, cu_seqlens=cum, ulysses_group=grp[1])

    names = ["out", "softmax_max", "softmax_sum", "dq", "dk", "dv", "dsink"]
    want = [local(ref[0], dim), local(ref[1], stat_dim), local(ref[2], stat_dim)] + [local(t, dim) for t in ref[3:6]]
    want += ref[6:]
    for name, a, b in zip(names, got, again):
        if not torch.equal(bits(a), bits(b)):
            failures.append(f"{tag}: {name} differs between two runs")
    exp = expected_counts(case, world)
    if exp is not None and (counts[0][0], counts[1]) != exp:
        failures.append(f"{tag}: transfers {counts}, expected {exp}")
    if case.get("calls") and world in case["calls"]:
        want_calls = case["calls"][world][rank]
        if counts[0][1].get("fwd", 0) != want_calls:
            failures.append(f"{tag}: {counts[0][1]} forward kernel calls, expected {want_calls}")
    if world == 1 and not case.get("hybrid"):
        for name, a, w in zip(names, got, want):
            if not torch.equal(bits(a), bits(w)):
                failures.append(f"{tag}: {name} is not bit-identical to the plain op")
        return
    fp32_idx = range(len(got)) if dtype == torch.float32 else [1, 2] + ([6] if len(got) > 6 else [])
    for i in fp32_idx:
        a, w = got[i].double(), want[i].double()
        finite = w[torch.isfinite(w)]
        bound = 1e-5 * max(1.0, finite.abs().max().item() if finite.numel() else 0.0)
        # Rows that see no key hold -inf statistics on both sides: equal, not NaN apart.
        err = torch.where(a == w, torch.zeros_like(a), a - w).abs().max().item() if a.numel() else 0.0
        if not err <= bound:
            failures.append(f"{tag}: {names[i]} error {err:.3e} against the single-process op > {bound:.3e}")
    if dtype != torch.float32:
        ref64 = dense64(case, q, k, v, dout, lengths, s, extra, scale)
        for i, r64 in zip((0, 3, 4, 5), ref64):
            w64 = local(r64, dim)
            if not w64.numel():  # a rank without tokens (whole sequences)
                continue
            base = (want[i].double() - w64).abs().max().item()
            err = (got[i].double() - w64).abs().max().item()
            bound = 2 * base + ABS_TOL[dtype] * max(1.0, w64.abs().max().item())
            if not err <= bound:
                failures.append(f"{tag}: {names[i]} error {err:.3e} against float64 > {bound:.3e} "
                                f"(single-process error {base:.3e})")


def matrix():
    """Every case with the worlds it runs at by default (``w``: each W sees a share, so that the
    default run stays short); ATTNOPS_TEST_LONG=1 runs every case at every W."""
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", f32)
        kw.setdefault("layout", "BSND")
        kw.setdefault("comm", "ring")
        kw["seed"] = len(c) + 100
        kw["w"] = w
        c.append(kw)

    # Bands (mode 4) and mode 0 (band + explicit global mask), both schemes, every comm.
    add((1, 2, 3), mode=4, pre=4, next=1, comm="ring")
    add((1, 2), mode=4, pre=0, next=5, comm="ring", scheme="contiguous", layout="SBH")
    add((1, 2, 3), mode=0, pre=7, next=2, comm="ring", layout="BNSD")
    add((1, 2), mode=4, pre=4, next=1, comm="allgather")
    add((1, 3), mode=4, pre=0, next=5, comm="allgather", scheme="contiguous", layout="SBH")
    add((1, 2), mode=0, pre=7, next=2, comm="allgather", layout="BNSD")
    add((1, 2), mode=4, pre=4, next=1, comm="ulysses")
    add((1, 4), mode=4, pre=0, next=5, comm="ulysses", scheme="contiguous", layout="SBH")
    add((1, 3), mode=0, pre=7, next=2, comm="ulysses", layout="BNSD")
    add((1, 2), mode=1, comm="ring", mask4d=True, layout="BSH")
    add((1, 2, 3), mode=5, comm="allgather", mask4d=True)
    add((1, 2), mode=6, comm="ring")
    add((1, 3), mode=6, comm="ulysses", scheme="contiguous")
    add((1, 2, 4), mode=3, comm="ring", sink=True)
    add((1, 3), mode=1, comm="allgather", sink=True, layout="SBH")
    add((1, 2), mode=4, pre=3, next=0, comm="ulysses", sink=True)
    add((1, 2), mode=3, comm="ring", alibi=2)
    add((1, 3), mode=1, comm="allgather", alibi=3, scheme="contiguous")
    add((1, 2), mode=2, comm="ulysses", alibi=2, sink=True)
    add((1, 2), mode=3, comm="ring", dense_pse=True, layout="BSH")
    # Packed sequences: modes 3/4/6/7/8 per sequence.
    add((1, 2, 3), mode=7, pre=5, next=0, comm="ring", layout="TND")
    add((1, 2), mode=8, pre=3, next=2, comm="allgather", layout="TND")
    add((1, 3), mode=6, comm="ring", layout="TND", scheme="contiguous")
    add((1, 2), mode=4, pre=2, next=2, comm="ulysses", layout="TND", sink=True)
    add((1, 4), mode=3, comm="allgather", layout="TND", alibi=2)
    # Half precision: the 2x rule against float64.
    add((2,), mode=4, pre=5, next=0, comm="ring", dtype=bf16, sink=True)
    add((3,), mode=6, comm="allgather", dtype=f16)
    add((2,), mode=7, pre=6, next=0, comm="ring", layout="TND", dtype=bf16)
    # A narrow band over contiguous shards: a rank computes only the blocks the band touches
    # (its own and its two neighbours'), the others make no kernel call.
    add((2, 3, 4), mode=4, pre=1, next=1, comm="ring", scheme="contiguous", chunk=2,
        calls={2: [2, 2], 3: [2, 3, 2], 4: [2, 3, 3, 2]})
    # The hybrid: Ulysses inside 2 ranks, ring (or all-gather) across 2 (W = 4 only).
    add((4,), mode=3, comm="ring", hybrid=True)
    add((4,), mode=4, pre=5, next=2, comm="ring", hybrid=True, sink=True, layout="SBH")
    add((4,), mode=1, comm="allgather", hybrid=True, alibi=2)
    add((4,), mode=3, comm="ring", hybrid=True, layout="TND")
    add((4,), mode=3, comm="ring", hybrid=True, dtype=bf16)
    # Whole sequences per rank (uneven lengths; ranks without a sequence at W = 3, 4).
    add((1, 2), mode=3, comm="ring", layout="TND", scheme="whole")
    add((1, 3, 4), mode=1, comm="ring", layout="TND", scheme="whole", sink=True)
    add((4,), mode=6, comm="ring", layout="TND", scheme="whole", dtype=bf16)
    return c


def default_cases(world):
    return [c for c in matrix() if world in c["w"]]


def long_cases(world):
    cases = [c for c in matrix() if world == 4 or not c.get("hybrid")]
    for comm in ("ring", "allgather", "ulysses"):
        cases.append(dict(mode=4, pre=40, next=8, comm=comm, dtype=torch.float32, layout="BSND", chunk=32, seed=7,
                          sink=True))
        cases.append(dict(mode=3, comm=comm, dtype=torch.bfloat16, layout="BSND", chunk=32, seed=8, alibi=2))
    cases.append(dict(mode=3, comm="ring", hybrid=True, dtype=torch.float32, layout="BSND", chunk=32, seed=9,
                      sink=True))
    return cases


CASES = {"default": default_cases, "long": long_cases}


def worker(rank, world, store, out_dir, which):
    cp_harness.run_cases(rank, world, store, out_dir, [(check_case, c) for c in CASES[which](world)],
                         deadline_s=DEADLINE_S)


def run_world(world, tmp_path, which="default"):
    cp_harness.run_world(worker, world, tmp_path, which, DEADLINE_S)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_context_parallel_masks_match_single_process(tmp_path, world):
    run_world(world, tmp_path)


@pytest.mark.skipif(not os.environ.get("ATTNOPS_TEST_LONG"), reason="long run: set ATTNOPS_TEST_LONG=1")
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_context_parallel_masks_long(tmp_path, world):
    run_world(world, tmp_path, "long")


# ---------------------------------------------------------------------------------------------
# No processes needed


def test_block_plan_skips_and_rewrites_the_band():
    from attnops.torch import _cp_general as gen

    g = gen.geometry(4, 2, 1, None, None, None, 1, batch=1, heads=1, seq_len=64)
    # Queries 0..7 against keys 32..39: beyond the band, no call.
    assert gen.plan(g, [[0, 0, 8, 0]], [[0, 32, 8, 0]]) == []
    # Queries 8..15 against keys 0..7: only key 7 (= 9 - 2) is seen, by query 8 and 9... trimmed.
    (blk,) = gen.plan(g, [[0, 8, 8, 0]], [[0, 0, 8, 0]])
    assert (blk.q0, blk.a, blk.k0, blk.c) == (8, 2, 6, 2)
    # The block's band in its own bottom-right terms keeps exactly the global band's pairs.
    for i in range(blk.a):
        for j in range(blk.c):
            gi, gj = blk.q0 + i, blk.k0 + j
            local = -blk.pre <= (j - i) - (blk.c - blk.a) <= blk.nxt
            assert local == (-2 <= gj - gi <= 1), (i, j)
    # Inside the band everywhere: a plain call.
    (full,) = gen.plan(gen.geometry(4, 100, 100, None, None, None, 1, batch=1, heads=1, seq_len=64),
                       [[0, 0, 8, 0]], [[0, 8, 8, 0]])
    assert full.mode == 0 and full.mask is None


def test_assign_sequences_balances_whole_sequences():
    from attnops.torch import cp

    owner = cp.assign_sequences([10, 10, 11, 20, 21], 2)  # lengths 10, 0, 1, 9, 1
    # By work (n^2): 10 -> rank 0 (100); 9 -> rank 1 (81); then 1, 1, 0 to the lighter rank 1.
    assert owner == [0, 1, 1, 1, 1]
    assert cp.assign_sequences([3, 5], 4) == [0, 1]  # lengths 3, 2; ranks 2 and 3 get nothing
    assert cp.assign_sequences([2, 4], 2) == [0, 1]  # a tie: the lower index first, to the lower rank
    every = torch.cat([cp.whole_index([3, 3, 9, 10], 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(10))
    assert cp.whole_cu_seqlens([3, 5], 4, 2) == []


def test_argument_errors_name_the_culprit(tmp_path):
    from attnops.torch import cp

    with cp_harness.one_process_group(tmp_path):
        q = torch.randn(1, 8, 4, 8)
        t = torch.randn(12, 4, 8)
        with pytest.raises(ValueError, match="sparse_mode = 7: modes 7 and 8"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, sparse_mode=7)
        with pytest.raises(ValueError, match="pre_tokens \\+ next_tokens = -3 \\+ 1"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, sparse_mode=4, pre_tokens=-3, next_tokens=1)
        with pytest.raises(ValueError, match="prefix: None: required with sparse_mode 6"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, sparse_mode=6)
        with pytest.raises(ValueError, match="prefix\\[0\\] = 9: must be in \\[0, 8\\]"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, sparse_mode=6, prefix=[9])
        with pytest.raises(ValueError, match="atten_mask: shape \\[4, 4\\]"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, sparse_mode=1, atten_mask=torch.zeros(4, 4, dtype=torch.bool))
        with pytest.raises(ValueError, match="sink: shape \\[3\\]"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, sink=torch.zeros(3))
        with pytest.raises(ValueError, match="pse: shape \\[4\\] dtype torch.float64"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, pse=torch.zeros(4, dtype=torch.float64), pse_type=2)
        with pytest.raises(ValueError, match="q_start_idx: given with pse_type 1 and no pse"):
            cp.npu_fusion_attention(q, q, q, 4, "BSND", q_start_idx=[0])
        with pytest.raises(ValueError, match="scheme = 'whole'.*TND"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, scheme="whole")
        with pytest.raises(ValueError, match="rank 0 holds 10 tokens"):
            cp.attention(t, t, t, 4, "TND", scale=1.0, scheme="whole", cu_seqlens=[4, 10])
