/* emu.cpp — the host side of the kernel emulator: one ucontext coroutine per CUDA thread, blocks run
 * one after another; __syncthreads waits for every live thread of the block, a shuffle for every
 * live lane of the warp. The CUDA runtime calls the kernels and gpu_check make are host memory
 * operations; cuBLASLt is a naive fp32 GEMM that honours the descriptors (transposes, leading
 * dimensions, D type, beta, BIAS, GELU_AUX and DGELU epilogues), refuses GELU_AUX and DGELU when the
 * aux leading dimension is not a multiple of 8, and finds no algorithm for BIAS when m is not a
 * multiple of 8, as the library may (so the callers' fallbacks run); with EMU_LT_REFUSE_EPILOGUES set,
 * cublasLtMatmul refuses (NOT_SUPPORTED) every epilogue but the default that its heuristic offered, as
 * the library may at run time; emu_lt_epilogue_runs counts the
 * GEMMs run with each epilogue, so a check can tell the fused path from its fallback. cp.async copies
 * land at their wait (emu.h). Checks the kernels' indexing, masks and synchronization without a GPU;
 * says nothing about speed, shared-memory limits or the real library. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <vector>

#include "emu.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;
unsigned char *emu_dyn_smem;

enum { RUN, AT_BAR, AT_WARP, DONE };
struct ECopy {
  void *dst;
  unsigned char data[16];
  int bytes;
};
struct EThread {
  ucontext_t ctx;
  int state;
  int pred;
  char slot[16];
  dim3 tid;
  std::vector<ECopy> open;                 /* cp.async copies issued since the last commit */
  std::vector<std::vector<ECopy>> groups; /* committed, oldest first, not yet waited for */
};
static std::vector<EThread> g_th;
static std::vector<char *> g_stacks;
static ucontext_t g_sched;
static int g_cur;
static int g_bar_and;
static std::function<void()> *g_body;
static const size_t kStack = 256 * 1024;
static uint64_t g_rand = 0x853c49e6748fea9bULL;

static void thread_entry() {
  (*g_body)();
  size_t pending = g_th[g_cur].open.size();
  for (const auto &gr : g_th[g_cur].groups) pending += gr.size();
  if (pending) {
    fprintf(stderr, "emu: thread %d of block (%u,%u,%u) exits with %zu cp.async copies never waited for\n", g_cur,
            blockIdx.x, blockIdx.y, blockIdx.z, pending);
    abort();
  }
  g_th[g_cur].state = DONE;
  swapcontext(&g_th[g_cur].ctx, &g_sched);
}

static void wait_state(int st) {
  g_th[g_cur].state = st;
  swapcontext(&g_th[g_cur].ctx, &g_sched);
}

void __syncthreads(void) { wait_state(AT_BAR); }
void emu_warp_barrier(void) { wait_state(AT_WARP); }

int __syncthreads_and(int pred) {
  g_th[g_cur].pred = pred != 0;
  wait_state(AT_BAR);
  return g_bar_and;
}

void emu_warp_exchange(const void *mine, void *theirs, int size, int src_lane) {
  const int me = g_cur, warp0 = me / 32 * 32;
  memcpy(g_th[me].slot, mine, size);
  wait_state(AT_WARP);
  int src = warp0 + src_lane;
  if (src >= (int)g_th.size() || g_th[src].state == DONE) {
    fprintf(stderr, "emu: shuffle from an exited or missing lane %d\n", src);
    abort();
  }
  memcpy(theirs, g_th[src].slot, size);
  wait_state(AT_WARP); /* nobody overwrites a slot before every lane has read */
}

void emu_cp_async(void *dst, const void *src, int bytes) {
  ECopy c;
  c.dst = dst;
  c.bytes = bytes;
  memcpy(c.data, src, (size_t)bytes); /* the source is read-only while the kernel runs */
  memset(dst, 0xFF, (size_t)bytes);
  g_th[g_cur].open.push_back(c);
}

