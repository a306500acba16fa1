/* device_cpu — the CPU device (device.h) over ops_cpu.c and optim.c, in fp32; its GEMMs in bf16
 * with fp32 accumulation when dev_cpu_set_compute asked for bf16 and the CPU has AVX512-BF16 that
 * measures fast enough against fp32 FMA (gemm_bf16.h; FSDP_CPU_BF16 overrides that).
 *
 * Every stream operation is packed into a task (a function and its arguments by value) and either
 * run at once on the caller's thread (sync) or appended to a bounded ring that one stream thread
 * runs in order (async, strict). The ring is allocated with the device; a full ring blocks the
 * submitter, as a full CUDA launch queue does. Busy time of each task and blocked time of each
 * wait are charged to the task's timer on the thread that runs it.
 */
#include "device.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_bf16.h"
#include "mem.h"
#include "monotime.h"
#include "nf4.h"
#include "ops_cpu.h"
#include "optim.h"
#include "safetensors.h"

#define RING 4096
#define NARG 18

typedef struct cpu_dev cpu_dev;

typedef union targ {
  void *p;
  int64_t i;
  double f;
} targ;

typedef struct task {
  void (*run)(cpu_dev *d, const targ *a);
  int timer;
  targ a[NARG];
} task;

struct cpu_dev {
  device_t base;
  dev_cpu_mode mode;
  int timer;                     /* host side: the timer of the next submissions */
  gemm_kind gemm;                /* what its GEMMs run (gemm_bf16.h), set before the first task */
  uint64_t us[DEV_NTIMER];       /* charged by whoever runs the tasks; read after sync */

  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv_put, cv_get, cv_idle;
  task *ring;
  uint64_t head, tail;           /* tasks [tail, head) are queued */
  int running, stop;
};

static void run_task(cpu_dev *d, const task *t) {
  gemm_bf16_set_active(d->gemm);   /* per thread: the stream's, or the host's in sync mode */
  uint64_t t0 = monotime_us();
  t->run(d, t->a);
  if (t->timer < DEV_NTIMER) d->us[t->timer] += monotime_us() - t0;   /* waits charge their own */
}

