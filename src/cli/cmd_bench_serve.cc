// `kvserve bench serve`: a bounded loopback load generator for any OpenAI-compatible server
// (kvserve, llama-server, vLLM). Streams /v1/completions with token-id prompts of a stated
// length distribution (fixed seed), at most C requests in flight, optionally Poisson arrivals
// at R requests/s; reports TTFT, TPOT, ITL percentiles, throughput, errors and the share of
// prompt tokens the server says came from its prefix cache. The multi-turn workload resends
// each chat's whole history every turn, optionally with a session header for a load balancer
// that hashes on it, and reports TTFT and the hit rate per turn.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/commands.h"

namespace kvs::cli {
namespace {

struct ServeBenchArgs {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string model;
  int32_t concurrency = 16;
  int32_t requests = 64;
  double rate = 0;  // requests/s, Poisson; 0: all at once (bounded by concurrency)
  int32_t prompt_tokens = 128;
  int32_t gen_tokens = 128;
  double sigma = 0;  // > 0: log-normal lengths around the two medians
  uint64_t seed = 42;
  bool json = false;
  // random: independent prompts (no reuse). shared-prefix: one --prefix-tokens system prompt,
  // then --requests different questions of --prompt-tokens; the first runs alone (cold), the
  // rest after it (warm). With --prefixes N > 1 there are N such prompts, request i using
  // prompt i mod N, none warmed first: each comes back after N - 1 others, which is what
  // shows how many prefixes the server's KV cache (and any tier below it) keeps.
  // multi-turn: --conversations chats at once of --turns turns each, a chat's turns one after
  // another, each resending the whole history as token ids (the previous prompt, the reply's
  // ids, a new user turn of --prompt-tokens random ids); see MultiTurnPrompt.
  std::string workload = "random";
  int32_t prefix_tokens = 2000;
  int32_t prefixes = 1;
  int32_t conversations = 8;
  int32_t turns = 6;
  // multi-turn: every request of a chat carries "<session_header>: <chat id>", what a load
  // balancer hashes on to keep a chat on one replica (deploy/haproxy.cfg: X-Session-Id).
  std::string session_header;
  // Options given on the command line, for the checks of which workload uses which.
  std::vector<std::string> given;
  bool Given(const std::string& name) const {
    return std::find(given.begin(), given.end(), name) != given.end();
  }
};

struct Outcome {
  bool ok = false;
  std::string error;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  int32_t cached_tokens = -1;      // usage.prompt_tokens_details.cached_tokens; -1: not reported
  std::string text;                // what was streamed
  std::vector<int32_t> token_ids;  // the reply's ids, where the server sends them
  int32_t turn = 0;                // multi-turn: 0-based turn of its chat
  double ttft = 0, e2e = 0;
  std::vector<double> gaps;  // between content chunks
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * (v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double frac = pos - i;
  return i + 1 < v.size() ? v[i] * (1 - frac) + v[i + 1] * frac : v[i];
}

// One streamed completion. `session`: the value of --session-header (none if empty);
// `want_ids`: asks for the reply's token ids (vLLM's return_token_ids; others ignore it).
Outcome RunOne(const ServeBenchArgs& a, const std::string& model, const nlohmann::json& prompt,
               int32_t max_tokens, const std::string& session = {}, bool want_ids = false) {
  Outcome o;
  o.prompt_tokens = prompt.is_array() ? static_cast<int32_t>(prompt.size()) : 0;
  httplib::Client client(a.url);
  client.set_read_timeout(600, 0);
  client.set_connection_timeout(10, 0);
  httplib::Headers headers;
  if (!a.api_key.empty()) headers.emplace("Authorization", "Bearer " + a.api_key);
  if (!session.empty() && !a.session_header.empty()) headers.emplace(a.session_header, session);
  nlohmann::json body = {{"prompt", prompt},
                         {"max_tokens", max_tokens},
                         {"temperature", 0},
                         {"stream", true},
                         {"ignore_eos", true},
                         {"stream_options", {{"include_usage", true}}},
                         // llama-server reuses a slot's KV for a repeated prompt unless told
                         // not to: only the workloads made of repeated prefixes allow it.
                         {"cache_prompt", a.workload != "random"}};
  if (!model.empty()) body["model"] = model;
  if (want_ids) body["return_token_ids"] = true;
  const auto t0 = Clock::now();
  auto last = t0;
  std::string buffer;
  int32_t chunks = 0, usage_tokens = -1;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  // Parses SSE events; .at() and type checks throw on odd replies, caught below.
  auto receive = [&](const char* data, size_t n) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const nlohmann::json chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded() || !chunk.is_object()) continue;
      if (chunk.contains("error")) {
        const nlohmann::json& err = chunk.at("error");
        o.error = err.is_object() && err.contains("message") ? err.at("message").dump()
                                                             : "error in stream";
        continue;
      }
      if (chunk.contains("usage") && chunk.at("usage").is_object() &&
          chunk.at("usage").contains("completion_tokens")) {
        usage_tokens = chunk.at("usage").at("completion_tokens").get<int32_t>();
        const nlohmann::json& usage = chunk.at("usage");
        if (usage.contains("prompt_tokens")) {
          o.prompt_tokens = usage.at("prompt_tokens").get<int32_t>();
        }
        // OpenAI's format, which kvserve and vLLM follow; null or absent: not reported.
        if (usage.contains("prompt_tokens_details") &&
            usage.at("prompt_tokens_details").is_object() &&
            usage.at("prompt_tokens_details").contains("cached_tokens") &&
            usage.at("prompt_tokens_details").at("cached_tokens").is_number()) {
          o.cached_tokens = usage.at("prompt_tokens_details").at("cached_tokens").get<int32_t>();
        }
      }
      if (!chunk.contains("choices") || !chunk.at("choices").is_array() ||
          chunk.at("choices").empty()) {
        continue;
      }
      const nlohmann::json& choice = chunk.at("choices").at(0);
      if (!choice.is_object()) continue;
      // A chunk may carry only ids (its text held back by the server): it still brings tokens.
      size_t ids = 0;
      if (choice.contains("token_ids") && choice.at("token_ids").is_array()) {
        for (const nlohmann::json& id : choice.at("token_ids")) {
          o.token_ids.push_back(id.get<int32_t>());
          ++ids;
        }
      }
      const bool has_text = choice.contains("text") && choice.at("text").is_string() &&
                            !choice.at("text").get<std::string>().empty();
      if (!has_text && ids == 0) continue;
      if (has_text) o.text += choice.at("text").get<std::string>();
      const auto now = Clock::now();
      if (chunks++ == 0) {
        o.ttft = std::chrono::duration<double>(now - t0).count();
      } else {
        o.gaps.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
    }
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    try {
      return receive(data, n);
    } catch (const std::exception& e) {  // an odd reply is this request's error, not a crash
      o.error = std::string("bad stream: ") + e.what();
      return false;
    }
  };
  auto res = client.send(req);
  o.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!res) {
    o.error = "connection failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    o.error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
  } else if (o.error.empty()) {
    o.output_tokens = usage_tokens >= 0 ? usage_tokens : chunks;
    o.ok = chunks > 0;
    if (!o.ok) o.error = "no tokens streamed";
  }
  return o;
}

