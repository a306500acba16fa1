/* cudnn_check — the cuDNN attention's host code on a machine with no GPU (ops_cuda_cudnn.h).
 *
 *   cudnn_check real LIB   LIB is a real libcudnn.so.9 (the test venv's PyTorch wheel): it opens
 *                          through FSDP_CUDNN_LIB; the forward and backward SDPA graphs build, every
 *                          descriptor call succeeding and every tensor and operation finalizing, for
 *                          multi-head, grouped-query and head size 128; cuDNN itself refuses a
 *                          malformed tensor (so a refusal would be seen). The operation graph then
 *                          finalizes with no handle (cuDNN ≥ 9.x allows it) and cuDNN's engines are
 *                          asked, one by one, whether they take it (an engine descriptor's finalize,
 *                          no device): some engine must take each attention graph that takes no lone
 *                          matmul (the two-GEMM fusion engines). That is a check of the graph's
 *                          structure only: without a device cuDNN does not look into the pattern's
 *                          details (a graph with the mask's comparison reversed, or tanh for exp, is
 *                          taken by the same engines), which only a GPU run checks (gpu_check).
 *                          Heuristics (which return nothing without a device), plans and execution
 *                          need a GPU; cudnnCreate's refusal is reported as the point where one is.
 *   cudnn_check stub LIB   LIB is tests/gpu/shim's cudnn_stub: a refusal of any one attribute call
 *                          makes the build fail with cuDNN's status named, and releases everything.
 *                          Then the calls themselves (ops_cuda_cudnn_run.c), with the stub offering
 *                          engine configurations of given workspace sizes: the first that fits the
 *                          context's workspace is chosen, the plan is cached per shape, the tensors,
 *                          scalars, scratch (dQ accumulator zeroed, then the row sums) and workspace
 *                          are bound as the graph names them; a shape no configuration fits falls back
 *                          with the sizes said. The CUDA runtime calls are host stand-ins below.
 *   cudnn_check trust LIB  the search of PyTorch's wheel (ops_cudnn_find_wheel) under a $VIRTUAL_ENV
 *                          made here, LIB copied in as its libcudnn.so.9: found while the file and
 *                          its directories are this user's and no one else can write them; passed
 *                          over, named "not trusted", when the lib directory or the file is
 *                          world-writable.
 *
 * What needs a GPU (the operation graph's finalize, heuristics, plans, execution) is gpu_check's. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "ops_cuda_cudnn.h"

static int fails;

/* The CUDA runtime calls of ops_cuda_cudnn_run.c, on the host: device 0, a memset done at once.
 * Every "device" buffer here is host memory. */
cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) {
  (void)e;
  return "host stand-in";
}

#define EXPECT(cond, ...)                \
  do {                                   \
    if (!(cond)) {                       \
      printf("FAIL %s: ", #cond);        \
      printf(__VA_ARGS__);               \
      printf("\n");                      \
      fails++;                           \
    }                                    \
  } while (0)

typedef struct shape {
  const char *name;
  int B, T, C, NH, NKV;
} shape;

static const shape kShapes[] = {
    {"gpt2 (hs 64)", 4, 256, 768, 12, 12},
    {"llama gqa (hs 64, 4 kv heads)", 2, 128, 1024, 16, 4},
    {"hs 128, one kv head", 1, 64, 512, 4, 1},
};

/* operations per graph, from the pattern (ops_cuda_cudnn.c): forward 14; backward 22, + 2 reductions
 * over a kv head's query heads (dK, dV) with grouped-query attention */
static int expected_ops(int backward, const shape *s) {
  return backward ? 22 + (s->NH != s->NKV ? 2 : 0) : 14;
}

/* A bit per engine (global index < 64) whose descriptor finalizes on the operation graph of
 * ops[0..n); 0 when the graph itself does not finalize (said so). */
static unsigned long engines_taking(const ops_cudnn_api *a, cudnnBackendDescriptor_t *ops, int n) {
  cudnnBackendDescriptor_t og = NULL;
  unsigned long mask = 0;
  int64_t count = 0, got = 0;
  EXPECT(a->CreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &og) == CUDNN_STATUS_SUCCESS, "graph");
  cudnnStatus_t st = a->SetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ops);
  if (!st) st = a->Finalize(og);
  EXPECT(st == CUDNN_STATUS_SUCCESS, "the operation graph (%d operations), no handle: %s", n, a->GetErrorString(st));
  if (!st)
    st = a->GetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &got, &count);
  for (int64_t i = 0; !st && i < count && i < 64; i++) {
    cudnnBackendDescriptor_t e = NULL;
    if (a->CreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e)) break;
    if (!a->SetAttribute(e, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og) &&
        !a->SetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &i) && !a->Finalize(e))
      mask |= 1UL << i;
    a->DestroyDescriptor(e);
  }
  a->DestroyDescriptor(og);
  return mask;
}

