"""attnops.torch.cp, the remaining features, over W = 1..4 gloo processes:
- dropout on the block-wise path (bands, prefixes, explicit masks, TND modes 7/8, sinks, alibi),
  the Ulysses-inside ring-across hybrid and scheme="whole": the keep bits are the single-process
  op's for the same seed (the kernels key the Philox counter by global positions);
- the packed-stream ("llama3") split of TND: contiguous slices of the packed token stream,
  sequences cut anywhere;
- cross-attention shards (S1 != S2, query and key/value sharded on their own), ring and all-gather;
- the early-stopping ring for band masks (ring steps with no work on any rank are not run).

Every output, statistic and gradient (dsink included) is compared with the single-process attnops
op on the whole problem with the same (keep_prob, seed), sharded the same way: fp32 within 1e-5
relative; bf16 within 2x the single-process bf16 op's error against the single-process fp32 op
(with dropout, the float64 reference does not know the keep bits; the fp32 op draws the same
ones) plus reference.ABS_TOL; W = 1 bit for bit; a second run gives the same bits; the transfer
counts and, where stated, the kernel-call counts are asserted. Long runs: ATTNOPS_TEST_LONG=1.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import cp_harness
from reference import ABS_TOL
from test_context_parallel import bits
import test_context_parallel_masks as masks
from test_context_parallel_masks import B, CAUSAL, D, DV, INT32_MAX, N, NK, SEQ_DIM, groups, layout_tensor, make_inputs

_masks_tnd_lengths = masks.tnd_lengths

DEADLINE_S = 600
KEEP, SEED = 0.8, 0x2468ACE


def _ops():
    from attnops.torch import _ops as o
    return o


# ---------------------------------------------------------------------------------------------
# The single-process op (the whole problem, one call)


def single(case, q, k, v, dout, lengths, extra, scale, keep, q_lengths=None):
    """(out, max, sum, dq, dk, dv[, dsink]) of the plain op on the whole problem; statistics lane 0
    ([B,N,S] / [T,N] token-major)."""
    o = _ops()
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    sink = extra.get("sink")
    if sink is not None:
        sink = sink.clone().requires_grad_()
    c = ck = None
    if lengths is not None:
        ck = torch.tensor(lengths).cumsum(0)
        c = torch.tensor(q_lengths).cumsum(0) if q_lengths is not None else ck
    mode = case["mode"]
    mask = extra.get("atten_mask")
    prefix = extra.get("prefix") if mode in (5, 6) else None
    out, mx, sm = o.flash_attention_score(q, k, v, extra.get("pse"), None, mask, c, ck, sink, prefix, None, None, scale,
                                          keep, case.get("pre", INT32_MAX), case.get("next", INT32_MAX), N,
                                          case["layout"], 0, mode, extra.get("pse_type", 1), SEED, 0)
    out.backward(dout)
    res = [out.detach(), mx[..., 0], sm[..., 0], q.grad, k.grad, v.grad]
    if sink is not None:
        res.append(sink.grad)
    return res


def sharded(case, q, k, v, dout, lengths, extra, scale, keep, grp):
    from attnops.torch import cp

    group, ug = grp
    layout, dim = case["layout"], SEQ_DIM[case["layout"]]
    cum = torch.tensor(lengths).cumsum(0).tolist() if lengths is not None else None
    scheme = case.get("scheme", "zigzag")
    local = [cp.shard(t, group, seq_dim=dim, scheme=scheme, cu_seqlens=cum, ulysses_group=ug).requires_grad_(i < 3)
             for i, t in enumerate((q, k, v, dout))]
    res, fwd, both = attend_and_backward(
        lambda a, b, c, **kw: cp.attention(a, b, c, N, layout, scale=scale, group=group, ulysses_group=ug,
                                           comm=case["comm"], scheme=scheme, cu_seqlens=cum, keep_prob=keep,
                                           seed=SEED, **kw),
        *local, mask_kwargs(case, extra))
    return res, (fwd, *both)


def attend_and_backward(attend, q, k, v, dout, kw):
    """attend(q, k, v, **kw) -> (out, softmax_max, softmax_sum) with the transfer and kernel-call
    counters reset, then out.backward(dout). Returns [out, max, sum, dq, dk, dv (, dsink with a
    sink in kw)], the counters (transfers, kernel calls) after the forward, and after both."""
    from attnops.torch import _cp_general, cp

    cp.comm_stats.reset()
    _cp_general.kernel_calls.clear()
    out, mx, sm = attend(q, k, v, **kw)
    fwd = (dict(cp.comm_stats.transfers), dict(_cp_general.kernel_calls))
    out.backward(dout)
    res = [out.detach(), mx, sm, q.grad, k.grad, v.grad]
    if "sink" in kw:
        res.append(kw["sink"].grad)
    return res, fwd, (dict(cp.comm_stats.transfers), dict(_cp_general.kernel_calls))


NAMES = ["out", "softmax_max", "softmax_sum", "dq", "dk", "dv", "dsink"]


def compare(tag, case, world, got, again, want, ref32, failures, exact=False):
    """The rules of the module docstring; ``want``: the single-process op in the case's dtype,
    sharded; ``ref32``: the same in fp32 (bf16/fp16 cases)."""
    for name, a, b in zip(NAMES, got, again):
        if not torch.equal(bits(a), bits(b)):
            failures.append(f"{tag}: {name} differs between two runs")
    if exact:
        for name, a, w in zip(NAMES, got, want):
            if a.shape != w.shape or not torch.equal(bits(a), bits(w)):
                failures.append(f"{tag}: {name} is not bit-identical to the plain op")
        return
    for i, (a, w) in enumerate(zip(got, want)):
        if a.shape != w.shape:
            failures.append(f"{tag}: {NAMES[i]} shape {list(a.shape)}, expected {list(w.shape)}")
            continue
        if case["dtype"] != torch.float32 and i not in (1, 2, 6):
            r = ref32[i].double()
            if not r.numel():
                continue
            base = (w.double() - r).abs().max().item()
            err = (a.double() - r).abs().max().item()
            bound = 2 * base + ABS_TOL[case["dtype"]] * max(1.0, r.abs().max().item())
            if not err <= bound:
                failures.append(f"{tag}: {NAMES[i]} error {err:.3e} against fp32 > {bound:.3e} (single-process "
                                f"{base:.3e})")
            continue
        err, bound = fp32_error(a, w)
        if not err <= bound:
            failures.append(f"{tag}: {NAMES[i]} error {err:.3e} against the single-process op > {bound:.3e}")


def fp32_error(a, w):
    """(error, bound) of a against w under the fp32 rule: 1e-5 relative to w's largest finite
    magnitude (at least 1); equal values, infinities included, count as no error."""
    a, w = a.double(), w.double()
    finite = w[torch.isfinite(w)]
    bound = 1e-5 * max(1.0, finite.abs().max().item() if finite.numel() else 0.0)
    err = torch.where(a == w, torch.zeros_like(a), a - w).abs().max().item() if a.numel() else 0.0
    return err, bound


def expect_matches_plain(tag, names, got, want, world, failures):
    """Sharded fp32 results against the plain entry point's (sharded the same way): the same
    shapes; at W = 1 the same bits; otherwise the fp32 rule (fp32_error)."""
    for name, a, w in zip(names, got, want):
        if a.shape != w.shape:
            failures.append(f"{tag}: {name} shape {list(a.shape)}, expected {list(w.shape)}")
        elif world == 1:
            if not torch.equal(bits(a), bits(w)):
                failures.append(f"{tag}: {name} is not bit-identical to the plain entry point")
        else:
            err, bound = fp32_error(a, w)
            if not err <= bound:
                failures.append(f"{tag}: {name} error {err:.3e} against the plain entry point > {bound:.3e}")


def mask_kwargs(case, extra):
    """The sparse mode, band and the case's mask, prefix, pse and sink as attention keywords."""
    mode = case["mode"]
    kw = dict(sparse_mode=mode, pre_tokens=case.get("pre", INT32_MAX), next_tokens=case.get("next", INT32_MAX))
    if mode in (0, 1, 5) and "atten_mask" in extra:
        kw["atten_mask"] = extra["atten_mask"]
    if mode in (5, 6):
        kw["prefix"] = extra["prefix"]
    if "sink" in extra:
        kw["sink"] = extra["sink"].clone().requires_grad_()
    if "pse" in extra:
        kw.update(pse=extra["pse"], pse_type=extra["pse_type"])
    return kw


