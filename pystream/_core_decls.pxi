# Included by _core.pyx (one extension module): the C core's declarations (csrc/*.h).

cdef extern from "status.h":
    enum:
        PS_OK
        PS_NEED_MORE
        PS_E_TRUNCATED_FRAME
        PS_E_FRAME_TOO_LARGE
        PS_E_CHUNK
        PS_E_CRC
        PS_E_LIMIT
        PS_E_AMQP
        PS_E_PROTOCOL
        PS_E_NOMEM
        PS_E_OVERFLOW
        PS_E_CODEC_MISSING
    ctypedef struct ps_error:
        int code
        uint64_t position
        const char *what

cdef extern from "frame.h":
    ctypedef struct ps_reader:
        uint8_t *buf
        size_t cap
        size_t rpos
        size_t wpos
        uint64_t consumed
        uint32_t max_frame
        uint32_t max_deliver
    int ps_reader_next(ps_reader *r, const uint8_t **frame, uint32_t *len,
                       ps_error *err) nogil
    size_t ps_reader_missing(const ps_reader *r) nogil
    void ps_reader_compact(ps_reader *r) nogil
    void ps_reader_rebase(ps_reader *r, uint8_t *nbuf, size_t ncap) nogil

cdef extern from "crc.h":
    uint32_t ps_crc32(uint32_t crc, const uint8_t *p, size_t n) nogil
    uint32_t ps_crc32_fold256(uint32_t crc, const uint8_t *p, size_t n) nogil
    uint32_t ps_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) nogil
    const char *ps_crc32_implementation()

cdef extern from "buf.h":
    ctypedef struct ps_buf:
        uint8_t *p
        size_t len
        size_t cap
    void ps_advise_huge(uint8_t *p, size_t cap) nogil

cdef extern from "batch.h":
    enum:
        PS_COL_PROPERTIES
        PS_COL_APPLICATION_PROPERTIES
        PS_COL_MESSAGE_ANNOTATIONS
        PS_COL_HEADER
        PS_COL_FOOTER
        PS_POLICY_RAISE
        PS_POLICY_SKIP
        PS_POLICY_RAW
        PS_PROP_FIELDS
        PS_HEADER_FIELDS
    ctypedef struct ps_options:
        int crc
        int amqp
        int body_binary
        int error_policy
        unsigned columns
        uint64_t start_offset
        uint64_t max_subbatch
        uint64_t max_chunk
    ctypedef struct ps_col:
        ps_buf validity
        ps_buf values
        ps_buf data
        size_t length
        size_t nulls
    ctypedef struct ps_region:
        const uint8_t *base
        size_t len
        ps_buf own
    ctypedef struct ps_batch:
        ps_options opt
        size_t rows
        ps_buf offset
        ps_buf timestamp
        ps_buf views
        ps_col body
        ps_col error
        ps_col properties
        ps_col prop[13]
        ps_col header
        ps_col hdr[5]
        ps_col app
        ps_col app_keys
        ps_col app_values
        ps_col ann
        ps_col ann_keys
        ps_col ann_values
        ps_col foot
        ps_col foot_keys
        ps_col foot_values
        ps_region *regions
        size_t nregions
    int ps_batch_init(ps_batch *b, const ps_options *opt)
    void ps_batch_free(ps_batch *b)
    int ps_batch_reset(ps_batch *b)

# The Arrow C data and stream interface structs (the standard ABI).
cdef extern from "arrow_c.h":
    struct ArrowSchema:
        pass
    struct ArrowArray:
        void (*release)(ArrowArray *) noexcept nogil
    struct ArrowArrayStream:
        int (*get_schema)(ArrowArrayStream *, ArrowSchema *) noexcept nogil
        int (*get_next)(ArrowArrayStream *, ArrowArray *) noexcept nogil
        const char *(*get_last_error)(ArrowArrayStream *) noexcept nogil
        void (*release)(ArrowArrayStream *) noexcept nogil
        void *private_data

cdef extern from "export.h":
    ctypedef void (*ps_drop_fn)(void *owner) noexcept nogil
    bint ps_batch_exportable(const ps_batch *b)
    int ps_batch_export(ps_batch *b, ArrowArray *out, ps_drop_fn drop, void *owner)

