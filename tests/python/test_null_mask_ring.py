"""A None atten_mask means no masking at all (torch_npu's rule, spec section 0), checked the way
torch_npu clients depend on it: MindSpeed's ring attention call contract driven over two gloo
processes, against one dense float64 attention; and the once-per-process warning.

The ring below is written for this test from the contract documented in
shared/context-parallel.md section 2.3 (no MindSpeed code): SBH shards holding zigzag chunks
(r, 2W-1-r); causal steps call npu_fusion_attention with
  - the diagonal block: sparse_mode 3 with the compressed 2048x2048 mask (pre = kv length, next 0),
  - an earlier rank's K/V: all local queries x its first chunk, sparse_mode 0, no mask, pre = next = kv length
    (Sq = 2 Skv),
  - a later rank's K/V: the second local query chunk x all of it, sparse_mode 0, no mask;
non-causal steps use sparse_mode 1 without a mask. Partial results merge in fp32 by their softmax
statistics (max, sum), and the backward calls npu_fusion_attention_grad per block with the merged
global statistics and output, as MindSpeed does.
"""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import cp_harness

INT32_MAX = 2147483647
W = 2          # processes
C = 6          # tokens per zigzag chunk: each rank holds 2 chunks, the sequence is 2 W C long
B, N, D = 2, 2, 8


def global_inputs():
    g = torch.Generator().manual_seed(7)
    s = 2 * W * C
    q, k, v, dout = (torch.randn(s, B, N * D, generator=g, dtype=torch.float64) for _ in range(4))
    return q, k, v, dout


def zigzag_rows(rank):
    """Global sequence positions held by `rank`: chunks rank and 2W-1-rank."""
    first = list(range(rank * C, (rank + 1) * C))
    second = list(range((2 * W - 1 - rank) * C, (2 * W - rank) * C))
    return first + second


def dense_reference(causal):
    """Out and gradients of the whole sequence in float64 (SBH)."""
    q, k, v, dout = (t.clone().requires_grad_(i < 3) for i, t in enumerate(global_inputs()))
    s = q.shape[0]
    qh, kh, vh = (t.view(s, B, N, D).permute(1, 2, 0, 3) for t in (q, k, v))
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -math.inf)
    out = (scores.softmax(-1) @ vh).permute(2, 0, 1, 3).reshape(s, B, N * D)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def block_calls(rank, src, causal):
    """(q rows, kv rows, sparse_mode, atten_mask, pre, next) of the step that sees rank src's K/V,
    as local row ranges: MindSpeed's per-step kernel calls (shared/context-parallel.md 2.3)."""
    whole, first, second = slice(0, 2 * C), slice(0, C), slice(C, 2 * C)
    if not causal:
        return whole, whole, 1, None, INT32_MAX, INT32_MAX
    if src == rank:
        return whole, whole, 3, torch.ones(2048, 2048, dtype=torch.bool).triu(1), 2 * C, 0
    if src < rank:
        return whole, first, 0, None, C, C
    return second, whole, 0, None, 2 * C, 2 * C


def merge(out, m, s, out2, m2, s2, rows):
    """Merges a partial result into rows of the running (out, max, sum), in fp32 (log-sum-exp form)."""
    m1, s1 = m[:, :, rows, :1], s[:, :, rows, :1]
    mx = torch.maximum(m1, m2[..., :1])
    a, b = s1 * torch.exp(m1 - mx), s2[..., :1] * torch.exp(m2[..., :1] - mx)
    total = a + b

    def per_row(x):  # [B,N,S,1] -> [S,B,N*D] broadcast factors
        return x[..., 0].permute(2, 0, 1).repeat_interleave(D, dim=2)

    out[rows] = out[rows] * per_row(a / total) + out2 * per_row(b / total)
    m[:, :, rows] = mx.expand(-1, -1, -1, 8)
    s[:, :, rows] = total.expand(-1, -1, -1, 8)