def seen_pairs(case, s, lengths, extra):
    """[S1, S2] True where some batch row and head sees key j from query i, from the spec's
    predicates (independent of the code under test)."""
    if not case.get("kv_chunk"):
        return masks.keep_matrix(case, s, lengths, extra).flatten(0, 1).any(0)
    s2 = s // case.get("chunk", 3) * case["kv_chunk"]
    d, pre, nxt = s2 - s, case.get("pre", INT32_MAX), case.get("next", INT32_MAX)
    diff = torch.arange(s2)[None, :] - torch.arange(s)[:, None]
    rule = {0: (diff >= -pre) & (diff <= nxt), 1: torch.ones(s, s2, dtype=torch.bool), 2: diff <= 0, 3: diff <= d,
            4: (diff >= d - pre) & (diff <= d + nxt)}[case["mode"]]
    m = extra.get("atten_mask") if case["mode"] in (0, 1) else None
    if m is not None:
        rule = rule & ~(m if m.dim() == 2 else m.flatten(0, 1).all(0))
    return rule


def ring_steps_needed(case, world, s, lengths, extra):
    """1 + the last ring step at which some rank holds keys one of its queries sees."""
    from attnops.torch import cp

    scheme = case.get("scheme", "zigzag")
    cum = torch.tensor(lengths).cumsum(0).tolist() if lengths is not None else None
    seen = seen_pairs(case, s, lengths, extra)
    qpos = [cp.shard_index(s, world, r, scheme, cu_seqlens=cum) for r in range(world)]
    kpos = [cp.shard_index(seen.shape[1], world, r, scheme, cu_seqlens=cum) for r in range(world)]
    for st in range(world - 1, 0, -1):
        if any(seen[qpos[r]][:, kpos[(r - st) % world]].any() for r in range(world)):
            return st + 1
    return 1