static void check_real(const ops_cudnn_api *a) {
  printf("cuDNN %zu from %s\n", a->version, a->path);
  EXPECT(a->version >= 90000, "version %zu", a->version);
  for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; i++) {
    const shape *s = &kShapes[i];
    for (int k = 0; k < 4; k++) {
      const int bwd = k & 1, window = k >> 1 ? 32 : 0; /* causal, then with a sliding window */
      ops_cudnn_sdpa g;
      fsdp_clear_error();
      fsdp_status rc = ops_cudnn_sdpa_build(&g, a, bwd, s->B, s->T, s->C, s->NH, s->NKV, window);
      EXPECT(rc == FSDP_OK, "%s %s: %s", s->name, bwd ? "backward" : "forward", fsdp_last_error());
      if (rc != FSDP_OK) continue;
      const int want = expected_ops(bwd, s) + (window ? 3 : 0);
      EXPECT(g.nops == want, "%s: %d operations, expected %d", s->name, g.nops, want);
      const long hs = s->C / s->NH;
      EXPECT(g.ssum_bytes == (bwd ? 4L * s->B * s->NH * s->T : 0), "%s: ssum %lld", s->name, (long long)g.ssum_bytes);
      EXPECT(g.dqacc_bytes == (bwd ? 4L * s->B * s->NH * s->T * hs : 0), "%s: dq %lld", s->name,
             (long long)g.dqacc_bytes);

      /* the engines that take the graph, against those that take its first matmul alone */
      const unsigned long full = engines_taking(a, g.ops, g.nops), lone = engines_taking(a, g.ops, 1);
      EXPECT(full & ~lone, "%s %s: no engine takes the attention graph but not a lone matmul (%#lx, %#lx)", s->name,
             bwd ? "backward" : "forward", full, lone);
      printf("%-34s %-8s %-9s %2d operations, %2d descriptors; engines taking it %#lx (a lone matmul: %#lx)\n",
             s->name, bwd ? "backward" : "forward", window ? "window 32" : "causal", g.nops, g.ndesc, full, lone);
      ops_cudnn_sdpa_free(&g);
      EXPECT(g.ndesc == 0 && g.nops == 0, "free left %d descriptors", g.ndesc);
    }
  }

  /* cuDNN checks what it is given: a tensor with dimensions but no strides does not finalize. */
  cudnnBackendDescriptor_t t = NULL;
  const int64_t dim[4] = {1, 2, 3, 4}, id = 1;
  const cudnnDataType_t dt = CUDNN_DATA_BFLOAT16;
  EXPECT(a->CreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t) == CUDNN_STATUS_SUCCESS, "tensor descriptor");
  a->SetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  a->SetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
  a->SetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
  cudnnStatus_t st = a->Finalize(t);
  EXPECT(st != CUDNN_STATUS_SUCCESS, "a tensor without strides finalized");
  printf("a tensor without strides: %s (status %d)\n", a->GetErrorString(st), (int)st);
  a->DestroyDescriptor(t);

  /* The point where a driver is needed. */
  cudnnHandle_t h = NULL;
  st = a->Create(&h);
  printf("cudnnCreate: %s (status %d)%s\n", a->GetErrorString(st), (int)st,
         st == CUDNN_STATUS_SUCCESS ? ": a GPU is present, gpu_check runs the rest" : ": no GPU here, as expected");
  if (st == CUDNN_STATUS_SUCCESS) a->Destroy(h);
}

