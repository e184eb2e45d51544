#include "engine/engine_builder.h"

#include <utility>

namespace kvs {

EngineBuilder::EngineBuilder(const Model& model, const Tokenizer* tokenizer, ThreadPool& pool,
                             KvFormatOptions kv)
    : model_(model), tokenizer_(tokenizer), pool_(pool), kv_(std::move(kv)) {}

Expected<KvFormatPtr> EngineBuilder::Format(int32_t block_size, int32_t n_ctx) {
  if (format_ != nullptr && format_->block_size() == block_size && format_ctx_ == n_ctx) {
    return format_;
  }
  KvFormatOptions options = kv_;
  options.block_size = block_size;
  options.n_ctx = n_ctx;
  auto format = MakeKvFormat(model_, tokenizer_, pool_, options);
  if (format.ok()) {
    format_ = *format;
    format_ctx_ = n_ctx;
  }
  return format;
}

Expected<std::unique_ptr<ModelRunner>> EngineBuilder::Runner(const EngineConfig& config) {
  KVS_RETURN_IF_ERROR(config.Validate());
  auto format = Format(config.block_size, config.n_ctx);
  if (!format.ok()) return format.status();
  return std::make_unique<ModelRunner>(model_, pool_, *format, config.n_blocks);
}

Expected<LocalEngine> EngineBuilder::Local(const EngineConfig& config) {
  auto runner = Runner(config);
  if (!runner.ok()) return runner.status();
  LocalEngine local;
  local.runner = std::move(*runner);
  local.engine = std::make_unique<Engine>(config, *local.runner);
  return local;
}

Expected<std::unique_ptr<AsyncEngine>> EngineBuilder::Async(const EngineConfig& config) {
  auto runner = Runner(config);
  if (!runner.ok()) return runner.status();
  return std::make_unique<AsyncEngine>(config, std::move(*runner));
}

Expected<std::unique_ptr<SingleSequence>> EngineBuilder::Single(int32_t n_ctx) {
  if (n_ctx < 1) return Status::Error(StrFormat("context %d: must be positive", n_ctx));
  auto format = Format(kv_.block_size, n_ctx);
  if (!format.ok()) return format.status();
  return std::make_unique<SingleSequence>(model_, pool_, n_ctx, *format);
}

}  // namespace kvs