// Figures over a set of outcomes (a run, or one turn of the multi-turn chats).
struct Summary {
  int32_t requests = 0, errors = 0;
  std::string first_error;
  std::vector<double> ttft, tpot, itl, e2e;  // ms
  int64_t out_tokens = 0, in_tokens = 0;
  // Prefix-cache hits: cached over prompt tokens of the requests whose reply said how many.
  int64_t cached_tokens = 0, cached_of = 0;

  void Add(const Outcome& o) {
    ++requests;
    if (!o.ok) {
      if (errors++ == 0) first_error = o.error;
      return;
    }
    ttft.push_back(o.ttft * 1e3);
    e2e.push_back(o.e2e * 1e3);
    if (o.output_tokens > 1) tpot.push_back((o.e2e - o.ttft) * 1e3 / (o.output_tokens - 1));
    for (double g : o.gaps) itl.push_back(g * 1e3);
    out_tokens += o.output_tokens;
    in_tokens += o.prompt_tokens;
    if (o.cached_tokens >= 0) {
      cached_tokens += o.cached_tokens;
      cached_of += o.prompt_tokens;
    }
  }
  // -1: no reply reported usage.prompt_tokens_details.cached_tokens (llama-server, say).
  double HitRate() const {
    return cached_of > 0 ? static_cast<double>(cached_tokens) / cached_of : -1.0;
  }
};

