/* gpt2 — GPT-2 (Hugging Face GPT2LMHeadModel): its units' tensor slots. The descriptor is
 * gpt2_arch (gpt2_arch.c: names, config.json, plan terms); forward and backward model_gpt2.h.
 *
 * Unit 0, the root: wte [V,C], wpe [n_positions,C], ln_f.weight [C], ln_f.bias [C]; unit 1+i block i
 * in Hugging Face order. Names without the "transformer." prefix (lookups take both); Conv1D
 * layout [in, out]. Global tensor index (the initializer's RNG key): root slot j → j, block i slot
 * j → ROOT_NT + BLK_NT·i + j.
 */
#ifndef FSDP_GPT2_H
#define FSDP_GPT2_H

enum { ROOT_WTE = 0, ROOT_WPE, ROOT_LNF_W, ROOT_LNF_B, ROOT_NT };
enum {
  BLK_LN1_W = 0, BLK_LN1_B, BLK_ATTN_W, BLK_ATTN_B, BLK_ATTNPROJ_W, BLK_ATTNPROJ_B,
  BLK_LN2_W, BLK_LN2_B, BLK_FC_W, BLK_FC_B, BLK_FCPROJ_W, BLK_FCPROJ_B, BLK_NT
};

#endif
