/* stepstats — see stepstats.h. */
#include "stepstats.h"

#include "plan.h"

const char *const stepstats_phase_names[STEPSTATS_NPHASE] = {"allgather", "compute", "reducescatter", "optimizer"};

static const char *const std_groups[] = {"peak_bytes", "cur_bytes", "phase_us", "sent_bytes", "sent_inter_bytes"};

static const char *mem_key(int i) { return plan_mem_category_name((mem_category)i); }
static const char *coll_key(int i) { return plan_coll_kind_name((coll_kind)i); }
static const char *phase_key(int i) { return stepstats_phase_names[i]; }

void stepstats_figure_name(const Fsdp__StepAgg *m, size_t i, const char **group, const char **key) {
  static const int len[] = {MEM_NCAT, MEM_NCAT, STEPSTATS_NPHASE, COLL_NKIND, COLL_NKIND};
  static const char *(*const keyf[])(int) = {mem_key, mem_key, phase_key, coll_key, coll_key};
  *key = NULL;
  if (i >= m->n_std) {
    *group = "extra";
    *key = m->extra_names[i - m->n_std];
    return;
  }
  size_t k = i;
  for (int g = 0; g < 5; g++) {
    if (k < (size_t)len[g]) {
      *group = std_groups[g];
      *key = keyf[g]((int)k);
      return;
    }
    k -= (size_t)len[g];
  }
  *group = k == 0 ? "step_us" : k == 1 ? "eval_us" : "unknown";
}
