// stepserve::linear: y = x W^T + b on the CPU, for the few rows of a decode step as for the many
// of a prefill.
//
// Up to kMaxRows rows of x (a decode step of a few sequences) the step is bound by reading W
// once, so this file's own kernel streams W as the model holds it ([N, K], no packed copy): each
// thread takes ranges of W's rows from a shared counter and multiplies every row of x with them,
// the sums of R weight rows held in registers across K, the next rows prefetched while these
// are read, on the step kernels' own threads (spin_pool.h: a batch-1 step runs a linear layer
// every few tens of microseconds, and OpenMP's passive threads took a wake-up each). Past kMaxRows rows the work
// is arithmetic, and oneDNN's GEMM on the weight packed for it at load (`packed`, what inductor's
// frozen graph and the benchmarks' GEMM limit call) does it; at::linear without a packed weight,
// but for bfloat16 on a CPU where oneDNN has no bfloat16 GEMM (AVX2 alone), which the kernel
// takes kMaxRows rows at a time.
//
// float32 and bfloat16 (on the dot-product instruction where the CPU has AVX512-BF16) run the
// vector path, other dtypes a plain loop; sums in float32, y rounded once, as a GEMM's.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "simd_math.h"
#include "spin_pool.h"

namespace {

constexpr int64_t kMaxRows = 8;
// oneDNN's bfloat16 GEMM needs AVX512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere (AVX2 alone) aten
// emulates it at a fifth of this file's kernel (20 against 85 GFLOP/s at 32 rows, 2-vCPU AMD EPYC),
// so there the kernel takes bfloat16 rows of any number.
#if (defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)) || defined(__AVXNECONVERT__)
constexpr bool kFastBf16Gemm = true;
#else
constexpr bool kFastBf16Gemm = false;
#endif

using stepserve::to_float;

template <typename scalar_t>
inline void store(scalar_t* out, float value) { *out = static_cast<scalar_t>(value); }  // bfloat16: to nearest even

// ---- the tile: R weight rows against MT rows of x ----------------------------------------------

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define STEPSERVE_LINEAR_SIMD 1
using Reg = __m512;
inline Reg zero() { return _mm512_setzero_ps(); }
inline float reduce(Reg x) { return _mm512_reduce_add_ps(x); }
inline Reg fmadd(Reg acc, Reg x, Reg w) { return _mm512_fmadd_ps(x, w, acc); }
inline Reg widen(__m256i half) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16)); }
constexpr int kPrefetchLine = 64;