nlohmann::json Pct(const std::vector<double>& v) {
  return nlohmann::json{
      {"mean", v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size()},
      {"p50", Percentile(v, 50)},
      {"p90", Percentile(v, 90)},
      {"p99", Percentile(v, 99)}};
}

nlohmann::json TurnJson(const Summary& s) {
  return {{"requests", s.requests},           {"errors", s.errors},
          {"ttft_ms", Pct(s.ttft)},           {"prompt_tokens", s.in_tokens},
          {"cached_tokens", s.cached_tokens}, {"prefix_hit_rate", s.HitRate()}};
}

// RFC 9110's token characters: anything else in a header name would make a bad request.
bool IsHeaderName(const std::string& name) {
  static const std::string kSpecial = "!#$%&'*+-.^_`|~";
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || kSpecial.find(static_cast<char>(c)) != std::string::npos;
  });
}

// Options that only one workload uses are refused with the others: a flag that silently does
// nothing makes a benchmark that measures something else than its command line says.
bool CheckWorkloadOptions(const ServeBenchArgs& a) {
  const bool multi = a.workload == "multi-turn";
  if (a.Given("--prefixes") && a.workload != "shared-prefix") {
    std::fprintf(stderr,
                 "error: --prefixes is only used with --workload shared-prefix (here: %s)\n",
                 a.workload.c_str());
    return false;
  }
  for (const char* name : {"--conversations", "--turns", "--session-header"}) {
    if (a.Given(name) && !multi) {
      std::fprintf(stderr, "error: %s is only used with --workload multi-turn (here: %s)\n", name,
                   a.workload.c_str());
      return false;
    }
  }
  for (const char* name : {"--requests", "--concurrency", "--rate", "--length-sigma"}) {
    if (a.Given(name) && multi) {
      std::fprintf(stderr,
                   "error: %s is not used with --workload multi-turn: it sends --conversations "
                   "chats at once, --turns requests each, one after another\n",
                   name);
      return false;
    }
  }
  if (a.Given("--session-header") && !IsHeaderName(a.session_header)) {
    std::fprintf(stderr, "error: --session-header: '%s' is not an HTTP header name\n",
                 a.session_header.c_str());
    return false;
  }
  return true;
}

// The multi-turn workload: every chat's turns in order on a thread of its own. Turn t's prompt
// is turn t-1's prompt, then the ids of its reply, then a new user turn, so each turn starts
// with the whole previous one, token for token, and a prefix cache may hold all of it. The
// reply's ids come from the server (return_token_ids); a server that does not send them gets
// random ids of the reply's length in their place, which keeps the earlier turns reusable and
// costs the reply's own blocks (replies_with_token_ids says which happened).
std::vector<Outcome> RunMultiTurn(const ServeBenchArgs& a, const std::string& model,
                                  std::mt19937_64& rng,
                                  std::uniform_int_distribution<int32_t> token,
                                  int32_t* replies_with_ids) {
  const int32_t chats = a.conversations, turns = a.turns;
  std::vector<std::vector<std::vector<int32_t>>> users(chats);
  for (auto& chat : users) {
    for (int32_t t = 0; t < turns; ++t) {
      std::vector<int32_t>& u = chat.emplace_back(a.prompt_tokens);
      for (int32_t& id : u) id = token(rng);
    }
  }
  std::vector<Outcome> outcomes(static_cast<size_t>(chats) * turns);
  std::atomic<int32_t> with_ids{0};
  std::vector<std::thread> workers;
  for (int32_t c = 0; c < chats; ++c) {
    workers.emplace_back([&, c, token]() mutable {
      // The seed in the id: two runs with different seeds are different chats to a balancer.
      const std::string session = "chat-" + std::to_string(c) + "-seed-" + std::to_string(a.seed);
      std::mt19937_64 stand_in(a.seed + 1 + c);
      std::vector<int32_t> history;
      for (int32_t t = 0; t < turns; ++t) {
        history.insert(history.end(), users[c][t].begin(), users[c][t].end());
        Outcome o = RunOne(a, model, history, a.gen_tokens, session, /*want_ids=*/true);
        o.turn = t;
        if (o.ok && o.output_tokens > 0 &&
            o.token_ids.size() == static_cast<size_t>(o.output_tokens)) {
          history.insert(history.end(), o.token_ids.begin(), o.token_ids.end());
          ++with_ids;
        } else if (o.ok) {
          for (int32_t k = 0; k < o.output_tokens; ++k) history.push_back(token(stand_in));
        }
        outcomes[static_cast<size_t>(c) * turns + t] = std::move(o);
      }
    });
  }
  for (auto& w : workers) w.join();
  *replies_with_ids = with_ids;
  return outcomes;
}

