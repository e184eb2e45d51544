#include "server/openai_api.h"

#include <climits>
#include <cmath>
#include <cstdint>

namespace kvs::server {

nlohmann::json ErrorJson(const ApiError& e) {
  nlohmann::json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return {{"error", err}};
}

namespace {

ApiError Bad(const std::string& param, const std::string& message) {
  return ApiError{400, "invalid_request_error", message, param, {}};
}

// Reads an optional number into *out, checking its type and range.
template <typename T>
std::optional<ApiError> Number(const nlohmann::json& body, const char* key, double lo, double hi,
                               T* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Bad(key, std::string("'") + key + "' must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return Bad(key, std::string("'") + key + "' must be between " + nlohmann::json(lo).dump() +
                        " and " + nlohmann::json(hi).dump() + ", got " + it->dump());
  }
  if constexpr (std::is_integral_v<T>) {
    if (v != std::floor(v)) return Bad(key, std::string("'") + key + "' must be an integer");
  }
  *out = static_cast<T>(v);
  return std::nullopt;
}

std::optional<ApiError> Bool(const nlohmann::json& body, const char* key, bool* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return Bad(key, std::string("'") + key + "' must be true or false");
  *out = it->get<bool>();
  return std::nullopt;
}

// kv_budget: this request's token eviction budget, positions (512) or a share of the sequence's
// length ("25%"). Only its form is checked here; the floor (--kv-sink + --kv-window) is the
// engine's, checked by the server (CheckKvBudget). Floats are refused rather than rounded: a
// budget is a count of positions, and 40.5 is more likely a mistake than a wish.
std::optional<ApiError> ParseKvBudgetField(const nlohmann::json& body, std::string* out) {
  auto it = body.find("kv_budget");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const std::string form =
      "'kv_budget' must be a number of positions (e.g. 512) or a percentage of the sequence's "
      "length as a string (e.g. \"25%\")";
  std::string text;
  if (it->is_number_integer()) {
    text = it->dump();
  } else if (it->is_string()) {
    text = it->get<std::string>();
    // Longer than any valid budget ("2147483647"): refused before it is echoed in the message.
    if (text.size() > 16) return Bad("kv_budget", form + ", got " + Quote(text));
  } else {
    return Bad("kv_budget", form + ", got " + it->dump());
  }
  // A guard of 0 + 0: the form and the range (no negatives, at most 100%) without the floor.
  std::string error;
  if (!kvserve::CheckKvBudget(text, 0, 0, out, &error)) return Bad("kv_budget", error);
  return std::nullopt;  // *out "" when 0: the engine's budget
}

std::optional<ApiError> ParseMessages(const nlohmann::json& body, CompletionRequest* out) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return Bad("messages", "'messages' must be a non-empty array of {role, content}");
  }
  for (const nlohmann::json& m : *it) {
    const auto role_it = m.is_object() ? m.find("role") : m.end();
    if (!m.is_object() || role_it == m.end() || !role_it->is_string()) {
      return Bad("messages", "every message needs a string 'role'");
    }
    const std::string role = *role_it;
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      return Bad("messages", "unknown message role " + Quote(role));
    }
    std::string content;
    const auto content_it = m.find("content");
    const nlohmann::json c = content_it != m.end() ? *content_it : nlohmann::json();
    if (c.is_string()) {
      content = c;
    } else if (c.is_array()) {  // content parts: only text is supported
      for (const nlohmann::json& part : c) {
        const auto type = part.is_object() ? part.find("type") : part.end();
        const auto text = part.is_object() ? part.find("text") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() || *type != "text" ||
            text == part.end() || !text->is_string()) {
          return Bad("messages",
                     "only text content parts ({\"type\": \"text\", \"text\": ...}) "
                     "are supported");
        }
        content += text->get<std::string>();
      }
    } else if (!c.is_null()) {
      return Bad("messages", "a message's 'content' must be a string or text parts");
    }
    out->messages.push_back({role == "developer" ? "system" : role, content});
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const nlohmann::json& body, CompletionRequest* out) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Bad("prompt", "'prompt' is required");
  if (it->is_string()) {
    out->prompt_text = *it;
    return std::nullopt;
  }
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    out->prompt_text = (*it)[0];
    return std::nullopt;
  }
  if (it->is_array() && !it->empty()) {
    for (const nlohmann::json& t : *it) {
      if (!t.is_number_integer()) {
        return Bad("prompt",
                   "'prompt' must be a string or an array of token ids "
                   "(several prompts per request are not supported)");
      }
      // Unsigned values past int64 read as huge; range-check before narrowing.
      const int64_t id =
          t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX ? int64_t{-1} : t.get<int64_t>();
      if (id < 0 || id > INT32_MAX)
        return Bad("prompt", "token id " + t.dump() + " is out of range");
      out->prompt_ids.push_back(static_cast<int32_t>(id));
    }
    return std::nullopt;
  }
  return Bad("prompt", "'prompt' must be a non-empty string or array of token ids");
}

