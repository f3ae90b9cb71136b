"""attnops.torch.cp, the gaps closed after the first context-parallel round, over W = 1..4 gloo
processes:
- scheme "llama3" with a packed token count T that W does not divide: rank r holds tokens
  [floor(r*T/W), floor((r+1)*T/W)) (slices differ by at most one token; with T < W some ranks
  hold none), over ring, all-gather, Ulysses and the hybrid;
- cross-attention (query and key lengths differ) with Ulysses and with the Ulysses-inside,
  ring-across hybrid (fixed layouts), and with a dense global pse [B|1, N, S1|1, S2];
- cross-attention with TND: per-sequence query and key lengths (``cu_seqlens_kv``), every
  sequence's queries and keys sharded on their own, sparse modes 0-4 with the bottom-right
  modes shifted per sequence, over ring, all-gather, Ulysses and the hybrid, dropout included.

Same rules as test_cp_features (whose checks this module reuses): every output, statistic and
gradient against the single-process attnops op on the whole problem with the same (keep_prob,
seed), sharded the same way: fp32 within 1e-5 relative; bf16 within 2x the single-process bf16
op's error against the single-process fp32 op (plus reference.ABS_TOL); W = 1 bit for bit; a
second run gives the same bits; transfer counts asserted for ring and all-gather (the ring's step
count from the spec's mask predicates, independent of the code under test). Long runs (every case
at the worlds the default run leaves out): ATTNOPS_TEST_LONG=1.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import cp_harness
import test_context_parallel_masks as masks
import test_cp_features as feat
import test_cp_last_gaps as last
import test_cp_mask_pse_cross as mpc
from test_context_parallel import layout_tensor
from test_context_parallel_masks import B, CAUSAL, D, DV, INT32_MAX, N, NK, groups

DEADLINE_S = 600
KEEP, SEED = feat.KEEP, feat.SEED

# ---------------------------------------------------------------------------------------------
# "llama3" with T not divisible by W


def uneven_lengths(world, scheme):
    """T = max(25, 12W + 1) (W >= 2: not divisible), slice boundaries inside sequences, one empty
    sequence; "tiny": T = 2 < W (ranks with no token)."""
    if _CURRENT.get("tiny"):
        return [1, 0, 1]
    cuts = [5, 0, 11, 1]
    return cuts + [max(25, 12 * world + 1) - sum(cuts)]


_CURRENT: dict = {}


def llama3_uneven_cases():
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", f32)
        kw.update(layout="TND", scheme="llama3", seed=700 + len(c), w=w, kind="llama3-uneven")
        c.append(kw)

    add((1, 3), mode=3, comm="allgather")
    add((2, 4), mode=3, comm="ring", steps={4: 3})  # T = 49: no sequence spans 4 slices
    add((3,), mode=1, comm="ulysses", dtype=bf16)
    add((2,), mode=4, pre=3, next=1, comm="ring", sink=True, keep=KEEP)
    add((4,), mode=3, comm="ring", hybrid=True)
    add((3, 4), mode=3, comm="allgather", tiny=True)  # T = 2 < W: empty ranks
    add((4,), mode=1, comm="ulysses", tiny=True)
    return c


def check_uneven(case, world, rank, failures):
    from attnops.torch import cp

    _CURRENT.clear()
    _CURRENT.update(case)
    try:
        feat.check_case(case, world, rank, failures)
        if case.get("hybrid") and world != 4:
            return
        # shard / unshard round trip over the uneven slices (every rank gets the global tensor back).
        lengths = uneven_lengths(world, "llama3")
        cum = torch.tensor(lengths).cumsum(0).tolist()
        x = torch.arange(sum(lengths) * 3, dtype=torch.float32).view(-1, 3)
        group, ug = groups(case, world)
        local = cp.shard(x, group, seq_dim=0, scheme="llama3", cu_seqlens=cum, ulysses_group=ug)
        back = cp.unshard(local, group, seq_dim=0, scheme="llama3", cu_seqlens=cum, ulysses_group=ug)
        if not torch.equal(back, x):
            failures.append(f"llama3-uneven W={world} rank={rank} {case}: unshard(shard(x)) != x")
    finally:
        _CURRENT.clear()


# ---------------------------------------------------------------------------------------------
# Cross-attention with Ulysses and the hybrid (fixed layouts; test_cp_features' checks)


def cross_ulysses_cases():
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", f32)
        kw.setdefault("layout", "BSND")
        kw.update(seed=800 + len(c), w=w, kind="cross-ulysses")
        c.append(kw)

    add((1, 3), mode=1, comm="ulysses", kv_chunk=5)
    add((2,), mode=3, comm="ulysses", kv_chunk=5, layout="BNSD", keep=KEEP)
    add((4,), mode=4, pre=6, next=1, comm="ulysses", kv_chunk=2, scheme="contiguous", layout="SBH")  # S1 > S2
    add((2,), mode=0, pre=9, next=3, comm="ulysses", kv_chunk=4, explicit=True, dtype=bf16, sink=True)
    add((4,), mode=3, comm="ring", kv_chunk=5, hybrid=True)
    add((), mode=1, comm="allgather", kv_chunk=2, hybrid=True, layout="BSH", sink=True)
    # A dense global pse [B|1, N, S1|1, S2] with cross-attention, sliced per block.
    add((2,), mode=3, comm="ring", kv_chunk=5, dense_pse=(B, N, True))
    add((3,), mode=1, comm="allgather", kv_chunk=2, dense_pse=(1, N, False), layout="BNSD", keep=KEEP)
    add((2,), mode=4, pre=4, next=2, comm="ulysses", kv_chunk=4, dense_pse=(B, N, True), dtype=bf16)
    return c


def make_cross_pse(case, world):
    """test_cp_features.make_cross, plus a dense global pse (pse_type 1) [b, N, S1 or 1, S2]
    when the case names one: dense_pse = (b, N, full rows)."""
    q, k, v, dout, lengths, s1, extra = _MAKE_CROSS(case, world)
    if case.get("dense_pse"):
        b, n, rows = case["dense_pse"]
        s2 = 4 * world * case["kv_chunk"]
        g = torch.Generator().manual_seed(case["seed"] + 1)
        extra["pse"] = torch.randn(b, n, s1 if rows else 1, s2, generator=g, dtype=torch.float64).to(case["dtype"])
        extra["pse_type"] = 1
    return q, k, v, dout, lengths, s1, extra


_MAKE_CROSS = feat.make_cross


# ---------------------------------------------------------------------------------------------
# Cross-attention with TND (per-sequence query and key lengths)


def tnd_cross_lengths(world, scheme):
    """(query lengths, key lengths) per sequence, each divisible by W (2W for zigzag): keys longer,
    shorter, equal, and a sequence with no query."""
    u = 2 * world if scheme != "contiguous" else world
    return [u, 3 * u, 0, 2 * u, u], [2 * u, u, u, 2 * u, 3 * u]


def seen_tnd(case, ql, kl):
    """[Tq, Tk] True where query i sees key j, from the spec's predicates: same sequence, and
    the mode's rule with the bottom-right modes 3/4 shifted by d = n_k - n_q of the sequence."""
    mode, pre, nxt = case["mode"], case.get("pre", INT32_MAX), case.get("next", INT32_MAX)
    tq, tk = sum(ql), sum(kl)
    seen = torch.zeros(tq, tk, dtype=torch.bool)
    a = b = 0
    for nq, nk in zip(ql, kl):
        d = nk - nq
        diff = torch.arange(nk)[None, :] - torch.arange(nq)[:, None]
        rule = {0: (diff >= -pre) & (diff <= nxt), 1: torch.ones(nq, nk, dtype=torch.bool), 2: diff <= 0,
                3: diff <= d, 4: (diff >= d - pre) & (diff <= d + nxt)}[mode]
        seen[a:a + nq, b:b + nk] = rule
        a, b = a + nq, b + nk
    return seen


