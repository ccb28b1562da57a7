// Paged decode attention on CPU: one query token per sequence against its KV blocks.
//
// The cost follows each sequence's real context length: a (token, kv head) work item walks
// the token's block table up to its own context length; nothing is gathered, padded or masked.
// Two passes over the keys (scores, then softmax-weighted values) with float accumulators.
//
// q [T, H, D] (any stride on T and H, D contiguous); k_cache, v_cache [NB, BS, Hkv, D]
// contiguous; block_tables [T, MB] int64 (row t: the blocks of token t's sequence);
// context_lens [T] int64 (keys 0 .. context_len - 1 are attended); out [T, H, D] contiguous,
// written in place (a slice of the layer's output, so no copy follows).
//
// Options of the same kernel (0 turns each off): sliding_window W attends only the last W keys
// (context_len - W .. context_len - 1, the query's own key included, as transformers' sliding
// mask `kv > q - W`), so a windowed layer's cost stops growing with the context;
// softcap c maps each scaled score s to c * tanh(s / c) before the softmax (Gemma 2).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

// A K or V row as float32, in `buffer` when a conversion is needed. The bfloat16 conversion is
// a 16-bit shift written so that the compiler vectorises it (c10::BFloat16's own operator is
// scalar); built with -fno-strict-aliasing, as the uint32 view of the float buffer needs.
inline const float* as_float(const float* row, float*, int64_t) { return row; }

inline const float* as_float(const c10::BFloat16* row, float* buffer, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(row);
  uint32_t* out = reinterpret_cast<uint32_t*>(buffer);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
  return buffer;
}

template <typename scalar_t>  // float16 (and float64)
inline const float* as_float(const scalar_t* row, float* buffer, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(row[i]);
  return buffer;
}

template <typename scalar_t>
void paged_decode_attention_impl(torch::Tensor& out, const torch::Tensor& q,
                                 const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                 const torch::Tensor& block_tables,
                                 const torch::Tensor& context_lens, double scale,
                                 int64_t sliding_window, double softcap) {
  const int64_t num_tokens = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;  // query heads per KV head (GQA)
  const int64_t max_blocks = block_tables.size(1);
  const int64_t q_token_stride = q.stride(0), q_head_stride = q.stride(1);
  const int64_t kv_block_stride = k_cache.stride(0), kv_slot_stride = k_cache.stride(1);
  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const float fscale = static_cast<float>(scale);
  const float fsoftcap = static_cast<float>(softcap);

  // One work item per token, all heads together: a slot's K (or V) row holds every KV head
  // side by side, so walking the slots in order streams each block from memory once.
  const int64_t row_len = num_kv_heads * head_dim;
  // Tokens are handed out in small dynamic chunks rather than split evenly up front: on a
  // shared host one thread is often late, and the other then takes over its share.
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> query(num_heads * head_dim), acc(num_heads * head_dim), row(row_len);
    std::vector<float> scores, max_score(num_heads), sum(num_heads);
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < num_tokens; ++t) {
      const int64_t len = lens[t];
      const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
      const int64_t* table = tables + t * max_blocks;
      scores.resize((len - first) * num_heads);
      for (int64_t head = 0; head < num_heads; ++head) {
        const scalar_t* src = q_ptr + t * q_token_stride + head * q_head_stride;
        for (int64_t d = 0; d < head_dim; ++d) query[head * head_dim + d] = static_cast<float>(src[d]) * fscale;
      }
      std::fill(max_score.begin(), max_score.end(), -INFINITY);
      for (int64_t j = first; j < len; ++j) {
        const int64_t offset = table[j / block_size] * kv_block_stride + (j % block_size) * kv_slot_stride;
        const float* keys = as_float(k_ptr + offset, row.data(), row_len);
        for (int64_t head = 0; head < num_heads; ++head) {
          const float* qh = query.data() + head * head_dim;
          const float* key = keys + (head / group) * head_dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < head_dim; ++d) s += qh[d] * key[d];
          if (fsoftcap > 0.f) s = fsoftcap * std::tanh(s / fsoftcap);
          scores[(j - first) * num_heads + head] = s;
          max_score[head] = std::max(max_score[head], s);
        }
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int64_t j = first; j < len; ++j) {
        const int64_t offset = table[j / block_size] * kv_block_stride + (j % block_size) * kv_slot_stride;
        const float* values = as_float(v_ptr + offset, row.data(), row_len);
        for (int64_t head = 0; head < num_heads; ++head) {
          const float p = std::exp(scores[(j - first) * num_heads + head] - max_score[head]);
          sum[head] += p;
          float* ah = acc.data() + head * head_dim;
          const float* value = values + (head / group) * head_dim;
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) ah[d] += p * value[d];
        }
      }
      for (int64_t head = 0; head < num_heads; ++head) {
        const float inv = 1.f / sum[head];
        scalar_t* dst = out_ptr + (t * num_heads + head) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<scalar_t>(acc[head * head_dim + d] * inv);
      }
    }
  }
}

void paged_decode_attention(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                     const torch::Tensor& context_lens, double scale,
                                 int64_t sliding_window, double softcap) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [T, H, D] with D contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "KV caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "block tables and context lengths must be int64");
  TORCH_CHECK(block_tables.is_contiguous() && context_lens.is_contiguous());
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "out must be a contiguous tensor shaped and typed like q");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_attention", [&] {
    paged_decode_attention_impl<scalar_t>(out, q, k_cache, v_cache, block_tables, context_lens, scale,
                                          sliding_window, softcap);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention,
        "decode attention over paged KV blocks, cost per sequence = its context length (or window)",
        pybind11::arg("out"), pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("block_tables"), pybind11::arg("context_lens"), pybind11::arg("scale"),
        pybind11::arg("sliding_window") = 0, pybind11::arg("softcap") = 0.0);
}
