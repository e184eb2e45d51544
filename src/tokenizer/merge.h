// The pair-merging loop shared by SentencePiece (highest score first) and byte-level BPE
// (lowest merge rank first). A word starts as one symbol per UTF-8 character, linked into
// a list; the best adjacent pair is merged until no pair may merge. A heap entry goes stale
// when either side has changed since it was pushed; its recorded length tells.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "tokenizer/unicode.h"

namespace kvs::merge {

struct Symbol {
  int32_t prev;
  int32_t next;    // -1 at the end of the list
  uint32_t start;  // byte offset into the text
  uint32_t len;    // 0 once merged into its left neighbour
};

// One symbol per UTF-8 character of `text` (a truncated sequence at the end is one symbol).
inline std::vector<Symbol> SplitCharacters(std::string_view text) {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t len =
        std::min(unicode::Utf8SeqLen(static_cast<uint8_t>(text[pos])), text.size() - pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(
        Symbol{index - 1, index + 1, static_cast<uint32_t>(pos), static_cast<uint32_t>(len)});
    pos += len;
  }
  if (!symbols.empty()) symbols.back().next = -1;
  return symbols;
}

// priority(left_text, right_text) -> nullopt when the pair cannot merge, else a value where
// larger merges first; ties go to the leftmost pair.
template <typename Priority>
void MergePairs(std::string_view text, std::vector<Symbol>& symbols, const Priority& priority) {
  struct Candidate {
    double priority;
    int32_t left;
    int32_t right;
    uint32_t len;  // of the merged text
    bool operator<(const Candidate& o) const {
      return priority < o.priority || (priority == o.priority && left > o.left);
    }
  };
  std::priority_queue<Candidate> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const std::optional<double> p =
        priority(text.substr(l.start, l.len), text.substr(r.start, r.len));
    if (p) queue.push(Candidate{*p, left, right, l.len + r.len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    Symbol& right = symbols[c.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != c.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    try_add(left.prev, c.left);
    try_add(c.left, left.next);
  }
}

}  // namespace kvs::merge
