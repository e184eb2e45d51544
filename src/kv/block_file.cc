#include "kv/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/byte_io.h"

namespace kvs {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'B', 'L', 'O', 'C', 'K'};

void PutHash(ByteWriter& w, const BlockHash& h) {
  w.Int(h.lo);
  w.Int(h.hi);
}

bool GetHash(ByteReader& r, BlockHash* h) {
  return r.Int(&h->lo) && r.Int(&h->hi);
}

void WriteIdentity(ByteWriter& w, const BlockIdentity& id) {
  PutHash(w, id.model);
  PutHash(w, id.kv_format);
  w.Int(id.k_type);
  w.Int(id.v_type);
  for (int32_t v : {id.block_size, id.n_layer, id.n_head_kv, id.head_dim_k, id.head_dim_v}) {
    w.Int(v);
  }
}

bool ReadIdentity(ByteReader& r, BlockIdentity* id) {
  return GetHash(r, &id->model) && GetHash(r, &id->kv_format) && r.Int(&id->k_type) &&
         r.Int(&id->v_type) && r.Int(&id->block_size) && r.Int(&id->n_layer) &&
         r.Int(&id->n_head_kv) && r.Int(&id->head_dim_k) && r.Int(&id->head_dim_v);
}

}  // namespace

BlockIdentity MakeBlockIdentity(const Digest128& weights, const KvFormat& format,
                                int32_t group_index, const KvGroupSpec& group) {
  const KvGeometry& g = format.geometry();
  BlockIdentity id;
  id.model = {weights.lo, weights.hi};
  id.kv_format = {format.fingerprint().lo, format.fingerprint().hi};
  if (group_index != 0 || group.sliding()) {
    // Another group's blocks hold other layers' keys: the group is part of what they depend on.
    // The first, global group keeps the identity of a model with one group (files stay valid).
    const int64_t parts[] = {static_cast<int64_t>(id.kv_format.lo),
                             static_cast<int64_t>(id.kv_format.hi), group_index, group.window};
    const XXH128_hash_t h = XXH3_128bits(parts, sizeof(parts));
    id.kv_format = {h.low64, h.high64};
  }
  id.k_type = static_cast<uint8_t>(g.k_type);
  id.v_type = static_cast<uint8_t>(g.v_type);
  id.block_size = g.block_size;
  id.n_layer = g.n_layer;
  id.n_head_kv = g.n_head_kv;
  id.head_dim_k = g.head_dim_k;
  id.head_dim_v = g.head_dim_v;
  return id;
}

const char* BlockCodecName(BlockCodec codec) {
  switch (codec) {
    case BlockCodec::kRaw:
      return "raw";
    case BlockCodec::kZstd:
      return "zstd";
    case BlockCodec::kTransform:
      return "transform";
  }
  return "unknown";
}

Expected<std::vector<uint8_t>> EncodeBlockFile(const BlockFileHeader& header,
                                               std::span<const uint8_t> payload, int zstd_level,
                                               const KvBlockCodec* transform) {
  if (header.codec != BlockCodec::kRaw && header.codec != BlockCodec::kZstd &&
      header.codec != BlockCodec::kTransform) {
    return Status::Error("block file: unknown codec");
  }
  if (header.codec == BlockCodec::kTransform && transform == nullptr) {
    return Status::Error("block file: the transform codec was not given");
  }
  // Coded first: a payload no smaller than the raw bytes is stored raw.
  BlockCodec codec = header.codec;
  std::vector<uint8_t> compressed;
  if (codec == BlockCodec::kTransform) {
    auto coded = transform->Encode(payload, header.first_position);
    if (!coded.ok()) return Status::Error("block file: " + coded.error());
    if (coded->size() < payload.size()) {
      compressed = std::move(*coded);
    } else {
      codec = BlockCodec::kRaw;
    }
  }
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(kMagic, sizeof(kMagic));
  w.Int(kBlockFileVersion);
  const size_t header_bytes_at = out.size();
  w.Int(uint32_t{0});  // header bytes, filled in below
  WriteIdentity(w, header.identity);
  w.Int(static_cast<uint8_t>(codec));
  w.Bytes("\0\0\0", 3);
  PutHash(w, header.hash);
  PutHash(w, header.parent);
  w.Int(static_cast<uint32_t>(header.tokens.size()));
  for (int32_t t : header.tokens) w.Int(t);
  w.Int(static_cast<uint64_t>(payload.size()));
  std::span<const uint8_t> stored = payload;
  if (codec == BlockCodec::kTransform) stored = compressed;
  if (codec == BlockCodec::kZstd) {
    compressed.resize(ZSTD_compressBound(payload.size()));
    const size_t n = ZSTD_compress(compressed.data(), compressed.size(), payload.data(),
                                   payload.size(), zstd_level);
    if (ZSTD_isError(n)) {
      return Status::Error(std::string("block file: zstd: ") + ZSTD_getErrorName(n));
    }
    compressed.resize(n);
    stored = compressed;
  }
  w.Int(static_cast<uint64_t>(stored.size()));
  const uint32_t header_bytes = static_cast<uint32_t>(out.size());
  for (size_t i = 0; i < 4; ++i) out[header_bytes_at + i] = (header_bytes >> (8 * i)) & 0xff;
  w.Bytes(stored.data(), stored.size());
  w.Int(static_cast<uint64_t>(XXH3_64bits(out.data(), out.size())));
  return out;
}

