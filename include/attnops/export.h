/* Symbol visibility for the attnops shared library. */
#ifndef ATTNOPS_EXPORT_H
#define ATTNOPS_EXPORT_H

#if defined(ATTNOPS_STATIC_DEFINE)
#define ATTNOPS_API
#elif defined(_WIN32)
#ifdef ATTNOPS_BUILDING
#define ATTNOPS_API __declspec(dllexport)
#else
#define ATTNOPS_API __declspec(dllimport)
#endif
#else
#define ATTNOPS_API __attribute__((visibility("default")))
#endif

/* Public enums have an int underlying type in C++ too, so any int value a caller passes is a
 * valid enum value there (the library validates it instead of invoking undefined behaviour). */
#ifdef __cplusplus
#define ATTNOPS_ENUM(name) enum name : int
#else
#define ATTNOPS_ENUM(name) enum name
#endif

#endif
