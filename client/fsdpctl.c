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
  {"sample", ctl_sample, "continue a prompt with a trained model (checkpoint or .safetensors; no daemon)"},
  {"gen-data", ctl_gen_data, "write token files: byte-level from text, or a synthetic Markov chain"},
  {"run", ctl_run, "run one job with a private daemon, follow it, exit with its status"},
  {"submit", ctl_submit, "submit a job to fsdpd and print its id (--follow: show progress)"},
  {"status", ctl_status, "a job's state, loss, throughput, memory, time split and traffic"},
  {"jobs", ctl_jobs, "list jobs"},
  {"logs", ctl_logs, "print a worker's log (--rank R, --follow)"},
  {"cancel", ctl_cancel, "cancel a job"},
  {"stop", ctl_stop, "stop a job, saving a checkpoint first when it makes them"},
  {"nodes", ctl_nodes, "list nodes, their devices and which job holds each"},
  {"shutdown", ctl_shutdown, "stop the daemon (as SIGTERM does) and wait until it has"},
  {"top", ctl_top, "a live view of running jobs (step, loss, tokens/s, ETA) and their ranks' memory and time"},
  {"trace", ctl_trace, "write a running job's spans as Chrome trace-event JSON for https://ui.perfetto.dev"},
  {"plot", ctl_plot, "draw a job's loss, learning rate and tokens/s against step as a PNG (gnuplot)"},
  {"keygen", ctl_keygen, "write a CURVE client keypair file (0600) and print its public key"},
  {NULL, NULL, NULL},
};

static void usage(FILE *f) {
  fprintf(f, "usage: fsdpctl COMMAND [ARGS]\n\ncommands:\n");
  for (int i = 0; commands[i].name; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\nglobal flags (before COMMAND): --ctl ENDPOINT, and for a tcp:// endpoint --server-key FILE and\n"
             "--client-key FILE (or $FSDP_CTL, $FSDP_SERVER_KEY, $FSDP_CLIENT_KEY)\n");
  fprintf(f, "\n'fsdpctl COMMAND --help' describes one command.\n");
}

int main(int argc, char **argv) {
  /* Global flags before the command set the environment every command reads: --ctl is FSDP_CTL,
   * --server-key FSDP_SERVER_KEY, --client-key FSDP_CLIENT_KEY (CURVE keys for a tcp:// endpoint). */
  static const struct {
    const char *flag, *env, *what;
  } globals[] = {
      {"--ctl", "FSDP_CTL", "an endpoint (ipc://PATH or tcp://HOST:PORT)"},
      {"--server-key", "FSDP_SERVER_KEY", "the daemon's public key file (its STATE/keys/server.pub)"},
      {"--client-key", "FSDP_CLIENT_KEY", "a keypair file (made by `fsdpctl keygen FILE`)"},
  };
  for (int again = 1; again && argc >= 2;) {
    again = 0;
    for (size_t g = 0; g < sizeof globals / sizeof globals[0]; g++) {
      size_t fl = strlen(globals[g].flag);
      if (strncmp(argv[1], globals[g].flag, fl) || (argv[1][fl] != '=' && argv[1][fl] != '\0')) continue;
      const char *v = argv[1][fl] == '=' ? argv[1] + fl + 1 : argc >= 3 ? argv[2] : NULL;
      if (!v || !*v) {
        fprintf(stderr, "fsdpctl: %s needs %s\n", globals[g].flag, globals[g].what);
        return 2;
      }
      setenv(globals[g].env, v, 1);
      int used = argv[1][fl] == '=' ? 1 : 2;
      argc -= used;
      argv += used;
      again = 1;
      break;
    }
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
