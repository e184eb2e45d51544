#include <cstdio>

#include <algorithm>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/kv_format_factory.h"
#include "kernels/kv_types.h"
#include "model/weights.h"

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

int RunInspect(const std::string& path, bool all_metadata, int64_t kv_memory) {
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
  auto model = Model::FromFile(std::move(*file));
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
              c.n_ctx_train, c.rope_neox ? "neox" : "normal", c.n_rot, c.rope_freq_base, c.rms_eps);
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
  return 0;
}

}  // namespace

Runner AddInspectCommand(CLI::App& root) {
  struct Args {
    std::string path;
    bool all = false;
    std::string kv_memory = "1GiB";
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd =
      root.add_subcommand("inspect", "Print a GGUF file's metadata, tensors and memory needs");
  cmd->add_option("model", a->path, "GGUF file")->required();
  cmd->add_flag("--all", a->all, "Print metadata arrays in full");
  cmd->add_option("--kv-memory", a->kv_memory,
                  "KV cache size for the tokens-that-fit table (512M, 4G, 2GiB, 25%)")
      ->capture_default_str();
  return [a] {
    int64_t kv_memory = 0;
    std::string error;
    if (!ParseMemorySize(a->kv_memory, &kv_memory, &error)) {
      std::fprintf(stderr, "error: %s\n", error.c_str());
      return 1;
    }
    return RunInspect(a->path, a->all, kv_memory);
  };
}

}  // namespace kvs::cli