static void *stream_main(void *arg) {
  cpu_dev *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (d->tail == d->head && !d->stop) pthread_cond_wait(&d->cv_get, &d->mu);
    if (d->tail == d->head) break;
    task t = d->ring[d->tail % RING];
    d->running = 1;
    pthread_mutex_unlock(&d->mu);
    run_task(d, &t);
    pthread_mutex_lock(&d->mu);
    d->running = 0;
    d->tail++;
    pthread_cond_signal(&d->cv_put);
    if (d->tail == d->head) pthread_cond_broadcast(&d->cv_idle);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

static void submit(cpu_dev *d, void (*run)(cpu_dev *, const targ *), const targ *a, int n, int timer) {
  task t = {.run = run, .timer = timer};
  memcpy(t.a, a, (size_t)n * sizeof *a);
  if (d->mode == DEV_CPU_SYNC) {
    run_task(d, &t);
    return;
  }
  pthread_mutex_lock(&d->mu);
  while (d->head - d->tail >= RING) pthread_cond_wait(&d->cv_put, &d->mu);
  d->ring[d->head % RING] = t;
  d->head++;
  pthread_cond_signal(&d->cv_get);
  pthread_mutex_unlock(&d->mu);
}

/* Argument packing: pointers lose const in the task and regain it in the runner. */
#define P(x) {.p = (void *)(uintptr_t)(x)}
#define I(x) {.i = (int64_t)(x)}
#define F(x) {.f = (double)(x)}
#define SUBMIT(d, fn, ...)                                                                         \
  do {                                                                                             \
    const targ args_[] = {__VA_ARGS__};                                                            \
    _Static_assert(sizeof args_ / sizeof args_[0] <= NARG, "a task holds at most NARG arguments"); \
    submit((cpu_dev *)(d), fn, args_, (int)(sizeof args_ / sizeof args_[0]), ((cpu_dev *)(d))->timer); \
  } while (0)

/* ---- memory ---- */

static void *cpu_alloc(device_t *d, mem_category cat, size_t bytes) {
  (void)d;
  return mem_alloc(cat, bytes);
}
static void cpu_free(device_t *d, void *p) {
  (void)d;
  mem_free(p);
}

/* Page-aligned, as pinned memory is: a checkpoint snapshot is written from it with O_DIRECT. */
static void *cpu_alloc_host(device_t *d, size_t bytes) {
  (void)d;
  size_t n = (bytes + 4095) & ~(size_t)4095;
  void *p = aligned_alloc(4096, n ? n : 4096);
  if (!p) fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
  else memset(p, 0, n ? n : 4096);
  return p;
}
static void cpu_free_host(device_t *d, void *p) {
  (void)d;
  free(p);
}

static fsdp_status cpu_sync(device_t *dd) {
  cpu_dev *d = (cpu_dev *)dd;
  if (d->mode == DEV_CPU_SYNC) return FSDP_OK;
  pthread_mutex_lock(&d->mu);
  while (d->tail != d->head) pthread_cond_wait(&d->cv_idle, &d->mu);
  pthread_mutex_unlock(&d->mu);
  return FSDP_OK;
}

static fsdp_status cpu_upload(device_t *d, void *dst, const void *src, size_t bytes) {
  TRY(cpu_sync(d));
  if (bytes) memcpy(dst, src, bytes);
  return FSDP_OK;
}
static fsdp_status cpu_download(device_t *d, void *dst, const void *src, size_t bytes) {
  TRY(cpu_sync(d));
  if (bytes) memcpy(dst, src, bytes);
  return FSDP_OK;
}

/* ---- ordering ---- */

static void run_complete(cpu_dev *d, const targ *a) {
  (void)d;
  dev_event_complete(a[0].p, (uint64_t)a[1].i);
}
static void cpu_record(device_t *d, dev_event *e) {
  uint64_t t = dev_event_mark(e);
  SUBMIT(d, run_complete, P(e), I(t));
}

static void run_wait(cpu_dev *d, const targ *a) {
  uint64_t t0 = monotime_us();
  /* Collectives complete or fail within their comm's deadlines, and a failed comm completes
   * every pending event, so this wait ends. */
  dev_event_host_wait(a[0].p, (uint64_t)a[1].i, 1e9);
  d->us[a[2].i] += monotime_us() - t0;
}
static void cpu_wait(device_t *d, dev_event *e, dev_timer t) {
  const targ a[] = {P(e), I(dev_event_last(e)), I(t)};
  submit((cpu_dev *)d, run_wait, a, 3, DEV_NTIMER);   /* blocked time is charged to T by run_wait */
}

static void run_trace(cpu_dev *d, const targ *a) {
  (void)d;
  uint64_t now = monotime_us();
  if (a[1].i) trace_end(a[0].p, TRACE_STREAM, (trace_kind)a[2].i, (int)a[3].i, (int)a[4].i, now);
  else trace_begin(a[0].p, TRACE_STREAM, now);
}
static void cpu_trace(device_t *d, trace_t *t, int end, trace_kind kind, int unit, int step) {
  const targ a[] = {P(t), I(end), I(kind), I(unit), I(step)};
  submit((cpu_dev *)d, run_trace, a, 5, DEV_NTIMER);   /* bookkeeping, not stream work */
}

static void cpu_set_timer(device_t *d, dev_timer t) { ((cpu_dev *)d)->timer = (int)t; }

static void cpu_timers(device_t *dd, uint64_t us[DEV_NTIMER]) {
  cpu_dev *d = (cpu_dev *)dd;
  memcpy(us, d->us, sizeof d->us[0] * DEV_NTIMER);
  memset(d->us, 0, sizeof d->us);
}

/* ---- memory operations ---- */

static void run_zero(cpu_dev *d, const targ *a) {
  (void)d;
  memset(a[0].p, 0, (size_t)a[1].i);
}
static void cpu_zero(device_t *d, void *p, size_t bytes) { SUBMIT(d, run_zero, P(p), I(bytes)); }

static void run_copy(cpu_dev *d, const targ *a) {
  (void)d;
  memcpy(a[0].p, a[1].p, (size_t)a[2].i);
}
static void cpu_copy(device_t *d, void *dst, const void *src, size_t bytes) { SUBMIT(d, run_copy, P(dst), P(src), I(bytes)); }

static void run_fill(cpu_dev *d, const targ *a) {
  (void)d;
  float *p = a[0].p, v = (float)a[1].f;
  for (int64_t i = 0; i < a[2].i; i++) p[i] = v;
}
static void cpu_fill(device_t *d, float *p, float v, int64_t n) { SUBMIT(d, run_fill, P(p), F(v), I(n)); }

static void run_cast_bf16(cpu_dev *d, const targ *a) {
  (void)d;
  uint16_t *dst = a[0].p;
  const float *src = a[1].p;
  int64_t n = a[2].i;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dst[i] = st_f32_to_bf16(src[i]);
}
static void cpu_cast_bf16(device_t *d, uint16_t *dst, const float *src, int64_t n) {
  SUBMIT(d, run_cast_bf16, P(dst), P(src), I(n));
}

static void run_to_act(cpu_dev *d, const targ *a) {
  (void)d;
  float *dst = a[0].p;
  int64_t n = a[3].i;
  if (a[2].i == DTYPE_FP32) {
    memcpy(dst, a[1].p, (size_t)n * sizeof(float));
    return;
  }
  const uint16_t *src = a[1].p;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dst[i] = st_bf16_to_f32(src[i]);
}
static void cpu_to_act(device_t *d, void *dst, const void *src, dtype_kind dt, int64_t n) {
  SUBMIT(d, run_to_act, P(dst), P(src), I(dt), I(n));
}

static void run_nf4_dequant(cpu_dev *d, const targ *a) {
  (void)d;
  nf4_record_dequantize_bf16(a[1].p, a[2].i, a[0].p);
}
static void cpu_nf4_dequant(device_t *d, uint16_t *out, const uint8_t *rec, int64_t n) {
  SUBMIT(d, run_nf4_dequant, P(out), P(rec), I(n));
}

static void run_add(cpu_dev *d, const targ *a) {
  (void)d;
  float *dst = a[0].p;
  int64_t n = a[3].i;
  if (a[2].i == DTYPE_FP32) {
    const float *src = a[1].p;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
  } else {
    const uint16_t *src = a[1].p;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] += st_bf16_to_f32(src[i]);
  }
}
static void cpu_add(device_t *d, float *dst, const void *src, dtype_kind dt, int64_t n) {
  SUBMIT(d, run_add, P(dst), P(src), I(dt), I(n));
}
static void cpu_add_act(device_t *d, void *dst, const void *src, int64_t n) {
  SUBMIT(d, run_add, P(dst), P(src), I(DTYPE_FP32), I(n));
}

