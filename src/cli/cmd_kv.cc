// `kvserve kv save|ls|rm`: KV documents on a disk tier directory (issue #20). `save` prefills a
// file's tokens into --kv-disk DIR and pins its blocks; a server started on the same directory,
// model and KV types then loads them for any prompt that starts with that text. `ls` and `rm`
// read and edit the directory's records without a model (a running server keeps the pins it
// read at start until it restarts).
#include <sys/stat.h>

#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "kv/block_store.h"
#include "kv/kv_documents.h"
#include "kvserve/kvserve.h"

namespace kvs::cli {
namespace {

struct KvArgs {
  std::string model, file, prompt, dir, name, cache_salt;
  bool json = false;
  EngineFlags engine;
  kvserve::ModelOptions model_options;
};

bool StoredBlock(const std::string& dir, const BlockHash& h) {
  struct stat st;
  const std::string path = dir + "/" + BlockHashHex(h) + ".kvb";
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

int RunSave(KvArgs a) {
  if (a.dir.empty()) {
    std::fprintf(stderr, "error: kv save needs --kv-disk DIR\n");
    return 1;
  }
  if (auto st = ValidateDocumentName(a.name); !st.ok()) {
    std::fprintf(stderr, "error: --name: %s\n", st.message().c_str());
    return 1;
  }
  if (a.file.empty() == a.prompt.empty()) {
    std::fprintf(stderr, "error: kv save needs the document: -f FILE or -p TEXT (one of them)\n");
    return 1;
  }
  std::string text = a.prompt;
  if (!a.file.empty() && !ReadTextFile(a.file, &text)) return 1;
  std::string path = a.model;
  if (!ResolveModelPath(path)) return 1;
  if (!ResolveKvMemory(&a.engine)) return 1;
  std::string error;
  auto model = kvserve::Model::Load(path, a.model_options, &error);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  std::vector<int32_t> tokens = model->Tokenize(text, /*add_special=*/true);
  kvserve::EngineOptions o = a.engine.options;
  o.kv_disk = a.dir;
  o.n_parallel = 1;
  if (o.n_ctx == 0) o.n_ctx = model->n_ctx_train();
  // As the server answers a longer document with 400: a document is a prompt of this context,
  // the one the engine that loads it runs with.
  if (static_cast<int64_t>(tokens.size()) + 1 > o.n_ctx) {
    std::fprintf(stderr,
                 "error: the document has %zu tokens and the context (-c) holds %d (the prompt "
                 "and one token): raise -c, as the server that loads it must run with\n",
                 tokens.size(), o.n_ctx);
    return 1;
  }
  auto engine = kvserve::Engine::Start(model, o, &error);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  std::fprintf(stderr, "kv save: %s: %zu tokens into %s\n", a.name.c_str(), tokens.size(),
               a.dir.c_str());
  kvserve::KvDocumentInfo info;
  const bool ok = engine->SaveKvDocument(
      a.name, std::move(tokens), a.cache_salt, &info, &error, [](int32_t done, int32_t total) {
        std::fprintf(stderr, "\rkv save: %d/%d blocks on disk", done, total);
      });
  std::fprintf(stderr, "\n");
  if (!ok) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  const kvserve::EngineStats s = engine->stats();
  const int64_t written = s.tier("disk") ? s.tier("disk")->bytes_written : 0;
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"name", info.name},
                                       {"tokens", info.tokens},
                                       {"blocks", info.blocks},
                                       {"blocks_on_disk", info.blocks_on_disk},
                                       {"bytes_written", written},
                                       {"model", info.model}}
                            .dump()
                            .c_str());
  } else {
    std::printf("saved %s: %d tokens, %d blocks on disk (%.1f KiB written)\n", info.name.c_str(),
                info.tokens, info.blocks_on_disk, written / 1024.0);
  }
  return 0;
}