def tnd_cross_cases():
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", f32)
        kw.update(layout="TND", seed=900 + len(c), w=w, kind="tnd-cross")
        c.append(kw)

    add((1, 3), mode=3, comm="ring")
    add((2, 4), mode=1, comm="allgather")
    add((2,), mode=4, pre=5, next=1, comm="ring", scheme="contiguous", keep=KEEP)
    add((4,), mode=2, comm="ulysses", dtype=bf16)
    add((3,), mode=3, comm="allgather", sink=True)
    add((2,), mode=3, comm="ulysses", keep=KEEP)
    add((4,), mode=3, comm="ring", hybrid=True)
    add((), mode=4, pre=3, next=0, comm="allgather", hybrid=True)
    return c


def single_tnd_cross(case, q, k, v, dout, ql, kl, extra, scale, keep):
    return feat.single(case, q, k, v, dout, kl, extra, scale, keep, q_lengths=ql)


def sharded_tnd_cross(case, q, k, v, dout, ql, kl, extra, scale, keep, grp):
    from attnops.torch import cp

    group, ug = grp
    qc, kc = (torch.tensor(x).cumsum(0).tolist() for x in (ql, kl))
    scheme = case.get("scheme", "zigzag")

    def local(t, cum):
        return cp.shard(t, group, seq_dim=0, scheme=scheme, cu_seqlens=cum, ulysses_group=ug)

    lq, lk, lv = local(q, qc).requires_grad_(), local(k, kc).requires_grad_(), local(v, kc).requires_grad_()
    ld = local(dout, qc)
    kw = dict(sparse_mode=case["mode"], pre_tokens=case.get("pre", INT32_MAX), next_tokens=case.get("next", INT32_MAX))
    if "sink" in extra:
        kw["sink"] = extra["sink"].clone().requires_grad_()
    res, fwd, both = feat.attend_and_backward(
        lambda a, b, c, **kw: cp.attention(a, b, c, N, "TND", scale=scale, group=group, ulysses_group=ug,
                                           comm=case["comm"], scheme=scheme, cu_seqlens=qc, cu_seqlens_kv=kc,
                                           keep_prob=keep, seed=SEED, **kw),
        lq, lk, lv, ld, kw)
    return res, (fwd[0], both[0])


