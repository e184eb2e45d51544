// Invariant checks for programming errors (not for bad input, which returns a Status).
#pragma once

#include <cstdio>
#include <cstdlib>

#define KVS_CHECK(cond)                                                             \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

// The same, printing a message (a C string) that says what went wrong.
#define KVS_CHECK_MSG(cond, msg)                                                             \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

#ifdef NDEBUG
#define KVS_DCHECK(cond) \
  do {                   \
  } while (0)
#else
#define KVS_DCHECK(cond) KVS_CHECK(cond)
#endif
