// 64-bit FNV-1a: a hash of text that is stable across runs, builds and machines (kernel names,
// program cache keys, the ranks' collective sequences), unlike std::hash.
#pragma once
#include <cstdint>
#include <string_view>

#pragma GCC visibility push(default)  // the backend SDK (cmake/sdk.txt)
namespace tessera {

inline constexpr uint64_t kFnv1aOffset = 14695981039346656037ull;

// The hash of s, or of s appended to the text whose hash is h.
inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aOffset) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace tessera
#pragma GCC visibility pop
