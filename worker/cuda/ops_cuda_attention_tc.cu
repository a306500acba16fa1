/* ops_cuda_attention_tc — the fused causal attention on tensor cores (WMMA, bf16 × bf16 → fp32),
 * the default behind ops_cuda_attention_forward/_backward; ops_cuda_attention.cu holds the plain
 * fp32-FMA kernels, same algorithm, kept as the reference and the fallback (ops_cuda.h says how to
 * pick). Same outputs, same saved lse, so the two are interchangeable even between forward and
 * backward.
 *
 * Layout: a block is 4 warps and owns a tile of 64 rows (queries in the forward and in dQ, keys in
 * dK/dV); warp w owns rows 16w..16w+15. The other operand streams through in tiles of 64 rows. Every
 * product is WMMA 16×16×16 from shared memory (bf16 tiles, rows padded by 8 elements); score tiles,
 * the softmax and the accumulators (O, dK, dV, dQ) stay in shared memory in fp32, each warp on its
 * own rows, so no fragment's register layout is ever assumed: accumulators go through WMMA's
 * own loads and stores, and the elementwise work is done by the warp's lanes on shared memory
 * (two lanes per row, half the columns each, their row max and sum joined by one shuffle).
 * P and dS are rounded to bf16 for the products, as in FlashAttention, and written over the fp32
 * score tile they come from (each lane reads its scores into registers, the warp syncs, then
 * writes): no shared memory of their own. Everything else is fp32. Exponentials are exp2f on
 * scores pre-scaled by log2(e) (one ex2 instruction each); the saved lse stays the natural log.
 *
 *   forward   for each key tile ≤ the query tile: S = Q·Kᵀ; online softmax on the warp's rows
 *             (O rescaled in place); O += P·V. out = O/l, lse = m + log l.
 *   backward  D = rowsum(dO∘O) (ops_cuda_attention.cu's kernel); then dK/dV per key tile over the
 *             query tiles ≥ it (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, P = e^(S·scale − lse), dS = P∘(dP − D);
 *             dV += Pᵀ·dO, dK += dSᵀ·Q), and dQ per query tile over the key tiles ≤ it
 *             (dQ += dS·K): one writer per output, no atomics.
 * Grouped-query attention: query head h reads kv head g = h / (NH/NKV) (rows C + 2·NKV·hs wide);
 * a dK/dV block owns a key tile of kv head g and accumulates over the group's query heads in
 * order, each over its query tiles, so a shared head has one writer and fixed-order sums.
 *
 * Global → shared: 16-byte vectors (a tile row of 64 bf16 is 8 of them, 8 consecutive threads
 * read one row's 128 bytes), issued asynchronously with cp.async on sm_80 and later (LDGSTS; the
 * static check tests/gpu/sass_check.py holds the sm_90 objects to it), so a tile's copy overlaps
 * the products of another:
 *   forward   K and V alternate in single buffers: K(j+1) is copied during softmax(j) and P·V(j),
 *             V(j+1) during Q·K(j+1)ᵀ and softmax(j+1). No second buffer, so the shared memory
 *             (and blocks per SM) stay those of a synchronous kernel.
 *   dK/dV     Q, dO, lse, D of the next query tile double-buffered (two stages).
 *   dQ        K, V of the next key tile double-buffered.
 * The host emulator of tests/gpu/emu models cp.async (a copy lands at its wait) and so checks
 * the waits and barriers of these pipelines.
 *
 * Why one dQ kernel of its own, S and dP computed again there (7 products of 64×64×hs per tile
 * pair where one kernel would do 5), rather than a single backward kernel: dQ needs, per query
 * tile, a sum over key tiles, and the dK/dV kernel visits those in different blocks. Summing them
 * with float atomics is not deterministic (docs/design.md, "Determinism"); handing dS to a second
 * pass (FlashAttention-2's deterministic alternative) moves the same work into memory: a bf16 dS
 * tile per causal tile pair is B·NH·nt(nt+1)/2·8 KiB = 214 MB per layer for GPT-2 124M at B = 16,
 * T = 1024, written once and read once. Per tile pair at head size 64 the recomputation is
 * 2·2·64³ = 1.05 MFLOP (≈ 0.35 µs of one SM's share of the bf16 peak at 40 %) against 16 KiB of
 * dS traffic (≈ 0.45 µs of one SM's share of the H200's 4.8 TB/s): about even, and the scratch
 * would be 6.4 times the 32 MiB workspace (OPS_CUDA_WORKSPACE_MIN). Recomputing keeps the
 * backward at 2 kernels, no scratch, no atomics.
 */
#include "ops_cuda_common.cuh"

#include <type_traits>

#include "ops/docmask.h"
#include "ops/softmax.h"

/* On the GPU: WMMA and cp.async as PTX on shared-memory addresses (sm_80 and later). Under the host
 * emulator of tests/gpu/emu: its WMMA (the C++ API) and its model of cp.async (emu.h). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the tensor-core attention needs sm_80 or later (bf16 WMMA, cp.async)"
#endif
#if defined(FSDP_EMU_H) && !defined(__CUDA_ARCH__)
#define TC_EMU 1
#include <mma.h>
#endif

#define TC_THREADS 128 /* 4 warps */
#define TC_TILE 64     /* rows per block tile and per streamed tile */
#define TC_LDS (TC_TILE + 4) /* row stride of the fp32 score tiles (S, dP) per warp: 16 × 64 */
#define TC_LDB (TC_TILE + 8) /* of the bf16 P, dS tiles, written over the score tile they come from */

