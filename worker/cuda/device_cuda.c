/* device_cuda — the CUDA device (device.h) over the bf16 kernels of ops_cuda.h; CUDA build only.
 *
 * One GPU, one compute stream (non-blocking), one cuBLASLt handle, one ops workspace. Activations
 * are bf16 (act_bytes 2); gradients, statistics, shards and scalars fp32. Every stream operation only
 * enqueues on the compute stream: no host synchronization, no allocation. The host synchronizes
 * in sync(), upload(), download(), alloc() and timers() only (never inside a micro-step).
 *
 * Memory: every buffer comes from cudaMalloc, zeroed, counted with mem_account under its category
 * and remembered in a pointer table (pointer → bytes, category) so that free() uncounts exactly.
 * The device's own buffers, allocated once: the ops workspace (PLAN_CUDA_WORKSPACE_BYTES) and a few
 * device scalars (PLAN_CUDA_SCALAR_BYTES) at creation, AdamW's decay-segment table at bind() — all
 * under MEM_WORKSPACE, as plan.c predicts. The classifier's logits scratch is the model's (its
 * head workspace, dev_logits_bytes: one chunk of plan_classifier_chunk rows, bf16).
 *
 * Errors: the dev ops return void, so the first failure (a refused launch or cuBLASLt call, with
 * its text) is kept in the device (sticky); later stream ops are skipped, and sync(), upload() and
 * download() report it. A fault while a kernel runs surfaces at the next synchronization.
 *
 * Events: each dev_event carries a cudaEvent_t (DisableTiming). record = cudaEventRecord on the
 * compute stream; wait = cudaStreamWaitEvent. A collective whose producer cannot record at issue
 * time (a threaded comm: gloo staged) leaves a CPU mark pending; wait() then blocks the STREAM (not
 * the host) with a host function until the comm thread completes the mark, at most wait_s (the
 * job's timeout_s: then the device fails with the reason). With host_marks set,
 * record also completes a CPU mark from a host function when the stream reaches it, so that a comm
 * thread can wait for exactly the record that was the latest when the collective was issued.
 *
 * Spans (trace.h): a span boundary is a timing event of the window too; sync() and timers() turn
 * each into host time (an event recorded on the idle stream and synchronized is "now" on the host's
 * monotonic clock; an earlier event is that minus the elapsed time between them: cuda_spans.h,
 * which NCCL's spans share) and record the spans in order.
 *
 * Timers (device_cuda_timing.c): timing events at every set_timer change and around every wait;
 * timers() (after sync) charges each segment of stream time to its timer and each wait's blocked time to the wait's
 * timer (taken out of the segment's). Stream time includes gaps in which the stream waited for the
 * host to submit, so "compute" is an upper bound of the kernels' busy time.
 *
 * One host thread drives a device (the runtime's); host functions touch only dev_events and the
 * device's host_failed / host_msg (device_cuda_int.h).
 */
#include "device_cuda_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_cuda_kern.h"
#include "log.h"
#include "nf4.h"

_Static_assert(PLAN_CUDA_WORKSPACE_BYTES >= (int64_t)OPS_CUDA_WORKSPACE_MIN,
               "plan.h's CUDA workspace must be at least what ops_cuda.h needs");

/* ---- errors ---- */

static void fail_status(cuda_dev *d, fsdp_status st, const char *what) {
  if (st == FSDP_OK || d->err != FSDP_OK) return;
  d->err = st;
  snprintf(d->msg, sizeof d->msg, "%s: %s", what, fsdp_last_error());
}