static void run_act_axpby(cpu_dev *d, const targ *a) {
  (void)d;
  float *dst = a[0].p;
  const float *src = a[2].p;
  int64_t dld = a[1].i, sld = a[3].i, rows = a[4].i, cols = a[5].i;
  float alpha = (float)a[6].f, beta = (float)a[7].f;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    float *o = dst + r * dld;
    const float *x = src + r * sld;
    if (beta == 0.0f)
      for (int64_t c = 0; c < cols; c++) o[c] = alpha * x[c];
    else
      for (int64_t c = 0; c < cols; c++) o[c] = alpha * x[c] + beta * o[c];
  }
}
static void cpu_act_axpby(device_t *d, void *dst, int64_t dld, const void *src, int64_t sld, int64_t rows,
                          int64_t cols, float alpha, float beta) {
  SUBMIT(d, run_act_axpby, P(dst), I(dld), P(src), I(sld), I(rows), I(cols), F(alpha), F(beta));
}

static void run_gemm(cpu_dev *d, const targ *a) {
  (void)d;
  gemm_strided((int)a[0].i, (int)a[1].i, (int)a[2].i, (int)a[3].i, (int)a[4].i, (float)a[5].f, a[6].p, a[7].i, a[8].p,
               a[9].i, (float)a[10].f, a[11].p, a[12].i);
}
static void cpu_gemm(device_t *d, int ta, int tb, int M, int N, int K, float alpha, const void *A, int64_t lda,
                     const void *B, int64_t ldb, float beta, void *C, int64_t ldc, int c_f32) {
  (void)c_f32;   /* act elements are fp32 on the CPU */
  SUBMIT(d, run_gemm, I(ta), I(tb), I(M), I(N), I(K), F(alpha), P(A), I(lda), P(B), I(ldb), F(beta), P(C), I(ldc));
}

