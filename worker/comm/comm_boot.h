/* comm_boot — bootstrapping a communicator that needs one secret from rank 0 (NCCL's unique id):
 * rank 0 makes it and publishes it under a key of a comm_kv store, every other rank reads it,
 * waiting up to a timeout. Compiled in every build (no CUDA): the id generator is injected, so the
 * exchange is tested on the CPU with a fake store and fake ids (tests/unit/test_comm.c).
 *
 * Stores: the coordinator's KV (wlink_kv: keys under the job's kv_prefix, one per attempt) or, in
 * --standalone, a directory (comm_dir_kv: one file per key, written atomically by rename; the
 * directory must be fresh per job, as gloo's FileStore). Both block in get until the key exists.
 * Called from the worker's main thread during startup; the store outlives the call.
 */
#ifndef FSDP_COMM_BOOT_H
#define FSDP_COMM_BOOT_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

#define COMM_BOOT_ID_BYTES 128   /* NCCL_UNIQUE_ID_BYTES */

/* Makes a fresh id (rank 0 only); comm_nccl_get_unique_id in the CUDA build. */
typedef fsdp_status (*comm_boot_idgen)(void *ctx, uint8_t id[COMM_BOOT_ID_BYTES]);

/* Rank 0: id = gen(gen_ctx), then kv->set(KEY, id). Other ranks: kv->get(KEY) within timeout_s,
 * which must hold exactly COMM_BOOT_ID_BYTES bytes. The id lands in ID on every rank. */
fsdp_status comm_boot_exchange_id(const comm_kv *kv, const char *key, int rank, double timeout_s,
                                  comm_boot_idgen gen, void *gen_ctx, uint8_t id[COMM_BOOT_ID_BYTES]);

/* A comm_kv over directory DIR (borrowed; must outlive the store's use): set writes DIR/KEY
 * through a temporary file and a rename, get polls for DIR/KEY every 10 ms until timeout_s
 * (FSDP_ERR_TIMEOUT). A '/' in KEY becomes '_'. */
comm_kv comm_dir_kv(const char *dir);

#endif