static void fail_cuda(cuda_dev *d, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();   /* leave no non-sticky error behind for the next launch check */
  if (d->err != FSDP_OK) return;
  d->err = FSDP_ERR_CUDA;
  snprintf(d->msg, sizeof d->msg, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static fsdp_status report(cuda_dev *d) {
  return fsdp_set_error(d->err, "CUDA device %d: %s", d->gpu, d->msg);
}

/* After a synchronization of the stream: a host function's failure becomes the device's. */
static void take_host_failure(cuda_dev *d) {
  if (!atomic_load_explicit(&d->host_failed, memory_order_acquire) || d->err != FSDP_OK) return;
  d->err = FSDP_ERR_TIMEOUT;
  snprintf(d->msg, sizeof d->msg, "%s", d->host_msg);
}

/* Run an ops_cuda call unless the device has already failed. */
#define OP(d, call, what)                      \
  do {                                         \
    if ((d)->err == FSDP_OK) fail_status((d), (call), (what)); \
  } while (0)
#define CU(d, call, what)                      \
  do {                                         \
    if ((d)->err == FSDP_OK) fail_cuda((d), (call), (what)); \
  } while (0)

/* ---- memory ---- */

static void *cu_alloc(device_t *dd, mem_category cat, size_t bytes) {
  cuda_dev *d = cd(dd);
  void *p = NULL;
  size_t n = bytes ? bytes : 1;
  cudaError_t e = cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    (void)cudaGetLastError();
    fsdp_set_error(FSDP_ERR_NOMEM, "CUDA device %d: cannot allocate %zu bytes for %s: %s (%.1f MiB free of %.1f MiB)",
                   d->gpu, bytes, plan_mem_category_name(cat), cudaGetErrorString(e), (double)fr / (1 << 20),
                   (double)tot / (1 << 20));
    return NULL;
  }
  if ((e = cudaMemsetAsync(p, 0, n, d->stream)) != cudaSuccess || (e = cudaStreamSynchronize(d->stream)) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(p);
    fsdp_set_error(FSDP_ERR_CUDA, "CUDA device %d: zeroing %zu new bytes for %s: %s", d->gpu, bytes,
                   plan_mem_category_name(cat), cudaGetErrorString(e));
    return NULL;
  }
  if (d->nrec == d->caprec) {
    int cap = d->caprec ? 2 * d->caprec : 64;
    alloc_rec *r = realloc(d->recs, (size_t)cap * sizeof *r);
    if (!r) {
      cudaFree(p);
      fsdp_set_error(FSDP_ERR_NOMEM, "CUDA device %d: out of host memory for the allocation table", d->gpu);
      return NULL;
    }
    d->recs = r;
    d->caprec = cap;
  }
  d->recs[d->nrec++] = (alloc_rec){.p = p, .bytes = bytes, .cat = cat};
  mem_account(cat, (int64_t)bytes);
  return p;
}

/* Pinned (page-locked) host memory: the offloaded optimizer state, copied at full PCIe speed. */
static void *cu_alloc_host(device_t *dd, size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fsdp_set_error(FSDP_ERR_NOMEM, "CUDA device %d: cannot pin %zu bytes of host memory: %s", cd(dd)->gpu, bytes,
                   cudaGetErrorString(e));
    return NULL;
  }
  memset(p, 0, bytes);
  return p;
}

static void cu_free_host(device_t *dd, void *p) {
  if (!p) return;
  cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    log_warn("CUDA device %d: cudaFreeHost: %s", cd(dd)->gpu, cudaGetErrorString(e));
  }
}

static void cu_free(device_t *dd, void *p) {
  cuda_dev *d = cd(dd);
  if (!p) return;
  for (int i = 0; i < d->nrec; i++) {
    if (d->recs[i].p != p) continue;
    mem_account(d->recs[i].cat, -(int64_t)d->recs[i].bytes);
    d->recs[i] = d->recs[--d->nrec];
    cudaError_t e = cudaFree(p);   /* synchronizes the device: the stream is idle by contract anyway */
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      log_warn("CUDA device %d: cudaFree: %s", d->gpu, cudaGetErrorString(e));
    }
    return;
  }
  log_error("CUDA device %d: free of %p, which this device did not allocate; ignored", d->gpu, p);
}

static fsdp_status cu_sync(device_t *dd) {
  cuda_dev *d = cd(dd);
  fail_cuda(d, cudaStreamSynchronize(d->stream), "cudaStreamSynchronize (a kernel or copy failed)");
  take_host_failure(d);
  if (d->nmarks > 0) {   /* spans closed since the last timers() (an evaluation's): resolve them now */
    int e = cuda_dev_tev_record(d);
    if (e >= 0 && cudaEventSynchronize(d->tev[e]) == cudaSuccess) cuda_dev_resolve_marks(d, e);
    d->nmarks = 0;
    (void)cudaGetLastError();
  }
  return d->err == FSDP_OK ? FSDP_OK : report(d);
}

static fsdp_status copy_sync(cuda_dev *d, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k,
                             const char *what) {
  if (d->err != FSDP_OK) return report(d);
  if (bytes) CU(d, cudaMemcpyAsync(dst, src, bytes, k, d->stream), what);
  CU(d, cudaStreamSynchronize(d->stream), what);
  take_host_failure(d);
  return d->err == FSDP_OK ? FSDP_OK : report(d);
}

/* Both after the work submitted before them (stream order), and complete when they return. */
static fsdp_status cu_upload(device_t *d, void *dst, const void *src, size_t bytes) {
  return copy_sync(cd(d), dst, src, bytes, cudaMemcpyHostToDevice, "upload (host to device)");
}
static fsdp_status cu_download(device_t *d, void *dst, const void *src, size_t bytes) {
  return copy_sync(cd(d), dst, src, bytes, cudaMemcpyDeviceToHost, "download (device to host)");
}

