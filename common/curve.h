/* curve — ZeroMQ CURVE keys for tcp:// endpoints (docs/design.md §7; docs/operations.md, "Keys").
 *
 * ipc:// endpoints are protected by the state directory's permissions and use no encryption;
 * every tcp:// socket uses CURVE: the daemon's ROUTERs are CURVE servers, and every client
 * (agent, worker, fsdpctl) needs the server's public key and its own keypair. Keys are Z85 text
 * (40 characters, which may include '#' though never first). A keypair file holds two lines, the public key then the
 * secret key (blank lines and other lines starting with # are ignored), and must not be readable by
 * group or others (mode 0600). A public key file holds one key line. The daemon's STATE/keys/ holds
 * server.key (the server's keypair, keypair-file format, 0600), server.pub (its public key) and
 * authorized, read line by line (any length), whose every line is one of (docs/operations.md,
 * "Trust model"):
 *   - blank, or a comment: its first non-blank character is '#' (which no key starts with);
 *   - a grant: KEY, blanks, then exactly "user=NAME" (the local user the key acts as) or "admin"
 *     (the daemon's own rights), then optionally blanks and a note (any text).
 * Any other line is malformed: it admits no key, and a key that appears on one is refused (never
 * a guessed right: no grant is the default). A key listed twice must have the same grant.
 *
 * Plain functions with no state; any thread.
 */
#ifndef FSDP_CURVE_H
#define FSDP_CURVE_H

#include "err.h"

#define CURVE_KEY_LEN 40          /* Z85 characters of a 32-byte key */
#define CURVE_USER_MAX 32         /* characters of a user name in the authorized file */
#define CURVE_ENV_SERVER_KEY "FSDP_SERVER_KEY"   /* path of the server's public key file */
#define CURVE_ENV_CLIENT_KEY "FSDP_CLIENT_KEY"   /* path of this client's keypair file */

/* 1 when ENDPOINT is tcp:// (needs CURVE), 0 otherwise. */
int curve_is_tcp(const char *endpoint);
/* FSDP_ERR_UNSUPPORTED when this libzmq was built without CURVE. */
fsdp_status curve_available(void);
/* A fresh keypair (Z85, NUL-terminated). */
fsdp_status curve_keypair_new(char pub[CURVE_KEY_LEN + 1], char sec[CURVE_KEY_LEN + 1]);
/* Write a keypair file (mode 0600). An existing file is never overwritten (FSDP_ERR_STATE). */
fsdp_status curve_keypair_write(const char *path, const char *pub, const char *sec);
/* Read a keypair file: mode must be 0600 or stricter, two valid keys, the public key matching the
 * secret one. */
fsdp_status curve_keypair_load(const char *path, char pub[CURVE_KEY_LEN + 1], char sec[CURVE_KEY_LEN + 1]);
/* Read a public key file (the first key line). */
fsdp_status curve_pubkey_load(const char *path, char pub[CURVE_KEY_LEN + 1]);
/* The daemon's keys in KEYS_DIR (created mode 0700): loads server.key, or creates server.key and
 * server.pub on first use. *CREATED (may be NULL) says which. */
fsdp_status curve_server_keys(const char *keys_dir, char pub[CURVE_KEY_LEN + 1], char sec[CURVE_KEY_LEN + 1],
                              int *created);
/* What a key listed in authorized may act as. */
typedef enum { CURVE_NOT_LISTED = 0, CURVE_AS_USER, CURVE_AS_ADMIN } curve_grant;
/* Whether PUB (Z85) is granted by the authorized file PATH (a missing file grants nothing): *GRANT,
 * and for CURVE_AS_USER the user in USER (else ""). A malformed line holding PUB, or PUB listed again
 * with another grant, is FSDP_ERR_FORMAT naming PATH:LINE, what is wrong and what is allowed, with
 * *GRANT = CURVE_NOT_LISTED. */
fsdp_status curve_authorized(const char *path, const char *pub, curve_grant *grant, char user[CURVE_USER_MAX + 1]);
/* Each malformed line of PATH: REPORT(ARG, "PATH:LINE what is wrong; ...") when REPORT is not NULL;
 * *BAD (may be NULL) is how many. The daemon runs it when it loads the file (zap_setup). */
typedef void (*curve_report)(void *arg, const char *msg);
fsdp_status curve_authorized_check(const char *path, int *bad, curve_report report, void *arg);
/* 1 when NAME is a portable user name: 1..CURVE_USER_MAX of [A-Za-z0-9._-], not starting with '-'. */
int curve_user_name_ok(const char *name);
/* Make SOCK a CURVE server with secret key SEC (before bind). */
fsdp_status curve_server_apply(void *sock, const char *sec);
/* Before connecting SOCK to ENDPOINT: nothing for ipc:// or inproc://; for tcp:// load the
 * server's public key (SERVER_KEY_PATH) and this client's keypair (CLIENT_KEY_PATH) and make SOCK a
 * CURVE client. A tcp:// endpoint without both paths is an error naming WHAT (e.g. "--join
 * tcp://..."), never a plaintext fallback. */
fsdp_status curve_client_apply(void *sock, const char *endpoint, const char *server_key_path,
                               const char *client_key_path, const char *what);

#endif
