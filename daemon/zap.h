/* zap — CURVE client admission for the coordinator's tcp:// endpoints (ZAP, RFC 27).
 *
 * zap_setup loads (or creates) the server keypair in STATE/keys/ and binds a REP socket on
 * inproc://zeromq.zap.01 in the daemon's ZeroMQ context, served by the uv loop, before any CURVE
 * socket binds. For each handshake it admits the daemon's own public key (the embedded agent and
 * its workers) and the keys listed in STATE/keys/authorized (read on every request), and refuses
 * the rest, logging each refused key once a minute. Loop thread only.
 */
#ifndef FSDP_DAEMON_ZAP_H
#define FSDP_DAEMON_ZAP_H

#include "coord_core.h"

fsdp_status zap_setup(coord_t *c);

#endif