/* On copy_stream, after the compute stream's work so far (an event between the two streams). */
static fsdp_status cu_snapshot(device_t *dd, void *dst, const void *src, size_t bytes) {
  cuda_dev *d = cd(dd);
  if (d->err != FSDP_OK) return report(d);
  if (!d->copy_stream) {
    CU(d, cudaStreamCreateWithFlags(&d->copy_stream, cudaStreamNonBlocking), "creating the snapshot stream");
    CU(d, cudaEventCreateWithFlags(&d->copy_after, cudaEventDisableTiming), "creating the snapshot event");
    if (d->err != FSDP_OK) return report(d);
  }
  CU(d, cudaEventRecord(d->copy_after, d->stream), "snapshot (event on the compute stream)");
  CU(d, cudaStreamWaitEvent(d->copy_stream, d->copy_after, 0), "snapshot (stream wait)");
  if (bytes) CU(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->copy_stream), "snapshot (device to host)");
  CU(d, cudaStreamSynchronize(d->copy_stream), "snapshot (device to host)");
  return d->err == FSDP_OK ? FSDP_OK : report(d);
}

/* ---- events ---- */

static fsdp_status cu_event_create(device_t *dd, void **native) {
  cuda_dev *d = cd(dd);
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fsdp_set_error(FSDP_ERR_CUDA, "CUDA device %d: cudaEventCreateWithFlags: %s", d->gpu, cudaGetErrorString(e));
  }
  *native = (void *)ev;
  return FSDP_OK;
}

static void cu_event_destroy(device_t *dd, void *native) {
  (void)dd;
  if (native) cudaEventDestroy((cudaEvent_t)native);
}

typedef struct host_mark {
  cuda_dev *d;
  dev_event *e;
  uint64_t ticket;
  int wait;            /* 1: block the stream until the mark completes; 0: complete it */
} host_mark;

/* On CUDA's host-function thread. A comm completes every mark it took, also when it fails
 * (comm.h), so the wait ends unless the comm thread itself is gone or stuck: then it gives up
 * after wait_s, the stream runs on (on data the collective never delivered) and the next sync()
 * fails the job with this reason. */
static void CUDART_CB host_mark_fn(void *arg) {
  host_mark *m = arg;
  cuda_dev *d = m->d;
  if (!m->wait) {
    dev_event_complete(m->e, m->ticket);
  } else if (dev_event_host_wait(m->e, m->ticket, d->wait_s) != FSDP_OK &&
             !atomic_load_explicit(&d->host_failed, memory_order_relaxed)) {
    snprintf(d->host_msg, sizeof d->host_msg,
             "the stream waited %g s (the job's timeout_s) for a collective of the staged comm that never "
             "completed (event mark %llu): its comm thread is stuck or gone",
             d->wait_s, (unsigned long long)m->ticket);
    atomic_store_explicit(&d->host_failed, 1, memory_order_release);
  }
  free(m);
}

static void host_fn(cuda_dev *d, dev_event *e, uint64_t ticket, int wait) {
  host_mark *m = malloc(sizeof *m);
  if (!m) {
    if (d->err == FSDP_OK) {
      d->err = FSDP_ERR_NOMEM;
      snprintf(d->msg, sizeof d->msg, "out of host memory for a stream host function");
    }
    if (!wait) dev_event_complete(e, ticket);
    return;
  }
  *m = (host_mark){.d = d, .e = e, .ticket = ticket, .wait = wait};
  cudaError_t r = cudaLaunchHostFunc(d->stream, host_mark_fn, m);
  if (r != cudaSuccess) {
    free(m);
    fail_cuda(d, r, "cudaLaunchHostFunc");
    if (!wait) dev_event_complete(e, ticket);
  }
}

static void cu_record(device_t *dd, dev_event *e) {
  cuda_dev *d = cd(dd);
  CU(d, cudaEventRecord((cudaEvent_t)dev_event_native(e), d->stream), "cudaEventRecord");
  if (!dd->host_marks) return;
  uint64_t t = dev_event_mark(e);
  if (d->err != FSDP_OK) dev_event_complete(e, t);   /* a failed stream completes nothing: release waiters */
  else host_fn(d, e, t, 0);
}

static void cu_wait(device_t *dd, dev_event *e, dev_timer timer) {
  cuda_dev *d = cd(dd);
  if (d->err != FSDP_OK) return;
  uint64_t t = dev_event_last(e);
  int ev0 = d->timing ? cuda_dev_tev_record(d) : -1;
  if (t > 0 && !dev_event_is_complete(e, t)) host_fn(d, e, t, 1);   /* a threaded comm's pending mark */
  CU(d, cudaStreamWaitEvent(d->stream, (cudaEvent_t)dev_event_native(e), 0), "cudaStreamWaitEvent");
  int ev1 = d->timing ? cuda_dev_tev_record(d) : -1;
  cuda_dev_tl_add(d, (tentry){.wait = 1, .timer = (int)timer, .seg_timer = d->timer, .ev0 = ev0, .ev1 = ev1});
}

