// Prefill attention on CPU for bfloat16 where the CPU has AVX512-BF16: flash-style causal
// attention of a step's prefill tokens over their paged KV blocks, both products on the CPU's
// bfloat16 dot-product instruction (vdpbf16ps: 32 multiply-adds into 16 float32 lanes).
//
// It runs after the step's K/V rows were stored (paged_decode_attention.cpp's call), so a
// prefill reads all its keys from the cache: this step's own and, for a chunk that resumes or a
// prompt after a cached prefix, the earlier ones, through the sequence's block table. Query i of
// sequence s sits at position num_computed[s] + i and attends keys 0 .. that position (the last
// W of them with a sliding window W; scores soft-capped as c * tanh(s / c) with softcap c).
//
// q [T, H, D] bfloat16 (the step's prefill tokens, any stride on T and H, D contiguous and even);
// k_cache, v_cache [NB, BS, Hkv, D] contiguous; block_tables [S, MB], query_starts [S + 1]
// (sequence s's tokens are rows query_starts[s] .. query_starts[s + 1] - 1 of q and out),
// num_computed [S], all int64; out [T, H, D] contiguous.
//
// Why: torch's SDPA (its CPU flash kernel, float32 multiply-adds) ran Qwen3-0.6B's prefill (16
// prompts of 512 tokens, 16 query heads over 8 KV heads of 128) at 231-248 ms a layer on a
// 2-vCPU AMD EPYC with avx512_bf16 and no AMX: 27% of the prefill step. Here a work item is one
// KV head of one sequence and a block of kQueryTokens of its queries (times the heads sharing
// that KV head); it walks its keys kKeys at a time, laid out once per block for the instruction
// (K: key j's d-pairs in lane j; V: key pairs interleaved per d), keeps each row's running
// maximum, sum and float32 output (the softmax online, nothing of size queries x keys held),
// and rounds the probabilities to bfloat16 for the second product, as transformers' bfloat16
// attention rounds them before multiplying by V. Items are spread over the threads dynamically
// (a later block of queries sees more keys). Blocks of 32 keys rather than 16 (two registers of
// scores a row) halve the per-block costs of each row (its maximum and sum reduced across the
// lanes, its accumulator loaded, stored and rescaled) and give the scores 8 independent sums:
// 16 x 512 went from 129 to 100 ms a layer and 4 x 2,048 from 426 to 309 (16-token prompts, which
// fill half a block, from 11.3 to 12.4).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd_math.h"