void emu_cp_async_commit(void) {
  EThread &e = g_th[g_cur];
  e.groups.push_back(e.open);
  e.open.clear();
}

void emu_cp_async_wait(int newest_left) {
  EThread &e = g_th[g_cur];
  while ((int)e.groups.size() > newest_left) {
    for (const ECopy &c : e.groups.front()) memcpy(c.dst, c.data, (size_t)c.bytes);
    e.groups.erase(e.groups.begin());
  }
}

static void set_indices(int t) {
  g_cur = t;
  threadIdx = g_th[t].tid;
}

static void run_block(const dim3 &block) {
  const int n = (int)g_th.size();
  for (int t = 0; t < n; t++) {
    EThread &e = g_th[t];
    e.state = RUN;
    e.open.clear();
    e.groups.clear();
    e.tid = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    getcontext(&e.ctx);
    e.ctx.uc_stack.ss_sp = g_stacks[t];
    e.ctx.uc_stack.ss_size = kStack;
    e.ctx.uc_link = NULL;
    makecontext(&e.ctx, thread_entry, 0);
  }
  std::vector<int> order(n);
  for (int t = 0; t < n; t++) order[t] = t;
  for (;;) {
    int ran = 0;
    /* Threads run to their next barrier or shuffle one after another, in a fresh random order each
     * round: a read that a missing barrier leaves unordered after another thread's write shows up. */
    for (int t = n - 1; t > 0; t--) {
      g_rand = g_rand * 6364136223846793005ULL + 1442695040888963407ULL;
      int u = (int)((g_rand >> 33) % (uint64_t)(t + 1)), tmp = order[t];
      order[t] = order[u];
      order[u] = tmp;
    }
    for (int oi = 0; oi < n; oi++)
      if (g_th[order[oi]].state == RUN) {
        const int t = order[oi];
        set_indices(t);
        swapcontext(&g_sched, &g_th[t].ctx);
        ran = 1;
      }
    if (ran) continue;
    int live = 0, at_bar = 0, released = 0;
    for (int t = 0; t < n; t++)
      if (g_th[t].state != DONE) {
        live++;
        at_bar += g_th[t].state == AT_BAR;
      }
    if (live == 0) return;
    /* Warps whose live lanes all wait in a shuffle (or at a warp barrier) go on; each is held back
     * a round at random while another can go, so warps drift apart as on a GPU and a read of
     * another warp's data missing its __syncthreads is not hidden by warps marching in step. */
    for (int pass = 0; pass < 2 && !released; pass++)
      for (int w = 0; w < n; w += 32) {
        int lw = 0, aw = 0;
        for (int t = w; t < w + 32 && t < n; t++)
          if (g_th[t].state != DONE) {
            lw++;
            aw += g_th[t].state == AT_WARP;
          }
        g_rand = g_rand * 6364136223846793005ULL + 1442695040888963407ULL;
        if (lw && aw == lw && (pass == 1 || (g_rand >> 63))) {
          for (int t = w; t < w + 32 && t < n; t++)
            if (g_th[t].state == AT_WARP) g_th[t].state = RUN;
          released = 1;
        }
      }
    if (!released && at_bar == live) {
      g_bar_and = 1;
      for (int t = 0; t < n; t++)
        if (g_th[t].state == AT_BAR) g_bar_and &= g_th[t].pred, g_th[t].pred = 1;
      for (int t = 0; t < n; t++)
        if (g_th[t].state == AT_BAR) g_th[t].state = RUN;
      released = 1;
    }
    if (!released) {
      fprintf(stderr, "emu: deadlock in block (%u,%u,%u): %d live threads, %d at __syncthreads, rest in shuffles "
              "with exited lanes or split between a barrier and a shuffle\n", blockIdx.x, blockIdx.y, blockIdx.z,
              live, at_bar);
      abort();
    }
  }
}