def expected_counts(case, world, steps=None):
    """(forward, forward + backward) transfers of a sharded run, or None (not asserted)."""
    if world == 1 or case.get("hybrid") or case.get("scheme") == "whole":
        return None
    sink = {"allgather_dsink": 1} if case.get("sink") else {}
    steps = steps or world  # ring steps run (early stop)
    if case["comm"] == "ring":
        fwd = {"kv": steps - 1} if steps > 1 else {}
        return fwd, {**({"kv": 2 * (steps - 1)} if steps > 1 else {}), "dkv": steps, **sink}
    if case["comm"] == "allgather":
        return {"allgather_kv": 1}, {"allgather_kv": 2, "reduce_scatter_dkv": 1, **sink}
    return None


# ---------------------------------------------------------------------------------------------
# The check (every kind of case)


LLAMA3_CUTS = [5, 0, 11, 1]  # then the rest of the stream: slice boundaries fall inside sequences


def tnd_lengths(world, scheme):
    if scheme == "llama3":
        total = 24 if world <= 2 else 12 * world
        return LLAMA3_CUTS + [total - sum(LLAMA3_CUTS)]
    return _masks_tnd_lengths(world, scheme)


def make_cross(case, world):
    """Cross-attention inputs: query length S1 = 4W * chunk, key/value length S2 = 4W * kv_chunk."""
    dtype, layout = case["dtype"], case["layout"]
    g = torch.Generator().manual_seed(case["seed"])
    s1, s2 = 4 * world * case.get("chunk", 3), 4 * world * case["kv_chunk"]
    q = layout_tensor(layout, B, N, s1, D, dtype, g)
    k = layout_tensor(layout, B, NK, s2, D, dtype, g)
    v = layout_tensor(layout, B, NK, s2, DV, dtype, g)
    dout = layout_tensor(layout, B, N, s1, DV, dtype, g)
    extra = {}
    if case.get("sink"):
        extra["sink"] = torch.randn(N, generator=g, dtype=torch.float64).float()
    mode = case["mode"]
    if mode in (0, 1) and case.get("explicit"):
        shape = (B, 1, s1, s2) if case.get("mask4d") else (s1, s2)
        extra["atten_mask"] = torch.rand(shape, generator=g, dtype=torch.float64) < 0.3
    elif mode in (2, 3, 4):
        extra["atten_mask"] = CAUSAL
    return q, k, v, dout, None, s1, extra


