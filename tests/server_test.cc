// HTTP contract tests: a server on a free loopback port serving stories260K, a C++ client
// (cpp-httplib), every endpoint and error of the OpenAI-compatible API.
#include <gtest/gtest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/openai_server.h"
#include "testing/temp_dir.h"
#include "testing/test_models.h"

namespace kvs::server {
namespace {

using nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {}) {
    const std::string path = testing::TestModelPath("stories260K.gguf");
    if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found (set KVSERVE_TEST_MODELS)";
    options.model_path = path;
    options.port = 0;
    options.engine.threads = 2;
    if (options.engine.n_ctx == 4096) options.engine.n_ctx = 512;
    server_ = std::make_unique<Server>(options);
    auto port = server_->Listen();
    ASSERT_TRUE(port.ok()) << port.error();
    port_ = *port;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_read_timeout(60, 0);
    auto loading = client_->Get("/health");  // the model is not loaded yet
    ASSERT_TRUE(loading);
    EXPECT_EQ(loading->status, 503);
    EXPECT_NE(loading->body.find("loading"), std::string::npos);
    const Status loaded = server_->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.message();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  httplib::Result Post(const std::string& path, const json& body, httplib::Headers headers = {}) {
    return client_->Post(path.c_str(), headers, body.dump(), "application/json");
  }
  // The status and the parsed body (a JSON value, possibly after keep-alive whitespace).
  std::pair<int, json> Call(const std::string& path, const json& body) {
    auto r = Post(path, body);
    EXPECT_TRUE(r);
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // SSE data payloads of a streamed response.
  std::vector<std::string> Stream(const std::string& path, const json& body) {
    auto r = Post(path, body);
    EXPECT_TRUE(r);
    std::vector<std::string> events;
    if (!r) return events;
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    size_t pos = 0;
    while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
      const size_t end = r->body.find("\n\n", pos);
      events.push_back(r->body.substr(pos + 6, end - pos - 6));
      pos = end;
    }
    return events;
  }
  double Metric(const std::string& name) {
    auto r = client_->Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    const std::string key = "kvserve:" + name + " ";
    const size_t pos = r->body.find("\n" + key);
    EXPECT_NE(pos, std::string::npos) << name;
    return pos == std::string::npos ? -1 : std::stod(r->body.substr(pos + 1 + key.size()));
  }

  // Waits (bounded) until read() is at least want: the engine publishes its totals after each
  // step, which may be after the response that step finished.
  bool MetricBecomesAtLeast(const std::function<double()>& read, double want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (read() >= want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  // A long greedy stream ("Once upon a time", 3900 tokens, no stop at EOS) whose chunks go to
  // on_chunk(count so far); the client hangs up when it returns false. Returns once it has.
  void LongStream(const std::function<bool(int)>& on_chunk) {
    httplib::Client streamer("127.0.0.1", port_);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{
        {"prompt", "Once upon a time"},
        {"max_tokens", 3900},
        {"stream", true},
        {"temperature", 0},
        {"ignore_eos",
         true}}.dump();
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      return on_chunk(++chunks);
    };
    streamer.send(req);
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;
};

const char* kStory = ", there was a little girl named Lily.";  // greedy after "Once upon a time"

TEST_F(ServerTest, HealthModelsAndMetrics) {
  Start();
  auto h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = client_->Get("/v1/models");
  ASSERT_TRUE(m);
  const json models = json::parse(m->body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "stories260K");
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* name :
       {"kv_cache_usage_perc", "num_requests_running", "num_requests_waiting",
        "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
        "time_to_first_token_seconds_bucket", "time_per_output_token_seconds_bucket",
        "e2e_request_latency_seconds_bucket", "spec_decode_num_drafts_total",
        "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
        "evicted_tokens_total", "compactions_total", "blocks_freed_by_compaction_total"}) {
    EXPECT_NE(metrics->body.find(std::string("kvserve:") + name), std::string::npos) << name;
  }
  // Counters, with their TYPE, at 0 before any request evicted.
  for (const char* name :
       {"evicted_tokens_total", "compactions_total", "blocks_freed_by_compaction_total"}) {
    EXPECT_NE(metrics->body.find(std::string("# TYPE kvserve:") + name + " counter\n"),
              std::string::npos)
        << name;
    EXPECT_EQ(Metric(name), 0) << name;
  }
}

TEST_F(ServerTest, CompletionGreedyWithUsageAndMetrics) {
  Start();
  auto [status, body] = Call("/v1/completions", {{"model", "stories260K"},
                                                 {"prompt", "Once upon a time"},
                                                 {"max_tokens", 12},
                                                 {"temperature", 0}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["object"], "text_completion");
  const std::string text = body["choices"][0]["text"];
  EXPECT_EQ(text.substr(0, 20), std::string(kStory).substr(0, 20));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);  // BOS + 4
  EXPECT_EQ(body["usage"]["total_tokens"], 17);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(Metric("generation_tokens_total"), 12);
  EXPECT_EQ(Metric("prompt_tokens_total"), 5);
  // A token-array prompt is the same prompt.
  auto [s2, b2] =
      Call("/v1/completions",
           {{"prompt", {1, 403, 407, 261, 378}}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(b2["choices"][0]["text"], text);
}

TEST_F(ServerTest, PrefixCacheReportsCachedTokensAndRespectsSalt) {
  Start();
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 40; ++i) prompt.push_back(10 + i * 7 % 400);
  const json req = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}};
  auto [s1, first] = Call("/v1/completions", req);
  ASSERT_EQ(s1, 200) << first.dump();
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  auto [s2, second] = Call("/v1/completions", req);
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], 32);  // 2 full blocks
  EXPECT_EQ(second["choices"][0]["text"], first["choices"][0]["text"]);
  json salted = req;
  salted["cache_salt"] = "tenant-b";
  auto [s3, third] = Call("/v1/completions", salted);
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(third["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(third["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(Metric("prefix_cache_queries_total"), 120);
  EXPECT_EQ(Metric("prefix_cache_hits_total"), 32);
}

// Tiers are data: blocks a tier loaded show in usage under its name (disk_tokens; redis_tokens 0,
// as every tier the build has is named), in /metrics under kv_tier_*{tier="disk"} and the names
// from before the label (kv_disk_*), and in /v1/kv/state's counters and tiers.
TEST_F(ServerTest, TierLoadsShowUnderTheTierLabel) {
  testing::TempDir dir;
  ServerOptions options;
  options.engine.kv_disk = dir.path();
  Start(options);
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 40; ++i) prompt.push_back(10 + i * 7 % 400);
  const json body = {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
  auto [s0, cold] = Call("/v1/completions", body);
  ASSERT_EQ(s0, 200) << cold.dump();
  EXPECT_EQ(cold["usage"]["prompt_tokens_details"],
            json({{"cached_tokens", 0}, {"disk_tokens", 0}, {"redis_tokens", 0}}));
  // The reset waits for the tier's writes, then drops the RAM copies: the blocks come from disk.
  auto reset = Post("/reset_prefix_cache", json::object());
  ASSERT_TRUE(reset);
  ASSERT_EQ(reset->status, 200) << reset->body;
  auto [s1, warm] = Call("/v1/completions", body);
  ASSERT_EQ(s1, 200) << warm.dump();
  EXPECT_EQ(warm["usage"]["prompt_tokens_details"],
            json({{"cached_tokens", 32}, {"disk_tokens", 32}, {"redis_tokens", 0}}));
  EXPECT_EQ(warm["choices"][0]["text"], cold["choices"][0]["text"]);

  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* line :
       {"# TYPE kvserve:kv_tier_hits_total counter\n",
        "kvserve:kv_tier_hits_total{tier=\"disk\"} 2\n", "kvserve:kv_tier_up{tier=\"disk\"} 1\n",
        "kvserve:kv_disk_hits_total 2\n", "kvserve:kv_disk_up 1\n",
        "kvserve:kv_tier_blocks_written_total{tier=\"disk\"} 2\n"}) {
    EXPECT_NE(metrics->body.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(metrics->body.find("tier=\"redis\""), std::string::npos);  // not on
  EXPECT_EQ(Metric("kv_disk_misses_total"), 2);  // the cold run looked for both
  EXPECT_GT(Metric("kv_disk_capacity_bytes"), 0);

  auto state = client_->Get("/v1/kv/state");
  ASSERT_TRUE(state);
  const json st = json::parse(state->body);
  EXPECT_EQ(st["counters"]["kv_disk_hits_total"], 2);
  EXPECT_EQ(st["counters"]["kv_redis_hits_total"], 0);
  ASSERT_EQ(st["tiers"].size(), 1u) << st["tiers"].dump();
  EXPECT_EQ(st["tiers"][0]["tier"], "disk");
  EXPECT_EQ(st["tiers"][0]["hits_total"], 2);
  EXPECT_EQ(st["tiers"][0]["up"], true);
}

TEST_F(ServerTest, KvLookupCountsTheLeadingBlocksHeldPerSalt) {
  Start();
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 40; ++i) prompt.push_back(10 + i * 7 % 400);
  auto [s0, before] = Call("/v1/kv/lookup", {{"tokens", prompt}});
  ASSERT_EQ(s0, 200) << before.dump();
  EXPECT_EQ(before["object"], "kv.lookup");
  EXPECT_EQ(before["prompt_tokens"], 40);
  EXPECT_EQ(before["block_size"], 16);
  EXPECT_EQ(before["ram_tokens"], 0);
  EXPECT_EQ(before["block_hashes"].size(), 2u);  // the full blocks
  EXPECT_EQ(before["block_hashes"][0].get<std::string>().size(), 32u);
  auto [s1, done] = Call("/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}});
  ASSERT_EQ(s1, 200) << done.dump();
  auto [s2, after] = Call("/v1/kv/lookup", {{"tokens", prompt}});
  EXPECT_EQ(after["ram_tokens"], 32);
  EXPECT_EQ(after["cached_tokens"], 32);
  EXPECT_EQ(after["disk_tokens"], 0);
  EXPECT_EQ(after["block_hashes"], before["block_hashes"]);
  // The same by GET, and a salt that never shared them.
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  auto get = client_->Get(("/v1/kv/lookup?tokens=" + ids).c_str());
  ASSERT_TRUE(get);
  EXPECT_EQ(json::parse(get->body)["ram_tokens"], 32);
  auto salted = client_->Get(("/v1/kv/lookup?cache_salt=b&tokens=" + ids).c_str());
  ASSERT_TRUE(salted);
  EXPECT_EQ(json::parse(salted->body)["ram_tokens"], 0);
  EXPECT_NE(json::parse(salted->body)["block_hashes"], before["block_hashes"]);
  // A prompt by text, and the errors.
  auto text = client_->Get("/v1/kv/lookup?prompt=Once+upon+a+time");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 200);
  EXPECT_EQ(client_->Get("/v1/kv/lookup")->status, 400);
  EXPECT_EQ(client_->Get("/v1/kv/lookup?tokens=1,x")->status, 400);
  EXPECT_EQ(client_->Get("/v1/kv/lookup?tokens=1,99999")->status, 400);
  EXPECT_EQ(client_->Delete("/v1/kv/lookup")->status, 405);
}

// vLLM's return_token_ids: the reply's ids, streamed or not, so that a client resending the
// conversation as token ids (bench serve's multi-turn workload) hits the KV of the reply too.
TEST_F(ServerTest, ReturnTokenIdsResendTheReplyExactly) {
  Start();
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};  // BOS "Once upon a time"
  // 5 + 27 fed = 32 positions: two full blocks, the reply's included.
  const json req = {
      {"prompt", prompt}, {"max_tokens", 28}, {"temperature", 0}, {"return_token_ids", true}};
  auto [status, body] = Call("/v1/completions", req);
  ASSERT_EQ(status, 200) << body.dump();
  const std::vector<int32_t> ids = body["choices"][0]["token_ids"];
  ASSERT_EQ(ids.size(), 28u);

  json streamed_req = req;
  streamed_req["stream"] = true;
  std::vector<int32_t> streamed;
  for (const std::string& e : Stream("/v1/completions", streamed_req)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    for (const json& id : chunk["choices"][0]["token_ids"]) streamed.push_back(id);
  }
  EXPECT_EQ(streamed, ids);

  // Prompt + reply + a new turn: both full blocks come from the cache.
  std::vector<int32_t> resend = prompt;
  resend.insert(resend.end(), ids.begin(), ids.end());
  for (int32_t i = 0; i < 8; ++i) resend.push_back(300 + i);
  auto [s2, again] =
      Call("/v1/completions", {{"prompt", resend}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(s2, 200) << again.dump();
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_FALSE(again["choices"][0].contains("token_ids"));  // only when asked

  auto [s3, chat] =
      Call("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                    {"max_tokens", 4},
                                    {"return_token_ids", true}});
  ASSERT_EQ(s3, 200) << chat.dump();
  EXPECT_EQ(chat["choices"][0]["token_ids"].size(), 4u);
  auto [s4, bad] = Call("/v1/completions", {{"prompt", "x"}, {"return_token_ids", "yes"}});
  EXPECT_EQ(s4, 400);
  EXPECT_EQ(bad["error"]["param"], "return_token_ids");
}

TEST_F(ServerTest, StopStringsNAndLogprobs) {
  Start();
  auto [status, body] = Call("/v1/completions", {{"prompt", "Once upon a time"},
                                                 {"max_tokens", 40},
                                                 {"temperature", 0},
                                                 {"stop", {"girl", "never-seen"}},
                                                 {"n", 2},
                                                 {"logprobs", 2}});
  ASSERT_EQ(status, 200) << body.dump();
  ASSERT_EQ(body["choices"].size(), 2u);
  for (const json& c : body["choices"]) {
    EXPECT_EQ(c["text"], ", there was a little ");
    EXPECT_EQ(c["finish_reason"], "stop");
    const json& lp = c["logprobs"];
    ASSERT_FALSE(lp.is_null());
    EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
    EXPECT_GE(lp["tokens"].size(), 5u);
    EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
    EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);
  }
  // Chat logprobs: greedy picks the most likely token, so it is the first alternative.
  auto [cs, cb] =
      Call("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                    {"max_tokens", 3},
                                    {"temperature", 0},
                                    {"logprobs", true},
                                    {"top_logprobs", 3}});
  ASSERT_EQ(cs, 200) << cb.dump();
  const json& content = cb["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 3u);
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(),
                  content[0]["top_logprobs"][0]["logprob"].get<float>());
}

