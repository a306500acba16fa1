/* device — the device layer: everything the runtime and the model do to parameter, gradient and
 * activation memory goes through two tables (docs/design.md §2, docs/runtime.md): the device runtime
 * (dev_ops: memory, copies, events, the stream, timers) and the kernel table (dev_kernels: the
 * models' and the optimizer's operators, the element-wise conversions).
 *
 * A device has one COMPUTE STREAM: every operation below (except the allocator, events' host side
 * and the synchronous copies) is enqueued on it and runs in submission order, asynchronously to the
 * host. Communication runs elsewhere (comm.h: gloo's thread, NCCL's stream) and is ordered against
 * the compute stream by EVENTS:
 *   record(d, e)       the stream marks e: e completes when all work submitted before it is done;
 *   wait(d, e, timer)  the stream waits until e's latest mark completes (its blocked time is charged
 *                      to TIMER); a collective issued with done = e marks e and completes it when
 *                      it finishes (comm.h comm_*_ev), so wait() orders compute after a collective;
 *   a collective issued with after = e starts only once e's latest mark is complete, so a gather
 *   does not overwrite a buffer that the stream still reads.
 * Marks are tickets (CUDA's semantics): a wait or a start-after captures the latest mark at the time
 * of the call; later marks do not affect it.
 *
 * Implementations: the CPU device (device_cpu.c) runs ops_cpu.c; synchronously on the calling thread
 * (DEV_CPU_SYNC: the stream is the host), or on a thread of its own (DEV_CPU_ASYNC), where a missing
 * wait between a collective and the compute that reads its result gives a wrong result. In
 * DEV_CPU_STRICT (async, for tests) a collective with a done event runs only once something waits
 * for it (or for a later collective), the latest moment a correct schedule allows: a missing wait
 * then reads an unfilled buffer every time, not just when the race is lost.
 *
 * Dtypes: "act" pointers (activations, their gradients, gathered parameters in compute form) are in
 * the device's compute dtype (fp32 on the CPU, whose GEMMs may round their inputs to bf16:
 * dev_cpu_set_compute; bf16 on CUDA), hence void *; parameter gradients,
 * LayerNorm statistics, losses, shards and scalars are always fp32; bf16 is uint16_t storage.
 * Sizes of act buffers: elements × d->act_bytes. Backward operators accumulate into parameter
 * gradients (+=) and assign activation gradients (=), as ops_cpu.h.
 *
 * Ownership and threads: one host thread drives a device (the runtime's); a device_t outlives every
 * buffer and event made from it. Event completion and waits are thread-safe (comm threads use them).
 * Names: dev_* (the handle's type is device_t, since dev_t is POSIX's).
 */
#ifndef FSDP_DEVICE_H
#define FSDP_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "jobspec.h"
#include "ops/rope.h"
#include "optim.h"
#include "plan.h"
#include "trace.h"

typedef struct device device_t;
typedef struct dev_event dev_event;

/* Where blocked and busy stream time is charged; the runtime's phases, in rt_phase order. */
typedef enum { DEV_T_GATHER = 0, DEV_T_COMPUTE, DEV_T_REDUCE, DEV_T_OPTIM, DEV_NTIMER } dev_timer;

typedef enum { DEV_CPU_SYNC = 0, DEV_CPU_ASYNC, DEV_CPU_STRICT } dev_cpu_mode;

