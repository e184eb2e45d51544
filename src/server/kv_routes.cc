// The KV routes of the server: KV documents (POST/GET /v1/kv/documents, GET/DELETE
// /v1/kv/documents/{name}) over the disk tier, POST /reset_prefix_cache (vLLM's), and
// GET/POST /v1/kv/lookup (how much of a prompt this replica holds, for simple routers).
#include <climits>
#include <cstdlib>

#include "core/log.h"
#include "server/openai_api.h"
#include "server/openai_server.h"

namespace kvs::server {
namespace {

nlohmann::json DocumentJson(const kvserve::KvDocumentInfo& d) {
  return {{"object", "kv.document"}, {"name", d.name},     {"status", d.status},
          {"tokens", d.tokens},      {"blocks", d.blocks}, {"blocks_on_disk", d.blocks_on_disk},
          {"created", d.created},    {"model", d.model}};
}

ApiError BadRequest(const std::string& message, const std::string& param = {}) {
  return ApiError{400, "invalid_request_error", message, param, {}};
}

// A path segment with its %XX escapes decoded (an invalid escape stays as it is: the name check
// refuses the '%').
std::string DecodePathSegment(const std::string& s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The status of a document route's error: 404 absent, 409 being saved, 503 the store failed.
ApiError DocumentError(const std::string& error) {
  if (error.rfind("no KV document", 0) == 0) {
    return ApiError{404, "invalid_request_error", error, "name", "not_found"};
  }
  if (error.find("is being saved") != std::string::npos) {
    return ApiError{409, "invalid_request_error", error, "name", "conflict"};
  }
  if (error.find("reached the disk") != std::string::npos ||
      error.find("shutting down") != std::string::npos ||
      error.find("cannot record") != std::string::npos ||
      error.find("the prefill ended") != std::string::npos ||
      error.find("cannot remove") != std::string::npos ||
      error.find("which is off") != std::string::npos) {
    return ApiError{503, "server_error", error, {}, {}};
  }
  return ApiError{400, "invalid_request_error", error, "name", {}};
}

// A query string's value with its %XX escapes and '+' (a space) decoded.
std::string DecodeQueryValue(const std::string& s) {
  std::string plus = s;
  for (char& c : plus) {
    if (c == '+') c = ' ';
  }
  return DecodePathSegment(plus);
}

// Each tier's totals (GET /v1/kv/state's "tiers", in lookup order; -1: not known).
nlohmann::json TiersJson(const std::vector<kvserve::TierStats>& tiers) {
  nlohmann::json out = nlohmann::json::array();
  for (const kvserve::TierStats& t : tiers) {
    out.push_back({{"tier", t.name},
                   {"up", t.up},
                   {"hits_total", t.hits},
                   {"misses_total", t.misses},
                   {"corrupt_total", t.corrupt},
                   {"bytes_read_total", t.bytes_read},
                   {"bytes_written_total", t.bytes_written},
                   {"blocks_written_total", t.blocks_written},
                   {"dropped_total", t.dropped},
                   {"usage_bytes", t.usage_bytes},
                   {"capacity_bytes", t.capacity_bytes}});
  }
  return out;
}

// counters' kv_<tier>_hits_total (the dashboard's; 0 for a tier that is not on), for every
// tier the build has.
void AddTierHits(const std::vector<kvserve::TierStats>& tiers, nlohmann::json* counters) {
  for (const std::string& name : kvserve::TierNames()) {
    int64_t hits = 0;
    for (const kvserve::TierStats& t : tiers) {
      if (t.name == name) hits = t.hits;
    }
    (*counters)["kv_" + name + "_hits_total"] = hits;
  }
}

}  // namespace

bool IsKvDocumentPath(const std::string& path) {
  return path == kKvDocumentsPath || path.rfind(std::string(kKvDocumentsPath) + "/", 0) == 0;
}

void Server::ResetPrefixCache(http::Response& res) {
  const int32_t dropped = engine_->ResetPrefixCache();
  res.content_type = "application/json";
  res.body = Dump(nlohmann::json{{"object", "prefix_cache.reset"}, {"blocks_dropped", dropped}});
}

// The prompt of a KV route's body, {"prompt" | "tokens" | "messages", "cache_salt"?}, checked
// as a completion request's (the completion parser checks the prompt, its ids and the salt);
// *param names the field the prompt came in.
std::optional<ApiError> Server::PromptOfBody(const nlohmann::json& body,
                                             std::vector<int32_t>* tokens, std::string* cache_salt,
                                             std::string* param) const {
  const int given =
      int(body.contains("prompt")) + int(body.contains("tokens")) + int(body.contains("messages"));
  if (given != 1)
    return BadRequest("give exactly one of 'prompt', 'tokens' or 'messages'", "prompt");
  nlohmann::json request = nlohmann::json::object();
  const bool chat = body.contains("messages");
  if (chat) request["messages"] = body["messages"];
  if (body.contains("prompt")) request["prompt"] = body["prompt"];
  if (body.contains("tokens")) {
    if (!body["tokens"].is_array()) {
      return BadRequest("'tokens' must be an array of token ids", "tokens");
    }
    request["prompt"] = body["tokens"];
  }
  if (body.contains("cache_salt")) request["cache_salt"] = body["cache_salt"];
  CompletionRequest parsed;
  if (auto err = ParseCompletionRequest(request, chat, &parsed)) {
    if (body.contains("tokens") && err->param == "prompt") err->param = "tokens";
    return err;
  }
  *param = body.contains("tokens") ? "tokens" : (chat ? "messages" : "prompt");
  *cache_salt = parsed.gen.cache_salt;
  return PromptTokens(parsed, chat, *param, tokens);
}

void Server::KvState(http::Response& res) {
  res.content_type = "application/json";
  const std::shared_ptr<const KvStateReply> reply = kv_state_.Get();
  if (!reply->error.empty())
    return SendError(res, ApiError{503, "server_error", reply->error, {}, {}});
  const kvserve::KvCacheState& state = reply->state;
  const kvserve::EngineStats stats = engine_->stats();
  const Metrics::Summary m = metrics_.Summarize();
  int64_t counts[4] = {0, 0, 0, 0};  // f c u s
  for (char c : state.blocks) ++counts[c == 'f' ? 0 : c == 'c' ? 1 : c == 'u' ? 2 : 3];
  nlohmann::json shared = nlohmann::json::array();
  for (const auto& [id, refs] : state.shared) shared.push_back({id, refs});
  nlohmann::json running = nlohmann::json::array();
  {
    // A request is named by the id its client was given; one of the server's own (a KV
    // document's prefill) has none, and is named by its engine request number.
    std::lock_guard lock(response_ids_mu_);
    for (const kvserve::KvSequenceState& s : state.running) {
      auto id = response_ids_.find(s.request);
      running.push_back(
          {{"id", id != response_ids_.end()
                      ? id->second
                      : StrFormat("req-%llu", static_cast<unsigned long long>(s.request))},
           {"choice", s.choice},
           {"prompt_tokens", s.prompt_tokens},
           {"output_tokens", s.output_tokens},
           {"cached_tokens", s.cached_tokens},
           {"blocks", s.blocks}});
    }
  }
  nlohmann::json body = {
      {"object", "kv.state"},
      {"model", model_id_},
      {"block_size", state.block_size},
      {"num_blocks", state.num_blocks},
      {"cache_type_k", engine_->options().cache_type_k},
      {"cache_type_v", engine_->options().cache_type_v},
      {"blocks", state.blocks},
      {"shared", shared},
      {"counts",
       {{"free", counts[0]}, {"cached", counts[1]}, {"used", counts[2]}, {"shared", counts[3]}}},
      {"running", running},
      {"waiting", state.waiting},
      {"counters",
       {{"prompt_tokens_total", m.prompt_tokens},
        {"generation_tokens_total", m.generation_tokens},
        {"request_success_total", m.requests_ok},
        {"request_failure_total", m.requests_failed},
        {"prefix_cache_queries_total", stats.prefix_cache_queries},
        {"prefix_cache_hits_total", stats.prefix_cache_hits},
        {"preemptions_total", stats.preemptions},
        {"evicted_tokens_total", stats.evicted_tokens}}},
      {"tiers", TiersJson(stats.tiers)},
      {"latency",
       {{"ttft_p50_s", m.ttft_p50},
        {"ttft_p90_s", m.ttft_p90},
        {"ttft_p99_s", m.ttft_p99},
        {"itl_p50_s", m.itl_p50},
        {"itl_p90_s", m.itl_p90},
        {"itl_p99_s", m.itl_p99}}}};
  AddTierHits(stats.tiers, &body["counters"]);
  res.body = Dump(body);
}

// GET /v1/kv/lookup?prompt=TEXT (or tokens=1,2,3; and cache_salt=S), or POST with a JSON body
// {"prompt" | "tokens" | "messages", "cache_salt"?}: the prompt's full blocks and how many
// leading tokens of it are held in RAM and on disk.
void Server::KvLookup(const http::Request& req, http::Response& res) {
  res.content_type = "application/json";
  nlohmann::json body = nlohmann::json::object();
  if (req.method == "POST") {
    if (auto err = ParseJsonBody(req.body, &body)) return SendError(res, *err);
    if (!body.is_object()) return SendError(res, BadRequest("the body must be a JSON object"));
  } else {
    size_t start = 0;
    while (start < req.query.size()) {
      size_t end = req.query.find('&', start);
      if (end == std::string::npos) end = req.query.size();
      const std::string pair = req.query.substr(start, end - start);
      start = end + 1;
      const size_t eq = pair.find('=');
      const std::string name = DecodeQueryValue(pair.substr(0, eq));
      const std::string value =
          eq == std::string::npos ? "" : DecodeQueryValue(pair.substr(eq + 1));
      if (name == "prompt" || name == "cache_salt") {
        body[name] = value;
      } else if (name == "tokens") {
        nlohmann::json ids = nlohmann::json::array();
        size_t p = 0;
        while (p < value.size()) {
          size_t q = value.find(',', p);
          if (q == std::string::npos) q = value.size();
          const std::string id = value.substr(p, q - p);
          char* parse_end = nullptr;
          const long long v = std::strtoll(id.c_str(), &parse_end, 10);
          if (id.empty() || *parse_end != '\0' || v < 0 || v > INT32_MAX) {
            return SendError(
                res, BadRequest("'tokens' must be comma-separated token ids, got '" + id + "'",
                                "tokens"));
          }
          ids.push_back(v);
          p = q + 1;
        }
        body["tokens"] = ids;
      } else if (!name.empty()) {
        return SendError(res, BadRequest("unknown parameter '" + name +
                                             "': give prompt or tokens, and cache_salt",
                                         name));
      }
    }
  }
  std::vector<int32_t> tokens;
  std::string salt, param;
  if (auto err = PromptOfBody(body, &tokens, &salt, &param)) return SendError(res, *err);
  kvserve::KvPrefixLookup found;
  std::string error;
  if (!engine_->LookupKvPrefix(tokens, salt, &found, &error)) {
    return SendError(res, ApiError{503, "server_error", error, {}, {}});
  }
  res.body = Dump(nlohmann::json{{"object", "kv.lookup"},
                                 {"prompt_tokens", found.prompt_tokens},
                                 {"block_size", found.block_size},
                                 {"ram_tokens", found.ram_tokens},
                                 {"disk_tokens", found.disk_tokens},
                                 {"cached_tokens", found.ram_tokens + found.disk_tokens},
                                 {"block_hashes", found.block_hashes}});
}

void Server::KvDocuments(const http::Request& req, http::Response& res) {
  res.content_type = "application/json";
  const std::string prefix = std::string(kKvDocumentsPath) + "/";
  if (req.path != kKvDocumentsPath) {  // /v1/kv/documents/{name}
    const std::string name = DecodePathSegment(req.path.substr(prefix.size()));
    kvserve::KvDocumentInfo info;
    std::string error;
    if (req.method == "DELETE") {
      if (!engine_->RemoveKvDocument(name, &error)) return SendError(res, DocumentError(error));
      res.body = Dump(
          nlohmann::json{{"object", "kv.document.deleted"}, {"name", name}, {"deleted", true}});
      return;
    }
    if (!engine_->GetKvDocument(name, &info, &error)) return SendError(res, DocumentError(error));
    res.body = Dump(DocumentJson(info));
    return;
  }
  if (req.method == "GET" || req.method == "HEAD") {
    nlohmann::json data = nlohmann::json::array();
    for (const kvserve::KvDocumentInfo& d : engine_->ListKvDocuments()) {
      data.push_back(DocumentJson(d));
    }
    res.body = Dump(nlohmann::json{{"object", "list"}, {"data", data}});
    return;
  }
  // POST: {"name", "prompt" | "tokens" | "messages", "cache_salt"?}
  nlohmann::json body;
  if (auto err = ParseJsonBody(req.body, &body)) return SendError(res, *err);
  if (!body.is_object()) return SendError(res, BadRequest("the body must be a JSON object"));
  auto name_it = body.find("name");
  if (name_it == body.end() || !name_it->is_string()) {
    return SendError(res, BadRequest("'name' is required: a string", "name"));
  }
  const std::string name = *name_it;
  std::vector<int32_t> tokens;
  std::string salt, param;
  if (auto err = PromptOfBody(body, &tokens, &salt, &param)) return SendError(res, *err);
  kvserve::KvDocumentInfo info;
  std::string error;
  if (!engine_->SaveKvDocument(name, std::move(tokens), salt, &info, &error)) {
    ApiError e = DocumentError(error);
    // Too few tokens, too many for the context: the document's text, not its name.
    if (e.status == 400 && error.find("name") == std::string::npos) {
      e.param = param;
    }
    return SendError(res, e);
  }
  KVS_LOG_INFO("kv documents: saved %s (%d tokens, %d blocks)", info.name.c_str(), info.tokens,
               info.blocks);
  res.body = Dump(DocumentJson(info));
}

}  // namespace kvs::server
