// A step's K/V write and its paged decode attention on CPU, in one call per layer.
//
// First this step's K/V rows are stored at their cache slots (what index_copy_ by the slot
// mapping did, without its two dispatches); then each decode token (one query token per
// sequence, the first rows of the step) attends its KV blocks. The cost follows each
// sequence's real context length: a token walks its block table up to its own context length;
// nothing is gathered, padded or masked. Rows past the step's real tokens (shape padding) get
// zeros, so the caller's output needs no fill of its own.
//
// q [T, H, D] and k, v [T, Hkv, D] (any stride on T and H, D contiguous); k_cache, v_cache
// [NB, BS, Hkv, D] contiguous; slot_mapping [T] int64 (rows 0 .. num_write - 1 are stored);
// block_tables [N, MB] int64 (row t: the blocks of decode token t's sequence); context_lens [N]
// int64 (keys 0 .. context_len - 1 are attended, the token's own just written among them);
// out [T, H, D] contiguous: rows 0 .. N - 1 written with the attention, rows num_write .. T - 1
// with zeros, the prefill rows between left to the caller.
//
// Options (0 turns each off): sliding_window W attends only the last W keys (context_len - W ..
// context_len - 1, the query's own key included, as transformers' sliding mask `kv > q - W`),
// so a windowed layer's cost stops growing with the context; softcap c maps each scaled score s
// to c * tanh(s / c) before the softmax (Gemma 2).
//
// Short contexts (tens of keys: small models, short requests) are where the fixed costs per
// token showed, so: scratch buffers live per thread across calls, keys are walked block by
// block (no division per key), where the CPU has AVX-512 or AVX2 and head_dim is a multiple of
// the lanes (16 or 8) each query head's dot products and output accumulators stay in registers
// (bfloat16 and float16 widened in them; long contexts walk each key once for all heads
// instead, kByKeyBytes), the softmax's exponentials run vectorised (simd_math.h's polynomial exp), and a step too
// small to share runs on the calling thread without an OpenMP region (micro-llama's worker has
// one thread, where the region was pure overhead; with several threads a small step would pay
// the fork and join for microseconds of work). Measured on a 2-vCPU AMD EPYC (avx512), one
// thread, load ~5, 256 decodes of 16 keys each, micro-llama's 2 heads x 64, keys in cache:
// 280-317 -> 80 us per layer in float32 (the K/V write included), 369-437 -> 92-100 us in
// bfloat16 (two runs each, alternating).
//
// Over 300 lines: one kernel, with its generic loops (any CPU, any head_dim) beside the vector
// ones that must give the same result; tests/models/test_decode_kernel.py checks both.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd_math.h"
#include "spin_pool.h"

