/* reqs — the collectives a step has in flight. Every request the units' gathers and reductions
 * issue is kept here and waited for by the host once, at the end of the step: the watchdog that
 * turns a hung collective into a timeout (the stream itself is ordered by events, device.h).
 * The capacity is fixed when the runtime is made (no allocation inside a step). One thread, the
 * runtime's.
 */
#ifndef FSDP_REQS_H
#define FSDP_REQS_H

#include "comm.h"

typedef struct reqs {
  comm_req **r;
  int n, cap;
} reqs;

fsdp_status reqs_init(reqs *q, int cap);
/* Keep R (NULL: nothing to keep). Full: R is waited for at once and the step fails, since the
 * schedule's bound was wrong; a request is never dropped. */
fsdp_status reqs_add(reqs *q, comm_req *r);
/* Wait for every kept request; the first failure's status. Empties Q. */
fsdp_status reqs_wait(reqs *q);
/* Waits for what is still kept, then frees. NULL-safe on a zeroed Q. */
void reqs_fini(reqs *q);

#endif
