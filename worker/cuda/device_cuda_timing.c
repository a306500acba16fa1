/* device_cuda_timing — the CUDA device's timers and spans (device.h: set_timer, timers, trace):
 * timing events recorded on the compute stream at every timer change, around every wait and at
 * every span boundary, turned into per-timer stream time and host-time spans when timers() (after
 * a sync) closes the window. State in cuda_dev (device_cuda_int.h); the device's host thread only.
 */
#include "device_cuda_int.h"

#include <stdlib.h>

#include "cuda_spans.h"
#include "monotime.h"

int cuda_dev_tev_record(cuda_dev *d) {
  if (d->err != FSDP_OK) return -1;
  if (d->ntev == d->captev) {
    int cap = d->captev ? 2 * d->captev : 64;
    cudaEvent_t *t = realloc(d->tev, (size_t)cap * sizeof *t);
    if (!t) return -1;   /* timing is best effort: an entry without events charges nothing */
    d->tev = t;
    for (int i = d->captev; i < cap; i++) {
      if (cudaEventCreate(&t[i]) != cudaSuccess) {
        (void)cudaGetLastError();
        d->captev = i;
        return -1;
      }
    }
    d->captev = cap;
  }
  if (cudaEventRecord(d->tev[d->ntev], d->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d->ntev++;
}

void cuda_dev_tl_add(cuda_dev *d, tentry t) {
  if (!d->timing || t.ev0 < 0 || t.ev1 < 0) return;
  if (d->ntl == d->captl) {
    int cap = d->captl ? 2 * d->captl : 128;
    tentry *n = realloc(d->tl, (size_t)cap * sizeof *n);
    if (!n) return;
    d->tl = n;
    d->captl = cap;
  }
  d->tl[d->ntl++] = t;
}

/* Open a window at the current end of the stream: its first segment belongs to d->timer. */
void cuda_dev_window_open(cuda_dev *d) {
  d->ntev = d->ntl = 0;
  d->timing = 1;
  int e = cuda_dev_tev_record(d);
  cuda_dev_tl_add(d, (tentry){.timer = d->timer, .ev0 = e, .ev1 = e});
  if (e < 0) d->timing = 0;
}

void cuda_dev_set_timer(device_t *dd, dev_timer t) {
  cuda_dev *d = cd(dd);
  if (d->timer == (int)t) return;
  d->timer = (int)t;
  int e = cuda_dev_tev_record(d);
  cuda_dev_tl_add(d, (tentry){.timer = (int)t, .ev0 = e, .ev1 = e});
}

void cuda_dev_trace(device_t *dd, trace_t *t, int end, trace_kind kind, int unit, int step) {
  cuda_dev *d = cd(dd);
  if (!d->timing) return;
  if (d->nmarks == d->capmarks) {
    int cap = d->capmarks ? 2 * d->capmarks : 256;
    tmark *n = realloc(d->marks, (size_t)cap * sizeof *n);
    if (!n) return;   /* spans are best effort, like the timers */
    d->marks = n;
    d->capmarks = cap;
  }
  int e = cuda_dev_tev_record(d);
  if (e >= 0) d->marks[d->nmarks++] = (tmark){.ev = e, .end = end, .kind = kind, .unit = unit, .step = step, .t = t};
}

static float elapsed_ms(cuda_dev *d, int a, int b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, d->tev[a], d->tev[b]) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return ms > 0 ? ms : 0;
}

/* The window's span boundaries into host time, given END: a timing event recorded on the idle stream
 * and synchronized, so that it completed "now". */
void cuda_dev_resolve_marks(cuda_dev *d, int end) {
  uint64_t now = monotime_us();
  for (int i = 0; i < d->nmarks; i++) {
    const tmark *m = &d->marks[i];
    uint64_t at;
    (void)cuda_spans_host_us(d->tev[m->ev], d->tev[end], now, 0, &at);   /* unreadable: at "now", as before */
    if (m->end) trace_end(m->t, TRACE_STREAM, m->kind, m->unit, m->step, at);
    else trace_begin(m->t, TRACE_STREAM, at);
  }
  d->nmarks = 0;
}

void cuda_dev_timers(device_t *dd, uint64_t us[DEV_NTIMER]) {
  cuda_dev *d = cd(dd);
  double ms[DEV_NTIMER] = {0};
  int end = d->timing ? cuda_dev_tev_record(d) : -1;
  if (end >= 0 && cudaEventSynchronize(d->tev[end]) == cudaSuccess) {
    int seg = -1;   /* the open segment's entry */
    for (int i = 0; i < d->ntl; i++) {
      const tentry *t = &d->tl[i];
      if (t->wait) {
        double w = elapsed_ms(d, t->ev0, t->ev1);
        ms[t->timer] += w;
        ms[t->seg_timer] -= w;
        continue;
      }
      if (seg >= 0) ms[d->tl[seg].timer] += elapsed_ms(d, d->tl[seg].ev0, t->ev0);
      seg = i;
    }
    if (seg >= 0) ms[d->tl[seg].timer] += elapsed_ms(d, d->tl[seg].ev0, end);
    cuda_dev_resolve_marks(d, end);
  }
  d->nmarks = 0;
  (void)cudaGetLastError();
  for (int i = 0; i < DEV_NTIMER; i++) us[i] = ms[i] > 0 ? (uint64_t)(ms[i] * 1000.0 + 0.5) : 0;
  cuda_dev_window_open(d);
}

