// `kvserve serve`: the OpenAI-compatible server. SIGINT/SIGTERM stop it cleanly (exit 0).
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "server/openai_server.h"

namespace kvs::cli {
namespace {

struct ServeArgs {
  std::string model;
  server::ServerOptions server;
  EngineFlags engine;
  double timeout_s = 60;    // --timeout: a request body, or a response making no progress
  double keep_alive_s = 5;  // --timeout-keep-alive: an idle connection between requests
};

int RunServe(ServeArgs a) {
  std::string path = a.model;
  if (!ResolveModelPath(path)) return 1;
  if (!ResolveKvMemory(&a.engine)) return 1;
  if (!ResolveSpecFlags(&a.engine)) return 1;
  // Signals are taken by sigwait below, never by a handler on a random thread; every thread
  // started from here on inherits the mask. A vanished client must not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  a.server.model_path = path;
  a.server.engine = a.engine.options;
  const auto ms = [](double s) {
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  };
  a.server.body_timeout = ms(a.timeout_s);
  a.server.write_timeout = ms(a.timeout_s);
  a.server.idle_timeout = ms(a.keep_alive_s);
  server::Server server(a.server);
  auto port = server.Listen();
  if (!port.ok()) {
    std::fprintf(stderr, "error: %s\n", port.error().c_str());
    return 1;
  }
  std::fprintf(stderr, "kvserve: listening on http://%s:%d (loading %s)\n", a.server.host.c_str(),
               *port, path.c_str());
  if (Status st = server.Load(); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    server.Stop();
    return 1;
  }
  const kvserve::EngineStats kv = server.stats();
  const kvserve::EngineOptions& eo = server.engine_options();
  // A model of several KV groups takes a block per group for the same positions: say what the
  // pool holds in full contexts, not blocks x positions.
  const int64_t per_context = std::max<int64_t>(1, server.blocks_per_context());
  std::fprintf(
      stderr,
      "kvserve: serving model '%s' (-np %d, -c %d); KV cache %.1f MiB of K %s / V %s: "
      "%d blocks of %d positions, %.1f full contexts of -c (%lld blocks each); Ctrl-C "
      "stops\n",
      server.model_id().c_str(), eo.n_parallel, eo.n_ctx, eo.kv_memory_bytes / double(1 << 20),
      eo.cache_type_k.c_str(), eo.cache_type_v.c_str(), kv.kv_blocks_total, kv.block_size,
      static_cast<double>(kv.kv_blocks_total) / per_context, static_cast<long long>(per_context));
  std::fprintf(stderr, "kvserve: KV format %s; weights digest %s\n", server.kv_format().c_str(),
               server.weights_digest().c_str());
  std::fprintf(stderr, "kvserve: kernels: %s\n", kvserve::CpuIsaDescription().c_str());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "kvserve: %s: stopping (running requests are cancelled)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.Stop();
  std::fprintf(stderr, "kvserve: stopped\n");
  return 0;
}

}  // namespace

Runner AddServeCommand(CLI::App& root) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = root.add_subcommand("serve", "OpenAI-compatible HTTP server");
  cmd->add_option("-m,--model", a->model,
                  "GGUF model file (default: $KVSERVE_MODEL or stories260K)");
  cmd->add_option("--host", a->server.host, "Address to bind (loopback unless told otherwise)")
      ->capture_default_str();
  cmd->add_option("--port", a->server.port, "Port")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option(
      "--chat-template", a->server.chat_template,
      "chatml (qwen), llama2, llama3, mistral, gemma or plain (default: from the GGUF)");
  cmd->add_option("--alias", a->server.alias, "Model id clients use (default: the file name)");
  cmd->add_option("--max-queue", a->server.max_queue,
                  "Requests waiting beyond -np before new ones get 503")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--timeout", a->timeout_s,
                  "Seconds a request body may take to arrive, and a response may go without "
                  "progress, before the connection is closed (a request head gets 10)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  cmd->add_option("--timeout-keep-alive", a->keep_alive_s,
                  "Seconds an idle connection is kept open between requests")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--max-connections", a->server.max_connections,
                  "Open connections at most; beyond, the stalest idle or unfinished one is closed")
      ->capture_default_str()
      ->check(CLI::Range(16, 1 << 20));
  cmd->add_flag("!--no-dashboard", a->server.dashboard,
                "Do not serve the live KV dashboard at GET /dashboard (its data, GET "
                "/v1/kv/state, stays)");
  AddEngineFlags(cmd, &a->engine, /*default_parallel=*/4);
  AddModelFlags(cmd, &a->server.model_options);
  return [a] { return RunServe(*a); };
}

}  // namespace kvs::cli
