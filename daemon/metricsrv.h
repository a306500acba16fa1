/* metricsrv — the HTTP endpoint of `fsdpd --metrics HOST:PORT`: GET /metrics answers the latest
 * Prometheus text published by the coordinator (promx.h), through libmicrohttpd.
 *
 * Threads: libmicrohttpd answers on a polling thread of its own, which never touches coordinator
 * structures. The loop thread renders the text (promx_render) and hands it over with
 * metricsrv_publish, which swaps it into a mutex-protected buffer; the HTTP thread copies the
 * latest buffer under that mutex into its response. A scrape thus sees the state as of the last
 * publish (every completed step and every coordinator tick, 250 ms), never a half-updated one.
 *
 * Lifetime: metricsrv_parse and metricsrv_bind run before the daemon detaches (so that a bad value
 * or a port in use is said on the terminal); metricsrv_start after it (threads do not survive a
 * fork). The server owns its socket, thread and buffer; metricsrv_destroy stops the thread first.
 */
#ifndef FSDP_DAEMON_METRICSRV_H
#define FSDP_DAEMON_METRICSRV_H

#include <stddef.h>

#include "err.h"

typedef struct metricsrv metricsrv_t;

/* Parse "HOST:PORT", ":PORT" or "PORT" (HOST defaults to 127.0.0.1; "[ADDR]:PORT" for IPv6) into
 * HOST (size HOSTLEN) and *PORT (1..65535). FSDP_ERR_INVALID with a one-line reason otherwise. */
fsdp_status metricsrv_parse(const char *spec, char *host, size_t hostlen, int *port);

/* Bind and listen on HOST:PORT (a numeric address or a name that resolves). */
fsdp_status metricsrv_bind(const char *host, int port, metricsrv_t **out);
/* Start answering on the bound socket (its own thread). */
fsdp_status metricsrv_start(metricsrv_t *m);
/* Replace the served text with a copy of TEXT (LEN bytes). Any thread; the loop thread in fsdpd. */
fsdp_status metricsrv_publish(metricsrv_t *m, const char *text, size_t len);
void metricsrv_destroy(metricsrv_t **m);   /* NULL-safe; clears *M */

#endif
