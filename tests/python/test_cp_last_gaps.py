"""attnops.torch.cp: the last three refusals lifted, over W = 1, 2, 3 gloo processes (W = 4 and
the extra worlds of each case: ATTNOPS_TEST_LONG=1). The multi-process cases run in test_cp_gaps'
processes (one start-up per W for all of them); this module holds them and the checks that need
no process:
- q_start_idx / kv_start_idx through cp.npu_fusion_attention (torch_npu's keyword names): the
  alibi offsets of the global problem, compared with the plain npu_fusion_attention on the whole
  problem with the same offsets;
- the compressed 1024-row alibi pse form ([B|1, N, 1024, W], spec 2.5) on the block-wise path
  (each block's bias expanded from its global positions), fixed layouts (S > 1024) and TND, ring,
  all-gather, Ulysses and scheme "whole";
- TND cross-attention with scheme "whole": sequences assigned by the query lengths, each
  sequence's keys on its queries' rank (cp.shard(key, ..., assign_by=cu_seqlens_q)), with masks,
  dense pse, prefix, sinks and dropout.

Same rules as test_cp_mask_pse_cross (whose check runs the mask/pse cases): every output,
statistic and gradient against the single-process attnops op on the whole problem, sharded the
same way: fp32 within 1e-5 relative; bf16 within 2x the single-process bf16 op's error against
the single-process fp32 op (plus reference.ABS_TOL); W = 1 bit for bit; a second run gives the
same bits; the transfers of ring and all-gather asserted.
"""

from __future__ import annotations

import math

import pytest
import torch

import cp_harness
import test_cp_features as feat
import test_cp_mask_pse_cross as mpc
from test_context_parallel import bits, layout_tensor
from test_context_parallel_masks import B, CAUSAL, D, DV, INT32_MAX, N, NK, SEQ_DIM

KEEP = feat.KEEP


# ---------------------------------------------------------------------------------------------
# The compressed alibi form and cross-attention with scheme "whole" (test_cp_mask_pse_cross' check)


def cases():
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, kind, layout="TND", **kw):
        kw.setdefault("dtype", f32)
        kw.update(kind=kind, layout=layout, seed=1300 + len(c), w=w)
        c.append(kw)

    # The compressed alibi form: TND (every sequence Sq = Skv <= W; one batch row per sequence or one for all).
    add((1, 3), "compressed", mode=3, pse="compressed", pse_batch=True, comm="ring")
    add((2,), "compressed", mode=0, pre=5, next=0, mask="max", pse="compressed", comm="allgather",
        scheme="contiguous")
    add((3,), "compressed", mode=2, pse="compressed", pse_type=0, pse_batch=True, comm="ulysses", dtype=bf16)
    add((2,), "compressed", mode=3, pse="compressed", pse_batch=True, comm="ring", scheme="whole", keep=KEEP)
    add((3,), "compressed", mode=3, pse="compressed", comm="ring", scheme="llama3", sink=True)
    # TND cross-attention with whole sequences: keys follow their queries' rank.
    add((1, 3), "whole-cross", cross=True, scheme="whole", mode=3, pse="dense", comm="ring")
    add((2,), "whole-cross", cross=True, scheme="whole", mode=0, pre=6, next=1, mask="packed", sink=True,
        keep=KEEP, comm="ring")
    add((3,), "whole-cross", cross=True, scheme="whole", mode=6, pse="alibi3", comm="ring")
    add((2,), "whole-cross", cross=True, scheme="whole", mode=1, mask="max", pse="rows", comm="ring", dtype=bf16)
    add((3,), "whole-cross", cross=True, scheme="whole", few=True, mode=3, sink=True, keep=KEEP, comm="ring")
    return c


# ---------------------------------------------------------------------------------------------
# The compressed alibi form with fixed layouts: S > 1024, so fewer heads than the shared constants


FIXED_S, FIXED_B, FIXED_N, FIXED_NK = 1032, 1, 2, 1  # S = 1032: 2W chunks for W = 1, 2, 3, 4
ULYSSES_N = 12  # query heads divisible by every W of the long run