// stop: a string or up to 4 strings, none of them empty.
std::optional<ApiError> ParseStop(const nlohmann::json& body, CompletionRequest* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    out->stop.push_back(*it);
  } else if (it->is_array() && it->size() <= 4) {
    for (const nlohmann::json& s : *it) {
      if (!s.is_string()) return Bad("stop", "'stop' must be a string or up to 4 strings");
      out->stop.push_back(s);
    }
  } else {
    return Bad("stop", "'stop' must be a string or up to 4 strings");
  }
  for (const std::string& s : out->stop) {
    if (s.empty()) return Bad("stop", "stop strings must not be empty");
  }
  return std::nullopt;
}

// Chat asks logprobs: true and top_logprobs: k; completions ask logprobs: k.
std::optional<ApiError> ParseLogprobs(const nlohmann::json& body, bool chat,
                                      CompletionRequest* out) {
  kvserve::GenerationOptions& g = out->gen;
  if (chat) {
    if (auto e = Bool(body, "logprobs", &out->logprobs)) return e;
    int32_t top = 0;
    if (auto e = Number(body, "top_logprobs", 0, 20, &top)) return e;
    const auto tl = body.find("top_logprobs");
    if (tl != body.end() && !tl->is_null() && !out->logprobs) {
      return Bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    if (out->logprobs) g.logprobs = top;
  } else if (auto it = body.find("logprobs"); it != body.end() && !it->is_null()) {
    int32_t k = 0;
    if (auto e = Number(body, "logprobs", 0, 5, &k)) return e;
    out->logprobs = true;
    g.logprobs = k;
  }
  return std::nullopt;
}

// Counts depth and values as the parser reads, and stops it at the first excess.
class JsonBudget : public nlohmann::json::json_sax_t {
 public:
  static constexpr size_t kMaxDepth = 64;
  static constexpr size_t kMaxValues = size_t{1} << 20;
  std::string problem;

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(size_t) override { return Value() && Enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Leave(); }
  bool start_array(size_t) override { return Value() && Enter(); }
  bool end_array() override { return Leave(); }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool Value() {
    if (++values_ <= kMaxValues) return true;
    problem = "The request body has more than " + std::to_string(kMaxValues) + " JSON values.";
    return false;
  }
  bool Enter() {
    if (++depth_ <= kMaxDepth) return true;
    problem = "The request body nests JSON deeper than " + std::to_string(kMaxDepth) + " levels.";
    return false;
  }
  bool Leave() {
    --depth_;
    return true;
  }
  size_t depth_ = 0;
  size_t values_ = 0;
};

}  // namespace

std::string Quote(const std::string& value) {
  constexpr size_t kMax = 256;
  if (value.size() <= kMax) return "'" + value + "'";
  return "'" + value.substr(0, kMax) + "...' (" + std::to_string(value.size()) + " bytes)";
}

std::optional<ApiError> ParseJsonBody(const std::string& body, nlohmann::json* out) {
  if (body.empty()) {
    return ApiError{400,
                    "invalid_request_error",
                    "The request has no body: send the JSON with a Content-Length (or "
                    "Transfer-Encoding: chunked).",
                    {},
                    {}};
  }
  JsonBudget budget;
  if (!nlohmann::json::sax_parse(body, &budget)) {
    return ApiError{400,
                    "invalid_request_error",
                    budget.problem.empty() ? "The request body is not valid JSON." : budget.problem,
                    {},
                    {}};
  }
  *out = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    return ApiError{400, "invalid_request_error", "The request body is not valid JSON.", {}, {}};
  }
  return std::nullopt;
}

