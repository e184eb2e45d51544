// Locates the shared test models (KVSERVE_TEST_MODELS, default ../shared/models).
#pragma once

#include <memory>
#include <string>

#include "model/weights.h"

namespace kvs::testing {

// Directory holding the shared models.
std::string TestModelsDir();
// Full path of `relative` under that directory, or "" when the file is absent.
std::string TestModelPath(const std::string& relative);
// The model at TestModelPath(relative), shared; null when absent (the caller skips) or when it
// does not load (a test failure).
std::shared_ptr<const Model> LoadTestModel(const std::string& relative);

}  // namespace kvs::testing

// Skips the current test with a clear message when the model file is missing.
#define KVS_REQUIRE_MODEL(var, relative)                                             \
  std::string var = ::kvs::testing::TestModelPath(relative);                         \
  if (var.empty()) {                                                                 \
    GTEST_SKIP() << "test model " << (relative) << " not found under "               \
                 << ::kvs::testing::TestModelsDir() << " (set KVSERVE_TEST_MODELS)"; \
  }
