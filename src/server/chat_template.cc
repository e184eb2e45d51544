#include "server/chat_template.h"

#include <algorithm>
#include <cctype>

namespace kvs::server {

const char* ChatFormatName(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kLlama2:
      return "llama2";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kMistral:
      return "mistral";
    case ChatFormat::kGemma:
      return "gemma";
    case ChatFormat::kPlain:
      return "plain";
  }
  return "plain";
}

Expected<ChatFormat> ChatFormatFromName(const std::string& name) {
  if (name == "chatml" || name == "qwen" || name == "qwen2" || name == "qwen3") {
    return ChatFormat::kChatML;
  }
  if (name == "llama2") return ChatFormat::kLlama2;
  if (name == "llama3") return ChatFormat::kLlama3;
  if (name == "mistral") return ChatFormat::kMistral;
  if (name == "gemma" || name == "gemma3") return ChatFormat::kGemma;
  if (name == "plain") return ChatFormat::kPlain;
  return Status::Error("--chat-template '" + name +
                       "': expected chatml (qwen), llama2, llama3, mistral, gemma or plain");
}

ChatFormat DetectChatFormat(const std::string& jinja) {
  auto has = [&](const char* s) { return jinja.find(s) != std::string::npos; };
  if (has("<|im_start|>")) return ChatFormat::kChatML;
  if (has("<|start_header_id|>")) return ChatFormat::kLlama3;
  if (has("[INST]") && has("<<SYS>>")) return ChatFormat::kLlama2;
  if (has("[INST]")) return ChatFormat::kMistral;
  if (has("<start_of_turn>")) return ChatFormat::kGemma;
  return ChatFormat::kPlain;
}

namespace {

// System messages folded into the first user message (formats without a system role).
std::vector<ChatMessage> FoldSystem(const std::vector<ChatMessage>& messages, const char* sep) {
  std::string system;
  std::vector<ChatMessage> out;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      system += (system.empty() ? "" : "\n") + m.content;
    } else {
      out.push_back(m);
    }
  }
  if (!system.empty()) {
    for (ChatMessage& m : out) {
      if (m.role == "user") {
        m.content = system + sep + m.content;
        return out;
      }
    }
    out.insert(out.begin(), ChatMessage{"user", system});
  }
  return out;
}

std::string Trim(const std::string& s) {
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

}  // namespace

RenderedChat RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages) {
  RenderedChat r;
  std::string& t = r.text;
  switch (format) {
    case ChatFormat::kChatML:
      for (const ChatMessage& m : messages) {
        t += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      t += "<|im_start|>assistant\n";
      break;
    case ChatFormat::kLlama3:
      t = "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        t += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      t += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::kLlama2:
    case ChatFormat::kMistral: {
      // Neither has a system role: Llama 2 wraps it in <<SYS>> inside the first [INST],
      // Mistral puts it before the first user message.
      const bool llama2 = format == ChatFormat::kLlama2;
      std::string system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") system += (system.empty() ? "" : "\n") + m.content;
      }
      std::vector<ChatMessage> turns = FoldSystem(messages, "\n\n");
      if (llama2 && !system.empty()) {
        for (ChatMessage& m : turns) {
          if (m.role == "user") {
            const size_t folded = std::min(m.content.size(), system.size() + 2);
            m.content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + m.content.substr(folded);
            break;
          }
        }
      }
      t = "<s>";
      for (const ChatMessage& m : turns) {
        if (m.role == "assistant") {
          t += llama2 ? " " + m.content + " </s><s>" : m.content + "</s>";
        } else {
          t += "[INST] " + m.content + " [/INST]";
        }
      }
      break;
    }
    case ChatFormat::kGemma: {
      // Gemma 3's template, as its Jinja reads: a first message of role system is no turn, its
      // text and a blank line open the first turn after it (whatever that turn's role); any
      // later system message is a turn of its own; the assistant is "model"; turns' contents
      // trimmed; BOS from the model.
      const bool system_first = !messages.empty() && messages[0].role == "system";
      const std::string prefix = system_first ? messages[0].content + "\n\n" : "";
      for (size_t i = system_first ? 1 : 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        const bool first = i == (system_first ? 1u : 0u);
        t += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n" +
             (first ? prefix : "") + Trim(m.content) + "<end_of_turn>\n";
      }
      t += "<start_of_turn>model\n";
      r.add_bos = true;
      break;
    }
    case ChatFormat::kPlain:
      // A documented fallback: role-labelled turns, the reply after "Assistant:".
      for (const ChatMessage& m : messages) {
        std::string role = m.role;
        if (!role.empty())
          role[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(role[0])));
        t += role + ": " + m.content + "\n";
      }
      t += "Assistant:";
      r.add_bos = true;
      break;
  }
  return r;
}

}  // namespace kvs::server