struct Fp32 {
  using scalar_t = float;
  static constexpr int kStep = 16;
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg madd(Reg acc, Reg x, Reg w) { return fmadd(acc, x, w); }
};
#if defined(__AVX512BF16__)
// 32 of K per step: the instruction sums pairs of products into 16 lanes.
struct Bf16 {
  using scalar_t = c10::BFloat16;
  static constexpr int kStep = 32;
  static Reg load(const c10::BFloat16* p) { return _mm512_castsi512_ps(_mm512_loadu_si512(p)); }
  static Reg madd(Reg acc, Reg x, Reg w) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w); }
};
#else
struct Bf16 {
  using scalar_t = c10::BFloat16;
  static constexpr int kStep = 16;
  static Reg load(const c10::BFloat16* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg madd(Reg acc, Reg x, Reg w) { return fmadd(acc, x, w); }
};
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#define STEPSERVE_LINEAR_SIMD 1
using Reg = __m256;
inline Reg zero() { return _mm256_setzero_ps(); }
inline float reduce(Reg x) {
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  __m128 odd = _mm_movehdup_ps(half);
  half = _mm_add_ps(half, odd);
  return _mm_cvtss_f32(_mm_add_ss(half, _mm_movehl_ps(odd, half)));
}
inline Reg fmadd(Reg acc, Reg x, Reg w) { return _mm256_fmadd_ps(x, w, acc); }
constexpr int kPrefetchLine = 64;

struct Fp32 {
  using scalar_t = float;
  static constexpr int kStep = 8;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg madd(Reg acc, Reg x, Reg w) { return fmadd(acc, x, w); }
};
struct Bf16 {
  using scalar_t = c10::BFloat16;
  static constexpr int kStep = 8;
  static Reg load(const c10::BFloat16* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static Reg madd(Reg acc, Reg x, Reg w) { return fmadd(acc, x, w); }
};
#endif

#ifdef STEPSERVE_LINEAR_SIMD
template <typename T> struct OpsOf { using type = void; };
template <> struct OpsOf<float> { using type = Fp32; };
template <> struct OpsOf<c10::BFloat16> { using type = Bf16; };

// sums[m][r] = x[m] . w[n0 + r], vector part over whole steps of K, the rest lane by lane. The
// same offsets of the next R rows are prefetched as these are read: W's rows are contiguous, so
// a thread's range is one stream, ahead of the hardware prefetcher's few streams.
template <typename Ops, int MT, int R>
inline void tile(const typename Ops::scalar_t* x, int64_t x_stride, const typename Ops::scalar_t* w, int64_t K,
                 int64_t n0, float (&sums)[MT][R]) {
  using scalar_t = typename Ops::scalar_t;
  Reg acc[MT][R];
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = zero();
  const scalar_t* rows = w + n0 * K;
  const int64_t vector_end = K / Ops::kStep * Ops::kStep;
  constexpr int kPerLine = kPrefetchLine / sizeof(scalar_t);
  for (int64_t k = 0; k < vector_end; k += Ops::kStep) {
    Reg wr[R];
    for (int r = 0; r < R; ++r) {
      wr[r] = Ops::load(rows + r * K + k);
      if ((k % kPerLine) == 0) _mm_prefetch(reinterpret_cast<const char*>(rows + (R + r) * K + k), _MM_HINT_T0);
    }
    for (int m = 0; m < MT; ++m) {
      const Reg xm = Ops::load(x + m * x_stride + k);
      for (int r = 0; r < R; ++r) acc[m][r] = Ops::madd(acc[m][r], xm, wr[r]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      float sum = reduce(acc[m][r]);
      for (int64_t k = vector_end; k < K; ++k) sum += to_float(x[m * x_stride + k]) * to_float(rows[r * K + k]);
      sums[m][r] = sum;
    }
}
#endif

template <typename scalar_t, int MT, int R>
inline void tile_any(const scalar_t* x, int64_t x_stride, const scalar_t* w, int64_t K, int64_t n0,
                     float (&sums)[MT][R]) {
#ifdef STEPSERVE_LINEAR_SIMD
  if constexpr (!std::is_void_v<typename OpsOf<scalar_t>::type>) {
    return tile<typename OpsOf<scalar_t>::type, MT, R>(x, x_stride, w, K, n0, sums);
  }
#endif
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      float sum = 0.f;
      for (int64_t k = 0; k < K; ++k) sum += to_float(x[m * x_stride + k]) * to_float(w[(n0 + r) * K + k]);
      sums[m][r] = sum;
    }
}

// Weight rows per tile: several, so that a row's loads are in flight beside the others', few
// enough that the MT x R sums and the R rows loaded fit the vector registers.
template <int MT>
constexpr int rows_per_tile() {
#if defined(__AVX512F__)
  return MT <= 2 ? 8 : MT <= 4 ? 6 : 3;
#else  // 16 vector registers: at 4 rows of x and more, fewer rows of W (2-vCPU AMD EPYC, AVX2: 4 rows of x
       // 16 -> 21 GB/s of weights, 8 rows 11 -> 11.5)
  return MT <= 2 ? 8 : MT <= 4 ? 3 : 2;
#endif
}

struct Problem {
  void* y;
  int64_t y_stride;
  const void* x;
  int64_t x_stride;
  const void* w;
  const void* bias;
  int64_t N, K;
};

template <typename scalar_t, int MT>
void rows_range(const Problem& p, int64_t begin, int64_t end) {
  constexpr int R = rows_per_tile<MT>();
  auto* y = static_cast<scalar_t*>(p.y);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* w = static_cast<const scalar_t*>(p.w);
  const auto* bias = static_cast<const scalar_t*>(p.bias);
  auto emit = [&](int64_t n, int m, float sum) {
    if (bias != nullptr) sum += to_float(bias[n]);
    store(y + m * p.y_stride + n, sum);
  };
  int64_t n = begin;
  for (; n + R <= end; n += R) {
    float sums[MT][R];
    tile_any<scalar_t, MT, R>(x, p.x_stride, w, p.K, n, sums);
    for (int m = 0; m < MT; ++m)
      for (int r = 0; r < R; ++r) emit(n + r, m, sums[m][r]);
  }
  for (; n < end; ++n) {
    float sums[MT][1];
    tile_any<scalar_t, MT, 1>(x, p.x_stride, w, p.K, n, sums);
    for (int m = 0; m < MT; ++m) emit(n, m, sums[m][0]);
  }
}

template <typename scalar_t>
void rows_range_of(const Problem& p, int64_t M, int64_t begin, int64_t end) {
  switch (M) {
    case 1: return rows_range<scalar_t, 1>(p, begin, end);
    case 2: return rows_range<scalar_t, 2>(p, begin, end);
    case 3: return rows_range<scalar_t, 3>(p, begin, end);
    case 4: return rows_range<scalar_t, 4>(p, begin, end);
    case 5: return rows_range<scalar_t, 5>(p, begin, end);
    case 6: return rows_range<scalar_t, 6>(p, begin, end);
    case 7: return rows_range<scalar_t, 7>(p, begin, end);
    default: return rows_range<scalar_t, 8>(p, begin, end);
  }
}

// W's rows go out in kChunksPerThread ranges a thread, taken from a shared counter: contiguous
// enough for the prefetchers, and a thread slowed by the host leaves its last ranges to the others.
constexpr int64_t kChunksPerThread = 4;
// More rows of x than kMaxRows go through in groups of kMaxRows, kGroupRows of W's rows at a
// time: those stay in L2 while every group multiplies them, so W is read from memory once.
constexpr int64_t kGroupRows = 32;

template <typename scalar_t>
void run_rows(const Problem& p, int64_t M) {
  constexpr int64_t kTile = 8;  // a whole number of every MT's tiles but the odd ones
  const int64_t max_threads = std::min<int64_t>(at::get_num_threads(), stepserve::SpinPool::kMaxThreads);
  const int64_t threads = std::max<int64_t>(1, std::min(max_threads, p.N / (16 * kTile)));
  const int64_t chunk = (p.N + threads * kChunksPerThread - 1) / (threads * kChunksPerThread);
  const int64_t rows = (chunk + kTile - 1) / kTile * kTile;
  const int64_t num_chunks = (p.N + rows - 1) / rows;
  std::atomic<int64_t> next{0};
  stepserve::SpinPool::instance().run(static_cast<int>(threads), [&](int) {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < num_chunks;) {
      const int64_t begin = c * rows, end = std::min(p.N, (c + 1) * rows);
      if (M <= kMaxRows) {
        rows_range_of<scalar_t>(p, M, begin, end);
        continue;
      }
      for (int64_t n = begin; n < end; n += kGroupRows) {
        for (int64_t m = 0; m < M; m += kMaxRows) {
          Problem group = p;
          group.x = static_cast<const scalar_t*>(p.x) + m * p.x_stride;
          group.y = static_cast<scalar_t*>(p.y) + m * p.y_stride;
          rows_range_of<scalar_t>(group, std::min(kMaxRows, M - m), n, std::min(end, n + kGroupRows));
        }
      }
    }
  });
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                        c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(), c10::string_view(""));
}

}  // namespace

