/* ctl_keys — `fsdpctl keygen FILE`: a CURVE client keypair for tcp:// endpoints (see ctl.h). */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "ctl_fmt.h"
#include "curve.h"

static void keygen_usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl keygen FILE\n\n"
          "Write a new CURVE keypair to FILE (mode 0600; an existing FILE is never overwritten) and print\n"
          "its public key. Add it, then \" user=NAME\" (the user it acts as) or \" admin\" (a node's key), as a\n"
          "line of the daemon's STATE/keys/authorized to admit this client, then use FILE as --client-key\n"
          "(fsdpd --join, fsdpctl) or $FSDP_CLIENT_KEY.\n");
}

int ctl_keygen(int argc, char **argv) {
  if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    keygen_usage(stdout);
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-' || !argv[1][0]) {
    keygen_usage(stderr);
    return 2;
  }
  char pub[CURVE_KEY_LEN + 1], sec[CURVE_KEY_LEN + 1];
  fsdp_status rc = curve_keypair_new(pub, sec);
  if (rc == FSDP_OK) rc = curve_keypair_write(argv[1], pub, sec);
  memset(sec, 0, sizeof sec);
  if (rc != FSDP_OK) {
    fprintf(stderr, "fsdpctl: keygen: %s\n", fsdp_last_error());
    return 1;
  }
  printf("%s\n", pub);
  return 0;
}
