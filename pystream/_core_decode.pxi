# Included by _core.pyx (one extension module): Deliver frames to Arrow record batches (decode, StreamDecoder).

# --- Arrow export -----------------------------------------------------------
#
# The C batch owns malloc'd column buffers; each is handed to Arrow wrapped in
# an _Owned object (Arrow buffer parent) that frees it when Arrow lets go.
# Views into the input point at it through a buffer whose parent keeps the
# input (bytes-like or receive block) alive.

cdef class _Owned:
    cdef void *p

    def __dealloc__(self):
        free(self.p)


cdef object EMPTY = pa.py_buffer(b"")


cdef void drop_owner(void *owner) noexcept nogil:
    # Arrow releases an array in whichever thread drops it last.
    with gil:
        Py_DECREF(<object>owner)


cdef object take(ps_buf *b):
    """An Arrow buffer owning b's memory (b is left empty)."""
    if b.p == NULL or b.len == 0:
        free(b.p)
        b.p = NULL
        b.len = b.cap = 0
        return EMPTY
    cdef _Owned o = _Owned.__new__(_Owned)
    o.p = b.p
    n = b.len
    b.p = NULL
    b.len = b.cap = 0
    return pa.foreign_buffer(<uintptr_t>o.p, n, base=o)


cdef object take_validity(ps_col *c):
    if c.nulls == 0:
        free(c.validity.p)
        c.validity.p = NULL
        c.validity.len = c.validity.cap = 0
        return None
    return take(&c.validity)


cdef object export_col(ps_col *c, object typ, list children=None):
    """One Arrow array from a C column of the matching kind."""
    cdef size_t n = c.length, nulls = c.nulls
    validity = take_validity(c)
    if children is not None:           # struct or map
        bufs = [validity] if typ.num_buffers == 1 else [validity, take(&c.values)]
        return pa.Array.from_buffers(typ, n, bufs, nulls, children=children)
    if typ.num_buffers == 3:           # string / binary
        offsets = take(&c.values)
        return pa.Array.from_buffers(typ, n, [validity, offsets, take(&c.data)], nulls)
    return pa.Array.from_buffers(typ, n, [validity, take(&c.values)], nulls)


TS = pa.timestamp("us", tz="UTC")

PROPERTIES = pa.struct([
    ("message_id", pa.string()), ("user_id", pa.binary()), ("to", pa.string()),
    ("subject", pa.string()), ("reply_to", pa.string()),
    ("correlation_id", pa.string()), ("content_type", pa.string()),
    ("content_encoding", pa.string()), ("absolute_expiry_time", TS),
    ("creation_time", TS), ("group_id", pa.string()),
    ("group_sequence", pa.int64()), ("reply_to_group_id", pa.string()),
])
STRING_MAP = pa.map_(pa.string(), pa.string())
HEADER = pa.struct([
    ("durable", pa.bool_()), ("priority", pa.int32()), ("ttl", pa.int64()),
    ("first_acquirer", pa.bool_()), ("delivery_count", pa.int64()),
])
OPTIONAL_COLUMNS = {
    "properties": (PS_COL_PROPERTIES, PROPERTIES),
    "application_properties": (PS_COL_APPLICATION_PROPERTIES, STRING_MAP),
    "message_annotations": (PS_COL_MESSAGE_ANNOTATIONS, STRING_MAP),
    "header": (PS_COL_HEADER, HEADER),
    "footer": (PS_COL_FOOTER, STRING_MAP),
}
POLICIES = {"raise": PS_POLICY_RAISE, "skip": PS_POLICY_SKIP, "raw": PS_POLICY_RAW}


def schema(*, columns=None, body="view", error_policy="raise"):
    """The schema of the batches decoded with these options."""
    return _Options(True, True, 0, columns, body, error_policy,
                    64 << 20, 1 << 30).schema