typedef struct dev_ops {
  const char *name;   /* "cpu", "cpu-async", "cpu-strict", "cuda" */

  /* ---- memory (host calls, not stream-ordered; never inside a step) ---- */
  void *(*alloc)(device_t *d, mem_category cat, size_t bytes);   /* zeroed; NULL + error on failure */
  void (*free)(device_t *d, void *p);                              /* NULL-safe; stream must be idle */
  /* Host memory the device copies to and from fast (pinned on CUDA; plain on the CPU), zeroed and
   * not counted in the device's categories (offload's host_bytes). NULL-safe free. */
  void *(*alloc_host)(device_t *d, size_t bytes);
  void (*free_host)(device_t *d, void *p);
  /* host → device and device → host, synchronous for the host: upload returns when SRC may be
   * reused, download when DST holds the data (both after all work submitted before them). */
  fsdp_status (*upload)(device_t *d, void *dst, const void *src, size_t bytes);
  fsdp_status (*download)(device_t *d, void *dst, const void *src, size_t bytes);
  /* device → host memory from alloc_host (a checkpoint's snapshot), after all work submitted
   * before it, returning when DST holds the data: on CUDA a copy on a stream of its own (pinned
   * memory, full PCIe speed, without queueing behind or ahead of the compute stream's later work);
   * on the CPU download. */
  fsdp_status (*snapshot)(device_t *d, void *dst, const void *src, size_t bytes);

  /* ---- stream ordering ---- */
  void (*record)(device_t *d, dev_event *e);
  void (*wait)(device_t *d, dev_event *e, dev_timer t);
  /* Host waits until the stream is idle; reports a fault of the stream (CUDA). */
  fsdp_status (*sync)(device_t *d);
  /* Ops submitted from now on charge their busy time to T (host-side setting). */
  void (*set_timer)(device_t *d, dev_timer t);
  /* Busy and blocked stream time per timer since the last call (call after sync); resets them. */
  void (*timers)(device_t *d, uint64_t us[DEV_NTIMER]);
  /* Optional (NULL on the CPU): the native half of an event (a cudaEvent_t on CUDA), made by
   * dev_event_new and destroyed by dev_event_destroy. */
  fsdp_status (*event_create)(device_t *d, void **native);
  void (*event_destroy)(device_t *d, void *native);
  /* Optional (NULL on the CPU): per-job state the device keeps for RANK of plan P (CUDA: AdamW's
   * decay-segment table), made once by runtime_new before any step; P must outlive the device's
   * use of it. */
  fsdp_status (*bind)(device_t *d, const plan_t *p, int rank);
  /* A span boundary on the stream (trace.h), taken when the stream reaches it, not at submission:
   * END = 0 opens a span on T's compute-stream lane, END = 1 closes the innermost open one as
   * KIND/UNIT/STEP. The CPU device runs it as a task (charged to no timer); CUDA records a timing
   * event and resolves it into T in timers(). */
  void (*trace)(device_t *d, trace_t *t, int end, trace_kind kind, int unit, int step);

  /* ---- memory operations on the stream ---- */
  void (*zero)(device_t *d, void *p, size_t bytes);
  void (*copy)(device_t *d, void *dst, const void *src, size_t bytes);   /* device to device */
  void (*destroy)(device_t *d);
} dev_ops;

/* The kernel table: every operator the models and the optimizer run, each enqueued on the compute
 * stream in submission order like the copies above (ops_cpu.h has the math; llm.c's argument
 * order). A device has one (d->kern) beside its runtime (d->op); the CPU's three modes share theirs. */
