/* attnops aclnn compatibility: acl/acl.h, the entry header of host programs (initialisation plus
 * the runtime subset of acl_rt.h). */
#ifndef ATTNOPS_COMPAT_ACL_H
#define ATTNOPS_COMPAT_ACL_H

#include "acl/acl_base.h"
#include "acl/acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* configPath may be NULL; a configuration file, when given, must exist and is not interpreted.
 * A second aclInit before aclFinalize returns ACL_ERROR_REPEAT_INITIALIZE. */
ACL_FUNC_VISIBILITY aclError aclInit(const char* configPath);
/* Waits for every device's queued work. Without a preceding aclInit: ACL_ERROR_REPEAT_FINALIZE. */
ACL_FUNC_VISIBILITY aclError aclFinalize(void);

#ifdef __cplusplus
}
#endif

#endif
