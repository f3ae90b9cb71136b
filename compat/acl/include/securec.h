/* attnops aclnn compatibility: the securec functions host programs use (memcpy_s, memset_s,
 * memmove_s). Header-only: on a bad argument the destination is cleared where it can be, as
 * the securec library does, and an error number is returned. */
#ifndef ATTNOPS_COMPAT_SECUREC_H
#define ATTNOPS_COMPAT_SECUREC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef EOK
#define EOK 0
#endif
#ifndef EINVAL
#define EINVAL 22
#endif
#ifndef ERANGE
#define ERANGE 34
#endif
#define EINVAL_AND_RESET (22 | 128)
#define ERANGE_AND_RESET (34 | 128)
#define EOVERLAP_AND_RESET (54 | 128)
#define SECUREC_MEM_MAX_LEN 0x7fffffffUL

typedef int errno_t;

static inline errno_t memset_s(void* dest, size_t destMax, int c, size_t count) {
    if (dest == NULL || destMax == 0 || destMax > SECUREC_MEM_MAX_LEN) return ERANGE;
    if (count > destMax) {
        memset(dest, c, destMax);
        return ERANGE_AND_RESET;
    }
    memset(dest, c, count);
    return EOK;
}

/* The checks memcpy_s and memmove_s share: EOK, or the error after clearing what can be cleared. */
static inline errno_t attnopsSecurecCopyCheck(void* dest, size_t destMax, const void* src, size_t count) {
    if (dest == NULL || destMax == 0 || destMax > SECUREC_MEM_MAX_LEN) return ERANGE;
    if (src == NULL) {
        memset(dest, 0, destMax);
        return EINVAL_AND_RESET;
    }
    if (count > destMax) {
        memset(dest, 0, destMax);
        return ERANGE_AND_RESET;
    }
    return EOK;
}

static inline errno_t memcpy_s(void* dest, size_t destMax, const void* src, size_t count) {
    const errno_t status = attnopsSecurecCopyCheck(dest, destMax, src, count);
    if (status != EOK) return status;
    const char* d = (const char*)dest;
    const char* s = (const char*)src;
    if (count > 0 && ((d < s && d + count > s) || (s < d && s + count > d))) {
        memset(dest, 0, destMax);
        return EOVERLAP_AND_RESET;
    }
    if (count > 0 && dest != src) memcpy(dest, src, count);
    return EOK;
}

static inline errno_t memmove_s(void* dest, size_t destMax, const void* src, size_t count) {
    const errno_t status = attnopsSecurecCopyCheck(dest, destMax, src, count);
    if (status != EOK) return status;
    if (count > 0) memmove(dest, src, count);
    return EOK;
}

#endif
