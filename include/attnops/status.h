/* attnops status codes and the per-thread last-error message.
 * Numeric values follow the upstream aclnn return codes where one exists. */
#ifndef ATTNOPS_STATUS_H
#define ATTNOPS_STATUS_H

#include "attnops/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ATTNOPS_ENUM(attnopsStatus) {
    ATTNOPS_SUCCESS = 0,
    ATTNOPS_ERROR_NULL_ARGUMENT = 161001,          /* a required pointer was NULL */
    ATTNOPS_ERROR_INVALID_ARGUMENT = 161002,       /* a value, shape, dtype or relation is invalid */
    ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION = 161003, /* valid, but not implemented here */
    ATTNOPS_ERROR_UNSUPPORTED_HARDWARE = 161004,   /* the device lacks a required feature */
    ATTNOPS_ERROR_RUNTIME = 361001,                /* runtime misuse or failure (streams, executors) */
    ATTNOPS_ERROR_OUT_OF_MEMORY = 361002,          /* an allocation failed */
    ATTNOPS_ERROR_INTERNAL = 561000                /* a bug in attnops: please report it */
} attnopsStatus;

/* Short constant name of a status ("ATTNOPS_ERROR_INVALID_ARGUMENT"); never NULL. */
ATTNOPS_API const char* attnopsStatusName(attnopsStatus status);

/* Message of the last failed call made by the calling thread ("" if none). The text names the
 * argument, the value received and the rule broken. Valid until the thread's next failing call. */
ATTNOPS_API const char* attnopsGetLastErrorMessage(void);

#ifdef __cplusplus
}
#endif

#endif
