/* ops_cuda_cudnn — causal self-attention through cuDNN's fused flash attention (SDPA), forward and
 * backward in bf16, behind ops_cuda_attention_forward/_backward (OPS_ATTN_CUDNN, ops_cuda.h).
 *
 * libcudnn is not linked: it is opened at run time (dlopen), because it is far too large to carry
 * (its engines alone are ~245 MB) and every GPU node that runs PyTorch has one. The first library
 * that opens and exports the backend API wins, in this order:
 *   1. $FSDP_CUDNN_LIB (a path to libcudnn.so.9 or a library with the same symbols);
 *   2. libcudnn.so.9, then libcudnn_graph.so.9, through the loader's own path (LD_LIBRARY_PATH, ldconfig);
 *   3. PyTorch's wheel: nvidia/cudnn/lib/libcudnn.so.9 under $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local
 *      and /usr{,/local}/lib/python3.*\/{site,dist}-packages, each found there only where no other
 *      user could have put it: the file and every directory above it belong to root or this user and
 *      no one else can write them (fsutil's trust checks; a candidate that fails is named, skipped).
 *
 * The graph is cuDNN's backend (C) API, the composite pattern its fused SDPA engines recognize
 * (what cudnn-frontend's sdpa node lowers to): Q·Kᵀ, scale, causal mask (row ≥ column, by index
 * generation, a comparison and a select; a sliding window adds column + W > row, a second
 * comparison and select, as the frontend's diagonal band does; packed documents are not expressed
 * here: those calls run the tensor-core kernels, docs/gpu.md says why), softmax with its statistics (max, exp, sum, log: the
 * natural-log LSE, fp32 (B,NH,T), which is exactly the lse the other kernels save), P·V. The
 * backward recomputes P from the statistics; dQ is accumulated in fp32 in the caller's scratch
 * (zeroed first), then converted. Each (direction, shape, device) is built once and cached: the execution
 * plan of the first engine configuration that heuristics mode A (then the fallback mode) offers,
 * that finalizes and whose workspace fits ctx->workspace_bytes.
 *
 * A call returns FSDP_ERR_UNSUPPORTED when cuDNN cannot run it (no library, no handle, no engine,
 * a plan's workspace larger than ctx's): the caller runs the tensor-core kernel instead; the reason is logged once
 * per shape and kept for ops_cuda_attention_note(). Any other error is a failure of a call that
 * should have worked. Thread-safe: one lock guards the library, the handles and the cache.
 *
 * The graph builder (ops_cudnn_sdpa_build) needs no device, so a CPU test checks every descriptor
 * call against the real libcudnn up to the operation graph's finalize, which needs a handle.
 */
#ifndef FSDP_OPS_CUDA_CUDNN_H
#define FSDP_OPS_CUDA_CUDNN_H

#include <cudnn_backend.h>
#include <stddef.h>

#include "ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The entry points this module uses, from the opened library. */
typedef struct ops_cudnn_api {
  void *dl;
  char path[512]; /* the file that was opened (or the name the loader resolved) */
  size_t version; /* cudnnGetVersion(): 91900 for 9.19.0 */
  size_t (*GetVersion)(void);
  const char *(*GetErrorString)(cudnnStatus_t);
  cudnnStatus_t (*Create)(cudnnHandle_t *);
  cudnnStatus_t (*Destroy)(cudnnHandle_t);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
  cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                int64_t, const void *);
  cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
  cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} ops_cudnn_api;

/* Opens the first library of the search order above into *api. FSDP_ERR_NOTFOUND with every place
 * tried when none opens or exports the backend API; FSDP_ERR_UNSUPPORTED for a cuDNN older than 9. */
fsdp_status ops_cudnn_open(ops_cudnn_api *api);
/* Step 3 of the search without opening anything: the first trusted PyTorch wheel's libcudnn.so.9
 * into FOUND (N bytes); returns 0 when there is none, with the candidates refused and why appended
 * to TRIED (NTRIED bytes). Exposed for the tests. */
int ops_cudnn_find_wheel(char *found, size_t n, char *tried, size_t ntried);
void ops_cudnn_close(ops_cudnn_api *api);

/* Unique ids of the tensors the caller binds (the rest are virtual or by-value scalars). */
enum {
  OPS_CUDNN_Q = 1, OPS_CUDNN_K, OPS_CUDNN_V, OPS_CUDNN_O, OPS_CUDNN_STATS, /* forward: Q K V in, O STATS out */
  OPS_CUDNN_DO, OPS_CUDNN_DQ, OPS_CUDNN_DK, OPS_CUDNN_DV,                   /* backward: + O STATS dO in */
  OPS_CUDNN_SSUM,                                                          /* backward: rowsum(dO∘O), workspace */
  OPS_CUDNN_DQACC,                                                         /* backward: dQ in fp32, workspace */
  OPS_CUDNN_SCALE, OPS_CUDNN_NEGINF, OPS_CUDNN_ONE,                        /* by-value scalars */
  OPS_CUDNN_WINDOW                                                         /* the sliding window W, a float */
};

#define OPS_CUDNN_MAX_OPS 32
#define OPS_CUDNN_MAX_DESC 128

/* One SDPA graph's operation descriptors, finalized, and everything they refer to. */
typedef struct ops_cudnn_sdpa {
  const ops_cudnn_api *api;
  int backward;
  cudnnBackendDescriptor_t ops[OPS_CUDNN_MAX_OPS];
  int nops;
  cudnnBackendDescriptor_t desc[OPS_CUDNN_MAX_DESC]; /* tensors, op configs and ops, to destroy */
  int ndesc;
  int64_t ssum_bytes, dqacc_bytes; /* the backward's scratch tensors (0 in the forward) */
} ops_cudnn_sdpa;

/* Builds and finalizes the tensor and operation descriptors of the causal SDPA forward (backward =
 * 0) or backward on the packed qkv layout of ops_cuda.h, with a sliding WINDOW (0: none) as a second
 * mask (the band's left bound, bound at run time as OPS_CUDNN_WINDOW). On failure, says which call
 * failed with cuDNN's status (FSDP_ERR_UNSUPPORTED). ops_cudnn_sdpa_free releases all of it (safe on
 * a partial build). */
fsdp_status ops_cudnn_sdpa_build(ops_cudnn_sdpa *g, const ops_cudnn_api *api, int backward, int B, int T, int C,
                                 int NH, int NKV, int window);
void ops_cudnn_sdpa_free(ops_cudnn_sdpa *g);

/* The attention through cuDNN (shapes and buffers as ops_cuda_attention_forward/_backward: the
 * backward's dQ accumulator and dO·O row sums live in scratch, the plans' workspace in
 * ctx->workspace). FSDP_ERR_UNSUPPORTED: cuDNN
 * cannot run this shape here, run another kernel (the reason is logged once and kept in *why*). */
fsdp_status ops_cudnn_attention_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH,
                                        int NKV, int window, const ops_cuda_ctx *ctx, char *why, size_t nwhy);
fsdp_status ops_cudnn_attention_backward(ops_bf16 *dqkv, float *scratch, const ops_bf16 *dout, const ops_bf16 *qkv,
                                         const ops_bf16 *out, const float *lse, int B, int T, int C, int NH, int NKV,
                                         int window, const ops_cuda_ctx *ctx, char *why, size_t nwhy);

#ifdef __cplusplus
}
#endif
#endif