def check_case(case, world, rank, failures):
    from attnops.torch import cp

    if case.get("hybrid") and world != 4:
        return
    keep = case.get("keep", 1.0)
    scale = 1 / math.sqrt(D)
    maker = make_cross if case.get("kv_chunk") else make_inputs
    q, k, v, dout, lengths, s, extra = maker(case, world)
    grp = groups(case, world)
    scheme = case.get("scheme", "zigzag")
    cum = torch.tensor(lengths).cumsum(0).tolist() if lengths is not None else None
    layout = case["layout"]

    def local(t, seq_dim):
        return cp.shard(t, grp[0], seq_dim=seq_dim, scheme=scheme, cu_seqlens=cum, ulysses_group=grp[1])

    def sharded_ref(res):
        dim, stat_dim = SEQ_DIM[layout], (0 if layout == "TND" else 2)
        return ([local(res[0], dim), local(res[1], stat_dim), local(res[2], stat_dim)] +
                [local(t, dim) for t in res[3:6]] + res[6:])

    want = sharded_ref(single(case, q, k, v, dout, lengths, extra, scale, keep))
    ref32 = None
    if case["dtype"] != torch.float32:
        ext32 = {key: (val.float() if isinstance(val, torch.Tensor) and val.is_floating_point() else val)
                 for key, val in extra.items()}
        ref32 = sharded_ref(single(case, *(t.float() for t in (q, k, v, dout)), lengths, ext32, scale, keep))
    got, counts = sharded(case, q, k, v, dout, lengths, extra, scale, keep, grp)
    again, _ = sharded(case, q, k, v, dout, lengths, extra, scale, keep, grp)
    tag = f"{case['kind']} W={world} rank={rank} {dict((a, b) for a, b in case.items() if a not in ('w', 'kind'))}"
    compare(tag, case, world, got, again, want, ref32, failures, exact=world == 1 and not case.get("hybrid"))
    steps = None
    if case["comm"] == "ring" and world > 1 and not case.get("hybrid") and scheme != "whole":
        steps = ring_steps_needed(case, world, s, lengths, extra)
        if world in case.get("steps", {}) and steps != case["steps"][world]:
            failures.append(f"{tag}: the reference says the ring needs {steps} steps, the case says "
                            f"{case['steps'][world]}")
        if steps < world and world in case["w"] and not case.get("steps"):
            failures.append(f"{tag}: the ring stops after {steps} steps of {world}: state it in the case")
    exp = expected_counts(case, world, steps)
    if exp is not None and (counts[0][0], counts[1]) != exp:
        failures.append(f"{tag}: transfers {counts[:2]}, expected {exp}")
    if case.get("calls") and world in case["calls"]:
        want_calls = case["calls"][world][rank]
        if (counts[0][1].get("fwd", 0), counts[2].get("bwd", 0)) != (want_calls, want_calls):
            failures.append(f"{tag}: kernel calls {counts[0][1]} forward, {counts[2]} in all, expected {want_calls} "
                            "each way")
    # Dropout must change something (else the test could not fail): the keep_prob = 1 run differs.
    if keep < 1.0 and world == 2:  # (every rank: it is collective)
        plain, _ = sharded(case, q, k, v, dout, lengths, extra, scale, 1.0, grp)
        if torch.equal(bits(plain[0]), bits(got[0])):
            failures.append(f"{tag}: the output with dropout equals the one without")


def dropout_cases():
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", f32)
        kw.setdefault("layout", "BSND")
        kw["seed"] = 300 + len(c)
        kw["w"] = w
        kw["kind"] = "dropout"
        kw["keep"] = KEEP
        c.append(kw)

    add((1, 3), mode=4, pre=4, next=1, comm="ring")
    add((4,), mode=0, pre=7, next=2, comm="allgather", layout="BNSD")
    add((3,), mode=6, comm="ring", scheme="contiguous", layout="SBH")
    add((2,), mode=5, comm="allgather", mask4d=True)
    add((2,), mode=3, comm="ring", sink=True, alibi=2)
    add((3,), mode=4, pre=4, next=1, comm="ulysses")
    add((2,), mode=7, pre=5, next=0, comm="ring", layout="TND")
    add((4,), mode=6, comm="allgather", layout="TND", scheme="contiguous")
    add((2,), mode=3, comm="ring", layout="TND", alibi=2, sink=True)
    add((2,), mode=4, pre=5, next=0, comm="ring", dtype=bf16, sink=True)
    # The hybrid (W = 4 as 2 x 2), full attention and causal, fixed and packed.
    add((4,), mode=3, comm="ring", hybrid=True)
    add((), mode=1, comm="allgather", hybrid=True, layout="SBH")
    add((4,), mode=3, comm="ring", hybrid=True, layout="TND")
    # Whole sequences per rank (uneven, empty ranks at W = 3, 4).
    add((1, 3), mode=3, comm="ring", layout="TND", scheme="whole")
    add((4,), mode=1, comm="ring", layout="TND", scheme="whole", sink=True)
    add((3,), mode=6, comm="ring", layout="TND", scheme="whole", dtype=bf16)
    return c


# ---------------------------------------------------------------------------------------------
# The runs