/* The masks each graph holds, read from the pointwise modes the stub saw set: causal alone is
 * GEN_INDEX row, GEN_INDEX column, CMP_GE, BINARY_SELECT; the sliding window adds column + W
 * (ADD with the by-value OPS_CUDNN_WINDOW), CMP_GT against the row, a second BINARY_SELECT, in the
 * forward and in the backward's recomputed P. Packed documents have no graph (the tensor cores). */
static int count_mode(const int *m, int n, int mode) {
  int k = 0;
  for (int i = 0; i < n; i++) k += m[i] == mode;
  return k;
}

static void check_masks(const ops_cudnn_api *a) {
  void (*reset)(void) = NULL;
  int (*modes)(int *, int, int64_t *, int *) = NULL;
  *(void **)&reset = dlsym(a->dl, "cudnn_stub_modes_reset");
  *(void **)&modes = dlsym(a->dl, "cudnn_stub_modes");
  EXPECT(reset && modes, "%s records no pointwise modes", a->path);
  if (!reset || !modes) return;
  const shape *s = &kShapes[1];
  for (int bwd = 0; bwd < 2; bwd++)
    for (int window = 0; window <= 24; window += 24) {
      int m[128], nid = 0;
      int64_t ids[128];
      ops_cudnn_sdpa g;
      reset();
      EXPECT(ops_cudnn_sdpa_build(&g, a, bwd, s->B, s->T, s->C, s->NH, s->NKV, window) == FSDP_OK, "%s",
             fsdp_last_error());
      const int n = modes(m, 128, ids, &nid), w = window > 0;
      int has_window_id = 0;
      for (int i = 0; i < nid; i++) has_window_id |= ids[i] == OPS_CUDNN_WINDOW;
      const char *what = bwd ? "backward" : "forward";
      EXPECT(g.nops == expected_ops(bwd, s) + 3 * w, "%s window %d: %d operations", what, window, g.nops);
      EXPECT(count_mode(m, n, CUDNN_POINTWISE_GEN_INDEX) == 2 && count_mode(m, n, CUDNN_POINTWISE_CMP_GE) == 1,
             "%s window %d: the causal mask's index generation and comparison", what, window);
      EXPECT(count_mode(m, n, CUDNN_POINTWISE_BINARY_SELECT) == 1 + w && count_mode(m, n, CUDNN_POINTWISE_CMP_GT) == w,
             "%s window %d: %d selects, %d greater-than comparisons", what, window,
             count_mode(m, n, CUDNN_POINTWISE_BINARY_SELECT), count_mode(m, n, CUDNN_POINTWISE_CMP_GT));
      EXPECT(has_window_id == w, "%s window %d: the window scalar %s", what, window, w ? "missing" : "present");
      ops_cudnn_sdpa_free(&g);
    }
  printf("stub: the causal graphs hold one mask, the sliding window's a second (its left bound a by-value scalar)\n");
}

