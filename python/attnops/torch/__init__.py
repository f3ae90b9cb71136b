"""attnops for PyTorch (CPU tensors).

- torch_npu interface: :func:`npu_fusion_attention`, :func:`npu_fusion_attention_grad`
- flash-attn 2 interface: :func:`flash_attn_func`, :func:`flash_attn_varlen_func` and the
  qkv-/kv-packed variants
- inference attention (torch_npu): :func:`npu_fused_infer_attention_score`,
  :func:`npu_fused_infer_attention_score_v2`, :func:`npu_incre_flash_attention`,
  :func:`npu_prompt_flash_attention`; flash-attn's :func:`flash_attn_with_kvcache`
- merging partial results by their softmax statistics: :func:`npu_ring_attention_update`
  (torch_npu/MindSpeed), :mod:`attnops.torch.merge`
- context parallelism over torch.distributed: :mod:`attnops.torch.cp`
- Block Attention Residuals: :func:`block_attention_residuals`,
  :func:`block_attention_residuals_backward`

The operators are registered with torch.library as ``torch.ops.attnops.*`` (fake
implementations for torch.compile, autograd formulas that call the attnops grads).
"""

from . import _ops, cp, merge
from .bar import block_attention_residuals, block_attention_residuals_backward, block_attention_residuals_with_stats
from .flash_attn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .infer import (
    flash_attn_with_kvcache,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
    npu_incre_flash_attention,
    npu_prompt_flash_attention,
)
from .merge import npu_ring_attention_update
from .npu import npu_fusion_attention, npu_fusion_attention_grad, npu_gen_drop_mask

__all__ = [
    "block_attention_residuals",
    "block_attention_residuals_backward",
    "block_attention_residuals_with_stats",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "npu_fused_infer_attention_score",
    "npu_fused_infer_attention_score_v2",
    "npu_incre_flash_attention",
    "npu_prompt_flash_attention",
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "npu_gen_drop_mask",
    "npu_ring_attention_update",
]
