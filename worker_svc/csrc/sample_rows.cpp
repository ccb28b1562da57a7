// A step's random sampling on CPU, one call: for each row of logits, the grammar's bitmask,
// temperature, top-k, top-p and min-p, then one draw, the row's token written to out.
//
// The semantics are vLLM's (and sampler.py's torch path): top-k keeps the k highest logits (ties
// to the lower token id, a stable descending sort's order), top-p then keeps the shortest prefix
// of those, best first, whose probability mass reaches p (the token that crosses p stays), min-p
// then drops the tokens whose probability is below min_p times the highest. A row with
// temperature 0 takes the argmax (lowest id among ties). A bitmask row (xgrammar's layout: bit
// j % 32 of word j / 32 set = token j allowed) sees every other token at -inf.
//
// The draw is the inverse of the kept tokens' cumulative distribution at the row's uniform u
// (given by the caller: from the request's seed and position, or from the worker's generator):
// the first token, in the order walked, whose running mass exceeds u times the kept mass. One
// random number per row, nothing per token: torch's exponential_ over [256, 32000] alone took
// 155 ms on a 2-vCPU AMD EPYC (avx512_bf16, 2 threads), this whole call 2.7 ms at temperature 1
// and 2.6 ms with top-k 50 and top-p 0.95.
//
// Cost per row, in passes over its V logits (each vectorised, the row's buffers in L2):
//   every row: its maximum, read from the logits where they are float32 and unmasked, else from
//     a float32 copy with the bitmask applied (32 tokens a word);
//   top-k: the maxima of 64-token chunks, then the entries of the chunks that can hold one of
//     the k best (or, for a small vocabulary, the k-th value by bisection: top_candidates), then
//     k exponentials; no exponentials over the whole row;
//   otherwise: the exponentials with per-block sums, then the walk of block sums and one block;
//     top-p first tries the 64 best tokens; when they hold less than p of the mass (a flat
//     distribution) it bisects the cut value over the float bits (about 30 passes: 13.5 ms for
//     [256, 32000] at top-p 0.9 on random logits, the slow case).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "simd_math.h"

namespace {

using stepserve::exp_nonpositive;
using stepserve::to_float;

constexpr int64_t kBlock = 64;          // tokens per partial sum of the draw's walk
constexpr int64_t kTopPCandidates = 64;  // best tokens tried for top-p before bisecting
constexpr int64_t kParallelWork = 1 << 16;  // below this many logits a call runs on one thread
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(d) for d = logit - max <= 0, exactly 0 below -87 (-inf included: a masked or banned token
// must never be drawn; exp_nonpositive clamps there to 1e-38).
inline float weight(float d) { return d < -87.f ? 0.f : exp_nonpositive(d); }

struct Candidate {
  float value;
  int64_t index;
};

// a ranks before b: a larger value, or the same value and a lower token id. A function object,
// so that std::partial_sort inlines it (a function pointer was a call per comparison).
struct RanksBefore {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.value > b.value || (a.value == b.value && a.index < b.index);
  }
};

struct Scratch {
  std::vector<float> x, e, mass;
  std::vector<double> block_sums;
  std::vector<Candidate> best;
  std::vector<float> chunk_max;
};

thread_local Scratch scratch;

// Largest of x[0 .. n), -inf for none; lanes of independent maxima (a single running maximum is
// a chain of dependent instructions the compiler leaves scalar).
float max_of(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kNegInf);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = x[j + l] > lanes[l] ? x[j + l] : lanes[l];
  float out = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) out = std::max(out, lanes[l]);
  for (; j < n; ++j) out = std::max(out, x[j]);
  return out;
}

// float -> uint32 in the same order (-inf lowest), and back: a bisection over floats' bits.
inline uint32_t order_key(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}

inline float from_order_key(uint32_t key) {
  const uint32_t bits = key & 0x80000000u ? key & 0x7fffffffu : ~key;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

int64_t count_at_least(const float* x, int64_t n, float value) {
  int32_t count = 0;  // 32-bit lanes beside the floats' (a vocabulary is far below 2^31)
#pragma omp simd reduction(+ : count)
  for (int64_t j = 0; j < n; ++j) count += x[j] >= value ? 1 : 0;
  return count;
}

// Into out, the entries of x[0 .. n) at or above a value with k to 2k of them (at least k: ties):
// the value by bisection over the float bits, vectorised counting passes until the count is
// close enough for the caller's sort.
void at_least_kth_by_bisection(const float* x, int64_t n, int64_t k, float max_value, std::vector<Candidate>& out) {
  uint32_t lo = order_key(kNegInf), hi = order_key(max_value) + 1;  // count(lo) >= k > count(hi)
  int64_t count_lo = n;
  while (hi - lo > 1 && count_lo > 2 * k) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const int64_t count = count_at_least(x, n, from_order_key(mid));
    if (count >= k) {
      lo = mid;
      count_lo = count;
    } else {
      hi = mid;
    }
  }
  const float floor = from_order_key(lo);
  out.clear();
  for (int64_t j = 0; j < n; ++j)
    if (x[j] >= floor) out.push_back({x[j], j});
}