def fixed_cases():
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", torch.float32)
        kw.update(seed=1350 + len(c), w=w, kind="compressed-fixed")
        c.append(kw)

    add((1, 2), layout="BSND", mode=3, comm="ring")
    add((3,), layout="SBH", mode=0, next=0, comm="allgather", pse_batch=True)
    add((2,), layout="BNSD", mode=2, comm="ulysses", pse_type=0, scheme="contiguous", heads=ULYSSES_N)
    add((2,), layout="BSH", mode=3, comm="ring", dtype=torch.bfloat16)
    return c


def check_compressed_fixed(case, world, rank, failures):
    """cp.attention with the compressed alibi form [B|1, N, 1024, S] (S = 1032) against the plain
    op on the whole problem (sharded), every output, statistic and gradient; the transfers of ring
    and all-gather asserted."""
    from attnops.torch import _ops, cp

    layout, dtype, mode = case["layout"], case["dtype"], case["mode"]
    scheme = case.get("scheme", "zigzag")
    g = torch.Generator().manual_seed(case["seed"])
    s, b, n, nk = FIXED_S, FIXED_B, case.get("heads", FIXED_N), FIXED_NK
    q, k, v, dout = (layout_tensor(layout, b, h, s, d, dtype, g) for h, d in ((n, D), (nk, D), (nk, DV), (n, DV)))
    comp = torch.randn(b if case.get("pse_batch") else 1, n, 1024, s, generator=g).to(dtype)
    pse_type = case.get("pse_type", 1)
    mask = (torch.rand(s, s, generator=g) < 0.3) if mode == 0 else CAUSAL
    pre, nxt = case.get("pre", INT32_MAX), case.get("next", INT32_MAX)
    scale = 1 / math.sqrt(D)
    dim, stat_dim = SEQ_DIM[layout], 2

    def single(q, k, v, dout, comp):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        out, mx, sm = _ops.flash_attention_score(q, k, v, comp, None, mask, None, None, None, None, None, None, scale,
                                                 1.0, pre, nxt, n, layout, 0, mode, pse_type, 0, 0)
        out.backward(dout)
        return [out.detach(), mx[..., 0], sm[..., 0], q.grad, k.grad, v.grad]

    def local(t, d=dim):
        return cp.shard(t, seq_dim=d, scheme=scheme)

    def sharded_ref(res):
        return [local(res[0]), local(res[1], stat_dim), local(res[2], stat_dim)] + [local(t) for t in res[3:]]

    want = sharded_ref(single(q, k, v, dout, comp))
    ref32 = None
    if dtype != torch.float32:
        ref32 = sharded_ref(single(q.float(), k.float(), v.float(), dout.float(), comp.float()))
    kw = dict(sparse_mode=mode, pre_tokens=pre, next_tokens=nxt, pse=comp, pse_type=pse_type)
    if mode == 0:
        kw["atten_mask"] = mask

    def sharded():
        lq, lk, lv = (local(t).requires_grad_() for t in (q, k, v))
        return feat.attend_and_backward(
            lambda a, b_, c, **kw: cp.attention(a, b_, c, n, layout, scale=scale, comm=case["comm"], scheme=scheme,
                                                **kw), lq, lk, lv, local(dout), kw)

    got, fwd, both = sharded()
    again = sharded()[0]
    tag = f"compressed-fixed W={world} rank={rank} {dict((a, b) for a, b in case.items() if a not in ('w', 'kind'))}"
    feat.compare(tag, case, world, got, again, want, ref32, failures, exact=world == 1)
    exp = feat.expected_counts(case, world)  # causal zigzag / masked blocks: every ring step has work
    if exp is not None and (fwd[0], both[0]) != exp:
        failures.append(f"{tag}: transfers {(fwd[0], both[0])}, expected {exp}")


# ---------------------------------------------------------------------------------------------
# q_start_idx / kv_start_idx through cp.npu_fusion_attention


def start_idx_cases():
    c = []

    def add(w, **kw):
        kw.update(seed=1400 + len(c), w=w, kind="start-idx")
        c.append(kw)

    add((1, 3), layout="BSND", pse_type=2, comm="ring", starts=([5], [2]))
    add((2,), layout="SBH", pse_type=3, comm="ulysses", starts=([0], [7]), mode=4, pre=6, next=2)
    add((2, 3), layout="TND", pse_type=2, comm="allgather", starts=([3], [1]))
    add((2,), layout="TND", pse_type=3, comm="ring", scheme="whole", starts=([2], [9]))
    return c


