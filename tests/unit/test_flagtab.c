/* test_flagtab — command-line flags from a table: defaults, every type and its range, the boolean
 * forms, -h, positional arguments, and each kind of bad flag (one line, naming what is allowed). */
#include "flagtab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

typedef struct cfg {
  const char *name;
  long count;
  int small;
  unsigned long long big;
  double rate;
  int on, help;
} cfg;

#define C(f) offsetof(cfg, f)
static const flagdef rows[] = {
  {"name", FLAG_STR, C(name), "anon", 0, 0, "a name"},
  {"count", FLAG_LONG, C(count), "3", 0, 10, "a count"},
  {"small", FLAG_INT, C(small), NULL, -5, 5, "a small number"},
  {"big", FLAG_U64, C(big), NULL, 0, 1e15, "a big number"},
  {"rate", FLAG_DBL, C(rate), "0.5", 0, 1, "a rate"},
  {"on", FLAG_BOOL, C(on), "0", 0, 1, "a switch"},
  {"help", FLAG_BOOL, C(help), NULL, 0, 1, "print this help"},
};
#define NROWS (sizeof rows / sizeof rows[0])

/* Parse the NULL-terminated ARGS (after a program name) into *C; the return of flagtab_parse, the
 * first positional argument's index in *FIRST and what it wrote to stderr in ERR. */
static int parse(cfg *c, int *first, char *err, size_t n, const char **args) {
  char *argv[16] = {"prog"};
  int argc = 1;
  for (; args[argc - 1]; argc++) argv[argc] = (char *)args[argc - 1];
  memset(c, 0, sizeof *c);
  fflush(stderr);
  FILE *tmp = tmpfile();
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  int rc = flagtab_parse("prog", rows, NROWS, c, argc, argv, first);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t k = fread(err, 1, n - 1, tmp);
  err[k] = '\0';
  fclose(tmp);
  return rc;
}

static void expect_bad(const char **args, const char *needle) {
  cfg c;
  int first;
  char err[512];
  CHECK(parse(&c, &first, err, sizeof err, args) != 0);
  if (!strstr(err, needle)) {
    fprintf(stderr, "expected '%s' in: %s\n", needle, err);
    CHECK(0);
  }
  CHECK(strchr(err, '\n') == err + strlen(err) - 1);   /* one line */
}

int main(void) {
  cfg c;
  int first;
  char err[512];
  CHECK_EQ_INT(0, parse(&c, &first, err, sizeof err, (const char *[]){NULL}));
  CHECK(strcmp(c.name, "anon") == 0);   /* the rows' defaults */
  CHECK_EQ_INT(3, (int)c.count);
  CHECK(c.rate == 0.5 && !c.on && !c.help && c.small == 0 && c.big == 0);
  CHECK_EQ_INT(1, first);

  CHECK_EQ_INT(0, parse(&c, &first, err, sizeof err, (const char *[]){"--name", "x", "--count=10", "--small", "-5",
      "--big", "1000000000000000", "--rate", "1", "--on", "job.ini", NULL}));
  CHECK(strcmp(c.name, "x") == 0);
  CHECK_EQ_INT(10, (int)c.count);
  CHECK_EQ_INT(-5, c.small);
  CHECK(c.big == 1000000000000000ULL && c.rate == 1.0 && c.on == 1);
  CHECK_EQ_INT(11, first);   /* job.ini */
  CHECK_EQ_INT(0, parse(&c, &first, err, sizeof err, (const char *[]){"--on=false", "-h", NULL}));
  CHECK(c.on == 0 && c.help == 1);
  CHECK_EQ_INT(0, parse(&c, &first, err, sizeof err, (const char *[]){"--on=yes", NULL}));
  CHECK_EQ_INT(1, c.on);

  expect_bad((const char *[]){"--count", "11", NULL}, "prog: --count 11: expected an integer in 0..10");
  expect_bad((const char *[]){"--count", "3x", NULL}, "expected an integer in 0..10");
  expect_bad((const char *[]){"--small", "-6", NULL}, "--small -6: expected an integer in -5..5");
  expect_bad((const char *[]){"--rate", "nan", NULL}, "--rate nan: expected a number in 0..1");
  expect_bad((const char *[]){"--rate", "", NULL}, "expected a number in 0..1");
  expect_bad((const char *[]){"--on=maybe", NULL}, "--on=maybe: expected true or false");
  expect_bad((const char *[]){"--bogus", NULL}, "unknown flag '--bogus' (see prog --help");
  expect_bad((const char *[]){"--count", NULL}, "--count needs a value");
  return check_done();
}
