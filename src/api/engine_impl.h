// The state behind kvserve::Model and kvserve::Engine, shared by the API's source files
// (kvserve.cc: requests and stats; kv_documents_api.cc: KV documents).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/token_dispatcher.h"
#include "core/thread_pool.h"
#include "engine/async_engine.h"
#include "kv/kv_documents.h"
#include "kv/zmq_event_publisher.h"
#include "kvserve/kvserve.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

struct Model::Impl {
  std::unique_ptr<kvs::Model> model;
  std::unique_ptr<kvs::Tokenizer> tokenizer;
};

struct Engine::Impl {
  std::shared_ptr<const Model> model;
  EngineOptions options;
  std::unique_ptr<kvs::ThreadPool> pool;
  kvs::KvFormatPtr kv_format;
  std::vector<int32_t> end_of_generation;  // the model's end-of-generation tokens, found once
  // Before the engine: it publishes into this until it is gone (with --kv-events).
  std::unique_ptr<kvs::ZmqKvEventPublisher> events;
  // The engine's tiers' names, in its order: before the dispatcher, which reads them until it
  // is gone.
  std::vector<std::string> tier_labels;
  // Before the engine too: the engine's callbacks queue into it until the engine is gone.
  std::unique_ptr<TokenDispatcher> dispatcher;
  std::unique_ptr<kvs::AsyncEngine> engine;
  std::unique_ptr<kvs::KvDocuments> documents;  // with --kv-disk
  std::mutex saving_mu;
  std::map<std::string, std::pair<int32_t, int32_t>> saving;  // name -> (on disk, blocks)
};

kvs::RequestOptions ToRequestOptions(const GenerationOptions& g, const kvs::Digest128& weights,
                                     const kvs::KvFormat& format,
                                     const std::vector<int32_t>& end_of_generation);

}  // namespace kvserve