// A stop string cuts the text exactly before it, whatever the engine produced after it (it runs
// a step or more before the cancel reaches it), and usage counts the tokens up to the one that
// completed the stop: the same answer streamed and not. The reference is the same greedy run
// without the stop, its text per token from logprobs.
TEST_F(ServerTest, StopStringCutsExactlyAndCountsTokensToTheStop) {
  Start();
  const json base = {
      {"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 0}};
  auto [s0, full] = Call("/v1/completions", base);
  ASSERT_EQ(s0, 200) << full.dump();
  const std::string text = full["choices"][0]["text"];
  const json& pieces = full["choices"][0]["logprobs"]["tokens"];
  for (const std::string stop : {"girl", "e", "ittle g"}) {
    SCOPED_TRACE(stop);
    const size_t at = text.find(stop);
    ASSERT_NE(at, std::string::npos) << text;
    // The token whose text completes the first occurrence of the stop.
    int64_t tokens = 0;
    std::string so_far;
    for (const json& p : pieces) {
      so_far += p.get<std::string>();
      ++tokens;
      if (so_far.find(stop) != std::string::npos) break;
    }
    json body = base;
    body["stop"] = {stop};
    auto [s1, cut] = Call("/v1/completions", body);
    ASSERT_EQ(s1, 200) << cut.dump();
    EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, at));
    EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(cut["usage"]["completion_tokens"], tokens);
    EXPECT_EQ(cut["choices"][0]["logprobs"]["tokens"].size(), static_cast<size_t>(tokens));

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    std::string streamed;
    json usage;
    for (const std::string& e : Stream("/v1/completions", body)) {
      if (e == "[DONE]") continue;
      const json chunk = json::parse(e);
      if (!chunk["usage"].is_null()) usage = chunk["usage"];
      for (const json& c : chunk["choices"]) streamed += c["text"].get<std::string>();
    }
    EXPECT_EQ(streamed, text.substr(0, at));
    EXPECT_EQ(usage["completion_tokens"], tokens);
  }
}