def check_tnd_cross(case, world, rank, failures):
    from attnops.torch import cp

    if case.get("hybrid") and world != 4:
        return
    keep = case.get("keep", 1.0)
    scale = 1 / math.sqrt(D)
    scheme = case.get("scheme", "zigzag")
    ql, kl = tnd_cross_lengths(world, scheme)
    dtype = case["dtype"]
    g = torch.Generator().manual_seed(case["seed"])
    q = layout_tensor("TND", 1, N, sum(ql), D, dtype, g)
    k = layout_tensor("TND", 1, NK, sum(kl), D, dtype, g)
    v = layout_tensor("TND", 1, NK, sum(kl), DV, dtype, g)
    dout = layout_tensor("TND", 1, N, sum(ql), DV, dtype, g)
    extra = {}
    if case.get("sink"):
        extra["sink"] = torch.randn(N, generator=g, dtype=torch.float64).float()
    if case["mode"] in (2, 3, 4):
        extra["atten_mask"] = CAUSAL
    grp = groups(case, world)
    qc, kc = (torch.tensor(x).cumsum(0).tolist() for x in (ql, kl))

    def local(t, cum):
        return cp.shard(t, grp[0], seq_dim=0, scheme=scheme, cu_seqlens=cum, ulysses_group=grp[1])

    def sharded_ref(res):
        return [local(res[0], qc), local(res[1], qc), local(res[2], qc), local(res[3], qc), local(res[4], kc),
                local(res[5], kc)] + res[6:]

    want = sharded_ref(single_tnd_cross(case, q, k, v, dout, ql, kl, extra, scale, keep))
    ref32 = None
    if dtype != torch.float32:
        ext32 = {key: (val.float() if val.is_floating_point() else val) for key, val in extra.items()}
        ref32 = sharded_ref(single_tnd_cross(case, *(t.float() for t in (q, k, v, dout)), ql, kl, ext32, scale, keep))
    got, counts = sharded_tnd_cross(case, q, k, v, dout, ql, kl, extra, scale, keep, grp)
    again, _ = sharded_tnd_cross(case, q, k, v, dout, ql, kl, extra, scale, keep, grp)
    tag = f"{case['kind']} W={world} rank={rank} {dict((a, b) for a, b in case.items() if a not in ('w', 'kind'))}"
    feat.compare(tag, case, world, got, again, want, ref32, failures, exact=world == 1 and not case.get("hybrid"))
    if world > 1 and not case.get("hybrid") and case["comm"] in ("ring", "allgather"):
        steps = None
        if case["comm"] == "ring":
            seen = seen_tnd(case, ql, kl)
            qpos = [cp.shard_index(sum(ql), world, r, scheme, cu_seqlens=qc) for r in range(world)]
            kpos = [cp.shard_index(sum(kl), world, r, scheme, cu_seqlens=kc) for r in range(world)]
            steps = 1
            for st in range(world - 1, 0, -1):
                if any(seen[qpos[r]][:, kpos[(r - st) % world]].any() for r in range(world)):
                    steps = st + 1
                    break
        exp = feat.expected_counts(case, world, steps)
        if (counts[0], counts[1]) != exp:
            failures.append(f"{tag}: transfers {counts}, expected {exp}")
    if keep < 1.0 and world == 2:  # dropout must change something (every rank: it is collective)
        plain, _ = sharded_tnd_cross(case, q, k, v, dout, ql, kl, extra, scale, 1.0, grp)
        if torch.equal(feat.bits(plain[0]), feat.bits(got[0])):
            failures.append(f"{tag}: the output with dropout equals the one without")


