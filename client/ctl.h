/* ctl — the fsdpctl subcommands. Each ctl_*.c file implements one family and exports its
 * entry points here; fsdpctl.c dispatches by name. Every command returns the process exit
 * status (0 on success) and prints a one-line reason on stderr otherwise. */
#ifndef FSDP_CTL_H
#define FSDP_CTL_H

typedef int (*ctl_cmd_fn)(int argc, char **argv);   /* argv[0] is the subcommand name */

#endif
