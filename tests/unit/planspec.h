/* planspec — what test_plan and test_plan_families share: a GPT-2 job spec of a shape, and the check
 * of a plan's L blocks against the names, shapes, order and aliases a family gives them. Include after
 * check.h (the checks count in the including test). */
#ifndef FSDP_TEST_PLANSPEC_H
#define FSDP_TEST_PLANSPEC_H

#include <stdio.h>
#include <string.h>

#include "jobspec.h"
#include "plan.h"

static inline jobspec_t spec_of(int L, int H, int C, int V, int T) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = (model_config){.n_layer = L, .n_head = H, .n_embd = C, .vocab_size = V, .seq_len = T,
                           .pad_token_id = -1};
  return s;
}

/* The L blocks of P: unit 1+i is UNIT_FMT(i) with the NT tensors TENSOR_FMT(i, NAMES[j]) of
 * SHAPES[j] ({n, 0}: 1-D), packed in that order with no gaps and filling the unit, their gids after
 * the ROOT_NT root tensors, weight decay on the 2-D ones; each found by its name (with its unit)
 * and by the alias ALIAS_FMT(i, NAMES[j]). */
static inline void expect_blocks(const plan_t *p, int L, const char *unit_fmt, const char *tensor_fmt, const char *alias_fmt,
                                 int root_nt, int nt, const char *const *names, const int64_t (*shapes)[2]) {
  for (int i = 0; i < L; i++) {
    const plan_unit *u = &p->units[1 + i];
    char name[96];
    snprintf(name, sizeof name, unit_fmt, i);
    CHECK(!strcmp(u->name, name));
    CHECK_EQ_INT(nt, u->ntensors);
    int64_t off = 0;
    for (int j = 0; j < nt; j++) {
      const plan_tensor *t = &u->t[j];
      snprintf(name, sizeof name, tensor_fmt, i, names[j]);
      CHECK(!strcmp(t->name, name));
      CHECK_EQ_INT(root_nt + nt * i + j, t->gid);
      CHECK_EQ_INT(shapes[j][1] ? 2 : 1, t->ndim);
      CHECK_EQ_INT(shapes[j][0], t->shape[0]);
      CHECK_EQ_INT(shapes[j][1], t->shape[1]);
      CHECK_EQ_INT(t->ndim == 2, t->decay);
      CHECK_EQ_INT(off, t->offset);   /* packed in Hugging Face order, no gaps (q|k|v, gate|up adjacent) */
      off += t->numel;
      int unit = -1;
      CHECK(plan_find_tensor(p, name, &unit) == t);
      CHECK_EQ_INT(1 + i, unit);
      snprintf(name, sizeof name, alias_fmt, i, names[j]);
      CHECK(plan_find_tensor(p, name, NULL) == t);
    }
    CHECK_EQ_INT(off, u->numel);
  }
}

#endif
