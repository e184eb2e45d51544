#include "model/compressed_view.h"

#include <string>
#include <vector>

#include "core/digest.h"
#include "core/page_memory.h"
#include "kernels/repack.h"
#include "tensor/quantize.h"

namespace kvs {
namespace {

// Each re-quantized matrix starts on a cache line of the view's buffer, as the kernels' loads
// of a row group then never straddle two lines more than they must.
constexpr size_t kMatrixAlign = 64;

bool Quantizable(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kQ8_0 ||
         t == DType::kQ4_0;
}

// Whether the view re-quantizes m to t: only when t is smaller per row (else the copy would
// cost memory and bandwidth and gain nothing, and re-quantizing Q4_K to Q8_0 would only add
// error) and m's rows hold whole blocks of t.
bool Requantizes(const MatrixView& m, DType t) {
  if (m.cols % Info(t).block_elems != 0) return false;
  return RowBytes(t, static_cast<size_t>(m.cols)) < m.row_bytes;
}

struct Job {
  MatrixView* m;  // in the view's weights: base's on entry, the re-quantized one after
  DType type;
  size_t offset;  // into the view's buffer
};

// Re-quantizes job.m's rows into dst and interleaves them when the kernels allow. Rows are
// split over the pool in groups of 16, and each thread interleaves its own groups: a group is
// interleaved on its own, so a slice of whole groups is a matrix InterleaveRows can take.
void Requantize(const Job& job, uint8_t* dst, ThreadPool& pool) {
  const MatrixView src = *job.m;
  MatrixView out;
  out.type = job.type;
  out.data = dst;
  out.rows = src.rows;
  out.cols = src.cols;
  out.row_bytes = RowBytes(job.type, static_cast<size_t>(src.cols));
  out.layout = WeightLayout::kRows;
  const bool interleave = CanInterleave(out);
  pool.ParallelFor(static_cast<size_t>(src.rows), kInterleaveRows, [&](int, size_t b, size_t e) {
    if (b == e) return;
    std::vector<float> row(static_cast<size_t>(src.cols));
    for (size_t r = b; r < e; ++r) {
      ReadRow(src, static_cast<int64_t>(r), row.data());
      QuantizeRow(out.type, row.data(), dst + r * out.row_bytes, out.cols);
    }
    if (interleave) {
      MatrixView slice = out;
      slice.data = dst + b * out.row_bytes;
      slice.rows = static_cast<int64_t>(e - b);
      InterleaveRows(&slice, dst + b * out.row_bytes);
    }
  });
  if (interleave) out.layout = WeightLayout::kInterleaved16;
  *job.m = out;
}

}  // namespace

Expected<std::unique_ptr<Model>> MakeCompressedView(const Model& base,
                                                    const CompressedViewOptions& options,
                                                    ThreadPool& pool) {
  const DType type = options.type;
  const DType output_type = options.output_type.value_or(type);
  const DType gate_up_type = options.ffn_gate_up_type.value_or(type);
  for (DType t : {type, output_type, gate_up_type}) {
    if (!Quantizable(t)) {
      return Status::Error(
          StrFormat("a compressed view cannot hold %s matrices: use q8_0, q4_0, f16, bf16 or f32",
                    std::string(DTypeName(t)).c_str()));
    }
  }
  std::unique_ptr<Model> view(new Model());
  view->config_ = base.config_;
  view->weights_ = base.weights_;  // views of base's matrices, copies of its vectors
  view->weights_digest_ = DigestBuilder()
                              .Text("kvserve compressed view")
                              .Add(base.weights_digest_)
                              .Int(static_cast<int64_t>(type))
                              .Int(static_cast<int64_t>(output_type))
                              .Int(static_cast<int64_t>(gate_up_type))
                              .Finish();

  // The token embedding stays shared: decode reads one row of it per token, so its type hardly
  // changes a step's bytes, while a copy would cost n_vocab rows of memory and an exact
  // embedding keeps the draft closer to the target. A tied output matrix is thus untied when it
  // is re-quantized (the output, n_vocab rows read in full every step, is what matters).
  ModelWeights& w = view->weights_;
  std::vector<Job> jobs;
  size_t total = 0;
  auto add = [&](MatrixView* m, DType t) {
    if (!Requantizes(*m, t)) return;
    jobs.push_back({m, t, total});
    const size_t bytes = RowBytes(t, static_cast<size_t>(m->cols)) * static_cast<size_t>(m->rows);
    total += (bytes + kMatrixAlign - 1) / kMatrixAlign * kMatrixAlign;
  };
  add(&w.output, output_type);
  for (LayerWeights& L : w.layers) {
    for (MatrixView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_down}) add(m, type);
    for (MatrixView* m : {&L.w_gate, &L.w_up}) add(m, gate_up_type);
  }
  if (total == 0) return view;  // nothing gets smaller: every matrix is base's