// The k best-ranked entries of x[0 .. n) (0 < k <= n, max_value their maximum) into out, best
// first. Where k is well under the number of 64-token chunks, the k-th largest chunk maximum is
// at most the k-th largest entry (k chunks hold an entry at least that large), so only the
// entries at or above it, in the chunks that reach it, are candidates: two vectorised passes
// over the row. Otherwise (a small vocabulary, a large k) the k-th value by bisection. Then a
// sort of about k candidates.
void top_candidates(const float* x, int64_t n, int64_t k, float max_value, std::vector<Candidate>& out,
                    std::vector<float>& chunk_max) {
  const int64_t num_chunks = (n + kBlock - 1) / kBlock;
  float floor = kNegInf;
  if (4 * k <= num_chunks) {
    chunk_max.resize(2 * num_chunks);  // the maxima, then a copy that nth_element reorders
    for (int64_t c = 0; c < num_chunks; ++c)
      chunk_max[c] = chunk_max[num_chunks + c] = max_of(x + c * kBlock, std::min(kBlock, n - c * kBlock));
    float* order = chunk_max.data() + num_chunks;
    std::nth_element(order, order + k - 1, order + num_chunks, std::greater<float>());
    floor = order[k - 1];
  }
  if (floor > kNegInf) {
    out.clear();
    for (int64_t c = 0; c < num_chunks; ++c) {
      if (!(chunk_max[c] >= floor)) continue;
      for (int64_t j = c * kBlock; j < std::min(n, (c + 1) * kBlock); ++j)
        if (x[j] >= floor) out.push_back({x[j], j});
    }
  } else {
    at_least_kth_by_bisection(x, n, k, max_value, out);
  }
  std::partial_sort(out.begin(), out.begin() + k, out.end(), RanksBefore());
  out.resize(k);
}

// Draws from the first num_kept of mass[] (weights of `best`, best first), dropping min-p's.
int64_t draw_from_candidates(const std::vector<Candidate>& best, const float* mass, int64_t num_kept, float min_p,
                             double u) {
  if (min_p > 0.f) {  // mass is descending and mass[0] == 1: drop the tail below min_p
    int64_t keep = 1;
    while (keep < num_kept && mass[keep] >= min_p) ++keep;
    num_kept = keep;
  }
  double total = 0.0;
  for (int64_t r = 0; r < num_kept; ++r) total += mass[r];
  const double target = u * total;
  double running = 0.0;
  for (int64_t r = 0; r < num_kept; ++r) {
    running += mass[r];
    if (running > target) return best[r].index;
  }
  return best[0].index;
}

// Draws from e[0 .. n) (weights, 0 = never), block_sums[b] the sum of block b.
int64_t draw_from_row(const float* e, const double* block_sums, int64_t n, double u) {
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  double total = 0.0;
  for (int64_t b = 0; b < num_blocks; ++b) total += block_sums[b];
  const double target = u * total;
  double running = 0.0;
  for (int64_t b = 0; b < num_blocks; ++b) {
    if (block_sums[b] > 0.0 && running + block_sums[b] > target) {
      double inside = running;
      for (int64_t j = b * kBlock; j < std::min(n, (b + 1) * kBlock); ++j) {
        inside += e[j];
        if (e[j] > 0.f && inside > target) return j;
      }
    }
    running += block_sums[b];
  }
  for (int64_t j = n - 1; j > 0; --j)  // rounding left the target beyond the last weight
    if (e[j] > 0.f) return j;
  return 0;
}

// The first j with x[j] == value, n if none: whole chunks compared at once, then one scanned.
int64_t first_index_of(const float* x, int64_t n, float value) {
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    int found = 0;
#pragma omp simd reduction(| : found)
    for (int64_t j = b; j < end; ++j) found |= x[j] == value;
    if (found)
      for (int64_t j = b; j < end; ++j)
        if (x[j] == value) return j;
  }
  return n;
}

