/* device — events (marks and their completion, shared by every CPU-side producer and consumer, and
 * the native half a device may add: a cudaEvent_t on CUDA) and the parts of device.h that do not
 * depend on the implementation. See device.h. */
#include "device.h"
#include "envknob.h"
#include "monotime.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dev_event {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t marked;    /* the latest mark handed out */
  uint64_t done;      /* every mark ≤ done is complete */
  uint64_t demand;    /* the highest mark somebody waits for (strict devices) */
  int lazy;
  device_t *dev;      /* the device whose event_destroy frees native */
  void *native;       /* the device's own event (cudaEvent_t), or NULL */
};

dev_event *dev_event_new(device_t *d) {
  dev_event *e = calloc(1, sizeof *e);
  if (!e) {
    fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a device event");
    return NULL;
  }
  pthread_mutex_init(&e->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cv, &ca);
  pthread_condattr_destroy(&ca);
  e->lazy = d && d->lazy_events;
  if (d && d->op && d->op->event_create) {
    if (d->op->event_create(d, &e->native) != FSDP_OK) {   /* the device recorded why */
      pthread_mutex_destroy(&e->mu);
      pthread_cond_destroy(&e->cv);
      free(e);
      return NULL;
    }
    e->dev = d;
  }
  return e;
}

void dev_event_destroy(dev_event **pe) {
  if (!pe || !*pe) return;
  dev_event *e = *pe;
  if (e->native && e->dev) e->dev->op->event_destroy(e->dev, e->native);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
  *pe = NULL;
}

uint64_t dev_event_mark(dev_event *e) {
  pthread_mutex_lock(&e->mu);
  uint64_t t = ++e->marked;
  pthread_mutex_unlock(&e->mu);
  return t;
}

void dev_event_complete(dev_event *e, uint64_t ticket) {
  pthread_mutex_lock(&e->mu);
  if (ticket > e->done) e->done = ticket;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

uint64_t dev_event_last(const dev_event *e) {
  dev_event *m = (dev_event *)e;
  pthread_mutex_lock(&m->mu);
  uint64_t t = m->marked;
  pthread_mutex_unlock(&m->mu);
  return t;
}

fsdp_status dev_event_host_wait(dev_event *e, uint64_t ticket, double timeout_s) {
  struct timespec end = monotime_after(timeout_s);
  fsdp_status rc = FSDP_OK;
  pthread_mutex_lock(&e->mu);
  if (ticket > e->demand) {
    e->demand = ticket;
    pthread_cond_broadcast(&e->cv);
  }
  while (e->done < ticket) {
    if (pthread_cond_timedwait(&e->cv, &e->mu, &end) != 0 && e->done < ticket) {
      rc = fsdp_set_error(FSDP_ERR_TIMEOUT, "device event mark %llu not complete after %.3g s",
                          (unsigned long long)ticket, timeout_s);
      break;
    }
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}

int dev_event_demanded(const dev_event *e, uint64_t ticket) {
  if (!e->lazy) return 1;
  dev_event *m = (dev_event *)e;
  pthread_mutex_lock(&m->mu);
  int r = m->demand >= ticket;
  pthread_mutex_unlock(&m->mu);
  return r;
}

int dev_event_lazy(const dev_event *e) { return e && e->lazy; }

int dev_event_is_complete(const dev_event *e, uint64_t ticket) {
  dev_event *m = (dev_event *)e;
  pthread_mutex_lock(&m->mu);
  int r = m->done >= ticket;
  pthread_mutex_unlock(&m->mu);
  return r;
}

void *dev_event_native(const dev_event *e) { return e ? e->native : NULL; }

int64_t dev_attention_floats(const device_t *d, int B, int T, int NH) {
  return plan_attention_floats(d->kind, B, T, NH);
}

int64_t dev_attention_scratch_floats(const device_t *d, int B, int T, int NH, int HS) {
  return plan_attention_scratch_floats(d->kind, B, T, NH, HS);
}

int64_t dev_logits_bytes(const device_t *d, int BT, int V, int C) { return plan_logits_bytes(d->kind, BT, V, C); }

fsdp_status dev_cpu_mode_from_env(dev_cpu_mode *mode) {
  const char *v = envknob_get(ENV_CPU_DEVICE);
  *mode = DEV_CPU_SYNC;
  if (!strcmp(v, "sync")) return FSDP_OK;
  if (!strcmp(v, "async")) *mode = DEV_CPU_ASYNC;
  else if (!strcmp(v, "strict")) *mode = DEV_CPU_STRICT;
  else
    return fsdp_set_error(FSDP_ERR_INVALID, "FSDP_CPU_DEVICE=%s is not a CPU device mode; allowed: sync, async, strict", v);
  return FSDP_OK;
}

void dev_destroy(device_t **pd) {
  if (!pd || !*pd) return;
  device_t *d = *pd;
  *pd = NULL;
  d->op->destroy(d);
}

void dev_residual_layernorm(device_t *d, void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                            const void *w, const void *bias, int B, int T, int C) {
  if (d->kern->residual_layernorm_forward) {
    d->kern->residual_layernorm_forward(d, res, out, mean, rstd, a, b, w, bias, B, T, C);
    return;
  }
  d->kern->residual_forward(d, res, a, b, (int64_t)B * T * C);
  d->kern->layernorm_forward(d, out, mean, rstd, res, w, bias, B, T, C);
}

void dev_layernorm_backward_add(device_t *d, void *dres, void *scratch, float *dw, float *db, const void *dout,
                                const void *inp, const void *w, const float *mean, const float *rstd, int B, int T,
                                int C) {
  if (d->kern->layernorm_backward_add) {
    d->kern->layernorm_backward_add(d, dres, dw, db, dout, inp, w, mean, rstd, B, T, C);
    return;
  }
  d->kern->layernorm_backward(d, scratch, dw, db, dout, inp, w, mean, rstd, B, T, C);
  d->kern->add_act(d, dres, scratch, (int64_t)B * T * C);
}

void dev_rmsnorm_backward_add(device_t *d, void *dres, void *scratch, float *dw, const void *dout, const void *inp,
                              const void *w, const float *rstd, int BT, int C, float woff) {
  if (d->kern->rmsnorm_backward_add) {
    d->kern->rmsnorm_backward_add(d, dres, dw, dout, inp, w, rstd, BT, C, woff);
    return;
  }
  d->kern->rmsnorm_backward(d, scratch, dw, dout, inp, w, rstd, BT, C, woff);
  d->kern->add_act(d, dres, scratch, (int64_t)BT * C);
}

void dev_matmul_gelu(device_t *d, void *out, void *pre, const void *inp, const void *w, const void *bias, int BT, int C,
                     int OC) {
  if (d->kern->matmul_gelu_forward) {
    d->kern->matmul_gelu_forward(d, out, pre, inp, w, bias, BT, C, OC);
    return;
  }
  d->kern->matmul_forward(d, pre, inp, w, bias, BT, C, OC);
  d->kern->gelu_forward(d, out, pre, (int64_t)BT * OC);
}

void dev_matmul_backward_gelu(device_t *d, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                              const void *w, const void *pre, void *scratch, int BT, int C, int OC) {
  if (d->kern->matmul_backward_gelu) {
    d->kern->matmul_backward_gelu(d, dinp, dw, db, dout, inp, w, pre, BT, C, OC);
    return;
  }
  d->kern->matmul_backward(d, scratch, dw, db, dout, inp, w, BT, C, OC);
  d->kern->gelu_backward(d, dinp, pre, scratch, (int64_t)BT * C);
}