/* ---- memory operations ---- */

static void cu_zero(device_t *dd, void *p, size_t bytes) {
  cuda_dev *d = cd(dd);
  if (bytes) CU(d, cudaMemsetAsync(p, 0, bytes, d->stream), "zero (cudaMemsetAsync)");
}

static void cu_copy(device_t *dd, void *dst, const void *src, size_t bytes) {
  cuda_dev *d = cd(dd);
  if (bytes) CU(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->stream), "copy (cudaMemcpyAsync)");
}

static void cu_fill(device_t *dd, float *p, float v, int64_t n) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_fill_f32(p, v, n, &d->ctx), "fill");
}

static void cu_cast_bf16(device_t *dd, uint16_t *dst, const float *src, int64_t n) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_cast_f32_to_bf16((ops_bf16 *)dst, src, n, &d->ctx), "cast_bf16");
}

static void cu_to_act(device_t *dd, void *dst, const void *src, dtype_kind dt, int64_t n) {
  cuda_dev *d = cd(dd);
  if (dt == DTYPE_BF16) cu_copy(dd, dst, src, (size_t)n * 2);
  else OP(d, ops_cuda_cast_f32_to_bf16(dst, src, n, &d->ctx), "to_act");
}

static void cu_nf4_dequant(device_t *dd, uint16_t *out, const uint8_t *rec, int64_t n) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_nf4_dequantize((ops_bf16 *)out, rec, d->nf4_maps, n, &d->ctx), "nf4_dequant");
}

static void cu_add(device_t *dd, float *dst, const void *src, dtype_kind dt, int64_t n) {
  cuda_dev *d = cd(dd);
  if (dt == DTYPE_BF16) OP(d, ops_cuda_accumulate_bf16(dst, src, n, &d->ctx), "add (bf16)");
  else OP(d, ops_cuda_accumulate_f32(dst, src, n, &d->ctx), "add (fp32)");
}

static void cu_add_act(device_t *dd, void *dst, const void *src, int64_t n) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_residual_forward(dst, dst, src, n, &d->ctx), "add_act");   /* out may equal a */
}

static void cu_act_axpby(device_t *dd, void *dst, int64_t dld, const void *src, int64_t sld, int64_t rows,
                         int64_t cols, float alpha, float beta) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_act_axpby(dst, dld, src, sld, rows, cols, alpha, beta, &d->ctx), "act_axpby");
}

static void cu_gemm(device_t *dd, int ta, int tb, int M, int N, int K, float alpha, const void *A, int64_t lda,
                    const void *B, int64_t ldb, float beta, void *C, int64_t ldc, int c_f32) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, c_f32, &d->ctx), "gemm");
}

/* ---- optimizer ---- */

static void cu_sumsq(device_t *dd, float *out, const float *x, int64_t n, float scale) {
  cuda_dev *d = cd(dd);
  int *flag = (int *)d->scal;
  OP(d, ops_cuda_sumsq(out, flag, x, n, &d->ctx), "sumsq");
  OP(d, dev_cuda_sumsq_post(out, flag, scale, d->stream), "sumsq");
}

/* An NF4 base's dequantization maps, uploaded once, at the first bind of a plan that has one. */
static fsdp_status bind_nf4_maps(cuda_dev *d) {
  float h[PLAN_NF4_MAPS_BYTES / sizeof(float)];
  for (int i = 0; i < 16; i++) h[i] = nf4_code[i];
  for (int i = 0; i < 256; i++) h[16 + i] = nf4_dynamic(i);
  if (!(d->nf4_maps = cu_alloc(&d->base, MEM_WORKSPACE, sizeof h))) return FSDP_ERR_NOMEM;
  return cu_upload(&d->base, d->nf4_maps, h, sizeof h);
}

/* The binding of plan P (NULL: none), or with P NULL a free one. */
static struct cuda_binding *binding_of(cuda_dev *d, const plan_t *p) {
  for (int i = 0; i < DEV_CUDA_BINDINGS; i++)
    if (d->bound[i].plan == p) return &d->bound[i];
  return NULL;
}

/* AdamW's decay segments of RANK's shard of P: [start, end) shard indices of every 2-D tensor's
 * part. A plan bound again replaces its table; up to DEV_CUDA_BINDINGS plans at once. */