TEST_F(ServerTest, ChatPlainAndStreamedWithUsage) {
  Start();
  const json messages = {{{"role", "system"}, {"content", "Tell a story."}},
                         {{"role", "user"}, {"content", "Once upon a time"}}};
  auto [status, body] =
      Call("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  const std::string answer = body["choices"][0]["message"]["content"];
  EXPECT_FALSE(answer.empty());

  const auto events =
      Stream("/v1/chat/completions", {{"messages", messages},
                                      {"max_tokens", 8},
                                      {"temperature", 0},
                                      {"stream", true},
                                      {"stream_options", {{"include_usage", true}}}});
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string streamed;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_TRUE(chunk["usage"].is_null());
    const json& choice = chunk["choices"][0];
    if (i == 0) {
      EXPECT_EQ(choice["delta"]["role"], "assistant");
    }
    if (choice["delta"].contains("content"))
      streamed += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(streamed, answer);  // same greedy answer, streamed
  EXPECT_EQ(finish, "length");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 8);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], body["usage"]["prompt_tokens"]);
}

TEST_F(ServerTest, ErrorsAreOpenAiShapedWithTheRightStatus) {
  ServerOptions o;
  o.engine.n_ctx = 64;
  o.max_body_bytes = 4096;
  Start(o);
  auto expect = [&](httplib::Result r, int status, const std::string& fragment,
                    const std::string& param = "") {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const json body = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(body.contains("error")) << r->body;
    EXPECT_NE(body["error"]["message"].get<std::string>().find(fragment), std::string::npos)
        << r->body;
    EXPECT_TRUE(body["error"].contains("type"));
    if (!param.empty()) {
      EXPECT_EQ(body["error"]["param"], param);
    }
  };
  expect(client_->Post("/v1/completions", "{not json", "application/json"), 400, "not valid JSON");
  expect(Post("/v1/completions", {{"prompt", "x"}, {"temperature", -1}}), 400, "temperature",
         "temperature");
  expect(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", "ten"}}), 400, "max_tokens",
         "max_tokens");
  expect(Post("/v1/completions", {{"prompt", "x"}, {"n", 0}}), 400, "'n'", "n");
  expect(Post("/v1/completions", {{"prompt", "x"}, {"stop", {1, 2}}}), 400, "stop", "stop");
  expect(Post("/v1/completions", {{"max_tokens", 3}}), 400, "prompt", "prompt");
  expect(Post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages", "messages");
  expect(Post("/v1/chat/completions", {{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}),
         400, "role", "messages");
  expect(Post("/v1/completions", {{"prompt", std::vector<int32_t>(70, 5)}}), 400,
         "maximum context length", "prompt");
  expect(Post("/v1/completions", {{"prompt", {5, 99999}}}), 400, "vocabulary", "prompt");
  expect(Post("/v1/completions", {{"model", "gpt-9"}, {"prompt", "x"}}), 404, "does not exist",
         "model");
  expect(client_->Get("/v2/nothing"), 404, "Unknown path");
  expect(client_->Get("/%ff%fe"), 404, "Unknown path");  // not UTF-8 once decoded
  expect(Post("/v1/chat/completions",
              {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}}}}}}}}),
         400, "text content parts", "messages");
  expect(Post("/v1/chat/completions",
              {{"messages", {{{"role", "user"}, {"content", {{{"type", 1}}}}}}}}),
         400, "text content parts", "messages");
  expect(Post("/v1/completions", {{"prompt", {1, 4294967296LL}}}), 400, "out of range", "prompt");
  expect(Post("/v1/completions", {{"prompt", {1, -3}}}), 400, "out of range", "prompt");
  expect(client_->Post("/v1/completions", std::string(8192, ' '), "application/json"), 413,
         "too large");
}