def llama3_cases():
    """The packed-stream split: every rank holds T/W consecutive tokens of the packed stream."""
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", f32)
        kw.update(layout="TND", scheme="llama3", seed=400 + len(c), w=w, kind="llama3")
        c.append(kw)

    add((1, 4), mode=3, comm="allgather")
    add((3,), mode=3, comm="ring", steps={3: 2})  # no sequence spans 3 slices: the ring stops after 2 steps
    add((2,), mode=1, comm="allgather", dtype=bf16)
    add((3,), mode=7, pre=4, next=0, comm="allgather", sink=True)
    add((2,), mode=3, comm="allgather", keep=KEEP)
    add((2,), mode=3, comm="ulysses")
    add((3,), mode=4, pre=2, next=1, comm="ring", alibi=2)
    return c


def cross_cases():
    """Cross-attention shards: query length S1 = 12W, key/value length S2 = 4W * kv_chunk."""
    f32, bf16 = torch.float32, torch.bfloat16
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", f32)
        kw.setdefault("layout", "BSND")
        kw.update(seed=500 + len(c), w=w, kind="cross")
        c.append(kw)

    add((1, 3), mode=1, comm="ring", kv_chunk=5)
    add((4,), mode=3, comm="allgather", kv_chunk=5, layout="BNSD")
    add((3,), mode=4, pre=6, next=1, comm="ring", kv_chunk=2, scheme="contiguous", layout="SBH")  # S1 > S2
    add((2,), mode=0, pre=9, next=3, comm="allgather", kv_chunk=4, explicit=True, layout="BSH")
    add((2,), mode=1, comm="ring", kv_chunk=4, explicit=True, mask4d=True, sink=True)
    add((2,), mode=3, comm="ring", kv_chunk=5, keep=KEEP)
    add((2,), mode=2, comm="ring", kv_chunk=5, dtype=bf16)
    add((3,), mode=3, comm="allgather", kv_chunk=2, scheme="contiguous", keep=KEEP)  # S1 > S2: empty rows
    return c


def early_stop_cases():
    """A band behind the diagonal over contiguous shards of 4 rows (pre = 3, next = 0): only a
    rank's own block and its predecessor's are visible, so the ring stops after 2 steps at any W
    (K/V: 1 hop forward and 1 backward; dK/dV: 1 ring hop and 1 hop home); rank 0 makes 1 kernel
    call each way, the others 2."""
    c = []

    def add(w, **kw):
        kw.setdefault("dtype", torch.float32)
        kw.setdefault("layout", "BSND")
        kw.update(seed=600 + len(c), w=w, kind="early")
        c.append(kw)

    calls = {2: [1, 2], 3: [1, 2, 2], 4: [1, 2, 2, 2]}
    add((4,), mode=4, pre=3, next=0, comm="ring", scheme="contiguous", chunk=1, steps={2: 2, 3: 2, 4: 2},
        calls=calls)
    add((3,), mode=4, pre=3, next=0, comm="ring", scheme="contiguous", chunk=1, steps={3: 2, 4: 2}, calls=calls,
        keep=KEEP, sink=True)
    add((4,), mode=7, pre=1, next=0, comm="ring", scheme="llama3", layout="TND", steps={4: 2})
    return c


def all_cases():
    return dropout_cases() + llama3_cases() + cross_cases() + early_stop_cases()


def worker(rank, world, store, out_dir, which):
    masks.tnd_lengths = tnd_lengths  # the packed-stream cases cut sequences at slice boundaries
    cp_harness.run_cases(rank, world, store, out_dir, [(check_case, c) for c in all_cases()],
                         cp_harness.in_run(which, world), DEADLINE_S)


def run_world(world, tmp_path, which="default"):
    cp_harness.run_world(worker, world, tmp_path, which, DEADLINE_S)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_cp_features_match_single_process(tmp_path, world):
    run_world(world, tmp_path)


@pytest.mark.skipif(not os.environ.get("ATTNOPS_TEST_LONG"), reason="long run: set ATTNOPS_TEST_LONG=1")
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_cp_features_long(tmp_path, world):
    """Every case at the worlds the default run leaves out."""
    run_world(world, tmp_path, "long")


# ---------------------------------------------------------------------------------------------
# No processes needed