static fsdp_status cu_bind(device_t *dd, const plan_t *p, int rank) {
  cuda_dev *d = cd(dd);
  int hs = p->model.n_head > 0 ? p->model.n_embd / p->model.n_head : 0;
  if (hs != 64 && hs != 128)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "device = cuda: head size n_embd/n_head = %d; the fused attention "
                          "kernels support 64 or 128", hs);
  if (p->lora.nf4 && !d->nf4_maps) TRY(bind_nf4_maps(d));
  struct cuda_binding *b = binding_of(d, p);
  if (!b) b = binding_of(d, NULL);
  if (!b)
    return fsdp_set_error(FSDP_ERR_STATE, "the CUDA device holds %d optimizer bindings already (the base's and the "
                          "adapters')", DEV_CUDA_BINDINGS);
  int cap = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++) cap += p->units[u].t[t].decay;
  /* 16 bytes per 2-D tensor, as plan.c's workspace term counts them (GPT-2: 2 + 4·L; Llama: 2 + 7·L;
   * [lora]: L more, one a block's adapters) */
  int64_t *h = calloc((size_t)(cap > 0 ? cap : 1) * 2, sizeof *h);
  if (!h) return fsdp_set_error(FSDP_ERR_NOMEM, "out of host memory for AdamW's decay segments");
  int n = 0;
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *un = &p->units[u];
    const int64_t lo = plan_shard_offset(p, u, rank), hi = lo + un->shard_numel, base = un->shard_base - lo;
    for (int t = 0; t < un->ntensors; t++) {
      const plan_tensor *pt = &un->t[t];
      int64_t a = pt->offset > lo ? pt->offset : lo, e = pt->offset + pt->numel < hi ? pt->offset + pt->numel : hi;
      if (!pt->decay || a >= e) continue;
      h[2 * n] = base + a;
      h[2 * n + 1] = base + e;
      n++;
    }
  }
  if (b->segs) cu_free(dd, b->segs);
  *b = (struct cuda_binding){0};
  int64_t *segs = cu_alloc(dd, MEM_WORKSPACE, (size_t)(cap > 0 ? cap : 1) * 2 * sizeof(int64_t));
  fsdp_status rc = segs ? cu_upload(dd, segs, h, (size_t)n * 2 * sizeof(int64_t)) : FSDP_ERR_NOMEM;
  free(h);
  if (rc != FSDP_OK) {
    if (segs) cu_free(dd, segs);
    return rc;
  }
  *b = (struct cuda_binding){.plan = p, .rank = rank, .segs = segs, .nseg = n};
  return FSDP_OK;
}

static void cu_adamw(device_t *dd, const plan_t *p, int rank, float *param, const float *grad, float *m, float *v,
                     uint16_t *lp, int step, double lr, const optim_config *s, float grad_scale) {
  cuda_dev *d = cd(dd);
  if (d->err != FSDP_OK) return;
  const struct cuda_binding *b = binding_of(d, p);
  if (!b || rank != b->rank) {
    d->err = FSDP_ERR_STATE;
    snprintf(d->msg, sizeof d->msg, "adamw for rank %d of a plan the device was not bound to (bind first)", rank);
    return;
  }
  ops_cuda_adamw_consts_t k = ops_cuda_adamw_consts(step, lr, s->beta1, s->beta2, s->eps, s->weight_decay, grad_scale);
  OP(d, ops_cuda_adamw(param, (ops_bf16 *)lp, m, v, grad, p->shard_total, b->segs, b->nseg, &k, &d->ctx), "adamw");
}

/* ---- the model's operators ---- */

static void cu_encoder_forward(device_t *dd, void *out, const int *inp, const void *wte, const void *wpe, int B, int T,
                               int C, const int32_t *seg) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_encoder_forward(out, inp, wte, wpe, B, T, C, seg, &d->ctx), "encoder_forward");
}

static void cu_encoder_backward(device_t *dd, float *dwte, float *dwpe, const void *dout, const int *inp, int B, int T,
                                int C, int pad, const int32_t *seg) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_encoder_backward(dwte, dwpe, dout, inp, B, T, C, pad, seg, &d->ctx), "encoder_backward");
}

static void cu_layernorm_forward(device_t *dd, void *out, float *mean, float *rstd, const void *inp, const void *w,
                                 const void *b, int B, int T, int C) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_layernorm_forward(out, mean, rstd, inp, w, b, B, T, C, &d->ctx), "layernorm_forward");
}

static void cu_layernorm_backward(device_t *dd, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                  const void *w, const float *mean, const float *rstd, int B, int T, int C) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, B, T, C, &d->ctx), "layernorm_backward");
}