/* ---- optimizer ---- */

static void run_sumsq(cpu_dev *d, const targ *a) {
  (void)d;
  float *out = a[0].p;
  const float *x = a[1].p;
  double sq = 0;
  for (int64_t i = 0; i < a[2].i; i++) sq += (double)x[i] * x[i];
  sq *= a[3].f;
  out[0] = (float)sq;
  out[1] = isfinite(sq) ? 0.0f : 1.0f;
}
static void cpu_sumsq(device_t *d, float *out, const float *x, int64_t n, float scale) {
  SUBMIT(d, run_sumsq, P(out), P(x), I(n), F(scale));
}

static void run_adamw(cpu_dev *d, const targ *a) {
  (void)d;
  const plan_t *p = a[0].p;
  float *param = a[2].p;
  optim_adamw_shard(p, (int)a[1].i, param, a[3].p, a[4].p, a[5].p, (int)a[7].i, a[8].f, a[9].p, (float)a[10].f);
  uint16_t *lp = a[6].p;
  if (!lp) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < p->shard_total; i++) lp[i] = st_f32_to_bf16(param[i]);
}
static void cpu_adamw(device_t *d, const plan_t *p, int rank, float *param, const float *grad, float *m, float *v,
                      uint16_t *lp, int step, double lr, const optim_config *s, float grad_scale) {
  SUBMIT(d, run_adamw, P(p), I(rank), P(param), P(grad), P(m), P(v), P(lp), I(step), F(lr), P(s), F(grad_scale));
}

/* ---- model operators: one runner each, unpacking into ops_cpu.h ---- */

static void run_encoder_forward(cpu_dev *d, const targ *a) {
  (void)d;
  encoder_forward(a[0].p, a[1].p, a[2].p, a[3].p, (int)a[4].i, (int)a[5].i, (int)a[6].i, a[7].p);
}
static void cpu_encoder_forward(device_t *d, void *out, const int *inp, const void *wte, const void *wpe, int B,
                                int T, int C, const int32_t *seg) {
  SUBMIT(d, run_encoder_forward, P(out), P(inp), P(wte), P(wpe), I(B), I(T), I(C), P(seg));
}

static void run_encoder_backward(cpu_dev *d, const targ *a) {
  (void)d;
  encoder_backward(a[0].p, a[1].p, a[2].p, a[3].p, (int)a[4].i, (int)a[5].i, (int)a[6].i, (int)a[7].i, a[8].p);
}
static void cpu_encoder_backward(device_t *d, float *dwte, float *dwpe, const void *dout, const int *inp, int B,
                                 int T, int C, int pad, const int32_t *seg) {
  SUBMIT(d, run_encoder_backward, P(dwte), P(dwpe), P(dout), P(inp), I(B), I(T), I(C), I(pad), P(seg));
}

static void run_layernorm_forward(cpu_dev *d, const targ *a) {
  (void)d;
  layernorm_forward(a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, a[5].p, (int)a[6].i, (int)a[7].i, (int)a[8].i);
}
static void cpu_layernorm_forward(device_t *d, void *out, float *mean, float *rstd, const void *inp, const void *w,
                                  const void *b, int B, int T, int C) {
  SUBMIT(d, run_layernorm_forward, P(out), P(mean), P(rstd), P(inp), P(w), P(b), I(B), I(T), I(C));
}

static void run_layernorm_backward(cpu_dev *d, const targ *a) {
  (void)d;
  layernorm_backward(a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, a[5].p, a[6].p, a[7].p, (int)a[8].i, (int)a[9].i,
                     (int)a[10].i);
}
static void cpu_layernorm_backward(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                   const void *w, const float *mean, const float *rstd, int B, int T, int C) {
  SUBMIT(d, run_layernorm_backward, P(dinp), P(dw), P(db), P(dout), P(inp), P(w), P(mean), P(rstd), I(B), I(T), I(C));
}

