/* stepstats — see stepstats.h. */
#include "stepstats.h"

const char *const stepstats_phase_names[STEPSTATS_NPHASE] = {"allgather", "compute", "reducescatter", "optimizer"};
