#include <cstdio>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/thread_pool.h"
#include "engine/kv_format_factory.h"
#include "kernels/cpu_isa.h"
#include "kernels/kv_types.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {
namespace {

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, units[u]);
  return buf;
}

struct InspectArgs {
  std::string path;
  bool all = false;
  bool json = false;
  std::string kv_memory = "1GiB";
  // The KV format whose fingerprint is printed.
  std::string cache_type_k = "f16", cache_type_v = "f16";
  int32_t n_ctx = 4096;
  int32_t block_size = 16;
  std::string kv_calibration;
  int32_t threads = ThreadPool::DefaultThreadCount();
};

// The KV format the flags describe, as the engine would make it (calibrating quantized keys).
Expected<KvFormatPtr> InspectKvFormat(const Model& model, const InspectArgs& a) {
  KvFormatOptions kv;
  auto k = ParseKvType(a.cache_type_k);
  if (!k) return Status::Error("--cache-type-k: " + k.error());
  auto v = ParseKvType(a.cache_type_v);
  if (!v) return Status::Error("--cache-type-v: " + v.error());
  kv.types = {*k, *v};
  kv.block_size = a.block_size;
  kv.n_ctx = a.n_ctx;
  ThreadPool pool(ThreadPool::ResolveThreadCount(a.threads));
  // Only quantized keys are calibrated, so only they need the tokenizer.
  if (!KvTypeIsQuantized(*k)) {
    if (!a.kv_calibration.empty()) WarnCalibrationUnused(*k);
    return MakeKvFormat(model, nullptr, pool, kv);
  }
  auto tok = Tokenizer::FromGguf(model.file());
  if (!tok) return Status::Error(tok.error());
  if (!a.kv_calibration.empty()) {
    KVS_RETURN_IF_ERROR(UseCalibrationFile(a.kv_calibration, **tok, &kv));
  }
  return MakeKvFormat(model, tok->get(), pool, kv);
}

nlohmann::json KvFormatJson(const KvFormat& f) {
  return {{"cache_type_k", std::string(KvTypeName(f.k_type()))},
          {"cache_type_v", std::string(KvTypeName(f.v_type()))},
          {"block_size", f.block_size()},
          {"key_coding", KeyCodingKindName(f.key_coding_kind())},
          {"calibration", f.key_coding_kind() == KeyCodingKind::kPlain
                              ? nlohmann::json(nullptr)
                              : nlohmann::json(f.calibration().source)},
          {"calibration_tokens_digest", f.calibration().tokens.Hex()},
          {"offset_context", f.calibration().offset_context},
          {"version", kKvFormatVersion},
          {"bytes_per_token", f.geometry().BytesPerToken()},
          {"fingerprint", f.fingerprint().Hex()}};
}

// `inspect --json`: the file, the model, and the two digests a cached KV block depends on.
int RunInspectJson(const InspectArgs& a) {
  // Loaded as the engine loads it (read into memory and repacked): the calibration's arithmetic,
  // and so a quantized K type's fingerprint, follows the kernels the weights' layout selects.
  auto model = Model::Load(a.path);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.error().c_str());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  const gguf::File& f = (*model)->file();
  auto format = InspectKvFormat(**model, a);
  if (!format) {
    std::fprintf(stderr, "error: %s\n", format.error().c_str());
    return 1;
  }
  nlohmann::json j = {{"file", a.path},
                      {"gguf_version", f.version()},
                      {"size_bytes", f.size()},
                      {"n_tensors", f.tensors().size()},
                      {"model",
                       {{"name", c.name},
                        {"arch", c.arch_name},
                        {"n_layer", c.n_layer},
                        {"n_embd", c.n_embd},
                        {"n_head", c.n_head},
                        {"n_head_kv", c.n_head_kv},
                        {"head_dim_k", c.head_dim_k},
                        {"head_dim_v", c.head_dim_v},
                        {"n_vocab", c.n_vocab},
                        {"n_ctx_train", c.n_ctx_train},
                        {"weight_bytes_per_token", (*model)->WeightBytesPerToken()}}},
                      {"weights_digest", (*model)->weights_digest().Hex()},
                      {"weights_digest_seconds", (*model)->weights_digest_seconds()},
                      {"n_ctx", a.n_ctx},
                      {"kv_format", KvFormatJson(**format)},
                      {"kv_format_fingerprint", (*format)->fingerprint().Hex()},
                      {"isa", std::string(IsaName(ActiveIsa()))}};
  // A path or model name need not be UTF-8: replaced, not refused.
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