static void run_matmul_forward(cpu_dev *d, const targ *a) {
  (void)d;
  matmul_forward(a[0].p, a[1].p, a[2].p, a[3].p, (int)a[4].i, (int)a[5].i, (int)a[6].i);
}
static void cpu_matmul_forward(device_t *d, void *out, const void *inp, const void *w, const void *bias, int BT, int C,
                               int OC) {
  SUBMIT(d, run_matmul_forward, P(out), P(inp), P(w), P(bias), I(BT), I(C), I(OC));
}

static void run_matmul_backward(cpu_dev *d, const targ *a) {
  (void)d;
  matmul_backward(a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, a[5].p, (int)a[6].i, (int)a[7].i, (int)a[8].i);
}
static void cpu_matmul_backward(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                const void *w, int BT, int C, int OC) {
  SUBMIT(d, run_matmul_backward, P(dinp), P(dw), P(db), P(dout), P(inp), P(w), I(BT), I(C), I(OC));
}

static void run_attention_forward(cpu_dev *d, const targ *a) {
  (void)d;
  attention_forward(a[0].p, a[1].p, a[2].p, (int)a[3].i, (int)a[4].i, (int)a[5].i, (int)a[6].i, (int)a[7].i, a[8].p,
                    (int)a[9].i);
}
static void cpu_attention_forward(device_t *d, void *out, void *state, const void *qkv, int B, int T, int C, int NH,
                                  int NKV, const int32_t *seg, int window) {
  SUBMIT(d, run_attention_forward, P(out), P(state), P(qkv), I(B), I(T), I(C), I(NH), I(NKV), P(seg), I(window));
}

static void run_attention_backward(cpu_dev *d, const targ *a) {
  (void)d;
  attention_backward(a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, (int)a[5].i, (int)a[6].i, (int)a[7].i, (int)a[8].i,
                     (int)a[9].i, a[10].p, (int)a[11].i);
}
static void cpu_attention_backward(device_t *d, void *dqkv, void *scratch, const void *dout, const void *qkv,
                                   const void *out, const void *state, int B, int T, int C, int NH, int NKV,
                                   const int32_t *seg, int window) {
  (void)out;   /* the CPU backward reads the saved probabilities instead */
  SUBMIT(d, run_attention_backward, P(dqkv), P(scratch), P(dout), P(qkv), P(state), I(B), I(T), I(C), I(NH),
         I(NKV), P(seg), I(window));
}

static void run_gelu_forward(cpu_dev *d, const targ *a) {
  (void)d;
  gelu_forward(a[0].p, a[1].p, (int)a[2].i);
}
static void cpu_gelu_forward(device_t *d, void *out, const void *inp, int64_t N) {
  SUBMIT(d, run_gelu_forward, P(out), P(inp), I(N));
}

static void run_gelu_backward(cpu_dev *d, const targ *a) {
  (void)d;
  gelu_backward(a[0].p, a[1].p, a[2].p, (int)a[3].i);
}
static void cpu_gelu_backward(device_t *d, void *dinp, const void *inp, const void *dout, int64_t N) {
  SUBMIT(d, run_gelu_backward, P(dinp), P(inp), P(dout), I(N));
}

static void run_residual_forward(cpu_dev *d, const targ *a) {
  (void)d;
  residual_forward(a[0].p, a[1].p, a[2].p, (int)a[3].i);
}
static void cpu_residual_forward(device_t *d, void *out, const void *x, const void *y, int64_t N) {
  SUBMIT(d, run_residual_forward, P(out), P(x), P(y), I(N));
}