static void check_stub(const ops_cudnn_api *a) {
  void (*calls)(long[5]) = NULL;
  *(void **)&calls = dlsym(a->dl, "cudnn_stub_calls");
  EXPECT(calls != NULL, "%s is not the stub", a->path);
  if (!calls) return;
  const shape *s = &kShapes[1];
  long c0[5], c1[5];
  calls(c0);
  ops_cudnn_sdpa g;
  EXPECT(ops_cudnn_sdpa_build(&g, a, 1, s->B, s->T, s->C, s->NH, s->NKV, 0) == FSDP_OK, "%s", fsdp_last_error());
  calls(c1);
  const long nset = c1[1] - c0[1];
  EXPECT(g.nops == expected_ops(1, s), "%d operations", g.nops);
  EXPECT(c1[0] - c0[0] == g.ndesc, "%ld descriptors created, %d kept", c1[0] - c0[0], g.ndesc);
  ops_cudnn_sdpa_free(&g);
  /* each attribute call's refusal in turn: the build stops there, says so, and keeps nothing */
  int seen = 0;
  for (long k = 1; k <= nset; k++) {
    calls(c0);
    char n[32];
    snprintf(n, sizeof n, "%ld", c0[1] + k);
    setenv("CUDNN_STUB_FAIL_SET", n, 1);
    fsdp_clear_error();
    fsdp_status rc = ops_cudnn_sdpa_build(&g, a, 1, s->B, s->T, s->C, s->NH, s->NKV, 0);
    calls(c1);
    EXPECT(rc == FSDP_ERR_UNSUPPORTED, "refusal %ld: status %d", k, (int)rc);
    EXPECT(strstr(fsdp_last_error(), "cuDNN refused") && strstr(fsdp_last_error(), "(stub)"), "refusal %ld: '%s'", k,
           fsdp_last_error());
    EXPECT(c1[1] - c0[1] == k, "refusal %ld: %ld attribute calls made (the rest should be skipped)", k, c1[1] - c0[1]);
    EXPECT(g.ndesc == 0 && g.nops == 0, "refusal %ld: %d descriptors kept", k, g.ndesc);
    seen++;
  }
  unsetenv("CUDNN_STUB_FAIL_SET");
  printf("stub: the backward makes %ld attribute calls; a refusal of each one fails the build (%d checked)\n", nset,
         seen);
  EXPECT(seen > 100, "only %d attribute calls", seen);
  check_masks(a);
}


/* What uid was bound to in the stub's last pack (the pointer and the float it held), or NULL. */
typedef struct bound {
  void *p;
  float v;
} bound;

static int (*stub_pack)(int64_t *, void **, float *, void **, int64_t *);

static bound bound_to(int64_t uid) {
  int64_t ids[16], plan = -1;
  void *ptrs[16], *ws = NULL;
  float vals[16];
  const int n = stub_pack(ids, ptrs, vals, &ws, &plan);
  for (int i = 0; i < n; i++)
    if (ids[i] == uid) return (bound){ptrs[i], vals[i]};
  return (bound){NULL, 0};
}

