// The server tests' fixture: a server on a free loopback port serving stories260K and a C++
// client (cpp-httplib) for it; shared by tests/server_test.cc and tests/server_kv_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/openai_server.h"
#include "testing/temp_dir.h"
#include "testing/test_models.h"

namespace kvs::server {

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

inline const char* const kStory =
    ", there was a little girl named Lily.";  // greedy after "Once upon a time"

}  // namespace kvs::server