static void run_classifier(cpu_dev *d, const targ *a) {
  (void)d;
  float *logits = a[4].p, *loss_acc = a[3].p;
  const float *inp = a[5].p, *wte = a[6].p;
  int BT = (int)a[8].i, C = (int)a[9].i, V = (int)a[10].i;
  linear_forward(logits, inp, wte, BT, C, V);
  double l = softmax_xent_forward_backward(logits, a[2].p, a[7].p, BT, V, (float)a[11].f);   /* → dlogits */
  *loss_acc += (float)l;
  if (a[0].p) linear_backward(a[0].p, a[1].p, logits, inp, wte, BT, C, V);
}
static void cpu_classifier(device_t *d, void *dinp, float *dwte, float *losses, float *loss_acc, void *logits,
                           const void *inp, const void *wte, const int *targets, int BT, int C, int V, float dscale) {
  SUBMIT(d, run_classifier, P(dinp), P(dwte), P(losses), P(loss_acc), P(logits), P(inp), P(wte), P(targets), I(BT),
         I(C), I(V), F(dscale));
}

/* ---- Llama's operators ---- */

static void run_linear_forward(cpu_dev *d, const targ *a) {
  (void)d;
  linear_forward(a[0].p, a[1].p, a[2].p, (int)a[4].i, (int)a[5].i, (int)a[6].i);
  if (a[3].p) bias_forward(a[0].p, a[3].p, (int)a[4].i, (int)a[6].i);
}
static void cpu_linear_forward(device_t *d, void *out, const void *inp, const void *w, const void *bias, int BT, int C,
                               int OC) {
  SUBMIT(d, run_linear_forward, P(out), P(inp), P(w), P(bias), I(BT), I(C), I(OC));
}

static void run_linear_backward(cpu_dev *d, const targ *a) {
  (void)d;
  if (a[2].p) bias_backward(a[2].p, a[3].p, (int)a[6].i, (int)a[8].i);
  linear_backward(a[0].p, a[1].p, a[3].p, a[4].p, a[5].p, (int)a[6].i, (int)a[7].i, (int)a[8].i);
}
static void cpu_linear_backward(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                const void *w, int BT, int C, int OC) {
  SUBMIT(d, run_linear_backward, P(dinp), P(dw), P(db), P(dout), P(inp), P(w), I(BT), I(C), I(OC));
}

static void run_qk_norm_forward(cpu_dev *d, const targ *a) {
  (void)d;
  qk_norm_forward(a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, (int)a[5].i, (int)a[6].i, (int)a[7].i, (int)a[8].i,
                  (float)a[9].f, (float)a[10].f);
}
static void cpu_qk_norm_forward(device_t *d, void *out, float *rstd, const void *inp, const void *wq, const void *wk,
                                int BT, int NH, int NKV, int HD, float eps, float woff) {
  SUBMIT(d, run_qk_norm_forward, P(out), P(rstd), P(inp), P(wq), P(wk), I(BT), I(NH), I(NKV), I(HD), F(eps),
         F(woff));
}

static void run_qk_norm_backward(cpu_dev *d, const targ *a) {
  (void)d;
  qk_norm_backward(a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, a[5].p, a[6].p, a[7].p, (int)a[8].i, (int)a[9].i,
                   (int)a[10].i, (int)a[11].i, (float)a[12].f);
}
static void cpu_qk_norm_backward(device_t *d, void *dinp, float *dwq, float *dwk, const void *dout, const void *inp,
                                 const void *wq, const void *wk, const float *rstd, int BT, int NH, int NKV, int HD,
                                 float woff) {
  SUBMIT(d, run_qk_norm_backward, P(dinp), P(dwq), P(dwk), P(dout), P(inp), P(wq), P(wk), P(rstd), I(BT), I(NH),
         I(NKV), I(HD), F(woff));
}

static void run_rmsnorm_forward(cpu_dev *d, const targ *a) {
  (void)d;
  rmsnorm_forward(a[0].p, a[1].p, a[2].p, a[3].p, (int)a[4].i, (int)a[5].i, (float)a[6].f, (float)a[7].f);
}
static void cpu_rmsnorm_forward(device_t *d, void *out, float *rstd, const void *inp, const void *w, int BT, int C,
                                float eps, float woff) {
  SUBMIT(d, run_rmsnorm_forward, P(out), P(rstd), P(inp), P(w), I(BT), I(C), F(eps), F(woff));
}

