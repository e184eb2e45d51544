// `kvserve bench spec`'s run, shared with `bench speed --spec-type` (whose decode test then runs
// through the engine with speculation, against the same engine without it).
#pragma once

#include <string>

#include "cli/engine_flags.h"

namespace kvs::cli {

struct SpecBenchArgs {
  std::string model;
  kvserve::ModelOptions model_options;
  EngineFlags engine;
  int32_t n_gen = 128;
  int32_t depth = 0;
  int32_t reps = 1;
  // -c was given: a context too small for -d and -n is an error, not silently raised.
  bool ctx_given = false;
  std::string prompt_file;
  bool json = false;
};

int RunSpecBench(SpecBenchArgs a);

// Registers the speculation flags alone (--spec-type, -md, --draft-*) on cmd.
void AddSpecFlags(CLI::App* cmd, EngineFlags* flags);

}  // namespace kvs::cli
