// A ragged batch: the tokens of many sequences flattened into one matrix, with the attention
// metadata the forward pass needs. The model never sees the allocator: the engine's runner
// fills this from its block tables.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace kvs {

struct BatchSequence {
  int32_t first_token = 0;  // index of its first token in the batch
  int32_t n_tokens = 0;
  // Keys already in the cache, in slot order: its first token sees n_cached + 1 keys, and the
  // batch's tokens write slots n_cached.. of kv_blocks.
  int32_t n_cached = 0;
  // [n_groups] each KV group's kernel blocks (16 slots each; ModelConfig::kv_groups), covering
  // at least n_cached + n_tokens slots, or one table every group reads (a sequence that frees
  // nothing before a window). Slot i is the same position in every group; a sliding-window
  // group's blocks before its window may be the null block.
  std::vector<std::vector<int32_t>> kv_blocks;
  // The RoPE position of the key in each slot [n_cached + n_tokens], or empty when slot i holds
  // position i. Positions are not slots: after eviction moves keys to other slots their
  // positions stay, and the key codings that depend on RoPE must know them.
  std::vector<int32_t> key_positions;
  // Token eviction's attention mass (kv/eviction_policy.h): when set, the queries of tokens
  // [mass_first_token, n_tokens) add the attention they give each key, summed over every head
  // and layer, into attention_mass[n_cached + n_tokens]. Null: not observed.
  float* attention_mass = nullptr;
  int32_t mass_first_token = 0;
};

struct RaggedBatch {
  std::vector<int32_t> tokens;              // [n_tokens]
  std::vector<int32_t> positions;           // [n_tokens] RoPE positions
  std::vector<std::vector<int64_t>> slots;  // [n_groups or 1][n_tokens] KV slot each token writes
  std::vector<BatchSequence> sequences;
  std::vector<int32_t> logit_rows;  // tokens whose logits are wanted, in output order
  int32_t max_position = -1;        // the largest position of a token or key in the batch

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  // Adds tokens[0..n) of one sequence that already has n_cached keys: token i writes slot
  // n_cached + i of each group's kv_blocks (kernel blocks of 16 slots) at RoPE position
  // first_position + i. key_positions: see BatchSequence (empty: slot i holds position i, and
  // first_position must be n_cached). Logits are requested for the last n_logits of them.
  void AddSequence(const int32_t* seq_tokens, int32_t n, int32_t n_cached,
                   std::vector<std::vector<int32_t>> kv_blocks, int32_t n_logits,
                   int32_t first_position = -1, std::vector<int32_t> key_positions = {}) {
    if (first_position < 0) first_position = n_cached;
    const int32_t first = n_tokens();
    if (slots.size() < kv_blocks.size()) slots.resize(kv_blocks.size());
    for (int32_t i = 0; i < n; ++i) {
      const int32_t slot = n_cached + i;
      tokens.push_back(seq_tokens[i]);
      positions.push_back(first_position + i);
      for (size_t g = 0; g < kv_blocks.size(); ++g) {
        slots[g].push_back(static_cast<int64_t>(kv_blocks[g][slot / kKvBlockTokens]) *
                               kKvBlockTokens +
                           slot % kKvBlockTokens);
      }
    }
    max_position = std::max(max_position, first_position + n - 1);
    for (int32_t p : key_positions) max_position = std::max(max_position, p);
    for (int32_t i = n - n_logits; i < n; ++i) logit_rows.push_back(first + i);
    sequences.push_back(
        {first, n, n_cached, std::move(kv_blocks), std::move(key_positions), nullptr, 0});
  }
  // The same with one table, which every KV group reads.
  void AddSequence(const int32_t* seq_tokens, int32_t n, int32_t n_cached,
                   std::vector<int32_t> kv_blocks, int32_t n_logits, int32_t first_position = -1,
                   std::vector<int32_t> key_positions = {}) {
    std::vector<std::vector<int32_t>> tables(1);
    tables[0] = std::move(kv_blocks);
    AddSequence(seq_tokens, n, n_cached, std::move(tables), n_logits, first_position,
                std::move(key_positions));
  }

  void Clear() {
    tokens.clear();
    positions.clear();
    for (auto& g : slots) g.clear();
    sequences.clear();
    logit_rows.clear();
    max_position = -1;
  }
};

}  // namespace kvs
