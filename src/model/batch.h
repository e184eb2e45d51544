// A ragged batch: the tokens of many sequences flattened into one matrix, with the attention
// metadata the forward pass needs. The model never sees the allocator: the engine's runner
// fills this from its block tables.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace kvs {

struct BatchSequence {
  int32_t first_token = 0;  // index of its first token in the batch
  int32_t n_tokens = 0;
  int32_t n_cached = 0;  // positions already in the cache: its first token sees n_cached + 1 keys
  // Kernel blocks (16 positions each) covering at least n_cached + n_tokens positions.
  std::vector<int32_t> kv_blocks;
};

struct RaggedBatch {
  std::vector<int32_t> tokens;     // [n_tokens]
  std::vector<int32_t> positions;  // [n_tokens] RoPE positions
  std::vector<int64_t> slots;      // [n_tokens] KV slot each token writes
  std::vector<BatchSequence> sequences;
  std::vector<int32_t> logit_rows;  // tokens whose logits are wanted, in output order

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  // Adds tokens[0..n) of one sequence at positions n_cached.. (which need not be its first), each
  // writing the slot its position has in kv_blocks (kernel blocks of 16 positions). Logits are
  // requested for the last n_logits of them.
  void AddSequence(const int32_t* seq_tokens, int32_t n, int32_t n_cached,
                   std::vector<int32_t> kv_blocks, int32_t n_logits) {
    const int32_t first = n_tokens();
    for (int32_t i = 0; i < n; ++i) {
      const int32_t pos = n_cached + i;
      tokens.push_back(seq_tokens[i]);
      positions.push_back(pos);
      slots.push_back(static_cast<int64_t>(kv_blocks[pos / kKvBlockTokens]) * kKvBlockTokens +
                      pos % kKvBlockTokens);
    }
    for (int32_t i = n - n_logits; i < n; ++i) logit_rows.push_back(first + i);
    sequences.push_back({first, n, n_cached, std::move(kv_blocks)});
  }

  void Clear() {
    tokens.clear();
    positions.clear();
    slots.clear();
    sequences.clear();
    logit_rows.clear();
  }
};

}  // namespace kvs
