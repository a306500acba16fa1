/* ops_cuda_cudnn_run — the cuDNN attention's plans and calls (ops_cuda_cudnn.h): the library opened
 * once, a handle per device, an execution plan per (direction, shape, device), built on first use
 * and kept for the process. One lock guards all of it, calls included (a cuDNN handle is not
 * thread-safe); the work itself is only enqueued on ctx->stream. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <math.h>
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "ops_cuda_cudnn.h"

#define MAX_DEV 16
#define MAX_PLANS 32
#define MAX_CFGS 64

typedef struct plan_entry {
  int backward, B, T, C, NH, NKV, window, dev;
  fsdp_status st;   /* FSDP_OK: plan is usable; else why[] says why not */
  char why[320];
  cudnnBackendDescriptor_t graph, plan;
  int64_t ws;       /* the plan's own workspace */
  ops_cudnn_sdpa g; /* the descriptors the plan was built from */
} plan_entry;

static struct {
  pthread_mutex_t mu;
  int opened; /* 0 not yet, 1 open, −1 failed (open_why) */
  char open_why[640];
  ops_cudnn_api api;
  cudnnHandle_t handle[MAX_DEV];
  fsdp_status handle_st[MAX_DEV]; /* FSDP_ERR_STATE: not tried yet */
  plan_entry e[MAX_PLANS];
  int n;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

static fsdp_status unsupported(char *why, size_t nwhy, const char *text) {
  snprintf(why, nwhy, "%s", text);
  return FSDP_ERR_UNSUPPORTED;
}

/* The library, then this device's handle. */
static fsdp_status ready(int dev, cudnnHandle_t *h, char *why, size_t nwhy) {
  if (!S.opened) {
    for (int i = 0; i < MAX_DEV; i++) S.handle_st[i] = FSDP_ERR_STATE;
    if (ops_cudnn_open(&S.api) == FSDP_OK) {
      S.opened = 1;
      log_info("attention: cuDNN %zu.%zu.%zu from %s", S.api.version / 10000, S.api.version / 100 % 100,
               S.api.version % 100, S.api.path);
    } else {
      S.opened = -1;
      snprintf(S.open_why, sizeof S.open_why, "%s", fsdp_last_error());
      log_warn("attention: %s; the tensor-core kernel runs instead", S.open_why);
    }
  }
  if (S.opened < 0) return unsupported(why, nwhy, S.open_why);
  if (dev < 0 || dev >= MAX_DEV) return unsupported(why, nwhy, "cuDNN attention: device number out of range");
  if (S.handle_st[dev] == FSDP_ERR_STATE) {
    cudnnStatus_t s = S.api.Create(&S.handle[dev]);
    S.handle_st[dev] = s == CUDNN_STATUS_SUCCESS ? FSDP_OK : FSDP_ERR_UNSUPPORTED;
    if (s != CUDNN_STATUS_SUCCESS)
      log_warn("attention: cudnnCreate on GPU %d failed: %s (status %d); the tensor-core kernel runs instead", dev,
               S.api.GetErrorString(s), (int)s);
  }
  if (S.handle_st[dev] != FSDP_OK) return unsupported(why, nwhy, "cudnnCreate failed");
  *h = S.handle[dev];
  return FSDP_OK;
}

/* The first engine configuration of heuristics mode `mode` whose plan finalizes and fits `room`
 * bytes of workspace. Returns 1 with e->plan set; 0 with a line in `note` about what was seen. */
static int pick_engine(plan_entry *e, cudnnHandle_t h, cudnnBackendHeurMode_t mode, int64_t room, char *note,
                       size_t nnote) {
  const char *name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback heuristics";
  const ops_cudnn_api *a = &S.api;
  cudnnBackendDescriptor_t heur = NULL, cfg[MAX_CFGS] = {0};
  int64_t n = 0, got = 0, tried = 0, need = -1, found = 0;
  cudnnStatus_t last = CUDNN_STATUS_SUCCESS; /* the last plan's refusal: what a fallback's note names */
  if (a->CreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) != CUDNN_STATUS_SUCCESS) return 0;
  if (a->SetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->graph) ||
      a->SetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) || a->Finalize(heur) ||
      a->GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL))
    goto out;
  if (n > MAX_CFGS) n = MAX_CFGS;
  for (int64_t i = 0; i < n; i++)
    if (a->CreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[i]) != CUDNN_STATUS_SUCCESS) goto out;
  if (n && a->GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg)) goto out;
  for (int64_t i = 0; i < got && !found; i++) {
    cudnnBackendDescriptor_t p = NULL;
    int64_t ws = 0, nws = 0;
    tried++;
    if (a->CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS) break;
    cudnnStatus_t st = a->SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (!st) st = a->SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
    if (!st) {
      st = a->Finalize(p);
      if (st) log_debug("attention: cuDNN %s, engine configuration %lld of %lld: the plan did not finalize: %s "
                        "(status %d)", name, (long long)i + 1, (long long)got, a->GetErrorString(st), (int)st);
    }
    if (!st) st = a->GetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &nws, &ws);
    if (!st) {
      if (ws <= room) {
        e->plan = p, e->ws = ws, found = 1;
        continue;
      }
      if (need < 0 || ws < need) need = ws;
    } else {
      last = st;
    }
    a->DestroyDescriptor(p);
  }
