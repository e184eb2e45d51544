#include "model/check_tensors.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "tensor/kquants.h"

namespace kvs {
namespace {

template <typename Bits>
Bits LoadBits(const uint8_t* p) {
  Bits b;
  std::memcpy(&b, p, sizeof(Bits));
  return b;
}

// IEEE formats: all exponent bits set means infinity (mantissa 0) or NaN (mantissa not 0).
// The sign bit is the top bit, so exponent and mantissa are everything below it.
template <typename Bits, Bits kExponent>
bool IsNonFinite(Bits b) {
  return (b & kExponent) == kExponent;
}
template <typename Bits, Bits kExponent>
bool IsNaN(Bits b) {
  constexpr Bits kMagnitude = static_cast<Bits>(~Bits{0}) >> 1;
  return (b & kMagnitude) > kExponent;
}

// Plain floats. Weights are almost always finite, so each chunk is first reduced to one flag
// with a branch-free loop that the compiler vectorizes (memory speed); only a flagged chunk is
// searched for the exact element.
template <typename Bits, Bits kExponent>
std::optional<NonFinite> ScanFloats(const uint8_t* data, uint64_t begin, uint64_t end) {
  constexpr uint64_t kChunk = 1024;
  for (uint64_t i = begin; i < end; i += kChunk) {
    const uint64_t n = std::min(kChunk, end - i);
    const uint8_t* p = data + i * sizeof(Bits);
    Bits flagged = 0;  // as wide as the elements, so the vector loop needs no widening
    for (uint64_t j = 0; j < n; ++j) {
      flagged |=
          static_cast<Bits>(IsNonFinite<Bits, kExponent>(LoadBits<Bits>(p + j * sizeof(Bits))));
    }
    if (!flagged) continue;
    for (uint64_t j = 0; j < n; ++j) {
      const Bits b = LoadBits<Bits>(p + j * sizeof(Bits));
      if (IsNonFinite<Bits, kExponent>(b)) return NonFinite{IsNaN<Bits, kExponent>(b), i + j};
    }
  }
  return std::nullopt;
}

// Where a block type keeps its f16 scales. The quantized values themselves are small integers
// (and sub-block scales are 6- or 8-bit integers), so a block's values are all finite exactly
// when these fields are: checking them checks every element.
struct ScaleField {
  const char* name;
  size_t offset;
};
struct BlockScales {
  ScaleField fields[2];
  int n_fields;
};

std::optional<BlockScales> ScalesOf(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return BlockScales{{{"d", offsetof(BlockQ4_0, d)}}, 1};
    case DType::kQ8_0:
      return BlockScales{{{"d", offsetof(BlockQ8_0, d)}}, 1};
    case DType::kQ5_0:
      return BlockScales{{{"d", offsetof(BlockQ5_0, d)}}, 1};
    case DType::kQ4_1:
      return BlockScales{{{"d", offsetof(BlockQ4_1, d)}, {"m", offsetof(BlockQ4_1, m)}}, 2};
    case DType::kQ5_1:
      return BlockScales{{{"d", offsetof(BlockQ5_1, d)}, {"m", offsetof(BlockQ5_1, m)}}, 2};
    case DType::kQ2_K:
      return BlockScales{{{"d", offsetof(BlockQ2_K, d)}, {"dmin", offsetof(BlockQ2_K, dmin)}}, 2};
    case DType::kQ3_K:
      return BlockScales{{{"d", offsetof(BlockQ3_K, d)}}, 1};
    case DType::kQ4_K:
      return BlockScales{{{"d", offsetof(BlockQ4_K, d)}, {"dmin", offsetof(BlockQ4_K, dmin)}}, 2};
    case DType::kQ5_K:
      return BlockScales{{{"d", offsetof(BlockQ5_K, d)}, {"dmin", offsetof(BlockQ5_K, dmin)}}, 2};
    case DType::kQ6_K:
      return BlockScales{{{"d", offsetof(BlockQ6_K, d)}}, 1};
    default:
      return std::nullopt;
  }
}

std::string DimsString(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string Describe(const gguf::TensorInfo& t, const NonFinite& bad) {
  const DTypeInfo info = Info(t.type);
  const char* what = bad.is_nan ? "a NaN" : "an infinity";
  const uint64_t row = bad.element / t.dims[0], col = bad.element % t.dims[0];
  std::string where;
  if (bad.scale_field) {
    where =
        StrFormat("%s in the scale %s of block %llu (elements %llu..%llu, row %llu)", what,
                  bad.scale_field, static_cast<unsigned long long>(bad.element / info.block_elems),
                  static_cast<unsigned long long>(bad.element),
                  static_cast<unsigned long long>(bad.element + info.block_elems - 1),
                  static_cast<unsigned long long>(row));
  } else {
    where = StrFormat("%s at element %llu (row %llu, column %llu)", what,
                      static_cast<unsigned long long>(bad.element),
                      static_cast<unsigned long long>(row), static_cast<unsigned long long>(col));
  }
  return StrFormat("tensor '%s' (%s %s) has %s (--check-tensors)", t.name.c_str(),
                   std::string(info.name).c_str(), DimsString(t.dims).c_str(), where.c_str());
}

}  // namespace

std::optional<NonFinite> FindNonFinite(DType type, const uint8_t* data, uint64_t begin_block,
                                       uint64_t end_block) {
  switch (type) {
    case DType::kF32:
      return ScanFloats<uint32_t, 0x7f800000u>(data, begin_block, end_block);
    case DType::kF16:
      return ScanFloats<uint16_t, 0x7c00>(data, begin_block, end_block);
    case DType::kBF16:
      return ScanFloats<uint16_t, 0x7f80>(data, begin_block, end_block);
    default:
      break;
  }
  const std::optional<BlockScales> scales = ScalesOf(type);
  if (!scales) return std::nullopt;
  const DTypeInfo info = Info(type);
  for (uint64_t b = begin_block; b < end_block; ++b) {
    const uint8_t* block = data + b * info.block_bytes;
    for (int f = 0; f < scales->n_fields; ++f) {
      const uint16_t h = LoadBits<uint16_t>(block + scales->fields[f].offset);
      if (IsNonFinite<uint16_t, 0x7c00>(h)) {
        return NonFinite{IsNaN<uint16_t, 0x7c00>(h), b * info.block_elems, scales->fields[f].name};
      }
    }
  }
  return std::nullopt;
}

Status CheckTensorValues(const gguf::File& file, int n_threads) {
  // Cut the tensors into pieces of about 4 MiB so that all threads stay busy however the
  // sizes are spread; pieces are in file order, so the lowest bad piece holds the first error.
  struct Piece {
    size_t tensor;
    uint64_t begin_block, end_block;
  };
  constexpr uint64_t kPieceBytes = 4 << 20;
  const std::vector<gguf::TensorInfo>& tensors = file.tensors();
  std::vector<Piece> pieces;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const DTypeInfo info = Info(tensors[k].type);
    const uint64_t n_blocks = tensors[k].n_elements / info.block_elems;
    const uint64_t step = std::max<uint64_t>(1, kPieceBytes / info.block_bytes);
    for (uint64_t b = 0; b < n_blocks; b += step) {
      pieces.push_back({k, b, std::min(n_blocks, b + step)});
    }
  }
  ThreadPool pool(n_threads > 0 ? n_threads : ThreadPool::DefaultThreadCount());
  struct Found {
    size_t piece = SIZE_MAX;
    NonFinite bad;
  };
  std::vector<Found> found(pool.size());
  // Each thread gets a contiguous run of pieces and stops at its first finding.
  pool.ParallelFor(pieces.size(), 1, [&](int thread, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const Piece& p = pieces[i];
      const gguf::TensorInfo& t = tensors[p.tensor];
      if (auto bad = FindNonFinite(t.type, t.data, p.begin_block, p.end_block)) {
        found[thread] = {i, *bad};
        return;
      }
    }
  });
  const Found* first = nullptr;
  for (const Found& f : found) {
    if (f.piece != SIZE_MAX && (!first || f.piece < first->piece)) first = &f;
  }
  if (!first) return Status::Ok();
  return Status::Error(Describe(tensors[pieces[first->piece].tensor], first->bad));
}

}  // namespace kvs
