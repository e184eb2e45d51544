// `kvserve kv codec-bench`: the cold tiers' block codecs side by side (engine/codec_bench.h):
// size against f16, encode and decode speed, and the change in perplexity, KL and top-1 when a
// text's context KV goes through each codec and back.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/codec_bench.h"
#include "engine/key_offsets.h"
#include "engine/kv_format_factory.h"

namespace kvs::cli {

Runner AddKvCodecBenchCommand(CLI::App* kv) {
  struct Args {
    std::string model, file, kv_calibration, codecs;
    int32_t n_ctx = 256;
    int32_t calibration_tokens = 2048;
    int32_t threads = ThreadPool::DefaultThreadCount();
    int32_t max_chunks = -1;
    bool json = false;
    kvserve::ModelOptions model_options;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = kv->add_subcommand(
      "codec-bench",
      "Compare the cold tiers' block codecs (raw, zstd over quantized blocks, transform-coded "
      "tc:BITS): size vs f16, encode/decode MB/s, and perplexity, KL and top-1 against an f32 "
      "cache when each chunk's context KV goes through the codec");
  cmd->add_option("-m,--model", a->model, "GGUF model file");
  cmd->add_option("-f,--file", a->file, std::string("Text to score (") + kInputFileHelp + ")")
      ->required();
  cmd->add_option("-c,--ctx-size", a->n_ctx,
                  "Tokens per chunk (a multiple of 32): the first half is the coded context, "
                  "the second half is scored")
      ->capture_default_str()
      ->check(CLI::Range(32, 1 << 16));
  cmd->add_option("-t,--threads", a->threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--chunks", a->max_chunks, "Score at most this many chunks (-1: all)")
      ->capture_default_str();
  CLI::Option* codecs_flag = cmd->add_option(
      "--codecs", a->codecs,
      "Comma-separated codecs (default: raw,zstd-q8_0,zstd-q4_0,zstd-turbo4,"
      "zstd-turbo3,tc:4,tc:3,tc:2,tc:1); raw-TYPE and zstd-TYPE take any KV type, "
      "tc:BITS[,sink=N] any budget (tc:1,sink=4,tc:2: an option joins the codec before it)");
  cmd->add_option("--kv-calibration", a->kv_calibration,
                  "Text the transform basis is fitted on (and quantized keys calibrated on); use "
                  "another text than -f, or the figures are in-sample (default: a built-in "
                  "paragraph, too short for a good basis)");
  CLI::Option* calibration_tokens_flag =
      cmd->add_option("--kv-calibration-tokens", a->calibration_tokens, kKvCalibrationTokensHelp)
          ->capture_default_str()
          ->check(CLI::Range(16, kMaxCalibrationTokensFlag));
  cmd->add_flag("--json", a->json, "Print one JSON object (an array \"codecs\") on stdout");
  AddModelFlags(cmd, &a->model_options);
  return [a, cmd, codecs_flag, calibration_tokens_flag]() -> int {
    if (!cmd->parsed()) return -1;
    CodecBenchOptions options;
    options.n_ctx = a->n_ctx;
    if (a->n_ctx % 32 != 0) {
      std::fprintf(stderr, "error: -c %d: the context must be a multiple of 32\n", a->n_ctx);
      return 1;
    }
    if (a->max_chunks == 0 || a->max_chunks < -1) {
      std::fprintf(stderr, "error: --chunks %d: give a count of at least 1, or -1 for all\n",
                   a->max_chunks);
      return 1;
    }
    if (a->kv_calibration.empty() && calibration_tokens_flag->count() > 0) {
      std::fprintf(stderr,
                   "error: --kv-calibration-tokens is only used with --kv-calibration FILE (the "
                   "built-in paragraph is 64 tokens)\n");
      return 1;
    }
    std::vector<std::string> names;
    if (codecs_flag->count() == 0) {
      names = DefaultCodecBenchVariants();
    } else {
      std::string list = a->codecs;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = list.find(',', at);
        std::string name = list.substr(at, comma == std::string::npos ? comma : comma - at);
        for (char& ch : name) ch = ch == ';' ? ',' : ch;
        // "tc:1,sink=4": an option (NAME=VALUE) belongs to the codec before it.
        if (!names.empty() && name.find('=') != std::string::npos &&
            name.find(':') == std::string::npos) {
          names.back() += "," + name;
        } else if (name.empty()) {
          std::fprintf(stderr, "error: --codecs '%s': an empty codec name\n", list.c_str());
          return 1;
        } else if (std::find(names.begin(), names.end(), name) != names.end()) {
          std::fprintf(stderr, "error: --codecs: %s is listed twice\n", name.c_str());
          return 1;
        } else {
          names.push_back(name);
        }
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    }
    for (const std::string& name : names) {
      auto v = ParseCodecBenchVariant(name);
      if (!v.ok()) {
        std::fprintf(stderr, "error: --codecs: %s\n", v.error().c_str());
        return 1;
      }
      options.variants.push_back(*v);
    }
    std::string path = a->model;
    LoadedModel loaded;
    std::vector<int32_t> ids;
    if (!LoadScoredText(&path, a->file, a->model_options.check_tensors, a->max_chunks, a->n_ctx,
                        &loaded, &ids)) {
      return 1;
    }
    const Model& model = *loaded.model;
    const Tokenizer& tok = *loaded.tokenizer;
    options.bos_id = tok.add_bos() ? tok.bos_id() : -1;
    std::string calibration_source = "built-in paragraph";
    std::error_code same_ec;
    if (!a->kv_calibration.empty() &&
        std::filesystem::equivalent(a->kv_calibration, a->file, same_ec)) {
      std::fprintf(stderr,
                   "warning: --kv-calibration is the scored text (-f): the basis is fitted on "
                   "what it codes, and the figures are in-sample (optimistic)\n");
    }
    if (!a->kv_calibration.empty()) {
      KvFormatOptions kv;
      if (Status st = UseCalibrationFile(a->kv_calibration, tok, &kv, a->calibration_tokens);
          !st.ok()) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
      }
      options.calibration_tokens = kv.calibration_tokens;
      calibration_source = a->kv_calibration;
    } else {
      options.calibration_tokens = KeyCalibrationTokens(&tok, model.config().n_vocab);
    }
    const int threads = ThreadPool::ResolveThreadCount(a->threads);
    options.decode_threads = threads;
    ThreadPool pool(threads);
    auto results = RunCodecBench(model, ids, options, pool, [&](int32_t done, int32_t total) {
      // A line per tenth of the work (a log, not a terminal, is where long runs are read).
      if (done == total || done * 10 / total != (done - 1) * 10 / total)
        std::fprintf(stderr, "codec bench: %d/%d chunk runs\n", done, total);
    });
    if (!results.ok()) {
      std::fprintf(stderr, "error: %s\n", results.error().c_str());
      return 1;
    }
    if (a->json) {
      nlohmann::json codecs = nlohmann::json::array();
      for (const CodecBenchResult& r : *results) {
        nlohmann::json j = {{"name", r.name},
                            {"bits_per_element", r.bits_per_element},
                            {"ratio_vs_f16", r.ratio_vs_f16},
                            {"payload_ratio_vs_f16", r.payload_ratio_vs_f16},
                            {"encode_mb_s", r.encode_mb_s},
                            {"decode_mb_s", r.decode_mb_s},
                            {"ppl", r.ppl},
                            {"base_ppl", r.base_ppl},
                            {"delta_ppl_pct", r.delta_ppl_pct},
                            {"delta_ppl_stderr_pct", r.delta_ppl_stderr_pct},
                            {"kl_mean", r.kl_mean},
                            {"kl_stderr", r.kl_stderr},
                            {"top1_agree_pct", r.top1_agree_pct},
                            {"blocks", r.blocks}};
        if (r.name.rfind("tc:", 0) == 0) {
          j["allocated_bits_per_element"] = r.allocated_bits;
          j["zstd_block_pct"] = r.zstd_block_pct;
        }
        codecs.push_back(j);
      }
      nlohmann::json out = {{"model", path},
                            {"text", a->file},
                            {"n_ctx", a->n_ctx},
                            {"n_chunks", static_cast<int64_t>(ids.size() / a->n_ctx)},
                            {"threads", threads},
                            {"calibration", calibration_source},
                            {"calibration_tokens", options.calibration_tokens.size()},
                            {"codecs", codecs}};
      std::printf("%s\n", out.dump().c_str());
      return 0;
    }
    std::printf("%-14s %8s %8s %9s %9s %10s %10s %8s\n", "codec", "bits/el", "vs f16", "enc MB/s",
                "dec MB/s", "dPPL %", "KL", "top-1 %");
    for (const CodecBenchResult& r : *results) {
      std::printf("%-14s %8.3f %7.2fx %9.1f %9.1f %+10.3f %10.2e %8.2f\n", r.name.c_str(),
                  r.bits_per_element, r.ratio_vs_f16, r.encode_mb_s, r.decode_mb_s, r.delta_ppl_pct,
                  r.kl_mean, r.top1_agree_pct);
    }
    return 0;
  };
}

}  // namespace kvs::cli