typedef struct dev_kernels {
  /* ---- element-wise conversions and sums on the stream (the runtime's and the reduction's) ---- */
  void (*fill)(device_t *d, float *p, float v, int64_t n);
  void (*cast_bf16)(device_t *d, uint16_t *dst, const float *src, int64_t n);    /* round to nearest even */
  void (*to_act)(device_t *d, void *dst, const void *src, dtype_kind src_dt, int64_t n);  /* params → compute form */
  /* OUT (n bf16) = the NF4 record REC (nf4.h: nf4_record_dequantize_bf16's bits; REC at any byte address) */
  void (*nf4_dequant)(device_t *d, uint16_t *out, const uint8_t *rec, int64_t n);
  void (*add)(device_t *d, float *dst, const void *src, dtype_kind src_dt, int64_t n);    /* dst += src */
  void (*add_act)(device_t *d, void *dst, const void *src, int64_t n);                    /* act dst += src */
  /* act dst[r·dld + c] = alpha·src[r·sld + c] + beta·dst[r·dld + c] for ROWS × COLS (a column
   * block of a wider row, as Gemma scales q's columns of the q|k|v rows); dst may be src with
   * dld = sld (in place). beta = 0 never reads dst. */
  void (*act_axpby)(device_t *d, void *dst, int64_t dld, const void *src, int64_t sld, int64_t rows, int64_t cols,
                    float alpha, float beta);
  /* C[M×N] = alpha·op(A)·op(B) + beta·C (ops_cpu.h gemm_strided), row-major with leading
   * dimensions, op(X) = Xᵀ where tX; A and B act elements, C act elements or, where C_F32, fp32 (a
   * gradient); beta 0 (C assigned, never read) or 1. LoRA's products (lora.h): a column block of a
   * fused projection's rows read or accumulated in place, the scale in alpha. */
  void (*gemm)(device_t *d, int ta, int tb, int M, int N, int K, float alpha, const void *A, int64_t lda, const void *B,
               int64_t ldb, float beta, void *C, int64_t ldc, int c_f32);

  /* ---- optimizer ---- */
  /* out[0] = scale·Σ x², out[1] = 0 if that is finite else 1 (fixed summation order). */
  void (*sumsq)(device_t *d, float *out, const float *x, int64_t n, float scale);
  /* AdamW (optim.h) over RANK's shard with the hyperparameters OC (read when the stream runs it: OC
   * outlives the step); when lp is non-NULL also writes lp = bf16(param) for every shard element
   * (padding included, which stays 0). */
  void (*adamw)(device_t *d, const plan_t *p, int rank, float *param, const float *grad, float *m, float *v,
                uint16_t *lp, int step, double lr, const optim_config *oc, float grad_scale);

  /* ---- the model's operators (ops_cpu.h has the math; llm.c's argument order) ---- */
  /* encoder: wpe (and dwpe) NULL for models without learned positions (Llama): out = wte[inp].
   * SEG: the device copy of the rows' documents (model_set_docs; NULL: one per row): wpe's row is the
   * token's position in its document (ops/docmask.h). The backward skips dwte's row PAD (the
   * model's pad_token_id, nn.Embedding's padding_idx; −1: none); dwpe takes every token. */
  void (*encoder_forward)(device_t *d, void *out, const int *inp, const void *wte, const void *wpe, int B, int T, int C,
                          const int32_t *seg);
  void (*encoder_backward)(device_t *d, float *dwte, float *dwpe, const void *dout, const int *inp, int B, int T, int C,
                           int pad, const int32_t *seg);
  void (*layernorm_forward)(device_t *d, void *out, float *mean, float *rstd, const void *inp, const void *w,
                            const void *b, int B, int T, int C);
  void (*layernorm_backward)(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                             const void *w, const float *mean, const float *rstd, int B, int T, int C);
  /* Optional (NULL: layernorm_backward into a scratch, then add_act; call dev_layernorm_backward_add):
   * dres += the input gradient, in one kernel (CUDA). */
  void (*layernorm_backward_add)(device_t *d, void *dres, float *dw, float *db, const void *dout, const void *inp,
                                 const void *w, const float *mean, const float *rstd, int B, int T, int C);
  void (*matmul_forward)(device_t *d, void *out, const void *inp, const void *w, const void *bias, int BT, int C, int OC);
  /* dw = db = NULL: only the input gradient (a frozen weight, [lora]); likewise linear_backward's and
   * the norms' dw, and the classifier's dwte with dinp set. */
  void (*matmul_backward)(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                          const void *w, int BT, int C, int OC);
  /* STATE is what the backward needs (dev_attention_floats floats) and SCRATCH the backward's
   * scratch (dev_attention_scratch_floats); OUT is the forward's output, which the CUDA backward
   * reads (the CPU's does not).
   * Grouped-query attention: qkv rows are C + 2·NKV·(C/NH) wide (q: NH heads, then k and v: NKV
   * heads each); query head h reads kv head h / (NH/NKV). NKV divides NH; NKV = NH is GPT-2's.
   * SEG (the device copy of the rows' documents, NULL: one per row) and WINDOW (the sliding window,
   * 0: none) restrict query t to keys [lo, t] (ops/docmask.h). */
  void (*attention_forward)(device_t *d, void *out, void *state, const void *qkv, int B, int T, int C, int NH,
                            int NKV, const int32_t *seg, int window);
  void (*attention_backward)(device_t *d, void *dqkv, void *scratch, const void *dout, const void *qkv,
                             const void *out, const void *state, int B, int T, int C, int NH, int NKV,
                             const int32_t *seg, int window);
  /* Optional (NULL: matmul_forward into PRE, then gelu_forward; call dev_matmul_gelu): pre = inp·w +
   * bias and out = gelu(pre), both kept, GELU in the GEMM's epilogue (CUDA). */
  void (*matmul_gelu_forward)(device_t *d, void *out, void *pre, const void *inp, const void *w, const void *bias,
                              int BT, int C, int OC);
  /* Optional (NULL: matmul_backward into a scratch, then gelu_backward; call dev_matmul_backward_gelu):
   * matmul_backward, with dinp = (dout·wᵀ)·gelu'(pre), the GELU's backward in the GEMM's epilogue
   * (CUDA). dinp may be inp: the weight gradient is taken first. */
  void (*matmul_backward_gelu)(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                               const void *w, const void *pre, int BT, int C, int OC);
  void (*gelu_forward)(device_t *d, void *out, const void *inp, int64_t N);
  void (*gelu_backward)(device_t *d, void *dinp, const void *inp, const void *dout, int64_t N);
  void (*residual_forward)(device_t *d, void *out, const void *a, const void *b, int64_t N);
  /* Optional (NULL: residual_forward, then layernorm_forward; call dev_residual_layernorm): res =
   * a + b (B·T·C act elements), out = LayerNorm(res) with its mean and rstd, in one pass (CUDA). */
  void (*residual_layernorm_forward)(device_t *d, void *res, void *out, float *mean, float *rstd, const void *a,
                                     const void *b, const void *w, const void *bias, int B, int T, int C);
  /* The tied head with its loss: logits = inp·wteᵀ, losses = cross-entropy, *loss_acc += Σ losses,
   * dinp = dscale·(softmax − onehot)·wte, dwte += its gradient. LOGITS is scratch of
   * dev_logits_bytes bytes (BT·V fp32 on the CPU; one chunk of rows on CUDA).
   * With dinp = dwte = NULL only the losses (evaluation). */
  void (*classifier)(device_t *d, void *dinp, float *dwte, float *losses, float *loss_acc, void *logits,
                     const void *inp, const void *wte, const int *targets, int BT, int C, int V, float dscale);

  /* ---- Llama's operators ---- */
  /* nn.Linear: W is [OC, C] (out, in); out[n,:] = W·inp[n,:] + bias (bias [OC] act, NULL: none).
   * Backward: dinp (NULL: not wanted) assigned, dw and db (NULL: no bias) +=. */
  void (*linear_forward)(device_t *d, void *out, const void *inp, const void *w, const void *bias, int BT, int C,
                         int OC);
  void (*linear_backward)(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                          const void *w, int BT, int C, int OC);
  /* Qwen3's q_norm / k_norm (ops_cpu.h qk_norm_forward): RMSNorm over each of the NH q heads (weight
   * wq) and NKV k heads (wk) of HD channels of a (BT, (NH + 2·NKV)·HD) qkv buffer, v copied; rstd
   * (BT, NH + NKV) fp32 saved. Backward: dinp assigned (may be dout), dwq and dwk += (both NULL: frozen
   * norms, [lora]). WOFF: as rmsnorm_forward's (Gemma 3's q/k norms: 1). */
  void (*qk_norm_forward)(device_t *d, void *out, float *rstd, const void *inp, const void *wq, const void *wk, int BT,
                          int NH, int NKV, int HD, float eps, float woff);
  void (*qk_norm_backward)(device_t *d, void *dinp, float *dwq, float *dwk, const void *dout, const void *inp,
                           const void *wq, const void *wk, const float *rstd, int BT, int NH, int NKV, int HD,
                           float woff);
  /* RMSNorm over C: out = inp·rstd·(woff + w), rstd = 1/sqrt(mean(inp²) + eps), rstd (BT) fp32 saved;
   * the scale woff + w is fp32 (ops/rmsnorm.h: WOFF 0 for Llama's norms, 1 for Gemma's). */
  void (*rmsnorm_forward)(device_t *d, void *out, float *rstd, const void *inp, const void *w, int BT, int C,
                          float eps, float woff);
  void (*rmsnorm_backward)(device_t *d, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                           const float *rstd, int BT, int C, float woff);
  /* Optional (NULL: rmsnorm_backward into a scratch, then add_act; call dev_rmsnorm_backward_add). */
  void (*rmsnorm_backward_add)(device_t *d, void *dres, float *dw, const void *dout, const void *inp, const void *w,
                               const float *rstd, int BT, int C, float woff);
  /* Rotary embeddings (Hugging Face's rotate-half), in place on the q and k heads of a (B,T,
   * C + 2·NKV·HS) qkv buffer (C = NH·HS, HS even); position t, pair (i, i + HS/2) rotates by
   * t·rope_inv_freq(i) (ops/rope.h: theta^(−2i/HS), rescaled by llama3's bands when set). Backward
   * rotates the gradients of q and k back (by −angle), in place. ROPE is read at the call (by value).
   * SEG (device memory, NULL: one document per row): positions restart in each document. */
  void (*rope_forward)(device_t *d, void *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                       const int32_t *seg);
  void (*rope_backward)(device_t *d, void *dqkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                        const int32_t *seg);
  /* SwiGLU: gu is (BT, 2F), gate then up per row; out (BT, F) = silu(gate)·up. dgu = its gradient. */
  void (*swiglu_forward)(device_t *d, void *out, const void *gu, int BT, int F);
  void (*swiglu_backward)(device_t *d, void *dgu, const void *gu, const void *dout, int BT, int F);
  /* GeGLU (Gemma): the same layout, out = gelu_tanh(gate)·up (ops/gated.h); dgu assigned. */
  void (*geglu_forward)(device_t *d, void *out, const void *gu, int BT, int F);
  void (*geglu_backward)(device_t *d, void *dgu, const void *gu, const void *dout, int BT, int F);

} dev_kernels;


