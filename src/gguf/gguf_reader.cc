#include "gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "core/text_file.h"

namespace kvs::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;
// Generous caps that still stop a corrupt count from driving a huge allocation.
constexpr uint64_t kMaxStringLength = 1ull << 30;
constexpr uint64_t kMaxElements = 1ull << 40;

// Bounds-checked little-endian cursor over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, uint32_t version)
      : base_(base), size_(size), version_(version) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  Status Read(T* out, const char* what) {
    if (remaining() < sizeof(T)) {
      *out = T{};
      return Status::Error(StrFormat("truncated file: %s at offset %zu needs %zu bytes, %zu left",
                                     what, pos_, sizeof(T), remaining()));
    }
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  // Counts and lengths are uint32 in v1 and uint64 from v2 on.
  Status ReadCount(uint64_t* out, const char* what) {
    if (version_ == 1) {
      uint32_t v = 0;
      KVS_RETURN_IF_ERROR(Read(&v, what));
      *out = v;
      return Status::Ok();
    }
    return Read(out, what);
  }

  Status ReadString(std::string* out, const char* what) {
    uint64_t len;
    KVS_RETURN_IF_ERROR(ReadCount(&len, what));
    if (len > kMaxStringLength || len > remaining()) {
      return Status::Error(StrFormat("corrupt file: %s at offset %zu has length %llu, past the end",
                                     what, pos_, static_cast<unsigned long long>(len)));
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

 private:
  const uint8_t* base_;
  size_t size_;
  uint32_t version_;
  size_t pos_ = 0;
};

bool ValidValueType(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::kFloat64);
}

Status ReadScalar(Cursor& c, ValueType t, int64_t* i, double* f, const std::string& key) {
  const char* what = "metadata value";
  switch (t) {
    case ValueType::kUint8: {
      uint8_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = v;
      break;
    }
    case ValueType::kInt8: {
      int8_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = v;
      break;
    }
    case ValueType::kUint16: {
      uint16_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = v;
      break;
    }
    case ValueType::kInt16: {
      int16_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = v;
      break;
    }
    case ValueType::kUint32: {
      uint32_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = v;
      break;
    }
    case ValueType::kInt32: {
      int32_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = v;
      break;
    }
    case ValueType::kUint64: {
      uint64_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = static_cast<int64_t>(v);
      break;
    }
    case ValueType::kInt64: {
      int64_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *i = v;
      break;
    }
    case ValueType::kFloat32: {
      float v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *f = v;
      break;
    }
    case ValueType::kFloat64: {
      double v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      *f = v;
      break;
    }
    case ValueType::kBool: {
      uint8_t v;
      KVS_RETURN_IF_ERROR(c.Read(&v, what));
      if (v > 1)
        return Status::Error(StrFormat("corrupt file: key '%s' has bool value %u", key.c_str(), v));
      *i = v;
      break;
    }
    default:
      return Status::Error(StrFormat("corrupt file: key '%s' has non-scalar type", key.c_str()));
  }
  return Status::Ok();
}

Status ReadValue(Cursor& c, ValueType type, Value* out, const std::string& key, int depth);

Status ReadArray(Cursor& c, Value* out, const std::string& key, int depth) {
  if (depth > kMaxArrayDepth) {
    return Status::Error(StrFormat("corrupt file: key '%s' nests arrays deeper than %d",
                                   key.c_str(), kMaxArrayDepth));
  }
  uint32_t elem;
  KVS_RETURN_IF_ERROR(c.Read(&elem, "array element type"));
  if (!ValidValueType(elem)) {
    return Status::Error(
        StrFormat("corrupt file: key '%s' has unknown array element type %u", key.c_str(), elem));
  }
  uint64_t n;
  KVS_RETURN_IF_ERROR(c.ReadCount(&n, "array length"));
  out->type = ValueType::kArray;
  out->array_type = static_cast<ValueType>(elem);
  // Every element takes at least one byte (strings and arrays at least 4), so a count larger
  // than the bytes left is corrupt; checking first keeps reserve() bounded by the file size.
  size_t min_elem = ScalarSize(out->array_type);
  if (min_elem == 0) min_elem = 4;
  if (n > c.remaining() / min_elem) {
    return Status::Error(
        StrFormat("corrupt file: array '%s' claims %llu elements, more than the file holds",
                  key.c_str(), static_cast<unsigned long long>(n)));
  }
  switch (out->array_type) {
    case ValueType::kString:
      out->strings.resize(n);
      for (uint64_t k = 0; k < n; ++k)
        KVS_RETURN_IF_ERROR(c.ReadString(&out->strings[k], "array string"));
      break;
    case ValueType::kArray:
      out->arrays.resize(n);
      for (uint64_t k = 0; k < n; ++k)
        KVS_RETURN_IF_ERROR(ReadArray(c, &out->arrays[k], key, depth + 1));
      break;
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      out->floats.resize(n);
      for (uint64_t k = 0; k < n; ++k) {
        int64_t unused;
        KVS_RETURN_IF_ERROR(ReadScalar(c, out->array_type, &unused, &out->floats[k], key));
      }
      break;
    default:
      out->ints.resize(n);
      for (uint64_t k = 0; k < n; ++k) {
        double unused;
        KVS_RETURN_IF_ERROR(ReadScalar(c, out->array_type, &out->ints[k], &unused, key));
      }
  }
  return Status::Ok();
}

// "[64, 512]": GGML order, as the file stores it.
std::string DimsString(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

Status ReadValue(Cursor& c, ValueType type, Value* out, const std::string& key, int depth) {
  out->type = type;
  if (type == ValueType::kString) return c.ReadString(&out->str, "string value");
  if (type == ValueType::kArray) return ReadArray(c, out, key, depth);
  return ReadScalar(c, type, &out->i, &out->f, key);
}

// "'name' (f32 [64, 512], 131072 bytes at data offset 0)": what decided a tensor's place and size.
std::string Describe(const TensorInfo& t) {
  return StrFormat("'%s' (%s %s, %llu bytes at data offset %llu)", t.name.c_str(),
                   std::string(DTypeName(t.type)).c_str(), DimsString(t.dims).c_str(),
                   static_cast<unsigned long long>(t.n_bytes),
                   static_cast<unsigned long long>(t.offset));
}

// Tensor k does not start at `expected`, the padded end of the tensor before it: name the
// tensor it collides with, or say how far apart the two are.
Status TensorLayoutError(const std::vector<TensorInfo>& tensors, size_t k, uint64_t expected,
                         uint64_t alignment) {
  const TensorInfo& t = tensors[k];
  const auto exp = static_cast<unsigned long long>(expected);
  if (k == 0) {
    return Status::Error(
        StrFormat("corrupt file: the first tensor %s should start at data offset 0 "
                  "(tensors must be contiguous in file order)",
                  Describe(t).c_str()));
  }
  if (t.offset < expected) {
    for (size_t j = 0; j < k; ++j) {
      const TensorInfo& o = tensors[j];
      if (t.offset < o.offset + o.n_bytes && o.offset < t.offset + t.n_bytes) {
        return Status::Error(StrFormat("corrupt file: tensor %s overlaps tensor %s",
                                       Describe(t).c_str(), Describe(o).c_str()));
      }
    }
  }
  // A gap, or a start inside the previous tensor's padding: one of the two tensors has the
  // wrong type, shape or offset (a smaller type leaves part of its slot unread).
  return Status::Error(StrFormat(
      "corrupt file: tensor %s should start at data offset %llu, the end of the tensor before "
      "it, %s, rounded up to the alignment of %llu; a type, shape or offset is wrong",
      Describe(t).c_str(), exp, Describe(tensors[k - 1]).c_str(),
      static_cast<unsigned long long>(alignment)));
}

}  // namespace

File::~File() {
  if (mapping_) munmap(mapping_, size_);
}

Expected<std::unique_ptr<File>> File::Open(const std::string& path, LoadMode mode) {
  // O_NONBLOCK: opening a FIFO (a -m or -md naming one) would otherwise wait for a writer
  // forever before fstat could refuse it. Reads of a regular file ignore the flag.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Status::Error(StrFormat("cannot open '%s': %s", path.c_str(), std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const char* kind = fstat(fd, &st) == 0 ? FileKind(st.st_mode) : "not a regular file";
    ::close(fd);
    return Status::Error(StrFormat("'%s' is %s, not a regular file", path.c_str(), kind));
  }
  std::unique_ptr<File> file(new File());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    if (mode == LoadMode::kMap) {
      void* m = mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        ::close(fd);
        return Status::Error(StrFormat("cannot map '%s': %s", path.c_str(), std::strerror(errno)));
      }
      file->mapping_ = m;
      file->base_ = static_cast<const uint8_t*>(m);
    } else {
      auto mem = AllocatePages(file->size_, PageSize::kHuge);
      if (!mem) {
        ::close(fd);
        return Status::Error(StrFormat("cannot map '%s': %s", path.c_str(), mem.error().c_str()));
      }
      uint8_t* m = mem->data();
      size_t done = 0;
      while (done < file->size_) {
        ssize_t got = ::pread(fd, m + done, file->size_ - done, static_cast<off_t>(done));
        if (got <= 0) {
          const int err = errno;
          ::close(fd);
          return Status::Error(StrFormat("cannot read '%s': %s", path.c_str(),
                                         got < 0 ? std::strerror(err) : "unexpected end of file"));
        }
        done += static_cast<size_t>(got);
      }
      file->pages_ = std::move(*mem);
      file->base_ = m;
    }
    file->writable_ = mode == LoadMode::kRead;
  }
  ::close(fd);
  Status st2 = file->Parse();
  if (!st2.ok()) return Status::Error(path + ": " + st2.message());
  return file;
}