namespace {

#if defined(__AVX512BF16__)
constexpr int64_t kKeys = 32;           // keys per block: two registers of float32 scores
constexpr int64_t kQueryTokens = 128;   // query tokens of one work item
constexpr int64_t kMaxHeadDim = 256;    // output accumulators of 2 rows: 2 x 16 registers
const __m512i kIota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
const __m512i kIotaHigh = _mm512_add_epi32(kIota, _mm512_set1_epi32(16));

struct Scratch {  // one per thread, grown as needed, kept across calls
  std::vector<float> acc, max_score, sum, probs;
  std::vector<uint32_t> keys, values;  // a key block in the instruction's layout
  std::vector<uint16_t> probs_bf16;
};

thread_local Scratch scratch;

inline uint16_t bf16_bits(float x) {  // round to nearest even, as torch rounds (and vcvtneps2bf16)
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

struct PrefillStep {
  const uint16_t* q;
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  uint16_t* out;
  const int64_t* tables;
  const int64_t* query_starts;
  const int64_t* computed;
  int64_t num_heads, num_kv_heads, group, head_dim, block_size, max_blocks;
  int64_t q_token_stride, q_head_stride, kv_block_stride, kv_slot_stride;
  float scale, softcap;
  int64_t window;

  const uint16_t* query_row(int64_t row0, int64_t kv_head, int64_t row) const {
    return q + (row0 + row / group) * q_token_stride + (kv_head * group + row % group) * q_head_stride;
  }

  // Query tokens [first_token, end_token) of sequence seq, the query heads of KV head kv_head;
  // rows are token-major: row = token * group + g.
  void run(int64_t seq, int64_t kv_head, int64_t first_token, int64_t end_token, Scratch& s) const {
    const int64_t tokens = end_token - first_token, rows = tokens * group;
    const int64_t row0 = query_starts[seq] + first_token;  // its first row of q and out
    const int64_t pos0 = computed[seq] + first_token;      // the position of its first query
    s.acc.assign(rows * head_dim, 0.f);
    s.max_score.assign(rows, -INFINITY);
    s.sum.assign(rows, 0.f);
    s.probs.resize(rows * kKeys);
    s.probs_bf16.resize(rows * kKeys);
    s.keys.resize(head_dim / 2 * kKeys);
    s.values.resize(kKeys / 2 * head_dim);
    const int64_t last_pos = pos0 + tokens - 1;
    int64_t first_key = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
    first_key -= first_key % kKeys;
    const int64_t* table = tables + seq * max_blocks;
    for (int64_t key0 = first_key; key0 <= last_pos; key0 += kKeys) {
      const int64_t num_keys = std::min(kKeys, last_pos + 1 - key0);
      load_keys(table, kv_head, key0, num_keys, s);
      // rows before the block's first key see none of it: start at the first that does
      const int64_t first_row = std::max<int64_t>(0, key0 - pos0) * group;
      scores(row0, kv_head, first_row, rows, s);
      for (int64_t row = first_row; row < rows; ++row) softmax_block(row, pos0 + row / group, key0, num_keys, s);
      accumulate(first_row, rows, num_keys, s);
    }
    for (int64_t row = 0; row < rows; ++row) {
      const float inv = 1.f / s.sum[row];
      const float* acc = s.acc.data() + row * head_dim;
      uint16_t* dst = out + ((row0 + row / group) * num_heads + kv_head * group + row % group) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) dst[d] = bf16_bits(acc[d] * inv);
    }
  }

  // Keys key0 .. key0 + num_keys - 1 (zeros past them): keys[i][j] = key j's d-pair i (two
  // bfloat16 in 32 bits), values[p][d] = (key 2p's d, key 2p + 1's d).
  void load_keys(const int64_t* table, int64_t kv_head, int64_t key0, int64_t num_keys, Scratch& s) const {
    uint32_t* keys = s.keys.data();
    uint32_t* values = s.values.data();
    const int64_t pairs = head_dim / 2;
    const uint16_t* v_rows[kKeys];
    for (int64_t j = 0; j < kKeys; ++j) {
      if (j >= num_keys) {
        for (int64_t i = 0; i < pairs; ++i) keys[i * kKeys + j] = 0;
        v_rows[j] = nullptr;
        continue;
      }
      const int64_t key = key0 + j;
      const int64_t offset = table[key / block_size] * kv_block_stride + (key % block_size) * kv_slot_stride +
                             kv_head * head_dim;
      uint32_t k_pairs[kMaxHeadDim / 2];
      std::memcpy(k_pairs, k_cache + offset, head_dim * sizeof(uint16_t));
      for (int64_t i = 0; i < pairs; ++i) keys[i * kKeys + j] = k_pairs[i];
      v_rows[j] = v_cache + offset;
    }
    for (int64_t p = 0; p < kKeys / 2; ++p) {
      const uint16_t* even = v_rows[2 * p];
      const uint16_t* odd = v_rows[2 * p + 1];
      uint32_t* dst = values + p * head_dim;
      if (even == nullptr) {
        std::fill(dst, dst + head_dim, 0u);
      } else if (odd == nullptr) {
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = even[d];
      } else {
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = uint32_t(even[d]) | (uint32_t(odd[d]) << 16);
      }
    }
  }

  // Raw scores of rows [first_row, rows) against the block, 4 rows at a time (each pair of
  // key registers loaded once for the 4: 8 independent sums hide the instruction's latency),
  // into probs.
  void scores(int64_t row0, int64_t kv_head, int64_t first_row, int64_t rows, Scratch& s) const {
    const __m512i* keys = reinterpret_cast<const __m512i*>(s.keys.data());
    const int64_t pairs = head_dim / 2;
    int64_t row = first_row;
    for (; row + 4 <= rows; row += 4) {
      const uint16_t* q0 = query_row(row0, kv_head, row);
      const uint16_t* q1 = query_row(row0, kv_head, row + 1);
      const uint16_t* q2 = query_row(row0, kv_head, row + 2);
      const uint16_t* q3 = query_row(row0, kv_head, row + 3);
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      for (int64_t i = 0; i < pairs; ++i) {
        const __m512bh lo = (__m512bh)_mm512_loadu_si512(keys + 2 * i);
        const __m512bh hi = (__m512bh)_mm512_loadu_si512(keys + 2 * i + 1);
        int32_t p0, p1, p2, p3;
        std::memcpy(&p0, q0 + 2 * i, 4);
        std::memcpy(&p1, q1 + 2 * i, 4);
        std::memcpy(&p2, q2 + 2 * i, 4);
        std::memcpy(&p3, q3 + 2 * i, 4);
        const __m512bh x0 = (__m512bh)_mm512_set1_epi32(p0), x1 = (__m512bh)_mm512_set1_epi32(p1);
        const __m512bh x2 = (__m512bh)_mm512_set1_epi32(p2), x3 = (__m512bh)_mm512_set1_epi32(p3);
        a0 = _mm512_dpbf16_ps(a0, lo, x0);
        b0 = _mm512_dpbf16_ps(b0, hi, x0);
        a1 = _mm512_dpbf16_ps(a1, lo, x1);
        b1 = _mm512_dpbf16_ps(b1, hi, x1);
        a2 = _mm512_dpbf16_ps(a2, lo, x2);
        b2 = _mm512_dpbf16_ps(b2, hi, x2);
        a3 = _mm512_dpbf16_ps(a3, lo, x3);
        b3 = _mm512_dpbf16_ps(b3, hi, x3);
      }
      float* dst = s.probs.data() + row * kKeys;
      _mm512_storeu_ps(dst, a0);
      _mm512_storeu_ps(dst + 16, b0);
      _mm512_storeu_ps(dst + kKeys, a1);
      _mm512_storeu_ps(dst + kKeys + 16, b1);
      _mm512_storeu_ps(dst + 2 * kKeys, a2);
      _mm512_storeu_ps(dst + 2 * kKeys + 16, b2);
      _mm512_storeu_ps(dst + 3 * kKeys, a3);
      _mm512_storeu_ps(dst + 3 * kKeys + 16, b3);
    }
    for (; row < rows; ++row) {
      const uint16_t* qr = query_row(row0, kv_head, row);
      __m512 a = _mm512_setzero_ps(), b = a;
      for (int64_t i = 0; i < pairs; ++i) {
        int32_t pair;
        std::memcpy(&pair, qr + 2 * i, 4);
        const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(keys + 2 * i), x);
        b = _mm512_dpbf16_ps(b, (__m512bh)_mm512_loadu_si512(keys + 2 * i + 1), x);
      }
      _mm512_storeu_ps(s.probs.data() + row * kKeys, a);
      _mm512_storeu_ps(s.probs.data() + row * kKeys + 16, b);
    }
  }