void emu_run_grid(dim3 grid, dim3 block, size_t smem, std::function<void()> body) {
  const int n = (int)(block.x * block.y * block.z);
  while ((int)g_stacks.size() < n) g_stacks.push_back((char *)malloc(kStack));
  g_th.assign(n, EThread());
  for (auto &e : g_th) e.pred = 1;
  std::vector<unsigned char> dyn(smem + 16);
  for (auto &b : dyn) b = 0xA5; /* garbage, as on a GPU */
  emu_dyn_smem = dyn.data();
  g_body = &body;
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = dim3(x, y, z);
        run_block(block);
      }
}

/* ---- the CUDA runtime, as host memory ---- */

/* The device and kernel attribute calls (cudaGetDevice, cudaDeviceGetAttribute, cudaFuncSetAttribute),
 * counted: a launch that repeats them shows in emu_attr_calls_made. */
long emu_attr_calls;
extern "C" long emu_attr_calls_made(void) { return emu_attr_calls; }

extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t) { return "emu error"; }
const char *cudaGetErrorName(cudaError_t) { return "emuError"; }
cudaError_t cudaGetDevice(int *d) { emu_attr_calls++; *d = 0; return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr, int) { emu_attr_calls++; *v = 232448; return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) { return (*p = aligned_alloc(256, (n + 255) / 256 * 256)) ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind) { memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = NULL; return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = NULL; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 0; return cudaSuccess; }
}

/* ---- cuBLASLt: a naive GEMM that honours the descriptors ---- */

static long g_epilogue_runs[1024];
extern "C" long emu_lt_epilogue_runs(int epilogue) { return g_epilogue_runs[epilogue & 1023]; }
static long g_heuristic_calls;
extern "C" long emu_lt_heuristic_calls(void) { return g_heuristic_calls; }

static long g_fault_hits;
bool emu_fault(const char *name) {
  static const char *planted = getenv("EMU_FAULT");
  if (!planted || strcmp(planted, name) != 0) return false;
  g_fault_hits++;
  return true;
}
extern "C" long emu_fault_hits(void) { return g_fault_hits; }

struct EDesc {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  const void *bias = NULL;
  void *aux = NULL;
  int64_t ldaux = 0;
};
struct ELayout {
  cudaDataType t;
  uint64_t rows, cols;
  int64_t ld;
};