TEST_F(ServerTest, ApiKeyIsRequiredOnV1) {
  ServerOptions o;
  o.api_key = "sekret";
  Start(o);
  auto none = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}});
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  auto wrong = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}},
                    {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(json::parse(wrong->body)["error"]["code"], "invalid_api_key");
  auto right = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}},
                    {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
  auto health = client_->Get("/health");  // not under /v1: open
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// A 100-token prompt and 100 tokens more under a 40-position budget (the default guard keeps 4
// sinks and a 32-position window): eviction runs at the end of the prefill and as the output
// grows, and the metrics count what it dropped and the blocks it returned.
TEST_F(ServerTest, RequestKvBudgetEvictsAndMetricsCountIt) {
  Start();
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 100; ++i) prompt.push_back(10 + i * 7 % 400);
  auto [status, body] = Call("/v1/completions", {{"prompt", prompt},
                                                 {"max_tokens", 100},
                                                 {"temperature", 0},
                                                 {"ignore_eos", true},
                                                 {"kv_budget", 40}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["usage"]["completion_tokens"], 100);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  // 199 positions computed, at most 40 + a block of 16 kept at any time: well over 100 dropped.
  // The engine publishes its totals after each step, so wait for them rather than race it.
  EXPECT_TRUE(MetricBecomesAtLeast([&] { return Metric("evicted_tokens_total"); }, 100))
      << Metric("evicted_tokens_total");
  const double evicted_total = Metric("evicted_tokens_total");
  const double compactions = Metric("compactions_total");
  const double freed = Metric("blocks_freed_by_compaction_total");
  EXPECT_GT(compactions, 0);
  EXPECT_GT(freed, 0);
  // The default schedule evicts once a sequence is a whole block past its budget, so that every
  // compaction frees a block; and a compaction frees no more blocks than the positions it
  // dropped fill, plus the slack of a partly filled last block (15 slots).
  EXPECT_GE(freed, compactions);
  EXPECT_LE(freed * 16, evicted_total + 15 * compactions)
      << "more whole blocks freed than positions dropped";
  const double total_blocks = Metric("kv_cache_blocks_total");
  EXPECT_TRUE(MetricBecomesAtLeast([&] { return Metric("kv_cache_blocks_free"); }, total_blocks))
      << "blocks still held after the request";
  // A request without a budget on the same server evicts nothing more.
  const double evicted = Metric("evicted_tokens_total");
  auto [s2, b2] = Call("/v1/completions", {{"prompt", prompt}, {"max_tokens", 20}});
  ASSERT_EQ(s2, 200) << b2.dump();
  EXPECT_EQ(Metric("evicted_tokens_total"), evicted);
}

// kv_budget takes positions (an integer) or a string ("512", "25%"); every other form, and a
// budget below what the guard never evicts, is a 400 naming it, on both endpoints.
TEST_F(ServerTest, RequestKvBudgetFormsAndRefusals) {
  Start();
  auto expect_bad = [&](const std::string& path, const json& value, const std::string& fragment) {
    json req = {{"max_tokens", 2}, {"kv_budget", value}};
    if (path == "/v1/completions") {
      req["prompt"] = "Once upon a time";
    } else {
      req["messages"] = {{{"role", "user"}, {"content", "Hi"}}};
    }
    auto [status, body] = Call(path, req);
    EXPECT_EQ(status, 400) << path << " " << value.dump() << ": " << body.dump();
    ASSERT_TRUE(body.contains("error")) << body.dump();
    EXPECT_EQ(body["error"]["param"], "kv_budget") << value.dump();
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    const std::string message = body["error"]["message"];
    EXPECT_NE(message.find("kv_budget"), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << value.dump() << ": " << message;
  };
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    expect_bad(path, 40.5, "number of positions");
    expect_bad(path, 64.0, "number of positions");  // a float, even a whole one
    expect_bad(path, -5, "0 (off) or positive");
    expect_bad(path, true, "number of positions");
    expect_bad(path, json::object({{"positions", 64}}), "number of positions");
    expect_bad(path, json::array({64}), "number of positions");
    expect_bad(path, "abc", "expected a number of positions");
    expect_bad(path, "-5", "0 (off) or positive");
    expect_bad(path, "150%", "between 0% and 100%");
    expect_bad(path, "25 %", "expected a number of positions");
    expect_bad(path, std::string(100, '9'), "number of positions");
    expect_bad(path, 4294967296LL, "0 (off) or positive");
    expect_bad(path, 10, "at least 36");  // below --kv-sink 4 + --kv-window 32
    expect_bad(path, "35", "at least 36");
  }
  // The good forms: positions as an integer or a string, a share as a string; 0 is the
  // engine's budget (none here).
  const json messages = {{{"role", "user"}, {"content", "Once upon a time"}}};
  for (const json& good : {json(40), json("40"), json("25%"), json(0)}) {
    auto [s1, b1] = Call("/v1/completions", {{"prompt", "Once upon a time"},
                                             {"max_tokens", 4},
                                             {"temperature", 0},
                                             {"kv_budget", good}});
    EXPECT_EQ(s1, 200) << good.dump() << ": " << b1.dump();
    EXPECT_EQ(b1["usage"]["completion_tokens"], 4) << good.dump();
    auto [s2, b2] = Call("/v1/chat/completions",
                         {{"messages", messages}, {"max_tokens", 4}, {"kv_budget", good}});
    EXPECT_EQ(s2, 200) << good.dump() << ": " << b2.dump();
  }
}

// Waits (bounded) until the metric reaches a value: the server frees blocks on its own thread.
bool MetricBecomes(ServerTest* t, const std::function<double()>& read, double want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (read() == want) return true;
    std::this_thread::yield();
  }
  return false;
}