/* Shared-memory banks (32 banks of 4 bytes; a warp's 8-byte accesses are served per 16 lanes,
 * 16-byte ones per 8 lanes). Lane l works on row r = l/2 of its warp's 16 rows and on half
 * h = l%2 of the columns, in column pairs (8-byte fp32 reads of S and dP, 4-byte writes of a bf16
 * pair of P or dS); its k-th pair is column c = 32h + 2·((k + h + 2·⌊r/8⌋) mod 16): the lanes'
 * walks are staggered by h + 2·⌊r/8⌋ pairs. Why (n-way: the most distinct words one bank
 * serves in one access):
 *  - S, dP reads: row stride LDS = 68 floats (the padding WMMA's fp32 stores want) is 4 mod 32,
 *    so (r, c) sits in bank pair 2r + c/2 mod 16; a half-warp (r = 0..7 or 8..15, both h) reads
 *    pairs 2r + h + k + const: 16 distinct, conflict-free. Unstaggered (c = 32h + 2k): 2-way; as the
 *    kernels had it, one float per access at c = 32h + i: 4-way (rows r, r + 8 and both halves).
 *  - P, dS pair writes: row stride LDB = 72 bf16 = 36 words, bank 4r + 16h + ((k + h + 2⌊r/8⌋)
 *    mod 16) mod 32: 32 distinct, conflict-free (the stagger by ⌊r/8⌋ is what separates rows r and
 *    r + 8; without it, 2-way; the former 2-byte stores: 4-way).
 *  - lse, D of the columns (dK/dV): 4 distinct words per access (h, ⌊r/8⌋), 4 distinct banks.
 *  - accumulators (O, dK, dV, dQ; row stride LDA = hs + 4 ≡ 4 mod 32) are scaled and zeroed 16
 *    bytes at a time, quad q of a lane's half at 4·((q + 4h) mod hs/8): a quarter-warp (rows r..r+3,
 *    both h) hits 8 distinct 4-bank groups r + q + 4h mod 8, conflict-free (unrotated: 2-way; one
 *    float at a time as before: 4-way). The final 16-byte stores read them 2-way, once per block.
 * The WMMA loads and stores (bf16 rows padded by 8 elements, fp32 by 4) are the library's. */
template <int D> struct tc_cfg {
  static constexpr int LDH = D + 8;             /* bf16 tiles (Q, K, V, dO): 64 × D */
  static constexpr int LDS = TC_LDS;
  static constexpr int LDB = TC_LDB;
  static constexpr int LDA = D + 4;             /* fp32 accumulators per warp: 16 × D */
  static constexpr size_t tile_h = (size_t)TC_TILE * LDH * 2;
  static constexpr size_t warp_s = (size_t)16 * LDS * 4;
  static constexpr size_t warp_a = (size_t)16 * LDA * 4;
  static constexpr size_t vec = (size_t)TC_TILE * 4; /* lse or D of a query tile */
  /* forward: Q, K, V; per warp S (then P), O */
  static constexpr size_t fwd_smem = 3 * tile_h + 4 * (warp_s + warp_a);
  /* dK/dV: K, V; two stages of Q, dO, lse, D; per warp Sᵀ (then P), dPᵀ (then dS), dK, dV */
  static constexpr size_t dkv_stage = 2 * tile_h + 2 * vec;
  static constexpr size_t dkv_smem = 2 * tile_h + 2 * dkv_stage + 4 * (2 * warp_s + 2 * warp_a);
  /* dQ: Q, dO; two stages of K, V; per warp S, dP (then dS), dQ */
  static constexpr size_t dq_smem = 2 * tile_h + 2 * (2 * tile_h) + 4 * (2 * warp_s + warp_a);
  static_assert(D % 16 == 0, "WMMA tiles");
  static_assert(tile_h % 128 == 0 && warp_s % 128 == 0 && warp_a % 128 == 0 && vec % 128 == 0,
                "every region keeps the 32-byte alignment WMMA pointers need (and 16 for the copies)");
  static_assert((size_t)16 * LDB * 2 <= warp_s, "P / dS fit in the score tile they replace");
  static_assert(fwd_smem <= 232448 && dkv_smem <= 232448 && dq_smem <= 232448,
                "within the 227 KB of shared memory a block may opt in to (sm_90)");
};

/* ---- asynchronous global → shared copies ---- */

/* BYTES from global to shared memory: 16 around L1 (cp.async.cg, which takes 16 only), 4 through
 * it (cp.async.ca). */
