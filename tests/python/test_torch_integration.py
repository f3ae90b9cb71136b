"""The attnops operators as PyTorch operators: torch.library.opcheck, torch.compile(fullgraph=True)
with forward and backward, and autograd through a small model compared with pure PyTorch."""

import math

import pytest
import torch
from torch.library import opcheck

import attnops.torch as at
from reference import bar_paper

INT32_MAX = 2147483647
# The compressed causal mask torch_npu users pass with sparse modes 2-4 (a None mask means no masking).
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
ops = torch.ops.attnops


def fa_args(q, k, v, layout="BNSD", n=3, mode=0, keep_prob=1.0, aq=None, ak=None, sink=None, seed=0):
    return (q, k, v, None, None, None, aq, ak, sink, None, None, None, 0.3, keep_prob, INT32_MAX, INT32_MAX, n, layout,
            0, mode, 1, seed, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_flash_attention(dtype):
    q, k, v = (torch.randn(s, dtype=dtype, requires_grad=True) for s in ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8)))
    opcheck(ops.flash_attention_score.default, fa_args(q, k, v, mode=2))
    opcheck(ops.flash_attention_score.default, fa_args(q, k, v, keep_prob=0.8, seed=5))
    sink = torch.randn(3, requires_grad=True)
    opcheck(ops.flash_attention_score.default, fa_args(q, k, v, sink=sink))
    qt, kt = (torch.randn(s, dtype=dtype, requires_grad=True) for s in ((9, 3, 8), (11, 3, 8)))
    opcheck(ops.flash_attention_score.default,
            fa_args(qt, kt, kt, "TND", mode=3, aq=torch.tensor([4, 9]), ak=torch.tensor([5, 11])))
    # The grads are not differentiable themselves (no double backward): plain tensors.
    q, k, v = (x.detach() for x in (q, k, v))
    out, smax, ssum = ops.flash_attention_score(*fa_args(q, k, v))
    dy = torch.randn_like(out)
    grad_args = (q, k, v, dy, None, None, None, smax, ssum, out, None, None, None, None, None, None, 0.3, 1.0,
                 INT32_MAX, INT32_MAX, 3, "BNSD", 0, 0, 1, 0, 0)
    opcheck(ops.flash_attention_score_grad.default, grad_args)


def test_opcheck_block_attention_residuals():
    pb, br, pw, nw = (torch.randn(s, requires_grad=True) for s in ((6, 16), (6, 3, 16), (1, 16), (16,)))
    opcheck(ops.block_attention_residuals.default, (pb, br, pw, nw, -1, 1e-6))
    opcheck(ops.block_attention_residuals.default, (pb, br.detach().transpose(0, 1).contiguous().transpose(0, 1),
                                                   pw, nw, 3, 1e-5))
    pb, br, pw, nw = (x.detach() for x in (pb, br, pw, nw))
    h, inv, probs = ops.block_attention_residuals(pb, br, pw, nw, -1, 1e-6)
    opcheck(ops.block_attention_residuals_backward.default, (pb, br, pw, nw, torch.randn_like(h), inv, probs, 0))


