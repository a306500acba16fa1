/* reqs — see reqs.h. */
#include "reqs.h"

#include <stdlib.h>

fsdp_status reqs_init(reqs *q, int cap) {
  q->n = 0;
  q->cap = cap;
  q->r = calloc((size_t)cap, sizeof *q->r);
  return q->r ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a table of %d collectives", cap);
}

fsdp_status reqs_add(reqs *q, comm_req *r) {
  if (!r) return FSDP_OK;
  if (q->n == q->cap) {
    comm_wait(&r);
    return fsdp_set_error(FSDP_ERR_INTERNAL, "more than %d collectives in one step", q->cap);
  }
  q->r[q->n++] = r;
  return FSDP_OK;
}

fsdp_status reqs_wait(reqs *q) {
  fsdp_status rc = FSDP_OK;
  for (int i = 0; i < q->n; i++) {
    fsdp_status r = comm_wait(&q->r[i]);
    if (rc == FSDP_OK) rc = r;
  }
  q->n = 0;
  return rc;
}

void reqs_fini(reqs *q) {
  if (!q->r) return;
  reqs_wait(q);
  free(q->r);
  q->r = NULL;
  q->cap = 0;
}
