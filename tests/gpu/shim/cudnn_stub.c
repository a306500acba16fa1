/* cudnn_stub — a libcudnn stand-in (a shared library, loaded through FSDP_CUDNN_LIB) with the
 * entry points ops_cuda_cudnn.c binds: every descriptor call succeeds and heuristics offer no engine
 * configuration, as a cuDNN with no engine for the graph would. Executing anything fails. So a test
 * can see the attention fall back to the tensor-core kernel, with no GPU and no real cuDNN.
 *
 * CUDNN_STUB_FAIL_SET=N makes the N-th cudnnBackendSetAttribute call (1-based) fail with
 * CUDNN_STATUS_BAD_PARAM, to show that every call's status is checked. cudnn_stub_calls() counts
 * the calls of each kind for the test's assertions. */
#include <cudnn_graph.h>
#include <stdint.h>
#include <stdlib.h>

struct cudnnContext {
  int unused;
};

static struct {
  long create, set, finalize, heur_results, execute;
} calls;

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
  return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_BAD_PARAM (stub)";
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

/* a descriptor is its type, heap-allocated so that a leak or a double destroy shows under ASan */
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *d) {
  int *p = malloc(sizeof *p);
  if (!p) return CUDNN_STATUS_ALLOC_FAILED;
  *p = (int)type;
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
  (void)d, (void)name, (void)type, (void)n, (void)v;
  calls.set++;
  return calls.set == fail_at() ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  (void)d;
  calls.finalize++;
  return CUDNN_STATUS_SUCCESS;
}

/* the heuristics' results: none */
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t req, int64_t *n, void *v) {
  (void)d, (void)type, (void)req, (void)v;
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS) calls.heur_results++;
  if (n) *n = 0;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  (void)h, (void)plan, (void)pack;
  calls.execute++;
  return CUDNN_STATUS_EXECUTION_FAILED;
}