static void cu_layernorm_backward_add(device_t *dd, void *dres, float *dw, float *db, const void *dout,
                                      const void *inp, const void *w, const float *mean, const float *rstd, int B,
                                      int T, int C) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_layernorm_backward_acc(dres, dw, db, dout, inp, w, mean, rstd, B, T, C, &d->ctx),
     "layernorm_backward (accumulated)");
}

static void cu_matmul_forward(device_t *dd, void *out, const void *inp, const void *w, const void *bias, int BT, int C,
                              int OC) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_matmul_forward(out, NULL, inp, w, bias, BT, C, OC, &d->ctx), "matmul_forward");
}

/* GELU in cuBLASLt's epilogue (GELU_AUX_BIAS: out and the pre-activation in one GEMM), or its
 * fallback inside ops_cuda_matmul_forward. */
static void cu_matmul_gelu_forward(device_t *dd, void *out, void *pre, const void *inp, const void *w,
                                   const void *bias, int BT, int C, int OC) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_matmul_forward(out, pre, inp, w, bias, BT, C, OC, &d->ctx), "matmul_gelu_forward");
}

static void cu_matmul_backward_gelu(device_t *dd, void *dinp, float *dw, float *db, const void *dout,
                                    const void *inp, const void *w, const void *pre, int BT, int C, int OC) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_matmul_backward(dinp, dw, db, dout, inp, w, pre, BT, C, OC, &d->ctx), "matmul_backward");
}

static void cu_matmul_backward(device_t *dd, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                               const void *w, int BT, int C, int OC) {
  cu_matmul_backward_gelu(dd, dinp, dw, db, dout, inp, w, NULL, BT, C, OC);
}

static void cu_attention_forward(device_t *dd, void *out, void *state, const void *qkv, int B, int T, int C, int NH,
                                 int NKV, const int32_t *seg, int window) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_attention_forward(out, state, qkv, B, T, C, NH, NKV, seg, window, &d->ctx), "attention_forward");
}

static void cu_attention_backward(device_t *dd, void *dqkv, void *scratch, const void *dout, const void *qkv,
                                  const void *out, const void *state, int B, int T, int C, int NH, int NKV,
                                  const int32_t *seg, int window) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_attention_backward(dqkv, scratch, dout, qkv, out, state, B, T, C, NH, NKV, seg, window, &d->ctx),
     "attention_backward");
}

static void cu_gelu_forward(device_t *dd, void *out, const void *inp, int64_t N) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_gelu_forward(out, inp, N, &d->ctx), "gelu_forward");
}

static void cu_gelu_backward(device_t *dd, void *dinp, const void *inp, const void *dout, int64_t N) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_gelu_backward(dinp, inp, dout, N, &d->ctx), "gelu_backward");
}

static void cu_residual_forward(device_t *dd, void *out, const void *a, const void *b, int64_t N) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_residual_forward(out, a, b, N, &d->ctx), "residual_forward");
}

static void cu_residual_layernorm_forward(device_t *dd, void *res, void *out, float *mean, float *rstd, const void *a,
                                          const void *b, const void *w, const void *bias, int B, int T, int C) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, B, T, C, &d->ctx),
     "residual_layernorm_forward");
}

static void cu_classifier(device_t *dd, void *dinp, float *dwte, float *losses, float *loss_acc, void *logits,
                          const void *inp, const void *wte, const int *targets, int BT, int C, int V, float dscale) {
  cuda_dev *d = cd(dd);
  const int chunk = (int)plan_classifier_chunk(BT, V); /* the rows of dev_logits_bytes (gpu_check checks) */
  OP(d, ops_cuda_classifier_forward_backward(losses, dinp, dwte, logits, inp, wte, targets, BT, C, V, chunk, dscale,
                                             &d->ctx), "classifier");
  OP(d, ops_cuda_loss_sum(loss_acc, losses, BT, &d->ctx), "classifier loss sum");
}

/* ---- Llama's operators ---- */

static void cu_linear_forward(device_t *dd, void *out, const void *inp, const void *w, const void *bias, int BT, int C,
                              int OC) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_linear_forward(out, inp, w, bias, BT, C, OC, &d->ctx), "linear_forward");
}

static void cu_linear_backward(device_t *dd, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                               const void *w, int BT, int C, int OC) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_linear_backward(dinp, dw, db, dout, inp, w, BT, C, OC, &d->ctx), "linear_backward");
}

static void cu_qk_norm_forward(device_t *dd, void *out, float *rstd, const void *inp, const void *wq, const void *wk,
                               int BT, int NH, int NKV, int HD, float eps, float woff) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_qk_norm_forward(out, rstd, inp, wq, wk, BT, NH, NKV, HD, eps, woff, &d->ctx), "qk_norm_forward");
}