def check_entry_points(case, world, rank, failures):
    """TND cross-attention through the torch_npu- and flash-attn-style entry points: out and
    every gradient against the plain (single-process) entry point, sharded; flash-attn's
    softmax_lse too."""
    from attnops.torch import cp, flash_attn_varlen_func, npu_fusion_attention

    scheme = case.get("scheme", "zigzag")
    ql, kl = tnd_cross_lengths(world, scheme)
    g = torch.Generator().manual_seed(case["seed"])
    q = layout_tensor("TND", 1, N, sum(ql), D, torch.float32, g)
    k = layout_tensor("TND", 1, NK, sum(kl), D, torch.float32, g)
    v = layout_tensor("TND", 1, NK, sum(kl), DV, torch.float32, g)
    dout = layout_tensor("TND", 1, N, sum(ql), DV, torch.float32, g)
    qc, kc = (torch.tensor(x).cumsum(0) for x in (ql, kl))
    scale = 1 / math.sqrt(D)

    def local(t, cum):
        return cp.shard(t, seq_dim=0, scheme=scheme, cu_seqlens=cum.tolist())

    def run(fn, q, k, v, dout, lse_of):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        res = fn(q, k, v)
        res[0].backward(dout)
        return [res[0].detach(), lse_of(res), q.grad, k.grad, v.grad]

    z = torch.zeros(1, dtype=torch.int32)
    fq, fk = torch.cat([z, qc.int()]), torch.cat([z, kc.int()])
    if case["api"] == "flash":
        def plain(q, k, v):
            return flash_attn_varlen_func(q, k, v, fq, fk, max(ql), max(kl), causal=True, return_attn_probs=True)

        def sharded(q, k, v):
            return cp.flash_attn_varlen_func(q, k, v, fq, fk, max(ql), max(kl), causal=True, return_attn_probs=True,
                                             comm=case["comm"], scheme=scheme)
        want = run(plain, q, k, v, dout, lambda r: r[1].detach())
        lse = want[1]
        want = [local(want[0], qc), local(lse.transpose(0, 1), qc).transpose(0, 1), local(want[2], qc),
                local(want[3], kc), local(want[4], kc)]
        got = run(sharded, local(q, qc), local(k, kc), local(v, kc), local(dout, qc), lambda r: r[1].detach())
    else:
        kw = dict(atten_mask=CAUSAL, scale=scale, sparse_mode=3, actual_seq_qlen=qc.tolist(),
                  actual_seq_kvlen=kc.tolist(), softmax_layout="TND")

        def plain(q, k, v):
            return npu_fusion_attention(q, k, v, N, "TND", **kw)

        def sharded(q, k, v):
            return cp.npu_fusion_attention(q, k, v, N, "TND", comm=case["comm"], scheme=scheme, **kw)
        want = run(plain, q, k, v, dout, lambda r: r[1][..., 0].detach())
        want = [local(want[0], qc), local(want[1], qc), local(want[2], qc), local(want[3], kc), local(want[4], kc)]
        got = run(sharded, local(q, qc), local(k, kc), local(v, kc), local(dout, qc), lambda r: r[1][..., 0].detach())
    tag = f"{case['kind']} W={world} rank={rank} {dict((a, b) for a, b in case.items() if a not in ('w', 'kind'))}"
    feat.expect_matches_plain(tag, ["out", "lse/max", "dq", "dk", "dv"], got, want, world, failures)