// e[j] = weight((x[j] - max_value) * scale), 0 where below floor; block_sums[b] the sum of block b.
void weights_and_block_sums(const float* x, int64_t n, float max_value, float scale, float floor, float* e,
                            double* block_sums) {
  for (int64_t b = 0; b * kBlock < n; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = b * kBlock; j < end; ++j) {
      const float w = weight((x[j] - max_value) * scale);
      e[j] = w < floor ? 0.f : w;
      sum += e[j];
    }
    block_sums[b] = sum;
  }
}

void sum_blocks(const float* e, int64_t n, double* block_sums) {
  for (int64_t b = 0; b * kBlock < n; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = b * kBlock; j < end; ++j) sum += e[j];
    block_sums[b] = sum;
  }
}

float mass_at_least(const float* e, int64_t n, float value) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += e[j] >= value ? e[j] : 0.f;
  return sum;
}

// Top-p over the whole row by bisection: t, the largest weight whose tokens at or above it hold
// at least `needed` of the mass; tokens above t stay, and of those equal to t (in id order) as
// many as it takes to reach `needed`. Everything else (and min-p's drops) becomes 0.
void cut_top_p_by_bisection(float* e, int64_t n, float needed, float min_p) {
  uint32_t lo = 0, hi;  // as float bits: mass_at_least(lo) >= needed, mass_at_least(hi) < needed
  const float above_one = std::nextafter(1.f, 2.f);
  std::memcpy(&hi, &above_one, sizeof hi);
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    float value;
    std::memcpy(&value, &mid, sizeof value);
    (mass_at_least(e, n, value) >= needed ? lo : hi) = mid;
  }
  float cut;
  std::memcpy(&cut, &lo, sizeof cut);
  float above = 0.f;
  int64_t num_ties = 0;
#pragma omp simd reduction(+ : above, num_ties)
  for (int64_t j = 0; j < n; ++j) {
    above += e[j] > cut ? e[j] : 0.f;
    num_ties += e[j] == cut;
  }
  int64_t ties_left = cut > 0.f ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil((needed - above) / cut))) : 0;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) e[j] = e[j] < cut || e[j] < min_p ? 0.f : e[j];
  if (num_ties > ties_left && cut > 0.f)  // equal weights at the cut: the lower ids stay
    for (int64_t j = 0; j < n; ++j)
      if (e[j] == cut && ties_left-- <= 0) e[j] = 0.f;
}

template <typename scalar_t>
const float* masked_row(const scalar_t* logits, int64_t n, const int32_t* bitmask, std::vector<float>& copy) {
  if constexpr (std::is_same_v<scalar_t, float>)
    if (bitmask == nullptr) return logits;
  copy.resize(n);
  float* x = copy.data();
  if (bitmask != nullptr) {  // a word of 32 tokens at a time: its bits shifted lane by lane, no gather
    for (int64_t word = 0; word * 32 < n; ++word) {
      const uint32_t bits = static_cast<uint32_t>(bitmask[word]);
      const int64_t first = word * 32, len = std::min<int64_t>(32, n - first);
      if (bits == 0) {
        std::fill(x + first, x + first + len, kNegInf);
        continue;
      }
#pragma omp simd
      for (int64_t l = 0; l < len; ++l) x[first + l] = (bits >> l) & 1u ? to_float(logits[first + l]) : kNegInf;
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) x[j] = to_float(logits[j]);
  }
  return x;
}

template <typename scalar_t>
int64_t sample_row(const scalar_t* logits, int64_t n, float temperature, int64_t top_k, float top_p, float min_p,
                   double u, const int32_t* bitmask) {
  Scratch& s = scratch;
  const float* x = masked_row(logits, n, bitmask, s.x);
  const float max_value = max_of(x, n);
  if (temperature <= 0.f || !(max_value > kNegInf)) {  // greedy, or nothing allowed: the argmax
    const int64_t first = first_index_of(x, n, max_value);
    return first < n ? first : 0;
  }
  const float scale = 1.f / temperature;

  if (top_k > 0 && top_k < n) {
    top_candidates(x, n, top_k, max_value, s.best, s.chunk_max);
    s.mass.resize(top_k);
    float total = 0.f;
    for (int64_t r = 0; r < top_k; ++r) total += s.mass[r] = weight((s.best[r].value - max_value) * scale);
    int64_t num_kept = top_k;
    if (top_p < 1.f) {
      float before = 0.f;
      for (int64_t r = 0; r < top_k; ++r) {
        if (r > 0 && before >= top_p * total) {
          num_kept = r;
          break;
        }
        before += s.mass[r];
      }
    }
    return draw_from_candidates(s.best, s.mass.data(), num_kept, min_p, u);
  }

  s.e.resize(n);
  s.block_sums.resize((n + kBlock - 1) / kBlock);
  float* e = s.e.data();
  weights_and_block_sums(x, n, max_value, scale, top_p < 1.f ? 0.f : min_p,  // min-p comes after top-p's cut
                         e, s.block_sums.data());
  if (top_p < 1.f) {
    double total = 0.0;
    for (double b : s.block_sums) total += b;
    const float needed = static_cast<float>(top_p * total);
    top_candidates(x, n, std::min(kTopPCandidates, n), max_value, s.best, s.chunk_max);
    s.mass.resize(s.best.size());
    float inclusive = 0.f;
    for (size_t r = 0; r < s.best.size(); ++r) {
      s.mass[r] = e[s.best[r].index];
      inclusive += s.mass[r];
      if (inclusive >= needed) return draw_from_candidates(s.best, s.mass.data(), r + 1, min_p, u);
    }
    cut_top_p_by_bisection(e, n, needed, min_p);
    sum_blocks(e, n, s.block_sums.data());
  }
  return draw_from_row(e, s.block_sums.data(), n, u);
}