def test_llama3_pieces_and_positions():
    from attnops.torch import cp

    cum = [5, 5, 16, 17, 24]  # lengths 5, 0, 11, 1, 7; two slices of 12 cut sequence 2 at 12
    assert cp.shard_index(24, 2, 0, "llama3", cu_seqlens=cum).tolist() == list(range(12))
    assert cp.shard_index(24, 2, 1, "llama3", cu_seqlens=cum).tolist() == list(range(12, 24))
    assert cp.llama3_cu_seqlens(cum, 2, 0) == [5, 12]  # sequence 0, then the head of sequence 2
    assert cp.llama3_cu_seqlens(cum, 2, 1) == [4, 5, 12]  # its tail, sequence 3, sequence 4
    assert cp.llama3_cu_seqlens([0, 8], 4, 0) == [2]
    # T not divisible by W: slices [floor(rT/W), floor((r+1)T/W)) (test_cp_gaps.py).
    assert cp.shard_index(10, 4, 1, "llama3", cu_seqlens=[3, 10]).tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="cu_seqlens = \\[3, 9\\]: must be non-decreasing cumulative lengths ending"):
        cp.shard_index(10, 2, 0, "llama3", cu_seqlens=[3, 9])


def test_ring_steps_stop_after_the_last_step_with_work():
    from attnops.torch import _cp_general as gen

    def lay(world, rows):
        return gen.Layout([torch.arange(r * rows, (r + 1) * rows) for r in range(world)], None)

    band = gen.geometry(4, 3, 0, None, None, None, 1, batch=1, heads=1, seq_len=16)
    assert gen.ring_steps(band, lay(4, 4), 4) == 2  # own block and the previous rank's
    wide = gen.geometry(4, 5, 0, None, None, None, 1, batch=1, heads=1, seq_len=16)
    assert gen.ring_steps(wide, lay(4, 4), 4) == 3  # 5 rows back: row 8 sees key 3, two ranks back
    ahead = gen.geometry(4, 0, 1, None, None, None, 1, batch=1, heads=1, seq_len=16)
    assert gen.ring_steps(ahead, lay(4, 4), 4) == 4  # the next rank's keys come last
    causal = gen.geometry(3, INT32_MAX, 0, None, None, None, 1, batch=1, heads=1, seq_len=16)
    assert gen.ring_steps(causal, lay(4, 4), 4) == 4
    # Cross-attention: bottom-right causal with S2 - S1 = 8 (queries 0..7, keys 0..15).
    cross = gen.geometry(3, INT32_MAX, 0, None, None, None, 1, batch=1, heads=1, seq_len=8, kv_len=16)
    assert (cross.lo, cross.hi) == (-gen.UNBOUNDED, 8)


def test_feature_argument_errors(tmp_path):
    from attnops.torch import cp

    with cp_harness.one_process_group(tmp_path):
        q = torch.randn(1, 8, 4, 8)
        kv = torch.randn(1, 12, 4, 8)
        # Cross-attention takes the prefix modes (test_cp_mask_pse_cross.py), with the plain op's prefix range.
        with pytest.raises(ValueError, match="prefix\\[0\\] = 2: must be in \\[4, 12\\] \\(Sq = 8, Skv = 12\\)"):
            cp.attention(q, kv, kv, 4, "BSND", scale=1.0, sparse_mode=6, prefix=[2])
        with pytest.raises(ValueError, match="atten_mask: shape \\[8, 8\\].*S1 = 8, S2 = 12"):
            cp.attention(q, kv, kv, 4, "BSND", scale=1.0, sparse_mode=1, atten_mask=torch.zeros(8, 8, dtype=torch.bool))
        with pytest.raises(ValueError, match="key: local sequence length 3: must be even for scheme 'zigzag'"):
            cp.attention(q, kv[:, :3], kv[:, :3], 4, "BSND", scale=1.0)
        with pytest.raises(ValueError, match="key/value: local sequence lengths 12/6: must equal each other"):
            cp.attention(q, kv, kv[:, :6], 4, "BSND", scale=1.0)
        with pytest.raises(ValueError, match="keep_prob = 0.0: must be in \\(0, 1\\]"):
            cp.attention(q, q, q, 4, "BSND", scale=1.0, keep_prob=0.0)
        # W = 1: the plain op, bit for bit, cross-attention and dropout on the block-wise path included.
        from attnops.torch import _ops as o
        want = o.flash_attention_score(q, kv, kv, None, None, CAUSAL, None, None, None, None, None, None, 0.5, 0.7,
                                       3, 0, 4, "BSND", 0, 4, 1, 99, 0)
        got = cp.attention(q, kv, kv, 4, "BSND", scale=0.5, sparse_mode=4, pre_tokens=3, next_tokens=0, keep_prob=0.7,
                           seed=99)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1][..., 0])
