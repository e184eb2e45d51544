// Opt-in validation of weight values at load (`--check-tensors`, as in llama.cpp): a NaN or an
// infinity anywhere in a weight poisons every activation it touches, and the output degrades
// to garbage without any error. The check reads every tensor once, on all cores.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "tensor/dtype.h"

namespace kvs {

// The first NaN or infinity found in a tensor's data.
struct NonFinite {
  bool is_nan = false;
  // Float types: the element index. Block types: the first element of the block whose scale
  // is bad, and which scale field it is ("d", "dmin", "m").
  uint64_t element = 0;
  const char* scale_field = nullptr;  // null for plain float types
};

// Scans blocks [begin_block, end_block) of data in type `type` (for plain float types a block
// is one element). Integer types cannot hold a NaN and always pass; so do types whose block
// layout kvserve does not know (they are refused when the weights load).
std::optional<NonFinite> FindNonFinite(DType type, const uint8_t* data, uint64_t begin_block,
                                       uint64_t end_block);

// Checks every tensor of the file; the error names the first bad tensor (in file order) and
// the element or block, e.g. "tensor 'blk.0.ffn_up.weight' (f32 [64, 172]) has a NaN at
// element 4242 (row 66, column 18)". n_threads <= 0: one per core.
Status CheckTensorValues(const gguf::File& file, int n_threads = 0);

}  // namespace kvs