def entry_cases():
    c = []

    def add(w, **kw):
        kw.update(seed=1000 + len(c), w=w, kind="tnd-cross-entry")
        c.append(kw)

    add((1, 2), api="flash", comm="allgather")
    add((3,), api="npu", comm="ring")
    add((2,), api="npu", comm="ulysses", scheme="contiguous")
    return c


# ---------------------------------------------------------------------------------------------
# The runs


def all_cases():
    return ([(check_uneven, c) for c in llama3_uneven_cases()] + [(feat.check_case, c) for c in cross_ulysses_cases()]
            + [(check_tnd_cross, c) for c in tnd_cross_cases()] + [(check_entry_points, c) for c in entry_cases()]
            + mpc.all_cases()  # explicit masks and dense pse with TND, cross-attention masks and alibi
            + last.all_cases())  # q_start_idx through npu_fusion_attention, compressed alibi, "whole" cross-attention


def worker(rank, world, store, out_dir, which):
    masks.tnd_lengths = uneven_lengths  # make_inputs' packed lengths: T = 12W + 1 for the llama3 cases
    feat.make_cross = make_cross_pse  # cross-attention inputs with a dense pse where the case names one
    cp_harness.run_cases(rank, world, store, out_dir, all_cases(), cp_harness.in_run(which, world), DEADLINE_S)


def run_world(world, tmp_path, which="default"):
    cp_harness.run_world(worker, world, tmp_path, which, DEADLINE_S)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_cp_gaps_match_single_process(tmp_path, world):
    run_world(world, tmp_path)


@pytest.mark.skipif(not os.environ.get("ATTNOPS_TEST_LONG"), reason="long run: set ATTNOPS_TEST_LONG=1")
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_cp_gaps_long(tmp_path, world):
    """Every case at the worlds the default run leaves out."""
    run_world(world, tmp_path, "long")


# ---------------------------------------------------------------------------------------------
# No processes needed


