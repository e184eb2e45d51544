#include "testing/test_models.h"

#include <gtest/gtest.h>

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

std::shared_ptr<const Model> LoadTestModel(const std::string& relative) {
  const std::string path = TestModelPath(relative);
  if (path.empty()) return nullptr;
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.error();
  return m.ok() ? std::shared_ptr<const Model>(std::move(*m)) : nullptr;
}

}  // namespace kvs::testing
