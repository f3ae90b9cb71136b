"""attnops.torch.cp: explicit masks and dense pse with packed (TND) input, and the cross-attention
masks and biases, over W = 1, 2, 3 gloo processes (every case at every W, the hybrid at W = 4:
ATTNOPS_TEST_LONG=1). The multi-process cases run in test_cp_gaps' processes (one start-up per W
for both modules: start-up dominates these small shapes); this module holds them and the checks
that need no process:
- TND with an explicit global mask in either of the plain op's forms, [maxSq, maxSkv] (every
  sequence from its start) or [T1, T2] (packed rows), and a dense global pse, flattened
  [sum N*Sq_i*Skv_i] or row-broadcast [sum N*Skv_i] (spec 2.2, 2.5): sequence-sharded (zigzag,
  contiguous), packed-stream ("llama3") and whole-sequence schemes, ring, all-gather and Ulysses;
- cross-attention (S1 != S2; TND: per-sequence key lengths) with the prefix modes 5/6, the TND
  split modes 7/8 and alibi slopes (pse_type 2/3), TND cross-attention over "llama3" slices (the
  packed query and key streams each cut into W slices, uneven), and flash-attn's alibi distance
  |i + Sk - Sq - j| through cp.flash_attn_func / flash_attn_varlen_func.

Every output, statistic and gradient is compared with the single-process attnops op on the whole
problem (same keep_prob and seed), sharded the same way: fp32 within 1e-5 relative; bf16 within 2x
the single-process bf16 op's error against the single-process fp32 op (plus reference.ABS_TOL);
W = 1 bit for bit; a second run gives the same bits; the transfers of ring and all-gather
asserted, the ring's step count derived from the spec's mask predicates (written out here, not
taken from the code under test).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import cp_harness
import test_cp_features as feat
from test_context_parallel import layout_tensor
from test_context_parallel_masks import B, CAUSAL, D, DV, INT32_MAX, N, NK, PREFIX_MASK, SEQ_DIM, groups

DEADLINE_S = 600
KEEP, SEED = feat.KEEP, feat.SEED


# ---------------------------------------------------------------------------------------------
# Inputs


def lengths_of(case, world):
    """(query lengths, key lengths) per packed sequence (TND), or None."""
    if case["layout"] != "TND":
        return None
    scheme = case.get("scheme", "zigzag")
    if case.get("cross") and scheme == "whole":  # uneven; a sequence with keys but no query
        if case.get("few"):  # two sequences: ranks without one at W >= 3
            return [5, 13], [9, 4]
        return [5, 0, 13, 2, 7], [9, 3, 4, 2, 12]
    if case.get("cross") and scheme == "llama3":  # T1 = 25, T2 = 30: slices uneven at most W; empty pieces
        return [5, 0, 11, 1, 8], [9, 3, 4, 2, 12]
    if case.get("cross"):
        from test_cp_gaps import tnd_cross_lengths  # (test_cp_gaps runs these cases: imported here, no cycle)
        return tnd_cross_lengths(world, scheme)
    if scheme == "whole":
        ql = [5, 0, 13, 2]  # uneven, one empty; ranks without a sequence at W >= 4
    elif scheme == "llama3":
        ql = feat.tnd_lengths(world, "llama3")  # slice boundaries inside sequences
    else:
        ql = [2 * world, 6 * world, 0, 4 * world]
    return ql, ql


def make(case, world):
    """q, k, v, dout, lengths, (S1, S2), and the op's extra arguments (global tensors)."""
    layout, dtype = case["layout"], case["dtype"]
    g = torch.Generator().manual_seed(case["seed"])
    lens = lengths_of(case, world)
    if lens is not None:
        s1, s2 = sum(lens[0]), sum(lens[1])
    elif case.get("seq"):  # self-attention of a given length (the compressed alibi form needs S > 1024)
        s1 = s2 = case["seq"]
    else:
        s1, s2 = 4 * world * 3, 4 * world * case.get("kv_chunk", 3)
    q = layout_tensor(layout, B, N, s1, D, dtype, g)
    k = layout_tensor(layout, B, NK, s2, D, dtype, g)
    v = layout_tensor(layout, B, NK, s2, DV, dtype, g)
    dout = layout_tensor(layout, B, N, s1, DV, dtype, g)
    extra = {}
    mode = case["mode"]
    mask = case.get("mask")
    if mask is not None:
        shape = {"max": lambda: (max(lens[0]), max(lens[1])), "packed": lambda: (s1, s2),
                 "2d": lambda: (s1, s2), "4d": lambda: (B, 1, s1, s2)}[mask]()
        extra["atten_mask"] = torch.rand(shape, generator=g, dtype=torch.float64) < 0.3
    elif mode in (2, 3, 4, 7, 8):
        extra["atten_mask"] = CAUSAL
    elif mode == 6:
        extra["atten_mask"] = PREFIX_MASK
    pse = case.get("pse")
    if pse in ("dense", "rows"):
        if lens is not None:
            n = sum(N * (a if pse == "dense" else 1) * b for a, b in zip(*lens))
            extra["pse"] = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
        else:
            extra["pse"] = torch.randn(B, N, s1 if pse == "dense" else 1, s2, generator=g,
                                       dtype=torch.float64).to(dtype)
        extra["pse_type"] = case.get("pse_type", 1)
    elif pse == "compressed":  # [B|1, N, 1024, W]: the op reads row 1023 only; the other rows are noise
        rows = (len(lens[0]) if lens is not None else B) if case.get("pse_batch") else 1
        cols = max(lens[1]) + 3 if lens is not None else s2
        extra["pse"] = torch.randn(rows, N, 1024, cols, generator=g, dtype=torch.float32).to(dtype)
        extra["pse_type"] = case.get("pse_type", 1)
    elif pse in ("alibi2", "alibi3"):
        extra["pse"] = (torch.rand(N, generator=g, dtype=torch.float64) * 0.5).float()
        extra["pse_type"] = int(pse[-1])
    if case.get("sink"):
        extra["sink"] = torch.randn(N, generator=g, dtype=torch.float64).float()
    if mode in (5, 6):
        pairs = list(zip(*lens)) if lens is not None else [(s1, s2)] * B
        extra["prefix"] = [int(torch.randint(0 if a > b else b - a, b + 1, (1,), generator=g)) for a, b in pairs]
    return q, k, v, dout, lens, (s1, s2), extra