template <int BYTES> __device__ __forceinline__ void tc_cp(void *dst, const void *src) {
#ifdef TC_EMU
  emu_cp_async(dst, src, BYTES);
#else
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  const size_t g = __cvta_generic_to_global(src);
  if (BYTES == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(g) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(g), "n"(BYTES) : "memory");
#endif
}
/* Close this thread's group of copies issued since the last commit (possibly none). */
__device__ __forceinline__ void tc_cp_commit() {
#ifdef TC_EMU
  emu_cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* Wait until at most N of this thread's newest groups are in flight; a __syncthreads after it
 * makes every thread's landed copies visible to the block. */
template <int N> __device__ __forceinline__ void tc_cp_wait() {
#ifdef TC_EMU
  emu_cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Issue the copy of rows [row0, row0 + 64) × columns [0, D) of a bf16 matrix with row stride ld
 * (16-byte aligned rows) into a shared tile of row stride LDH; rows ≥ T are zeroed now. */
template <int D>
__device__ __forceinline__ void tc_load(ops_bf16 *__restrict__ dst, const ops_bf16 *__restrict__ src, int64_t ld,
                                        int row0, int T) {
  constexpr int CH = D / 8; /* 16-byte vectors per row */
#pragma unroll
  for (int k = 0; k < TC_TILE * CH / TC_THREADS; k++) {
    const int i = threadIdx.x + k * TC_THREADS, r = i / CH, c = (i % CH) * 8, t = row0 + r;
    ops_bf16 *d = dst + r * tc_cfg<D>::LDH + c;
    if (t < T) tc_cp<16>(d, src + (int64_t)t * ld + c);
    else *reinterpret_cast<int4 *>(d) = make_int4(0, 0, 0, 0);
  }
}

/* Issue the copy of lse[row0..row0+64) (threads 0..63) and dvec[row0..row0+64) (threads 64..127);
 * rows ≥ T are zeroed now. */
__device__ __forceinline__ void tc_load_rows(float *sL, float *sD, const float *L, const float *Dv, int row0, int T) {
  const int i = threadIdx.x & (TC_TILE - 1);
  float *d = threadIdx.x < TC_TILE ? sL + i : sD + i;
  if (row0 + i < T) tc_cp<4>(d, (threadIdx.x < TC_TILE ? L : Dv) + row0 + i);
  else *d = 0.0f;
}

/* ---- WMMA 16×16×16 (bf16 × bf16 → fp32) on shared memory ----
 * The fragments' register layout stays the instruction's own (none is assumed). The C++ API
 * (mma.h) addresses memory generically, so its loads compile to four generic 32-bit loads a
 * fragment; PTX's wmma.load with the .shared state space compiles to one ldmatrix (LDSM) for a
 * bf16 fragment, and to shared loads and stores (LDS, STS) for fp32 ones. The PTX is the API's
 * own (nvcc -ptx of the API version gives the same wmma instructions, operands and order) with
 * .shared added; the emulator runs the API form. */
#ifdef TC_EMU
namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> tc_frag_a;
template <bool TRANS>
using tc_frag_b = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                                 typename std::conditional<TRANS, wmma::col_major, wmma::row_major>::type>;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_frag_c;
__device__ __forceinline__ void tc_load_a(tc_frag_a &f, const ops_bf16 *p, int ld) {
  wmma::load_matrix_sync(f, p, ld);
}
template <bool TRANS> __device__ __forceinline__ void tc_load_b(tc_frag_b<TRANS> &f, const ops_bf16 *p, int ld) {
  wmma::load_matrix_sync(f, p, ld);
}
__device__ __forceinline__ void tc_load_c(tc_frag_c &f, const float *p, int ld) {
  wmma::load_matrix_sync(f, p, ld, wmma::mem_row_major);
}
__device__ __forceinline__ void tc_zero_c(tc_frag_c &f) { wmma::fill_fragment(f, 0.0f); }
__device__ __forceinline__ void tc_store_c(float *p, const tc_frag_c &f, int ld) {
  wmma::store_matrix_sync(p, f, ld, wmma::mem_row_major);
}
template <bool TRANS>
__device__ __forceinline__ void tc_mma(tc_frag_c &c, const tc_frag_a &a, const tc_frag_b<TRANS> &b) {
  wmma::mma_sync(c, a, b, c);
}
#else
struct tc_frag_a {
  uint32_t x[4]; /* 8 bf16 */
};
template <bool TRANS> struct tc_frag_b {
  uint32_t x[4];
};
struct tc_frag_c {
  float x[8];
};
__device__ __forceinline__ unsigned tc_saddr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void tc_load_a(tc_frag_a &f, const ops_bf16 *p, int ld) {
  asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16 {%0,%1,%2,%3}, [%4], %5;\n"
               : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3])
               : "r"(tc_saddr(p)), "r"(ld)
               : "memory");
}
/* B given as Bᵀ row-major (TRANS: B column-major) or B row-major */
template <bool TRANS> __device__ __forceinline__ void tc_load_b(tc_frag_b<TRANS> &f, const ops_bf16 *p, int ld) {
  if (TRANS)
    asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3])
                 : "r"(tc_saddr(p)), "r"(ld)
                 : "memory");
  else
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3])
                 : "r"(tc_saddr(p)), "r"(ld)
                 : "memory");
}
__device__ __forceinline__ void tc_load_c(tc_frag_c &f, const float *p, int ld) {
  asm volatile("wmma.load.c.sync.aligned.row.m16n16k16.shared.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;\n"
               : "=f"(f.x[0]), "=f"(f.x[1]), "=f"(f.x[2]), "=f"(f.x[3]), "=f"(f.x[4]), "=f"(f.x[5]), "=f"(f.x[6]),
                 "=f"(f.x[7])
               : "r"(tc_saddr(p)), "r"(ld)
               : "memory");
}
__device__ __forceinline__ void tc_zero_c(tc_frag_c &f) {
#pragma unroll
  for (int i = 0; i < 8; i++) f.x[i] = 0.0f;
}
__device__ __forceinline__ void tc_store_c(float *p, const tc_frag_c &f, int ld) {
  asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;\n" ::"r"(
                   tc_saddr(p)),
               "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]), "f"(f.x[5]), "f"(f.x[6]), "f"(f.x[7]),
               "r"(ld)
               : "memory");
}
#define TC_MMA(lay)                                                                                                  \
  asm volatile("wmma.mma.sync.aligned.row." lay ".m16n16k16.f32.bf16.bf16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, "          \
               "{%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3,%4,%5,%6,%7};\n"                                   \
               : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3]), "+f"(c.x[4]), "+f"(c.x[5]), "+f"(c.x[6]),   \
                 "+f"(c.x[7])                                                                                        \
               : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]),         \
                 "r"(b.x[3]))
