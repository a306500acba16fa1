/* test_safetensors — .safetensors round trips, BF16 rounding, malformed files, and loading a
 * rank's shard of a plan straight from a file. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gpt2.h"
#include "llama.h"
#include "safetensors.h"
#include "tmpdir.h"

static int has(const char *needle) {
  const char *msg = fsdp_last_error();
  if (strstr(msg, needle)) return 1;
  fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", msg, needle);
  return 0;
}

static uint8_t *slurp(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)*len + 1);
  if (fread(b, 1, (size_t)*len, f) != (size_t)*len) *len = -1;
  fclose(f);
  return b;
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* A deterministic pseudo-random float in about [-2, 2), with varied low mantissa bits. */
static float val(uint64_t k) {
  uint64_t x = k * 0x9e3779b97f4a7c15ull + 12345;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (float)((double)(x >> 11) * 0x1.0p-53 * 4.0 - 2.0);
}

static void test_bf16_rounding(void) {
  /* Ties go to even, above half goes up, below half goes down, NaN stays NaN. */
  CHECK_EQ_INT(0x3F80, st_f32_to_bf16(from_bits(0x3F808000)));  /* 1 + 2^-8: tie, even → 1 */
  CHECK_EQ_INT(0x3F82, st_f32_to_bf16(from_bits(0x3F818000)));  /* tie, odd → up */
  CHECK_EQ_INT(0x3F81, st_f32_to_bf16(from_bits(0x3F808001)));  /* just above half */
  CHECK_EQ_INT(0x3F80, st_f32_to_bf16(from_bits(0x3F807FFF)));  /* just below half */
  CHECK_EQ_INT(0xBF82, st_f32_to_bf16(from_bits(0xBF818000)));  /* sign-symmetric */
  CHECK_EQ_INT(0x7F80, st_f32_to_bf16(from_bits(0x7F7FFFFF)));  /* rounds up to +inf */
  CHECK_EQ_INT(0x8000, st_f32_to_bf16(-0.0f));
  CHECK(isnan(st_bf16_to_f32(st_f32_to_bf16(from_bits(0x7F800001)))));  /* signalling NaN stays NaN */
  CHECK(isinf(st_bf16_to_f32(st_f32_to_bf16(INFINITY))));
  /* Against an independent definition: the nearest of the two bf16 neighbours, ties to even. */
  int bad = 0;
  for (uint64_t k = 0; k < 200000; k++) {
    float x = val(k) * (k % 7 == 0 ? 1e-30f : 1.0f);
    uint32_t u = bits(x);
    uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    double dlo = fabs((double)from_bits(lo) - x), dhi = fabs((double)from_bits(hi) - x);
    uint16_t want = (uint16_t)((dlo < dhi || (dlo == dhi && !((lo >> 16) & 1))) ? lo >> 16 : hi >> 16);
    bad += st_f32_to_bf16(x) != want;
  }
  CHECK_EQ_INT(0, bad);
}

/* The round trip's tensors: zeta.weight F32 [6, 5] with specials, alpha.bias BF16 [1000], a scalar,
 * and an empty [0, 4]. */
enum { RT_NA = 6 * 5, RT_NB = 1000 };
typedef struct {
  float a[RT_NA], b[RT_NB], s[1];
} rt_data;
static const int64_t rt_sa[2] = {6, 5}, rt_sb[1] = {RT_NB};

static void rt_fill(rt_data *d) {
  for (int i = 0; i < RT_NA; i++) d->a[i] = val((uint64_t)i);
  for (int i = 0; i < RT_NB; i++) d->b[i] = val((uint64_t)i + 7777);
  d->s[0] = 3.25f;
  /* F32 specials must survive bit-exactly. */
  d->a[0] = -0.0f;
  d->a[1] = INFINITY;
  d->a[2] = from_bits(0x7FC01234);  /* NaN with payload */
  d->a[3] = from_bits(0x00000001);  /* smallest denormal */
}

/* Write D to P, with the writer's refusals along the way. */
static void rt_write(const char *p, const rt_data *d) {
  int64_t sz[2] = {0, 4};
  st_writer *w = NULL;
  CHECK_OK(st_writer_new(p, &w));
  CHECK_OK(st_writer_add(w, "zeta.weight", "F32", rt_sa, 2, d->a));
  CHECK_OK(st_writer_add(w, "alpha.bias", "BF16", rt_sb, 1, d->b));
  CHECK_OK(st_writer_add(w, "scalar", "F32", NULL, 0, d->s));
  CHECK_OK(st_writer_add(w, "empty", "F32", sz, 2, NULL));
  CHECK(st_writer_add(w, "transformer.alpha.bias", "F32", rt_sb, 1, d->b) == FSDP_ERR_INVALID);
  CHECK(has("added twice"));
  CHECK(st_writer_add(w, "x", "F16", rt_sb, 1, d->b) == FSDP_ERR_INVALID);
  CHECK(has("F32, BF16"));
  CHECK(st_writer_add(w, "__metadata__", "F32", rt_sb, 1, d->b) == FSDP_ERR_INVALID);
  CHECK_OK(st_writer_finish(&w));
  CHECK(w == NULL);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  CHECK(access(tmp, F_OK) != 0);
}