def seen_pairs(case, lens, s12, extra):
    """[S1, S2] True where a query sees a key (in some batch row or head), from the spec's
    predicates (2.6; TND per sequence, the bottom-right origin at Skv_i - Sq_i)."""
    mode, pre, nxt = case["mode"], case.get("pre", INT32_MAX), case.get("next", INT32_MAX)
    mask = extra.get("atten_mask") if mode in (0, 1, 5) and case.get("mask") else None
    if mask is not None and mask.dim() == 4:
        mask = mask.flatten(0, 1).all(0)  # seen if some batch row sees it
    seqs = list(zip(*lens)) if lens is not None else [s12]
    seen = torch.zeros(*s12, dtype=torch.bool)
    live = [i for i, (a, b) in enumerate(seqs) if a and b]
    a0 = b0 = 0
    for i, (nq, nk) in enumerate(seqs):
        d = nk - nq
        diff = torch.arange(nk)[None, :] - torch.arange(nq)[:, None]
        band_br = (diff >= d - pre) & (diff <= d + nxt)
        rule = {0: (diff >= -pre) & (diff <= nxt), 1: torch.ones(nq, nk, dtype=torch.bool), 2: diff <= 0,
                3: diff <= d, 4: band_br, 5: diff <= d, 6: diff <= d,
                7: band_br if live and i == live[-1] else diff <= d,
                8: band_br if live and i == live[0] else diff <= 0}[mode]
        if mode in (5, 6):
            pref = extra["prefix"][i] if lens is not None else max(extra["prefix"])
            rule = rule | (torch.arange(nk)[None, :] < pref)
        if mask is not None:
            if lens is None or case["mask"] == "packed":
                rule = rule & ~mask[a0:a0 + nq, b0:b0 + nk]
            else:
                rule = rule & ~mask[:nq, :nk]
        seen[a0:a0 + nq, b0:b0 + nk] = rule
        a0, b0 = a0 + nq, b0 + nk
    return seen


# ---------------------------------------------------------------------------------------------
# The check


def single(case, q, k, v, dout, lens, extra, keep):
    if lens is None:
        return feat.single(case, q, k, v, dout, None, extra, 1 / math.sqrt(D), keep)
    return feat.single(case, q, k, v, dout, lens[1], extra, 1 / math.sqrt(D), keep, q_lengths=lens[0])


