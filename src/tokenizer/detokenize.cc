#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvs {

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool first_piece = true;
  for (int32_t id : ids) {
    std::string piece = TokenToPiece(id);
    if (piece.empty()) continue;  // BOS and other control tokens do not count as the first
    if (first_piece && strip_leading_space_ && piece[0] == ' ') piece.erase(0, 1);
    first_piece = false;
    out += piece;
  }
  return out;
}

std::string StreamingDetokenizer::Push(int32_t id) {
  pending_ += tokenizer_.TokenToPiece(id);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t len = 0;
    const unicode::Utf8Status status = unicode::CheckUtf8(pending_, pos, &len);
    if (status == unicode::Utf8Status::kIncomplete) break;  // wait for the next token
    if (status == unicode::Utf8Status::kValid) {
      out.append(pending_, pos, len);
      pos += len;
    } else {
      // A byte that no continuation can make valid: report it now rather than stall.
      unicode::AppendUtf8(unicode::kReplacementChar, &out);
      ++pos;
    }
  }
  pending_.erase(0, pos);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out;
  if (!pending_.empty()) {
    unicode::AppendUtf8(unicode::kReplacementChar, &out);  // an unfinished character
    pending_.clear();
  }
  return out;
}

}  // namespace kvs