int RunServeBench(const ServeBenchArgs& a) {
  if (!CheckWorkloadOptions(a)) return 1;
  const bool multi = a.workload == "multi-turn";
  // The served model: its id and vocabulary (for random prompt tokens) from /v1/models.
  httplib::Client probe(a.url);
  probe.set_connection_timeout(10, 0);
  httplib::Headers headers;
  if (!a.api_key.empty()) headers.emplace("Authorization", "Bearer " + a.api_key);
  auto models = probe.Get("/v1/models", headers);
  if (!models || models->status != 200) {
    std::fprintf(stderr, "error: %s/v1/models did not answer 200 (%s)\n", a.url.c_str(),
                 models ? std::to_string(models->status).c_str() : "no connection");
    return 1;
  }
  const nlohmann::json list = nlohmann::json::parse(models->body, nullptr, false);
  std::string model = a.model;
  int32_t n_vocab = 500;
  try {
    const nlohmann::json& first = list.at("data").at(0);
    if (model.empty() && first.at("id").is_string()) model = first.at("id");
    if (first.contains("meta")) n_vocab = first.at("meta").at("n_vocab").get<int32_t>();
  } catch (const std::exception&) {
    // No usable model list: send no model id and draw token ids below 500.
  }

  std::mt19937_64 rng(a.seed);
  std::uniform_int_distribution<int32_t> token(10, std::max(11, n_vocab - 1));
  std::lognormal_distribution<double> factor(0.0, a.sigma > 0 ? a.sigma : 1e-9);
  std::exponential_distribution<double> gap(a.rate > 0 ? a.rate : 1.0);
  struct Job {
    nlohmann::json prompt;  // token ids
    int32_t max_tokens;
    double start;  // seconds after the beginning
  };
  std::vector<Job> jobs;
  double t = 0;
  // The shared prefixes, drawn before anything else so that one prefix (the default) gives the
  // same prompts as before --prefixes existed; request i uses prefix i mod N, so more than
  // --requests prefixes would never be sent and are not made.
  const bool shared = a.workload == "shared-prefix";
  const bool warm = shared && a.prefixes == 1;  // one prefix: computed by a first request
  std::vector<std::vector<int32_t>> prefixes(shared ? std::min(a.prefixes, a.requests) : 0);
  for (std::vector<int32_t>& prefix : prefixes) {
    prefix.resize(a.prefix_tokens);
    for (int32_t& id : prefix) id = token(rng);
  }
  for (int32_t i = 0; i < a.requests && !multi; ++i) {
    const int32_t p =
        std::max<int32_t>(1, std::lround(a.prompt_tokens * (a.sigma > 0 ? factor(rng) : 1)));
    const int32_t g =
        std::max<int32_t>(1, std::lround(a.gen_tokens * (a.sigma > 0 ? factor(rng) : 1)));
    std::vector<int32_t> ids = shared ? prefixes[i % prefixes.size()] : std::vector<int32_t>{};
    for (int32_t k = 0; k < p; ++k) ids.push_back(token(rng));
    jobs.push_back(Job{ids, g, t});
    if (a.rate > 0) t += gap(rng);
  }

  std::vector<Outcome> outcomes(jobs.size());
  std::atomic<size_t> next{0};
  Outcome cold;
  if (warm && !jobs.empty()) {
    cold = RunOne(a, model, jobs[0].prompt, jobs[0].max_tokens);  // computes the shared prefix
    next = 1;
  }
  const auto t0 = Clock::now();
  int32_t replies_with_ids = 0;
  if (multi) {
    outcomes = RunMultiTurn(a, model, rng, token, &replies_with_ids);
  } else {
    std::vector<std::thread> workers;
    for (int32_t w = 0; w < std::min<int32_t>(a.concurrency, a.requests); ++w) {
      workers.emplace_back([&] {
        for (size_t i; (i = next++) < jobs.size();) {
          const auto due = t0 + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(jobs[i].start));
          std::this_thread::sleep_until(due);  // Poisson arrivals (no-op without --rate)
          outcomes[i] = RunOne(a, model, jobs[i].prompt, jobs[i].max_tokens);
        }
      });
    }
    for (auto& w : workers) w.join();
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (warm && !outcomes.empty()) outcomes.erase(outcomes.begin());

  Summary all;
  std::vector<Summary> per_turn(multi ? a.turns : 0);
  Summary later;  // multi-turn: turns 2 on, the ones a prefix cache can serve
  for (const Outcome& o : outcomes) {
    all.Add(o);
    if (!multi) continue;
    per_turn[o.turn].Add(o);
    if (o.turn > 0) later.Add(o);
  }
  int32_t errors = all.errors;
  const int32_t requests = multi ? a.conversations * a.turns : a.requests;
  const double hit_rate = all.HitRate();
  nlohmann::json j = {{"url", a.url},
                      {"model", model},
                      {"requests", requests},
                      {"concurrency", multi ? a.conversations : a.concurrency},
                      {"rate", a.rate},
                      {"prompt_tokens", a.prompt_tokens},
                      {"gen_tokens", a.gen_tokens},
                      {"length_sigma", a.sigma},
                      {"seed", a.seed},
                      {"wall_s", wall},
                      {"errors", errors},
                      {"output_tokens", all.out_tokens},
                      {"output_tps", all.out_tokens / wall},
                      {"total_tps", (all.out_tokens + all.in_tokens) / wall},
                      {"request_rate", (requests - errors) / wall},
                      {"ttft_ms", Pct(all.ttft)},
                      {"tpot_ms", Pct(all.tpot)},
                      {"itl_ms", Pct(all.itl)},
                      {"e2e_ms", Pct(all.e2e)},
                      // -1: the server reported no usage.prompt_tokens_details.cached_tokens
                      {"prefix_hit_rate", hit_rate},
                      {"cached_tokens", all.cached_tokens}};
  if (!all.first_error.empty()) j["first_error"] = all.first_error;
  j["workload"] = a.workload;
  if (a.workload == "shared-prefix") {
    j["prefix_tokens"] = a.prefix_tokens;
    j["prefixes"] = a.prefixes;
    if (warm) {
      j["ttft_cold_ms"] = cold.ok ? cold.ttft * 1e3 : -1.0;
      j["cold_over_warm_ttft"] =
          cold.ok && !all.ttft.empty() ? cold.ttft * 1e3 / Percentile(all.ttft, 50) : 0.0;
      if (!cold.ok) ++errors;
    }
  }
  if (multi) {
    j["conversations"] = a.conversations;
    j["turns"] = a.turns;
    j["session_header"] =
        a.session_header.empty() ? nlohmann::json() : nlohmann::json(a.session_header);
    j["replies_with_token_ids"] = replies_with_ids;
    nlohmann::json turns = nlohmann::json::array();
    for (size_t i = 0; i < per_turn.size(); ++i) {
      nlohmann::json turn = TurnJson(per_turn[i]);
      turn["turn"] = i + 1;
      turns.push_back(std::move(turn));
    }
    j["per_turn"] = std::move(turns);
    j["after_first_turn"] = TurnJson(later);
  }
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return errors == 0 ? 0 : 3;
  }
  if (multi) {
    std::printf(
        "%s: multi-turn, %d chats x %d turns (user turns of %d tokens, %d generated)%s: %.2f s, "
        "%d errors\n",
        a.url.c_str(), a.conversations, a.turns, a.prompt_tokens, a.gen_tokens,
        a.session_header.empty() ? "" : (", session header " + a.session_header).c_str(), wall,
        errors);
  } else {
    std::printf(
        "%s: %d requests (%d prompt + %d generated tokens%s), concurrency %d%s: %.2f s, "
        "%d errors\n",
        a.url.c_str(), requests, a.prompt_tokens, a.gen_tokens, a.sigma > 0 ? ", log-normal" : "",
        a.concurrency, a.rate > 0 ? (", Poisson " + std::to_string(a.rate) + " req/s").c_str() : "",
        wall, errors);
  }
  std::printf("output %.1f t/s, total %.1f t/s\n", all.out_tokens / wall,
              (all.out_tokens + all.in_tokens) / wall);
  std::printf("| ms | mean | p50 | p90 | p99 |\n|---|---|---|---|---|\n");
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", k, j[k]["mean"].get<double>(),
                j[k]["p50"].get<double>(), j[k]["p90"].get<double>(), j[k]["p99"].get<double>());
  }
  if (!all.first_error.empty()) std::printf("first error: %s\n", all.first_error.c_str());
  if (warm) {
    std::printf("shared prefix of %d tokens: cold TTFT %.1f ms, warm TTFT p50 %.1f ms (%.1fx)\n",
                a.prefix_tokens, j["ttft_cold_ms"].get<double>(), j["ttft_ms"]["p50"].get<double>(),
                j["cold_over_warm_ttft"].get<double>());
  } else if (shared) {
    std::printf("%d shared prefixes of %d tokens, in turn, not warmed: TTFT mean %.1f ms\n",
                a.prefixes, a.prefix_tokens, j["ttft_ms"]["mean"].get<double>());
  }
  if (multi) {
    std::printf(
        "\n| turn | prompt tokens | cached | hit rate | TTFT mean ms | p50 | p99 |\n"
        "|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < per_turn.size(); ++i) {
      const Summary& s = per_turn[i];
      const nlohmann::json p = Pct(s.ttft);
      std::printf("| %zu | %lld | %lld | %s | %.1f | %.1f | %.1f |\n", i + 1,
                  static_cast<long long>(s.in_tokens), static_cast<long long>(s.cached_tokens),
                  s.HitRate() >= 0 ? std::to_string(s.HitRate()).substr(0, 5).c_str() : "-",
                  p["mean"].get<double>(), p["p50"].get<double>(), p["p99"].get<double>());
    }
    std::printf("replies resent as the server's token ids: %d of %d\n", replies_with_ids, requests);
  }
  if (hit_rate >= 0) {
    std::printf("prefix cache: %lld of %lld prompt tokens cached (hit rate %.3f)\n",
                static_cast<long long>(all.cached_tokens), static_cast<long long>(all.cached_of),
                hit_rate);
  } else {
    std::printf("prefix cache: the server reported no cached_tokens\n");
  }
  return errors == 0 ? 0 : 3;
}

}  // namespace

