"""attnops: fused attention operators for CPUs.

The operators (FlashAttentionScore and its grad, BlockAttentionResiduals and its grad) take any
DLPack array (PyTorch CPU tensors, NumPy arrays) in place, with its strides, and write into
output arrays the caller allocates. Most users want :mod:`attnops.torch`, which allocates the
outputs, registers the operators with PyTorch (autograd, torch.compile) and offers the torch_npu
and flash-attn interfaces.

Errors: ValueError for invalid arguments (the message names the argument, the value and the
rule); RuntimeError for everything else. The GIL is released while an operator runs.
"""

from ._C import (
    block_attention_residuals,
    block_attention_residuals_grad,
    flash_attention_drop_mask_bytes,
    flash_attention_gen_drop_mask,
    flash_attention_score,
    flash_attention_score_grad,
)
from ._C import data_ptr as _data_ptr
from ._C import set_threads, threads, version

__version__ = version()

__all__ = [
    "block_attention_residuals",
    "block_attention_residuals_grad",
    "flash_attention_drop_mask_bytes",
    "flash_attention_gen_drop_mask",
    "flash_attention_score",
    "flash_attention_score_grad",
    "set_threads",
    "threads",
    "version",
]