static void cu_qk_norm_backward(device_t *dd, void *dinp, float *dwq, float *dwk, const void *dout, const void *inp,
                                const void *wq, const void *wk, const float *rstd, int BT, int NH, int NKV, int HD,
                                float woff) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_qk_norm_backward(dinp, dwq, dwk, dout, inp, wq, wk, rstd, BT, NH, NKV, HD, woff, &d->ctx),
     "qk_norm_backward");
}

static void cu_rmsnorm_forward(device_t *dd, void *out, float *rstd, const void *inp, const void *w, int BT, int C,
                               float eps, float woff) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_rmsnorm_forward(out, rstd, inp, w, BT, C, eps, woff, &d->ctx), "rmsnorm_forward");
}

static void cu_rmsnorm_backward(device_t *dd, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                const float *rstd, int BT, int C, float woff) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, BT, C, woff, &d->ctx), "rmsnorm_backward");
}

static void cu_rmsnorm_backward_add(device_t *dd, void *dres, float *dw, const void *dout, const void *inp,
                                    const void *w, const float *rstd, int BT, int C, float woff) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_rmsnorm_backward_acc(dres, dw, dout, inp, w, rstd, BT, C, woff, &d->ctx),
     "rmsnorm_backward (accumulated)");
}

static void cu_rope_forward(device_t *dd, void *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                            const int32_t *seg) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_rope_forward(qkv, B, T, NH, NKV, HS, rope, seg, &d->ctx), "rope_forward");
}

static void cu_rope_backward(device_t *dd, void *dqkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                             const int32_t *seg) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_rope_backward(dqkv, B, T, NH, NKV, HS, rope, seg, &d->ctx), "rope_backward");
}

static void cu_swiglu_forward(device_t *dd, void *out, const void *gu, int BT, int F) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_swiglu_forward(out, gu, BT, F, &d->ctx), "swiglu_forward");
}

static void cu_swiglu_backward(device_t *dd, void *dgu, const void *gu, const void *dout, int BT, int F) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_swiglu_backward(dgu, gu, dout, BT, F, &d->ctx), "swiglu_backward");
}

static void cu_geglu_forward(device_t *dd, void *out, const void *gu, int BT, int F) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_geglu_forward(out, gu, BT, F, &d->ctx), "geglu_forward");
}

static void cu_geglu_backward(device_t *dd, void *dgu, const void *gu, const void *dout, int BT, int F) {
  cuda_dev *d = cd(dd);
  OP(d, ops_cuda_geglu_backward(dgu, gu, dout, BT, F, &d->ctx), "geglu_backward");
}

/* ---- lifetime ---- */

static void cu_destroy(device_t *dd) {
  cuda_dev *d = cd(dd);
  cudaSetDevice(d->gpu);
  if (d->stream) cudaStreamSynchronize(d->stream);
  (void)cudaGetLastError();
  int own = (d->ws ? 1 : 0) + (d->scal ? 1 : 0) + (d->nf4_maps ? 1 : 0);
  for (int i = 0; i < DEV_CUDA_BINDINGS; i++) own += d->bound[i].segs != NULL;
  if (d->nrec > own)
    log_warn("CUDA device %d: %d buffer(s) still allocated at destroy; freeing them", d->gpu, d->nrec);
  while (d->nrec > 0) cu_free(dd, d->recs[d->nrec - 1].p);
  for (int i = 0; i < d->captev; i++) cudaEventDestroy(d->tev[i]);
  if (d->lt) cublasLtDestroy(d->lt);
  if (d->copy_stream) cudaStreamDestroy(d->copy_stream);
  if (d->copy_after) cudaEventDestroy(d->copy_after);
  if (d->stream) cudaStreamDestroy(d->stream);
  (void)cudaGetLastError();
  free(d->tev);
  free(d->tl);
  free(d->marks);
  free(d->recs);
  free(d);
}

static const dev_ops cuda_ops = {
    .name = "cuda", .alloc = cu_alloc, .free = cu_free, .alloc_host = cu_alloc_host, .free_host = cu_free_host,
    .upload = cu_upload, .download = cu_download, .snapshot = cu_snapshot, .record = cu_record, .wait = cu_wait,
    .sync = cu_sync, .set_timer = cuda_dev_set_timer, .timers = cuda_dev_timers, .event_create = cu_event_create,
    .event_destroy = cu_event_destroy, .bind = cu_bind, .trace = cuda_dev_trace, .zero = cu_zero, .copy = cu_copy,
    .destroy = cu_destroy};

