/* test_jobresolve — a job resolved once: the placement's part (world, hybrid's shard_group, comm,
 * the plan), the canonical text that carries the result to the workers (every key explicit, read
 * back without defaults), and its refusals. */
#include "jobresolve.h"
#include "jobspec_keys.h"
#include "planmsg.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* The source tree, from this file's path (CMake compiles it by absolute path). */
static void source_path(char *out, size_t n, const char *rel) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", __FILE__);
  char *s = strstr(dir, "tests/unit/");
  if (s) *s = '\0';
  snprintf(out, n, dir[0] == '/' ? "%s%s" : "./%s%s", dir, rel);
}

static void load_example(const char *name, jobspec_t *s) {
  char path[PATH_MAX], rel[64];
  snprintf(rel, sizeof rel, "examples/%s", name);
  source_path(path, sizeof path, rel);
  CHECK_OK(jobspec_load(path, s));
}

/* Resolved, written, read back and written again: the same text, the same plan, and every key of
 * the table on a line of its own. */
static void roundtrip(const char *name, const jobresolve_place *pl) {
  jobspec_t s, back;
  plan_t *p = NULL, *q = NULL;
  char *t1 = NULL, *t2 = NULL;
  load_example(name, &s);
  CHECK_OK(jobresolve_place_job(&s, pl, &p));
  CHECK_OK(jobspec_canonical_write(&s, &t1));
  CHECK_OK(jobspec_canonical_read(t1, name, &back));
  CHECK_OK(jobspec_canonical_write(&back, &t2));
  CHECK(t1 && t2 && strcmp(t1, t2) == 0);
  CHECK_EQ_INT(s.world_size, back.world_size);
  CHECK_EQ_INT(s.shard_group, back.shard_group);
  CHECK_EQ_INT((int)s.comm, (int)back.comm);
  CHECK(s.lr == back.lr && s.min_lr == back.min_lr && s.eps == back.eps);
  CHECK(strcmp(s.init, back.init) == 0 && strcmp(s.train, back.train) == 0);
  CHECK_EQ_INT(s.synthetic, back.synthetic);
  CHECK(s.markov_seed == back.markov_seed);
  CHECK(strcmp(back.path, name) == 0);
  Fsdp__Plan *m = NULL;
  CHECK_OK(planmsg_new(p, &m));
  CHECK_OK(plan_build(&back, back.world_size, &q));
  CHECK_OK(planmsg_check(m, q));
  for (int i = 0; i < jobspec_nkeys; i++) {
    char line[96];
    snprintf(line, sizeof line, "\n%s = ", jobspec_keys[i].key);
    if (!strstr(t1, line)) {
      fprintf(stderr, "%s: [%s] %s is not explicit in the resolved job\n", name, jobspec_keys[i].sec, jobspec_keys[i].key);
      CHECK(0);
    }
  }
  planmsg_destroy(&m);
  plan_destroy(&p);
  plan_destroy(&q);
  free(t1);
  free(t2);
}

static void test_roundtrip(void) {
  roundtrip("tiny.ini", &(jobresolve_place){0});
  roundtrip("llama-tiny.ini", &(jobresolve_place){.world = 4});
  roundtrip("llama-1b.ini", &(jobresolve_place){0});
  roundtrip("gpt2-xl-hybrid.ini", &(jobresolve_place){.ranks_per_node = 8});
}

