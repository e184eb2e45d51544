// The on-disk format of one KV block (issue #20's disk tier, and later tiers that store the same
// bytes): a versioned header that names everything the block's bytes depend on, the payload
// (the block's K/V bytes of every layer, raw or compressed), and an XXH3-64 checksum over both.
// A reader loads a block only if the checksum holds, the header parses, and its identity (model,
// KV format, types, geometry) and hash are the ones it asked for; anything else is a miss,
// never data. Files are written to a temporary name, fsync'd and renamed, so a crash leaves
// either the old state or the whole new file.
//
//   magic "KVSBLOCK" | version u32 | header bytes u32 | identity | codec u8 | 3 zero bytes |
//   hash 16 | parent 16 | n_tokens u32 | tokens i32[n_tokens] | raw bytes u64 | stored bytes u64 |
//   payload [stored bytes] | xxh3-64 of everything before it, u64
// All integers little-endian.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/digest.h"
#include "core/status.h"
#include "kv/block_codec.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_format.h"
#include "kv/kv_group.h"

namespace kvs {

inline constexpr uint32_t kBlockFileVersion = 1;
// Largest block file a reader accepts (a block of 1,024 positions of a large model in f32 is
// well under this): a bound on what a corrupt length field can make it allocate.
inline constexpr uint64_t kMaxBlockFileBytes = uint64_t{1} << 30;

// How the payload is stored: the block's bytes as they are, zstd-compressed, or re-coded by a
// KvBlockCodec (block_codec.h: the transform codec, whose payload names its own fit).
enum class BlockCodec : uint8_t { kRaw = 0, kZstd = 1, kTransform = 2 };
const char* BlockCodecName(BlockCodec codec);

// What a stored block's bytes depend on: a block is loaded only into a pool whose identity
// equals the one it was written with.
struct BlockIdentity {
  BlockHash model;      // the weights' digest
  BlockHash kv_format;  // the KV format's fingerprint (types, calibration, RoPE, version)
  uint8_t k_type = 0, v_type = 0;
  int32_t block_size = 0;
  int32_t n_layer = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  bool operator==(const BlockIdentity&) const = default;
};

// The identity of the blocks of a pool in this format, for a model with these weights, in KV
// cache group group_index (kv_group.h) of that spec: a group other than the first, global one
// names itself in kv_format.
BlockIdentity MakeBlockIdentity(const Digest128& weights, const KvFormat& format,
                                int32_t group_index = 0, const KvGroupSpec& group = {});

struct BlockFileHeader {
  BlockIdentity identity;
  BlockHash hash;    // the block's chain hash (its key in the store)
  BlockHash parent;  // the chain hash of the block before it (zero for the first)
  BlockCodec codec = BlockCodec::kRaw;
  std::vector<int32_t> tokens;  // [block_size] the block's token ids
  // The RoPE position of the block's first slot: not in the header (the chain hash fixes it),
  // handed to a KvBlockCodec, which keeps what it needs in its payload.
  int32_t first_position = 0;
};

struct DecodedBlock {
  BlockFileHeader header;
  std::vector<uint8_t> payload;  // the block's K/V bytes, decompressed
};

// The file's bytes: header, the payload stored with header.codec (zstd at zstd_level;
// kTransform by transform, which must be given then), checksum. A transform payload no smaller
// than the raw bytes is stored raw instead (so no file outgrows MaxBlockFileBytes).
Expected<std::vector<uint8_t>> EncodeBlockFile(const BlockFileHeader& header,
                                               std::span<const uint8_t> payload, int zstd_level = 3,
                                               const KvBlockCodec* transform = nullptr);

// The most bytes a file of a block of payload_bytes can have, whatever its codec (header,
// zstd's worst case, checksum): a store may refuse to read anything larger.
size_t MaxBlockFileBytes(const BlockIdentity& identity, size_t payload_bytes);

// Checks and decodes a file's bytes. An error (naming what failed: truncated, checksum,
// version, identity, hash, payload size, codec) for anything but the expected block: the
// caller counts it as corrupt and recomputes. A kTransform payload is decoded by transform; a
// reader without one (or with another fit) cannot read it: an error too.
// *other_codec (when given) is set when the file is sound but was written with a codec this
// reader cannot decode: transform-coded with no transform here, or with another fit.
Expected<DecodedBlock> DecodeBlockFile(std::span<const uint8_t> bytes,
                                       const BlockIdentity& expected_identity,
                                       const BlockHash& expected_hash,
                                       const KvBlockCodec* transform = nullptr,
                                       bool* other_codec = nullptr);

// Writes bytes to dir/name through a temporary file in dir: written, fsync'd, renamed over
// name, and the directory fsync'd. On any error the temporary file is removed and name is
// untouched.
Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           std::span<const uint8_t> bytes);

// The bytes of a regular file of at most max_bytes (a directory, a device, a larger file or an
// unreadable one is an error).
Expected<std::vector<uint8_t>> ReadBlockFileBytes(const std::string& path,
                                                  uint64_t max_bytes = kMaxBlockFileBytes);

}  // namespace kvs