static void run_rmsnorm_backward(cpu_dev *d, const targ *a) {
  (void)d;
  rmsnorm_backward(a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, a[5].p, (int)a[6].i, (int)a[7].i, (float)a[8].f);
}
static void cpu_rmsnorm_backward(device_t *d, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                 const float *rstd, int BT, int C, float woff) {
  SUBMIT(d, run_rmsnorm_backward, P(dinp), P(dw), P(dout), P(inp), P(w), P(rstd), I(BT), I(C), F(woff));
}

/* The frequencies travel by value, field by field, in the task's last 10 arguments (fp32 values are
 * exact in a double); longrope's factors by reference: the caller's rope_freqs (the model's
 * activation state) outlives the queued operator. */
#define ROPE_ARGS(r) F((r)->theta), I((r)->llama3), F((r)->factor), F((r)->low_freq_factor), F((r)->original), \
                     F((r)->low_wavelen), F((r)->high_wavelen), F((r)->band), F((r)->scale),                  \
                     P((r)->longrope ? (void *)(uintptr_t)(r)->ext : NULL)
static rope_freqs rope_of_args(const targ *a) {
  rope_freqs r = {(float)a[0].f, (int)a[1].i, (float)a[2].f, (float)a[3].f, (float)a[4].f,
                  (float)a[5].f, (float)a[6].f, (float)a[7].f, 0, (float)a[8].f, {0}};
  if (a[9].p) {
    r.longrope = 1;
    memcpy(r.ext, a[9].p, sizeof r.ext);
  }
  return r;
}

static void run_rope_forward(cpu_dev *d, const targ *a) {
  (void)d;
  rope_freqs r = rope_of_args(a + 6);
  rope_forward(a[0].p, (int)a[1].i, (int)a[2].i, (int)a[3].i, (int)a[4].i, (int)a[5].i, &r, a[16].p);   /* after ROPE_ARGS' 10 */
}
static void cpu_rope_forward(device_t *d, void *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                             const int32_t *seg) {
  SUBMIT(d, run_rope_forward, P(qkv), I(B), I(T), I(NH), I(NKV), I(HS), ROPE_ARGS(rope), P(seg));
}

static void run_rope_backward(cpu_dev *d, const targ *a) {
  (void)d;
  rope_freqs r = rope_of_args(a + 6);
  rope_backward(a[0].p, (int)a[1].i, (int)a[2].i, (int)a[3].i, (int)a[4].i, (int)a[5].i, &r, a[16].p);   /* after ROPE_ARGS' 10 */
}
static void cpu_rope_backward(device_t *d, void *dqkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                              const int32_t *seg) {
  SUBMIT(d, run_rope_backward, P(dqkv), I(B), I(T), I(NH), I(NKV), I(HS), ROPE_ARGS(rope), P(seg));
}

static void run_swiglu_forward(cpu_dev *d, const targ *a) {
  (void)d;
  swiglu_forward(a[0].p, a[1].p, (int)a[2].i, (int)a[3].i);
}
static void cpu_swiglu_forward(device_t *d, void *out, const void *gu, int BT, int F) {
  SUBMIT(d, run_swiglu_forward, P(out), P(gu), I(BT), I(F));
}

static void run_swiglu_backward(cpu_dev *d, const targ *a) {
  (void)d;
  swiglu_backward(a[0].p, a[1].p, a[2].p, (int)a[3].i, (int)a[4].i);
}
static void cpu_swiglu_backward(device_t *d, void *dgu, const void *gu, const void *dout, int BT, int F) {
  SUBMIT(d, run_swiglu_backward, P(dgu), P(gu), P(dout), I(BT), I(F));
}

static void run_geglu_forward(cpu_dev *d, const targ *a) {
  (void)d;
  geglu_forward(a[0].p, a[1].p, (int)a[2].i, (int)a[3].i);
}
static void cpu_geglu_forward(device_t *d, void *out, const void *gu, int BT, int F) {
  SUBMIT(d, run_geglu_forward, P(out), P(gu), I(BT), I(F));
}

static void run_geglu_backward(cpu_dev *d, const targ *a) {
  (void)d;
  geglu_backward(a[0].p, a[1].p, a[2].p, (int)a[3].i, (int)a[4].i);
}
static void cpu_geglu_backward(device_t *d, void *dgu, const void *gu, const void *dout, int BT, int F) {
  SUBMIT(d, run_geglu_backward, P(dgu), P(gu), P(dout), I(BT), I(F));
}

