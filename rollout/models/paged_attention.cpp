// The CPU paged-attention kernel, built on first use by paged_attention.py (its docstring says what and why).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <type_traits>
#include <limits>
#include <algorithm>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECROLL_AVX2 1
extern "C" __m256 _ZGVdN8v_expf(__m256);  // glibc's libmvec: expf on 8 lanes

// The dot products of q [d] with 8 keys k[j * d ..] (d a multiple of 8), as one vector [8].
static inline __m256 dot8(const float* q, const float* k, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 x = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + i), a0);
    a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + d + i), a1);
    a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 2 * d + i), a2);
    a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 3 * d + i), a3);
    a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 4 * d + i), a4);
    a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 5 * d + i), a5);
    a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 6 * d + i), a6);
    a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 7 * d + i), a7);
  }
  // Pairwise sums: per 128-bit lane, [a0 a1 a2 a3] partial sums low and high, then the halves added.
  const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}
#endif

// Scores of one query [d] against `span` keys (stride d) into out; masked keys -inf.
template <typename scalar_t>
static inline void score_keys(const float* qr, const scalar_t* kb, const bool* mr, float* out, int64_t span,
                              int64_t d, float neg_inf) {
  int64_t s = 0;
#ifdef SPECROLL_AVX2
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (d % 8 == 0)
      for (; s + 8 <= span; s += 8) _mm256_storeu_ps(out + s, dot8(qr, kb + s * d, d));
  }
#endif
  for (; s < span; ++s) {
    const scalar_t* kr = kb + s * d;
    float acc_s = 0.f;
#pragma omp simd reduction(+ : acc_s)
    for (int64_t i = 0; i < d; ++i) acc_s += qr[i] * static_cast<float>(kr[i]);
    out[s] = acc_s;
  }
  for (s = 0; s < span; ++s)
    if (!mr[s]) out[s] = neg_inf;
}

// pr[t] = exp(pr[t] - m) for t < len (-inf -> 0); returns their sum.
static inline float exp_shifted(float* pr, int64_t len, float m) {
  int64_t t = 0;
  float sum = 0.f;
#ifdef SPECROLL_AVX2
  const __m256 shift = _mm256_set1_ps(m);
  __m256 total = _mm256_setzero_ps();
  for (; t + 8 <= len; t += 8) {
    const __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(pr + t), shift));
    _mm256_storeu_ps(pr + t, e);
    total = _mm256_add_ps(total, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  for (float x : lanes) sum += x;
#endif
  for (; t < len; ++t) { pr[t] = std::exp(pr[t] - m); sum += pr[t]; }
  return sum;
}

template <typename scalar_t>
static void paged_attention_impl(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                 const at::Tensor& table, const at::Tensor& mask, at::Tensor& out,
                                 int64_t block_size, int64_t kv_len, double scale) {
  const int64_t n = q.size(0), hq = q.size(1), ql = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(0), dv = values.size(2), groups = hq / hkv, nb = table.size(1);
  const int64_t gq = groups * ql;  // queries that read one K/V head: (group g, query i) -> g * ql + i
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = keys.data_ptr<scalar_t>();
  const scalar_t* vp = values.data_ptr<scalar_t>();
  const int64_t* tp = table.data_ptr<int64_t>();
  const bool* mp = mask.data_ptr<bool>();
  const int64_t mask_row = mask.size(0) == 1 ? 0 : ql * kv_len;
  const int64_t k_head = keys.stride(0), v_head = values.stride(0);
  scalar_t* op = out.data_ptr<scalar_t>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, n * hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(gq * d), p(gq * kv_len), acc(gq * dv), inv(gq);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / hkv, h = task % hkv;
      const bool* mb = mp + b * mask_row;
      for (int64_t r = 0; r < gq; ++r) {
        const scalar_t* src = qp + ((b * hq + h * groups + r / ql) * ql + r % ql) * d;
        for (int64_t i = 0; i < d; ++i) qf[r * d + i] = static_cast<float>(src[i]) * static_cast<float>(scale);
      }
      for (int64_t t0 = 0; t0 < kv_len; t0 += block_size) {  // scores: each key read once for every query of its head
        const scalar_t* kb = kp + h * k_head + tp[b * nb + t0 / block_size] * block_size * d;
        const int64_t span = std::min(block_size, kv_len - t0);
        for (int64_t r = 0; r < gq; ++r) {
          const float* qr = qf.data() + r * d;
          score_keys<scalar_t>(qr, kb, mb + (r % ql) * kv_len + t0, p.data() + r * kv_len + t0, span, d, neg_inf);
        }
      }
      for (int64_t r = 0; r < gq; ++r) {  // softmax in fp32
        float* pr = p.data() + r * kv_len;
        float m = neg_inf;
        for (int64_t t = 0; t < kv_len; ++t) m = pr[t] > m ? pr[t] : m;
        const float sum = exp_shifted(pr, kv_len, m);
        inv[r] = 1.f / sum;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = 0; t0 < kv_len; t0 += block_size) {  // values, each read once
        const scalar_t* vb = vp + h * v_head + tp[b * nb + t0 / block_size] * block_size * dv;
        const int64_t span = std::min(block_size, kv_len - t0);
        for (int64_t r = 0; r < gq; ++r) {
          const float* pr = p.data() + r * kv_len + t0;
          float* ar = acc.data() + r * dv;
          for (int64_t s = 0; s < span; ++s) {
            const float w = pr[s];
            if (w == 0.f) continue;
            const scalar_t* vr = vb + s * dv;
#pragma omp simd
            for (int64_t i = 0; i < dv; ++i) ar[i] += w * static_cast<float>(vr[i]);
          }
        }
      }
      for (int64_t r = 0; r < gq; ++r) {
        scalar_t* dst = op + ((b * hq + h * groups + r / ql) * ql + r % ql) * dv;
        for (int64_t i = 0; i < dv; ++i) dst[i] = static_cast<scalar_t>(acc[r * dv + i] * inv[r]);
      }
    }
  });
}

at::Tensor paged_attention(at::Tensor q, at::Tensor keys, at::Tensor values, at::Tensor table, at::Tensor mask,
                           int64_t block_size, int64_t kv_len, double scale) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 3 && values.dim() == 3 && table.dim() == 2 && mask.dim() == 4,
              "paged_attention: q [n, Hq, Q, D], pools [Hkv, slots, D], table [n, nb], mask [n or 1, 1, Q, K]");
  TORCH_CHECK(keys.scalar_type() == q.scalar_type() && values.scalar_type() == q.scalar_type(),
              "paged_attention: q and the pools must share a dtype");
  TORCH_CHECK(table.scalar_type() == at::kLong && mask.scalar_type() == at::kBool,
              "paged_attention: an int64 table and a bool mask");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.size(0) == values.size(0) &&
              keys.size(1) == values.size(1) && keys.size(2) == q.size(3) && q.size(1) % keys.size(0) == 0,
              "paged_attention: contiguous pools of matching heads, slots and head dim");
  TORCH_CHECK(table.size(0) == q.size(0) && table.size(1) * block_size >= kv_len && kv_len > 0 &&
              mask.size(3) == kv_len && mask.size(2) == q.size(2) && (mask.size(0) == 1 || mask.size(0) == q.size(0)),
              "paged_attention: table and mask must cover the rows, queries and kv_len slots");
  q = q.contiguous();
  table = table.contiguous();
  mask = mask.contiguous();
  auto out = at::empty({q.size(0), q.size(1), q.size(2), values.size(2)}, q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention", [&] {
    paged_attention_impl<scalar_t>(q, keys, values, table, mask, out, block_size, kv_len, scale);
  });
  return out;
}