def sharded(case, q, k, v, dout, lens, extra, keep, grp):
    from attnops.torch import cp

    group, ug = grp
    layout, dim = case["layout"], SEQ_DIM[case["layout"]]
    scheme = case.get("scheme", "zigzag")
    qc, kc = ((torch.tensor(x).cumsum(0).tolist() for x in lens) if lens is not None else (None, None))

    def local(t, cum):
        return cp.shard(t, group, seq_dim=dim, scheme=scheme, cu_seqlens=cum, ulysses_group=ug,
                        assign_by=qc if scheme == "whole" else None)

    lq, lk, lv = local(q, qc).requires_grad_(), local(k, kc).requires_grad_(), local(v, kc).requires_grad_()
    kw = feat.mask_kwargs(case, extra)
    if lens is not None and case.get("cross"):
        kw["cu_seqlens_kv"] = kc
    res, fwd, both = feat.attend_and_backward(
        lambda a, b, c, **kw: cp.attention(a, b, c, N, layout, scale=1 / math.sqrt(D), group=group, ulysses_group=ug,
                                           comm=case["comm"], scheme=scheme, cu_seqlens=qc, keep_prob=keep,
                                           seed=SEED, **kw),
        lq, lk, lv, local(dout, qc), kw)
    return res, (fwd[0], both[0])


def check_case(case, world, rank, failures):
    from attnops.torch import cp

    if case.get("hybrid") and world != 4:
        return
    keep = case.get("keep", 1.0)
    q, k, v, dout, lens, s12, extra = make(case, world)
    grp = groups(case, world)
    layout, scheme = case["layout"], case.get("scheme", "zigzag")
    dim, stat_dim = SEQ_DIM[layout], (0 if layout == "TND" else 2)
    qc, kc = ((torch.tensor(x).cumsum(0).tolist() for x in lens) if lens is not None else (None, None))

    def local(t, seq_dim, cum):
        return cp.shard(t, grp[0], seq_dim=seq_dim, scheme=scheme, cu_seqlens=cum, ulysses_group=grp[1],
                        assign_by=qc if scheme == "whole" else None)

    def sharded_ref(res):
        return ([local(res[0], dim, qc), local(res[1], stat_dim, qc), local(res[2], stat_dim, qc),
                 local(res[3], dim, qc), local(res[4], dim, kc), local(res[5], dim, kc)] + res[6:])

    want = sharded_ref(single(case, q, k, v, dout, lens, extra, keep))
    ref32 = None
    if case["dtype"] != torch.float32:
        ext32 = {key: (val.float() if isinstance(val, torch.Tensor) and val.is_floating_point() else val)
                 for key, val in extra.items()}
        ref32 = sharded_ref(single(case, *(t.float() for t in (q, k, v, dout)), lens, ext32, keep))
    got, counts = sharded(case, q, k, v, dout, lens, extra, keep, grp)
    again, _ = sharded(case, q, k, v, dout, lens, extra, keep, grp)
    tag = f"{case['kind']} W={world} rank={rank} {dict((a, b) for a, b in case.items() if a not in ('w', 'kind'))}"
    feat.compare(tag, case, world, got, again, want, ref32, failures, exact=world == 1 and not case.get("hybrid"))
    if world > 1 and not case.get("hybrid") and scheme != "whole" and case["comm"] in ("ring", "allgather"):
        steps = None
        if case["comm"] == "ring":
            seen = seen_pairs(case, lens, s12, extra)
            qpos = [cp.shard_index(s12[0], world, r, scheme, cu_seqlens=qc) for r in range(world)]
            kpos = [cp.shard_index(s12[1], world, r, scheme, cu_seqlens=kc) for r in range(world)]
            steps = 1
            for st in range(world - 1, 0, -1):
                if any(seen[qpos[r]][:, kpos[(r - st) % world]].any() for r in range(world)):
                    steps = st + 1
                    break
        exp = feat.expected_counts(case, world, steps)
        if counts != exp:
            failures.append(f"{tag}: transfers {counts}, expected {exp}")
    if keep < 1.0 and world == 2:  # dropout must change something (every rank: it is collective)
        plain, _ = sharded(case, q, k, v, dout, lens, extra, 1.0, grp)
        if torch.equal(feat.bits(plain[0]), feat.bits(got[0])):
            failures.append(f"{tag}: the output with dropout equals the one without")


