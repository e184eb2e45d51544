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
#include "testing/server_fixture.h"
#include "testing/temp_dir.h"
#include "testing/test_models.h"

namespace kvs::server {
namespace {

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
  EXPECT_EQ(DetectChatFormat("{{ '<start_of_turn>' + role + '\n' + message['content'] | trim }}"),
            ChatFormat::kGemma);
  EXPECT_EQ(DetectChatFormat(""), ChatFormat::kPlain);
  EXPECT_EQ(*ChatFormatFromName("gemma"), ChatFormat::kGemma);
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
  const RenderedChat gemma = RenderChat(
      ChatFormat::kGemma,
      {{"system", "Be brief."}, {"user", " Hi \n"}, {"assistant", "Hello"}, {"user", "Bye"}});
  EXPECT_EQ(gemma.text,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
            "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_TRUE(gemma.add_bos);
  // As the Jinja template: only a first system message opens the next turn (an empty one still
  // adds its blank line), a later one is a turn, and a lone system message renders no turn.
  EXPECT_EQ(RenderChat(ChatFormat::kGemma, {{"system", ""}, {"assistant", "A"}}).text,
            "<start_of_turn>model\n\n\nA<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(RenderChat(ChatFormat::kGemma, {{"user", "Q"}, {"system", "S"}}).text,
            "<start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>system\nS<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(RenderChat(ChatFormat::kGemma, {{"system", "S"}}).text, "<start_of_turn>model\n");
  const RenderedChat plain = RenderChat(ChatFormat::kPlain, m);
  EXPECT_EQ(plain.text, "System: Be brief.\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:");
  EXPECT_TRUE(plain.add_bos);
}

}  // namespace
}  // namespace kvs::server