/* The layout of P, checked byte by byte. */
static void rt_check_layout(const char *p, const rt_data *d) {
  long len = 0;
  uint8_t *raw = slurp(p, &len);
  CHECK(raw != NULL && len > 8);
  if (!raw) return;
  uint64_t hlen;
  memcpy(&hlen, raw, 8);
  CHECK_EQ_INT(0, hlen % 8);
  CHECK_EQ_INT(len, (long)(8 + hlen + RT_NA * 4 + RT_NB * 2 + 4));
  CHECK(raw[8] == '{');
  raw[len] = 0;
  char *hdr = (char *)raw + 8;
  CHECK(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\"}") != NULL);
  CHECK(strstr(hdr, "\"zeta.weight\":{\"data_offsets\":[0,120],\"dtype\":\"F32\",\"shape\":[6,5]}") != NULL);
  CHECK(strstr(hdr, "\"alpha.bias\":{\"data_offsets\":[120,2120],\"dtype\":\"BF16\",\"shape\":[1000]}") != NULL);
  CHECK(strstr(hdr, "\"scalar\":{\"data_offsets\":[2120,2124],\"dtype\":\"F32\",\"shape\":[]}") != NULL);
  CHECK(strstr(hdr, "\"alpha.bias\"") < strstr(hdr, "\"zeta.weight\""));   /* sorted keys */
  char *close = hdr + hlen - 1;   /* the padding after the JSON is spaces */
  while (*close == ' ') close--;
  CHECK(*close == '}');
  CHECK(memcmp(raw + 8 + hlen, d->a, sizeof d->a) == 0);   /* F32 data stored as given */
  free(raw);
}

/* What the reader gives back from F: names, shapes, values (BF16 within half an ulp), ranges. */
static void rt_check_reads(st_file *f, const rt_data *d) {
  CHECK_EQ_INT(4, st_count(f));
  CHECK(!strcmp(st_name(f, 0), "zeta.weight"));   /* data order = order added */
  CHECK(!strcmp(st_name(f, 1), "alpha.bias"));
  CHECK(st_tensor_dtype(f, 1) == ST_BF16);
  CHECK_EQ_INT(2, st_ndim(f, 0));
  CHECK_EQ_INT(5, st_shape(f, 0)[1]);
  CHECK_EQ_INT(RT_NB, st_numel(f, 1));
  CHECK_EQ_INT(0, st_numel(f, 3));
  float ra[RT_NA], rb[RT_NB], rs[1];
  CHECK_OK(st_read(f, "zeta.weight", rt_sa, 2, ra));
  CHECK(memcmp(ra, d->a, sizeof d->a) == 0);
  CHECK_OK(st_read(f, "transformer.alpha.bias", rt_sb, 1, rb));   /* prefix accepted */
  int bad = 0;
  double maxrel = 0;
  for (int i = 0; i < RT_NB; i++) {
    bad += bits(rb[i]) != bits(st_bf16_to_f32(st_f32_to_bf16(d->b[i])));
    double r = fabs((double)rb[i] - d->b[i]) / fabs((double)d->b[i]);
    if (r > maxrel) maxrel = r;
  }
  CHECK_EQ_INT(0, bad);
  CHECK(maxrel <= 1.0 / 256 + 1e-9);   /* half an ulp of an 8-bit significand */
  CHECK_OK(st_read(f, "scalar", NULL, 0, rs));
  CHECK(rs[0] == 3.25f);
  /* Ranges agree with the full read. */
  float part[7];
  CHECK_OK(st_read_range(f, "zeta.weight", 11, 7, part));
  CHECK(memcmp(part, ra + 11, sizeof part) == 0);
  CHECK_OK(st_read_range(f, "alpha.bias", 993, 7, part));
  CHECK(memcmp(part, rb + 993, sizeof part) == 0);
  CHECK(st_read_range(f, "alpha.bias", 995, 7, part) == FSDP_ERR_RANGE);
  CHECK(has("1000 elements"));
}

/* Wrong shape, transposed, missing: each refused with its reason. */
static void rt_check_refusals(st_file *f) {
  float ra[RT_NA];
  int64_t wrong[2] = {5, 6}, wrong3[2] = {6, 4};
  CHECK(st_read(f, "zeta.weight", wrong3, 2, ra) == FSDP_ERR_INVALID);
  CHECK(has("expected shape [6, 4], found [6, 5]"));
  CHECK(st_read(f, "zeta.weight", wrong, 2, ra) == FSDP_ERR_INVALID);
  CHECK(has("transposed"));
  CHECK(st_read(f, "zeta.weight", rt_sb, 1, ra) == FSDP_ERR_INVALID);
  CHECK(st_read(f, "h.0.mlp.c_fc.weight", rt_sa, 2, ra) == FSDP_ERR_NOTFOUND);
  CHECK(has("'h.0.mlp.c_fc.weight'"));
  CHECK_EQ_INT(-1, st_find(f, "beta.bias"));
}