def check_start_idx(case, world, rank, failures):
    """cp.npu_fusion_attention with alibi slopes and q_start_idx / kv_start_idx: out, softmax_max,
    softmax_sum and every gradient against the plain npu_fusion_attention on the whole problem with
    the same offsets (sharded); W = 1 bit for bit; two runs give the same bits."""
    from attnops.torch import cp, npu_fusion_attention

    layout, scheme = case["layout"], case.get("scheme", "zigzag")
    g = torch.Generator().manual_seed(case["seed"])
    if layout == "TND":
        lens = [5, 0, 13, 2] if scheme == "whole" else [2 * world, 6 * world, 0, 4 * world]
        s = sum(lens)
        cum = torch.tensor(lens).cumsum(0).tolist()
        tnd = dict(actual_seq_qlen=cum, actual_seq_kvlen=cum, softmax_layout="TND")
    else:
        s, cum, tnd = 4 * world * 3, None, {}
    q = layout_tensor(layout, B, N, s, D, torch.float32, g)
    k = layout_tensor(layout, B, NK, s, D, torch.float32, g)
    v = layout_tensor(layout, B, NK, s, DV, torch.float32, g)
    dout = layout_tensor(layout, B, N, s, DV, torch.float32, g)
    slopes = (torch.rand(N, generator=g, dtype=torch.float64) * 0.5).float()
    qs, ks = case["starts"]
    mode = case.get("mode", 3)
    kw = dict(pse=slopes, pse_type=case["pse_type"], atten_mask=CAUSAL, sparse_mode=mode, scale=1 / math.sqrt(D),
              pre_tockens=case.get("pre", INT32_MAX), next_tockens=case.get("next", INT32_MAX), **tnd)
    dim, stat_dim = SEQ_DIM[layout], (0 if layout == "TND" else 2)

    def local(t, d=dim):
        return cp.shard(t, seq_dim=d, scheme=scheme, cu_seqlens=cum)

    def run(fn, q, k, v, dout, **extra):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        res = fn(q, k, v, N, layout, **kw, **extra)
        res[0].backward(dout)
        return [res[0].detach(), res[1][..., 0], res[2][..., 0], q.grad, k.grad, v.grad]

    plain = run(npu_fusion_attention, q, k, v, dout, q_start_idx=qs, kv_start_idx=ks)
    want = [local(plain[0]), local(plain[1], stat_dim), local(plain[2], stat_dim)] + [local(t) for t in plain[3:]]
    args = (local(q), local(k), local(v), local(dout))
    got = run(cp.npu_fusion_attention, *args, comm=case["comm"], scheme=scheme, q_start_idx=qs, kv_start_idx=ks)
    again = run(cp.npu_fusion_attention, *args, comm=case["comm"], scheme=scheme, q_start_idx=qs, kv_start_idx=ks)
    tag = f"start-idx W={world} rank={rank} {dict((a, b) for a, b in case.items() if a not in ('w', 'kind'))}"
    names = ["out", "softmax_max", "softmax_sum", "dq", "dk", "dv"]
    feat.expect_matches_plain(tag, names, got, want, world, failures)
    for name, a, b in zip(names, got, again):
        if not torch.equal(bits(a), bits(b)):
            failures.append(f"{tag}: {name} differs between two runs")
    # The offsets must matter (else the test could not fail): the plain op without them differs.
    if torch.equal(run(npu_fusion_attention, q, k, v, dout)[0], plain[0]):
        failures.append(f"{tag}: q_start_idx / kv_start_idx change nothing in the plain op")


def all_cases():
    return ([(mpc.check_case, c) for c in cases()] + [(check_compressed_fixed, c) for c in fixed_cases()]
            + [(check_start_idx, c) for c in start_idx_cases()])


# ---------------------------------------------------------------------------------------------
# No processes needed


