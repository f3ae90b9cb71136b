"""Block Attention Residuals ("attention over depth") for PyTorch, with the signatures of the
CANN torch extension (cann_ops_transformer.block_attention_residuals and its backward)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import _ops


def block_attention_residuals(partial_block: Tensor, block_res: Tensor, proj_weight: Tensor, norm_weight: Tensor,
                              valid_block_num: Optional[int] = None, norm_eps: float = 1e-6) -> Tensor:
    """hidden_states [T,H]: per token, softmax over the N blocks of block_res [T,N,H] and the
    partial block [T,H] (last source) of RMSNorm(v)·(norm_weight ⊙ proj_weight), mixing the raw
    sources. valid_block_num: None, -1 or N (all blocks take part). Differentiable in all four
    tensors. block_res may be any strided view, e.g. a source-major [N,T,H] cache .transpose(0, 1)."""
    vbn = -1 if valid_block_num is None else int(valid_block_num)
    hidden, _, _ = _ops.block_attention_residuals(partial_block, block_res, proj_weight, norm_weight, vbn,
                                                  float(norm_eps))
    return hidden


def block_attention_residuals_backward(pb: Tensor, br: Tensor, pw: Tensor, nw: Tensor, go: Tensor, inv: Tensor,
                                       pr: Tensor, *, valid_block_num: int = 0):
    """(grad_partial_block, grad_block_res, grad_proj_weight, grad_norm_weight) from the forward's
    saved inv_norm and probs (fp32 [T,N+1]); valid_block_num: -1, 0 or N."""
    return _ops.block_attention_residuals_backward(pb, br, pw, nw, go, inv, pr, int(valid_block_num))


def block_attention_residuals_with_stats(partial_block: Tensor, block_res: Tensor, proj_weight: Tensor,
                                         norm_weight: Tensor, valid_block_num: Optional[int] = None,
                                         norm_eps: float = 1e-6):
    """(hidden_states, inv_norm, probs): the forward with the statistics its backward reads."""
    vbn = -1 if valid_block_num is None else int(valid_block_num)
    return _ops.block_attention_residuals(partial_block, block_res, proj_weight, norm_weight, vbn, float(norm_eps))