static void check_run(const ops_cudnn_api *a) {
  void (*calls)(long[5]) = NULL;
  int (*pack)(int64_t *, void **, float *, void **, int64_t *) = NULL;
  *(void **)&calls = dlsym(a->dl, "cudnn_stub_calls");
  *(void **)&pack = dlsym(a->dl, "cudnn_stub_pack");
  EXPECT(calls && pack, "%s is not the stub", a->path);
  if (!calls || !pack) return;
  stub_pack = pack;
  enum { B = 2, T = 16, C = 128, NH = 2, NKV = 1, HS = C / NH, C3 = C + 2 * NKV * HS };
  const size_t nqkv = (size_t)B * T * C3, nout = (size_t)B * T * C, rows = (size_t)B * NH * T;
  ops_bf16 *qkv = calloc(nqkv, 2), *dqkv = calloc(nqkv, 2), *out = calloc(nout, 2), *dout = calloc(nout, 2);
  float *lse = calloc(rows, 4), *scratch = malloc(rows * (HS + 1) * 4);
  static char ws[4096];
  ops_cuda_ctx ctx = {.workspace = ws, .workspace_bytes = 2048};
  char why[320] = "";
  long c0[5], c1[5];
  int64_t ids[16], plan = -1;
  void *ptrs[16], *got_ws = NULL;
  float vals[16];

  /* three configurations: 4096 bytes (too many for 2048), 1024 (fits: chosen), 0 */
  setenv("CUDNN_STUB_WS", "4096,1024,0", 1);
  fsdp_status rc = ops_cudnn_attention_forward(out, lse, qkv, B, T, C, NH, NKV, 0, &ctx, why, sizeof why);
  EXPECT(rc == FSDP_OK, "forward: %s", why);
  int n = pack(ids, ptrs, vals, &got_ws, &plan);
  EXPECT(n == 7 && plan == 1 && got_ws == ws, "forward pack: %d entries, configuration %lld", n, (long long)plan);
  EXPECT(bound_to(OPS_CUDNN_Q).p == qkv && bound_to(OPS_CUDNN_K).p == qkv + C &&
             bound_to(OPS_CUDNN_V).p == qkv + C + NKV * HS && bound_to(OPS_CUDNN_O).p == out &&
             bound_to(OPS_CUDNN_STATS).p == lse,
         "forward: a tensor bound to the wrong buffer");
  EXPECT(bound_to(OPS_CUDNN_SCALE).v == 0.125f && isinf(bound_to(OPS_CUDNN_NEGINF).v) &&
             bound_to(OPS_CUDNN_NEGINF).v < 0,
         "forward: scale %g, −∞ %g", bound_to(OPS_CUDNN_SCALE).v, bound_to(OPS_CUDNN_NEGINF).v);
  /* the same shape again: the cached plan, no heuristics asked */
  calls(c0);
  EXPECT(ops_cudnn_attention_forward(out, lse, qkv, B, T, C, NH, NKV, 0, &ctx, why, sizeof why) == FSDP_OK, "%s", why);
  calls(c1);
  EXPECT(c1[3] == c0[3] && c1[4] == c0[4] + 1, "second forward: %ld heuristic queries, %ld executions",
         c1[3] - c0[3], c1[4] - c0[4]);

  memset(scratch, 0xFF, rows * (HS + 1) * 4);
  rc = ops_cudnn_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV, 0, &ctx, why, sizeof why);
  EXPECT(rc == FSDP_OK, "backward: %s", why);
  n = pack(ids, ptrs, vals, &got_ws, &plan);
  EXPECT(n == 14 && plan == 1 && got_ws == ws, "backward pack: %d entries, configuration %lld", n, (long long)plan);
  EXPECT(bound_to(OPS_CUDNN_DQ).p == dqkv && bound_to(OPS_CUDNN_DK).p == dqkv + C &&
             bound_to(OPS_CUDNN_DV).p == dqkv + C + NKV * HS && bound_to(OPS_CUDNN_DO).p == dout &&
             bound_to(OPS_CUDNN_ONE).v == 1.0f,
         "backward: a tensor bound to the wrong buffer");
  EXPECT(bound_to(OPS_CUDNN_DQACC).p == scratch && bound_to(OPS_CUDNN_SSUM).p == scratch + rows * HS,
         "backward: the scratch's layout");
  size_t nonzero = 0;
  for (size_t i = 0; i < rows * HS; i++) nonzero += scratch[i] != 0.0f;
  EXPECT(nonzero == 0, "the dQ accumulator was not zeroed: %zu nonzero", nonzero);

  /* a shape no configuration fits: the fallback, with the sizes said, then cached as such */
  setenv("CUDNN_STUB_WS", "4096,3000", 1);
  rc = ops_cudnn_attention_forward(out, lse, qkv, B, T / 2, C, NH, NKV, 0, &ctx, why, sizeof why);
  EXPECT(rc == FSDP_ERR_UNSUPPORTED && strstr(why, "smallest needing 3000 bytes"), "no fit: %d '%s'", (int)rc, why);
  calls(c0);
  rc = ops_cudnn_attention_forward(out, lse, qkv, B, T / 2, C, NH, NKV, 0, &ctx, why, sizeof why);
  calls(c1);
  EXPECT(rc == FSDP_ERR_UNSUPPORTED && c1[3] == c0[3] && c1[4] == c0[4], "no fit, again: %d, %ld queries", (int)rc,
         c1[3] - c0[3]);
  /* plans that refuse to finalize: the fallback's reason keeps cuDNN's status, not only a count */
  setenv("CUDNN_STUB_WS", "-1,-1", 1);
  rc = ops_cudnn_attention_forward(out, lse, qkv, B, T / 4, C, NH, NKV, 0, &ctx, why, sizeof why);
  EXPECT(rc == FSDP_ERR_UNSUPPORTED && strstr(why, "none finalized (the last: CUDNN_STATUS_NOT_SUPPORTED"),
         "refused plans: %d '%s'", (int)rc, why);
  /* the sliding window: a plan of its own, the window bound by value */
  setenv("CUDNN_STUB_WS", "0", 1);
  rc = ops_cudnn_attention_forward(out, lse, qkv, B, T, C, NH, NKV, 5, &ctx, why, sizeof why);
  EXPECT(rc == FSDP_OK && pack(ids, ptrs, vals, &got_ws, &plan) == 8 && bound_to(OPS_CUDNN_WINDOW).v == 5.0f,
         "window forward: %d '%s', W bound as %g", (int)rc, why, bound_to(OPS_CUDNN_WINDOW).v);
  rc = ops_cudnn_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV, 5, &ctx, why, sizeof why);
  EXPECT(rc == FSDP_OK && bound_to(OPS_CUDNN_WINDOW).v == 5.0f, "window backward: %d '%s'", (int)rc, why);
  unsetenv("CUDNN_STUB_WS");
  printf("stub: the run path chose the configuration that fits, bound %d tensors and scalars, cached its plan\n", n);
  free(qkv), free(dqkv), free(out), free(dout), free(lse), free(scratch);
}

