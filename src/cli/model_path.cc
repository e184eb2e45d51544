#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"

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
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "error: cannot read '%s'\n", path.c_str());
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace kvs::cli