out:
  for (int64_t i = 0; i < MAX_CFGS; i++)
    if (cfg[i]) a->DestroyDescriptor(cfg[i]);
  if (heur) a->DestroyDescriptor(heur);
  if (!found) {
    size_t k = strlen(note);
    if (need >= 0)
      snprintf(note + k, nnote - k, "%s%s: %lld engine(s), the smallest needing %lld bytes of workspace (%lld free)",
               k ? "; " : "", name, (long long)tried, (long long)need, (long long)room);
    else
      snprintf(note + k, nnote - k, "%s%s: %lld engine(s) offered, none finalized%s%s%s", k ? "; " : "", name,
               (long long)tried, last ? " (the last: " : "", last ? a->GetErrorString(last) : "", last ? ")" : "");
  }
  return (int)found;
}

/* Builds e's graph and plan; e->st and e->why say how it went. */
static void build(plan_entry *e, cudnnHandle_t h, size_t room) {
  const ops_cudnn_api *a = &S.api;
  const char *dir = e->backward ? "backward" : "forward";
  if (ops_cudnn_sdpa_build(&e->g, a, e->backward, e->B, e->T, e->C, e->NH, e->NKV, e->window) != FSDP_OK) {
    snprintf(e->why, sizeof e->why, "%s", fsdp_last_error());
    e->st = FSDP_ERR_UNSUPPORTED;
    return;
  }
  cudnnStatus_t s = a->CreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &e->graph);
  if (!s) s = a->SetAttribute(e->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, e->g.nops, e->g.ops);
  if (!s) s = a->SetAttribute(e->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  if (!s) s = a->Finalize(e->graph);
  char note[256] = "";
  if (s) {
    snprintf(e->why, sizeof e->why, "cuDNN refused the %s graph: %s (status %d)", dir, a->GetErrorString(s), (int)s);
  } else if (pick_engine(e, h, CUDNN_HEUR_MODE_A, (int64_t)room, note, sizeof note) ||
             pick_engine(e, h, CUDNN_HEUR_MODE_FALLBACK, (int64_t)room, note, sizeof note)) {
    e->st = FSDP_OK;
    return;
  } else {
    snprintf(e->why, sizeof e->why, "cuDNN %zu.%zu.%zu has no engine for the %s (%s)", a->version / 10000,
             a->version / 100 % 100, a->version % 100, dir, note);
  }
  e->st = FSDP_ERR_UNSUPPORTED;
}

/* The entry for this call, built on first use; NULL when the cache is full. */
static plan_entry *entry(int backward, int B, int T, int C, int NH, int NKV, int window, int dev, cudnnHandle_t h,
                         size_t room) {
  for (int i = 0; i < S.n; i++) {
    plan_entry *e = &S.e[i];
    if (e->backward == backward && e->B == B && e->T == T && e->C == C && e->NH == NH && e->NKV == NKV &&
        e->window == window && e->dev == dev)
      return e;
  }
  if (S.n == MAX_PLANS) return NULL;
  plan_entry *e = &S.e[S.n++];
  *e = (plan_entry){.backward = backward, .B = B, .T = T, .C = C, .NH = NH, .NKV = NKV, .window = window, .dev = dev};
  build(e, h, room);
  if (e->st != FSDP_OK)
    log_warn("attention: %s (B=%d T=%d NH=%d NKV=%d hs=%d window=%d); the tensor-core kernel runs instead", e->why, B,
             T, NH, NKV, C / NH, window);
  return e;
}

/* Looks up (or builds) the plan and runs it with the tensors bound: n pairs of (uid, pointer), and
 * in the backward the scratch (dQ accumulator, then the dO·O row sums). */