Expected<std::unique_ptr<File>> File::FromBytes(std::vector<uint8_t> bytes) {
  std::unique_ptr<File> file(new File());
  file->path_ = "<memory>";
  file->owned_ = std::move(bytes);
  file->base_ = file->owned_.data();
  file->size_ = file->owned_.size();
  file->writable_ = true;
  KVS_RETURN_IF_ERROR(file->Parse());
  return file;
}

Status File::Parse() {
  Cursor c(base_, size_, 0);
  uint32_t magic;
  if (size_ < 8) return Status::Error(StrFormat("not a GGUF file: only %zu bytes", size_));
  KVS_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kMagic) {
    return Status::Error(StrFormat("not a GGUF file: bad magic 0x%08x (expected 'GGUF')", magic));
  }
  KVS_RETURN_IF_ERROR(c.Read(&version_, "version"));
  if (version_ == 1) {
    return Status::Error(
        "GGUF version 1 is not supported (an old format with 32-bit counts); "
        "convert the model to GGUF v3 with a current llama.cpp");
  }
  if (version_ != 2 && version_ != 3) {
    return Status::Error(
        StrFormat("unsupported GGUF version %u (kvserve reads versions 2 and 3)", version_));
  }
  c = Cursor(base_, size_, version_);
  uint32_t skip;
  KVS_RETURN_IF_ERROR(c.Read(&skip, "magic"));
  KVS_RETURN_IF_ERROR(c.Read(&skip, "version"));
  uint64_t n_tensors, n_kv;
  KVS_RETURN_IF_ERROR(c.ReadCount(&n_tensors, "tensor count"));
  KVS_RETURN_IF_ERROR(c.ReadCount(&n_kv, "metadata count"));
  // A key-value pair takes at least 12 bytes and a tensor info at least 24.
  if (n_kv > c.remaining() / 12) {
    return Status::Error(
        StrFormat("corrupt file: metadata count %llu is larger than the file can hold",
                  static_cast<unsigned long long>(n_kv)));
  }
  if (n_tensors > c.remaining() / 24) {
    return Status::Error(
        StrFormat("corrupt file: tensor count %llu is larger than the file can hold",
                  static_cast<unsigned long long>(n_tensors)));
  }

  metadata_.reserve(n_kv);
  std::unordered_set<std::string> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    KVS_RETURN_IF_ERROR(c.ReadString(&key, "metadata key"));
    uint32_t type;
    KVS_RETURN_IF_ERROR(c.Read(&type, "metadata type"));
    if (!ValidValueType(type)) {
      return Status::Error(
          StrFormat("corrupt file: key '%s' has unknown value type %u", key.c_str(), type));
    }
    Value value;
    KVS_RETURN_IF_ERROR(ReadValue(c, static_cast<ValueType>(type), &value, key, 0));
    if (!keys.insert(key).second) {
      return Status::Error(StrFormat("corrupt file: duplicate metadata key '%s'", key.c_str()));
    }
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const Value* a = Find("general.alignment")) {
    auto v = a->AsUint();
    if (!v || *v == 0 || (*v & (*v - 1)) != 0 || *v > (1u << 20)) {
      return Status::Error("corrupt file: general.alignment must be a power of two");
    }
    alignment_ = *v;
  }

  tensors_.reserve(n_tensors);
  std::unordered_set<std::string> names;
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t;
    KVS_RETURN_IF_ERROR(c.ReadString(&t.name, "tensor name"));
    uint32_t n_dims;
    KVS_RETURN_IF_ERROR(c.Read(&n_dims, "tensor dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return Status::Error(StrFormat("corrupt file: tensor '%s' has %u dimensions (1..%u allowed)",
                                     t.name.c_str(), n_dims, kMaxDims));
    }
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim;
      KVS_RETURN_IF_ERROR(c.ReadCount(&dim, "tensor dimension"));
      if (dim == 0 || dim > kMaxElements || t.n_elements > kMaxElements / dim) {
        return Status::Error(StrFormat("corrupt file: tensor '%s' has an absurd dimension %llu",
                                       t.name.c_str(), static_cast<unsigned long long>(dim)));
      }
      t.n_elements *= dim;
      t.dims.push_back(dim);
    }
    uint32_t type;
    KVS_RETURN_IF_ERROR(c.Read(&type, "tensor type"));
    auto info = GetDTypeInfo(type);
    if (!info) {
      return Status::Error(StrFormat("tensor '%s' has unknown type id %u", t.name.c_str(), type));
    }
    t.type = static_cast<DType>(type);
    if (t.dims[0] % info->block_elems != 0) {
      return Status::Error(
          StrFormat("corrupt file: tensor '%s' row of %llu is not a multiple of the %s block (%u)",
                    t.name.c_str(), static_cast<unsigned long long>(t.dims[0]),
                    std::string(info->name).c_str(), info->block_elems));
    }
    t.n_bytes = t.n_elements / info->block_elems * info->block_bytes;
    KVS_RETURN_IF_ERROR(c.Read(&t.offset, "tensor offset"));
    if (t.offset % alignment_ != 0) {
      return Status::Error(StrFormat("corrupt file: tensor '%s' offset %llu is not aligned to %llu",
                                     t.name.c_str(), static_cast<unsigned long long>(t.offset),
                                     static_cast<unsigned long long>(alignment_)));
    }
    if (!names.insert(t.name).second) {
      return Status::Error(StrFormat("corrupt file: duplicate tensor name '%s'", t.name.c_str()));
    }
    tensors_.push_back(std::move(t));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ > size_ && !tensors_.empty()) {
    return Status::Error("truncated file: the tensor data section is missing");
  }
  const uint64_t avail = size_ > data_offset_ ? size_ - data_offset_ : 0;
  // llama.cpp's rule: in file order, each tensor starts exactly where the previous one's data,
  // padded to the alignment, ends. Without it two tensors could share bytes, or a tensor whose
  // type or shape was changed to a smaller one would silently read only part of its slot.
  uint64_t expected = 0;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    TensorInfo& t = tensors_[k];
    if (t.offset > avail || t.n_bytes > avail - t.offset) {
      return Status::Error(
          StrFormat("truncated file: tensor '%s' (%llu bytes at data offset %llu) "
                    "runs past the end of the file (%zu bytes)",
                    t.name.c_str(), static_cast<unsigned long long>(t.n_bytes),
                    static_cast<unsigned long long>(t.offset), size_));
    }
    if (t.offset != expected) return TensorLayoutError(tensors_, k, expected, alignment_);
    // Bounded by the file size (checked above), so the running total cannot overflow.
    expected += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
    t.data = base_ + data_offset_ + t.offset;
  }
  // The last tensor has no successor whose offset would expose a too-small type or shape, so
  // the file's end stands in for it: a whole alignment unit or more of data that no tensor
  // claims means the tensor table and the data disagree. (Writers pad the last tensor or stop
  // right after it; both end within one alignment unit of `expected`.)
  if (!tensors_.empty() && avail > expected && avail - expected >= alignment_) {
    return Status::Error(StrFormat(
        "corrupt file: %llu bytes of tensor data after the last tensor %s belong to no tensor: "
        "its type or shape is smaller than the data written for it, or bytes were appended",
        static_cast<unsigned long long>(avail - expected), Describe(tensors_.back()).c_str()));
  }
  return Status::Ok();
}

const Value* File::Find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::optional<uint64_t> File::GetUint(std::string_view key) const {
  const Value* v = Find(key);
  return v ? v->AsUint() : std::nullopt;
}
std::optional<int64_t> File::GetInt(std::string_view key) const {
  const Value* v = Find(key);
  return v ? v->AsInt() : std::nullopt;
}
std::optional<double> File::GetFloat(std::string_view key) const {
  const Value* v = Find(key);
  return v ? v->AsFloat() : std::nullopt;
}
std::optional<bool> File::GetBool(std::string_view key) const {
  const Value* v = Find(key);
  return v ? v->AsBool() : std::nullopt;
}
std::optional<std::string> File::GetString(std::string_view key) const {
  const Value* v = Find(key);
  if (!v || !v->AsString()) return std::nullopt;
  return *v->AsString();
}

const TensorInfo* File::FindTensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace kvs::gguf
