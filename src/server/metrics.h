// Server metrics in the Prometheus text format, named like vLLM's with a "kvserve:" prefix.
// Thread-safe: request handlers record, the /metrics handler renders.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kvserve/kvserve.h"
#include "server/http/http_server.h"

namespace kvs::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends the _bucket/_sum/_count lines of metric `name`.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void RecordRequest(int64_t prompt_tokens, int64_t generation_tokens, double ttft_s, double e2e_s,
                     bool ok);
  void RecordInterTokenGap(double seconds);  // time per output token, one per gap
  std::string Render(const kvserve::EngineStats& engine, const std::string& model,
                     const http::HttpServer::Stats& connections = {}) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, requests_ok_ = 0, requests_failed_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace kvs::server
