#include "engine/codec_bench.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "engine/engine_builder.h"
#include "engine/kv_transforms.h"
#include "engine/perplexity.h"

namespace kvs {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One variant's cache, codec and running figures.
struct VariantRun {
  CodecBenchVariant variant;
  std::unique_ptr<SingleSequence> seq;
  std::shared_ptr<TransformCodec> transform;
  BlockIdentity identity;
  PerplexityTally tally;
  double encode_s = 0, decode_s = 0;
  int64_t file_bytes = 0, payload_bytes = 0, blocks = 0;
};

}  // namespace

Expected<CodecBenchVariant> ParseCodecBenchVariant(const std::string& name) {
  CodecBenchVariant v;
  v.name = name;
  v.pool = {KvType::kF16, KvType::kF16};
  if (name == "raw") return v;
  if (name.rfind("tc:", 0) == 0) {
    auto options = ParseTransformCodec(name);
    if (!options.ok()) return options.status();
    v.codec = BlockCodec::kTransform;
    v.transform = *options;
    return v;
  }
  for (auto [prefix, codec] :
       {std::pair{"zstd-", BlockCodec::kZstd}, std::pair{"raw-", BlockCodec::kRaw}}) {
    const std::string p = prefix;
    if (name.rfind(p, 0) != 0) continue;
    auto type = ParseKvType(name.substr(p.size()));
    if (!type.ok()) return Status::Error("codec " + name + ": " + type.error());
    v.codec = codec;
    v.pool = {*type, *type};
    return v;
  }
  return Status::Error("codec " + name +
                       ": expected raw, raw-TYPE, zstd-TYPE (a KV type) or tc:BITS[,sink=N]");
}

std::vector<std::string> DefaultCodecBenchVariants() {
  return {"raw",  "zstd-q8_0", "zstd-q4_0", "zstd-turbo4", "zstd-turbo3",
          "tc:4", "tc:3",      "tc:2",      "tc:1"};
}