std::optional<ApiError> ParseCompletionRequest(const nlohmann::json& body, bool chat,
                                               CompletionRequest* out) {
  if (!body.is_object()) return Bad("", "the request body must be a JSON object");
  out->chat = chat;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("model", "'model' must be a string");
    out->model = *it;
  }
  if (auto e = chat ? ParseMessages(body, out) : ParsePrompt(body, out)) return e;
  kvserve::GenerationOptions& g = out->gen;
  g.temperature = 1.0f;  // OpenAI's defaults: no top-k / min-p truncation unless asked
  g.top_k = 0;
  g.top_p = 1.0f;
  g.min_p = 0.f;
  g.max_tokens = chat ? -1 : 16;
  const auto mct = body.find("max_completion_tokens");
  const char* max_key =
      chat && mct != body.end() && !mct->is_null() ? "max_completion_tokens" : "max_tokens";
  if (auto e = Number(body, max_key, 1, 1 << 24, &g.max_tokens)) return e;
  if (auto e = Number(body, "temperature", 0, 2, &g.temperature)) return e;
  if (auto e = Number(body, "top_p", 0, 1, &g.top_p)) return e;
  if (auto e = Number(body, "top_k", -1, 1 << 20, &g.top_k)) return e;
  if (auto e = Number(body, "min_p", 0, 1, &g.min_p)) return e;
  if (auto e = Number(body, "presence_penalty", -2, 2, &g.presence_penalty)) return e;
  if (auto e = Number(body, "frequency_penalty", -2, 2, &g.frequency_penalty)) return e;
  if (auto e = Number(body, "repetition_penalty", 0.01, 10, &g.repeat_penalty)) return e;
  if (auto e = Number(body, "n", 1, 128, &g.n)) return e;
  if (auto e = Number(body, "priority", -1000000, 1000000, &g.priority)) return e;
  int64_t seed = -1;
  if (auto e = Number(body, "seed", -9.2e18, 9.2e18, &seed)) return e;
  if (body.contains("seed") && !body["seed"].is_null()) g.seed = static_cast<uint64_t>(seed);
  if (auto e = Bool(body, "stream", &out->stream)) return e;
  if (auto it = body.find("cache_salt"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("cache_salt", "'cache_salt' must be a string");
    g.cache_salt = *it;
  }
  if (auto e = Bool(body, "ignore_eos", &g.ignore_eos)) return e;
  // Opting out of speculative decoding (it never changes the output, only its speed).
  if (auto e = Bool(body, "speculative", &g.speculative)) return e;
  if (auto e = ParseKvBudgetField(body, &g.kv_budget)) return e;
  if (auto e = Bool(body, "return_token_ids", &out->return_token_ids)) return e;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("stream_options", "'stream_options' must be an object");
    if (auto e = Bool(*it, "include_usage", &out->include_usage)) {
      e->param = "stream_options";
      return e;
    }
  }
  if (auto e = ParseStop(body, out)) return e;
  if (auto e = ParseLogprobs(body, chat, out)) return e;
  if (g.temperature == 0) g.temperature = 0;  // greedy
  return std::nullopt;
}

std::string JsonString(std::string_view s) {
  return Dump(nlohmann::json(std::string(s)));
}

std::string JsonNumber(double v) {
  return Dump(nlohmann::json(v));
}

namespace {

void AppendBytes(std::string* out, std::string_view text) {
  *out += "[";
  for (size_t i = 0; i < text.size(); ++i) {
    if (i > 0) *out += ",";
    *out += std::to_string(static_cast<unsigned char>(text[i]));
  }
  *out += "]";
}

}  // namespace

std::string ChatLogprobJson(const kvserve::TokenEvent& e, const std::string& text) {
  std::string out =
      "{\"token\":" + JsonString(text) + ",\"logprob\":" + JsonNumber(e.logprob) + ",\"bytes\":";
  AppendBytes(&out, text);
  out += ",\"top_logprobs\":[";
  for (size_t i = 0; i < e.top_logprobs.size(); ++i) {
    const auto& alt = e.top_logprobs[i];
    if (i > 0) out += ",";
    out += "{\"token\":" + JsonString(alt.text) + ",\"logprob\":" + JsonNumber(alt.logprob) +
           ",\"bytes\":";
    AppendBytes(&out, alt.text);
    out += "}";
  }
  out += "]}";
  return out;
}

std::string CompletionTopLogprobsJson(const kvserve::TokenEvent& e) {
  std::string out = "{";
  for (size_t i = 0; i < e.top_logprobs.size(); ++i) {
    const auto& alt = e.top_logprobs[i];
    bool seen = false;
    for (size_t k = 0; k < i && !seen; ++k) seen = e.top_logprobs[k].text == alt.text;
    if (seen) continue;
    if (out.size() > 1) out += ",";
    out += JsonString(alt.text) + ":" + JsonNumber(alt.logprob);
  }
  out += "}";
  return out;
}

}  // namespace kvs::server