  // Huge pages, as for the weights a model reads into memory (ModelLoadOptions::mode): decode
  // streams every matrix once per step, and 4 KiB pages cap that bandwidth.
  KVS_ASSIGN_OR_RETURN(PageMemory buffer, AllocatePages(total, PageSize::kHuge));
  for (const Job& job : jobs) Requantize(job, buffer.data() + job.offset, pool);
  view->owned_.push_back(std::move(buffer));
  return view;
}

Expected<DType> ParseDraftWeightsType(std::string_view name) {
  const std::optional<DType> t = ParseDType(name);
  if (!t || (*t != DType::kQ8_0 && *t != DType::kQ4_0 && *t != DType::kF16)) {
    return Status::Error(
        StrFormat("--draft-weights: unknown type '%.*s': expected q8_0, q4_0 or f16",
                  static_cast<int>(name.size()), name.data()));
  }
  return *t;
}

Expected<CompressedViewOptions> ParseDraftWeights(std::string_view text) {
  const std::string_view all = text;
  CompressedViewOptions o;
  bool first = true;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view part = text.substr(0, comma);
    std::optional<DType>* slot = nullptr;
    std::string_view value = part;
    if (!first) {
      const size_t eq = part.find('=');
      const std::string_view key = part.substr(0, eq);
      if (eq == std::string_view::npos || (key != "ffn" && key != "output")) {
        return Status::Error(StrFormat(
            "--draft-weights '%.*s': expected TYPE[,ffn=TYPE][,output=TYPE], e.g. q8_0,ffn=q4_0",
            static_cast<int>(all.size()), all.data()));
      }
      slot = key == "ffn" ? &o.ffn_gate_up_type : &o.output_type;
      value = part.substr(eq + 1);
    }
    KVS_ASSIGN_OR_RETURN(const DType t, ParseDraftWeightsType(value));
    if (first) {
      o.type = t;
    } else {
      *slot = t;
    }
    first = false;
    if (comma == std::string_view::npos) break;
    text = text.substr(comma + 1);
  }
  return o;
}

std::string DescribeCompressedView(const CompressedViewOptions& o) {
  std::string s(DTypeName(o.type));
  if (o.ffn_gate_up_type) s += ",ffn=" + std::string(DTypeName(*o.ffn_gate_up_type));
  if (o.output_type) s += ",output=" + std::string(DTypeName(*o.output_type));
  return s;
}

// Measured top-1 agreement with the target (ratio of positions where the draft's argmax is the
// target's, the acceptance self-speculation can hope for): a Q8_0 copy of an F16 model agrees
// ~94% of the time, a Q4_0 copy only ~46%, which would waste most drafted tokens; hence Q8_0 for
// float targets. (Over 32 greedy positions of the random-weight llama-1b F16, measured with
// compressed_view_test's DISABLED_BenchTopOneAgreement: Q8_0 29/32, Q4_0 15/32.) A target already
// at 8.5 bits or less per weight gains nothing from Q8_0 (the view would share every matrix), so
// Q4_0 is the only cheaper draft; its matrices that Q4_0 would not make smaller (Q4_0, Q4_K ones)
// stay shared. A Q4_0 target thus gets a view that is the target itself (owned_bytes() == 0): the
// caller can tell and not speculate.
DType DefaultDraftWeightsType(const Model& target) {
  double bytes = 0, values = 0;
  for (const LayerWeights& L : target.weights().layers) {
    for (const MatrixView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      bytes += static_cast<double>(m->row_bytes) * static_cast<double>(m->rows);
      values += static_cast<double>(m->cols) * static_cast<double>(m->rows);
    }
  }
  const double q8_0_bits = 8.0 * Info(DType::kQ8_0).block_bytes / Info(DType::kQ8_0).block_elems;
  return values > 0 && 8.0 * bytes / values > q8_0_bits ? DType::kQ8_0 : DType::kQ4_0;
}

}  // namespace kvs