TEST_F(ServerTest, DisconnectMidStreamFreesBlocksAndOverloadGets503) {
  ServerOptions o;
  o.engine.n_parallel = 1;
  o.max_queue = 0;
  o.engine.n_ctx = 4000;
  Start(o);
  const double total = Metric("kv_cache_blocks_total");
  // A long streamed request; the client reads two chunks and hangs up.
  std::atomic<bool> second_refused{false};
  std::thread t([&] {
    LongStream([&](int chunks) {
      if (chunks == 2) {
        // While it runs, the only seat (-np 1, no queue) is taken: a second request gets 503.
        auto r = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}});
        second_refused = r && r->status == 503 && r->body.find("overloaded") != std::string::npos;
      }
      return chunks < 3;  // hang up
    });
  });
  t.join();
  EXPECT_TRUE(second_refused);
  EXPECT_TRUE(MetricBecomes(
      this, [&] { return Metric("kv_cache_blocks_free"); }, total))
      << "blocks still held after the client went away";
  EXPECT_GE(Metric("request_failure_total"), 1);
  // The seat is free again.
  auto [status, body] = Call("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(status, 200) << body.dump();
}

// TTFT goes to /metrics at the first token (as vLLM records it), not when the request ends: read
// while a long stream still runs, the histogram already counts it.
TEST_F(ServerTest, TimeToFirstTokenIsRecordedWhileTheStreamRuns) {
  ServerOptions o;
  o.engine.n_ctx = 4000;
  Start(o);
  double ttft_count = -1, running = -1;
  std::thread t([&] {
    LongStream([&](int chunks) {
      if (chunks == 2) {
        ttft_count = Metric("time_to_first_token_seconds_count");
        running = Metric("num_requests_running");
      }
      return chunks < 3;  // hang up
    });
  });
  t.join();
  EXPECT_EQ(running, 1) << "the stream had ended before /metrics was read";
  EXPECT_EQ(ttft_count, 1);
}

