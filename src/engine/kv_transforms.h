// The fitted transforms of a model's KV for the transform codec (issue #23): per (layer, KV head)
// the PCA of its keys before RoPE and of its values (kernels/kv_transform.h), from a calibration
// run over a text. Per head rather than per layer: each head reads its own subspace (a layer's
// heads pooled need several heads' worth of components for the same error), and a head's basis
// is only head_dim^2 floats (llama-1b: 16 layers x 8 heads x 2 x 64^2 x 4 bytes = 4 MiB).
//
// Fitting is deterministic for a model, text and chunking, and is saved beside the store
// (tc-<key>.basis, the key a digest of the weights, the KV format's fingerprint and the
// calibration tokens) so that a restart reuses it; a file of another key, version or length, or
// one whose checksum fails, is refitted and replaced, never used.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/digest.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/calibration_prefill.h"
#include "kernels/kv_transform.h"
#include "kv/kv_format.h"
#include "model/weights.h"

namespace kvs {

struct KvTransforms {
  Digest128 key;     // what they were fitted for (KvTransformKey)
  Digest128 digest;  // of everything below: a payload names the fit it was coded with
  int32_t n_layer = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  int64_t n_samples = 0;              // calibration positions per head
  std::vector<HeadTransform> keys;    // [n_layer * n_head_kv], of keys before RoPE
  std::vector<HeadTransform> values;  // [n_layer * n_head_kv]
};

// The key of a fit: the weights, the KV format and the calibration tokens.
Digest128 KvTransformKey(const Digest128& weights, const KvFormat& format,
                         const std::vector<int32_t>& tokens);

// Runs the model over tokens in independent sequences of at most chunk positions (each from
// position 0: the statistics of the positions a served prompt has) and fits every head's key and
// value PCA. Position 0 of each chunk is left out of the fit: the first token's keys and values
// are attention sinks, far from the rest, and would take a component of their own.
// runs: where the prefills come from (shared with the other calibrations), or null.
Expected<KvTransforms> FitKvTransforms(const Model& model, ThreadPool& pool,
                                       const std::vector<int32_t>& tokens, int32_t chunk,
                                       const Digest128& key, CalibrationRuns* runs = nullptr);

// The file's bytes and back (checksummed); Parse checks the key and the geometry.
std::vector<uint8_t> SerializeKvTransforms(const KvTransforms& t);
Expected<KvTransforms> ParseKvTransforms(std::span<const uint8_t> bytes, const Digest128& key,
                                         const KvGeometry& geometry);

// The fit for these tokens: read from dir/tc-<key>.basis when it is there and valid, else fitted
// and (dir not empty) saved there. Logs what it did.
Expected<std::shared_ptr<const KvTransforms>> LoadOrFitKvTransforms(
    const Model& model, ThreadPool& pool, const KvFormat& format,
    const std::vector<int32_t>& tokens, const std::string& dir, CalibrationRuns* runs = nullptr);

}  // namespace kvs
