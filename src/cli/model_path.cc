#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "cli/commands.h"
#include "core/text_file.h"

namespace kvs::cli {
namespace fs = std::filesystem;

std::string DefaultModelPath() {
  if (const char* env = std::getenv("KVSERVE_MODEL"); env && *env) return env;
  std::error_code ec;
  for (const char* candidate : {"../shared/models/stories260K.gguf"}) {
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    fs::path cached = fs::path(home) / ".cache/kvserve/models/stories260K.gguf";
    if (fs::is_regular_file(cached, ec)) return cached.string();
  }
  return "";
}

bool ResolveModelPath(std::string& path) {
  if (!path.empty()) return true;
  path = DefaultModelPath();
  if (!path.empty()) return true;
  std::fprintf(stderr,
               "error: no model given and no default model found.\n"
               "  Pass -m MODEL.gguf, set KVSERVE_MODEL, or run scripts/run.sh once to download\n"
               "  stories260K.gguf into ~/.cache/kvserve/models.\n");
  return false;
}

bool ReadTextFile(const std::string& path, std::string* out) {
  auto text = kvs::ReadTextFile(path, kMaxInputFileBytes);
  if (!text) {
    std::fprintf(stderr, "error: %s\n", text.error().c_str());
    return false;
  }
  *out = std::move(*text);
  return true;
}

bool LoadScoredText(std::string* model_path, const std::string& text_path, bool check_tensors,
                    int32_t max_chunks, int32_t n_ctx, LoadedModel* loaded,
                    std::vector<int32_t>* ids) {
  if (!ResolveModelPath(*model_path)) return false;
  std::string text;
  if (!ReadTextFile(text_path, &text)) return false;
  if (!LoadModelWithTokenizer(*model_path, check_tensors, loaded)) return false;
  *ids = loaded->tokenizer->Encode(text, /*add_special=*/true, /*parse_special=*/false);
  // As llama-perplexity: the whole text must hold two contexts, however few chunks are scored.
  if (static_cast<int64_t>(ids->size()) < 2 * static_cast<int64_t>(n_ctx)) {
    std::fprintf(stderr,
                 "error: %s has %zu tokens; perplexity with a context of %d needs at least %lld\n",
                 text_path.c_str(), ids->size(), n_ctx, 2 * static_cast<long long>(n_ctx));
    return false;
  }
  if (max_chunks > 0 &&
      static_cast<int64_t>(ids->size()) > static_cast<int64_t>(max_chunks) * n_ctx) {
    ids->resize(static_cast<size_t>(max_chunks) * n_ctx);
  }
  return true;
}

bool LoadModelWithTokenizer(const std::string& path, bool check_tensors, LoadedModel* out) {
  auto model = Model::Load(path, {.check_tensors = check_tensors});
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.error().c_str());
    return false;
  }
  auto tok = Tokenizer::FromGguf((*model)->file());
  if (!tok) {
    std::fprintf(stderr, "error: %s: %s\n", path.c_str(), tok.error().c_str());
    return false;
  }
  out->model = std::move(*model);
  out->tokenizer = std::move(*tok);
  return true;
}

}  // namespace kvs::cli
