/* monotime — the worker's one clock: CLOCK_MONOTONIC, which every thread of the process shares, so
 * that spans recorded on the host, the compute stream's thread and the comm thread line up, step
 * times do not jump with the wall clock, and deadlines of condition waits (whose condition variables
 * are set to this clock) are absolute times on it. Any thread.
 */
#ifndef FSDP_MONOTIME_H
#define FSDP_MONOTIME_H

#include <stdint.h>
#include <time.h>

uint64_t monotime_us(void);
double monotime_s(void);
/* The absolute time SECONDS from now, for pthread_cond_timedwait with CLOCK_MONOTONIC. */
struct timespec monotime_after(double seconds);

#endif