def test_llama3_uneven_slices():
    from attnops.torch import cp

    cum = [5, 5, 16, 17, 25]  # T = 25 over 2 ranks: 12 and 13 tokens
    assert cp.shard_index(25, 2, 0, "llama3", cu_seqlens=cum).tolist() == list(range(12))
    assert cp.shard_index(25, 2, 1, "llama3", cu_seqlens=cum).tolist() == list(range(12, 25))
    assert cp.llama3_cu_seqlens(cum, 2, 0) == [5, 12]
    assert cp.llama3_cu_seqlens(cum, 2, 1) == [4, 5, 13]
    # T = 10 over 4: 2, 3, 2, 3 tokens; T = 2 over 3: 0, 1, 1.
    assert [cp.shard_index(10, 4, r, "llama3", cu_seqlens=[10]).numel() for r in range(4)] == [2, 3, 2, 3]
    assert [cp.shard_index(2, 3, r, "llama3", cu_seqlens=[2]).tolist() for r in range(3)] == [[], [0], [1]]
    assert cp.llama3_cu_seqlens([2], 3, 0) == []
    # Every token exactly once, in order.
    for t, w in ((25, 4), (7, 3), (3, 4)):
        got = torch.cat([cp.shard_index(t, w, r, "llama3", cu_seqlens=[t]) for r in range(w)])
        assert got.tolist() == list(range(t))


def test_cross_tnd_geometry():
    from attnops.torch import _cp_general as gen

    # Bottom-right causal per sequence: d = 4 - 2 = 2 for sequence 0, 1 - 3 = -2 for sequence 1.
    g = gen.geometry(3, INT32_MAX, 0, None, None, None, 1, batch=1, heads=1, seq_len=5, lengths=[2, 3],
                     kv_lengths=[4, 1])
    assert g.band(0) == (-gen.UNBOUNDED, 2) and g.band(1) == (-gen.UNBOUNDED, -2)
    g = gen.geometry(4, 3, 1, None, None, None, 1, batch=1, heads=1, seq_len=5, lengths=[2, 3], kv_lengths=[4, 1])
    assert g.band(0) == (-1, 3) and g.band(1) == (-5, -1)
    # Mode 6 with per-sequence key lengths (test_cp_mask_pse_cross.py): the plain op's prefix range per sequence.
    with pytest.raises(ValueError, match="prefix\\[0\\] = 1: must be in \\[2, 4\\] \\(Sq = 2, Skv = 4\\)"):
        gen.geometry(6, INT32_MAX, 0, None, [1, 1], None, 1, batch=1, heads=1, seq_len=5, lengths=[2, 3],
                     kv_lengths=[4, 1])


def test_gap_argument_errors(tmp_path):
    from attnops.torch import cp

    with cp_harness.one_process_group(tmp_path):
        q = torch.randn(6, 4, 8)
        kv = torch.randn(10, 4, 8)
        with pytest.raises(ValueError, match="cu_seqlens_kv: given with input_layout BSND"):
            cp.attention(q[None], kv[None], kv[None], 4, "BSND", scale=1.0, cu_seqlens_kv=[10])
        with pytest.raises(ValueError, match="cu_seqlens_kv: 1 sequences: must be as many as the queries' 2"):
            cp.attention(q, kv, kv, 4, "TND", scale=1.0, cu_seqlens=[2, 6], cu_seqlens_kv=[10])
        # "llama3" cross-attention slices the key stream on its own (test_cp_mask_pse_cross.py).
        with pytest.raises(ValueError, match="key: 9 local tokens: rank 0 of 1 holds 10 of the packed key stream"):
            cp.attention(q, kv[:9], kv[:9], 4, "TND", scale=1.0, cu_seqlens=[2, 6], cu_seqlens_kv=[4, 10],
                         scheme="llama3")
        with pytest.raises(ValueError, match="key/value: local token counts 10/9: must equal each other"):
            cp.attention(q, kv, kv[:9], 4, "TND", scale=1.0, cu_seqlens=[2, 6], cu_seqlens_kv=[4, 10])
        with pytest.raises(ValueError, match="key length of sequence 1 5: must be divisible by 2"):
            cp.attention(q, kv[:9], kv[:9], 4, "TND", scale=1.0, cu_seqlens=[2, 6], cu_seqlens_kv=[4, 9])
        with pytest.raises(ValueError, match="query: 5 local tokens: rank 0 of 1 holds 6"):
            cp.attention(q[:5], q[:5], q[:5], 4, "TND", scale=1.0, cu_seqlens=[2, 6], scheme="llama3")
        # W = 1: TND cross-attention is the plain op, bit for bit.
        from attnops.torch import _ops as o
        qc, kc = torch.tensor([2, 6]), torch.tensor([4, 10])
        want = o.flash_attention_score(q, kv, kv, None, None, CAUSAL, qc, kc, None, None, None, None, 0.5, 1.0,
                                       INT32_MAX, 0, 4, "TND", 0, 3, 1, 0, 0)
        got = cp.attention(q, kv, kv, 4, "TND", scale=0.5, sparse_mode=3, cu_seqlens=[2, 6], cu_seqlens_kv=[4, 10])
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1][..., 0])