def cases():
    """Every case with the worlds it runs at by default (``w``); ATTNOPS_TEST_LONG=1 runs the
    others (W = 4, the hybrid)."""
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, kind, layout="TND", **kw):
        kw.setdefault("dtype", f32)
        kw.update(kind=kind, layout=layout, seed=1100 + len(c), w=w)
        c.append(kw)

    # Packed sequences with an explicit global mask and a dense global pse.
    add((1, 3), "tnd-mask", mode=0, pre=5, next=1, mask="max", comm="ring")
    add((2,), "tnd-mask", mode=1, mask="packed", pse="dense", comm="allgather", scheme="contiguous")
    add((3,), "tnd-pse", mode=3, pse="dense", pse_type=0, comm="ulysses")
    add((2,), "tnd-mask", mode=1, mask="max", pse="rows", comm="ring", sink=True, keep=KEEP)
    add((3,), "tnd-mask", mode=0, pre=3, next=3, mask="packed", pse="dense", comm="allgather", dtype=bf16)
    add((2,), "tnd-mask", mode=1, mask="packed", pse="dense", comm="ring", scheme="llama3")
    add((1, 3), "tnd-whole", mode=0, pre=4, next=0, mask="max", pse="dense", comm="ring", scheme="whole")
    add((2,), "tnd-whole", mode=0, pre=6, next=2, mask="packed", pse="rows", comm="ring", scheme="whole", keep=KEEP)
    add((), "tnd-mask", mode=1, mask="packed", pse="dense", comm="ring", hybrid=True)
    add((), "tnd-mask", mode=0, pre=2, next=6, mask="max", pse="rows", comm="ulysses", scheme="contiguous")
    # Packed cross-attention (per-sequence key lengths): masks, pse, the prefix and split modes, alibi.
    add((3,), "tnd-cross", cross=True, mode=3, pse="dense", comm="ring")
    add((2,), "tnd-cross", cross=True, mode=0, pre=4, next=2, mask="max", comm="allgather")
    add((3,), "tnd-cross", cross=True, mode=1, mask="packed", pse="rows", comm="ulysses")
    add((1, 2), "tnd-cross", cross=True, mode=6, comm="ring")
    add((3,), "tnd-cross", cross=True, mode=7, pre=8, next=0, comm="allgather", pse="alibi2")
    add((2,), "tnd-cross", cross=True, mode=8, pre=3, next=1, comm="ring", pse="alibi3", keep=KEEP)
    add((3,), "tnd-cross", cross=True, mode=3, comm="ulysses", pse="alibi2", sink=True)
    add((), "tnd-cross", cross=True, mode=6, comm="ring", hybrid=True, pse="alibi2")
    # Packed cross-attention over slices of the packed query and key streams ("llama3"), uneven.
    add((1, 2), "tnd-cross", cross=True, scheme="llama3", mode=3, comm="ring")
    add((3,), "tnd-cross", cross=True, scheme="llama3", mode=1, mask="packed", pse="dense", comm="allgather")
    add((2,), "tnd-cross", cross=True, scheme="llama3", mode=4, pre=3, next=1, comm="ulysses", keep=KEEP)
    add((), "tnd-cross", cross=True, scheme="llama3", mode=3, comm="ring", hybrid=True, sink=True)
    # Fixed layouts, cross-attention (S1 != S2): the prefix modes and alibi.
    add((1, 3), "cross", "BSND", mode=5, mask="4d", kv_chunk=5, comm="ring")
    add((2,), "cross", "BNSD", mode=6, kv_chunk=2, comm="allgather")
    add((1,), "cross", "SBH", mode=3, kv_chunk=5, comm="ring", pse="alibi2")
    add((2,), "cross", "BSND", mode=4, pre=6, next=1, kv_chunk=4, comm="ulysses", pse="alibi3", keep=KEEP)
    add((3,), "cross", "BSH", mode=1, kv_chunk=2, comm="allgather", pse="alibi2", dtype=bf16)
    add((), "cross", "BSND", mode=6, kv_chunk=5, comm="ring", hybrid=True, pse="alibi2")
    return c


