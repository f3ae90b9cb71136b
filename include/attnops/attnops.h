/* attnops: fused transformer attention operators (C API). Include this one header. */
#ifndef ATTNOPS_ATTNOPS_H
#define ATTNOPS_ATTNOPS_H

#include "attnops/attention_merge.h"
#include "attnops/block_attention_residuals.h"
#include "attnops/flash_attention_score.h"
#include "attnops/flash_attention_score_ex.h"
#include "attnops/flash_attention_score_grad.h"
#include "attnops/fused_infer_attention_score.h"
#include "attnops/incre_flash_attention.h"
#include "attnops/prompt_flash_attention.h"
#include "attnops/runtime.h"
#include "attnops/status.h"
#include "attnops/tensor.h"

#endif
