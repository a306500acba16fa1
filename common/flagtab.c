/* flagtab — command-line flags from a table; see flagtab.h. */
#include "flagtab.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define FLAGTAB_MAX 64

static int set_number(const char *prog, const flagdef *o, void *p, const char *val) {
  char *end;
  errno = 0;
  if (o->type == FLAG_DBL) {
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v >= o->lo && v <= o->hi)) {
      fprintf(stderr, "%s: --%s %s: expected a number in %g..%g\n", prog, o->name, val, o->lo, o->hi);
      return -1;
    }
    *(double *)p = v;
    return 0;
  }
  long long v = strtoll(val, &end, 10);
  if (errno || end == val || *end || (double)v < o->lo || (double)v > o->hi) {
    fprintf(stderr, "%s: --%s %s: expected an integer in %.0f..%.0f\n", prog, o->name, val, o->lo, o->hi);
    return -1;
  }
  if (o->type == FLAG_LONG) *(long *)p = (long)v;
  else if (o->type == FLAG_INT) *(int *)p = (int)v;
  else *(unsigned long long *)p = (unsigned long long)v;
  return 0;
}

static int set_flag(const char *prog, void *cfg, const flagdef *o, const char *val) {
  void *p = (char *)cfg + o->off;
  switch (o->type) {
  case FLAG_STR: *(const char **)p = val; return 0;
  case FLAG_BOOL:
    if (!strcmp(val, "1") || !strcmp(val, "true") || !strcmp(val, "yes")) *(int *)p = 1;
    else if (!strcmp(val, "0") || !strcmp(val, "false") || !strcmp(val, "no")) *(int *)p = 0;
    else {
      fprintf(stderr, "%s: --%s=%s: expected true or false\n", prog, o->name, val);
      return -1;
    }
    return 0;
  default:
    return set_number(prog, o, p, val);
  }
}

int flagtab_parse(const char *prog, const flagdef *t, size_t n, void *cfg, int argc, char **argv, int *first_arg) {
  if (n > FLAGTAB_MAX) {
    fprintf(stderr, "%s: %zu flags, more than the %d a table may hold\n", prog, n, FLAGTAB_MAX);
    return -1;
  }
  int help = -1;
  for (size_t i = 0; i < n; i++) {
    if (t[i].def && set_flag(prog, cfg, &t[i], t[i].def) != 0) return -1;
    if (!strcmp(t[i].name, "help")) help = (int)i;
  }
  struct option lopts[FLAGTAB_MAX + 1];
  for (size_t i = 0; i < n; i++)
    lopts[i] = (struct option){t[i].name, t[i].type == FLAG_BOOL ? optional_argument : required_argument, NULL, (int)i};
  lopts[n] = (struct option){0};
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, help >= 0 ? ":h" : ":", lopts, NULL)) != -1) {
    if (c == 'h' && help >= 0) c = help;
    if (c == '?') {
      fprintf(stderr, "%s: unknown flag '%s' (see %s --help for the flags)\n", prog, argv[optind - 1], prog);
      return -1;
    }
    if (c == ':') {
      fprintf(stderr, "%s: %s needs a value\n", prog, argv[optind - 1]);
      return -1;
    }
    if (set_flag(prog, cfg, &t[c], optarg ? optarg : "1") != 0) return -1;
  }
  *first_arg = optind;
  return 0;
}

void flagtab_usage(FILE *f, const flagdef *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const flagdef *o = &t[i];
    const char *arg = o->type == FLAG_BOOL ? "" : o->type == FLAG_STR ? " VALUE" : " N";
    char left[64];
    snprintf(left, sizeof left, "--%s%s", o->name, arg);
    fprintf(f, "  %-22s %s", left, o->help);
    if (o->def && *o->def && o->type != FLAG_BOOL) fprintf(f, " (default %s)", o->def);
    fputc('\n', f);
  }
}