namespace {

// Past this many bytes of one sequence's keys and values (a layer's), a token walks its keys
// once for all heads (scores_by_key, values_by_key) rather than once per query head: the
// per-head walks re-read every key row once per head, cheap while the rows stay in L2, not past
// it. Measured in bfloat16 on a 2-vCPU AMD EPYC (2 threads, Qwen3-0.6B's 16 query and 8 KV
// heads of 128), per layer, per-head -> by-key walks: 256 x 24 keys (96 KiB a sequence) 2.44 ->
// 2.69 ms, 128 x 64 keys (256 KiB) 2.88 -> 1.56, 64 x 517 keys 12.56 -> 7.32 (18.5 GB/s of KV).
constexpr int64_t kByKeyBytes = 128 << 10;

// Below this many multiply-adds (keys x query heads x head_dim) a step runs on one thread.
constexpr int64_t kParallelWork = 1 << 18;

using stepserve::exp_nonpositive;
using stepserve::to_float;

// The vector path (AVX-512, or AVX2 with FMA and F16C; head_dim a multiple of the lanes): one
// query head at a time against its keys, its partial dot products and its output accumulators
// in registers. The generic loops below reduce each dot product through memory lane by lane
// and keep the accumulators in memory, which was most of a short context's time.
#if defined(__AVX512F__)
#define STEPSERVE_SIMD 1
struct Simd {
  static constexpr int kLanes = 16;
  using Reg = __m512;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load(const c10::BFloat16* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static Reg load(const c10::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg load(const double*) { return zero(); }  // never called: float64 is not vectorised
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static float sum(Reg x) { return _mm512_reduce_add_ps(x); }
};
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define STEPSERVE_SIMD 1
struct Simd {
  static constexpr int kLanes = 8;
  using Reg = __m256;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load(const c10::BFloat16* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static Reg load(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Reg load(const double*) { return zero(); }  // never called: float64 is not vectorised
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  static float sum(Reg x) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    __m128 odd = _mm_movehdup_ps(half);
    half = _mm_add_ps(half, odd);
    return _mm_cvtss_f32(_mm_add_ss(half, _mm_movehl_ps(odd, half)));
  }
};
#endif

#ifdef STEPSERVE_SIMD
template <typename scalar_t>
constexpr bool kVectorised = !std::is_same_v<scalar_t, double>;
constexpr int kLanes = Simd::kLanes;
#else
template <typename scalar_t>
constexpr bool kVectorised = false;
constexpr int kLanes = 1;
#endif

struct Scratch {  // one per thread, grown as needed, kept across calls
  std::vector<float> query, acc, scores, sum;  // acc: the generic path's
};

template <typename scalar_t>
struct DecodeStep {
  const scalar_t* q;
  const scalar_t* k_cache;
  const scalar_t* v_cache;
  scalar_t* out;
  const int64_t* tables;
  const int64_t* lens;
  int64_t num_heads, head_dim, num_kv_heads, group, block_size, max_blocks;
  int64_t q_token_stride, q_head_stride, kv_block_stride, kv_slot_stride;
  float scale, softcap;
  int64_t sliding_window;

  // Token t's attention over its keys [first, len) into out's row t, for its query heads
  // [h0, h0 + heads): a whole number of KV heads' groups.
  void attend(int64_t t, int64_t h0, int64_t heads, Scratch& s) const {
    const int64_t len = lens[t];
    const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
    const int64_t n = len - first;
    const int64_t* table = tables + t * max_blocks;
    s.query.resize(heads * head_dim);
    s.scores.resize(n * heads);  // [head - h0][key]
    s.sum.resize(heads);
    float* query = s.query.data();
    float* scores = s.scores.data();
    for (int64_t head = 0; head < heads; ++head) {
      const scalar_t* src = q + t * q_token_stride + (h0 + head) * q_head_stride;
      float* dst = query + head * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) dst[d] = to_float(src[d]) * scale;
    }
    const bool vectorised = kVectorised<scalar_t> && head_dim % kLanes == 0;
    const bool by_key = vectorised && n * (heads / group) * head_dim * 2 * int64_t(sizeof(scalar_t)) > kByKeyBytes;
    if (by_key)
      scores_by_key(table, first, len, h0, heads, query, scores);
    else if (vectorised)
      scores_simd(table, first, len, h0, heads, query, scores);
    else
      scores_generic(table, first, len, h0, heads, query, scores);
    for (int64_t head = 0; head < heads; ++head) {
      float* row = scores + head * n;
      if (softcap > 0.f)
        for (int64_t j = 0; j < n; ++j) row[j] = softcap * std::tanh(row[j] / softcap);
      float max_score = -INFINITY;
      for (int64_t j = 0; j < n; ++j) max_score = std::max(max_score, row[j]);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < n; ++j) {
        row[j] = exp_nonpositive(row[j] - max_score);
        sum += row[j];
      }
      s.sum[head] = sum;
    }
    if (by_key)
      values_by_key(t, table, first, len, h0, heads, scores, s);
    else if (vectorised)
      values_simd(t, table, first, len, h0, heads, scores, s);
    else
      values_generic(t, table, first, len, h0, heads, scores, s);
  }

  void scores_generic(const int64_t* table, int64_t first, int64_t len, int64_t h0, int64_t heads, const float* query,
                      float* scores) const {
    const int64_t n = len - first;
    for_each_key(table, first, len, k_cache, [&](int64_t j, const scalar_t* keys) {
      for (int64_t head = 0; head < heads; ++head) {
        const float* qh = query + head * head_dim;
        const scalar_t* key = keys + ((h0 + head) / group) * head_dim;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * to_float(key[d]);
        scores[head * n + j] = dot;
      }
    });
  }

  void values_generic(int64_t t, const int64_t* table, int64_t first, int64_t len, int64_t h0, int64_t heads,
                      const float* probs, Scratch& s) const {
    const int64_t n = len - first;
    s.acc.assign(heads * head_dim, 0.f);
    float* acc = s.acc.data();
    for_each_key(table, first, len, v_cache, [&](int64_t j, const scalar_t* values) {
      for (int64_t head = 0; head < heads; ++head) {
        const float p = probs[head * n + j];
        float* ah = acc + head * head_dim;
        const scalar_t* value = values + ((h0 + head) / group) * head_dim;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) ah[d] += p * to_float(value[d]);
      }
    });
    for (int64_t head = 0; head < heads; ++head) {
      const float inv = 1.f / s.sum[head];
      scalar_t* dst = out + (t * num_heads + h0 + head) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<scalar_t>(acc[head * head_dim + d] * inv);
    }
  }

#ifdef STEPSERVE_SIMD
  void scores_simd(const int64_t* table, int64_t first, int64_t len, int64_t h0, int64_t heads, const float* query,
                      float* scores) const {
    const int64_t n = len - first;
    for (int64_t head = 0; head < heads; ++head) {
      const float* qh = query + head * head_dim;
      const int64_t kv_offset = ((h0 + head) / group) * head_dim;
      float* row = scores + head * n;
      for_each_key(table, first, len, k_cache, [&](int64_t j, const scalar_t* keys) {
        const scalar_t* key = keys + kv_offset;
        Simd::Reg dot = Simd::mul(Simd::load(qh), Simd::load(key));
        for (int64_t d = kLanes; d < head_dim; d += kLanes) dot = Simd::fmadd(Simd::load(qh + d), Simd::load(key + d), dot);
        row[j] = Simd::sum(dot);
      });
    }
  }