// logits [S, V] float32, bfloat16 or float16 (rows contiguous); temperature, top_p, min_p [S] float32;
// top_k [S] int64 (<= 0: off); uniform [S] float64 in [0, 1); bitmask [S, ceil(V / 32)] int32 and
// constrained [S] bool, or both empty (no row constrained); out [S] int64.
void sample_rows(const torch::Tensor& logits, const torch::Tensor& temperature, const torch::Tensor& top_k,
                 const torch::Tensor& top_p, const torch::Tensor& min_p, const torch::Tensor& uniform,
                 const torch::Tensor& bitmask, const torch::Tensor& constrained, torch::Tensor& out) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "logits must be [S, V] with contiguous rows");
  const int64_t num_rows = logits.size(0), vocab_size = logits.size(1);
  TORCH_CHECK(temperature.scalar_type() == at::kFloat && top_p.scalar_type() == at::kFloat &&
              min_p.scalar_type() == at::kFloat && top_k.scalar_type() == at::kLong &&
              uniform.scalar_type() == at::kDouble && out.scalar_type() == at::kLong, "parameter dtypes");
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&temperature, &top_k, &top_p, &min_p, &uniform, &out})
    TORCH_CHECK(t->is_contiguous() && t->numel() == num_rows, "one contiguous parameter per row");
  const bool masked = bitmask.numel() > 0;
  if (masked)
    TORCH_CHECK(bitmask.scalar_type() == at::kInt && bitmask.is_contiguous() && bitmask.size(0) >= num_rows &&
                    bitmask.size(1) * 32 >= vocab_size && constrained.scalar_type() == at::kBool &&
                    constrained.numel() == num_rows,
                "bitmask must be [S, ceil(V / 32)] int32 with a bool per row");
  const float* temperature_ = temperature.data_ptr<float>();
  const int64_t* top_k_ = top_k.data_ptr<int64_t>();
  const float* top_p_ = top_p.data_ptr<float>();
  const float* min_p_ = min_p.data_ptr<float>();
  const double* uniform_ = uniform.data_ptr<double>();
  const int32_t* bitmask_ = masked ? bitmask.data_ptr<int32_t>() : nullptr;
  const bool* constrained_ = masked ? constrained.data_ptr<bool>() : nullptr;
  const int64_t words = masked ? bitmask.size(1) : 0;
  int64_t* out_ = out.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "sample_rows", [&] {
    const scalar_t* base = logits.data_ptr<scalar_t>();
    const int64_t row_stride = logits.stride(0);
    auto run = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        out_[i] = sample_row(base + i * row_stride, vocab_size, temperature_[i], top_k_[i], top_p_[i], min_p_[i],
                             uniform_[i], masked && constrained_[i] ? bitmask_ + i * words : nullptr);
    };
    if (num_rows * vocab_size < kParallelWork)
      run(0, num_rows);
    else
      at::parallel_for(0, num_rows, 1, run);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sample_rows", &sample_rows,
        "per row: bitmask, temperature, top-k, top-p, min-p, then the draw at the row's uniform",
        pybind11::arg("logits"), pybind11::arg("temperature"), pybind11::arg("top_k"), pybind11::arg("top_p"),
        pybind11::arg("min_p"), pybind11::arg("uniform"), pybind11::arg("bitmask"), pybind11::arg("constrained"),
        pybind11::arg("out"));
}
