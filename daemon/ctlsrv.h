/* ctlsrv — the coordinator's control endpoint: the requests of fsdpctl (submit, status, list,
 * cancel, stop, logs, nodes, shutdown), one reply each.
 *
 * Submit validates the job (job_from_spec, schedule_fit) and stores it before it answers; status and
 * list are answered from jobs.db; logs reads the job's files in chunks. A malformed request is
 * answered with error{code, "malformed request ..."} when it came with an envelope. Loop thread
 * only.
 */
#ifndef FSDP_DAEMON_CTLSRV_H
#define FSDP_DAEMON_CTLSRV_H

#include "coord_core.h"

/* Bind the control ROUTER at c->ctl_ep (once) and serve it from the loop. */
void ctlsrv_bind(coord_t *c);

#endif