// Chat formats: recognised from real templates' markers, rendered with the family's tokens.
TEST(ChatTemplate, DetectsFamiliesAndRendersThem) {
  EXPECT_EQ(DetectChatFormat("{% for m in messages %}<|im_start|>{{m.role}}"), ChatFormat::kChatML);
  EXPECT_EQ(DetectChatFormat("<|start_header_id|>' + message['role']"), ChatFormat::kLlama3);
  EXPECT_EQ(DetectChatFormat("[INST] <<SYS>>\n' + system"), ChatFormat::kLlama2);
  EXPECT_EQ(DetectChatFormat("{{ '[INST] ' + message['content'] + ' [/INST]' }}"),
            ChatFormat::kMistral);
  EXPECT_EQ(DetectChatFormat(""), ChatFormat::kPlain);
  EXPECT_FALSE(ChatFormatFromName("vicuna").ok());
  EXPECT_EQ(*ChatFormatFromName("qwen"), ChatFormat::kChatML);

  const std::vector<ChatMessage> m = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, m).text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(RenderChat(ChatFormat::kLlama3, m).text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(RenderChat(ChatFormat::kMistral, m).text,
            "<s>[INST] Be brief.\n\nHi [/INST]Hello</s>[INST] Bye [/INST]");
  EXPECT_EQ(RenderChat(ChatFormat::kLlama2, m).text,
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Bye [/INST]");
  const RenderedChat plain = RenderChat(ChatFormat::kPlain, m);
  EXPECT_EQ(plain.text, "System: Be brief.\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:");
  EXPECT_TRUE(plain.add_bos);
}

// GET /v1/kv/state (the dashboard's data): the block map agrees with /metrics (free and
// free-but-cached blocks are /metrics' free ones), the prompt's full blocks show as cached after
// the request, and a request being streamed is listed with its tokens and block table.
TEST_F(ServerTest, KvStateAgreesWithMetricsAndListsRunningRequests) {
  // A long context: the streamed request below must still run when its first chunk arrives
  // (stories260K makes 300 tokens in well under the time a state read took on a busy machine).
  ServerOptions o;
  o.engine.n_ctx = 8192;
  Start(o);
  const std::string prompt =
      "Once upon a time there was a little girl named Lily. She liked to play in the park with "
      "her friends every day after school.";
  auto [code, done] = Call("/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}});
  ASSERT_EQ(code, 200) << done.dump();
  const int prompt_tokens = done["usage"]["prompt_tokens"];
  auto get_state = [&] {
    auto r = client_->Get("/v1/kv/state");
    EXPECT_TRUE(r && r->status == 200);
    return r ? json::parse(r->body) : json();
  };
  // The engine publishes its totals after the step; the pool is quiet once no request runs.
  ASSERT_TRUE(
      MetricBecomesAtLeast([&] { return Metric("prefix_cache_queries_total"); }, prompt_tokens));
  const json st = get_state();
  EXPECT_EQ(st["object"], "kv.state");
  EXPECT_EQ(st["block_size"], 16);
  EXPECT_EQ(st["num_blocks"], Metric("kv_cache_blocks_total"));
  EXPECT_EQ(st["blocks"].get<std::string>().size(), st["num_blocks"].get<size_t>());
  const json& n = st["counts"];
  EXPECT_EQ(n["free"].get<double>() + n["cached"].get<double>(), Metric("kv_cache_blocks_free"));
  EXPECT_EQ(n["used"].get<int>() + n["shared"].get<int>(), 0);
  EXPECT_EQ(n["cached"], (prompt_tokens - 1) / 16);  // the prompt's full blocks, kept
  EXPECT_EQ(st["counters"]["prefix_cache_queries_total"], Metric("prefix_cache_queries_total"));
  EXPECT_EQ(st["counters"]["request_success_total"], Metric("request_success_total"));
  EXPECT_TRUE(st["running"].empty());
  EXPECT_GT(st["latency"]["ttft_p50_s"].get<double>(), 0);

  // While a request streams, it is running and holds blocks (the same prompt: its cached ones).
  httplib::Client streamer("127.0.0.1", port_);
  json seen;
  const json body = {
      {"prompt", prompt}, {"max_tokens", 8000}, {"stream", true}, {"ignore_eos", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string first_chunk;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (seen.is_null()) seen = get_state();
    first_chunk.assign(data, n);
    return false;  // one chunk is enough: the client goes away, the request is cancelled
  };
  streamer.send(req);
  ASSERT_FALSE(seen.is_null());
  ASSERT_EQ(seen["running"].size(), 1u) << seen.dump();
  const json& r = seen["running"][0];
  // Named as the client knows it (the stream's id), its first choice.
  const size_t id_at = first_chunk.find("\"id\":\"");
  ASSERT_NE(id_at, std::string::npos) << first_chunk;
  const std::string stream_id =
      first_chunk.substr(id_at + 6, first_chunk.find('"', id_at + 6) - (id_at + 6));
  EXPECT_EQ(stream_id.rfind("cmpl-", 0), 0u) << first_chunk;
  EXPECT_EQ(r["id"], stream_id);
  EXPECT_EQ(r["choice"], 0);
  EXPECT_EQ(r["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r["cached_tokens"], (prompt_tokens - 1) / 16 * 16);
  // The table covers every token whose KV is written: all but the last sampled one, whose KV the
  // next step writes (its block is taken then); it may hold a block ahead for the next steps.
  const int held = r["prompt_tokens"].get<int>() + r["output_tokens"].get<int>() - 1;
  EXPECT_GE(r["blocks"].size() * 16, static_cast<size_t>(held));
  EXPECT_LE(r["blocks"].size() * 16, static_cast<size_t>(held) + 2 * 16);
  const std::string map = seen["blocks"];
  for (const json& id : r["blocks"]) {
    const char c = map.at(id.get<size_t>() - 1);
    EXPECT_TRUE(c == 'u' || c == 's') << "block " << id << " is '" << c << "'";
  }
  EXPECT_EQ(seen["counts"]["used"].get<int>() + seen["counts"]["shared"].get<int>(),
            static_cast<int>(r["blocks"].size()));
}

// The page is served (small, self-contained), --no-dashboard turns it off, and with --api-key
// the state needs the key like every /v1 route while the page (no data in it) does not.
TEST_F(ServerTest, DashboardPageKeyAndSwitch) {
  ServerOptions o;
  o.api_key = "sekret";
  Start(o);
  auto page = client_->Get("/dashboard");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_LT(page->body.size(), 100u * 1024);
  EXPECT_NE(page->body.find("/v1/kv/state"), std::string::npos);
  EXPECT_EQ(page->body.find("http://"), std::string::npos);  // nothing from elsewhere
  EXPECT_EQ(page->body.find("https://"), std::string::npos);
  // Not framed by other sites, not cached: the page keeps the key for the tab.
  EXPECT_EQ(page->get_header_value("X-Frame-Options"), "DENY");
  EXPECT_EQ(page->get_header_value("Cache-Control"), "no-store");
  auto no_key = client_->Get("/v1/kv/state");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(no_key->get_header_value("WWW-Authenticate"), "Bearer");
  auto post = client_->Post("/v1/kv/state", {{"Authorization", "Bearer sekret"}}, "", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  auto with_key = client_->Get("/v1/kv/state", {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(with_key);
  EXPECT_EQ(with_key->status, 200);
  server_->Stop();

  ServerOptions off;
  off.dashboard = false;
  Start(off);
  auto gone = client_->Get("/dashboard");
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->status, 404);
  auto state = client_->Get("/v1/kv/state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->status, 200);
}

}  // namespace
}  // namespace kvs::server
