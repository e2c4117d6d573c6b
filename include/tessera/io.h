// Checkpoints in the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length, a JSON header mapping each tensor name to its dtype ("F32",
// "F64", "I64", ...), shape and [begin, end) data offsets, plus an optional "__metadata__" map
// of strings, then the raw little-endian data. Files open in other tools.
#pragma once
#include <map>
#include <string>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::io {

using TensorMap = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

// Writes atomically: a temporary file in the same directory, fsync, rename over `path`, fsync of
// the directory. A crash at any moment leaves either the old file or the new one. A failure
// before the rename (a full disk says so) leaves the old file and no temporary; one after it
// (the directory's fsync) says "saved, but ...": the new file is in place, its durability unsure.
void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& meta = {});
// Loads every tensor to `device`. A missing, truncated or corrupt file is a tessera::Error
// starting "[load] <path>: " and saying what is wrong.
TensorMap load_safetensors(const std::string& path, Metadata* meta = nullptr, const Device& device = Device("cpu"));

// NumPy .npy files (format versions 1-3): little-endian <f2 <f4 <f8 <i4 <i8 |b1 in C order.
// Everything else (Fortran order, big-endian, other dtypes, a header or data size that does not
// match the file) is refused with one error line before any tensor is allocated.
Tensor load_npy(const std::string& path, const Device& device = Device("cpu"));
void save_npy(const std::string& path, const Tensor& t);  // version 1.0

}  // namespace tessera::io
#pragma GCC visibility pop