cdef class _Options:
    """Validated decode options and the matching schema."""
    cdef ps_options o
    cdef readonly object schema

    def __init__(self, crc, amqp, start_offset, columns, body, error_policy,
                 max_subbatch_size, max_chunk_size):
        if body not in ("view", "binary"):
            raise ValueError('body must be "view" or "binary"')
        if error_policy not in POLICIES:
            raise ValueError('error_policy must be "raise", "skip" or "raw"')
        if start_offset < 0:
            raise ValueError("start_offset must be >= 0")
        if not 0 < max_subbatch_size <= max_chunk_size < 2 ** 31:
            raise ValueError("need 0 < max_subbatch_size <= max_chunk_size < 2 GiB")
        names = list(columns or ())
        for name in names:
            if name not in OPTIONAL_COLUMNS:
                raise ValueError(f"unknown column {name!r}; optional columns are "
                                 f"{', '.join(OPTIONAL_COLUMNS)}")
        if names and not amqp:
            raise ValueError("optional columns need amqp=True")
        self.o.crc = bool(crc)
        self.o.amqp = bool(amqp)
        self.o.body_binary = body == "binary"
        self.o.error_policy = POLICIES[error_policy]
        self.o.start_offset = start_offset
        self.o.max_subbatch = max_subbatch_size
        self.o.max_chunk = max_chunk_size
        self.o.columns = 0
        fields = [pa.field("offset", pa.int64(), nullable=False),
                  pa.field("chunk_timestamp", TS, nullable=False),
                  pa.field("body", pa.binary() if self.o.body_binary else pa.binary_view(),
                           nullable=False)]
        for name, (bit, typ) in OPTIONAL_COLUMNS.items():   # fixed order
            if name in names:
                self.o.columns |= bit
                fields.append(pa.field(name, typ))
        if self.o.error_policy == PS_POLICY_RAW:
            fields.append(pa.field("error", pa.string()))
        self.schema = pa.schema(fields)


cdef class _Builder:
    """A C batch with its options; exports what it decoded as a RecordBatch."""
    cdef ps_batch b
    cdef _Options options

    def __cinit__(self, _Options options):
        self.options = options
        if ps_batch_init(&self.b, &options.o) != PS_OK:
            raise MemoryError()

    def __dealloc__(self):
        ps_batch_free(&self.b)

    cdef object export(self, object owner):
        """The RecordBatch of everything decoded since the last export;
        `owner` keeps the input bytes alive."""
        cdef ps_batch *b = &self.b
        cdef ArrowArray whole
        if ps_batch_exportable(b):
            # One import, where a call into Arrow per buffer costs several
            # times the decode of a small chunk.
            Py_INCREF(owner)
            if ps_batch_export(b, &whole, drop_owner, <void *>owner) != PS_OK:
                Py_DECREF(owner)
                raise MemoryError()
            if ps_batch_reset(b) != PS_OK:
                whole.release(&whole)
                raise MemoryError()
            # Arrow releases the array even if the import fails.
            return pa.RecordBatch._import_from_c(<uintptr_t>&whole, self.options.schema)
        cdef size_t rows = b.rows, i
        cdef ps_region *r
        cdef unsigned cols = b.opt.columns
        arrays = [
            pa.Array.from_buffers(pa.int64(), rows, [None, take(&b.offset)]),
            pa.Array.from_buffers(TS, rows, [None, take(&b.timestamp)]),
        ]
        if b.opt.body_binary:
            arrays.append(export_col(&b.body, pa.binary()))
        else:
            regions = []
            for i in range(b.nregions):
                r = &b.regions[i]
                if r.own.p != NULL:
                    regions.append(take(&r.own))
                else:
                    regions.append(pa.foreign_buffer(<uintptr_t>r.base, r.len, base=owner))
            arrays.append(pa.Array.from_buffers(
                pa.binary_view(), rows, [None, take(&b.views)] + regions))
        if cols & PS_COL_PROPERTIES:
            children = [export_col(&b.prop[i], PROPERTIES.field(i).type)
                        for i in range(PS_PROP_FIELDS)]
            arrays.append(export_col(&b.properties, PROPERTIES, children))
        if cols & PS_COL_APPLICATION_PROPERTIES:
            arrays.append(self.export_map(&b.app, &b.app_keys, &b.app_values))
        if cols & PS_COL_MESSAGE_ANNOTATIONS:
            arrays.append(self.export_map(&b.ann, &b.ann_keys, &b.ann_values))
        if cols & PS_COL_HEADER:
            children = [export_col(&b.hdr[i], HEADER.field(i).type)
                        for i in range(PS_HEADER_FIELDS)]
            arrays.append(export_col(&b.header, HEADER, children))
        if cols & PS_COL_FOOTER:
            arrays.append(self.export_map(&b.foot, &b.foot_keys, &b.foot_values))
        if b.opt.error_policy == PS_POLICY_RAW:
            arrays.append(export_col(&b.error, pa.string()))
        if ps_batch_reset(b) != PS_OK:
            raise MemoryError()
        return pa.RecordBatch.from_arrays(arrays, schema=self.options.schema)

    cdef object export_map(self, ps_col *m, ps_col *k, ps_col *v):
        keys = export_col(k, pa.string())
        values = export_col(v, pa.string())
        entries = pa.StructArray.from_arrays(
            [keys, values], fields=[STRING_MAP.key_field, STRING_MAP.item_field])
        return export_col(m, STRING_MAP, [entries])

    cdef int fail(self, ps_error *err) except -1:
        """Drop what a failed decode appended, then raise its error."""
        ps_batch_reset(&self.b)
        return raise_error(err)