/* Copy file FROM to TO (mode 0755); 0 on success. */
static int copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
  char buf[65536];
  size_t n;
  int rc = in && out ? 0 : -1;
  while (!rc && (n = fread(buf, 1, sizeof buf, in)) > 0) rc = fwrite(buf, 1, n, out) == n ? 0 : -1;
  if (in) fclose(in);
  if (out && fclose(out) != 0) rc = -1;
  return rc ? rc : chmod(to, 0755);
}

/* The wheel search against a venv made here: trusted, then a world-writable lib directory, then a
 * world-writable file, then trusted again. */
static void check_trust(const char *lib) {
  char root[] = "/tmp/cudnn-trust-XXXXXX", dir[512], want[600], found[4096], tried[2048];
  if (!mkdtemp(root)) {
    EXPECT(0, "mkdtemp");
    return;
  }
  chmod(root, 0755);
  snprintf(dir, sizeof dir, "%s/venv/lib/python3.11/site-packages/nvidia/cudnn/lib", root);
  snprintf(want, sizeof want, "%s/libcudnn.so.9", dir);
  EXPECT(fsutil_mkdir_p(dir, 0755) == FSDP_OK && copy_file(lib, want) == 0, "the venv: %s", fsdp_last_error());
  char venv[300];
  snprintf(venv, sizeof venv, "%s/venv", root);
  setenv("VIRTUAL_ENV", venv, 1);
  unsetenv("CONDA_PREFIX");
  setenv("HOME", root, 1);
  static const struct { const char *what; mode_t dir_mode, file_mode; int ok; } cases[] = {
      {"trusted", 0755, 0755, 1},
      {"world-writable directory", 0777, 0755, 0},
      {"world-writable file", 0755, 0777, 0},
      {"trusted again", 0755, 0755, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    chmod(dir, cases[i].dir_mode);
    chmod(want, cases[i].file_mode);
    found[0] = tried[0] = '\0';
    int got = ops_cudnn_find_wheel(found, sizeof found, tried, sizeof tried) && !strcmp(found, want);
    EXPECT(got == cases[i].ok, "%s: found '%s', tried %s", cases[i].what, found, tried);
    if (!cases[i].ok) EXPECT(strstr(tried, want) && strstr(tried, "not trusted"), "%s: tried %s", cases[i].what, tried);
    printf("trust: %s: %s\n", cases[i].what, got ? "found" : tried);
  }
  fsutil_remove_tree(root);
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "real") && strcmp(argv[1], "stub") && strcmp(argv[1], "trust"))) {
    fprintf(stderr, "usage: cudnn_check real|stub|trust LIBCUDNN\n");
    return 2;
  }
  if (!strcmp(argv[1], "trust")) {
    check_trust(argv[2]);
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
  }
  setenv("FSDP_CUDNN_LIB", argv[2], 1);
  ops_cudnn_api a;
  if (ops_cudnn_open(&a) != FSDP_OK) {
    printf("FAIL: %s\n", fsdp_last_error());
    return 1;
  }
  EXPECT(strcmp(a.path, argv[2]) == 0, "opened %s", a.path);
  if (!strcmp(argv[1], "real")) check_real(&a);
  else {
    check_stub(&a);
    check_run(&a);
  }
  ops_cudnn_close(&a);
  printf("%s\n", fails ? "FAIL" : "PASS");
  return fails ? 1 : 0;
}
