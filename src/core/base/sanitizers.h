// Which sanitizer this translation unit is compiled under, the same way for
// GCC (__SANITIZE_ADDRESS__, __SANITIZE_THREAD__) and clang (__has_feature):
// SHARDWILD_ASAN in an AddressSanitizer build, SHARDWILD_TSAN in a
// ThreadSanitizer build, and SHARDWILD_SANITIZED in either.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define SHARDWILD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDWILD_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define SHARDWILD_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHARDWILD_TSAN 1
#endif
#endif

#if defined(SHARDWILD_ASAN) || defined(SHARDWILD_TSAN)
#define SHARDWILD_SANITIZED 1
#endif