/* F saved again to P2 (load → save) is P1's bytes exactly. */
static void rt_check_resave(st_file *f, const char *p1, const char *p2) {
  float *bufs[4];
  st_writer *w = NULL;
  CHECK_OK(st_writer_new(p2, &w));
  for (int i = 0; i < st_count(f); i++) {
    bufs[i] = malloc(sizeof(float) * (size_t)(st_numel(f, i) + 1));
    CHECK_OK(st_read(f, st_name(f, i), st_shape(f, i), st_ndim(f, i), bufs[i]));
    CHECK_OK(st_writer_add(w, st_name(f, i), st_dtype_name(st_tensor_dtype(f, i)), st_shape(f, i),
                           st_ndim(f, i), bufs[i]));
  }
  CHECK_OK(st_writer_finish(&w));
  for (int i = 0; i < st_count(f); i++) free(bufs[i]);
  long l1 = 0, l2 = 0;
  uint8_t *b1 = slurp(p1, &l1), *b2 = slurp(p2, &l2);
  CHECK(b1 && b2 && l1 == l2 && l1 > 0 && memcmp(b1, b2, (size_t)l1) == 0);
  free(b1);
  free(b2);
}

/* An independent minimal reader of P (python3's struct and json) finds D's values. */
static void rt_check_python_reader(const char *p, const rt_data *d) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "python3 - '%s' <<'EOF'\n"
           "import json, struct, sys\n"
           "b = open(sys.argv[1], 'rb').read()\n"
           "n = struct.unpack('<Q', b[:8])[0]\n"
           "h = json.loads(b[8:8 + n])\n"
           "d = b[8 + n:]\n"
           "t = h['zeta.weight']; s, e = t['data_offsets']\n"
           "v = struct.unpack('<30I', d[s:e])\n"
           "t = h['scalar']; s, e = t['data_offsets']\n"
           "assert struct.unpack('<f', d[s:e])[0] == 3.25\n"
           "t = h['alpha.bias']; s, e = t['data_offsets']\n"
           "x = struct.unpack('<H', d[s:s + 2])[0]\n"
           "f = x << 16\n"
           "assert h['__metadata__'] == {'format': 'pt'}\n"
           "assert len(d) == max(t['data_offsets'][1] for k, t in h.items() if k != '__metadata__')\n"
           "print(v[29], f)\n"
           "EOF\n",
           p);
  FILE *pp = popen(cmd, "r");
  unsigned v29 = 0, f0 = 0;   /* bit patterns */
  int got = pp ? fscanf(pp, "%u %u", &v29, &f0) : 0;
  int st = pp ? pclose(pp) : -1;
  CHECK_EQ_INT(0, st);   /* python3 is a test dependency (scripts/install-deps.sh --test) */
  CHECK_EQ_INT(2, got);
  CHECK_EQ_INT(bits(d->a[29]), v29);
  CHECK_EQ_INT(bits(st_bf16_to_f32(st_f32_to_bf16(d->b[0]))), f0);
}

static void test_roundtrip(void) {
  static rt_data d;
  rt_fill(&d);
  const char *p1 = path_in("rt1.safetensors"), *p2 = path_in("rt2.safetensors");
  rt_write(p1, &d);
  rt_check_layout(p1, &d);
  st_file *f = NULL;
  CHECK_OK(st_open(p1, &f));
  if (!f) return;
  rt_check_reads(f, &d);
  rt_check_refusals(f);
  rt_check_resave(f, p1, p2);
  st_destroy(&f);
  CHECK(f == NULL);
  rt_check_python_reader(p2, &d);
}

/* A file with the given header text (padded as-is) followed by DATA_LEN zero bytes. */
static const char *raw_file(const char *name, const char *json, size_t data_len, int64_t hlen_override) {
  const char *p = path_in(name);
  FILE *f = fopen(p, "wb");
  uint64_t hlen = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(json);
  fwrite(&hlen, 8, 1, f);
  fwrite(json, 1, strlen(json), f);
  for (size_t i = 0; i < data_len; i++) fputc(0, f);
  fclose(f);
  return p;
}

static void expect_bad(const char *name, const char *json, size_t data_len, fsdp_status want,
                       const char *needle) {
  st_file *f = NULL;
  fsdp_status s = st_open(raw_file(name, json, data_len, -1), &f);
  if (s != want) fprintf(stderr, "  %s: got %s (%s)\n", name, fsdp_strerror(s), fsdp_last_error());
  CHECK(s == want);
  CHECK(f == NULL);
  CHECK(has(needle));
  st_destroy(&f);
}