int RunInspect(const InspectArgs& a, int64_t kv_memory) {
  const std::string& path = a.path;
  const bool all_metadata = a.all;
  auto file = gguf::File::Open(path);
  if (!file) {
    std::fprintf(stderr, "error: %s\n", file.error().c_str());
    return 1;
  }
  const gguf::File& f = **file;
  std::printf("file: %s\n", path.c_str());
  std::printf("gguf version: %u, alignment: %llu, data offset: %llu, size: %s\n", f.version(),
              static_cast<unsigned long long>(f.alignment()),
              static_cast<unsigned long long>(f.data_offset()), HumanBytes(f.size()).c_str());
  std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
  for (const auto& [key, value] : f.metadata()) {
    std::printf("  %-44s %-4s %s\n", key.c_str(),
                std::string(gguf::ValueTypeName(value.type)).c_str(),
                value.ToString(all_metadata ? SIZE_MAX : 8).c_str());
  }
  std::printf("\ntensors (%zu):\n", f.tensors().size());
  uint64_t total = 0;
  for (const auto& t : f.tensors()) {
    std::string dims;
    for (size_t i = 0; i < t.dims.size(); ++i) dims += (i ? " x " : "") + std::to_string(t.dims[i]);
    std::printf("  %-36s %-6s %-20s %s\n", t.name.c_str(), std::string(DTypeName(t.type)).c_str(),
                dims.c_str(), HumanBytes(t.n_bytes).c_str());
    total += t.n_bytes;
  }
  std::printf("  total tensor data: %s\n", HumanBytes(total).c_str());

  if (f.tensors().empty()) {
    std::printf("\n(vocabulary-only file: no model to run)\n");
    return 0;
  }
  // The model itself is loaded as the engine loads it: read (so a file that shrinks meanwhile is
  // an error, not a bus error) and repacked (which the KV format's calibration depends on).
  file->reset();
  auto model = Model::Load(path);
  if (!model) {
    std::printf("\nmodel: cannot be run by kvserve: %s\n", model.error().c_str());
    return 0;
  }
  const ModelConfig& c = (*model)->config();
  std::printf("\nmodel: %s (%s)\n", c.name.c_str(), c.arch_name.c_str());
  std::printf(
      "  layers %d, embedding %d, feed-forward %d, heads %d (kv %d), head dim k %d / v %d\n",
      c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.head_dim_k, c.head_dim_v);
  std::printf("  vocab %d, training context %d, rope %s dims %d base %g, rms eps %g\n", c.n_vocab,
              c.n_ctx_train, c.ropes[0].neox ? "neox" : "normal", c.ropes[0].n_rot,
              c.ropes[0].freq_base, c.rms_eps);
  std::printf("memory:\n");
  std::printf("  weights (mapped): %s\n", HumanBytes(total).c_str());
  std::printf("  weights read per decoded token: %s\n",
              HumanBytes((*model)->WeightBytesPerToken()).c_str());
  // What each KV type (K and V alike) costs, and how many tokens fit in kv_memory.
  std::printf("  KV cache by type (--cache-type-k/-v), tokens that fit in --kv-memory %s:\n",
              HumanBytes(static_cast<double>(kv_memory)).c_str());
  std::printf("    %-7s %10s %14s %12s %9s\n", "type", "bits/elem", "per token", "tokens",
              "vs f16");
  const double f16_per_token =
      ModelKvGeometry(c, kKvBlockTokens, {KvType::kF16, KvType::kF16}).BytesPerToken();
  for (KvType t : kAllKvTypes) {
    const KvGeometry g = ModelKvGeometry(c, kKvBlockTokens, {t, t});
    if (!g.Validate().ok()) {
      std::printf("    %-7s (head size %d is not a multiple of 8)\n",
                  std::string(KvTypeName(t)).c_str(), c.head_dim_k);
      continue;
    }
    const int64_t blocks = kv_memory / static_cast<int64_t>(g.BytesPerBlock()) - 1;  // null block
    std::printf("    %-7s %10.2f %14s %12lld %8.2fx\n", std::string(KvTypeName(t)).c_str(),
                KvBitsPerElement(t, c.head_dim_k), HumanBytes(g.BytesPerToken()).c_str(),
                static_cast<long long>(std::max<int64_t>(blocks, 0) * kKvBlockTokens),
                f16_per_token / g.BytesPerToken());
  }
  std::printf("  KV cache at the training context (%d), f16: %s\n", c.n_ctx_train,
              HumanBytes(f16_per_token * c.n_ctx_train).c_str());
  std::printf("digests (what a cached KV block depends on besides its tokens):\n");
  std::printf("  weights: %s (%.0f ms)\n", (*model)->weights_digest().Hex().c_str(),
              1e3 * (*model)->weights_digest_seconds());
  auto format = InspectKvFormat(**model, a);
  if (!format) {
    std::fprintf(stderr, "error: %s\n", format.error().c_str());
    return 1;
  }
  std::printf("  KV format (-c %d): %s\n", a.n_ctx, (*format)->Describe().c_str());
  return 0;
}

}  // namespace

Runner AddInspectCommand(CLI::App& root) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* cmd =
      root.add_subcommand("inspect", "Print a GGUF file's metadata, tensors and memory needs");
  cmd->add_option("model", a->path, "GGUF file")->required();
  cmd->add_flag("--all", a->all, "Print metadata arrays in full");
  cmd->add_option("--kv-memory", a->kv_memory,
                  "KV cache size for the tokens-that-fit table (512M, 4G, 2GiB, 25%)")
      ->capture_default_str();
  cmd->add_option("--cache-type-k", a->cache_type_k,
                  "KV cache type of keys, for the KV format fingerprint; also -ctk")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", a->cache_type_v, "KV cache type of values; also -ctv")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", a->n_ctx,
                  "Context (an 8-bit key offset is averaged over it: part of the KV format)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 24));
  cmd->add_option("--block-size", a->block_size, "Positions per KV block (a multiple of 16)")
      ->capture_default_str()
      ->check(CLI::Range(16, 1024));
  cmd->add_option("--kv-calibration", a->kv_calibration, kKvCalibrationHelp);
  cmd->add_option("-t,--threads", a->threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--json", a->json,
                "Print one JSON object: the model, weights_digest and kv_format_fingerprint");
  return [a] {
    int64_t kv_memory = 0;
    std::string error;
    if (!ParseMemorySize(a->kv_memory, &kv_memory, &error)) {
      std::fprintf(stderr, "error: %s\n", error.c_str());
      return 1;
    }
    if (a->json) return RunInspectJson(*a);
    return RunInspect(*a, kv_memory);
  };
}

}  // namespace kvs::cli