/* ---- lifetime ---- */

static void cpu_destroy(device_t *dd) {
  cpu_dev *d = (cpu_dev *)dd;
  if (d->mode != DEV_CPU_SYNC) {
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_signal(&d->cv_get);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);   /* drains the ring first */
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_put);
    pthread_cond_destroy(&d->cv_get);
    pthread_cond_destroy(&d->cv_idle);
  }
  free(d->ring);
  free(d);
}

#define CPU_OPS(NAME)                                                                                          \
  {                                                                                                            \
    .name = NAME, .alloc = cpu_alloc, .free = cpu_free, .alloc_host = cpu_alloc_host, .free_host = cpu_free_host, \
    .upload = cpu_upload, .download = cpu_download, .snapshot = cpu_download, .record = cpu_record,             \
    .wait = cpu_wait, .sync = cpu_sync, .set_timer = cpu_set_timer, .timers = cpu_timers, .trace = cpu_trace,   \
    .zero = cpu_zero, .copy = cpu_copy, .destroy = cpu_destroy                                                 \
  }

static const dev_ops ops_sync = CPU_OPS("cpu"), ops_async = CPU_OPS("cpu-async"), ops_strict = CPU_OPS("cpu-strict");

/* every mode's: each kernel submits to the device's stream, which is the host in sync mode */
static const dev_kernels cpu_kernels = {
    .fill = cpu_fill, .cast_bf16 = cpu_cast_bf16, .to_act = cpu_to_act, .nf4_dequant = cpu_nf4_dequant, .add = cpu_add, .add_act = cpu_add_act,
    .act_axpby = cpu_act_axpby, .gemm = cpu_gemm,
    .sumsq = cpu_sumsq, .adamw = cpu_adamw, .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward, .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward, .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward, .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward, .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward, .residual_forward = cpu_residual_forward,
    .classifier = cpu_classifier, .linear_forward = cpu_linear_forward, .linear_backward = cpu_linear_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward, .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward, .rope_backward = cpu_rope_backward, .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward, .qk_norm_forward = cpu_qk_norm_forward,
    .qk_norm_backward = cpu_qk_norm_backward, .geglu_forward = cpu_geglu_forward,
    .geglu_backward = cpu_geglu_backward};

dtype_kind dev_cpu_set_compute(device_t *dd, dtype_kind dt) {
  cpu_dev *d = (cpu_dev *)dd;
  d->gemm = dt == DTYPE_BF16 ? gemm_bf16_kind() : GEMM_FP32;
  return d->gemm != GEMM_FP32 ? DTYPE_BF16 : DTYPE_FP32;
}

fsdp_status dev_new_cpu(dev_cpu_mode mode, device_t **out) {
  *out = NULL;
  cpu_dev *d = calloc(1, sizeof *d);
  if (!d) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the CPU device");
  d->base.op = mode == DEV_CPU_SYNC ? &ops_sync : mode == DEV_CPU_ASYNC ? &ops_async : &ops_strict;
  d->base.kern = &cpu_kernels;
  d->base.kind = DEVICE_CPU;
  d->base.act_bytes = 4;
  d->base.host_accessible = 1;
  d->base.lazy_events = mode == DEV_CPU_STRICT;
  d->mode = mode;
  d->timer = DEV_T_COMPUTE;
  if (mode != DEV_CPU_SYNC) {
    d->ring = calloc(RING, sizeof *d->ring);
    if (!d->ring) {
      free(d);
      return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the CPU device's task ring");
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_put, NULL);
    pthread_cond_init(&d->cv_get, NULL);
    pthread_cond_init(&d->cv_idle, NULL);
    int e = pthread_create(&d->thread, NULL, stream_main, d);
    if (e != 0) {
      free(d->ring);
      free(d);
      return fsdp_set_error(FSDP_ERR_INTERNAL, "cannot start the CPU device's stream thread: %s", strerror(e));
    }
  }
  *out = &d->base;
  return FSDP_OK;
}
