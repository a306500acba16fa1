/* test_loop — loop_ms_to_boundary: the wait to the next multiple of a period of the wall clock, at
 * least a quarter period away (so a timer that fired a little early does not beat twice). */
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "loop.h"

static uint64_t wall_ms(void) { return (uint64_t)(loop_now_wall() * 1000.0); }

int main(void) {
  static const uint64_t periods[] = {10, 250, 1000, 2000, 5000};
  for (size_t i = 0; i < sizeof periods / sizeof periods[0]; i++) {
    uint64_t p = periods[i];
    int bad_range = 0, bad_boundary = 0;
    for (int k = 0; k < 40; k++) {
      uint64_t t0 = wall_ms(), d = loop_ms_to_boundary(p), t1 = wall_ms();
      bad_range += d < p / 4 || d > p + p / 4;
      int on = 0;   /* now + d is a multiple of p for a "now" within the call */
      for (uint64_t t = t0; t <= t1 + 1 && !on; t++) on = (t + d) % p == 0;
      bad_boundary += !on;
      struct timespec ts = {0, (long)(k % 7) * 1000 * 1000};   /* spread the calls over the period's phases */
      nanosleep(&ts, NULL);
    }
    CHECK_EQ_INT(0, bad_range);
    CHECK_EQ_INT(0, bad_boundary);
  }
  CHECK(loop_ms_to_boundary(0) == 1);
  return check_done();
}