  // Up to 4 registers of one head's output lanes per walk over the values.
  template <int kVectors>
  void accumulate_simd(const int64_t* table, int64_t first, int64_t len, int64_t offset, const float* probs,
                       float inv, scalar_t* dst) const {
    Simd::Reg acc[kVectors];
    for (int v = 0; v < kVectors; ++v) acc[v] = Simd::zero();
    for_each_key(table, first, len, v_cache, [&](int64_t j, const scalar_t* values) {
      const Simd::Reg p = Simd::set1(probs[j]);
      for (int v = 0; v < kVectors; ++v) acc[v] = Simd::fmadd(p, Simd::load(values + offset + kLanes * v), acc[v]);
    });
    float lanes[kLanes * kVectors];
    for (int v = 0; v < kVectors; ++v) Simd::store(lanes + kLanes * v, Simd::mul(acc[v], Simd::set1(inv)));
    for (int i = 0; i < kLanes * kVectors; ++i) dst[i] = static_cast<scalar_t>(lanes[i]);
  }

  void values_simd(int64_t t, const int64_t* table, int64_t first, int64_t len, int64_t h0, int64_t heads,
                      const float* probs, Scratch& s) const {
    const int64_t n = len - first;
    for (int64_t head = 0; head < heads; ++head) {
      const float inv = 1.f / s.sum[head];
      scalar_t* dst = out + (t * num_heads + h0 + head) * head_dim;
      const int64_t offset = ((h0 + head) / group) * head_dim;
      for (int64_t d = 0; d < head_dim; d += 4 * kLanes) {
        const float* p = probs + head * n;
        switch (std::min<int64_t>(4, (head_dim - d) / kLanes)) {
          case 4: accumulate_simd<4>(table, first, len, offset + d, p, inv, dst + d); break;
          case 3: accumulate_simd<3>(table, first, len, offset + d, p, inv, dst + d); break;
          case 2: accumulate_simd<2>(table, first, len, offset + d, p, inv, dst + d); break;
          default: accumulate_simd<1>(table, first, len, offset + d, p, inv, dst + d); break;
        }
      }
    }
  }
  // Long contexts: every key's row read once, for all query heads in turn (a row of K or V
  // stays in L1 across the heads), the output accumulators in memory (L1).
  void scores_by_key(const int64_t* table, int64_t first, int64_t len, int64_t h0, int64_t heads, const float* query,
                     float* scores) const {
    const int64_t n = len - first;
    for_each_key(table, first, len, k_cache, [&](int64_t j, const scalar_t* keys) {
      for (int64_t head = 0; head < heads; ++head) {
        const float* qh = query + head * head_dim;
        const scalar_t* key = keys + ((h0 + head) / group) * head_dim;
        Simd::Reg dot = Simd::mul(Simd::load(qh), Simd::load(key));
        for (int64_t d = kLanes; d < head_dim; d += kLanes) dot = Simd::fmadd(Simd::load(qh + d), Simd::load(key + d), dot);
        scores[head * n + j] = Simd::sum(dot);
      }
    });
  }