/* Every implementation's struct starts with this. */
struct device {
  const dev_ops *op;         /* the runtime: memory, copies, events, the stream, timers */
  const dev_kernels *kern;   /* the operators of the models and the optimizer */
  device_kind kind;      /* DEVICE_CPU or DEVICE_CUDA: what the planner's formulas are for */
  int act_bytes;         /* bytes per act element: 4 on the CPU, 2 (bf16) on CUDA */
  int host_accessible;   /* device pointers are host pointers (the CPU device) */
  int lazy_events;       /* DEV_CPU_STRICT: its events are completed only once waited for */
  /* A device that is not the host (CUDA) completes a CPU mark of every recorded event when its
   * stream reaches it, for consumers on host threads (a threaded comm's `after`: gloo staged).
   * Off by default: stream-ordered consumers (NCCL) use the native event. Set before any record. */
  int host_marks;
};

/* The CPU device; FSDP_CPU_DEVICE=sync|async|strict in the environment picks the mode for workers
 * (dev_cpu_mode_from_env, default sync). */
fsdp_status dev_new_cpu(dev_cpu_mode mode, device_t **out);
fsdp_status dev_cpu_mode_from_env(dev_cpu_mode *mode);
/* The CPU device's GEMMs (matmuls, the head, attention's products) in bf16 with fp32 accumulation
 * (gemm_bf16.h: the CUDA path's contract) when DT is DTYPE_BF16 and this CPU has AVX512-BF16 that
 * measures fast enough against its fp32 FMA (FSDP_CPU_BF16=on|off|emulate overrides: gemm_bf16_kind); in
 * fp32 otherwise (the default). Activations and every other operator stay fp32. Returns the dtype
 * the GEMMs compute in. Call on a CPU device before its first operation. */
