/* gemm_bf16 — an AVX512-BF16 GEMM (gemm_bf16.h), and the probe that decides whether it pays on
 * this CPU. Debian's OpenBLAS 0.3.21 is built without BUILD_BFLOAT16 (no cblas_sbgemm) and Debian's
 * oneDNN 2.6 has no bf16 GEMM in its C API (docs/performance.md, "bf16 on the CPU"), hence this
 * kernel.
 *
 * Layout: op(A) is packed into blocks of MR rows and op(B) into panels of NR columns, both as
 * 32-bit words holding the bf16 pair (x[2kk], x[2kk+1]) of consecutive k (K is padded to even with
 * zeros), rounding fp32 → bf16 as they are packed: a panel as [kk][j] (one vector per pair of k), a
 * block as [i][kk] (A's rows converted in place) or, for a transposed A, [kk][i]. The micro-kernel keeps an MR×NR tile of fp32
 * sums in 16 zmm registers and adds, per pair of k, 16 vdpbf16ps: a broadcast A pair times a B
 * panel row of 16 pairs. Packing and tiles are OpenMP loops; panels outer, so a B panel stays in
 * cache while the (smaller) A blocks stream past it.
 */
#include "gemm_bf16.h"

#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "envknob.h"
#include "ops/bf16.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define GEMM_BF16_X86 1
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define GEMM_BF16_X86 0
#endif

#define MR 8    /* rows of a tile */
#define NR 32   /* columns of a tile: two zmm of 16 fp32 */
#define KC 128  /* pairs of k per pass: a B panel's chunk is 16 KB */

/* Below this many multiply-adds a product runs on the calling thread: a parallel region costs
 * more than it saves (attention's per-head products at small T). */
#define PAR_MIN_MACS (1 << 18)

static int cpu_bf16;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT, rate_once = PTHREAD_ONCE_INIT;
static gemm_bf16_rates rates;
static _Thread_local gemm_kind active;

static void detect(void) {
#if GEMM_BF16_X86
  __builtin_cpu_init();
  cpu_bf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#endif
}

int gemm_bf16_cpu_has(void) {
  pthread_once(&cpu_once, detect);
  return cpu_bf16;
}

#if GEMM_BF16_X86
#define PROBE_ITERS 32768   /* 16 instructions each: ~0.2 ms of vdpbf16ps at 2 GHz and 1 per cycle */

static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 16 independent chains of vdpbf16ps (or of vfmadd231ps): throughput, not latency, bounds them.
 * The empty asm makes X opaque, so that the compiler keeps every instruction. */