def check_flash_alibi(case, world, rank, failures):
    """cp.flash_attn_func / flash_attn_varlen_func with alibi slopes and Sq != Sk: flash-attn's
    distance |i + Sk - Sq - j| on global positions; out, softmax_lse and every gradient against
    the plain (single-process) entry point, sharded."""
    from attnops.torch import cp, flash_attn_func, flash_attn_varlen_func

    g = torch.Generator().manual_seed(case["seed"])
    slopes = (torch.rand(N, generator=g, dtype=torch.float64) * 0.5).float()
    if case["api"] == "flash":
        s1, s2 = 4 * world * 2, 4 * world * 3
        q, dout = (torch.randn(B, s1, N, d, generator=g) for d in (D, DV))
        k, v = (torch.randn(B, s2, NK, d, generator=g) for d in (D, DV))
        qc = kc = None
        dim = 1

        def call(fn, *a, **kw):
            return fn(*a, causal=True, alibi_slopes=slopes, return_attn_probs=True, **kw)
        plain = (flash_attn_func, ())
        cp_fn = (cp.flash_attn_func, ())
    else:
        ql, kl = [2 * world, 4 * world, 6 * world], [4 * world, 6 * world, 8 * world]  # one Sk - Sq per sequence
        q, dout = (torch.randn(sum(ql), N, d, generator=g) for d in (D, DV))
        k, v = (torch.randn(sum(kl), NK, d, generator=g) for d in (D, DV))
        z = torch.zeros(1, dtype=torch.int32)
        fq, fk = torch.cat([z, torch.tensor(ql).cumsum(0).int()]), torch.cat([z, torch.tensor(kl).cumsum(0).int()])
        qc, kc = fq[1:].tolist(), fk[1:].tolist()
        dim = 0

        def call(fn, *a, **kw):
            return fn(*a, fq, fk, max(ql), max(kl), causal=True, alibi_slopes=slopes, return_attn_probs=True, **kw)
        plain = (flash_attn_varlen_func, ())
        cp_fn = (cp.flash_attn_varlen_func, ())

    def run(fn, q, k, v, dout, **kw):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse, _ = call(fn, q, k, v, **kw)
        out.backward(dout)
        return [out.detach(), lse, q.grad, k.grad, v.grad]

    def local(t, cum, d=dim):
        return cp.shard(t, seq_dim=d, scheme="zigzag", cu_seqlens=cum)

    want = run(plain[0], q, k, v, dout)
    lse_dim = 2 if case["api"] == "flash" else 1  # [B, H, S] / [H, T]
    want = [local(want[0], qc), local(want[1], qc, lse_dim), local(want[2], qc), local(want[3], kc),
            local(want[4], kc)]
    got = run(cp_fn[0], local(q, qc), local(k, kc), local(v, kc), local(dout, qc), comm=case["comm"])
    tag = f"flash-alibi W={world} rank={rank} {case}"
    feat.expect_matches_plain(tag, ["out", "softmax_lse", "dq", "dk", "dv"], got, want, world, failures)


def flash_cases():
    return [dict(api="flash", comm="ring", seed=1200, w=(1, 2)),
            dict(api="varlen", comm="allgather", seed=1201, w=(3,))]


def all_cases():
    return [(check_case, c) for c in cases()] + [(check_flash_alibi, c) for c in flash_cases()]


# ---------------------------------------------------------------------------------------------
# No processes needed