cdef extern from "chunk.h":
    enum:
        PS_KEY_DELIVER
    ctypedef struct ps_chunk:
        uint8_t version
        uint8_t subscription_id
        uint64_t committed_chunk_id
        uint8_t type
        uint16_t num_entries
        uint32_t num_records
        int64_t timestamp
        uint64_t epoch
        uint64_t first_offset
        uint32_t crc
        uint32_t data_len
        const uint8_t *data
    uint16_t ps_frame_key(const uint8_t *frame) nogil
    int ps_deliver_parse(const uint8_t *frame, size_t len, uint64_t pos,
                         ps_chunk *c, ps_error *err) nogil
    int ps_chunk_decode(const ps_chunk *c, ps_batch *b, ps_error *err) nogil
    int ps_chunk_check_crc(const ps_chunk *c, uint32_t crc, ps_error *err) nogil
    int ps_chunk_decode_records(const ps_chunk *c, ps_batch *b, ps_error *err) nogil
    ctypedef struct ps_size_walk:
        uint64_t size
    void ps_size_walk_step(ps_size_walk *w, const ps_chunk *c, size_t have) nogil
    int ps_decode_buffer(const uint8_t *p, size_t n, ps_batch *b,
                         ps_error *err) nogil
    ctypedef struct ps_crc_ahead:
        pass
    void ps_crc_ahead_advance(ps_crc_ahead *a, const uint8_t *frame, size_t have,
                              uint64_t pos) nogil
    uint32_t ps_crc_ahead_take(ps_crc_ahead *a, const ps_chunk *c, uint32_t *n,
                               ps_size_walk *walk) nogil


cdef extern from "codec.h":
    ctypedef struct ps_codecs:
        pass
    ps_codecs *ps_codecs_new()
    void ps_codecs_free(ps_codecs *c)
    int ps_codec_available(int codec)

cdef extern from "encode.h":
    enum:
        PS_STRS_ABSENT
        PS_STRS_OFFSETS32
        PS_STRS_OFFSETS64
        PS_STRS_VIEWS
    ctypedef struct ps_strs:
        int layout
        int binary
        const uint8_t *validity
        size_t offset
        const void *offsets
        const uint8_t *data
        const uint8_t *const *buffers
    ctypedef struct ps_ints:
        const int64_t *values
        const uint8_t *validity
        size_t offset
        int64_t mul
        int64_t div
    ctypedef struct ps_props:
        int present
        const uint8_t *validity
        size_t offset
        ps_strs text[13]
        ps_ints num[13]
    ctypedef struct ps_map:
        const int32_t *offsets
        const uint8_t *validity
        size_t offset
        ps_strs keys
        ps_strs values
    ctypedef struct ps_publish:
        uint8_t publisher_id
        uint64_t first_id
        size_t count
        int amqp
        int codec
        uint32_t sub_batch
        uint64_t max_frame
        ps_strs body
        ps_strs filter
        ps_props properties
        ps_map application_properties
        ps_map message_annotations
    int ps_encode_publish(const ps_publish *p, ps_codecs *codecs, ps_buf *frames,
                          ps_buf *counts, ps_error *err) nogil
    void ps_murmur3_32(const ps_strs *keys, size_t n, uint32_t seed,
                       uint32_t *out) nogil


# A socket read of the rest of a frame (FrameReader.recv_rest), and the
# sends of send_all.
cdef extern from "<sys/socket.h>" nogil:
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    enum: MSG_WAITALL
    enum: MSG_NOSIGNAL

cdef extern from "Python.h":
    int PyErr_CheckSignals() except -1

# POSIX threads: the CRC worker (_core_crc.pxi), the Arrow stream hand-off
# (_core_stream.pxi).
cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *m, const void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *m)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_cond_init(pthread_cond_t *c, const void *attr)
    int pthread_cond_destroy(pthread_cond_t *c)
    int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
    int pthread_cond_broadcast(pthread_cond_t *c)
    int pthread_cond_signal(pthread_cond_t *c)