static void test_bad_files(void) {
  st_file *f = NULL;
  const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}";
  CHECK_OK(st_open(raw_file("ok.safetensors", ok, 16, -1), &f));
  if (f) CHECK_EQ_INT(2, st_count(f));
  st_destroy(&f);
  /* Extra keys and metadata are ignored; a header padded with spaces is fine. */
  CHECK_OK(st_open(raw_file("ok2.safetensors",
                            "{\"__metadata__\":{\"x\":\"y\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                            "\"data_offsets\":[0,4],\"extra\":1}}      ",
                            4, -1),
                   &f));
  st_destroy(&f);

  CHECK(st_open(path_in("none.safetensors"), &f) == FSDP_ERR_NOTFOUND);
  FILE *t = fopen(path_in("tiny.safetensors"), "wb");
  fwrite("abc", 1, 3, t);
  fclose(t);
  CHECK(st_open(path_in("tiny.safetensors"), &f) == FSDP_ERR_FORMAT);
  CHECK(has("8-byte header length"));
  /* Truncated: the header length points past the end of the file. */
  CHECK(st_open(raw_file("trunc.safetensors", ok, 0, (int64_t)strlen(ok) + 100), &f) == FSDP_ERR_FORMAT);
  CHECK(has("truncated"));
  /* Truncated data: the header is intact, the data is short. */
  expect_bad("truncdata.safetensors", ok, 12, FSDP_ERR_FORMAT, "out of bounds");
  expect_bad("notjson.safetensors", "{\"a\": {\"dtype\": \"F32\", }", 0, FSDP_ERR_FORMAT, "bad JSON");
  expect_bad("notobj.safetensors", "[1, 2, 3]", 0, FSDP_ERR_FORMAT, "does not start with '{'");
  expect_bad("dup.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             8, FSDP_ERR_FORMAT, "bad JSON");
  expect_bad("oob.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
             8, FSDP_ERR_FORMAT, "out of bounds");
  expect_bad("overlap.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12, FSDP_ERR_FORMAT, "overlap");
  expect_bad("hole.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             12, FSDP_ERR_FORMAT, "belong to no tensor");
  expect_bad("extra.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             12, FSDP_ERR_FORMAT, "the tensors cover 4 bytes but the data buffer is 12");
  expect_bad("size.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
             8, FSDP_ERR_FORMAT, "needs 12 bytes");
  expect_bad("f16.safetensors", "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
             4, FSDP_ERR_UNSUPPORTED, "dtype F16; fsdpd reads F32, BF16");
  expect_bad("xyz.safetensors", "{\"a\":{\"dtype\":\"XYZ\",\"shape\":[2],\"data_offsets\":[0,4]}}",
             4, FSDP_ERR_UNSUPPORTED, "F32, BF16");
  expect_bad("noshape.safetensors", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
             FSDP_ERR_FORMAT, "\"shape\"");
  expect_bad("negshape.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
             4, FSDP_ERR_FORMAT, "non-negative");
  expect_bad("revoff.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",
             4, FSDP_ERR_FORMAT, "BEGIN <= END");
  expect_bad("notentry.safetensors", "{\"a\":5}", 0, FSDP_ERR_FORMAT, "not an object");
}

/* ---- shards, against the planner ----
 * The oracle is docs/design.md §3, not plan.c: unit 0 holds wte, wpe, ln_f.weight, ln_f.bias; unit 1+i
 * holds block i's 12 tensors in Hugging Face order, each unit one flat buffer in that order. The
 * file is written tensor by tensor from this table (never through a plan), so a planner that put
 * a tensor in the wrong place or order makes the shards it loads come out wrong. */

typedef struct {
  char name[64];
  int64_t d0, d1;   /* d1 = 0: a vector */
} spec_tensor;

/* Unit U's tensors per docs/design.md §3; returns their count. */
static int spec_unit(int u, int C, int V, int T, spec_tensor *out) {
  if (u == 0) {
    out[0] = (spec_tensor){"wte.weight", V, C};
    out[1] = (spec_tensor){"wpe.weight", T, C};
    out[2] = (spec_tensor){"ln_f.weight", C, 0};
    out[3] = (spec_tensor){"ln_f.bias", C, 0};
    return 4;
  }
  static const struct { const char *n; int a, b; } blk[12] = {
    {"ln_1.weight", 1, 0}, {"ln_1.bias", 1, 0}, {"attn.c_attn.weight", 1, 3},
    {"attn.c_attn.bias", 3, 0}, {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0}, {"ln_2.bias", 1, 0}, {"mlp.c_fc.weight", 1, 4},
    {"mlp.c_fc.bias", 4, 0}, {"mlp.c_proj.weight", 4, 1}, {"mlp.c_proj.bias", 1, 0}};
  for (int j = 0; j < 12; j++) {
    snprintf(out[j].name, sizeof out[j].name, "h.%d.%s", u - 1, blk[j].n);
    out[j].d0 = (int64_t)blk[j].a * C;
    out[j].d1 = (int64_t)blk[j].b * C;
  }
  return 12;
}

static int64_t spec_numel(const spec_tensor *s) { return s->d1 ? s->d0 * s->d1 : s->d0; }

/* Element K of tensor NAME: a value that says which tensor and which element it is. */
static float spec_val(const char *name, int64_t k) {
  uint64_t h = 1469598103934665603ull;
  for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  return val(h % 1000003u * 7919u + (uint64_t)k);
}

/* Unit U's flat buffer per the oracle (malloc'd), its element count in *N. */
static float *spec_buffer(int u, int C, int V, int T, int64_t *n) {
  spec_tensor st[12];
  int nt = spec_unit(u, C, V, T, st);
  *n = 0;
  for (int i = 0; i < nt; i++) *n += spec_numel(&st[i]);
  float *b = malloc(sizeof(float) * (size_t)*n);
  int64_t off = 0;
  for (int i = 0; i < nt; i++)
    for (int64_t k = 0; k < spec_numel(&st[i]); k++) b[off++] = spec_val(st[i].name, k);
  return b;
}

/* The planner's plan for model M (batch 1, no accumulation) on WORLD ranks. */
static plan_t *planned_model(model_config m, int world, shard_mode sharding) {
  jobspec_t spec;
  jobspec_defaults(&spec);
  spec.model = m;
  spec.batch_size = 1;
  spec.grad_accum = 1;
  spec.world_size = world;
  spec.sharding = sharding;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&spec, world, &p));
  return p;
}

/* A GPT-2 of this shape. */
static plan_t *planned(int L, int C, int V, int T, int world, shard_mode sharding) {
  return planned_model((model_config){.n_layer = L, .n_head = 2, .n_embd = C, .vocab_size = V, .seq_len = T}, world,
                       sharding);
}

/* Load every rank's shard of P from F and compare with the full unit buffers UNITS (zero padding). */
static void check_gather(const st_file *f, const plan_t *p, float *const *units, const int64_t *numel) {
  float *shard = malloc(sizeof(float) * (size_t)p->shard_total);
  int bad = 0;
  for (int u = 0; u < p->nunits; u++) CHECK(p->units[u].numel == numel[u]);
  for (int r = 0; r < p->world; r++) {
    for (int64_t i = 0; i < p->shard_total; i++) shard[i] = NAN;
    CHECK_OK(st_load_shard(f, p, r, shard));
    for (int u = 0; u < p->nunits; u++) {
      const plan_unit *U = &p->units[u];
      int64_t off = plan_shard_offset(p, u, r);
      for (int64_t i = 0; i < U->shard_numel; i++) {
        int64_t e = off + i;
        float want = e < numel[u] ? units[u][e] : 0.0f;
        bad += bits(shard[U->shard_base + i]) != bits(want);
      }
    }
  }
  if (bad) fprintf(stderr, "  world %d, %s: %d elements differ from docs/design.md's layout\n", p->world,
                   jobspec_shard_mode_name(p->sharding), bad);
  CHECK_EQ_INT(0, bad);
  CHECK(st_load_shard(f, p, p->world, shard) == FSDP_ERR_RANGE);
  free(shard);
}

static void test_shards(void) {
  const int L = 2, C = 8, V = 50, T = 16;
  float *units[3];
  int64_t numel[3];
  for (int u = 0; u < 1 + L; u++) units[u] = spec_buffer(u, C, V, T, &numel[u]);
  /* The file, tensor by tensor from the oracle. */
  const char *path = path_in("model.safetensors");
  st_writer *w = NULL;
  CHECK_OK(st_writer_new(path, &w));
  for (int u = 0; u < 1 + L; u++) {
    spec_tensor st[12];
    int nt = spec_unit(u, C, V, T, st);
    int64_t off = 0;
    for (int i = 0; i < nt; i++) {
      int64_t shape[2] = {st[i].d0, st[i].d1};
      CHECK_OK(st_writer_add(w, st[i].name, "F32", shape, st[i].d1 ? 2 : 1, units[u] + off));
      off += spec_numel(&st[i]);
    }
  }
  CHECK_OK(st_writer_finish(&w));
  st_file *f = NULL;
  CHECK_OK(st_open(path, &f));
  if (!f) return;
  CHECK_EQ_INT(4 + 12 * L, st_count(f));

  /* Every rank's shard of the planner's plan, for several world sizes and both layouts: gathered
   * back, the shards are the oracle's padded unit buffers. */
  int worlds[] = {1, 2, 3, 4, 8};
  for (int wi = 0; wi < 5; wi++)
    for (int mode = 0; mode < 2; mode++) {
      plan_t *p = planned(L, C, V, T, worlds[wi], mode ? SHARD_NONE : SHARD_FULL);
      if (p) check_gather(f, p, units, numel);
      plan_destroy(&p);
    }
  st_destroy(&f);

  /* st_save_units of the planner's world-1 plan writes the same tensors under the same names. */
  plan_t *p1 = planned(L, C, V, T, 1, SHARD_FULL);
  if (!p1) return;
  CHECK_OK(st_save_units(path_in("saved.safetensors"), p1, units));
  CHECK_OK(st_open(path_in("saved.safetensors"), &f));
  if (f) {
    int64_t cattn[2] = {C, 3 * C};
    float *full = malloc(sizeof(float) * 3 * C * C);
    CHECK_OK(st_read(f, "transformer.h.1.attn.c_attn.weight", cattn, 2, full));
    int bad = 0;
    for (int64_t k = 0; k < 3 * C * C; k++) bad += bits(full[k]) != bits(spec_val("h.1.attn.c_attn.weight", k));
    CHECK_EQ_INT(0, bad);
    free(full);
    st_destroy(&f);
  }

  /* A file with the "transformer." prefix (as GPT2LMHeadModel.save_pretrained writes it), plus a
   * tied lm_head and an attention-mask buffer the plan does not know: loads the same. */
  w = NULL;
  CHECK_OK(st_writer_new(path_in("prefixed.safetensors"), &w));
  float mask[4] = {1, 0, 1, 1};
  int64_t mshape[4] = {1, 1, 2, 2};
  for (int u = 0; u < p1->nunits; u++)
    for (int t = 0; t < p1->units[u].ntensors; t++) {
      const plan_tensor *pt = &p1->units[u].t[t];
      char n[80];
      snprintf(n, sizeof n, "transformer.%s", pt->name);
      CHECK_OK(st_writer_add(w, n, "F32", pt->shape, pt->ndim, units[u] + pt->offset));
    }
  CHECK_OK(st_writer_add(w, "h.0.attn.bias", "F32", mshape, 4, mask));
  CHECK_OK(st_writer_add(w, "lm_head.weight", "F32", p1->units[0].t[0].shape, 2, units[0]));
  CHECK_OK(st_writer_finish(&w));
  CHECK_OK(st_open(path_in("prefixed.safetensors"), &f));
  if (f) {
    plan_t *p = planned(L, C, V, T, 3, SHARD_FULL);
    float *shard = malloc(sizeof(float) * (size_t)p->shard_total);
    CHECK_OK(st_load_shard(f, p, 2, shard));
    const plan_unit *U = &p->units[1];
    CHECK(memcmp(shard + U->shard_base, units[1] + 2 * U->shard_numel,
                 sizeof(float) * (size_t)(U->numel - 2 * U->shard_numel)) == 0);
    free(shard);
    plan_destroy(&p);
    st_destroy(&f);
  }

  /* A model of another shape, or a model missing a block, is a clear error naming the tensor. */
  plan_t *wide = planned(L, 2 * C, V, T, 2, SHARD_FULL), *deep = planned(L + 1, C, V, T, 2, SHARD_FULL);
  float *shard = malloc(sizeof(float) * (size_t)(wide->shard_total + deep->shard_total));
  CHECK_OK(st_open(path, &f));
  if (f) {
    CHECK(st_load_shard(f, wide, 0, shard) == FSDP_ERR_INVALID);
    CHECK(has("tensor 'wte.weight'"));
    CHECK(has("expected shape [50, 16], found [50, 8]"));
    CHECK(st_load_shard(f, deep, 1, shard) == FSDP_ERR_NOTFOUND);
    CHECK(has("'h.2.ln_1.weight'"));
    st_destroy(&f);
  }
  free(shard);
  plan_destroy(&wide);
  plan_destroy(&deep);

  /* save_units → load (world 1) → save_units gives identical bytes. */
  path = path_in("saved.safetensors");
  CHECK_OK(st_open(path, &f));
  if (f) {
    float *sh = malloc(sizeof(float) * (size_t)p1->shard_total);
    CHECK_OK(st_load_shard(f, p1, 0, sh));
    float *views[3];
    for (int u = 0; u < p1->nunits; u++) views[u] = sh + p1->units[u].shard_base;
    CHECK_OK(st_save_units(path_in("model2.safetensors"), p1, views));
    long l1 = 0, l2 = 0;
    uint8_t *b1 = slurp(path, &l1), *b2 = slurp(path_in("model2.safetensors"), &l2);
    CHECK(b1 && b2 && l1 == l2 && memcmp(b1, b2, (size_t)l1) == 0);
    free(b1);
    free(b2);
    free(sh);
    st_destroy(&f);
  }
  for (int u = 0; u < p1->nunits; u++) free(units[u]);
  plan_destroy(&p1);
}

/* A small Llama with grouped-query attention. */
static plan_t *planned_llama(int world, shard_mode sharding) {
  return planned_model((model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 8,
                                      .ffn_dim = 12, .vocab_size = 20, .seq_len = 6, .norm_eps = 1e-5,
                                      .rope_theta = 10000},
                       world, sharding);
}

/* Write P's tensors from the world-1 shard W under their plan names, with the "model." prefix
 * dropped (BARE), without tensor SKIP (-1: none), with tensor TRANSPOSE's 2-D shape swapped. */
static void write_llama(const char *path, const plan_t *p, const float *w, int bare, int skip, int transpose) {
  st_writer *wr = NULL;
  CHECK_OK(st_writer_new(path, &wr));
  int k = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++, k++) {
      const plan_tensor *pt = &p->units[u].t[t];
      if (k == skip) continue;
      const char *name = bare && !strncmp(pt->name, "model.", 6) ? pt->name + 6 : pt->name;
      int64_t shape[2] = {pt->shape[k == transpose ? 1 : 0], pt->shape[k == transpose ? 0 : 1]};
      CHECK_OK(st_writer_add(wr, name, "F32", shape, pt->ndim, w + p->units[u].shard_base + pt->offset));
    }
  CHECK_OK(st_writer_finish(&wr));
}

