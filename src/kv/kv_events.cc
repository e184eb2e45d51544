#include "kv/kv_events.h"

#include <msgpack.hpp>

#include <cstring>
#include <exception>
#include <string_view>

namespace kvs {

namespace {

// msgpack's packer writes through any type with write(const char*, size_t): straight into the
// vector the caller gets, without an sbuffer copy.
struct KvEventByteSink {
  std::vector<uint8_t>* out;
  void write(const char* data, size_t n) {
    out->insert(out->end(), reinterpret_cast<const uint8_t*>(data),
                reinterpret_cast<const uint8_t*>(data) + n);
  }
};
using KvEventPacker = msgpack::packer<KvEventByteSink>;

// Always a msgpack float64 (0xcb and the IEEE bits big-endian): msgpack-cxx's pack_double writes
// a double with an integral value (a ts of exactly 2.0) as an int, which a decoder that insists
// on vLLM's `ts: float` may refuse. The packer writes straight through to the sink, so raw bytes
// can go between its calls.
void PackKvFloat64(KvEventByteSink& sink, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  char buf[9];
  buf[0] = static_cast<char>(0xcb);
  for (int i = 0; i < 8; ++i) buf[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
  sink.write(buf, sizeof(buf));
}

void PackKvString(KvEventPacker& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackKvHash(KvEventPacker& pk, const BlockHash& hash) {
  const std::array<uint8_t, 16> bytes = KvEventHashBytes(hash);
  pk.pack_bin(16);
  pk.pack_bin_body(reinterpret_cast<const char*>(bytes.data()), 16);
}

void PackKvHashes(KvEventPacker& pk, const std::vector<BlockHash>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const BlockHash& h : hashes) PackKvHash(pk, h);
}

void PackKvMedium(KvEventPacker& pk, const std::optional<std::string>& medium) {
  if (medium) {
    PackKvString(pk, *medium);
  } else {
    pk.pack_nil();
  }
}

void PackKvEvent(KvEventPacker& pk, const KvEvent& event) {
  if (const auto* e = std::get_if<KvBlockStored>(&event)) {
    pk.pack_array(7);
    PackKvString(pk, "BlockStored");
    PackKvHashes(pk, e->hashes);
    if (e->parent) {
      PackKvHash(pk, *e->parent);
    } else {
      pk.pack_nil();
    }
    pk.pack_array(static_cast<uint32_t>(e->token_ids.size()));
    for (int32_t t : e->token_ids) pk.pack_int32(t);
    pk.pack_int32(e->block_size);
    pk.pack_nil();  // lora_id: no adapters
    PackKvMedium(pk, e->medium);
  } else if (const auto* r = std::get_if<KvBlockRemoved>(&event)) {
    pk.pack_array(3);
    PackKvString(pk, "BlockRemoved");
    PackKvHashes(pk, r->hashes);
    PackKvMedium(pk, r->medium);
  } else {
    pk.pack_array(1);
    PackKvString(pk, "AllBlocksCleared");
  }
}

// Decoding: every accessor checks the object's type and says which field was wrong.
using MsgObject = msgpack::object;

Status KvDecodeError(std::string_view what) {
  return Status::Error("kv event batch: " + std::string(what));
}

bool KvObjectIsArray(const MsgObject& o) {
  return o.type == msgpack::type::ARRAY;
}

Expected<BlockHash> DecodeKvHash(const MsgObject& o) {
  if (o.type == msgpack::type::BIN) {
    if (o.via.bin.size != 16) return KvDecodeError("a block hash is not 16 bytes");
    const auto* p = reinterpret_cast<const uint8_t*>(o.via.bin.ptr);
    BlockHash h;
    for (int i = 0; i < 8; ++i) h.hi = h.hi << 8 | p[i];
    for (int i = 8; i < 16; ++i) h.lo = h.lo << 8 | p[i];
    return h;
  }
  if (o.type == msgpack::type::POSITIVE_INTEGER) return BlockHash{o.via.u64, 0};
  return KvDecodeError("a block hash is neither bin nor an unsigned int");
}

Expected<std::vector<BlockHash>> DecodeKvHashes(const MsgObject& o) {
  if (!KvObjectIsArray(o)) return KvDecodeError("block_hashes is not an array");
  std::vector<BlockHash> hashes;
  hashes.reserve(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    KVS_ASSIGN_OR_RETURN(BlockHash h, DecodeKvHash(o.via.array.ptr[i]));
    hashes.push_back(h);
  }
  return hashes;
}

Expected<int64_t> DecodeKvInt(const MsgObject& o, const char* field) {
  if (o.type == msgpack::type::POSITIVE_INTEGER && o.via.u64 <= uint64_t{INT64_MAX}) {
    return static_cast<int64_t>(o.via.u64);
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  return KvDecodeError(std::string(field) + " is not an integer");
}

Expected<std::optional<std::string>> DecodeKvMedium(const MsgObject& o) {
  if (o.type == msgpack::type::NIL) return std::optional<std::string>();
  if (o.type != msgpack::type::STR) return KvDecodeError("medium is neither a string nor nil");
  return std::optional<std::string>(std::string(o.via.str.ptr, o.via.str.size));
}

Expected<KvEvent> DecodeKvEvent(const MsgObject& o) {
  if (!KvObjectIsArray(o) || o.via.array.size == 0)
    return KvDecodeError("an event is not an array");
  const MsgObject* f = o.via.array.ptr;
  const uint32_t n = o.via.array.size;
  if (f[0].type != msgpack::type::STR) return KvDecodeError("an event's tag is not a string");
  const std::string_view tag(f[0].via.str.ptr, f[0].via.str.size);
  if (tag == "BlockStored") {
    if (n < 6) return KvDecodeError("BlockStored has fewer than 5 fields");
    KvBlockStored e;
    KVS_ASSIGN_OR_RETURN(e.hashes, DecodeKvHashes(f[1]));
    if (f[2].type != msgpack::type::NIL) {
      KVS_ASSIGN_OR_RETURN(e.parent, DecodeKvHash(f[2]));
    }
    if (!KvObjectIsArray(f[3])) return KvDecodeError("token_ids is not an array");
    for (uint32_t i = 0; i < f[3].via.array.size; ++i) {
      KVS_ASSIGN_OR_RETURN(int64_t t, DecodeKvInt(f[3].via.array.ptr[i], "a token id"));
      e.token_ids.push_back(static_cast<int32_t>(t));
    }
    KVS_ASSIGN_OR_RETURN(int64_t block_size, DecodeKvInt(f[4], "block_size"));
    e.block_size = static_cast<int32_t>(block_size);
    // f[5], lora_id, is not kept (kvserve has none); medium follows it where present.
    if (n > 6) {
      KVS_ASSIGN_OR_RETURN(e.medium, DecodeKvMedium(f[6]));
    }
    return KvEvent(std::move(e));
  }
  if (tag == "BlockRemoved") {
    if (n < 2) return KvDecodeError("BlockRemoved has no block_hashes");
    KvBlockRemoved e;
    KVS_ASSIGN_OR_RETURN(e.hashes, DecodeKvHashes(f[1]));
    if (n > 2) {
      KVS_ASSIGN_OR_RETURN(e.medium, DecodeKvMedium(f[2]));
    }
    return KvEvent(std::move(e));
  }
  if (tag == "AllBlocksCleared") return KvEvent(KvAllBlocksCleared{});
  return KvDecodeError("unknown event type");
}

Expected<KvEventBatch> DecodeKvBatchObject(const MsgObject& o) {
  if (!KvObjectIsArray(o) || o.via.array.size < 2) {
    return KvDecodeError("not an array of at least [ts, events]");
  }
  const MsgObject* f = o.via.array.ptr;
  KvEventBatch batch;
  if (f[0].type == msgpack::type::FLOAT64 || f[0].type == msgpack::type::FLOAT32) {
    batch.ts = f[0].via.f64;
  } else {
    KVS_ASSIGN_OR_RETURN(int64_t ts, DecodeKvInt(f[0], "ts"));
    batch.ts = static_cast<double>(ts);
  }
  if (!KvObjectIsArray(f[1])) return KvDecodeError("events is not an array");
  for (uint32_t i = 0; i < f[1].via.array.size; ++i) {
    KVS_ASSIGN_OR_RETURN(KvEvent e, DecodeKvEvent(f[1].via.array.ptr[i]));
    batch.events.push_back(std::move(e));
  }
  if (o.via.array.size > 2 && f[2].type != msgpack::type::NIL) {
    KVS_ASSIGN_OR_RETURN(int64_t rank, DecodeKvInt(f[2], "data_parallel_rank"));
    batch.dp_rank = static_cast<int32_t>(rank);
  }
  return batch;
}

}  // namespace

std::array<uint8_t, 16> KvEventHashBytes(const BlockHash& hash) {
  std::array<uint8_t, 16> out;
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(hash.hi >> (56 - 8 * i));
    out[8 + i] = static_cast<uint8_t>(hash.lo >> (56 - 8 * i));
  }
  return out;
}

std::vector<uint8_t> EncodeKvEventBatch(double ts, std::span<const KvEvent> events,
                                        std::optional<int32_t> dp_rank) {
  std::vector<uint8_t> out;
  KvEventByteSink sink{&out};
  KvEventPacker pk(sink);
  pk.pack_array(dp_rank ? 3 : 2);
  PackKvFloat64(sink, ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) PackKvEvent(pk, e);
  if (dp_rank) pk.pack_int32(*dp_rank);
  return out;
}

Expected<KvEventBatch> DecodeKvEventBatch(std::span<const uint8_t> bytes) {
  try {
    // No container can hold more elements than there are bytes: the limits keep a forged length
    // from reserving memory for elements that are not there.
    const size_t n = bytes.size();
    const msgpack::unpack_limit limit(n, n, n, n, n, /*depth=*/8);
    size_t offset = 0;
    msgpack::object_handle handle = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), n,
                                                    offset, nullptr, nullptr, limit);
    if (offset != bytes.size()) return KvDecodeError("bytes after the batch");
    return DecodeKvBatchObject(handle.get());
  } catch (const std::exception& e) {
    // msgpack-cxx reports truncated or malformed input (and its size limits) by throwing.
    return Status::Error(StrFormat("kv event batch: not msgpack (%s)", e.what()));
  }
}

void KvEventRecorder::Publish(std::vector<KvEvent> events) {
  if (events.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  batches_.push_back(std::move(events));
}

std::vector<std::vector<KvEvent>> KvEventRecorder::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}

std::vector<KvEvent> KvEventRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvEvent> all;
  for (const auto& b : batches_) all.insert(all.end(), b.begin(), b.end());
  return all;
}

void KvEventRecorder::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  batches_.clear();
}

}  // namespace kvs