  // One row's online softmax over the block: its scores become probabilities (0 where masked,
  // as bfloat16), its running maximum and sum move on, and its accumulator is rescaled where the
  // maximum rose. The 32 keys in two registers.
  void softmax_block(int64_t row, int64_t pos, int64_t key0, int64_t num_keys, Scratch& s) const {
    const __mmask16 allowed_lo = allowed_keys(kIota, pos, key0, num_keys);
    const __mmask16 allowed_hi = allowed_keys(kIotaHigh, pos, key0, num_keys);
    uint16_t* probs = s.probs_bf16.data() + row * kKeys;
    if ((allowed_lo | allowed_hi) == 0) {  // the row sees none of these keys
      _mm512_storeu_si512(probs, _mm512_setzero_si512());
      return;
    }
    float* raw = s.probs.data() + row * kKeys;
    __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(raw), _mm512_set1_ps(scale));
    __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(raw + 16), _mm512_set1_ps(scale));
    if (softcap > 0.f) {
      _mm512_storeu_ps(raw, lo);
      _mm512_storeu_ps(raw + 16, hi);
      for (int64_t j = 0; j < kKeys; ++j) raw[j] = softcap * std::tanh(raw[j] / softcap);
      lo = _mm512_loadu_ps(raw);
      hi = _mm512_loadu_ps(raw + 16);
    }
    const __m512 lowest = _mm512_set1_ps(-INFINITY);
    float& running_max = s.max_score[row];
    const float new_max = std::max(running_max, _mm512_reduce_max_ps(_mm512_max_ps(
        _mm512_mask_mov_ps(lowest, allowed_lo, lo), _mm512_mask_mov_ps(lowest, allowed_hi, hi))));
    const __m512 shift = _mm512_set1_ps(new_max);
    const __m256bh rounded_lo = _mm512_cvtneps_pbh(
        _mm512_maskz_mov_ps(allowed_lo, exp_nonpositive(_mm512_sub_ps(lo, shift))));
    const __m256bh rounded_hi = _mm512_cvtneps_pbh(
        _mm512_maskz_mov_ps(allowed_hi, exp_nonpositive(_mm512_sub_ps(hi, shift))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs), (__m256i)rounded_lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs + 16), (__m256i)rounded_hi);
    // the sum of the weights V is multiplied by: the rounded ones
    const float block_sum = _mm512_reduce_add_ps(_mm512_add_ps(widen(rounded_lo), widen(rounded_hi)));
    if (new_max > running_max && running_max != -INFINITY) {
      const float rescale = stepserve::exp_nonpositive(running_max - new_max);
      s.sum[row] *= rescale;
      float* acc = s.acc.data() + row * head_dim;
      const __m512 factor = _mm512_set1_ps(rescale);
      for (int64_t d = 0; d < head_dim; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), factor));
    }
    running_max = new_max;
    s.sum[row] += block_sum;
  }

  // Which of 16 keys (key0 + lanes) the query at pos sees: in the block, causal, in its window.
  __mmask16 allowed_keys(__m512i lanes, int64_t pos, int64_t key0, int64_t num_keys) const {
    const int64_t lo = window > 0 ? pos - window + 1 : 0;
    const __m512i keys = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(key0)), lanes);
    return _mm512_cmplt_epi32_mask(lanes, _mm512_set1_epi32(static_cast<int32_t>(num_keys))) &
           _mm512_cmple_epi32_mask(keys, _mm512_set1_epi32(static_cast<int32_t>(pos))) &
           _mm512_cmpge_epi32_mask(keys, _mm512_set1_epi32(static_cast<int32_t>(lo)));
  }

  static __m512 widen(__m256bh x) {  // bfloat16 -> float32: the 16 bits moved up
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)x), 16));
  }

  // exp(x) for x <= 0 in 16 lanes: simd_math.h's polynomial, vectorised by hand.
  static __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
    const __m512i two_n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
  }

  // acc[row] += probs[row] x V for rows [first_row, rows), 2 rows at a time (each register of
  // values loaded once for the 2, their outputs in registers across the block's keys).
  void accumulate(int64_t first_row, int64_t rows, int64_t num_keys, Scratch& s) const {
    const int64_t vectors = head_dim / 16, key_pairs = (num_keys + 1) / 2;
    const __m512i* values = reinterpret_cast<const __m512i*>(s.values.data());
    for (int64_t row = first_row; row < rows; row += 2) {
      const bool two = row + 1 < rows;
      float* o0 = s.acc.data() + row * head_dim;
      float* o1 = two ? o0 + head_dim : o0;
      const uint16_t* p0 = s.probs_bf16.data() + row * kKeys;
      const uint16_t* p1 = two ? p0 + kKeys : p0;
      __m512 acc0[kMaxHeadDim / 16], acc1[kMaxHeadDim / 16];
      for (int64_t v = 0; v < vectors; ++v) {
        acc0[v] = _mm512_loadu_ps(o0 + 16 * v);
        acc1[v] = _mm512_loadu_ps(o1 + 16 * v);
      }
      for (int64_t p = 0; p < key_pairs; ++p) {
        int32_t w0, w1;
        std::memcpy(&w0, p0 + 2 * p, 4);
        std::memcpy(&w1, p1 + 2 * p, 4);
        const __m512bh b0 = (__m512bh)_mm512_set1_epi32(w0), b1 = (__m512bh)_mm512_set1_epi32(w1);
        const __m512i* pair_values = values + p * vectors;
        for (int64_t v = 0; v < vectors; ++v) {
          const __m512bh x = (__m512bh)_mm512_loadu_si512(pair_values + v);
          acc0[v] = _mm512_dpbf16_ps(acc0[v], x, b0);
          acc1[v] = _mm512_dpbf16_ps(acc1[v], x, b1);
        }
      }
      for (int64_t v = 0; v < vectors; ++v) {
        _mm512_storeu_ps(o0 + 16 * v, acc0[v]);
        if (two) _mm512_storeu_ps(o1 + 16 * v, acc1[v]);
      }
    }
  }
};