  void values_by_key(int64_t t, const int64_t* table, int64_t first, int64_t len, int64_t h0, int64_t heads,
                     const float* probs, Scratch& s) const {
    const int64_t n = len - first;
    s.acc.assign(heads * head_dim, 0.f);
    float* acc = s.acc.data();
    for_each_key(table, first, len, v_cache, [&](int64_t j, const scalar_t* values) {
      for (int64_t head = 0; head < heads; ++head) {
        const Simd::Reg p = Simd::set1(probs[head * n + j]);
        const scalar_t* value = values + ((h0 + head) / group) * head_dim;
        float* ah = acc + head * head_dim;
        for (int64_t d = 0; d < head_dim; d += kLanes) Simd::store(ah + d, Simd::fmadd(p, Simd::load(value + d), Simd::load(ah + d)));
      }
    });
    for (int64_t head = 0; head < heads; ++head) {
      const Simd::Reg inv = Simd::set1(1.f / s.sum[head]);
      scalar_t* dst = out + (t * num_heads + h0 + head) * head_dim;
      float lanes[kLanes];
      for (int64_t d = 0; d < head_dim; d += kLanes) {
        Simd::store(lanes, Simd::mul(Simd::load(acc + head * head_dim + d), inv));
        for (int i = 0; i < kLanes; ++i) dst[d + i] = static_cast<scalar_t>(lanes[i]);
      }
    }
  }
#else
  void scores_simd(const int64_t*, int64_t, int64_t, int64_t, int64_t, const float*, float*) const {}
  void values_simd(int64_t, const int64_t*, int64_t, int64_t, int64_t, int64_t, const float*, Scratch&) const {}
  void scores_by_key(const int64_t*, int64_t, int64_t, int64_t, int64_t, const float*, float*) const {}
  void values_by_key(int64_t, const int64_t*, int64_t, int64_t, int64_t, int64_t, const float*, Scratch&) const {}
#endif

  // fn(j - first, row) for keys j in [first, len), walking whole blocks.
  template <typename Fn>
  void for_each_key(const int64_t* table, int64_t first, int64_t len, const scalar_t* cache, Fn&& fn) const {
    int64_t j = first;
    while (j < len) {
      const int64_t block = j / block_size;
      const int64_t end = std::min(len, (block + 1) * block_size);
      const scalar_t* row = cache + table[block] * kv_block_stride + (j - block * block_size) * kv_slot_stride;
      for (; j < end; ++j, row += kv_slot_stride) fn(j - first, row);
    }
  }
};

thread_local Scratch scratch;

template <typename scalar_t>
void write_rows(const torch::Tensor& src, scalar_t* cache, const int64_t* slots, int64_t num_rows,
                int64_t num_slots) {
  const int64_t heads = src.size(1), head_dim = src.size(2);
  const int64_t token_stride = src.stride(0), head_stride = src.stride(1);
  const scalar_t* ptr = src.data_ptr<scalar_t>();
  for (int64_t t = 0; t < num_rows; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "KV slot ", slots[t], " out of range");
    scalar_t* dst = cache + slots[t] * heads * head_dim;
    for (int64_t head = 0; head < heads; ++head)
      std::memcpy(dst + head * head_dim, ptr + t * token_stride + head * head_stride, head_dim * sizeof(scalar_t));
  }
}