/* What the placement decides: the world, hybrid's G, comm = auto; and what it leaves alone. */
static void test_place(void) {
  jobspec_t s;
  plan_t *p = NULL;
  load_example("tiny.ini", &s);
  CHECK_EQ_INT(COMM_AUTO, s.comm);
  CHECK_OK(jobresolve_place_job(&s, &(jobresolve_place){.world = 3}, &p));
  CHECK_EQ_INT(3, s.world_size);
  CHECK_EQ_INT(3, p->world);
  CHECK_EQ_INT(COMM_GLOO, s.comm);   /* cpu: gloo */
  CHECK(strcmp(jobresolve_comm_name(&s), "gloo") == 0);
  plan_destroy(&p);

  load_example("gpt2-xl-hybrid.ini", &s);
  CHECK_EQ_INT(0, s.shard_group);
  s.comm = COMM_AUTO;   /* the file names nccl; auto is what the placement decides */
  jobspec_t standalone = s;
  CHECK_OK(jobresolve_place_job(&s, &(jobresolve_place){.ranks_per_node = 4}, &p));
  CHECK_EQ_INT(4, s.shard_group);
  CHECK_EQ_INT(4, p->shard_world);
  CHECK_EQ_INT(COMM_NCCL, s.comm);   /* cuda: one GPU per rank, NCCL */
  plan_destroy(&p);
  /* a shard_group the file sets is the file's, whatever the placement */
  s.shard_group = 2;
  CHECK_OK(jobresolve_place_job(&s, &(jobresolve_place){.ranks_per_node = 8}, &p));
  CHECK_EQ_INT(2, p->shard_world);
  plan_destroy(&p);
  /* standalone: no placement knows G (refused, saying so), and comm = auto stays each rank's choice */
  CHECK(jobresolve_place_job(&standalone, &(jobresolve_place){.comm_per_rank = 1}, &p) != FSDP_OK);
  CHECK(p == NULL);
  CHECK(strstr(fsdp_last_error(), "shard_group") != NULL);
  standalone.shard_group = 8;
  CHECK_OK(jobresolve_place_job(&standalone, &(jobresolve_place){.comm_per_rank = 1}, &p));
  CHECK_EQ_INT(COMM_AUTO, standalone.comm);
  CHECK(jobresolve_comm_name(&standalone) == NULL);
  plan_destroy(&p);
}

/* TEXT with the line that starts with FROM (a leading newline: a whole line's start) replaced by TO
 * (TO "" drops it). Caller frees. */
static char *edit_line(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  CHECK(at != NULL);
  if (!at) return strdup(text);
  if (*from == '\n') at++;
  const char *eol = strchr(at, '\n');
  size_t head = (size_t)(at - text), tail = strlen(eol + 1);
  char *out = malloc(head + strlen(to) + tail + 2);
  memcpy(out, text, head);
  size_t n = head;
  if (*to) n += (size_t)sprintf(out + n, "%s\n", to);
  memcpy(out + n, eol + 1, tail + 1);
  return out;
}

static void expect_refused(const char *text, const char *needle) {
  jobspec_t s;
  CHECK(jobspec_canonical_read(text, "job.ini", &s) != FSDP_OK);
  if (!strstr(fsdp_last_error(), needle)) {
    fprintf(stderr, "expected '%s' in: %s\n", needle, fsdp_last_error());
    CHECK(0);
  }
  CHECK(strchr(fsdp_last_error(), '\n') == NULL);
}

/* The reader takes the canonical form only: a key left to a default, one set twice, an unknown one,
 * a value not of its type, another version, or raw job-file text are refused with one line. */
static void test_read_refusals(void) {
  jobspec_t s;
  plan_t *p = NULL;
  char *t = NULL;
  load_example("tiny.ini", &s);
  CHECK_OK(jobresolve_place_job(&s, &(jobresolve_place){0}, &p));
  CHECK_OK(jobspec_canonical_write(&s, &t));
  struct { const char *from, *to, *needle; } cases[] = {
    {"\nlr = ", "", "[optim] lr is missing"},
    {"\nsteps = ", "steps = 5\nsteps = 6", "[job] steps is set twice"},
    {"\nsteps = ", "stepz = 5", "unknown key [job] stepz"},
    {"\nbatch_size = ", "batch_size = two", "batch_size = two is not an integer"},
    {"\nlr = ", "lr = fast", "lr = fast is not a number"},
    {"\nsharding = ", "sharding = zero3", "sharding = zero3 is not one of its names"},
    {"# fsdpd resolved job, version 1", "# fsdpd resolved job, version 2 (every key explicit)", "version 2"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *bad = edit_line(t, cases[i].from, cases[i].to);
    expect_refused(bad, cases[i].needle);
    free(bad);
  }
  expect_refused("[job]\nsteps = 5\n", "without its resolved form");
  /* a value that cannot stay on its line is refused by the writer (the daemon, at submit) */
  jobspec_t nl = s;
  char *none = NULL;
  snprintf(nl.ckpt_dir, sizeof nl.ckpt_dir, "/tmp/a\nb");
  CHECK(jobspec_canonical_write(&nl, &none) != FSDP_OK && none == NULL);
  CHECK(strstr(fsdp_last_error(), "[checkpoint] dir holds a line break") != NULL);
  expect_refused("", "without its resolved form");
  plan_destroy(&p);
  free(t);
}

int main(void) {
  test_roundtrip();
  test_place();
  test_read_refusals();
  return check_done();
}
