/* attnops aclnn compatibility: the base header every aclnnop/ operator header includes. */
#ifndef ATTNOPS_COMPAT_ACLNN_BASE_H
#define ATTNOPS_COMPAT_ACLNN_BASE_H

#include "acl/acl_base.h"
#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nothing to set up on a CPU; configPath is not interpreted. */
ACLNN_API aclnnStatus aclnnInit(const char* configPath);
ACLNN_API aclnnStatus aclnnFinalize(void);

#ifdef __cplusplus
}
#endif

#endif
