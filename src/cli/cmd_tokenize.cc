#include <cstdio>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {

Runner AddTokenizeCommand(CLI::App& root) {
  struct Args {
    std::string model, text, file;
    bool no_bos = false;
    bool parse_special = false;
    bool pieces = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = root.add_subcommand("tokenize", "Print the token ids of a text");
  cmd->add_option("-m,--model", a->model, "GGUF model (or vocab-only) file");
  auto* p = cmd->add_option("-p,--prompt", a->text, "Text to tokenize");
  auto* f = cmd->add_option("-f,--file", a->file,
                            std::string("Read the text from a file (") + kInputFileHelp + ")");
  p->excludes(f);
  cmd->add_flag("--no-bos", a->no_bos, "Leave out the BOS token the model would add");
  cmd->add_flag("--parse-special", a->parse_special,
                "Map control tokens written in the text to their ids");
  cmd->add_flag("--show-pieces", a->pieces, "Print id:'piece' pairs, one per line");
  return [a]() -> int {
    std::string path = a->model;
    if (!ResolveModelPath(path)) return 1;
    std::string text = a->text;
    if (!a->file.empty() && !ReadTextFile(a->file, &text)) return 1;
    auto file = gguf::File::Open(path);
    if (!file) {
      std::fprintf(stderr, "error: %s\n", file.error().c_str());
      return 1;
    }
    auto tok = Tokenizer::FromGguf(**file);
    if (!tok) {
      std::fprintf(stderr, "error: %s: %s\n", path.c_str(), tok.error().c_str());
      return 1;
    }
    std::vector<int32_t> ids = (*tok)->Encode(text, !a->no_bos, a->parse_special);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (a->pieces) {
        std::printf("%d:'%s'\n", ids[i], (*tok)->TokenToPiece(ids[i], true).c_str());
      } else {
        std::printf("%s%d", i ? " " : "", ids[i]);
      }
    }
    if (!a->pieces) std::printf("\n");
    return 0;
  };
}

}  // namespace kvs::cli