void prefill_attention_impl(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k_cache,
                            const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                            const torch::Tensor& query_starts, const torch::Tensor& num_computed, double scale,
                            int64_t sliding_window, double softcap) {
  const int64_t num_seqs = num_computed.size(0);
  const int64_t num_kv_heads = k_cache.size(2);
  auto bits = [](const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); };
  PrefillStep step{
      bits(q), bits(k_cache), bits(v_cache), reinterpret_cast<uint16_t*>(out.data_ptr()),
      block_tables.data_ptr<int64_t>(), query_starts.data_ptr<int64_t>(), num_computed.data_ptr<int64_t>(),
      q.size(1), num_kv_heads, q.size(1) / num_kv_heads, q.size(2), k_cache.size(1), block_tables.size(1),
      q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
      static_cast<float>(scale), static_cast<float>(softcap), sliding_window};
  struct Item { int64_t seq, kv_head, first, end; };
  std::vector<Item> items;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t tokens = step.query_starts[seq + 1] - step.query_starts[seq];
    for (int64_t first = 0; first < tokens; first += kQueryTokens)
      for (int64_t kv_head = 0; kv_head < num_kv_heads; ++kv_head)
        items.push_back({seq, kv_head, first, std::min(tokens, first + kQueryTokens)});
  }
  const int threads = at::get_num_threads();
  const int64_t num_items = static_cast<int64_t>(items.size());
  if (threads == 1 || num_items < 2) {
    for (const Item& item : items) step.run(item.seq, item.kv_head, item.first, item.end, scratch);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t i = 0; i < num_items; ++i) step.run(items[i].seq, items[i].kv_head, items[i].first, items[i].end, scratch);
}
#endif