class TinyBlock(torch.nn.Module):
    """Attention over a packed causal TND batch, then Block Attention Residuals over earlier
    blocks; `fused` picks attnops or the same maths in plain PyTorch."""

    def __init__(self, h=32, heads=4, fused=True):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Parameter(torch.randn(1, h) * 0.1)
        self.norm = torch.nn.Parameter(torch.ones(h))

    def forward(self, x, blocks, cu, lens):
        t, h = x.shape
        q, k, v = self.qkv(x).view(t, 3, self.heads, h // self.heads).unbind(1)
        if self.fused:
            a = at.npu_fusion_attention(q, k, v, self.heads, "TND", scale=1 / math.sqrt(h // self.heads),
                                        atten_mask=CAUSAL, sparse_mode=3, actual_seq_qlen=cu, actual_seq_kvlen=cu)[0]
        else:
            pieces, s = [], 0
            for n in lens:
                qs, ks, vs = (y[s:s + n].transpose(0, 1) for y in (q, k, v))
                pieces.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
                              .transpose(0, 1))
                s += n
            a = torch.cat(pieces)
        partial = x + a.reshape(t, h)
        if self.fused:
            return at.block_attention_residuals(partial, blocks, self.proj, self.norm)
        return bar_paper(partial, blocks, self.proj, self.norm, dtype=torch.float32)


def test_autograd_through_a_small_model_matches_pytorch():
    torch.manual_seed(0)
    fused = TinyBlock(fused=True)
    plain = TinyBlock(fused=False)
    plain.load_state_dict(fused.state_dict())
    lens = [5, 9, 2]
    cu = torch.tensor(lens).cumsum(0).tolist()
    x = torch.randn(16, 32)
    blocks = torch.randn(3, 16, 32).transpose(0, 1)  # source-major cache viewed token-major
    losses = {}
    for name, model in (("fused", fused), ("plain", plain)):
        xx, bb = x.clone().requires_grad_(), blocks.detach().clone().requires_grad_()
        loss = model(xx, bb, cu, lens).square().mean()
        loss.backward()
        losses[name] = (loss.detach(), xx.grad, bb.grad, {n: p.grad for n, p in model.named_parameters()})
    f, p = losses["fused"], losses["plain"]
    torch.testing.assert_close(f[0], p[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(f[1], p[1], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(f[2], p[2], rtol=1e-4, atol=1e-6)
    for n in f[3]:
        torch.testing.assert_close(f[3][n], p[3][n], rtol=1e-4, atol=1e-6, msg=n)


def fa_bar_step(q, k, v, pb, br, pw, nw):
    a = at.npu_fusion_attention(q, k, v, 2, "TND", scale=0.25, atten_mask=CAUSAL, sparse_mode=3,
                                actual_seq_qlen=[3, 8], actual_seq_kvlen=[3, 8])[0]
    f = at.flash_attn_varlen_func(q, k, v, torch.tensor([0, 3, 8], dtype=torch.int32),
                                  torch.tensor([0, 3, 8], dtype=torch.int32), 5, 5, causal=True)
    h = at.block_attention_residuals(pb + a.reshape(8, -1) + f.reshape(8, -1), br, pw, nw)
    return h.square().sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_forward_and_backward(backend):
    g = torch.Generator().manual_seed(3)
    leaves = [torch.randn(s, generator=g, requires_grad=True)
              for s in ((8, 2, 16), (8, 2, 16), (8, 2, 16), (8, 32), (8, 2, 32), (32,), (32,))]
    eager = fa_bar_step(*leaves)
    eager.backward()
    expect = [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(fa_bar_step, fullgraph=True, backend=backend)
    got = compiled(*leaves)
    got.backward()
    torch.testing.assert_close(got, eager, rtol=1e-6, atol=1e-6)
    for a, b in zip(leaves, expect):
        torch.testing.assert_close(a.grad, b, rtol=1e-5, atol=1e-6)


def test_torch_compile_flash_attn_func_fullgraph():
    q = torch.randn(2, 6, 4, 8, requires_grad=True)
    f = torch.compile(lambda x: at.flash_attn_func(x, x, x, causal=True, window_size=(2, 0)), fullgraph=True,
                      backend="aot_eager")
    torch.testing.assert_close(f(q), at.flash_attn_func(q, q, q, causal=True, window_size=(2, 0)))


def test_torch_compile_fullgraph_with_dropout():
    # Drawing the dropout seed reads a tensor value: dynamo captures it as a scalar when allowed.
    q = torch.randn(2, 6, 4, 8, requires_grad=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch._dynamo.reset()
        f = torch.compile(lambda x: at.flash_attn_func(x, x, x, dropout_p=0.2, causal=True), fullgraph=True,
                          backend="aot_eager")
        torch.manual_seed(1)
        got = f(q)
        got.sum().backward()
    grad = q.grad.clone()
    q.grad = None
    torch.manual_seed(1)
    expect = at.flash_attn_func(q, q, q, dropout_p=0.2, causal=True)
    expect.sum().backward()
    assert torch.equal(got, expect) and torch.equal(grad, q.grad)
    assert not torch.equal(expect, at.flash_attn_func(q, q, q, causal=True))