int RunList(const KvArgs& a) {
  auto docs = KvDocuments::Open(a.dir, /*create=*/false);
  if (!docs.ok()) {
    std::fprintf(stderr, "error: %s\n", docs.error().c_str());
    return 1;
  }
  nlohmann::json list = nlohmann::json::array();
  if (!a.json)
    std::printf("%-32s %8s %7s %8s  %s\n", "NAME", "TOKENS", "BLOCKS", "ON DISK", "MODEL");
  for (const KvDocument& d : (*docs)->List()) {
    int32_t on_disk = 0;
    for (const BlockHash& h : d.blocks) on_disk += StoredBlock(a.dir, h) ? 1 : 0;
    if (a.json) {
      list.push_back({{"name", d.name},
                      {"tokens", d.n_tokens},
                      {"blocks", d.blocks.size()},
                      {"blocks_on_disk", on_disk},
                      {"model", d.model},
                      {"kv_format", d.kv_format},
                      {"created", d.created}});
    } else {
      std::printf("%-32s %8d %7zu %8d  %.16s\n", d.name.c_str(), d.n_tokens, d.blocks.size(),
                  on_disk, d.model.c_str());
    }
  }
  if (a.json) std::printf("%s\n", list.dump().c_str());
  return 0;
}

int RunRemove(const KvArgs& a) {
  auto docs = KvDocuments::Open(a.dir, /*create=*/false);
  if (!docs.ok()) {
    std::fprintf(stderr, "error: %s\n", docs.error().c_str());
    return 1;
  }
  auto unpinned = (*docs)->Remove(a.name);
  if (!unpinned.ok()) {
    std::fprintf(stderr, "error: %s\n", unpinned.error().c_str());
    return 1;
  }
  std::fprintf(stderr,
               "removed %s: its blocks stay on disk, now evictable (a running server unpins them "
               "at restart)\n",
               a.name.c_str());
  return 0;
}

}  // namespace

Runner AddKvCommand(CLI::App& root) {
  auto a = std::make_shared<KvArgs>();
  CLI::App* kv = root.add_subcommand(
      "kv", "KV documents on a disk tier (save, ls, rm) and the tiers' codecs (codec-bench)");
  kv->require_subcommand(1);
  CLI::App* save = kv->add_subcommand(
      "save",
      "Prefill a document into --kv-disk DIR and pin its blocks, so that prompts "
      "starting with it load its KV instead of recomputing it");
  save->add_option("-m,--model", a->model,
                   "GGUF model file (default: $KVSERVE_MODEL or stories260K)");
  save->add_option("-f,--file", a->file, std::string("The document's text: ") + kInputFileHelp);
  save->add_option("-p,--prompt", a->prompt, "The document's text, given inline");
  save->add_option("--name", a->name, "The document's name ([A-Za-z0-9._-], at most 128)")
      ->required();
  save->add_option("--cache-salt", a->cache_salt,
                   "Salt the blocks as requests with this cache_salt are (only they hit it)");
  save->add_flag("--json", a->json, "Print the result as JSON on stdout");
  AddEngineFlags(save, &a->engine, /*default_parallel=*/1);
  AddModelFlags(save, &a->model_options);
  save->get_option("--kv-disk")->required();
  CLI::App* ls = kv->add_subcommand("ls", "List the KV documents of --kv-disk DIR");
  ls->add_option("--kv-disk", a->dir, "The disk tier's directory")->required();
  ls->add_flag("--json", a->json, "Print the list as JSON on stdout");
  CLI::App* rm = kv->add_subcommand("rm", "Remove a KV document (its blocks become evictable)");
  rm->add_option("--kv-disk", a->dir, "The disk tier's directory")->required();
  rm->add_option("--name", a->name, "The document's name")->required();
  Runner codec_bench = AddKvCodecBenchCommand(kv);
  return [a, save, ls, rm, codec_bench]() {
    if (const int rc = codec_bench(); rc != -1) return rc;
    if (save->parsed()) {
      KvArgs args = *a;
      args.dir = args.engine.options.kv_disk;
      return RunSave(std::move(args));
    }
    if (ls->parsed()) return RunList(*a);
    if (rm->parsed()) return RunRemove(*a);
    return 2;
  };
}

}  // namespace kvs::cli
