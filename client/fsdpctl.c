/* fsdpctl — the user's CLI: dispatches to the subcommands of client/ctl_*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

static const struct {
  const char *name;
  ctl_cmd_fn fn;
  const char *help;
} commands[] = {
  {"plan", ctl_plan, "show a job's shard plan and predicted per-rank memory (no daemon)"},
  {"export", ctl_export, "write a checkpoint's model as one Hugging Face .safetensors file (no daemon)"},
  {"gen-data", ctl_gen_data, "write a synthetic Markov-chain token file, print its entropy rate"},
  {"run", ctl_run, "run one job with a private daemon, follow it, exit with its status"},
  {"submit", ctl_submit, "submit a job to fsdpd and print its id (--follow: show progress)"},
  {"status", ctl_status, "a job's state, loss, throughput, memory, time split and traffic"},
  {"jobs", ctl_jobs, "list jobs"},
  {"logs", ctl_logs, "print a worker's log (--rank R, --follow)"},
  {"cancel", ctl_cancel, "cancel a job"},
  {"nodes", ctl_nodes, "list nodes, their devices and which job holds each"},
  {NULL, NULL, NULL},
};

static void usage(FILE *f) {
  fprintf(f, "usage: fsdpctl COMMAND [ARGS]\n\ncommands:\n");
  for (int i = 0; commands[i].name; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\n'fsdpctl COMMAND --help' describes one command.\n");
}

int main(int argc, char **argv) {
  /* A global --ctl before the command is the same as FSDP_CTL (every command reads that). */
  while (argc >= 2 && !strncmp(argv[1], "--ctl", 5)) {
    const char *v = argv[1][5] == '=' ? argv[1] + 6 : argv[1][5] == '\0' && argc >= 3 ? argv[2] : NULL;
    if (!v || !*v) {
      fprintf(stderr, "fsdpctl: --ctl needs an endpoint (ipc://PATH or tcp://HOST:PORT)\n");
      return 2;
    }
    setenv("FSDP_CTL", v, 1);
    int used = argv[1][5] == '=' ? 1 : 2;
    argc -= used;
    argv += used;
  }
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (int i = 0; commands[i].name; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "fsdpctl: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
