// Each subcommand registers its options on the root app and returns what to run when the
// user chose it. Runners return the process exit code.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {

using Runner = std::function<int()>;

using Clock = std::chrono::steady_clock;
inline double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Runner AddGenerateCommand(CLI::App& root);
Runner AddTokenizeCommand(CLI::App& root);
Runner AddInspectCommand(CLI::App& root);
Runner AddPerplexityCommand(CLI::App& root);
Runner AddBenchCommand(CLI::App& root);
Runner AddServeCommand(CLI::App& root);
// `kv save|ls|rm`: KV documents on a disk tier directory.
Runner AddKvCommand(CLI::App& root);
// `kv codec-bench`; the runner returns -1 when it was not chosen.
Runner AddKvCodecBenchCommand(CLI::App* kv);
// `bench memory` and `bench throughput`; the runner returns -1 when neither was chosen.
Runner AddEngineBenchCommands(CLI::App* bench);
// `bench spec`, speculative against plain decoding; the runner returns -1 when not chosen.
Runner AddSpecBenchCommand(CLI::App* bench);
Runner AddEvictBenchCommand(CLI::App* bench);
// `bench serve`, the HTTP load generator; the runner returns -1 when it was not chosen.
Runner AddServeBenchCommand(CLI::App* bench);

// The model to use when -m is absent: $KVSERVE_MODEL, else ../shared/models/stories260K.gguf,
// else the copy the setup script downloads into ~/.cache/kvserve/models. Empty if none.
std::string DefaultModelPath();
// Resolves -m (or the default) and prints a helpful error when there is none.
bool ResolveModelPath(std::string& path);

// What -f may read (a prompt, a text to tokenize or score): a regular file of at most this
// many bytes. 64 MiB is some 16M tokens, far past any context or perplexity run on a CPU
// (wikitext-2's test set is 1.3 MB); the cap keeps a mistyped path (a disk image) from
// exhausting memory.
inline constexpr int64_t kMaxInputFileBytes = int64_t{64} << 20;
inline constexpr const char* kInputFileHelp = "a regular file of at most 64 MiB";
inline constexpr const char* kKvCalibrationHelp =
    "Text to measure how quantized keys are coded on (its first 512 tokens; default: a built-in "
    "paragraph of English prose). Part of the KV format: caches calibrated differently never "
    "share blocks";

inline constexpr const char* kKvCalibrationTokensHelp =
    "How many tokens of --kv-calibration's text are read: key codings measure the first 512, a "
    "tier's transform codec (tc:BITS) fits its basis on all of them";

// -t's help; the count goes through ThreadPool::ResolveThreadCount, which clamps it.
inline constexpr const char* kThreadsHelp =
    "Threads (more than the CPU threads this process may use are clamped, with a warning)";

// A model and its tokenizer, loaded from one GGUF.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
// Loads both (--check-tensors as asked); false, with a one-line "error: ..." on stderr, when
// either fails.
bool LoadModelWithTokenizer(const std::string& path, bool check_tensors, LoadedModel* out);

// Reads a -f file under kMaxInputFileBytes (kvs::ReadTextFile); false, with a one-line
// "error: ..." on stderr, for anything else (a directory, a device, a FIFO, a bigger file).
bool ReadTextFile(const std::string& path, std::string* out);

// What a scoring command (perplexity, kv codec-bench) starts from: -m (or the default model)
// loaded with its tokenizer, and -f's text as token ids (BOS first where the model adds one),
// cut to max_chunks chunks of n_ctx when max_chunks > 0. false, with "error: ..." on stderr.
// *model_path: -m, resolved in place.
bool LoadScoredText(std::string* model_path, const std::string& text_path, bool check_tensors,
                    int32_t max_chunks, int32_t n_ctx, LoadedModel* loaded,
                    std::vector<int32_t>* ids);

}  // namespace kvs::cli