static const dev_kernels cuda_kernels = {
    .fill = cu_fill, .cast_bf16 = cu_cast_bf16, .to_act = cu_to_act, .nf4_dequant = cu_nf4_dequant, .add = cu_add,
    .add_act = cu_add_act, .act_axpby = cu_act_axpby, .gemm = cu_gemm, .sumsq = cu_sumsq, .adamw = cu_adamw, .encoder_forward = cu_encoder_forward,
    .encoder_backward = cu_encoder_backward, .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward, .layernorm_backward_add = cu_layernorm_backward_add,
    .matmul_forward = cu_matmul_forward,
    .matmul_backward = cu_matmul_backward, .matmul_gelu_forward = cu_matmul_gelu_forward,
    .matmul_backward_gelu = cu_matmul_backward_gelu,
    .attention_forward = cu_attention_forward, .attention_backward = cu_attention_backward, .gelu_forward = cu_gelu_forward, .gelu_backward = cu_gelu_backward,
    .residual_forward = cu_residual_forward, .residual_layernorm_forward = cu_residual_layernorm_forward,
    .classifier = cu_classifier, .linear_forward = cu_linear_forward,
    .linear_backward = cu_linear_backward, .rmsnorm_forward = cu_rmsnorm_forward,
    .rmsnorm_backward = cu_rmsnorm_backward, .rmsnorm_backward_add = cu_rmsnorm_backward_add,
    .rope_forward = cu_rope_forward, .rope_backward = cu_rope_backward,
    .swiglu_forward = cu_swiglu_forward, .swiglu_backward = cu_swiglu_backward,
    .qk_norm_forward = cu_qk_norm_forward, .qk_norm_backward = cu_qk_norm_backward,
    .geglu_forward = cu_geglu_forward, .geglu_backward = cu_geglu_backward};

fsdp_status dev_cuda_count(int *n) {
  *n = 0;
  cudaError_t e = cudaGetDeviceCount(n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *n = 0;
    return fsdp_set_error(FSDP_ERR_CUDA, "no usable GPU: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                          cudaGetErrorName(e));
  }
  if (*n == 0) return fsdp_set_error(FSDP_ERR_CUDA, "no usable GPU: cudaGetDeviceCount found none");
  return FSDP_OK;
}

fsdp_status dev_new_cuda(int gpu, double wait_s, device_t **out) {
  *out = NULL;
  int n = 0;
  cudaError_t e;
  if (!(wait_s > 0))
    return fsdp_set_error(FSDP_ERR_RANGE, "CUDA device: wait timeout %g s; allowed: > 0 (the job's timeout_s)", wait_s);
  TRY(dev_cuda_count(&n));
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (gpu < 0 || gpu >= n)
    return fsdp_set_error(FSDP_ERR_RANGE, "GPU %d does not exist: %d visible (CUDA_VISIBLE_DEVICES=%s)", gpu, n,
                          vis ? vis : "unset");
  cuda_dev *d = calloc(1, sizeof *d);
  if (!d) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the CUDA device");
  d->base.op = &cuda_ops;
  d->base.kern = &cuda_kernels;
  d->base.kind = DEVICE_CUDA;
  d->base.act_bytes = 2;
  d->base.host_accessible = 0;
  d->gpu = gpu;
  d->wait_s = wait_s;
  d->timer = DEV_T_COMPUTE;
  fsdp_status rc = FSDP_OK;
  if ((e = cudaSetDevice(gpu)) != cudaSuccess || (e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking)) != cudaSuccess) {
    (void)cudaGetLastError();
    rc = fsdp_set_error(FSDP_ERR_CUDA, "no usable GPU: GPU %d: %s (%s)", gpu, cudaGetErrorString(e), cudaGetErrorName(e));
    goto fail;
  }
  cublasStatus_t bs = cublasLtCreate(&d->lt);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    d->lt = NULL;
    rc = fsdp_set_error(FSDP_ERR_CUDA, "GPU %d: cublasLtCreate failed (status %d)", gpu, (int)bs);
    goto fail;
  }
  d->ws = cu_alloc(&d->base, MEM_WORKSPACE, (size_t)PLAN_CUDA_WORKSPACE_BYTES);
  d->scal = d->ws ? cu_alloc(&d->base, MEM_WORKSPACE, PLAN_CUDA_SCALAR_BYTES) : NULL;
  if (!d->ws || !d->scal) {
    rc = FSDP_ERR_NOMEM;   /* cu_alloc said why */
    goto fail;
  }
  d->ctx = (ops_cuda_ctx){.stream = d->stream, .lt = d->lt, .workspace = d->ws,
                          .workspace_bytes = (size_t)PLAN_CUDA_WORKSPACE_BYTES, .device = gpu};
  cuda_dev_window_open(d);
  *out = &d->base;
  return FSDP_OK;
fail:
  cu_destroy(&d->base);
  return rc;
}
