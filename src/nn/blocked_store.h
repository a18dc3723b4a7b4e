/*
 * nn/blocked_store.h — private: the blocked bf16 weight copies that the
 * models over one storage share (st_model_storage.blocked), for the
 * linear layers that take them and the model memo that places them.
 */
#ifndef SUBTRAIN_NN_BLOCKED_STORE_H
#define SUBTRAIN_NN_BLOCKED_STORE_H

#include <dnnl.h>

#include <subtrain/model.h>

/* The copy of the weights at parameter `offset` in layout md, which a
 * product reads with the matrix's rows along its dim row_dim: the one an
 * earlier model took (the same md, else an error), or a new one of the
 * store's arena (zeros, which the blocks' padding keeps). */
st_status st_blocked_store_take(st_blocked_store *s, size_t offset, int row_dim,
                                const dnnl_memory_desc_t *md, void **p);

/* Where the copy that p lies in (a copy of s) sits in t, taken there if t
 * has none yet; NULL if p lies in none of s's copies or t cannot take it. */
void *st_blocked_store_moved(const st_blocked_store *s, st_blocked_store *t, const void *p);

#endif /* SUBTRAIN_NN_BLOCKED_STORE_H */