def decode(buffer, *, crc=True, amqp=True, start_offset=0, columns=None,
           body="view", error_policy="raise", max_subbatch_size=64 << 20,
           max_chunk_size=1 << 30):
    """Decode the size-prefixed Deliver frames in ``buffer`` (any bytes-like)
    into one :class:`pyarrow.RecordBatch`; see the module documentation for
    the schema and the options."""
    cdef _Options opts = _Options(crc, amqp, start_offset, columns, body,
                                  error_policy, max_subbatch_size, max_chunk_size)
    cdef _Builder builder = _Builder(opts)
    cdef ps_error err
    cdef int rc
    view = memoryview(buffer)      # pins the bytes (a bytearray cannot resize)
    if not view.c_contiguous:
        raise ValueError("buffer must be contiguous")
    view = view.cast("B")
    cdef const uint8_t[::1] data = view
    cdef const uint8_t *p = &data[0] if data.shape[0] else NULL
    cdef size_t n = data.shape[0]
    with nogil:
        rc = ps_decode_buffer(p, n, &builder.b, &err)
    if rc != PS_OK:
        builder.fail(&err)
    return builder.export(view)


# --- streaming decoder --------------------------------------------------------

# Smaller Deliver frames decode with the GIL held: their decode takes a few
# microseconds, less than handing the GIL to another thread and waiting to
# get it back (up to the 5 ms switch interval if that thread keeps it).
cdef enum:
    NOGIL_FRAME = 64 * 1024

cdef class Chunk:
    """One Deliver frame of a subscription, decoded, or (``batch`` None)
    left to decode later (see ``StreamDecoder.admit``)."""
    cdef readonly int subscription_id
    cdef readonly object batch          # pyarrow.RecordBatch, None until decoded
    cdef readonly uint64_t first_offset
    cdef readonly uint32_t num_records  # records in the chunk, dropped ones included
    cdef readonly object committed_chunk_id  # Deliver v2, else None
    cdef readonly int64_t timestamp     # ms since the epoch (broker clock)
    cdef readonly int chunk_type        # 0 user; 1, 2 tracking (no rows)
    cdef readonly uint64_t size         # frame bytes, size prefix included
    cdef readonly uint64_t decoded_size # what it holds decoded (see below)
    cdef readonly int64_t decode_ns     # time spent decoding it (monotonic clock)
    cdef public object ticket           # the admitting consumer's bookkeeping
    # A deferred chunk: its frame in a receive block, the options to decode it with.
    cdef _Block block
    cdef size_t frame_at
    cdef uint32_t frame_len
    cdef uint64_t frame_pos
    cdef _Options options

    @property
    def next_offset(self):
        """The offset that follows this chunk (records, not entries)."""
        return self.first_offset + self.num_records

    def decode(self):
        """Decode a chunk whose admission was deferred, in this thread (its
        CRC was checked on arrival); nothing once decoded."""
        cdef _Builder builder
        cdef ps_chunk c
        cdef ps_error err
        cdef int rc
        cdef timespec t0, t1
        cdef const uint8_t *frame
        if self.options is None:
            return
        builder = _Builder(self.options)
        frame = self.block.data + self.frame_at
        with nogil:
            clock_gettime(CLOCK_MONOTONIC, &t0)
            rc = ps_deliver_parse(frame, self.frame_len, self.frame_pos, &c, &err)
            if rc == PS_OK:
                rc = ps_chunk_decode_records(&c, &builder.b, &err)
            clock_gettime(CLOCK_MONOTONIC, &t1)
        if rc != PS_OK:
            builder.fail(&err)
        self.batch = builder.export(self.block)
        self.decode_ns = ((t1.tv_sec - t0.tv_sec) * 1000000000
                          + (t1.tv_nsec - t0.tv_nsec))
        self.block = None
        self.options = None

    def __repr__(self):
        rows = "deferred" if self.batch is None else self.batch.num_rows
        return (f"Chunk(subscription_id={self.subscription_id}, "
                f"first_offset={self.first_offset}, num_records={self.num_records}, "
                f"rows={rows}, size={self.size})")