size_t MaxBlockFileBytes(const BlockIdentity& identity, size_t payload_bytes) {
  // The fixed header fields take under 256 bytes; the token ids 4 each.
  constexpr size_t kFixed = 256;
  return kFixed + 4 * static_cast<size_t>(std::max(identity.block_size, 0)) +
         std::max(payload_bytes, ZSTD_compressBound(payload_bytes));
}

Expected<DecodedBlock> DecodeBlockFile(std::span<const uint8_t> bytes,
                                       const BlockIdentity& expected_identity,
                                       const BlockHash& expected_hash,
                                       const KvBlockCodec* transform, bool* other_codec) {
  if (other_codec != nullptr) *other_codec = false;
  if (bytes.size() < sizeof(kMagic) + 8 + 8) return Status::Error("block file: truncated");
  // The checksum first: nothing of a file whose bytes changed is read.
  const uint64_t checksum = LoadLittleEndian<uint64_t>(bytes.data() + bytes.size() - 8);
  if (XXH3_64bits(bytes.data(), bytes.size() - 8) != checksum) {
    return Status::Error("block file: checksum mismatch (torn, truncated or corrupted)");
  }
  ByteReader r(bytes.first(bytes.size() - 8));
  char magic[8];
  uint32_t version = 0, header_bytes = 0;
  if (!r.Bytes(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return Status::Error("block file: not a kvserve block (bad magic)");
  }
  if (!r.Int(&version) || version != kBlockFileVersion) {
    return Status::Error(StrFormat("block file: format version %u, this build reads %u", version,
                                   kBlockFileVersion));
  }
  DecodedBlock d;
  BlockFileHeader& h = d.header;
  uint8_t codec = 0;
  uint8_t pad[3];
  uint32_t n_tokens = 0;
  if (!r.Int(&header_bytes) || !ReadIdentity(r, &h.identity) || !r.Int(&codec) ||
      !r.Bytes(pad, 3) || !GetHash(r, &h.hash) || !GetHash(r, &h.parent) || !r.Int(&n_tokens)) {
    return Status::Error("block file: truncated header");
  }
  if (!(h.identity == expected_identity)) {
    return Status::Error("block file: written for another model, KV format or geometry");
  }
  if (!(h.hash == expected_hash)) return Status::Error("block file: another block's hash");
  if (n_tokens != static_cast<uint32_t>(expected_identity.block_size)) {
    return Status::Error("block file: token count differs from the block size");
  }
  h.tokens.resize(n_tokens);
  for (int32_t& t : h.tokens) {
    if (!r.Int(&t)) return Status::Error("block file: truncated header");
  }
  uint64_t raw_bytes = 0, stored_bytes = 0;
  if (!r.Int(&raw_bytes) || !r.Int(&stored_bytes) || r.pos() != header_bytes) {
    return Status::Error("block file: malformed header");
  }
  if (codec > static_cast<uint8_t>(BlockCodec::kTransform)) {
    return Status::Error(StrFormat("block file: codec %u is not known to this build", codec));
  }
  h.codec = static_cast<BlockCodec>(codec);
  if (stored_bytes != bytes.size() - 8 - header_bytes || raw_bytes > kMaxBlockFileBytes) {
    return Status::Error("block file: payload size disagrees with the file");
  }
  const std::span<const uint8_t> stored = bytes.subspan(header_bytes, stored_bytes);
  if (h.codec == BlockCodec::kRaw) {
    if (raw_bytes != stored_bytes) return Status::Error("block file: raw payload size mismatch");
    d.payload.assign(stored.begin(), stored.end());
    return d;
  }
  if (h.codec == BlockCodec::kTransform) {
    if (transform == nullptr) {
      if (other_codec != nullptr) *other_codec = true;
      return Status::Error("block file: transform-coded, and this tier has no transform codec");
    }
    if (Status st = transform->Decode(stored, &d.payload); !st.ok()) {
      if (other_codec != nullptr) *other_codec = transform->OtherFit(stored);
      return Status::Error("block file: " + st.message());
    }
    if (d.payload.size() != raw_bytes) {
      return Status::Error("block file: the transform payload decodes to another size");
    }
    return d;
  }
  d.payload.resize(raw_bytes);
  const size_t n =
      ZSTD_decompress(d.payload.data(), d.payload.size(), stored.data(), stored.size());
  if (ZSTD_isError(n) || n != raw_bytes) {
    return Status::Error("block file: the compressed payload does not decode to its size");
  }
  return d;
}

Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           std::span<const uint8_t> bytes) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = dir + "/." + name + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(counter.fetch_add(1));
  const std::string path = dir + "/" + name;
  auto fail = [&](const char* what) {
    const std::string msg = StrFormat("%s %s: %s", what, tmp.c_str(), std::strerror(errno));
    ::unlink(tmp.c_str());
    return Status::Error(msg);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error(StrFormat("create %s: %s", tmp.c_str(), std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return fail("fsync");
  }
  if (::close(fd) != 0) return fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  // The rename itself is durable once the directory is synced.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Expected<std::vector<uint8_t>> ReadBlockFileBytes(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: a FIFO under the name must not block the open; O_NOFOLLOW: a link is refused
  // (ELOOP), not followed. Both are then errors below, as any non-regular file is.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return Status::Error(StrFormat("open %s: %s", path.c_str(), std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return Status::Error(StrFormat("%s: not a regular file of at most %llu bytes", path.c_str(),
                                   static_cast<unsigned long long>(max_bytes)));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  // A file that shrank while read is truncated: the checksum will say so.
  bytes.resize(done);
  return bytes;
}

}  // namespace kvs