BF16_TARGET __attribute__((noinline)) static float probe_dp(void) {
  __m512 acc[16];
  for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3c003c00), y = x;   /* 2^-7 pairs */
  for (int k = 0; k < PROBE_ITERS; k++) {
    __asm__ volatile("" : "+v"(x));
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  }
  for (int i = 1; i < 16; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx512f,fma"), noinline)) static float probe_fma(void) {
  __m512 acc[16];
  for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(0x1p-14f), y = x;
  for (int k = 0; k < PROBE_ITERS; k++) {
    __asm__ volatile("" : "+v"(x));
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
  }
  for (int i = 1; i < 16; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return _mm512_reduce_add_ps(acc[0]);
}

/* Multiply-adds per second of each, best of five alternations (a time slice lost to another
 * process, or the sibling hyperthread's work, only lowers a sample). */
static void probe(void) {
  volatile float sink = 0;
  for (int r = 0; r < 5; r++) {
    double t0 = thread_cpu_s();
    sink += probe_dp();
    double t1 = thread_cpu_s();
    sink += probe_fma();
    double t2 = thread_cpu_s();
    double dp = 16.0 * 32 * PROBE_ITERS / (t1 - t0), fma = 16.0 * 16 * PROBE_ITERS / (t2 - t1);
    if (t1 > t0 && dp > rates.bf16) rates.bf16 = dp;
    if (t2 > t1 && fma > rates.fp32) rates.fp32 = fma;
  }
  (void)sink;
}
#endif

gemm_bf16_rates gemm_bf16_rates_of_cpu(void) {
#if GEMM_BF16_X86
  if (gemm_bf16_cpu_has()) pthread_once(&rate_once, probe);
#endif
  return rates;
}

int gemm_bf16_env_valid(const char *env) {
  return strcmp(env, "auto") == 0 || strcmp(env, "on") == 0 || strcmp(env, "off") == 0 || strcmp(env, "emulate") == 0;
}

gemm_kind gemm_bf16_choose(const char *env, int has, gemm_bf16_rates r) {
  if (strcmp(env, "off") == 0) return GEMM_FP32;
  if (strcmp(env, "emulate") == 0) return GEMM_BF16_EMULATED;
  if (!has) return GEMM_FP32;
  if (strcmp(env, "on") == 0) return GEMM_BF16;
  return r.bf16 >= GEMM_BF16_MIN_RATIO * r.fp32 && r.bf16 > 0 ? GEMM_BF16 : GEMM_FP32;
}

gemm_kind gemm_bf16_kind(void) {
  const char *env = envknob_get(ENV_CPU_BF16);
  int has = gemm_bf16_cpu_has();
  /* the probe only where its answer matters */
  gemm_bf16_rates r = has && strcmp(env, "auto") == 0 ? gemm_bf16_rates_of_cpu() : (gemm_bf16_rates){0, 0};
  return gemm_bf16_choose(env, has, r);
}

const char *gemm_kind_name(gemm_kind k) {
  return k == GEMM_BF16 ? "bf16 (AVX512-BF16)" : k == GEMM_BF16_EMULATED ? "bf16 (emulated)" : "fp32";
}

void gemm_bf16_set_active(gemm_kind k) { active = k; }
gemm_kind gemm_bf16_active(void) { return active; }

/* The contract on any CPU: op(A) and op(B) rounded to bf16 into compact copies, then cblas_sgemm. */
static void gemm_emulated(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                          int ldb, float beta, float *C, int ldc) {
  int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  float *a = malloc(((size_t)ar * ac + (size_t)br * bc + 1) * sizeof *a), *b = a + (size_t)ar * ac;
  if (!a) abort();   /* the size of the operands: out of memory */
  for (int r = 0; r < ar; r++)
    for (int c = 0; c < ac; c++) a[(size_t)r * ac + c] = bf16_round(A[(size_t)r * lda + c]);
  for (int r = 0; r < br; r++)
    for (int c = 0; c < bc; c++) b[(size_t)r * bc + c] = bf16_round(B[(size_t)r * ldb + c]);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, a,
              ac > 0 ? ac : 1, b, bc > 0 ? bc : 1, beta, C, ldc);
  free(a);
}

double gemm_bf16_error_bound(int K, double abs_sum) {
  const double u = 1.0 / 256, u32 = 1.0 / 16777216;
  /* roundings on the way to one output: at most one per k (vdpbf16ps adds a pair's two products
   * into the sum), alpha's product and the addition into C once per chunk of KC pairs, beta's term */
  double n = K + 2.0 * (K / (2 * KC) + 1) + 1, gamma = n * u32 / (1 - n * u32);
  return (2 * u + u * u + gamma) * abs_sum;
}

#if GEMM_BF16_X86

/* The packing workspace of the calling thread, grown as needed, never shrunk (its largest product),
 * freed when the thread exits (a device's stream thread ends with its device). */
static _Thread_local uint32_t *ws;
static _Thread_local size_t ws_words;
static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;

static void ws_key_new(void) { (void)pthread_key_create(&ws_key, free); }

static uint32_t *workspace(size_t words) {
  if (words <= ws_words) return ws;
  free(ws);
  ws = aligned_alloc(64, (words * 4 + 63) & ~(size_t)63);
  ws_words = ws ? words : 0;
  pthread_once(&ws_once, ws_key_new);
  (void)pthread_setspecific(ws_key, ws);
  return ws;
}

