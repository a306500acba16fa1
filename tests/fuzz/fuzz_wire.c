/* fuzz_wire — libFuzzer target: arbitrary bytes as a message body. wire_unpack must reject or
 * accept without a crash, a leak or undefined behaviour, and whatever it accepts must validate and
 * pack back to a message that unpacks again. */
#include <stdlib.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Fsdp__Msg *m = NULL;
  if (wire_unpack(data, size, &m) != FSDP_OK) return 0;
  if (wire_validate(m) != FSDP_OK) abort();
  uint8_t *buf = NULL;
  size_t len = 0;
  if (wire_pack(m, &buf, &len) != FSDP_OK) abort();
  Fsdp__Msg *again = NULL;
  if (wire_unpack(buf, len, &again) != FSDP_OK) abort();
  wire_destroy(&again);
  free(buf);
  wire_destroy(&m);
  return 0;
}
