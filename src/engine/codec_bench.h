// The KV codec bench (`kvserve kv codec-bench`, issue #23): for each way a cold tier can store a
// block (raw in the pool's type, zstd over a quantized pool's blocks, the transform codec at a
// bit budget), its size against f16, its encode and decode speed, and what it costs the model:
// each chunk of the text is scored as perplexity scores it (second half), after the first half's
// KV went through the codec and back into the pool (what a prompt whose prefix is loaded from
// the tier then attends to), against an f32 cache that kept its KV as computed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/transform_codec.h"
#include "kernels/kv_types.h"
#include "kv/block_file.h"
#include "model/weights.h"

namespace kvs {

struct CodecBenchVariant {
  std::string name;  // "zstd-q8_0", "tc:2", ...
  KvTypes pool;      // the pool's types the blocks are in
  BlockCodec codec = BlockCodec::kRaw;
  TransformCodecOptions transform;  // for kTransform
};

// "raw", "zstd-q8_0" (zstd over a pool of that type), "tc:2[,sink=N]" (over an f16 pool), ...
Expected<CodecBenchVariant> ParseCodecBenchVariant(const std::string& name);
// raw, zstd-q8_0, zstd-q4_0, zstd-turbo4, zstd-turbo3, tc:4, tc:3, tc:2, tc:1.
std::vector<std::string> DefaultCodecBenchVariants();

struct CodecBenchResult {
  std::string name;
  double bits_per_element = 0;      // stored file bits (header included) per K/V element
  double ratio_vs_f16 = 0;          // f16 bytes of the same elements / stored file bytes
  double payload_ratio_vs_f16 = 0;  // the same without the block file's header
  double encode_mb_s = 0;           // f16-equivalent MB encoded per second (one thread)
  double decode_mb_s = 0;           // f16-equivalent MB decoded per second
  double ppl = 0, base_ppl = 0;
  double delta_ppl_pct = 0, delta_ppl_stderr_pct = 0;
  double kl_mean = 0, kl_stderr = 0, top1_agree_pct = 0;
  int64_t blocks = 0;         // blocks round-tripped
  double allocated_bits = 0;  // tc: the allocation's bits per element (before entropy coding)
  double zstd_block_pct = 0;  // tc: blocks whose codes zstd beat packing on
};

struct CodecBenchOptions {
  int32_t n_ctx = 256;
  int32_t bos_id = -1;
  std::vector<int32_t> calibration_tokens;  // the transform codec's fit (and key codings)
  int32_t decode_threads = 2;
  std::vector<CodecBenchVariant> variants;
};

// on_progress(done, total): chunks x variants.
Expected<std::vector<CodecBenchResult>> RunCodecBench(
    const Model& model, const std::vector<int32_t>& tokens, const CodecBenchOptions& options,
    ThreadPool& pool, const std::function<void(int32_t, int32_t)>& on_progress = nullptr);

}  // namespace kvs
