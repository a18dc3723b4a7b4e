/* data/gather.h — private: how each kind of sample reaches a batch.
 * dataset.c's gathers decide once which of these a set's samples take:
 * a text set's windows (text.c), or augmented image rows (augment.c);
 * plain rows it copies itself. */
#ifndef SUBTRAIN_DATA_GATHER_H
#define SUBTRAIN_DATA_GATHER_H

#include <subtrain/data.h>

/* Windows idx[0..n) of `epoch` (idx NULL: windows first .. first + n):
 * their inputs into x_out (n, T) as byte ids, their next bytes into
 * y_out (n x T). */
void st_text_gather(const st_dataset *d, uint64_t epoch, const uint32_t *idx, uint32_t first,
                    size_t n, float *x_out, int32_t *y_out);

/* Whether the augmentation changes anything (a crop or a flip). */
int st_augment_active(const st_augment *a);

/* Rows idx[0..n) of an image set, each augmented as `epoch` draws it. */
void st_augment_gather(const st_dataset *d, uint64_t epoch, const uint32_t *idx, size_t n,
                       float *x_out, int32_t *y_out);

#endif /* SUBTRAIN_DATA_GATHER_H */
