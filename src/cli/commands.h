// Each subcommand registers its options on the root app and returns what to run when the
// user chose it. Runners return the process exit code.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace kvs::cli {

using Runner = std::function<int()>;

Runner AddGenerateCommand(CLI::App& root);
Runner AddTokenizeCommand(CLI::App& root);
Runner AddInspectCommand(CLI::App& root);
Runner AddPerplexityCommand(CLI::App& root);
Runner AddBenchCommand(CLI::App& root);
Runner AddServeCommand(CLI::App& root);
// `bench memory` and `bench throughput`; the runner returns -1 when neither was chosen.
Runner AddEngineBenchCommands(CLI::App* bench);
// `bench serve`, the HTTP load generator; the runner returns -1 when it was not chosen.
Runner AddServeBenchCommand(CLI::App* bench);

// The model to use when -m is absent: $KVSERVE_MODEL, else ../shared/models/stories260K.gguf,
// else the copy the setup script downloads into ~/.cache/kvserve/models. Empty if none.
std::string DefaultModelPath();
// Resolves -m (or the default) and prints a helpful error when there is none.
bool ResolveModelPath(std::string& path);

// Reads a whole file; false (with a message on stderr) on failure.
bool ReadTextFile(const std::string& path, std::string* out);

}  // namespace kvs::cli
