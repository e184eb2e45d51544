// OpenAI request parsing and response shapes: /v1/completions and /v1/chat/completions bodies
// to GenerationOptions, every bad parameter to a 400 naming it, and the JSON of errors,
// completions, chunks and usage.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvserve/kvserve.h"
#include "server/chat_template.h"

namespace kvs::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the offending parameter, if one
  std::string code;   // e.g. "model_not_found", "context_length_exceeded"
};
nlohmann::json ErrorJson(const ApiError& e);
// JSON text for a client; invalid UTF-8 (from a model's bytes or a client's path) becomes
// U+FFFD instead of an exception.
inline std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::string prompt_text;            // completions: a string prompt
  std::vector<int32_t> prompt_ids;    // completions: a token-array prompt
  std::vector<ChatMessage> messages;  // chat
  kvserve::GenerationOptions gen;
  std::vector<std::string> stop;  // stop strings (up to 4)
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // chat: logprobs=true; completions: logprobs=k
  // vLLM's extension: each choice also carries the generated tokens' ids ("token_ids"), so a
  // client can resend a conversation as token ids that match the KV cache exactly.
  bool return_token_ids = false;
};

// Parses a request body into *out, refusing (400) JSON nested deeper than 64 levels or with more
// than 2^20 values before building it: a few MiB of "[[[[..." would otherwise become
// gigabytes of JSON tree.
std::optional<ApiError> ParseJsonBody(const std::string& body, nlohmann::json* out);

// A client's value quoted in an error message: at most 256 bytes of it.
std::string Quote(const std::string& value);

// Fills *out from the body, or returns the error to send (400, naming the parameter).
std::optional<ApiError> ParseCompletionRequest(const nlohmann::json& body, bool chat,
                                               CompletionRequest* out);

// JSON text of a string: quoted and escaped, invalid UTF-8 as U+FFFD.
std::string JsonString(std::string_view s);
// JSON text of a number (non-finite ones as null).
std::string JsonNumber(double v);

// Logprobs are written as JSON text as they are made: a response may carry hundreds of
// thousands of them, and a JSON tree of each would cost tens of times the text's memory.
// Chat: one entry {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}.
std::string ChatLogprobJson(const kvserve::TokenEvent& e, const std::string& text);
// Completions: the alternatives as {"text": logprob, ...} (the first of equal texts kept).
std::string CompletionTopLogprobsJson(const kvserve::TokenEvent& e);

}  // namespace kvs::server
