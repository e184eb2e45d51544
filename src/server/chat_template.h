// Chat templates: the prompt formats of the model families we serve, picked from the GGUF's
// tokenizer.chat_template (a Jinja text we recognise by its markers, not execute) or by name
// (--chat-template). A model without a template gets the plain format below.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace kvs::server {

enum class ChatFormat { kChatML, kLlama2, kLlama3, kMistral, kGemma, kPlain };

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

const char* ChatFormatName(ChatFormat format);
// "chatml" (also "qwen"), "llama2", "llama3", "mistral", "gemma", "plain".
Expected<ChatFormat> ChatFormatFromName(const std::string& name);
// The family a Jinja chat template belongs to; kPlain when it is empty or unrecognised.
ChatFormat DetectChatFormat(const std::string& jinja);

// The prompt text for the messages, ending where the assistant's reply starts. Special tokens
// are written as text (e.g. "<|im_start|>", "<s>") for the tokenizer to parse; the formats
// that need BOS write it themselves, except kGemma and kPlain, whose texts want the model's BOS
// added (add_bos).
struct RenderedChat {
  std::string text;
  bool add_bos = false;
};
RenderedChat RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages);

}  // namespace kvs::server