namespace {

// One SingleSequence per variant, in its pool types, with its transform codec (fitted once for
// all the tc: variants).
Expected<std::vector<VariantRun>> MakeVariantRuns(const Model& model,
                                                  const CodecBenchOptions& options,
                                                  ThreadPool& pool) {
  std::shared_ptr<const KvTransforms> fit;
  std::vector<VariantRun> runs;
  for (const CodecBenchVariant& v : options.variants) {
    VariantRun run;
    run.variant = v;
    KvFormatOptions kv = KvFormatWithTypes(v.pool);
    kv.block_size = kKvBlockTokens;
    kv.n_ctx = options.n_ctx;
    kv.calibration_tokens = options.calibration_tokens;
    kv.transform_codec = true;
    auto seq = EngineBuilder(model, nullptr, pool, kv).Single(options.n_ctx);
    if (!seq.ok()) return seq.status();
    run.seq = std::move(*seq);
    const KvFormatPtr& format = run.seq->storage().shared_format();
    run.identity = MakeBlockIdentity(model.weights_digest(), *format);
    if (v.codec == BlockCodec::kTransform) {
      if (fit == nullptr) {
        auto made = LoadOrFitKvTransforms(model, pool, *format, options.calibration_tokens, "");
        if (!made.ok()) return made.status();
        fit = *made;
      }
      TransformCodecOptions to = v.transform;
      to.decode_threads = options.decode_threads;
      auto codec = TransformCodec::Make(format, fit, to);
      if (!codec.ok()) return codec.status();
      run.transform = *codec;
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

// Every block of chunk `chunk_index`'s first n_blocks encoded (a writer's work) into files, with
// their hashes, counted into run.
Status EncodeBlocks(VariantRun& run, const std::vector<int32_t>& chunk, int32_t chunk_index,
                    int32_t n_blocks, std::vector<std::vector<uint8_t>>* files,
                    std::vector<BlockHash>* hashes) {
  SingleSequence& seq = *run.seq;
  std::vector<uint8_t> block;
  files->assign(n_blocks, {});
  hashes->assign(n_blocks, {});
  for (int32_t b = 0; b < n_blocks; ++b) {
    KVS_RETURN_IF_ERROR(seq.storage().ReadBlock(seq.pool_block(b), &block));
    BlockFileHeader header;
    header.identity = run.identity;
    header.hash = {static_cast<uint64_t>(chunk_index) + 1, static_cast<uint64_t>(b) + 1};
    header.codec = run.variant.codec;
    header.tokens.assign(chunk.begin() + b * kKvBlockTokens,
                         chunk.begin() + (b + 1) * kKvBlockTokens);
    header.first_position = b * kKvBlockTokens;
    const auto t0 = Clock::now();
    auto file = EncodeBlockFile(header, block, 3, run.transform.get());
    run.encode_s += Seconds(t0);
    if (!file.ok()) return file.status();
    // The header's share: what a raw file of no payload takes.
    header.codec = BlockCodec::kRaw;
    auto empty = EncodeBlockFile(header, {});
    run.file_bytes += static_cast<int64_t>(file->size());
    run.payload_bytes += static_cast<int64_t>(file->size() - (empty.ok() ? empty->size() : 0));
    ++run.blocks;
    (*files)[b] = std::move(*file);
    (*hashes)[b] = header.hash;
  }
  return Status::Ok();
}

// The chain decoded back to back, as the tier's loader does it, kDecodePasses times with the
// fastest pass timed (a small model's blocks decode in tens of microseconds, where one stall of
// the machine would set the figure); the last pass's blocks written back into the sequence.
Status DecodeBlocks(VariantRun& run, const std::vector<std::vector<uint8_t>>& files,
                    const std::vector<BlockHash>& hashes) {
  constexpr int kDecodePasses = 3;
  SingleSequence& seq = *run.seq;
  const int32_t n_blocks = static_cast<int32_t>(files.size());
  double fastest = 0;
  for (int pass = 0; pass < kDecodePasses; ++pass) {
    double pass_s = 0;
    for (int32_t b = 0; b < n_blocks; ++b) {
      const auto t0 = Clock::now();
      auto decoded = DecodeBlockFile(files[b], run.identity, hashes[b], run.transform.get());
      pass_s += Seconds(t0);
      if (!decoded.ok()) return decoded.status();
      if (pass == kDecodePasses - 1) {
        KVS_RETURN_IF_ERROR(seq.mutable_storage().WriteBlock(seq.pool_block(b), decoded->payload));
      }
    }
    fastest = pass == 0 ? pass_s : std::min(fastest, pass_s);
  }
  run.decode_s += fastest;
  return Status::Ok();
}

CodecBenchResult ResultOf(const VariantRun& run, int64_t elements) {
  CodecBenchResult r;
  r.name = run.variant.name;
  r.blocks = run.blocks;
  const double f16_bytes = 2.0 * static_cast<double>(elements) * run.blocks;
  r.bits_per_element = 8.0 * run.file_bytes / (static_cast<double>(elements) * run.blocks);
  r.ratio_vs_f16 = f16_bytes / run.file_bytes;
  r.payload_ratio_vs_f16 = f16_bytes / std::max<int64_t>(run.payload_bytes, 1);
  r.encode_mb_s = run.encode_s > 0 ? f16_bytes / run.encode_s / 1e6 : 0;
  r.decode_mb_s = run.decode_s > 0 ? f16_bytes / run.decode_s / 1e6 : 0;
  PerplexityResult p;
  run.tally.Finish(&p);
  r.ppl = p.ppl;
  r.base_ppl = p.base_ppl;
  r.delta_ppl_pct = 100.0 * (p.ppl / p.base_ppl - 1.0);
  r.delta_ppl_stderr_pct = p.delta_ppl_stderr_pct;
  r.kl_mean = p.kl_mean;
  r.kl_stderr = p.kl_stderr;
  r.top1_agree_pct = p.top1_agree_pct;
  if (run.transform) {
    r.allocated_bits = run.transform->allocated_bits_per_element();
    const int64_t coded = run.transform->zstd_blocks() + run.transform->packed_blocks();
    r.zstd_block_pct = coded > 0 ? 100.0 * run.transform->zstd_blocks() / coded : 0;
  }
  return r;
}

}  // namespace

Expected<std::vector<CodecBenchResult>> RunCodecBench(
    const Model& model, const std::vector<int32_t>& tokens, const CodecBenchOptions& options,
    ThreadPool& pool, const std::function<void(int32_t, int32_t)>& on_progress) {
  const ModelConfig& c = model.config();
  const int32_t n_ctx = options.n_ctx, n_vocab = c.n_vocab;
  if (n_ctx < 2 * kKvBlockTokens || n_ctx % (2 * kKvBlockTokens) != 0) {
    return Status::Error(StrFormat("codec bench: the context (%d) must be a multiple of %d", n_ctx,
                                   2 * kKvBlockTokens));
  }
  const int32_t n_chunks = static_cast<int32_t>(tokens.size() / n_ctx);
  if (n_chunks < 1) {
    return Status::Error(StrFormat(
        "codec bench: the text has %zu tokens, fewer than a context (%d)", tokens.size(), n_ctx));
  }
  if (options.variants.empty()) return Status::Error("codec bench: no codecs to measure");
  const int32_t first = n_ctx / 2;
  const int32_t n_blocks = first / kKvBlockTokens;  // the coded context: whole blocks
  const int32_t n_scored = n_ctx - 1 - first;

  auto base = EngineBuilder(model, nullptr, pool, KvFormatWithTypes({})).Single(n_ctx);
  if (!base.ok()) return base.status();
  auto made = MakeVariantRuns(model, options, pool);
  if (!made.ok()) return made.status();
  std::vector<VariantRun>& runs = *made;

  const size_t logit_floats = static_cast<size_t>(n_ctx - first) * n_vocab;
  std::vector<float> logits(logit_floats), base_logits(logit_floats);
  std::vector<int32_t> chunk(n_ctx);
  std::vector<std::vector<uint8_t>> files;
  std::vector<BlockHash> hashes;
  int32_t done = 0;
  for (int32_t i = 0; i < n_chunks; ++i) {
    std::copy(tokens.begin() + static_cast<size_t>(i) * n_ctx,
              tokens.begin() + static_cast<size_t>(i + 1) * n_ctx, chunk.begin());
    if (options.bos_id >= 0) chunk[0] = options.bos_id;
    KVS_RETURN_IF_ERROR((*base)->Run(chunk.data(), n_ctx, 0, n_ctx - first, base_logits.data()));
    for (VariantRun& run : runs) {
      SingleSequence& seq = *run.seq;
      KVS_RETURN_IF_ERROR(seq.Run(chunk.data(), first, 0, 0, nullptr));
      KVS_RETURN_IF_ERROR(EncodeBlocks(run, chunk, i, n_blocks, &files, &hashes));
      KVS_RETURN_IF_ERROR(DecodeBlocks(run, files, hashes));
      KVS_RETURN_IF_ERROR(
          seq.Run(chunk.data() + first, n_ctx - first, first, n_ctx - first, logits.data()));
      for (int32_t j = 0; j < n_scored; ++j) {
        const size_t at = static_cast<size_t>(j) * n_vocab;
        run.tally.Add(logits.data() + at, base_logits.data() + at, n_vocab, chunk[first + j + 1]);
      }
      if (on_progress) on_progress(++done, n_chunks * static_cast<int32_t>(runs.size()));
    }
  }
  const int64_t elements =
      int64_t{c.n_layer} * c.n_head_kv * (c.head_dim_k + c.head_dim_v) * kKvBlockTokens;
  std::vector<CodecBenchResult> results;
  for (const VariantRun& run : runs) results.push_back(ResultOf(run, elements));
  return results;
}

}  // namespace kvs