/* dst[t] = pair(r0[t], r1[t]) for t < n; r1 NULL: pairs with zero (the padding of an odd K). One
 * conversion of both rows and one permutation that interleaves them. */
BF16_TARGET static void pack_rows(uint32_t *dst, const float *r0, const float *r1, int n) {
  const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int t = 0; t < n; t += 16) {
    __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1);
    __m512 lo = _mm512_maskz_loadu_ps(m, r0 + t);
    __m512 hi = r1 ? _mm512_maskz_loadu_ps(m, r1 + t) : _mm512_setzero_ps();
    __m512i v = _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    _mm512_mask_storeu_epi32(dst + t, m, v);
  }
}

/* dst[kk·stride] = pair(row[2kk], row[2kk+1]) for the K elements of ROW (the last odd one pairs
 * with zero); stride 1 is a plain conversion. Otherwise a scatter, not a vector store read back as
 * words: that would stall on store forwarding (measured 3× slower). */
BF16_TARGET static void pack_pairs(uint32_t *dst, int stride, const float *row, int K) {
  __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   _mm512_set1_epi32(stride));
  for (int k = 0; k < K; k += 32) {
    int n = K - k < 32 ? K - k : 32, np = (n + 1) / 2;
    __mmask16 m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    __mmask16 m1 = n >= 32 ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    __mmask16 mp = np >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << np) - 1);
    __m512 a = _mm512_maskz_loadu_ps(m0, row + k), b = _mm512_maskz_loadu_ps(m1, row + k + 16);
    __m512i w = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    if (stride == 1) _mm512_mask_storeu_epi32(dst + k / 2, mp, w);
    else _mm512_mask_i32scatter_epi32(dst + (size_t)(k / 2) * stride, mp, idx, w, 4);
  }
}

/* The 16×16 transpose of 32-bit words, in registers (four rounds of unpacks and lane shuffles). */
BF16_TARGET static void transpose16(__m512i r[16]) {
  __m512i a[16], b[16], c[16];
  for (int i = 0; i < 8; i++) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) {
      c[8 * i + j] = _mm512_shuffle_i32x4(b[8 * i + j], b[8 * i + j + 4], 0x88);
      c[8 * i + j + 4] = _mm512_shuffle_i32x4(b[8 * i + j], b[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; j++) {
    r[j] = _mm512_shuffle_i32x4(c[j], c[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(c[j], c[j + 8], 0xdd);
  }
}

/* A transposed B's NJ ≤ 16 columns (rows of B, k contiguous) into a panel's [kk][j] words from
 * column 0 of DST: 16 pairs of k of 16 columns at a time, converted and transposed in registers
 * (a scatter of each word measured 2× slower). */
BF16_TARGET static void pack_b_trans16(uint32_t *dst, const float *B, int ldb, int K, int nj) {
  int kp2 = (K + 1) / 2;
  for (int kk0 = 0; kk0 < kp2; kk0 += 16) {
    int k = 2 * kk0, n = K - k < 32 ? K - k : 32, nq = kp2 - kk0 < 16 ? kp2 - kk0 : 16;
    __mmask16 m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    __mmask16 m1 = n >= 32 ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    __m512i r[16];
    for (int t = 0; t < 16; t++) {
      if (t >= nj) {
        r[t] = _mm512_setzero_si512();
        continue;
      }
      const float *row = B + (size_t)t * ldb + k;
      r[t] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, row + 16), _mm512_maskz_loadu_ps(m0, row));
    }
    transpose16(r);
    __mmask16 mj = nj >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nj) - 1);
    for (int q = 0; q < nq; q++) _mm512_mask_storeu_epi32(dst + (size_t)(kk0 + q) * NR, mj, r[q]);
  }
}