def test_tnd_mask_and_pse_geometry():
    from attnops.torch import _cp_general as gen

    ql, kl = [2, 3], [4, 1]
    m = torch.zeros(3, 4, dtype=torch.bool)  # [maxSq, maxSkv]: every sequence from its start
    g = gen.geometry(1, INT32_MAX, INT32_MAX, m, None, None, 1, batch=1, heads=2, seq_len=5, lengths=ql, kv_lengths=kl)
    assert g.mask_origin == [(0, 0), (0, 0)]
    g = gen.geometry(1, INT32_MAX, INT32_MAX, torch.zeros(5, 5, dtype=torch.bool), None, None, 1, batch=1, heads=2,
                     seq_len=5, lengths=ql, kv_lengths=kl)  # [T1, T2]: packed rows
    assert g.mask_origin == [(0, 0), (2, 4)]
    pse = torch.arange(2 * (2 * 4 + 3 * 1), dtype=torch.float32)
    g = gen.geometry(1, INT32_MAX, INT32_MAX, None, None, pse, 1, batch=1, heads=2, seq_len=5, lengths=ql,
                     kv_lengths=kl)
    assert [tuple(p.shape) for p in g.seq_pse] == [(2, 2, 4), (2, 3, 1)]
    assert g.seq_pse[1].flatten().tolist() == list(range(16, 22))
    g = gen.geometry(1, INT32_MAX, INT32_MAX, None, None, torch.zeros(2 * 5), 1, batch=1, heads=2, seq_len=5,
                     lengths=ql, kv_lengths=kl)  # row-broadcast
    assert [tuple(p.shape) for p in g.seq_pse] == [(2, 1, 4), (2, 1, 1)]
    # Cross-attention: mode 6 keeps the bottom-right causal rule per sequence plus the prefix; mode 7
    # bands the last sequence with queries and keys.
    g = gen.geometry(6, INT32_MAX, INT32_MAX, None, [3, 0], None, 1, batch=1, heads=2, seq_len=5, lengths=ql,
                     kv_lengths=kl)
    assert g.band(0) == (-gen.UNBOUNDED, 2) and g.band(1) == (-gen.UNBOUNDED, -2) and g.prefix == [3, 0]
    g = gen.geometry(7, 4, 0, None, None, None, 1, batch=1, heads=2, seq_len=5, lengths=ql, kv_lengths=kl)
    assert g.band(0) == (-gen.UNBOUNDED, 2) and g.band(1) == (-6, -2)


def test_mask_pse_cross_argument_errors(tmp_path):
    from attnops.torch import _cp_general as gen
    from attnops.torch import cp

    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(ValueError, match="atten_mask: shape \\[4, 4\\]: .*TND.*\\[maxSq, maxSkv\\] = \\[3, 4\\].*"
                                         "\\[T1, T2\\] = \\[5, 5\\]"):
        gen.geometry(1, INT32_MAX, INT32_MAX, torch.zeros(4, 4, dtype=torch.bool), None, None, 1, batch=1, heads=2,
                     seq_len=5, lengths=[2, 3], kv_lengths=[4, 1])
    with pytest.raises(ValueError, match="pse: shape \\[2, 22\\]: .*TND.*\\[22\\].*\\[10\\], or the 4-D compressed"):
        gen.geometry(3, INT32_MAX, 0, None, None, torch.zeros(2, 22), 1, batch=1, heads=2, seq_len=5,
                     lengths=[2, 3], kv_lengths=[4, 1])
    with pytest.raises(ValueError, match="prefix\\[1\\] = 0: must be in \\[1, 4\\] \\(Sq = 3, Skv = 4\\)"):
        gen.geometry(6, INT32_MAX, INT32_MAX, None, [0, 0], None, 1, batch=1, heads=2, seq_len=5, lengths=[2, 3],
                     kv_lengths=[2, 4])
    with cp_harness.one_process_group(tmp_path):
        t = torch.randn(12, 4, 8)
        with pytest.raises(ValueError, match="key: shape \\[12, 4, 8\\]: rank 0 holds 14 tokens .* keys follow"):
            cp.attention(t, t, t, 4, "TND", scale=1.0, scheme="whole", cu_seqlens=[4, 12], cu_seqlens_kv=[6, 14])
        with pytest.raises(ValueError, match="q_start_idx: given with pse_type 1 and no pse: only alibi slopes"):
            cp.attention(t, t, t, 4, "TND", scale=1.0, cu_seqlens=[4, 12], q_start_idx=[2])
        with pytest.raises(ValueError, match="kv_start_idx: \\[\\]: must hold at least one value"):
            cp.attention(t, t, t, 4, "TND", scale=1.0, cu_seqlens=[4, 12], pse=torch.ones(4), pse_type=2,
                         kv_start_idx=[])
        # W = 1: alibi with start indices is the plain op's, bit for bit.
        from attnops.torch import npu_fusion_attention
        slopes = torch.rand(4)
        want = npu_fusion_attention(t, t, t, 4, "TND", pse=slopes, pse_type=2, q_start_idx=[3], kv_start_idx=[1],
                                    actual_seq_qlen=[4, 12], actual_seq_kvlen=[4, 12], softmax_layout="TND")
        got = cp.attention(t, t, t, 4, "TND", scale=1.0, cu_seqlens=[4, 12], pse=slopes, pse_type=2, q_start_idx=[3],
                           kv_start_idx=1)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1][..., 0])
