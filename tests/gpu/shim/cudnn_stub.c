/* cudnn_stub — a libcudnn stand-in (a shared library, loaded through FSDP_CUDNN_LIB) with the
 * entry points ops_cuda_cudnn.c binds: every descriptor call succeeds and heuristics offer no engine
 * configuration, as a cuDNN with no engine for the graph would. Executing anything fails. So a test
 * can see the attention fall back to the tensor-core kernel, with no GPU and no real cuDNN.
 *
 * CUDNN_STUB_FAIL_SET=N makes the N-th cudnnBackendSetAttribute call (1-based) fail with
 * CUDNN_STATUS_BAD_PARAM, to show that every call's status is checked. cudnn_stub_calls() counts
 * the calls of each kind for the test's assertions.
 *
 * CUDNN_STUB_WS="W0,W1,..." makes heuristics offer one engine configuration per number, whose
 * execution plan finalizes and asks W bytes of workspace; executing then succeeds and records the
 * variant pack (cudnn_stub_pack: ids, pointers, workspace, and the by-value scalars' values as they
 * were when it ran). So a test can see which configuration was chosen and what was bound. A
 * negative W: that configuration's plan refuses to finalize (CUDNN_STATUS_NOT_SUPPORTED), so a
 * test can see the refusal named in the fallback's reason.
 *
 * cudnn_stub_modes() gives the pointwise modes set since the last cudnn_stub_modes_reset(), in
 * order, and the unique ids of the tensors set, so a test can read which masks a graph holds. */
#include <cudnn_graph.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct cudnnContext {
  int unused;
};

static struct {
  long create, set, finalize, heur_results, execute;
} calls;

/* a descriptor: its type, and for engine configurations and plans the configuration's index */
typedef struct desc {
  int type;
  int64_t index;
} desc;

#define MAX_PACK 16
static struct {
  int n;
  int64_t ids[MAX_PACK];
  void *ptrs[MAX_PACK];
  void *ws;
  float values[MAX_PACK]; /* *(float *)ptrs[i], read at execution */
  int64_t plan_index;
} pack;

/* the workspace sizes of CUDNN_STUB_WS; returns how many (at most `max`) */
static int engine_ws(int64_t *ws, int max) {
  const char *e = getenv("CUDNN_STUB_WS");
  int n = 0;
  while (e && *e && n < max) {
    char *end;
    ws[n++] = strtoll(e, &end, 10);
    e = *end == ',' ? end + 1 : end + strlen(end);
  }
  return n;
}

/* the last variant pack executed, the float each pointer held then, and the chosen configuration */
int cudnn_stub_pack(int64_t *ids, void **ptrs, float *values, void **ws, int64_t *plan_index) {
  for (int i = 0; i < pack.n; i++) ids[i] = pack.ids[i], ptrs[i] = pack.ptrs[i], values[i] = pack.values[i];
  *ws = pack.ws;
  *plan_index = pack.plan_index;
  return pack.n;
}

#define MAX_MODES 128
static struct {
  int n, nid;
  int mode[MAX_MODES];
  int64_t id[MAX_MODES];
} graph;

void cudnn_stub_modes_reset(void) { graph.n = graph.nid = 0; }

/* the pointwise modes set (into MODES, at most MAX; returns how many) and the tensor ids (IDS, *NID) */
int cudnn_stub_modes(int *modes, int max, int64_t *ids, int *nid) {
  int n = graph.n < max ? graph.n : max;
  for (int i = 0; i < n; i++) modes[i] = graph.mode[i];
  *nid = graph.nid < max ? graph.nid : max;
  for (int i = 0; i < *nid; i++) ids[i] = graph.id[i];
  return n;
}

static long fail_at(void) {
  const char *e = getenv("CUDNN_STUB_FAIL_SET");
  return e ? atol(e) : 0;
}

/* the counters, in this order: descriptors created, attributes set, finalizes, heuristic queries, executes */
void cudnn_stub_calls(long out[5]) {
  out[0] = calls.create, out[1] = calls.set, out[2] = calls.finalize, out[3] = calls.heur_results;
  out[4] = calls.execute;
}

size_t cudnnGetVersion(void) { return 91900; }

const char *cudnnGetErrorString(cudnnStatus_t s) {
  return s == CUDNN_STATUS_SUCCESS         ? "CUDNN_STATUS_SUCCESS"
         : s == CUDNN_STATUS_NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED (stub)"
                                           : "CUDNN_STATUS_BAD_PARAM (stub)";
}

static struct cudnnContext the_handle;

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
  *h = &the_handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  (void)h;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  (void)h, (void)s;
  return CUDNN_STATUS_SUCCESS;
}

/* heap-allocated, so that a leak or a double destroy shows under ASan */
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *d) {
  desc *p = malloc(sizeof *p);
  if (!p) return CUDNN_STATUS_ALLOC_FAILED;
  *p = (desc){.type = (int)type, .index = -1};
  *d = p;
  calls.create++;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  free(d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t n, const void *v) {
  (void)type;
  calls.set++;
  if (calls.set == fail_at()) return CUDNN_STATUS_BAD_PARAM;
  if (name == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) ((desc *)d)->index = (*(desc *const *)v)->index;
  if (name == CUDNN_ATTR_POINTWISE_MODE && graph.n < MAX_MODES) graph.mode[graph.n++] = *(const int *)v;
  if (name == CUDNN_ATTR_TENSOR_UNIQUE_ID && graph.nid < MAX_MODES) graph.id[graph.nid++] = *(const int64_t *)v;
  if (name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS || name == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) {
    if (n > MAX_PACK) return CUDNN_STATUS_BAD_PARAM;
    pack.n = (int)n;
    for (int64_t i = 0; i < n; i++)
      if (name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) pack.ids[i] = ((const int64_t *)v)[i];
      else pack.ptrs[i] = ((void *const *)v)[i];
  }
  if (name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE) pack.ws = *(void *const *)v;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  calls.finalize++;
  const desc *p = d;
  int64_t ws[MAX_PACK];
  const int k = engine_ws(ws, MAX_PACK);
  if (p->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && p->index >= 0 && p->index < k && ws[p->index] < 0)
    return CUDNN_STATUS_NOT_SUPPORTED;
  return CUDNN_STATUS_SUCCESS;
}

/* the heuristics' results (CUDNN_STUB_WS's configurations, none by default); a plan's workspace */
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t req, int64_t *n, void *v) {
  (void)type;
  int64_t ws[MAX_PACK];
  const int k = engine_ws(ws, MAX_PACK);
  if (n) *n = 0;
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    calls.heur_results++;
    const int64_t m = req == 0 ? k : (req < k ? req : k);
    for (int64_t i = 0; v && req && i < m; i++) ((desc **)v)[i]->index = i;
    if (n) *n = m;
  } else if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
    const int64_t i = ((const desc *)d)->index;
    if (i < 0 || i >= k) return CUDNN_STATUS_BAD_PARAM;
    *(int64_t *)v = ws[i];
    if (n) *n = 1;
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t vp) {
  (void)h, (void)vp;
  calls.execute++;
  int64_t ws[MAX_PACK];
  if (engine_ws(ws, MAX_PACK) == 0) return CUDNN_STATUS_EXECUTION_FAILED; /* no engine was offered */
  pack.plan_index = ((const desc *)plan)->index;
  /* every pointer's first float, now (the by-value scalars live on the caller's stack); only for
   * tests whose "device" buffers are host memory, as cudnn_check's */
  for (int i = 0; i < pack.n; i++) pack.values[i] = *(const float *)pack.ptrs[i];
  return CUDNN_STATUS_SUCCESS;
}
