#include "testing/test_models.h"

#include <cstdlib>
#include <filesystem>

namespace kvs::testing {

std::string TestModelsDir() {
  const char* env = std::getenv("KVSERVE_TEST_MODELS");
  if (env && *env) return env;
  return KVSERVE_DEFAULT_TEST_MODELS;
}

std::string TestModelPath(const std::string& relative) {
  std::filesystem::path p = std::filesystem::path(TestModelsDir()) / relative;
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) ? p.string() : std::string();
}

}  // namespace kvs::testing