template <bool TRANS>
__device__ __forceinline__ void tc_mma(tc_frag_c &c, const tc_frag_a &a, const tc_frag_b<TRANS> &b) {
  if (TRANS) TC_MMA("col");
  else TC_MMA("row");
}
#undef TC_MMA
#endif

/* C (16 × 16·NB, fp32, ldc) = A (16 × 16·KB, bf16 row-major, lda) · B, where B is 16·KB × 16·NB and
 * given either as Bᵀ stored row-major (TRANS: B's column j is row j of the buffer) or as B
 * row-major. ACC: add to what C holds. One warp; every pointer into shared memory. */
template <int KB, int NB, bool TRANS, bool ACC>
__device__ __forceinline__ void warp_gemm(float *c, int ldc, const ops_bf16 *a, int lda, const ops_bf16 *b, int ldb) {
  for (int n = 0; n < NB; n++) {
    tc_frag_c acc;
    if (ACC) tc_load_c(acc, c + n * 16, ldc);
    else tc_zero_c(acc);
    for (int k = 0; k < KB; k++) {
      tc_frag_a fa;
      tc_frag_b<TRANS> fb;
      tc_load_a(fa, a + k * 16, lda);
      tc_load_b<TRANS>(fb, TRANS ? b + (size_t)n * 16 * ldb + k * 16 : b + (size_t)k * 16 * ldb + n * 16, ldb);
      tc_mma<TRANS>(acc, fa, fb);
    }
    tc_store_c(c + n * 16, acc, ldc);
  }
}

/* ---- the lanes' view of the per-warp tiles (bank layout: the comment above tc_cfg) ---- */

#define TC_PAIRS 16 /* column pairs of a lane's half of a 64-column score row */

/* The column of the k-th pair of lane (row r, half) in a score tile (the stagger: above tc_cfg). */
__device__ __forceinline__ int tc_col(int r, int half, int k) {
  return 32 * half + 2 * ((k + half + 2 * (r >> 3)) & (TC_PAIRS - 1));
}

/* Two fp32 → two bf16 (nearest even) in one 32-bit word, low column first. */
__device__ __forceinline__ uint32_t tc_pack(float a, float b) {
  const ops_bf16 h[2] = {tobf(a), tobf(b)};
  uint32_t w;
  memcpy(&w, h, 4);
  return w;
}

/* fn(x) on the lane's half of accumulator row r (D/2 floats, 16 bytes at a time), quads
 * rotated by 4·half (bank layout above). */
template <int D, class F> __device__ __forceinline__ void tc_acc_row(float *row, int half, F fn) {
  constexpr int NQ = D / 8; /* quads per half row */
#pragma unroll
  for (int k = 0; k < NQ; k++) {
    float *p = row + half * (D / 2) + 4 * ((k + 4 * half) % NQ);
    float4 v = *reinterpret_cast<float4 *>(p);
    fn(v);
    *reinterpret_cast<float4 *>(p) = v;
  }
}

/* out[0..D/2) (bf16, 16-byte aligned) = scale · the lane's half of accumulator row r, 16 bytes a store. */
template <int D>
__device__ __forceinline__ void tc_store_row(ops_bf16 *__restrict__ out, const float *row, int half, float scale) {
#pragma unroll
  for (int k = 0; k < D / 16; k++) {
    const float *p = row + half * (D / 2) + 8 * k;
    float f[8];
    ld4f(f, p);
    ld4f(f + 4, p + 4);
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] *= scale;
    st8(out + half * (D / 2) + 8 * k, f);
  }
}

/* The first key query row QI of row b sees (ops/docmask.h); rows past T (a tile's padding): 0. */
__device__ __forceinline__ int tc_row_lo(const int32_t *seg, int window, int b, int T, int qi) {
  return qi < T ? attn_key_lo(seg, window, b, T, qi) : 0;
}

/* ---- forward ---- */

