/* flagtab — a program's command-line flags as one table, in the shape of the job file's key table
 * (common/jobspec_keys.h): each row is a flag's name, type, field, default, range and help. fsdpd's
 * flags (daemon/fsdpd.c) and fsdp-worker's (worker/main.c) are such tables; flagtab_parse reads
 * argv against one (getopt_long: --flag VALUE, --flag=VALUE, a boolean --flag alone or
 * --flag=false, -h for a row named "help"), applying every row's default first and checking every
 * value, and flagtab_usage prints it. A bad flag is one line on stderr, "PROG: ...", naming what is
 * allowed. The table is the caller's static data; the fields are in the caller's struct; the
 * strings stored for FLAG_STR point into argv or the table. Single-threaded (getopt).
 */
#ifndef FSDP_FLAGTAB_H
#define FSDP_FLAGTAB_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
  FLAG_STR,    /* const char * */
  FLAG_LONG,   /* long, in lo..hi */
  FLAG_INT,    /* int, in lo..hi */
  FLAG_U64,    /* unsigned long long, in lo..hi */
  FLAG_DBL,    /* double, in lo..hi */
  FLAG_BOOL,   /* int 0/1: --flag, --flag=true|false|1|0|yes|no */
} flag_type;

typedef struct flagdef {
  const char *name;   /* without the leading -- */
  flag_type type;
  size_t off;         /* the field's offset in the caller's struct */
  const char *def;    /* the default as it would be written on the command line; NULL: none (the help
                         says what then) */
  double lo, hi;      /* numbers: inclusive */
  const char *help;
} flagdef;

/* ARGV against the N rows of T into CFG. Returns 0, or -1 with one line printed. *FIRST_ARG: the
 * index of the first argument that is not a flag (argc when none). */
int flagtab_parse(const char *prog, const flagdef *t, size_t n, void *cfg, int argc, char **argv, int *first_arg);
/* One line per row: --name ARG, the help, the default. */
void flagtab_usage(FILE *f, const flagdef *t, size_t n);

#endif