def _top_left_band_reference(q, k, v, q_lengths, kv_lengths, scale, pre, nxt):
    """Double-precision attention of TND q/k/v ([T, N, D], equal head counts) with the rule's mode 0
    band -pre <= j - i <= nxt counted from each sequence's top-left corner."""
    out, q0, k0 = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64), 0, 0
    for sq, skv in zip(q_lengths, kv_lengths):
        qs, ks, vs = (t.double() for t in (q[q0:q0 + sq], k[k0:k0 + skv], v[k0:k0 + skv]))
        s = torch.einsum("ind,jnd->nij", qs, ks) * scale
        i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
        s = s.masked_fill(~((j - i >= -pre) & (j - i <= nxt)), float("-inf"))
        out[q0:q0 + sq] = torch.einsum("nij,jnd->ind", torch.softmax(s, dim=-1), vs)
        q0, k0 = q0 + sq, k0 + skv
    return out


def test_mode0_band_cross_attention_at_one_rank(tmp_path):
    """W = 1, cross-attention, sparse mode 0 without a mask and a band: the rule's top-left band (as
    at W > 1), with one Skv - Sq for all sequences (the plain op with a shifted mode-4 band) and
    with per-sequence offsets (TND: the block-wise path)."""
    from attnops.torch import cp

    with cp_harness.one_process_group(tmp_path):
        g = torch.Generator().manual_seed(7)
        pre, nxt, scale = 2, 1, 0.5
        for ql, kl in (([6, 6], [10, 10]), ([2, 6], [4, 10]), ([4, 2], [4, 10])):
            q = torch.randn(sum(ql), 2, 8, generator=g)
            k, v = torch.randn(sum(kl), 2, 8, generator=g), torch.randn(sum(kl), 2, 8, generator=g)
            want = _top_left_band_reference(q, k, v, ql, kl, scale, pre, nxt)
            qc, kc = (torch.tensor(x).cumsum(0).tolist() for x in (ql, kl))
            got = cp.attention(q, k, v, 2, "TND", scale=scale, sparse_mode=0, pre_tokens=pre, next_tokens=nxt,
                               cu_seqlens=qc, cu_seqlens_kv=kc)[0]
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6, msg=f"TND {ql} {kl}")
            if len(set(ql)) == 1 and len(set(kl)) == 1:  # the same problem in BSND
                b = len(ql)
                got = cp.attention(q.view(b, ql[0], 2, 8), k.view(b, kl[0], 2, 8), v.view(b, kl[0], 2, 8), 2,
                                   "BSND", scale=scale, sparse_mode=0, pre_tokens=pre, next_tokens=nxt)[0]
                torch.testing.assert_close(got.double().reshape(want.shape), want, rtol=1e-5, atol=1e-6,
                                           msg=f"BSND {ql} {kl}")
