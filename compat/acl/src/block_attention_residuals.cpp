// aclnnBlockAttentionResiduals and aclnnBlockAttentionResidualsGrad on attnops' C API.
#include "attnops/block_attention_residuals.h"

#include "aclnnop/aclnn_block_attention_residuals.h"
#include "aclnnop/aclnn_block_attention_residuals_grad.h"
#include "shim.hpp"

using namespace attnops::acl;

extern "C" {

aclnnStatus aclnnBlockAttentionResidualsGetWorkspaceSize(const aclTensor* partialBlock, const aclTensor* blockRes,
                                                         const aclTensor* projWeight, const aclTensor* normWeight,
                                                         int64_t validBlockNum, double normEps, bool needBackward,
                                                         aclTensor* hiddenStates, aclTensor* invNorm, aclTensor* probs,
                                                         uint64_t* workspaceSize, aclOpExecutor** executor) {
    return guardedOp("aclnnBlockAttentionResidualsGetWorkspaceSize", [&] {
        const attnops::Tensor pb = view(partialBlock, "partialBlock"), br = view(blockRes, "blockRes"),
                              pw = view(projWeight, "projWeight"), nw = view(normWeight, "normWeight"),
                              hs = view(hiddenStates, "hiddenStates"), inv = view(invNorm, "invNorm"),
                              pr = view(probs, "probs");
        attnopsExecutor* created = nullptr;
        attnops::check(attnopsBlockAttentionResidualsGetWorkspaceSize(
            pb.get(), br.get(), pw.get(), nw.get(), validBlockNum, normEps, needBackward, hs.get(), inv.get(), pr.get(),
            workspaceSize, executor == nullptr ? nullptr : &created));
        *executor = toAclnn(created);
    });
}

ATTNOPS_ACL_EXECUTE(aclnnBlockAttentionResiduals, attnopsBlockAttentionResiduals)

aclnnStatus aclnnBlockAttentionResidualsGradGetWorkspaceSize(
    const aclTensor* partialBlock, const aclTensor* blockRes, const aclTensor* projWeight, const aclTensor* normWeight,
    const aclTensor* gradHiddenStates, const aclTensor* invNorm, const aclTensor* probs, int64_t validBlockNum,
    const aclTensor* gradPartialBlock, const aclTensor* gradBlockRes, const aclTensor* gradProjWeight,
    const aclTensor* gradNormWeight, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return guardedOp("aclnnBlockAttentionResidualsGradGetWorkspaceSize", [&] {
        const attnops::Tensor pb = view(partialBlock, "partialBlock"), br = view(blockRes, "blockRes"),
                              pw = view(projWeight, "projWeight"), nw = view(normWeight, "normWeight"),
                              go = view(gradHiddenStates, "gradHiddenStates"), inv = view(invNorm, "invNorm"),
                              pr = view(probs, "probs"), gpb = view(gradPartialBlock, "gradPartialBlock"),
                              gbr = view(gradBlockRes, "gradBlockRes"), gpw = view(gradProjWeight, "gradProjWeight"),
                              gnw = view(gradNormWeight, "gradNormWeight");
        attnopsExecutor* created = nullptr;
        attnops::check(attnopsBlockAttentionResidualsGradGetWorkspaceSize(
            pb.get(), br.get(), pw.get(), nw.get(), go.get(), inv.get(), pr.get(), validBlockNum, gpb.get(), gbr.get(),
            gpw.get(), gnw.get(), workspaceSize, executor == nullptr ? nullptr : &created));
        *executor = toAclnn(created);
    });
}

ATTNOPS_ACL_EXECUTE(aclnnBlockAttentionResidualsGrad, attnopsBlockAttentionResidualsGrad)

}  // extern "C"
