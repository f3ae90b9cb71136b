"""attnops.torch.block_attention_residuals against the paper's PyTorch form (float64 reference,
float32 naive form), with autograd, the explicit backward, strided caches and validation."""

import pytest
import torch

from attnops.torch import (block_attention_residuals, block_attention_residuals_backward,
                           block_attention_residuals_with_stats)
from reference import assert_rule, bar_paper


def inputs(t, n, h, dtype, seed=0, pw_shape=None):
    g = torch.Generator().manual_seed(seed)
    pb = torch.randn(t, h, generator=g, dtype=torch.float64).to(dtype)
    br = (torch.randn(t, n, h, generator=g, dtype=torch.float64) * torch.linspace(0.5, 2, n).view(1, n, 1)).to(dtype)
    pw = (torch.randn(h, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    nw = (1 + 0.1 * torch.randn(h, generator=g, dtype=torch.float64)).to(dtype)
    if pw_shape is not None:
        pw = pw.reshape(pw_shape)
    return pb, br, pw, nw


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,n,h", [(5, 1, 8), (17, 4, 33), (3, 9, 130)])
def test_values_and_gradients(t, n, h, dtype):
    pb, br, pw, nw = (x.requires_grad_() for x in inputs(t, n, h, dtype, seed=t + n))
    out = block_attention_residuals(pb, br, pw, nw, norm_eps=1e-5)
    assert out.shape == (t, h) and out.dtype == dtype
    g_out = torch.randn(t, h, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(dtype)
    out.backward(g_out)
    res = {}
    for tag, dt in (("ref", torch.float64), ("naive", torch.float32)):
        xs = [x.detach().clone().requires_grad_() for x in (pb, br, pw, nw)]
        o = bar_paper(*xs, eps=1e-5, dtype=dt)
        o.backward(g_out.to(dt))
        # The naive form rounds its output (and gradients) to the main dtype as attnops does.
        res[tag] = [o.detach()] + [x.grad for x in xs]
        if tag == "naive":
            res[tag] = [r.to(dtype) for r in res[tag]]
    assert_rule(out, res["ref"][0], res["naive"][0], "hidden_states")
    for i, (name, got) in enumerate((("partial_block", pb.grad), ("block_res", br.grad), ("proj_weight", pw.grad),
                                     ("norm_weight", nw.grad))):
        assert got.shape == res["ref"][i + 1].shape and got.dtype == dtype
        assert_rule(got, res["ref"][i + 1], res["naive"][i + 1], f"grad {name}")


def test_source_major_cache_is_read_in_place():
    pb, br, pw, nw = inputs(6, 3, 16, torch.float32, pw_shape=(1, 16))
    cache = br.transpose(0, 1).contiguous()  # [N,T,H], as a model appends blocks
    view = cache.transpose(0, 1)            # [T,N,H] view, strides (H, T*H, 1)
    assert not view.is_contiguous()
    assert torch.equal(block_attention_residuals(pb, view, pw, nw), block_attention_residuals(pb, br, pw, nw))


def test_explicit_backward_and_stats():
    pb, br, pw, nw = inputs(7, 2, 24, torch.float32, pw_shape=(1, 24))
    hidden, inv, probs = block_attention_residuals_with_stats(pb, br, pw, nw)
    assert inv.shape == probs.shape == (7, 3) and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(7))
    v = torch.cat([br, pb[:, None]], 1).double()
    torch.testing.assert_close(inv.double(), torch.rsqrt(v.pow(2).mean(-1) + 1e-6), rtol=1e-6, atol=0)
    go = torch.randn(7, 24)
    grads = block_attention_residuals_backward(pb, br, pw, nw, go, inv, probs)  # valid_block_num=0
    leaves = [x.clone().requires_grad_() for x in (pb, br, pw, nw)]
    block_attention_residuals(*leaves).backward(go)
    for got, leaf in zip(grads, leaves):
        assert torch.equal(got, leaf.grad)
    grads_n = block_attention_residuals_backward(pb, br, pw, nw, go, inv, probs, valid_block_num=2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_n))


def test_zero_pseudo_query_gives_the_mean():
    pb, br, pw, nw = inputs(4, 3, 8, torch.float32)
    out = block_attention_residuals(pb, br, torch.zeros_like(pw), nw)
    torch.testing.assert_close(out, torch.cat([br, pb[:, None]], 1).mean(1))


def test_valid_block_num_and_eps_are_checked():
    pb, br, pw, nw = inputs(4, 3, 8, torch.float32)
    assert torch.equal(block_attention_residuals(pb, br, pw, nw, valid_block_num=3),
                       block_attention_residuals(pb, br, pw, nw, valid_block_num=-1))
    with pytest.raises(ValueError, match="validBlockNum"):
        block_attention_residuals(pb, br, pw, nw, valid_block_num=2)
    with pytest.raises(ValueError, match="normEps"):
        block_attention_residuals(pb, br, pw, nw, norm_eps=0.0)
    with pytest.raises(ValueError):
        block_attention_residuals(pb, br, pw, nw.double())