template <typename scalar_t>
void write_kv_and_decode_impl(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, torch::Tensor& k_cache, torch::Tensor& v_cache,
                              const torch::Tensor& slot_mapping, int64_t num_write,
                              const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                              double scale, int64_t sliding_window, double softcap) {
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  write_rows<scalar_t>(k, k_cache.data_ptr<scalar_t>(), slots, num_write, num_slots);
  write_rows<scalar_t>(v, v_cache.data_ptr<scalar_t>(), slots, num_write, num_slots);
  const int64_t row_width = q.size(1) * q.size(2);
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  std::fill(out_ptr + num_write * row_width, out_ptr + out.size(0) * row_width, static_cast<scalar_t>(0));

  DecodeStep<scalar_t> step{
      q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(), out_ptr,
      block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(),
      q.size(1), q.size(2), k_cache.size(2), q.size(1) / k_cache.size(2), k_cache.size(1), block_tables.size(1),
      q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
      static_cast<float>(scale), static_cast<float>(softcap), sliding_window};
  const int64_t num_decode = context_lens.size(0);
  int64_t keys = 0;
  for (int64_t t = 0; t < num_decode; ++t)
    keys += sliding_window > 0 ? std::min(step.lens[t], sliding_window) : step.lens[t];
  const int threads = at::get_num_threads();
  if (threads == 1 || keys * row_width < kParallelWork) {
    for (int64_t t = 0; t < num_decode; ++t) step.attend(t, 0, step.num_heads, scratch);
    return;
  }
  // Work goes out in small chunks from a shared counter rather than split evenly up front: on a
  // shared host one thread is often late, and the others then take over its share. A step of
  // fewer tokens than twice the threads (one user's: one token) splits each token's KV heads,
  // with their query heads, into parts, so that every thread has a share. The threads are the
  // step kernels' own (spin_pool.h), as the linear layers' between which this runs.
  const int64_t kv_heads = step.num_kv_heads;
  const int64_t parts = num_decode >= 2 * threads ? 1 : std::min(kv_heads, (2 * threads + num_decode - 1) / num_decode);
  const int64_t kv_heads_per_part = (kv_heads + parts - 1) / parts;
  const int64_t items = num_decode * parts, chunk = parts == 1 ? 4 : 1;
  std::atomic<int64_t> next{0};
  stepserve::SpinPool::instance().run(threads, [&](int) {
    for (int64_t start; (start = next.fetch_add(chunk, std::memory_order_relaxed)) < items;) {
      for (int64_t item = start; item < std::min(items, start + chunk); ++item) {
        const int64_t first_kv = item % parts * kv_heads_per_part;
        const int64_t num_kv = std::min(kv_heads, first_kv + kv_heads_per_part) - first_kv;
        if (num_kv > 0) step.attend(item / parts, first_kv * step.group, num_kv * step.group, scratch);
      }
    }
  });
}

void write_kv_and_decode(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k,
                         const torch::Tensor& v, torch::Tensor& k_cache, torch::Tensor& v_cache,
                         const torch::Tensor& slot_mapping, int64_t num_write,
                         const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                         double scale, int64_t sliding_window, double softcap) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [T, H, D] with D contiguous");
  TORCH_CHECK(k.dim() == 3 && v.dim() == 3 && k.stride(2) == 1 && v.stride(2) == 1,
              "k and v must be [T, Hkv, D] with D contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "KV caches must be contiguous");
  TORCH_CHECK(k.sizes().slice(1) == k_cache.sizes().slice(2) && v.sizes() == k.sizes(),
              "k and v rows must be shaped like a cache slot");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype && k_cache.scalar_type() == dtype &&
              v_cache.scalar_type() == dtype, "q, k, v and the caches must share one dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && block_tables.scalar_type() == at::kLong &&
              context_lens.scalar_type() == at::kLong, "slots, block tables and context lengths must be int64");
  TORCH_CHECK(slot_mapping.is_contiguous() && block_tables.is_contiguous() && context_lens.is_contiguous());
  TORCH_CHECK(num_write >= 0 && num_write <= k.size(0) && num_write <= slot_mapping.size(0) &&
              k.size(0) == q.size(0), "num_write rows must exist in k, v and slot_mapping");
  TORCH_CHECK(context_lens.size(0) <= num_write && block_tables.size(0) == context_lens.size(0),
              "decode tokens are the first of the written rows");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes() && out.scalar_type() == dtype,
              "out must be a contiguous tensor shaped and typed like q");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "write_kv_and_decode", [&] {
    write_kv_and_decode_impl<scalar_t>(out, q, k, v, k_cache, v_cache, slot_mapping, num_write, block_tables,
                                       context_lens, scale, sliding_window, softcap);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("write_kv_and_decode", &write_kv_and_decode,
        "store a step's K/V rows at their slots, then decode attention over paged KV blocks "
        "(cost per sequence = its context length, or window)",
        pybind11::arg("out"), pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("k_cache"),
        pybind11::arg("v_cache"), pybind11::arg("slot_mapping"), pybind11::arg("num_write"),
        pybind11::arg("block_tables"), pybind11::arg("context_lens"), pybind11::arg("scale"),
        pybind11::arg("sliding_window") = 0, pybind11::arg("softcap") = 0.0);
}