/* Llama files: LlamaForCausalLM's names with or without "model.", loaded into any layout; save and
 * load round trip; a GPT-2 file, a missing tensor and a wrong shape refused with what is wrong. */
static void test_llama(void) {
  plan_t *p1 = planned_llama(1, SHARD_NONE), *p3 = planned_llama(3, SHARD_FULL);
  if (!p1 || !p3) return;
  float *w = calloc((size_t)p1->shard_total, sizeof(float)), *sh = malloc(sizeof(float) * (size_t)p3->shard_total);
  for (int u = 0; u < p1->nunits; u++)
    for (int64_t i = 0; i < p1->units[u].numel; i++) w[p1->units[u].shard_base + i] = val((uint64_t)(1000 * u + i));
  float *units[3];
  int64_t numel[3];
  for (int u = 0; u < p1->nunits; u++) units[u] = w + p1->units[u].shard_base, numel[u] = p1->units[u].numel;
  for (int bare = 0; bare <= 1; bare++) {
    const char *path = path_in(bare ? "llama-bare.safetensors" : "llama.safetensors");
    write_llama(path, p1, w, bare, -1, -1);
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (!f) continue;
    CHECK((st_find(f, "model.layers.1.mlp.up_proj.weight") >= 0) && st_find(f, "layers.1.mlp.up_proj.weight") >= 0);
    check_gather(f, p3, units, numel);
    check_gather(f, p1, units, numel);
    st_destroy(&f);
  }
  /* st_save_units writes exactly the plan's names: "model." included, lm_head without */
  CHECK_OK(st_save_units(path_in("llama-saved.safetensors"), p1, units));
  st_file *f = NULL;
  CHECK_OK(st_open(path_in("llama-saved.safetensors"), &f));
  if (f) {
    CHECK_EQ_INT(3 + 2 * 9, st_count(f));
    for (int i = 0; i < st_count(f); i++) {
      int u = -1;
      const plan_tensor *t = plan_find_tensor(p1, st_name(f, i), &u);
      CHECK(t && !strcmp(t->name, st_name(f, i)) && st_numel(f, i) == t->numel);
    }
    st_destroy(&f);
  }
  /* the wrong files */
  CHECK_OK(st_open(path_in("model.safetensors"), &f));   /* test_shards' GPT-2 file */
  if (f) {
    CHECK(st_load_shard(f, p3, 0, sh) == FSDP_ERR_INVALID);
    CHECK(has("holds a GPT-2 model (wte.weight, h.0.…); the job is arch = llama"));
    st_destroy(&f);
  }
  CHECK_OK(st_open(path_in("llama.safetensors"), &f));
  if (f) {
    plan_t *g = planned(2, 8, 20, 6, 1, SHARD_NONE);
    float *gs = malloc(sizeof(float) * (size_t)g->shard_total);
    CHECK(st_load_shard(f, g, 0, gs) == FSDP_ERR_INVALID);
    CHECK(has("holds a Llama model"));
    CHECK(has("the job is arch = gpt2"));
    free(gs);
    plan_destroy(&g);
    st_destroy(&f);
  }
  /* tied or not: a file without lm_head.weight is a tied model (transformers saves none), read by a
   * tied job, its embed_tokens in the root's first slot; refused by an untied one, and the other way */
  write_llama(path_in("llama-nohead.safetensors"), p1, w, 0, LROOT_HEAD, -1);
  CHECK_OK(st_open(path_in("llama-nohead.safetensors"), &f));
  if (f) {
    CHECK(st_load_shard(f, p3, 1, sh) == FSDP_ERR_INVALID);
    CHECK(has("holds no lm_head.weight"));
    CHECK(has("the job has tie_word_embeddings = false: set it true"));
    model_config tied = p1->model;
    tied.tie_embeddings = 1;
    plan_t *pt = planned_model(tied, 1, SHARD_NONE);
    float *ts = pt ? malloc(sizeof(float) * (size_t)pt->shard_total) : NULL;
    if (ts) {
      CHECK_OK(st_load_shard(f, pt, 0, ts));
      CHECK_EQ_INT(2, pt->units[0].ntensors);
      CHECK(!memcmp(ts, w, sizeof(float) * (size_t)pt->units[0].numel));   /* embed_tokens, then norm */
      st_destroy(&f);
      CHECK_OK(st_open(path_in("llama.safetensors"), &f));
      CHECK(f && st_load_shard(f, pt, 0, ts) == FSDP_ERR_INVALID);
      CHECK(has("holds an untied model (lm_head.weight, different from model.embed_tokens.weight); the job has "
                "tie_word_embeddings = true"));
    }
    free(ts);
    plan_destroy(&pt);
    st_destroy(&f);
  }
  write_llama(path_in("llama-kt.safetensors"), p1, w, 0, -1, LROOT_NT + LBLK_K);   /* layer 0's k_proj [8, 4] */
  CHECK_OK(st_open(path_in("llama-kt.safetensors"), &f));
  if (f) {
    CHECK(st_load_shard(f, p3, 2, sh) == FSDP_ERR_INVALID);
    CHECK(has("tensor 'model.layers.0.self_attn.k_proj.weight'"));
    CHECK(has("expected shape [4, 8], found [8, 4] (transposed: Llama stores nn.Linear weights as [out, in])"));
    st_destroy(&f);
  }
  free(w);
  free(sh);
  plan_destroy(&p1);
  plan_destroy(&p3);
}