/* Online softmax of row r's columns [32·half, 32·half + 32) of score tile sS (unscaled scores),
 * keys k0.. against query qi: updates the running max m and sum l (base 2), writes P (bf16) over
 * the warp's score tile, returns the factor O must be rescaled by. Keys outside [lo, qi] are masked;
 * a row may see none of a tile's (documents, a window): its max stays −inf, its P 0 and its
 * rescaling 0 until it sees one. Warp-collective. */
template <int D>
__device__ __forceinline__ float tc_softmax_tile(float *sS, int r, int half, int k0, int qi, int T, float scale2,
                                                 float *m, float *l, const int32_t *seg, int window) {
  using K = tc_cfg<D>;
  const int lo = tc_row_lo(seg, window, (int)blockIdx.z, T, qi); /* taken here: no register held over the loop */
  float2 s[TC_PAIRS];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < TC_PAIRS; k++) {
    const int c = tc_col(r, half, k), kj = k0 + c;
    s[k] = *reinterpret_cast<const float2 *>(sS + r * K::LDS + c);
    s[k].x = (kj <= qi && kj >= lo && kj < T) ? s[k].x * scale2 : -INFINITY;
    s[k].y = (kj + 1 <= qi && kj + 1 >= lo && kj + 1 < T) ? s[k].y * scale2 : -INFINITY;
    mx = fmaxf(mx, fmaxf(s[k].x, s[k].y));
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  const float mnew = fmaxf(*m, mx);
  const float corr = *m == -INFINITY ? 0.0f : exp2f(*m - mnew);
  float sum = 0.0f;
  uint32_t p2[TC_PAIRS];
#pragma unroll
  for (int k = 0; k < TC_PAIRS; k++) {
    const float p0 = s[k].x == -INFINITY ? 0.0f : exp2f(s[k].x - mnew);
    const float p1 = s[k].y == -INFINITY ? 0.0f : exp2f(s[k].y - mnew);
    p2[k] = tc_pack(p0, p1);
    sum += p0; /* unrounded, as FlashAttention: lse stays fp32-accurate for the backward */
    sum += p1;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  *l = *l * corr + sum;
  *m = mnew;
  __syncwarp(); /* every lane holds its scores: P may overwrite the tile */
  ops_bf16 *sP = (ops_bf16 *)sS;
#pragma unroll
  for (int k = 0; k < TC_PAIRS; k++) *reinterpret_cast<uint32_t *>(sP + r * K::LDB + tc_col(r, half, k)) = p2[k];
  return corr;
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
    attention_tc_forward_kernel(ops_bf16 *__restrict__ out, float *__restrict__ lse, const ops_bf16 *__restrict__ qkv,
                                int T, int C, int NH, int NKV, float scale, const int32_t *__restrict__ seg,
                                int window) {
  using K = tc_cfg<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  ops_bf16 *sQ = (ops_bf16 *)smem, *sK = (ops_bf16 *)(smem + K::tile_h), *sV = (ops_bf16 *)(smem + 2 * K::tile_h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = smem + 3 * K::tile_h + warp * (K::warp_s + K::warp_a);
  float *sS = (float *)wbase, *sO = (float *)(wbase + K::warp_s);
  const ops_bf16 *sP = (const ops_bf16 *)sS;
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z; /* longest tiles first */
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)(h / (NH / NKV)) * D, *v = k + (int64_t)NKV * D;
  const int q0 = qt * TC_TILE;
  const int r = lane >> 1, half = lane & 1; /* this lane's row of the warp's 16, and its half of the columns */
  const int qi = q0 + warp * 16 + r;
  const int kt0 = tc_row_lo(seg, window, b, T, q0) / TC_TILE; /* no row of the tile sees a key before */

  /* copy groups, in order: {Q, K(kt0)}, {V(kt0)}, then per key tile j: {K(j+1)}, {V(j+1)} (empty past the last) */
  tc_load<D>(sQ, q, C3, q0, T);
  tc_load<D>(sK, k, C3, kt0 * TC_TILE, T);
  tc_cp_commit();
  tc_load<D>(sV, v, C3, kt0 * TC_TILE, T);
  tc_cp_commit();
  tc_acc_row<D>(sO + r * K::LDA, half, [](float4 &x) { x = make_float4(0.0f, 0.0f, 0.0f, 0.0f); });
  /* the softmax in base 2: scores pre-scaled by scale·log2(e), so every e^x is one exp2f (ex2) */
  const float scale2 = scale * OPS_LOG2E;
  float m = -INFINITY, l = 0.0f;

  for (int kt = kt0; kt <= qt; kt++) {
    tc_cp_wait<1>(); /* all but V(kt): K(kt) (and Q) have landed */
    __syncthreads();
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sS, K::LDS, sQ + warp * 16 * K::LDH, K::LDH, sK, K::LDH);
    __syncthreads(); /* every warp is done with K(kt) */
    if (kt < qt) tc_load<D>(sK, k, C3, (kt + 1) * TC_TILE, T);
    tc_cp_commit();
    const float corr = tc_softmax_tile<D>(sS, r, half, kt * TC_TILE, qi, T, scale2, &m, &l, seg, window);
    tc_acc_row<D>(sO + r * K::LDA, half, [corr](float4 &x) { x.x *= corr, x.y *= corr, x.z *= corr, x.w *= corr; });
    tc_cp_wait<1>(); /* all but K(kt+1): V(kt) has landed */
    __syncthreads();
    warp_gemm<TC_TILE / 16, D / 16, false, true>(sO, K::LDA, sP, K::LDB, sV, K::LDH);
    __syncthreads(); /* every warp is done with V(kt) */
    if (kt < qt) tc_load<D>(sV, v, C3, (kt + 1) * TC_TILE, T);
    tc_cp_commit();
  }
  if (qi < T) {
    tc_store_row<D>(out + ((int64_t)b * T + qi) * C + (int64_t)h * D, sO + r * K::LDA, half, 1.0f / l);
    if (half == 0) lse[((int64_t)b * NH + h) * T + qi] = (m + log2f(l)) * OPS_LN2; /* natural, as saved */
  }
}

/* ---- backward ---- */

/* P and dS of row r's column pairs from the warp's score tile sS and dP tile sdP (unscaled S):
 * p = 2^(s·scale2 − lse2(col)), ds = p·(dp − dvec(col)), where ok(col) says whether the pair's
 * element is inside the causal mask and T; written as bf16 over sS (P, if WANT_P) and sdP (dS).
 * Warp-collective. */
template <bool WANT_P, class LF, class DF, class OK>
__device__ __forceinline__ void tc_p_ds(float *sS, float *sdP, int r, int half, float scale2, LF lse2, DF dvec,
                                        OK ok) {
  uint32_t p2[TC_PAIRS], ds2[TC_PAIRS];
#pragma unroll
  for (int k = 0; k < TC_PAIRS; k++) {
    const int c = tc_col(r, half, k);
    const float2 s = *reinterpret_cast<const float2 *>(sS + r * TC_LDS + c);
    const float2 dp = *reinterpret_cast<const float2 *>(sdP + r * TC_LDS + c);
    const float p0 = ok(c) ? exp2f(s.x * scale2 - lse2(c)) : 0.0f;
    const float p1 = ok(c + 1) ? exp2f(s.y * scale2 - lse2(c + 1)) : 0.0f;
    p2[k] = tc_pack(p0, p1);
    ds2[k] = tc_pack(p0 * (dp.x - dvec(c)), p1 * (dp.y - dvec(c + 1)));
  }
  __syncwarp(); /* every lane holds its scores: P and dS may overwrite the tiles */
  ops_bf16 *sP = (ops_bf16 *)sS, *sdS = (ops_bf16 *)sdP;
#pragma unroll
  for (int k = 0; k < TC_PAIRS; k++) {
    const int c = tc_col(r, half, k);
    if (WANT_P) *reinterpret_cast<uint32_t *>(sP + r * TC_LDB + c) = p2[k];
    *reinterpret_cast<uint32_t *>(sdS + r * TC_LDB + c) = ds2[k];
  }
  __syncwarp();
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
    attention_tc_dkv_kernel(ops_bf16 *__restrict__ dqkv, const ops_bf16 *__restrict__ dout,
                            const ops_bf16 *__restrict__ qkv, const float *__restrict__ lse,
                            const float *__restrict__ dvec, int T, int C, int NH, int NKV, float scale,
                            const int32_t *__restrict__ seg, int window) {
  using K = tc_cfg<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  ops_bf16 *sK = (ops_bf16 *)smem, *sV = (ops_bf16 *)(smem + K::tile_h);
  unsigned char *stage0 = smem + 2 * K::tile_h; /* stage s at stage0 + s·dkv_stage: Q, dO, lse, D */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = stage0 + 2 * K::dkv_stage + warp * (2 * K::warp_s + 2 * K::warp_a);
  float *sS = (float *)wbase, *sdP = (float *)(wbase + K::warp_s);
  float *sdK = (float *)(wbase + 2 * K::warp_s), *sdV = sdK + 16 * K::LDA;
  const ops_bf16 *sP = (const ops_bf16 *)sS, *sdS = (const ops_bf16 *)sdP;
  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, nqt = gridDim.x, rep = NH / NKV;
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)g * D, *v = k + (int64_t)NKV * D;
  const int k0 = kt * TC_TILE;
  int nq = 1; /* the query tiles from kt on that see a key of this tile: until one whose first row's lo is past it */
  while (kt + nq < nqt && tc_row_lo(seg, window, b, T, (kt + nq) * TC_TILE) < k0 + TC_TILE) nq++;
  const int steps = rep * nq; /* step i: head g·rep + i/nq, query tile kt + i%nq */
  const int r = lane >> 1, half = lane & 1;
  const int kj = k0 + warp * 16 + r; /* this lane's key row */
  const int qend = kj < T ? attn_query_end(seg, window, b, T, kj) : 0; /* queries kj .. qend − 1 see it */
  const float scale2 = scale * OPS_LOG2E;

  /* step i's Q, dO, lse, D into stage i % 2 */
  auto issue = [&](int i) {
    const int h = g * rep + i / nq, q0 = (kt + i % nq) * TC_TILE;
    unsigned char *st = stage0 + (i & 1) * K::dkv_stage;
    tc_load<D>((ops_bf16 *)st, qkv + (int64_t)b * T * C3 + (int64_t)h * D, C3, q0, T);
    tc_load<D>((ops_bf16 *)(st + K::tile_h), dout + (int64_t)b * T * C + (int64_t)h * D, C, q0, T);
    tc_load_rows((float *)(st + 2 * K::tile_h), (float *)(st + 2 * K::tile_h + K::vec),
                 lse + ((int64_t)b * NH + h) * T, dvec + ((int64_t)b * NH + h) * T, q0, T);
  };
  tc_load<D>(sK, k, C3, k0, T);
  tc_load<D>(sV, v, C3, k0, T);
  issue(0);
  tc_cp_commit();
  tc_acc_row<D>(sdK + r * K::LDA, half, [](float4 &x) { x = make_float4(0.0f, 0.0f, 0.0f, 0.0f); });
  tc_acc_row<D>(sdV + r * K::LDA, half, [](float4 &x) { x = make_float4(0.0f, 0.0f, 0.0f, 0.0f); });

  for (int i = 0; i < steps; i++) { /* the group's query heads in order, each over its query tiles */
    if (i + 1 < steps) issue(i + 1);
    tc_cp_commit();
    tc_cp_wait<1>(); /* all but step i + 1's copies: step i's have landed */
    __syncthreads();
    const unsigned char *st = stage0 + (i & 1) * K::dkv_stage;
    const ops_bf16 *sQ = (const ops_bf16 *)st, *sdO = (const ops_bf16 *)(st + K::tile_h);
    const float *sL = (const float *)(st + 2 * K::tile_h), *sD = sL + TC_TILE;
    const int q0 = (kt + i % nq) * TC_TILE;
    /* Sᵀ (16 keys × 64 queries) = K_w·Qᵀ; dPᵀ = V_w·dOᵀ */
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sS, K::LDS, sK + warp * 16 * K::LDH, K::LDH, sQ, K::LDH);
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sdP, K::LDS, sV + warp * 16 * K::LDH, K::LDH, sdO, K::LDH);
    __syncwarp();
    tc_p_ds<true>(
        sS, sdP, r, half, scale2, [&](int c) { return sL[c] * OPS_LOG2E; }, [&](int c) { return sD[c]; },
        [&](int c) { return q0 + c >= kj && q0 + c < qend; });
    /* dV_w += Pᵀ·dO; dK_w += dSᵀ·Q (scaled at the end) */
    warp_gemm<TC_TILE / 16, D / 16, false, true>(sdV, K::LDA, sP, K::LDB, sdO, K::LDH);
    warp_gemm<TC_TILE / 16, D / 16, false, true>(sdK, K::LDA, sdS, K::LDB, sQ, K::LDH);
    __syncthreads(); /* every warp is done with stage i before step i + 2's copies go there */
  }
  if (kj < T) {
    ops_bf16 *dkrow = dqkv + ((int64_t)b * T + kj) * C3 + C + (int64_t)g * D;
    tc_store_row<D>(dkrow, sdK + r * K::LDA, half, scale);
    tc_store_row<D>(dkrow + (int64_t)NKV * D, sdV + r * K::LDA, half, 1.0f);
  }
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
    attention_tc_dq_kernel(ops_bf16 *__restrict__ dqkv, const ops_bf16 *__restrict__ dout,
                           const ops_bf16 *__restrict__ qkv, const float *__restrict__ lse,
                           const float *__restrict__ dvec, int T, int C, int NH, int NKV, float scale,
                           const int32_t *__restrict__ seg, int window) {
  using K = tc_cfg<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  ops_bf16 *sQ = (ops_bf16 *)smem, *sdO = (ops_bf16 *)(smem + K::tile_h);
  unsigned char *stage0 = smem + 2 * K::tile_h; /* stage s at stage0 + s·2·tile_h: K, V */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = stage0 + 4 * K::tile_h + warp * (2 * K::warp_s + K::warp_a);
  float *sS = (float *)wbase, *sdP = (float *)(wbase + K::warp_s), *sdQ = (float *)(wbase + 2 * K::warp_s);
  const ops_bf16 *sdS = (const ops_bf16 *)sdP;
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z; /* longest first */
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)(h / (NH / NKV)) * D, *v = k + (int64_t)NKV * D;
  const ops_bf16 *dO = dout + (int64_t)b * T * C + (int64_t)h * D;
  const int q0 = qt * TC_TILE;
  const int r = lane >> 1, half = lane & 1;
  const int qi = q0 + warp * 16 + r, lo = tc_row_lo(seg, window, b, T, qi); /* this lane's query row, its first key */
  const int kt0 = tc_row_lo(seg, window, b, T, q0) / TC_TILE; /* no row of the tile sees a key before */
  const float Lq = qi < T ? lse[((int64_t)b * NH + h) * T + qi] * OPS_LOG2E : 0.0f; /* base 2, for exp2f */
  const float Dq = qi < T ? dvec[((int64_t)b * NH + h) * T + qi] : 0.0f;
  const float scale2 = scale * OPS_LOG2E;

  tc_load<D>(sQ, q, C3, q0, T);
  tc_load<D>(sdO, dO, C, q0, T);
  unsigned char *first = stage0 + (kt0 & 1) * 2 * K::tile_h; /* key tile kt lives in stage kt & 1 */
  tc_load<D>((ops_bf16 *)first, k, C3, kt0 * TC_TILE, T);
  tc_load<D>((ops_bf16 *)(first + K::tile_h), v, C3, kt0 * TC_TILE, T);
  tc_cp_commit();
  tc_acc_row<D>(sdQ + r * K::LDA, half, [](float4 &x) { x = make_float4(0.0f, 0.0f, 0.0f, 0.0f); });

  for (int kt = kt0; kt <= qt; kt++) {
    if (kt < qt) {
      unsigned char *nx = stage0 + ((kt + 1) & 1) * 2 * K::tile_h;
      tc_load<D>((ops_bf16 *)nx, k, C3, (kt + 1) * TC_TILE, T);
      tc_load<D>((ops_bf16 *)(nx + K::tile_h), v, C3, (kt + 1) * TC_TILE, T);
    }
    tc_cp_commit();
    tc_cp_wait<1>(); /* all but key tile kt + 1's copies: tile kt's have landed */
    __syncthreads();
    const ops_bf16 *sK = (const ops_bf16 *)(stage0 + (kt & 1) * 2 * K::tile_h), *sV = sK + K::tile_h / 2;
    const int k0 = kt * TC_TILE;
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sS, K::LDS, sQ + warp * 16 * K::LDH, K::LDH, sK, K::LDH);
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sdP, K::LDS, sdO + warp * 16 * K::LDH, K::LDH, sV, K::LDH);
    __syncwarp();
    tc_p_ds<false>(
        sS, sdP, r, half, scale2, [&](int) { return Lq; }, [&](int) { return Dq; },
        [&](int c) { return qi >= k0 + c && qi < T && k0 + c < T && k0 + c >= lo; });
    warp_gemm<TC_TILE / 16, D / 16, false, true>(sdQ, K::LDA, sdS, K::LDB, sK, K::LDH);
    __syncthreads(); /* every warp is done with tile kt before tile kt + 2's copies go there */
  }
  if (qi < T) tc_store_row<D>(dqkv + ((int64_t)b * T + qi) * C3 + (int64_t)h * D, sdQ + r * K::LDA, half, scale);
}

