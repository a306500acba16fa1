/* planmsg — see planmsg.h. */
#include "planmsg.h"

#include <stdlib.h>
#include <string.h>

void planmsg_destroy(Fsdp__Plan **pm) {
  Fsdp__Plan *m = pm ? *pm : NULL;
  if (!m) return;
  for (size_t u = 0; u < m->n_units; u++) {
    Fsdp__PlanUnit *pu = m->units[u];
    if (!pu) continue;
    for (size_t t = 0; t < pu->n_tensors; t++) {
      if (!pu->tensors[t]) continue;
      free(pu->tensors[t]->shape);
      free(pu->tensors[t]);
    }
    free(pu->tensors);
    free(pu);
  }
  free(m->units);
  free(m->model);
  free(m);
  *pm = NULL;
}

fsdp_status planmsg_new(const plan_t *p, Fsdp__Plan **out) {
  Fsdp__Plan *m = calloc(1, sizeof *m);
  if (!m) goto nomem;
  fsdp__plan__init(m);
  m->world = (uint32_t)p->world;
  m->shard_world = (uint32_t)p->shard_world;
  m->sharding = (uint32_t)p->sharding;
  m->shard_total = p->shard_total;
  const model_config *mc = &p->model;
  if (!(m->model = calloc(1, sizeof *m->model))) goto nomem;
  fsdp__plan_model__init(m->model);
  m->model->arch = (uint32_t)mc->arch;
  m->model->tie_embeddings = mc->tie_embeddings != 0;
  m->model->norm_eps = mc->norm_eps;
  m->model->rope_theta = mc->rope_theta;
  m->model->rope_scaling = (uint32_t)mc->rope_scaling;
  m->model->rope_factor = mc->rope_factor;
  m->model->rope_low_freq_factor = mc->rope_low_freq_factor;
  m->model->rope_high_freq_factor = mc->rope_high_freq_factor;
  m->model->rope_original_max_pos = (uint32_t)mc->rope_original_max_pos;
  m->units = calloc((size_t)p->nunits, sizeof *m->units);
  if (!m->units) goto nomem;
  m->n_units = (size_t)p->nunits;
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *src = &p->units[u];
    Fsdp__PlanUnit *pu = calloc(1, sizeof *pu);
    if (!(m->units[u] = pu)) goto nomem;
    fsdp__plan_unit__init(pu);
    pu->name = (char *)src->name;   /* borrowed from the plan, which outlives the message */
    pu->numel = src->numel;
    pu->padded = src->padded;
    pu->shard_numel = src->shard_numel;
    pu->shard_base = src->shard_base;
    pu->tensors = calloc((size_t)src->ntensors, sizeof *pu->tensors);
    if (!pu->tensors) goto nomem;
    pu->n_tensors = (size_t)src->ntensors;
    for (int t = 0; t < src->ntensors; t++) {
      const plan_tensor *st = &src->t[t];
      Fsdp__PlanTensor *pt = calloc(1, sizeof *pt);
      if (!(pu->tensors[t] = pt)) goto nomem;
      fsdp__plan_tensor__init(pt);
      pt->name = (char *)st->name;
      pt->gid = (uint32_t)st->gid;
      pt->offset = st->offset;
      pt->numel = st->numel;
      pt->decay = st->decay;
      pt->shape = calloc((size_t)st->ndim, sizeof(int64_t));
      if (!pt->shape) goto nomem;
      pt->n_shape = (size_t)st->ndim;
      for (int d = 0; d < st->ndim; d++) pt->shape[d] = st->shape[d];
    }
  }
  *out = m;
  return FSDP_OK;
nomem:
  planmsg_destroy(&m);
  return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the plan message");
}

#define DIFF(...) return fsdp_set_error(FSDP_ERR_INVALID, "the coordinator's plan differs from this worker's: " __VA_ARGS__)

fsdp_status planmsg_check(const Fsdp__Plan *m, const plan_t *p) {
  if ((int)m->world != p->world || (int)m->shard_world != p->shard_world || (int)m->sharding != (int)p->sharding)
    DIFF("world %u/%u sharding %u vs %d/%d/%d", m->world, m->shard_world, m->sharding, p->world, p->shard_world,
         (int)p->sharding);
  const Fsdp__PlanModel *mm = m->model;
  const model_config *mc = &p->model;
  if (!mm || (int)mm->arch != (int)mc->arch || !mm->tie_embeddings != !mc->tie_embeddings ||
      mm->norm_eps != mc->norm_eps || mm->rope_theta != mc->rope_theta || (int)mm->rope_scaling != (int)mc->rope_scaling ||
      mm->rope_factor != mc->rope_factor || mm->rope_low_freq_factor != mc->rope_low_freq_factor ||
      mm->rope_high_freq_factor != mc->rope_high_freq_factor || (int)mm->rope_original_max_pos != mc->rope_original_max_pos)
    DIFF("the model (arch, tie, norm_eps, rope_theta or rope scaling)");
  if ((int)m->n_units != p->nunits || m->shard_total != p->shard_total)
    DIFF("%zu units (shard %lld) vs %d (shard %lld)", m->n_units, (long long)m->shard_total, p->nunits,
         (long long)p->shard_total);
  for (int u = 0; u < p->nunits; u++) {
    const Fsdp__PlanUnit *mu = m->units[u];
    const plan_unit *pu = &p->units[u];
    if (strcmp(mu->name, pu->name) || mu->numel != pu->numel || mu->padded != pu->padded ||
        mu->shard_numel != pu->shard_numel || mu->shard_base != pu->shard_base || (int)mu->n_tensors != pu->ntensors)
      DIFF("unit %d (%s vs %s)", u, mu->name, pu->name);
    for (int t = 0; t < pu->ntensors; t++) {
      const Fsdp__PlanTensor *mt = mu->tensors[t];
      const plan_tensor *pt = &pu->t[t];
      int same = !strcmp(mt->name, pt->name) && (int)mt->gid == pt->gid && mt->offset == pt->offset &&
                 mt->numel == pt->numel && !!mt->decay == !!pt->decay && (int)mt->n_shape == pt->ndim;
      for (int d = 0; same && d < pt->ndim; d++) same = mt->shape[d] == pt->shape[d];
      if (!same) DIFF("tensor %s", pt->name);
    }
  }
  return FSDP_OK;
}