/* Panel JP of op(B): NR columns from j0 = JP·NR, KP/2 rows of pairs ([kk][j]), zero past N. */
BF16_TARGET static void pack_b(uint32_t *bp, int tb, const float *B, int ldb, int K, int N, int jp) {
  int j0 = jp * NR, nj = N - j0 < NR ? N - j0 : NR, kp2 = (K + 1) / 2;
  if (nj < NR) memset(bp, 0, (size_t)kp2 * NR * sizeof *bp);
  if (!tb) {
    for (int kk = 0; kk < kp2; kk++) {
      const float *r0 = B + (size_t)(2 * kk) * ldb + j0;
      pack_rows(bp + (size_t)kk * NR, r0, 2 * kk + 1 < K ? r0 + ldb : NULL, nj);
    }
  } else {
    for (int jb = 0; jb < nj; jb += 16) pack_b_trans16(bp + jb, B + (size_t)(j0 + jb) * ldb, ldb, K, nj - jb < 16 ? nj - jb : 16);
  }
}

/* Block IB of op(A): MR rows from i0 = IB·MR, zero past M. Not transposed, row by row ([i][kk]: a
 * plain conversion of each row); transposed, [kk][i] (two rows of A interleaved). a_layout() says
 * where pair kk of row i is. */
typedef struct a_layout {
  size_t si, sk;   /* pair (i, kk) at i·si + kk·sk */
} a_layout;

static a_layout a_layout_of(int ta, int kp2) { return ta ? (a_layout){1, MR} : (a_layout){(size_t)kp2, 1}; }

BF16_TARGET static void pack_a(uint32_t *ap, int ta, const float *A, int lda, int K, int M, int ib) {
  int i0 = ib * MR, mi = M - i0 < MR ? M - i0 : MR, kp2 = (K + 1) / 2;
  if (mi < MR) memset(ap, 0, (size_t)kp2 * MR * sizeof *ap);
  if (!ta) {
    for (int i = 0; i < mi; i++) pack_pairs(ap + (size_t)i * kp2, 1, A + (size_t)(i0 + i) * lda, K);
  } else {
    for (int kk = 0; kk < kp2; kk++) {
      const float *r0 = A + (size_t)(2 * kk) * lda + i0;
      pack_rows(ap + (size_t)kk * MR, r0, 2 * kk + 1 < K ? r0 + lda : NULL, mi);
    }
  }
}

/* One MI×NJ tile (MI ≤ MR, NJ ≤ NR) of C from packed block AP (layout L) and panel BP, over NK
 * pairs of k. Inlined into one copy per layout, so that the transposed layout's offsets are
 * constants. */
BF16_TARGET static inline __attribute__((always_inline)) void tile_impl(float *C, int ldc, const uint32_t *ap,
                                                                        a_layout L, const uint32_t *bp, int nk,
                                                                        int mi, int nj, float alpha, float beta) {
  __m512 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int kk = 0; kk < nk; kk++) {
    __m512bh b0 = (__m512bh)_mm512_load_si512(bp + (size_t)kk * NR);
    __m512bh b1 = (__m512bh)_mm512_load_si512(bp + (size_t)kk * NR + 16);
    const uint32_t *a = ap + kk * L.sk;
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i * L.si]);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  __mmask16 m0 = nj >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nj) - 1);
  __mmask16 m1 = nj >= 32 ? (__mmask16)0xffff : nj > 16 ? (__mmask16)((1u << (nj - 16)) - 1) : 0;
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int i = 0; i < mi; i++) {
    float *c = C + (size_t)i * ldc;
    __m512 r0 = _mm512_mul_ps(va, acc[i][0]), r1 = _mm512_mul_ps(va, acc[i][1]);
    if (beta != 0.0f) {
      r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), r0);
      r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), r1);
    }
    _mm512_mask_storeu_ps(c, m0, r0);
    _mm512_mask_storeu_ps(c + 16, m1, r1);
  }
}