bool supports(int64_t head_dim) {
#if defined(__AVX512BF16__)
  return head_dim % 16 == 0 && head_dim <= kMaxHeadDim;
#else
  return false;
#endif
}

void prefill_attention(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k_cache,
                       const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                       const torch::Tensor& query_starts, const torch::Tensor& num_computed, double scale,
                       int64_t sliding_window, double softcap) {
  TORCH_CHECK(supports(q.size(2)), "no bfloat16 prefill kernel for head size ", q.size(2), " on this CPU");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [T, H, D] with D contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              v_cache.sizes() == k_cache.sizes(), "KV caches must be contiguous [NB, BS, Hkv, D]");
  TORCH_CHECK(k_cache.size(3) == q.size(2) && q.size(1) % k_cache.size(2) == 0,
              "q's head size must be the cache's, its heads a multiple of the KV heads");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
              v_cache.scalar_type() == at::kBFloat16, "q and the caches must be bfloat16");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && query_starts.scalar_type() == at::kLong &&
              num_computed.scalar_type() == at::kLong && block_tables.is_contiguous() &&
              query_starts.is_contiguous() && num_computed.is_contiguous(),
              "block tables, query starts and computed counts must be contiguous int64");
  const int64_t num_seqs = num_computed.size(0);
  TORCH_CHECK(block_tables.size(0) == num_seqs && query_starts.size(0) == num_seqs + 1,
              "one block table and one computed count per sequence, num_seqs + 1 query starts");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "out must be a contiguous tensor shaped and typed like q");
  const int64_t* starts = query_starts.data_ptr<int64_t>();
  const int64_t* computed = num_computed.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t block_size = k_cache.size(1), max_blocks = block_tables.size(1);
  TORCH_CHECK(starts[0] == 0 && starts[num_seqs] == q.size(0), "query starts must span q's rows");
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t end = computed[seq] + starts[seq + 1] - starts[seq];
    TORCH_CHECK(starts[seq + 1] >= starts[seq] && computed[seq] >= 0 && end <= max_blocks * block_size,
                "sequence ", seq, "'s keys must fit its block table");
    for (int64_t block = 0; block * block_size < end; ++block)
      TORCH_CHECK(tables[seq * max_blocks + block] >= 0 && tables[seq * max_blocks + block] < k_cache.size(0),
                  "sequence ", seq, "'s block ", block, " is outside the cache");
  }
#if defined(__AVX512BF16__)
  prefill_attention_impl(out, q, k_cache, v_cache, block_tables, query_starts, num_computed, scale, sliding_window,
                         softcap);
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supports", &supports, "whether this CPU has the bfloat16 prefill kernel for this head size",
        pybind11::arg("head_dim"));
  m.def("prefill_attention", &prefill_attention,
        "causal bfloat16 attention of a step's prefill tokens over their sequences' paged KV blocks, flash-style",
        pybind11::arg("out"), pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("block_tables"), pybind11::arg("query_starts"), pybind11::arg("num_computed"),
        pybind11::arg("scale"), pybind11::arg("sliding_window") = 0, pybind11::arg("softcap") = 0.0);
}