dtype_kind dev_cpu_set_compute(device_t *d, dtype_kind dt);
void dev_destroy(device_t **d);   /* NULL-safe; *d becomes NULL */

/* The CUDA device on GPU GPU (an index among the visible devices) in bf16 (device_cuda.c; CUDA
 * build only). Fails with "no usable GPU: ..." when the driver or the GPU is missing. WAIT_S (the
 * job's timeout_s, > 0): the longest the stream stays parked waiting for a threaded comm's
 * collective (a wait on a pending CPU mark: gloo staged); past it the device fails, and the next
 * sync() reports the wait that gave up. */
#ifdef FSDP_HAVE_CUDA
fsdp_status dev_new_cuda(int gpu, double wait_s, device_t **out);
/* The number of visible GPUs (≥ 1), or "no usable GPU: ..." naming CUDA's reason. */
fsdp_status dev_cuda_count(int *n);
#endif

/* Floats of the attention state the forward keeps for the backward (per block): B·NH·T·T on the
 * CPU (the probabilities), B·NH·T on CUDA (the logsumexp; the fused backward recomputes the rest).
 * plan_attention_floats of d->kind. */
int64_t dev_attention_floats(const device_t *d, int B, int T, int NH);
/* Floats of the attention backward's scratch: B·NH·T·T on the CPU (the probabilities' gradient),
 * B·NH·T·(HS + 1) on CUDA. plan_attention_scratch_floats of d->kind. */
