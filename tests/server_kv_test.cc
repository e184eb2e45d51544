// HTTP contract tests of the KV cache's endpoints and figures: tier labels in usage and metrics,
// /v1/kv/lookup, a request's kv_budget, /v1/kv/state against /metrics, the dashboard page. The
// fixture is tests/testing/server_fixture.h.
#include <gtest/gtest.h>

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "testing/server_fixture.h"

namespace kvs::server {
namespace {

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