/* A tensor the job's model does not have (Qwen2's q_proj.bias in a Llama file) is refused, naming
 * it, one file or an index alike; the buffers transformers saves (GPT-2's attn.bias) are not. */
static void test_unused(void) {
  plan_t *p = planned_llama(1, SHARD_NONE);
  if (!p) return;
  float *w = calloc((size_t)p->shard_total, sizeof(float)), *sh = calloc((size_t)p->shard_total, sizeof(float));
  float bias[8] = {0};
  int64_t bshape[1] = {8};
  for (int extra = 0; extra < 3; extra++) {
    st_writer *wr = NULL;
    CHECK_OK(st_writer_new(path_in("llama-extra.safetensors"), &wr));
    for (int u = 0; u < p->nunits; u++)
      for (int t = 0; t < p->units[u].ntensors; t++) {
        const plan_tensor *pt = &p->units[u].t[t];
        CHECK_OK(st_writer_add(wr, pt->name, "F32", pt->shape, pt->ndim, w + p->units[u].shard_base + pt->offset));
      }
    if (extra == 1) CHECK_OK(st_writer_add(wr, "model.layers.1.self_attn.q_proj.bias", "F32", bshape, 1, bias));
    if (extra == 2) CHECK_OK(st_writer_add(wr, "model.layers.0.self_attn.rotary_emb.inv_freq", "F32", bshape, 1, bias));
    CHECK_OK(st_writer_finish(&wr));
    st_file *f = NULL;
    CHECK_OK(st_open(path_in("llama-extra.safetensors"), &f));
    if (!f) continue;
    fsdp_status rc = st_load_shard(f, p, 0, sh);
    if (extra == 1) {
      CHECK(rc == FSDP_ERR_INVALID);
      CHECK(has("holds 'model.layers.1.self_attn.q_proj.bias', a tensor that arch = llama with this [model] does not have"));
    } else {
      CHECK_OK(rc);
    }
    st_destroy(&f);
  }
  free(w);
  free(sh);
  plan_destroy(&p);
}

