// kvserve: one binary, subcommands (generate, tokenize, inspect, perplexity, ...).
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/log.h"
#include "kernels/cpu_isa.h"

int main(int argc, char** argv) {
  CLI::App app{"kvserve: an LLM inference engine built around the KV cache", "kvserve"};
  app.require_subcommand(1);
  // Later flags override earlier ones (scripts pass defaults, users append their own).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // The version line names the instruction-set level the kernels run at (KVSERVE_ISA or the
  // CPU's best); a KVSERVE_ISA this CPU cannot honour is an error before anything else.
  if (kvs::Status isa = kvs::CheckIsaEnvironment(); !isa.ok()) {
    std::fprintf(stderr, "error: %s\n", isa.message().c_str());
    return 2;
  }
  app.set_version_flag("--version", "kvserve 0.1.0 (kernels: " + kvs::IsaDescription() + ")");
  std::vector<std::pair<CLI::App*, kvs::cli::Runner>> commands;
  auto add = [&](kvs::cli::Runner r) {
    commands.emplace_back(app.get_subcommands({}).back(), std::move(r));
  };
  add(kvs::cli::AddServeCommand(app));
  add(kvs::cli::AddGenerateCommand(app));
  add(kvs::cli::AddTokenizeCommand(app));
  add(kvs::cli::AddInspectCommand(app));
  add(kvs::cli::AddPerplexityCommand(app));
  add(kvs::cli::AddBenchCommand(app));
  add(kvs::cli::AddKvCommand(app));
  // llama.cpp spells some flags with several letters after one dash ("-np", "-ctk"); CLI11
  // takes one-letter short names only. (CLI11 takes the argument vector in reverse order.)
  const std::pair<std::string, std::string> spellings[] = {{"-np", "--parallel"},
                                                           {"-ctk", "--cache-type-k"},
                                                           {"-ctv", "--cache-type-v"},
                                                           {"-md", "--model-draft"}};
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {
    std::string arg = argv[i];
    for (const auto& [short_name, long_name] : spellings) {
      if (arg == short_name) {
        arg = long_name;
      } else if (arg.rfind(short_name + "=", 0) == 0) {
        arg = long_name + arg.substr(short_name.size());
      }
    }
    args.push_back(arg);
  }
  // Progress of long setup work (key calibration) is logged at info level, to stderr.
  kvs::SetLogLevel(kvs::LogLevel::kInfo);
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Commands report their errors themselves; what escapes them (memory exhausted under a limit,
  // a thread that cannot start) still ends in one line and exit 1, not std::terminate.
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "error: out of memory (a memory limit such as ulimit -v, or too little "
                 "RAM for this model and these options)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