static float ld_elem(const void *p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
static void st_elem(void *p, cudaDataType t, size_t i, float v) {
  if (t == CUDA_R_32F) ((float *)p)[i] = v;
  else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

extern "C" {
const char *cublasLtGetStatusString(cublasStatus_t) { return "emu cuBLASLt status"; }
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = NULL; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t, cudaDataType_t) {
  *d = (cublasLtMatmulDesc_t) new EDesc();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete (EDesc *)d; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                              const void *buf, size_t n) {
  EDesc *e = (EDesc *)d;
  switch (a) {
  case CUBLASLT_MATMUL_DESC_TRANSA: memcpy(&e->ta, buf, n); break;
  case CUBLASLT_MATMUL_DESC_TRANSB: memcpy(&e->tb, buf, n); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE: memcpy(&e->epi, buf, n); break;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: memcpy(&e->bias, buf, n); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: memcpy(&e->aux, buf, n); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: memcpy(&e->ldaux, buf, n); break;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: {
    cudaDataType t;
    memcpy(&t, buf, n);
    if (t != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    break;
  }
  default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;
  *l = (cublasLtMatrixLayout_t) new ELayout{t, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete (ELayout *)l; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = (cublasLtMatmulPreference_t) new int(0);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete (int *)p; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void *, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t, int,
                                              cublasLtMatmulHeuristicResult_t *r, int *found) {
  g_heuristic_calls++;
  EDesc *e = (EDesc *)d;
  ELayout *A = (ELayout *)a, *B = (ELayout *)b, *C = (ELayout *)c, *D = (ELayout *)dl;
  (void)C;
  uint64_t m = D->rows, n = D->cols;
  uint64_t am = e->ta == CUBLAS_OP_T ? A->cols : A->rows, ak = e->ta == CUBLAS_OP_T ? A->rows : A->cols;
  uint64_t bk = e->tb == CUBLAS_OP_T ? B->cols : B->rows, bn = e->tb == CUBLAS_OP_T ? B->rows : B->cols;
  if (am != m || bn != n || ak != bk) {
    fprintf(stderr, "emu cuBLASLt: shapes do not chain: op(A) %llux%llu, op(B) %llux%llu, D %llux%llu\n",
            (unsigned long long)am, (unsigned long long)ak, (unsigned long long)bk, (unsigned long long)bn,
            (unsigned long long)m, (unsigned long long)n);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *found = 0;
  if ((e->epi == CUBLASLT_EPILOGUE_GELU_AUX || e->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
       e->epi == CUBLASLT_EPILOGUE_DGELU) && e->ldaux % 8 != 0)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (e->epi == CUBLASLT_EPILOGUE_BIAS && m % 8 != 0) return CUBLAS_STATUS_SUCCESS;   /* found = 0: no algorithm */
  memset(r, 0, sizeof *r);
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha, const void *Ap,
                              cublasLtMatrixLayout_t a, const void *Bp, cublasLtMatrixLayout_t b, const void *beta,
                              const void *Cp, cublasLtMatrixLayout_t c, void *Dp, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t) {
  EDesc *e = (EDesc *)desc;
  ELayout *A = (ELayout *)a, *B = (ELayout *)b, *C = (ELayout *)c, *D = (ELayout *)dl;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  const uint64_t m = D->rows, n = D->cols, k = e->ta == CUBLAS_OP_T ? A->rows : A->cols;
  const bool gelu = e->epi == CUBLASLT_EPILOGUE_GELU_AUX || e->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool bias = e->epi == CUBLASLT_EPILOGUE_BIAS || e->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = e->epi == CUBLASLT_EPILOGUE_DGELU;
  if (!gelu && !bias && !dgelu && e->epi != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (bias && !e->bias) return CUBLAS_STATUS_INVALID_VALUE;
  if ((gelu || dgelu) && !e->aux) return CUBLAS_STATUS_INVALID_VALUE;
  if (dgelu && be != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (e->epi != CUBLASLT_EPILOGUE_DEFAULT && getenv("EMU_LT_REFUSE_EPILOGUES")) return CUBLAS_STATUS_NOT_SUPPORTED;
  g_epilogue_runs[e->epi & 1023]++;
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t i = 0; i < m; i++) {
      float s = 0;
      for (uint64_t p = 0; p < k; p++) {
        size_t ai = e->ta == CUBLAS_OP_T ? p + i * A->ld : i + p * A->ld;
        size_t bi = e->tb == CUBLAS_OP_T ? j + p * B->ld : p + j * B->ld;
        s += ld_elem(Ap, A->t, ai) * ld_elem(Bp, B->t, bi);
      }
      float v = al * s;
      if (be != 0) v += be * ld_elem(Cp, C->t, i + j * C->ld);
      if (bias) v += __bfloat162float(((const __nv_bfloat16 *)e->bias)[i]);
      if (gelu) {
        st_elem(e->aux, CUDA_R_16BF, i + j * e->ldaux, v);
        v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
      }
      if (dgelu) { /* d/dx of the tanh GELU at the saved pre-activation x */
        const float x = ld_elem(e->aux, CUDA_R_16BF, i + j * e->ldaux);
        const float th = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
        v *= 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * 0.7978845608028654f * (1.0f + 0.134145f * x * x);
      }
      st_elem(Dp, D->t, i + j * D->ld, v);
    }
  return CUBLAS_STATUS_SUCCESS;
}
}