static fsdp_status run(int backward, int B, int T, int C, int NH, int NKV, int window, const ops_cuda_ctx *ctx, int n,
                       const int64_t *uid, void *const *ptr, float *scratch, char *why, size_t nwhy) {
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    return fsdp_set_error(FSDP_ERR_CUDA, "cudaGetDevice: %s", cudaGetErrorString(ce));
  }
  cudnnHandle_t h = NULL;
  fsdp_status rc = ready(dev, &h, why, nwhy);
  if (rc != FSDP_OK) return rc;
  plan_entry *e = entry(backward, B, T, C, NH, NKV, window, dev, h, ctx->workspace ? ctx->workspace_bytes : 0);
  if (!e) return unsupported(why, nwhy, "cuDNN attention: more shapes than the plan cache holds");
  if (e->st != FSDP_OK) return unsupported(why, nwhy, e->why);
  if ((size_t)e->ws > (ctx->workspace ? ctx->workspace_bytes : 0))
    return unsupported(why, nwhy, "cuDNN attention: this context's workspace is smaller than the plan's");
  void *plan_ws = ctx->workspace;
  const float scale = 1.0f / sqrtf((float)(C / NH)), one = 1.0f, band = (float)window;
  /* cuDNN before 9.10 wants the most negative float where later ones take −∞ (as cudnn-frontend does) */
  const float neginf = S.api.version < 91000 ? -FLT_MAX : -INFINITY;
  int64_t ids[16];
  void *p[16];
  int k = 0;
  for (; k < n; k++) ids[k] = uid[k], p[k] = ptr[k];
  ids[k] = OPS_CUDNN_SCALE, p[k++] = (void *)&scale;
  ids[k] = OPS_CUDNN_NEGINF, p[k++] = (void *)&neginf;
  if (window > 0) ids[k] = OPS_CUDNN_WINDOW, p[k++] = (void *)&band;
  if (backward) {
    ids[k] = OPS_CUDNN_ONE, p[k++] = (void *)&one;
    /* B·NH·T·hs floats, a multiple of 256 bytes at hs = 64 or 128: the row sums stay aligned */
    ids[k] = OPS_CUDNN_DQACC, p[k++] = scratch;
    ids[k] = OPS_CUDNN_SSUM, p[k++] = (char *)scratch + e->g.dqacc_bytes;
    ce = cudaMemsetAsync(scratch, 0, (size_t)e->g.dqacc_bytes, ctx->stream);
    if (ce != cudaSuccess) {
      (void)cudaGetLastError();
      return fsdp_set_error(FSDP_ERR_CUDA, "attention_backward: zeroing the dQ accumulator: %s", cudaGetErrorString(ce));
    }
  }
  const ops_cudnn_api *a = &S.api;
  cudnnBackendDescriptor_t vp = NULL;
  cudnnStatus_t s = a->CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (!s) s = a->SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, k, ids);
  if (!s) s = a->SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, k, p);
  if (!s) s = a->SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &plan_ws);
  if (!s) s = a->Finalize(vp);
  if (!s) s = a->SetStream(h, ctx->stream);
  if (!s) s = a->Execute(h, e->plan, vp);
  if (vp) a->DestroyDescriptor(vp);
  if (s)
    return fsdp_set_error(FSDP_ERR_CUDA, "attention_%s (cuDNN): %s (status %d)", backward ? "backward" : "forward",
                          a->GetErrorString(s), (int)s);
  return FSDP_OK;
}

fsdp_status ops_cudnn_attention_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH,
                                        int NKV, int window, const ops_cuda_ctx *ctx, char *why, size_t nwhy) {
  const int hs = C / NH;
  const int64_t uid[] = {OPS_CUDNN_Q, OPS_CUDNN_K, OPS_CUDNN_V, OPS_CUDNN_O, OPS_CUDNN_STATS};
  void *const ptr[] = {(void *)qkv, (void *)(qkv + C), (void *)(qkv + C + (size_t)NKV * hs), out, lse};
  pthread_mutex_lock(&S.mu);
  fsdp_status rc = run(0, B, T, C, NH, NKV, window, ctx, 5, uid, ptr, NULL, why, nwhy);
  pthread_mutex_unlock(&S.mu);
  return rc;
}

fsdp_status ops_cudnn_attention_backward(ops_bf16 *dqkv, float *scratch, const ops_bf16 *dout, const ops_bf16 *qkv,
                                         const ops_bf16 *out, const float *lse, int B, int T, int C, int NH, int NKV,
                                         int window, const ops_cuda_ctx *ctx, char *why, size_t nwhy) {
  const int hs = C / NH;
  const size_t kv = (size_t)NKV * hs;
  const int64_t uid[] = {OPS_CUDNN_Q,  OPS_CUDNN_K,  OPS_CUDNN_V,  OPS_CUDNN_O, OPS_CUDNN_STATS,
                         OPS_CUDNN_DO, OPS_CUDNN_DQ, OPS_CUDNN_DK, OPS_CUDNN_DV};
  void *const ptr[] = {(void *)qkv, (void *)(qkv + C), (void *)(qkv + C + kv), (void *)out, (void *)lse,
                       (void *)dout, dqkv, dqkv + C, dqkv + C + kv};
  pthread_mutex_lock(&S.mu);
  fsdp_status rc = run(1, B, T, C, NH, NKV, window, ctx, 9, uid, ptr, scratch, why, nwhy);
  pthread_mutex_unlock(&S.mu);
  return rc;
}