int64_t dev_attention_scratch_floats(const device_t *d, int B, int T, int NH, int HS);
/* Bytes of the classifier's scratch for C channels (plan_logits_bytes of d->kind). */
int64_t dev_logits_bytes(const device_t *d, int BT, int V, int C);
/* pre = inp·w + bias, out = gelu(pre): the device's fused op where it has one (dev_ops). */
void dev_matmul_gelu(device_t *d, void *out, void *pre, const void *inp, const void *w, const void *bias, int BT, int C,
                     int OC);
/* dinp = (dout·wᵀ)·gelu'(pre) with matmul_backward's weight and bias gradients: the device's fused op
 * where it has one (dev_ops), else matmul_backward into SCRATCH (BT·C act elements) and gelu_backward
 * from it. dinp may be inp. */
void dev_matmul_backward_gelu(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                              const void *w, const void *pre, void *scratch, int BT, int C, int OC);
/* res = a + b, out = LayerNorm(res): the device's fused op where it has one (dev_ops). */
void dev_residual_layernorm(device_t *d, void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                            const void *w, const void *bias, int B, int T, int C);
/* dres += LayerNorm's (RMSNorm's) input gradient with layernorm_backward's (rmsnorm_backward's)
 * weight gradients: the device's fused op where it has one, else the backward into SCRATCH (B·T·C
 * act elements) and add_act. */
void dev_layernorm_backward_add(device_t *d, void *dres, void *scratch, float *dw, float *db, const void *dout,
                                const void *inp, const void *w, const float *mean, const float *rstd, int B, int T,
                                int C);
void dev_rmsnorm_backward_add(device_t *d, void *dres, void *scratch, float *dw, const void *dout, const void *inp,
                              const void *w, const float *rstd, int BT, int C, float woff);

/* ---- events (device.c) ---- */
dev_event *dev_event_new(device_t *d);   /* NULL + error on failure */
void dev_event_destroy(dev_event **e);
/* The producer side, for collectives (comm.c): a new mark to be completed by another thread, and
 * its completion. */
uint64_t dev_event_mark(dev_event *e);
void dev_event_complete(dev_event *e, uint64_t ticket);
uint64_t dev_event_last(const dev_event *e);   /* the latest mark (0: never marked) */
/* Host or comm thread: wait until mark TICKET is complete (it is demanded meanwhile, see
 * DEV_CPU_STRICT). FSDP_ERR_TIMEOUT after timeout_s. */
fsdp_status dev_event_host_wait(dev_event *e, uint64_t ticket, double timeout_s);
/* Strict devices' events: whether mark TICKET has been waited for yet. Always 1 elsewhere. */
int dev_event_demanded(const dev_event *e, uint64_t ticket);
int dev_event_lazy(const dev_event *e);
/* Whether mark TICKET is complete (a host-side query; no waiting). */
int dev_event_is_complete(const dev_event *e, uint64_t ticket);
/* The native event (a cudaEvent_t on CUDA) or NULL on the CPU. Native events have CUDA's ticket
 * semantics of their own: a device record is cudaEventRecord on the compute stream, a device wait
 * cudaStreamWaitEvent; NCCL waits for `after` and records `done` on its stream (comm_nccl.c). */
void *dev_event_native(const dev_event *e);

#endif
