/* data/text.h — private: the gather of a text set's windows (text.c),
 * called by the dataset's gathers. */
#ifndef SUBTRAIN_DATA_TEXT_H
#define SUBTRAIN_DATA_TEXT_H

#include <subtrain/data.h>

/* Windows idx[0..n) of `epoch` (idx NULL: windows first .. first + n):
 * their inputs into x_out (n, T) as byte ids, their next bytes into
 * y_out (n x T). */
void st_text_gather(const st_dataset *d, uint64_t epoch, const uint32_t *idx, uint32_t first,
                    size_t n, float *x_out, int32_t *y_out);

#endif /* SUBTRAIN_DATA_TEXT_H */