BF16_TARGET static void tile_rows(float *C, int ldc, const uint32_t *ap, size_t si, const uint32_t *bp, int nk, int mi,
                                  int nj, float alpha, float beta) {
  tile_impl(C, ldc, ap, (a_layout){si, 1}, bp, nk, mi, nj, alpha, beta);
}

BF16_TARGET static void tile_pairs(float *C, int ldc, const uint32_t *ap, const uint32_t *bp, int nk, int mi, int nj,
                                   float alpha, float beta) {
  tile_impl(C, ldc, ap, (a_layout){1, MR}, bp, nk, mi, nj, alpha, beta);
}

/* Tile (IB, JP) over pairs [KC0, KC0 + NK) of k. */
BF16_TARGET static void tile(float *C, int ldc, const uint32_t *ap, int ta, int kp2, const uint32_t *bp, int kc0,
                             int nk, int mi, int nj, float alpha, float beta) {
  a_layout L = a_layout_of(ta, kp2);
  if (ta) tile_pairs(C, ldc, ap + kc0 * L.sk, bp + (size_t)kc0 * NR, nk, mi, nj, alpha, beta);
  else tile_rows(C, ldc, ap + kc0 * L.sk, L.si, bp + (size_t)kc0 * NR, nk, mi, nj, alpha, beta);
}

static void gemm_avx512(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc) {
  int kp2 = (K + 1) / 2, nib = (M + MR - 1) / MR, njp = (N + NR - 1) / NR;
  /* A's blocks rounded up to 16 words, so that B's panels start on a 64-byte line (aligned loads) */
  size_t a_words = ((size_t)nib * MR * kp2 + 15) & ~(size_t)15, b_words = (size_t)njp * NR * kp2;
  uint32_t *ap = workspace(a_words + b_words);
  if (!ap) abort();   /* the workspace is the size of the operands: out of memory */
  uint32_t *bp = ap + a_words;
  int par = (double)M * N * (K > 0 ? K : 1) >= PAR_MIN_MACS;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static) nowait
    for (int jp = 0; jp < njp; jp++) pack_b(bp + (size_t)jp * NR * kp2, tb, B, ldb, K, N, jp);
#pragma omp for schedule(static)
    for (int ib = 0; ib < nib; ib++) pack_a(ap + (size_t)ib * MR * kp2, ta, A, lda, K, M, ib);
    /* K in chunks of KC pairs (a B panel's chunk stays in L1), each accumulating into C after the
     * first, which applies beta */
    for (int kc = 0; kc < kp2; kc += KC) {
      int nk = kp2 - kc < KC ? kp2 - kc : KC;
      float bk = kc == 0 ? beta : 1.0f, ak = alpha;
#pragma omp for collapse(2) schedule(dynamic, 4)
      for (int jp = 0; jp < njp; jp++)
        for (int ib = 0; ib < nib; ib++) {
          int i0 = ib * MR, j0 = jp * NR;
          tile(C + (size_t)i0 * ldc + j0, ldc, ap + (size_t)ib * MR * kp2, ta, kp2, bp + (size_t)jp * NR * kp2, kc,
               nk, M - i0 < MR ? M - i0 : MR, N - j0 < NR ? N - j0 : NR, ak, bk);
        }
    }
    if (kp2 == 0) {   /* K = 0: C = beta·C */
#pragma omp for collapse(2) schedule(static)
      for (int jp = 0; jp < njp; jp++)
        for (int ib = 0; ib < nib; ib++) {
          int i0 = ib * MR, j0 = jp * NR;
          tile(C + (size_t)i0 * ldc + j0, ldc, ap, ta, kp2, bp, 0, 0, M - i0 < MR ? M - i0 : MR,
               N - j0 < NR ? N - j0 : NR, alpha, beta);
        }
    }
  }
}

#endif

void gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
#if GEMM_BF16_X86
  if (active == GEMM_BF16) {
    gemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  gemm_emulated(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
