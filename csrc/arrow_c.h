/* The Arrow C data interface and C stream interface: the ABI through which
 * pystream hands record batches to Arrow engines without a copy
 * (the PyCapsule interface, pystream/_core_stream.pxi).
 *
 * The layouts are fixed by the Arrow specification ("The Arrow C data
 * interface", "The Arrow C stream interface"); the include guards are the
 * ones the specification names, so that a translation unit which also
 * includes Arrow's own abi.h sees each struct once. */
#ifndef PS_ARROW_C_H
#define PS_ARROW_C_H

#include <stdint.h>

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

/* A type: a format string, children for nested types. */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    /* NULL once released; the consumer calls it exactly once */
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

/* The data of one array: its buffers and its children's. */
struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#endif /* ARROW_C_DATA_INTERFACE */

#ifndef ARROW_C_STREAM_INTERFACE
#define ARROW_C_STREAM_INTERFACE

/* A pull stream of arrays of one schema. The callbacks return 0 or an errno
 * value; get_next gives a released array (release == NULL) at the end. */
struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *out);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *out);
    /* valid until the next call on the stream; NULL if there is none */
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

#endif /* ARROW_C_STREAM_INTERFACE */

#endif /* PS_ARROW_C_H */