cdef int chunk_check(CrcWorker *w, const ps_chunk *c, uint32_t crc, uint32_t done,
                     ps_error *err) noexcept nogil:
    """The chunk's CRC, continued from that of the entries' first ``done``
    bytes (checked as they arrived), the rest on two cores given a worker
    (a rest whose CRC is worth splitting)."""
    cdef size_t rest = c.data_len - done
    if w != NULL:
        crc = ps_crc32_combine(crc, crc32_split(w, c.data + done, rest), rest)
    else:
        crc = ps_crc32(crc, c.data + done, rest)
    return ps_chunk_check_crc(c, crc, err)


cdef int chunk_decode(CrcWorker *w, const ps_chunk *c, ps_batch *b, uint32_t crc,
                      uint32_t done, ps_error *err) noexcept nogil:
    """chunk_check if the options ask for it, then ps_chunk_decode_records."""
    cdef int rc
    if b.opt.crc:
        rc = chunk_check(w, c, crc, done, err)
        if rc != PS_OK:
            return rc
    return ps_chunk_decode_records(c, b, err)


cdef class StreamDecoder(FrameReader):
    """A :class:`FrameReader` that also decodes the Deliver frames of the
    subscriptions registered with :meth:`subscribe`.

    :meth:`next_event` returns the next frame: a :class:`Chunk` for a Deliver
    of a registered subscription, otherwise the frame's bytes (control frames
    and Deliver frames of other subscription ids, untouched), or ``None``
    when no complete frame is buffered.  Columns of body="view" batches point
    into the receive buffer, which stays alive (and out of reuse) while they do.
    """
    cdef dict subs
    cdef ps_crc_ahead ahead   # zeroed by Cython: following no frame
    # Called with each Chunk before it is decoded (its header fields and
    # decoded_size set, its batch None); False leaves it undecoded, for
    # Chunk.decode later. It may raise a StreamError (the chunk's).
    cdef public object admit

    def __init__(self, max_frame_size=1048576):
        self.subs = {}

    def subscribe(self, int subscription_id, *, crc=True, amqp=True,
                  start_offset=0, columns=None, body="view",
                  error_policy="raise", max_subbatch_size=64 << 20,
                  max_chunk_size=1 << 30):
        """Decode this subscription's chunks with these options (replacing
        earlier ones).  Safe from any thread, also while another one is in
        :meth:`next_event`: a chunk being decoded keeps the options it
        started with."""
        if not 0 <= subscription_id <= 255:
            raise ValueError("subscription_id is a u8")
        opts = _Options(crc, amqp, start_offset, columns, body, error_policy,
                        max_subbatch_size, max_chunk_size)
        self.subs[subscription_id] = _Builder(opts)

    def unsubscribe(self, int subscription_id):
        """Stop decoding this subscription's chunks (a no-op if unknown)."""
        self.subs.pop(subscription_id, None)

    cdef int arrived(self) except -1:
        return self.check_arriving()

    cdef int check_arriving(self) except -1:
        """Continue the CRC of the entries of the incomplete frame buffered,
        if it is a Deliver frame of a subscription that checks CRCs: the
        bytes just received are still in the cache (see ps_crc_ahead)."""
        cdef size_t have = self.r.wpos - self.r.rpos
        cdef const uint8_t *f = self.r.buf + self.r.rpos + 4
        cdef _Builder builder
        if have < 4 + 5 or ps_frame_key(f) != PS_KEY_DELIVER:   # no subscription id yet
            return 0
        builder = self.subs.get(f[4])
        if builder is not None and builder.b.opt.crc:
            ps_crc_ahead_advance(&self.ahead, f, have - 4, self.r.consumed + 4)
        return 0

    def next_event(self):
        """The next :class:`Chunk` or control frame (bytes), or ``None``."""
        cdef const uint8_t *frame
        cdef uint32_t n
        cdef ps_error err
        cdef ps_chunk c
        cdef _Builder builder
        cdef int rc
        cdef uint64_t pos
        cdef timespec t0, t1
        cdef CrcWorker *worker
        cdef uint32_t crc, done
        cdef uint64_t inflated
        cdef ps_size_walk walk
        self.check_idle()
        rc = ps_reader_next(&self.r, &frame, &n, &err)
        if rc == PS_NEED_MORE:
            self.check_arriving()
            return None
        if rc != PS_OK:
            raise_error(&err)
        builder = None
        if n >= 5 and ps_frame_key(frame) == PS_KEY_DELIVER:
            builder = self.subs.get(frame[4])
        if builder is None:
            return PyBytes_FromStringAndSize(<const char *>frame, n)
        pos = self.r.consumed - n
        cdef Chunk chunk = Chunk.__new__(Chunk)
        try:
            if ps_deliver_parse(frame, n, pos, &c, &err) != PS_OK:
                raise_error(&err)
            crc = ps_crc_ahead_take(&self.ahead, &c, &done, &walk)
            chunk.subscription_id = c.subscription_id
            chunk.first_offset = c.first_offset
            chunk.num_records = c.num_records
            chunk.committed_chunk_id = c.committed_chunk_id if c.version == 2 else None
            chunk.timestamp = c.timestamp
            chunk.chunk_type = c.type
            chunk.size = 4 + <uint64_t>n
            # From the headers, before anything is inflated: a decoded batch
            # holds its frame (views point into it), what the sub-batches
            # declare and the rows' columns, and with body="binary" a copy
            # of the bodies (at most the frame's entries, inflated).
            ps_size_walk_step(&walk, &c, c.data_len)  # the headers not walked yet
            inflated = walk.size
            chunk.decoded_size = chunk.size + inflated
            if builder.b.opt.body_binary:
                chunk.decoded_size += c.data_len + inflated
            worker = NULL
            if builder.b.opt.crc and c.data_len - done >= SPLIT_CRC_BYTES:
                worker = crc_worker()
            if self.admit is not None and not self.admit(chunk):
                self.busy = True
                rc = PS_OK
                if builder.b.opt.crc:
                    with nogil:
                        rc = chunk_check(worker, &c, crc, done, &err)
                self.busy = False
                if rc != PS_OK:
                    raise_error(&err)
                chunk.block = self.block
                chunk.frame_at = <size_t>(frame - self.block.data)
                chunk.frame_len = n
                chunk.frame_pos = pos
                chunk.options = builder.options
                return chunk
            self.busy = True
            if n >= NOGIL_FRAME:
                with nogil:
                    clock_gettime(CLOCK_MONOTONIC, &t0)
                    rc = chunk_decode(worker, &c, &builder.b, crc, done, &err)
                    clock_gettime(CLOCK_MONOTONIC, &t1)
            else:
                clock_gettime(CLOCK_MONOTONIC, &t0)
                rc = chunk_decode(NULL, &c, &builder.b, crc, done, &err)
                clock_gettime(CLOCK_MONOTONIC, &t1)
            self.busy = False
            if rc != PS_OK:
                builder.fail(&err)
        except StreamError as exc:
            # The frame is consumed and the reader stays in step: only this
            # subscription's chunk is bad, so say whose it is.
            exc.subscription_id = frame[4]
            raise
        chunk.batch = builder.export(self.block)
        chunk.decode_ns = ((t1.tv_sec - t0.tv_sec) * 1000000000
                           + (t1.tv_nsec - t0.tv_nsec))
        return chunk