/* Phi-3: the fused qkv_proj and gate_up_proj of a file land in Llama's slots exactly (q, k, v and
 * gate, up adjacent), on any world size; st_save_units writes them fused, with the file's names. */
static void test_phi3_fused(void) {
  model_config m = {.arch = ARCH_PHI3, .pad_token_id = -1, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 8, .ffn_dim = 12,
                    .vocab_size = 20, .seq_len = 6, .norm_eps = 1e-5, .rope_theta = 10000};
  plan_t *p1 = planned_model(m, 1, SHARD_NONE), *p3 = planned_model(m, 3, SHARD_FULL);
  if (!p1 || !p3) return;
  const plan_unit *u1 = &p1->units[1];
  const llama_slots sl = llama_slots_of(&p1->model);
  const plan_tensor *tq = &u1->t[sl.at[LBLK_Q]], *tk = &u1->t[sl.at[LBLK_K]], *tv = &u1->t[sl.at[LBLK_V]],
                    *tu = &u1->t[sl.at[LBLK_UP]];
  CHECK_EQ_INT(sl.n, u1->ntensors);
  CHECK(!strcmp(tq->name, "model.layers.0.self_attn.qkv_proj.weight") && !strcmp(tv->name, tq->name) &&
        tk->hf_row0 == 8 && tv->hf_row0 == 12 && tv->hf_rows == 16 && tu->hf_row0 == 12 && tu->hf_rows == 24);
  float *w = calloc((size_t)p1->shard_total, sizeof(float)), *sh = malloc(sizeof(float) * (size_t)p3->shard_total);
  for (int u = 0; u < p1->nunits; u++)
    for (int64_t i = 0; i < p1->units[u].numel; i++) w[p1->units[u].shard_base + i] = val((uint64_t)(1000 * u + i));
  float *units[3];
  int64_t numel[3];
  for (int u = 0; u < p1->nunits; u++) units[u] = w + p1->units[u].shard_base, numel[u] = p1->units[u].numel;
  CHECK_OK(st_save_units(path_in("phi3.safetensors"), p1, units));
  st_file *f = NULL;
  CHECK_OK(st_open(path_in("phi3.safetensors"), &f));
  if (f) {
    CHECK_EQ_INT(3 + 2 * 6, st_count(f));   /* root 3; per layer 2 norms, qkv, o, gate_up, down */
    int i = st_find(f, "model.layers.1.self_attn.qkv_proj.weight"), g = st_find(f, "model.layers.1.mlp.gate_up_proj.weight");
    CHECK(i >= 0 && st_shape(f, i)[0] == 16 && st_shape(f, i)[1] == 8 && g >= 0 && st_shape(f, g)[0] == 24);
    CHECK(st_find(f, "model.layers.0.self_attn.q_proj.weight") < 0);
    float row[8];   /* k's first row is the fused tensor's row 8: layer 0's q (64 elements) after its norm (8) */
    CHECK_OK(st_read_range(f, "model.layers.0.self_attn.qkv_proj.weight", 8 * 8, 8, row));
    CHECK(!memcmp(row, units[1] + tk->offset, sizeof row));
    check_gather(f, p3, units, numel);
    check_gather(f, p1, units, numel);
    st_destroy(&f);
  }
  /* a Llama file under arch = phi3, and the Phi-3 file under arch = llama: told by their names */
  CHECK_OK(st_open(path_in("llama.safetensors"), &f));
  if (f) {
    CHECK(st_load_shard(f, p3, 0, sh) == FSDP_ERR_INVALID);
    CHECK(has("holds a Llama model") && has("the job is arch = phi3"));
    st_destroy(&f);
  }
  m.arch = ARCH_LLAMA;
  plan_t *pl = planned_model(m, 1, SHARD_NONE);
  CHECK_OK(st_open(path_in("phi3.safetensors"), &f));
  if (f && pl) {
    float *ls = malloc(sizeof(float) * (size_t)pl->shard_total);
    CHECK(st_load_shard(f, pl, 0, ls) == FSDP_ERR_INVALID);
    CHECK(has("holds a Phi-3 model") && has("the job is arch = llama"));
    free(ls);
  }
  st_destroy(&f);
  plan_destroy(&pl);
  free(w);
  free(sh);
  plan_destroy(&p1);
  plan_destroy(&p3);
}

int main(void) {
  tmpdir_make("test_safetensors");
  test_bf16_rounding();
  test_roundtrip();
  test_bad_files();
  test_shards();
  test_llama();
  test_unused();
  test_phi3_fused();
  tmpdir_remove();
  return check_done();
}