/* ---- host side (called by ops_cuda_attention.cu after it checked the arguments) ---- */

template <int D>
static fsdp_status tc_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH, int NKV,
                              const int32_t *seg, int window, const ops_cuda_ctx *ctx) {
  static const char *what = "attention_forward (tensor cores)";
  static ops_smem_once once;
  TRY(ops_smem_opt_in(&once, attention_tc_forward_kernel<D>, tc_cfg<D>::fwd_smem, ctx, what));
  dim3 grid((T + TC_TILE - 1) / TC_TILE, NH, B);
  attention_tc_forward_kernel<D><<<grid, TC_THREADS, tc_cfg<D>::fwd_smem, ctx->stream>>>(out, lse, qkv, T, C, NH,
                                                                                          NKV, attn_scale(D), seg,
                                                                                          window);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

template <int D>
static fsdp_status tc_backward(ops_bf16 *dqkv, const ops_bf16 *dout, const ops_bf16 *qkv, const float *lse,
                               const float *dvec, int B, int T, int C, int NH, int NKV, const int32_t *seg,
                               int window, const ops_cuda_ctx *ctx) {
  static const char *what = "attention_backward (tensor cores)";
  static ops_smem_once once_dkv, once_dq;
  TRY(ops_smem_opt_in(&once_dkv, attention_tc_dkv_kernel<D>, tc_cfg<D>::dkv_smem, ctx, what));
  TRY(ops_smem_opt_in(&once_dq, attention_tc_dq_kernel<D>, tc_cfg<D>::dq_smem, ctx, what));
  const int nt = (T + TC_TILE - 1) / TC_TILE;
  attention_tc_dkv_kernel<D><<<dim3(nt, NKV, B), TC_THREADS, tc_cfg<D>::dkv_smem, ctx->stream>>>(
      dqkv, dout, qkv, lse, dvec, T, C, NH, NKV, attn_scale(D), seg, window);
  LAUNCH_CHECK("attention_backward (tensor cores, dk, dv)");
  attention_tc_dq_kernel<D><<<dim3(nt, NH, B), TC_THREADS, tc_cfg<D>::dq_smem, ctx->stream>>>(
      dqkv, dout, qkv, lse, dvec, T, C, NH, NKV, attn_scale(D), seg, window);
  LAUNCH_CHECK("attention_backward (tensor cores, dq)");
  return FSDP_OK;
}

fsdp_status ops_attention_tc_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH,
                                     int NKV, const int32_t *seg, int window, const ops_cuda_ctx *ctx) {
  return C / NH == 64 ? tc_forward<64>(out, lse, qkv, B, T, C, NH, NKV, seg, window, ctx)
                      : tc_forward<128>(out, lse, qkv, B, T, C, NH, NKV, seg, window, ctx);
}

fsdp_status ops_attention_tc_backward(ops_bf16 *dqkv, const ops_bf16 *dout, const ops_bf16 *qkv, const float *lse,
                                      const float *dvec, int B, int T, int C, int NH, int NKV, const int32_t *seg,
                                      int window, const ops_cuda_ctx *ctx) {
  return C / NH == 64 ? tc_backward<64>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, NKV, seg, window, ctx)
                      : tc_backward<128>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, NKV, seg, window, ctx);
}