// out [M, N] = x [M, K] @ weight [N, K]^T (+ bias [N]) by this file's kernel.
static void small_batch_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && out.dim() == 2, "2-D x, weight, out");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K && out.size(0) == M && out.size(1) == N, "shapes: x ", x.sizes(), ", weight ",
              weight.sizes(), ", out ", out.sizes());
  TORCH_CHECK(weight.is_contiguous() && x.stride(1) == 1 && out.stride(1) == 1, "rows contiguous in K");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() && out.scalar_type() == weight.scalar_type(), "one dtype");
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->scalar_type() == weight.scalar_type(), "bias [N]");
  }
  if (M == 0 || N == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, weight.scalar_type(), "small_batch_linear", [&] {
    const Problem p{out.data_ptr(), out.stride(0), x.data_ptr(), x.stride(0), weight.data_ptr(),
                    bias.has_value() ? bias->data_ptr() : nullptr, N, K};
    run_rows<scalar_t>(p, M);
  });
}

// stepserve::linear: x [..., K] -> [..., N]; packed: weight as mkldnn._reorder_linear_weight
// packed it, or none.
static at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& packed) {
  if (x.dim() != 2) {  // [..., K]: as rows, and back (the models' layers pass rows: no view on their path)
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return linear(x.reshape({-1, x.size(-1)}), weight, bias, packed).view(shape);
  }
  const bool ours = weight.is_contiguous() && x.scalar_type() == weight.scalar_type() &&
                    (x.size(0) <= kMaxRows || (!packed.has_value() && x.scalar_type() == at::kBFloat16 && !kFastBf16Gemm));
  if (!ours) return packed.has_value() ? packed_linear(x, *packed, bias) : at::linear(x, weight, bias);
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options());
  small_batch_linear(out, x.stride(1) == 1 ? x : x.contiguous(), weight, bias);
  return out;
}

TORCH_LIBRARY_FRAGMENT(stepserve, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, Tensor? packed) -> Tensor");
}

// MkldnnCPU: where the packed weight is oneDNN's opaque tensor (bfloat16), its key decides.
TORCH_LIBRARY_IMPL(stepserve, CPU, m) { m.impl("linear", &linear); }
TORCH_LIBRARY_IMPL(stepserve, MkldnnCPU, m) { m.impl("linear", &linear); }
