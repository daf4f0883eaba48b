/* A decoded batch handed to Arrow whole through the C data interface: one
 * struct array (offset, chunk_timestamp, body as binary_view or binary)
 * that an engine imports in one call, where building it column by column
 * costs a call into Arrow per buffer. For batches with no optional column
 * and no error column (ps_batch_exportable). */
#ifndef PS_EXPORT_H
#define PS_EXPORT_H

#include "arrow_c.h"
#include "batch.h"

/* Called once, when Arrow releases the array, with the owner of the input
 * bytes that the views point into (they must stay alive until then). */
typedef void (*ps_drop_fn)(void *owner);

static inline int ps_batch_exportable(const ps_batch *b)
{
    return !b->opt.columns && b->opt.error_policy != PS_POLICY_RAW &&
           (!b->opt.body_binary || b->body.nulls == 0);
}

/* Fill `out` with the batch's rows, moving every buffer it owns into the
 * array (they are detached from b, which the caller then resets); the
 * input regions stay the owner's, dropped through `drop` at release.
 * PS_OK, or PS_E_NOMEM with b and out untouched. */
int ps_batch_export(ps_batch *b, struct ArrowArray *out, ps_drop_fn drop,
                    void *owner);

#endif
