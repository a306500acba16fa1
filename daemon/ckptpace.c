/* ckptpace — see ckptpace.h. */
#include "ckptpace.h"

static double base_mean(const ckptpace *p) {
  double s = 0;
  for (int i = 0; i < p->nbase; i++) s += p->base[i];
  return p->nbase ? s / p->nbase : 0.0;
}

void ckptpace_step(ckptpace *p, uint32_t step, double step_ms, int saves, Fsdp__CkptSave *done, size_t ndone) {
  int overlapped = p->flight != 0;
  if (overlapped) p->flight_ms += step_ms, p->flight_n++;
  int own_done = 0;
  for (size_t i = 0; i < ndone; i++) {
    Fsdp__CkptSave *c = &done[i];
    c->inflight_steps = 0, c->inflight_step_ms = 0, c->before_step_ms = 0;
    if (c->step == step) own_done = 1;
    if (!p->flight || c->step != p->flight) continue;
    if (p->flight_n) {
      c->inflight_steps = p->flight_n;
      c->inflight_step_ms = p->flight_ms / p->flight_n;
      c->before_step_ms = p->before_ms;
    }
    p->flight = 0;
  }
  if (!p->first) {
    p->first = step;
  } else if (!overlapped) {
    p->base[p->next] = step_ms;
    p->next = (p->next + 1) % CKPTPACE_BASE;
    if (p->nbase < CKPTPACE_BASE) p->nbase++;
  }
  if (saves && !own_done) {
    p->flight = step, p->flight_n = 0, p->flight_ms = 0;
    p->before_ms = base_mean(p);
  }
}