Runner AddServeBenchCommand(CLI::App* bench) {
  auto a = std::make_shared<ServeBenchArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "serve", "Load generator for an OpenAI-compatible server: TTFT, TPOT, ITL, throughput");
  cmd->add_option("--url", a->url, "Server base URL")->capture_default_str();
  cmd->add_option("--api-key", a->api_key, "Bearer key, if the server wants one");
  cmd->add_option("--model", a->model, "Model id (default: the first of /v1/models)");
  cmd->add_option("--concurrency", a->concurrency, "Requests in flight at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--requests", a->requests, "Requests in all")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--rate", a->rate, "Poisson arrivals at this many requests/s (0: all at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--prompt-tokens", a->prompt_tokens,
                  "Prompt length (random token ids); multi-turn: each new user turn's")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen-tokens", a->gen_tokens, "Tokens generated per request (EOS ignored)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--length-sigma", a->sigma, "> 0: log-normal lengths around those medians")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3.0));
  cmd->add_option("-s,--seed", a->seed, "Workload seed")->capture_default_str();
  cmd->add_option("--workload", a->workload,
                  "random (the default: independent prompts, no reuse) | shared-prefix "
                  "(--prefixes prompts of --prefix-tokens, then --requests questions) | "
                  "multi-turn (--conversations chats at once x --turns turns, each turn "
                  "resending the whole history as token ids)")
      ->capture_default_str()
      ->check(CLI::IsMember({"random", "shared-prefix", "multi-turn"}));
  cmd->add_option("--prefix-tokens", a->prefix_tokens, "Shared prefix length (shared-prefix)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--prefixes", a->prefixes,
                  "Distinct shared prefixes, request i using prefix i mod N (shared-prefix); "
                  "1: warmed by a first request left out of the figures, more: none warmed")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--conversations", a->conversations, "Chats at once (multi-turn)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--turns", a->turns, "Turns per chat (multi-turn)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--session-header", a->session_header,
                  "Send 'NAME: <chat id>' with every request of a chat, for a load balancer "
                  "that hashes on it, e.g. X-Session-Id (multi-turn)");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  return [a, cmd]() -> int {
    if (!cmd->parsed()) return -1;
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->count() > 0) a->given.push_back(opt->get_name());
    }
    return RunServeBench(*a);
  };
}

}  // namespace kvs::cli