def test_compressed_alibi_expansion_is_the_full_bias():
    """The block expansion of the compressed form (the last 1024 rows of a Toeplitz alibi bias,
    spec 2.5: compressed = full[:, :, -1024:, :]) equals the full bias on and below the diagonal,
    for blocks anywhere in the sequence (rows before S - 1024 included), and 0 above it."""
    from attnops.torch import _cp_general as gen

    s, heads = 1100, 3
    slopes = torch.tensor([0.5, 0.25, 0.125]).view(1, heads, 1, 1)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    full = -slopes * (i - j).abs().float()  # [1, N, S, S]
    comp = full[:, :, -1024:, :].contiguous()
    for q0, a, k0, c in ((0, 40, 0, 40), (5, 40, 3, 50), (700, 64, 650, 100), (1090, 10, 0, 1100), (3, 7, 20, 9)):
        got = gen.expand_compressed_alibi(comp, q0, a, k0, c)
        want = full[:, :, q0:q0 + a, k0:k0 + c]
        below = (torch.arange(k0, k0 + c)[None, :] <= torch.arange(q0, q0 + a)[:, None]).expand_as(got)
        assert torch.equal(got[below], want[below]), (q0, a, k0, c)
        assert not got[~below].any(), (q0, a, k0, c)


def test_compressed_alibi_rules():
    """The form's rules, as the plain op checks them: which shapes are compressed, and every refusal
    names the argument, the value and the rule."""
    from attnops.torch import _cp_general as gen

    comp = torch.zeros(1, 2, 1024, 6)

    def geo(mode, pse, lengths=None, kv_lengths=None, seq_len=5, kv_len=None, mask=None, nxt=0):
        return gen.geometry(mode, INT32_MAX, nxt, mask, None, pse, 1, batch=1, heads=2, seq_len=seq_len,
                            lengths=lengths, kv_lengths=kv_lengths, kv_len=kv_len)

    assert geo(3, comp, [2, 3], [2, 3]).pse_compressed
    assert geo(0, comp, [2, 3], [2, 3], mask=torch.zeros(3, 3, dtype=torch.bool)).pse_compressed
    assert geo(2, torch.zeros(1, 2, 1024, 1100), seq_len=1100).pse_compressed
    dense = geo(3, torch.zeros(1, 2, 1024, 1024), seq_len=1024)  # S1 = 1024: the dense form
    assert not dense.pse_compressed
    with pytest.raises(ValueError, match="pse: shape \\[1, 2, 1024, 6\\]: the compressed alibi form needs Sq_i == "
                                         "Skv_i <= W = 6 for every sequence; sequence 0 has Sq = 2, Skv = 4"):
        geo(3, comp, [2, 3], [4, 1])
    with pytest.raises(ValueError, match="needs Sq_i == Skv_i <= W = 6 .* sequence 1 has Sq = 7, Skv = 7"):
        geo(3, comp, [2, 7], [2, 7])
    with pytest.raises(ValueError, match="lower-triangular mask .* got sparse_mode 1"):
        geo(1, comp, [2, 3], [2, 3])
    with pytest.raises(ValueError, match="lower-triangular mask .* got sparse_mode 0, next_tokens 1"):
        geo(0, comp, [2, 3], [2, 3], mask=torch.zeros(3, 3, dtype=torch.bool), nxt=1)
    with pytest.raises(ValueError, match="got sparse_mode 0, next_tokens 0, no atten_mask"):
        geo(0, comp, [2, 3], [2, 3])
    with pytest.raises(ValueError, match="\\[B\\|1, N, 1024, W\\] with B = the number of sequences = 2, N = 2"):
        geo(3, torch.zeros(3, 2, 1024, 6), [2, 3], [2, 3])
    with pytest.raises(ValueError, match="needs S1 == S2 > 1024 and W == S2; got S1 = 1030, S2 = 1030"):
        geo(3, torch.zeros(1, 2, 1024, 1031), seq_len=1030)
    with pytest.raises(ValueError, match="got S1 = 1000, S2 = 1000"):
        geo(3, torch.zeros(1, 2, 1024, 1000), seq_len=1000)


