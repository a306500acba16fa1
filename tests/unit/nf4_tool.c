/* nf4_tool — worker/ops/nf4's quantization of raw fp32 values, for tests/integration/nf4_bnb.sh (not a
 * test itself): `nf4_tool IN.f32 OUTDIR` writes OUTDIR/codes, absmax_q, absmax2, offset (the quantized
 * form, nf4.h), deq.f32 and deq.bf16 (its dequantization), and the maps (nf4_code.f32, dynamic.f32). */
#include <stdio.h>
#include <stdlib.h>

#include "nf4.h"

static int put(const char *dir, const char *name, const void *p, size_t bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(p, 1, bytes, f) == bytes;
  if (f && fclose(f)) ok = 0;
  if (!ok) fprintf(stderr, "nf4_tool: cannot write %s\n", path);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: nf4_tool IN.f32 OUTDIR\n");
    return 2;
  }
  FILE *f = fopen(argv[1], "rb");
  if (!f || fseek(f, 0, SEEK_END) || ftell(f) <= 0) {
    fprintf(stderr, "nf4_tool: cannot read %s\n", argv[1]);
    return 1;
  }
  int64_t n = ftell(f) / 4;
  rewind(f);
  float *x = malloc((size_t)n * 4), *deq = malloc((size_t)n * 4), dyn[256];
  uint16_t *bf = malloc((size_t)n * 2);
  nf4_tensor t = {.codes = malloc((size_t)n / 2 + 1), .absmax_q = malloc((size_t)nf4_blocks(n) + 1),
                  .absmax2 = malloc((size_t)nf4_groups(n) * 4 + 4)};
  if (!x || !deq || !bf || !t.codes || !t.absmax_q || !t.absmax2 || fread(x, 4, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "nf4_tool: cannot read %lld values of %s\n", (long long)n, argv[1]);
    return 1;
  }
  fclose(f);
  int rc = nf4_quantize(x, n, &t);
  if (rc) {
    fprintf(stderr, "nf4_tool: %lld values: %s\n", (long long)n, rc == -1 ? "not a multiple of 64" : "no memory");
    return 1;
  }
  nf4_dequantize(&t, deq);
  nf4_dequantize_bf16(&t, bf);
  for (int i = 0; i < 256; i++) dyn[i] = nf4_dynamic(i);
  const char *d = argv[2];
  int bad = put(d, "codes", t.codes, (size_t)n / 2) | put(d, "absmax_q", t.absmax_q, (size_t)nf4_blocks(n)) |
            put(d, "absmax2", t.absmax2, (size_t)nf4_groups(n) * 4) | put(d, "offset", &t.offset, 4) |
            put(d, "deq.f32", deq, (size_t)n * 4) | put(d, "deq.bf16", bf, (size_t)n * 2) |
            put(d, "nf4_code.f32", nf4_code, sizeof nf4_code) | put(d, "dynamic.f32", dyn, sizeof dyn);
  free(x), free(deq), free(bf), free(t.codes), free(t.absmax_q), free(t.absmax2);
  return bad;
}