def ring_attention(rank, causal):
    """This rank's (out, dq, dk, dv) from the ring over the W processes of the default group."""
    from attnops.torch import npu_fusion_attention, npu_fusion_attention_grad

    rows = zigzag_rows(rank)
    q, k, v, dout = (t[rows].float().contiguous() for t in global_inputs())
    scale = 1.0 / math.sqrt(D)
    kv = torch.stack([k, v])
    gathered = [torch.empty_like(kv) for _ in range(W)]
    dist.all_gather(gathered, kv)

    out = torch.zeros_like(q)
    m = torch.full((B, N, 2 * C, 8), -math.inf)
    s = torch.zeros(B, N, 2 * C, 8)
    for src in range(W):
        qr, kr, mode, mask, pre, nxt = block_calls(rank, src, causal)
        o2, m2, s2 = npu_fusion_attention(
            q[qr], gathered[src][0][kr], gathered[src][1][kr], N, "SBH", atten_mask=mask, scale=scale,
            pre_tockens=pre, next_tockens=nxt, sparse_mode=mode)[:3]
        merge(out, m, s, o2, m2, s2, qr)

    dq = torch.zeros_like(q)
    dkv = torch.zeros(W, 2, 2 * C, B, N * D)  # fp32 partial dK/dV of every rank's block
    for src in range(W):
        qr, kr, mode, mask, pre, nxt = block_calls(rank, src, causal)
        kk, vv = gathered[src][0][kr], gathered[src][1][kr]
        g = npu_fusion_attention_grad(
            q[qr], kk, vv, dout[qr], N, "SBH", atten_mask=mask, softmax_max=m[:, :, qr].contiguous(),
            softmax_sum=s[:, :, qr].contiguous(), attention_in=out[qr].contiguous(), scale_value=scale,
            pre_tockens=pre, next_tockens=nxt, sparse_mode=mode)
        dq[qr] += g[0]
        dkv[src, 0, kr] += g[1]
        dkv[src, 1, kr] += g[2]
    dist.all_reduce(dkv)
    return out, dq, dkv[rank, 0], dkv[rank, 1]


def check(case, world, rank, failures):
    causal = case["causal"]
    rows = zigzag_rows(rank)
    for name, got, want in zip(("out", "dq", "dk", "dv"), ring_attention(rank, causal), dense_reference(causal)):
        # fp32 accuracy: the error of fp32 maths over these short rows is about 1e-7.
        try:
            torch.testing.assert_close(got.double(), want[rows], rtol=2e-6, atol=2e-6)
        except AssertionError as e:
            failures.append(f"rank {rank} {name} (causal={causal}): {e}")


def worker(rank, world, store, out_dir, which):
    cp_harness.run_cases(rank, world, store, out_dir, [(check, {"causal": which == "causal"})], deadline_s=300)


@pytest.mark.parametrize("causal", [True, False])
def test_mindspeed_ring_contract_two_processes(tmp_path, causal):
    cp_harness.run_world(worker, W, tmp_path, "causal" if causal else "full", deadline_s=300)


def test_null_mask_warning_once_per_process():
    """Modes 2-8 without a mask: the library warns once on stderr, the binding once as a UserWarning."""
    code = """
import warnings, torch
from attnops.torch import npu_fusion_attention, npu_fusion_attention_grad
q = torch.randn(1, 2, 4, 8)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for mode in (3, 2, 4):
        out, m, s = npu_fusion_attention(q, q, q, 2, "BNSD", sparse_mode=mode)[:3]
        npu_fusion_attention_grad(q, q, q, out, 2, "BNSD", softmax_max=m, softmax_sum=s, attention_in=out,
                                  sparse_mode=mode)
    npu_fusion_attention(q, q, q, 2, "BNSD", sparse_mode=1)
print("python-warnings", sum("atten_mask = None" in str(w.message) for w in seen))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "default"})
    assert run.returncode == 0, run.stderr
    assert "python-warnings 1" in run.stdout
    assert run.stderr.count("attnops warning: sparseMode = 3 with attenMask = NULL") == 1, run.stderr
    assert run.stderr.count("attnops warning") == 1, run.stderr