def test_whole_assignment_of_keys():
    """Keys follow their queries: shard_whole / whole_index with assign_by place every key sequence
    on the rank of its queries, whatever the keys' own lengths would assign."""
    from attnops.torch import cp

    qc, kc = [5, 5, 18, 20, 27], [9, 12, 16, 18, 30]  # query lengths 5, 0, 13, 2, 7; key 9, 3, 4, 2, 12
    owner = cp.assign_sequences(qc, 2)
    assert owner == [1, 1, 0, 1, 1]  # 13 -> rank 0 (169); 7, 5, 2, 0 -> rank 1 (49 + 25 + 4 + 0 < 169)
    assert cp.assign_sequences(kc, 2) != owner  # the keys' own lengths would place them elsewhere
    k_starts = [0] + kc[:-1]
    for r in range(2):
        want = [p for a, b, o in zip(k_starts, kc, owner) if o == r for p in range(a, b)]
        assert cp.whole_index(kc, 2, r, assign_by=qc).tolist() == want
    assert cp.whole_cu_seqlens(kc, 2, 0, assign_by=qc) == [4]
    assert cp.whole_cu_seqlens(kc, 2, 1, assign_by=qc) == [9, 12, 14, 26]
    with pytest.raises(ValueError, match="assign_by: 4 sequences: must be as many as cu_seqlens' 5"):
        cp.whole_index(kc, 2, 0, assign_by=qc[:4])


def test_last_gaps_argument_errors(tmp_path):
    from attnops.torch import cp

    with cp_harness.one_process_group(tmp_path):
        q = torch.randn(1, 8, 4, 8)
        t = torch.randn(12, 4, 8)
        with pytest.raises(ValueError, match="q_start_idx: given with pse_type 1 and no pse: only alibi slopes"):
            cp.npu_fusion_attention(q, q, q, 4, "BSND", q_start_idx=[0])
        with pytest.raises(ValueError, match="kv_start_idx: given with pse_type 1: only alibi slopes"):
            cp.npu_fusion_attention(q, q, q, 4, "BSND", pse=torch.zeros(1, 4, 8, 8), kv_start_idx=[1])
        with pytest.raises(ValueError, match="assign_by: given with scheme 'zigzag': only scheme 'whole'"):
            cp.shard(t, seq_dim=0, cu_seqlens=[4, 12], assign_by=[6, 12])
        # Keys sharded by their own lengths instead of their queries' assignment: the rule is named.
        kv = torch.randn(14, 4, 8)
        with pytest.raises(ValueError, match="key: shape \\[13, 4, 8\\]: rank 0 holds 14 tokens .* keys follow their "
                                             "queries' rank"):
            cp.attention(t, kv[:13], kv[:13], 4, "TND", scale=1.0, scheme="whole", cu_seqlens=[4, 12],
                         cu_seqlens_kv=[6, 14])
        with pytest.raises(ValueError, match="cu_seqlens_kv: 1 sequences: must be as many as the queries' 2"):
            cp.attention(t, kv, kv, 4, "TND", scale=1.0, scheme="whole", cu_seqlens=[4, 12], cu_seqlens_kv=[14])
        # W = 1: cross-attention with scheme "whole" and q_start_idx through npu_fusion_attention are the plain op.
        from attnops.torch import npu_fusion_attention
        slopes = torch.rand(4)
        kw = dict(pse=slopes, pse_type=2, q_start_idx=[3], kv_start_idx=[1], atten_mask=CAUSAL, sparse_mode=3,
                  actual_seq_qlen=[4, 12], actual_seq_kvlen=[6, 14])
        want = npu_fusion_attention(t, kv, kv, 4, "TND", **kw)
        got = cp.npu_fusion_attention(t, kv, kv, 4, "TND", scheme="whole", **kw)
        assert all(torch.equal(a, b) for a, b in zip(got[:3], want[:3]))
        got = cp.npu_fusion_attention(t, kv, kv, 4, "TND", **kw)
        assert all(torch.equal(a, b) for a, b in zip(got[:3], want[:3]))
        # ... and cp.flash_attn_varlen_func with scheme "whole" and cu_seqlens_k != cu_seqlens_q.
        from attnops.torch import flash_attn_varlen_func
        fq, fk = torch.tensor([0, 4, 12], dtype=torch.int32), torch.tensor([0, 6, 14], dtype=torch.int32)
        want = flash_attn_varlen_func(t, kv, kv, fq, fk, 8, 8, causal=True, return_attn_probs=True)
        got = cp.flash_attn_varlen_func(t, kv, kv, fq, fk, 8, 8, causal=True, return_attn_probs=True, scheme="whole")
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
