#include <cstdio>

#include "cli/commands.h"
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

int RunInspect(const std::string& path, bool all_metadata) {
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
  double kv_per_token = 2.0 * c.n_layer * (c.k_dim() + c.v_dim()) / 2.0 * 2.0;  // f16 K and V
  std::printf("  KV cache per token (f16): %s; at the training context (%d): %s\n",
              HumanBytes(kv_per_token).c_str(), c.n_ctx_train,
              HumanBytes(kv_per_token * c.n_ctx_train).c_str());
  return 0;
}

}  // namespace

Runner AddInspectCommand(CLI::App& root) {
  struct Args {
    std::string path;
    bool all = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd =
      root.add_subcommand("inspect", "Print a GGUF file's metadata, tensors and memory needs");
  cmd->add_option("model", a->path, "GGUF file")->required();
  cmd->add_flag("--all", a->all, "Print metadata arrays in full");
  return [a] { return RunInspect(a->path, a->all); };
}

}  // namespace kvs::cli
