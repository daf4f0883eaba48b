# Included by _core.pyx (one extension module): Publish frames from Arrow columns (the producer) and the routing hash.

# --- Publish frames (the producer) ----------------------------------------------
#
# Arrow arrays are read in place by the C encoder (csrc/encode.c): each is
# described by pointers into its buffers, which the arrays keep alive for the
# call; the GIL is released while the frames are written.

cdef int64_t NO_BYTES[2]       # stands in for absent buffers of empty arrays

cdef const uint8_t *address(buf):
    if buf is None or buf.size == 0:
        return <const uint8_t *>NO_BYTES
    return <const uint8_t *><uintptr_t>buf.address


cdef class _Strs:
    """A column of byte strings as the C encoder reads it."""
    cdef ps_strs s
    cdef const uint8_t **buffers    # views layout: the data buffers
    cdef uint8_t *views             # views built here (from a tuple of bytes)
    cdef object array

    def __dealloc__(self):
        free(self.buffers)
        free(self.views)


cdef object flat(arr):
    """One contiguous Array: chunks combined, dictionaries decoded."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not isinstance(arr, pa.Array):
        raise TypeError(f"expected a pyarrow Array, got {type(arr).__name__}")
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    arr.validate()
    return arr


cdef _Strs strs_of(arr, str what, bint text):
    """``arr`` (string types, and binary types unless ``text``) for C."""
    cdef _Strs out = _Strs.__new__(_Strs)
    cdef Py_ssize_t i
    if pa.types.is_null(arr.type):      # pa.array([None, ...]): all null
        arr = arr.cast(pa.string())
    t = arr.type
    binary = (pa.types.is_binary(t) or pa.types.is_large_binary(t)
              or pa.types.is_binary_view(t))
    if pa.types.is_string(t) or pa.types.is_binary(t):
        out.s.layout = PS_STRS_OFFSETS32
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        out.s.layout = PS_STRS_OFFSETS64
    elif pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        out.s.layout = PS_STRS_VIEWS
    else:
        out.s.layout = PS_STRS_ABSENT
    if out.s.layout == PS_STRS_ABSENT or (text and binary):
        kinds = "a string" if text else "a binary or string"
        raise TypeError(f"{what} must be {kinds} array, not {t}")
    out.array = arr
    bufs = arr.buffers()
    out.s.binary = binary
    out.s.validity = address(bufs[0]) if arr.null_count else NULL
    out.s.offset = arr.offset
    out.s.offsets = address(bufs[1])
    if out.s.layout == PS_STRS_VIEWS:
        data = bufs[2:]
        out.buffers = <const uint8_t **>malloc((len(data) + 1) * sizeof(uint8_t *))
        if out.buffers == NULL:
            raise MemoryError()
        for i in range(len(data)):
            out.buffers[i] = address(data[i])
        out.s.buffers = out.buffers
    else:
        out.s.data = address(bufs[2])
    return out


cdef _Strs strs_of_bytes(tuple items):
    """A tuple of ``bytes`` read in place, as Arrow views with one data
    buffer per item (None if an item is not ``bytes``): no joined copy of
    the bodies, no Arrow array built first. The tuple keeps the items alive
    while the encoder reads them without the GIL."""
    cdef Py_ssize_t n = len(items), i = 0, size
    cdef int32_t word
    cdef uint8_t *v
    cdef const uint8_t *p
    if n >= 2 ** 31:
        return None                     # view buffer indexes are int32
    cdef _Strs out = _Strs.__new__(_Strs)
    out.views = <uint8_t *>malloc(16 * n + 16)
    out.buffers = <const uint8_t **>malloc(sizeof(uint8_t *) * n + 8)
    if out.views == NULL or out.buffers == NULL:
        raise MemoryError()
    for item in items:
        if type(item) is not bytes:
            return None
        size = PyBytes_Size(item)
        if size >= 2 ** 31:
            return None
        p = <const uint8_t *>PyBytes_AsString(item)
        v = out.views + 16 * i
        memset(v, 0, 16)
        word = <int32_t>size
        memcpy(v, &word, 4)
        if size <= 12:
            memcpy(v + 4, p, size)
        else:
            memcpy(v + 4, p, 4)
            word = <int32_t>i
            memcpy(v + 8, &word, 4)     # buffer i, offset 0
        out.buffers[i] = p
        i += 1
    out.array = items
    out.s.layout = PS_STRS_VIEWS
    out.s.binary = 1
    out.s.validity = NULL
    out.s.offset = 0
    out.s.offsets = out.views
    out.s.buffers = out.buffers
    return out


cdef int ints_of(ps_ints *c, arr, int64_t mul, int64_t div) except -1:
    """An int64 array for C (values scaled by mul / div)."""
    bufs = arr.buffers()
    c.values = <const int64_t *>address(bufs[1])
    c.validity = address(bufs[0]) if arr.null_count else NULL
    c.offset = arr.offset
    c.mul = mul
    c.div = div
    return 0


# Timestamp units to AMQP milliseconds: (mul, div).
MS_SCALE = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1000000)}
PROPERTY_INDEX = {name: i for i, name in enumerate(PROPERTIES.names)}
TIMESTAMP_FIELDS = (8, 9)
GROUP_SEQUENCE = 11
BINARY_FIELDS = (0, 1, 5)       # message_id, user_id, correlation_id


cdef int props_of(ps_props *pr, arr, Py_ssize_t n, list keep) except -1:
    arr = flat(arr)
    if not pa.types.is_struct(arr.type):
        raise TypeError(f"properties must be a struct array, not {arr.type}")
    if len(arr) != n:
        raise ValueError(f"properties has {len(arr)} rows for {n} bodies")
    pr.present = 1
    pr.validity = address(arr.buffers()[0]) if arr.null_count else NULL
    pr.offset = arr.offset
    cdef _Strs s
    cdef int f
    for j in range(arr.type.num_fields):
        name = arr.type.field(j).name
        if name not in PROPERTY_INDEX:
            raise ValueError(f"unknown properties field {name!r}; fields are "
                             f"{', '.join(PROPERTIES.names)}")
        f = PROPERTY_INDEX[name]
        child = flat(arr.field(j))
        t = child.type
        if f in TIMESTAMP_FIELDS:
            if not pa.types.is_timestamp(t):
                raise TypeError(f"properties.{name} must be a timestamp array, not {t}")
            keep.append(child)
            mul, div = MS_SCALE[t.unit]
            ints_of(&pr.num[f], child, mul, div)
        elif f == GROUP_SEQUENCE:
            if not pa.types.is_integer(t):
                raise TypeError(f"properties.{name} must be an integer array, not {t}")
            child = child.cast(pa.int64())
            keep.append(child)
            ints_of(&pr.num[f], child, 1, 1)
        else:
            s = strs_of(child, f"properties.{name}", f not in BINARY_FIELDS)
            keep.append(s)
            pr.text[f] = s.s
    return 0


cdef int map_of(ps_map *m, arr, str what, Py_ssize_t n, list keep) except -1:
    arr = flat(arr)
    if not pa.types.is_map(arr.type):
        raise TypeError(f"{what} must be a map<string, string> array, not {arr.type}")
    if len(arr) != n:
        raise ValueError(f"{what} has {len(arr)} rows for {n} bodies")
    bufs = arr.buffers()
    m.offsets = <const int32_t *>address(bufs[1])
    m.validity = address(bufs[0]) if arr.null_count else NULL
    m.offset = arr.offset
    # offsets index the entries ignoring the map's own offset (.values);
    # .field() applies the entries' offset
    cdef _Strs keys = strs_of(flat(arr.values.field(0)), f"{what} keys", True)
    cdef _Strs values = strs_of(flat(arr.values.field(1)), f"{what} values", True)
    keep.append(keys)
    keep.append(values)
    m.keys = keys.s
    m.values = values.s
    return 0


cdef class _Codecs:
    """Compression contexts, reused across calls (one call at a time)."""
    cdef ps_codecs *c

    def __cinit__(self):
        self.c = ps_codecs_new()
        if self.c == NULL:
            raise MemoryError()

    def __dealloc__(self):
        ps_codecs_free(self.c)


cdef list free_codecs = []      # list.pop / append are atomic under the GIL

CODECS = {None: -1, "none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def codecs():
    """The sub-batch codecs this build can decode and encode: every one in
    a wheel; a source build lacks those whose library it did not find."""
    return tuple(name for name, number in CODECS.items()
                 if name is not None and ps_codec_available(number))


def check_codec(codec):
    """Raise :class:`~pystream.errors.CodecUnavailable` if this build
    cannot (de)compress ``codec`` (a name of ``CODECS``)."""
    if not ps_codec_available(CODECS[codec]):
        raise CodecUnavailable(
            f"{codec}: pystream was built without {codec} (install "
            f"lib{codec} and rebuild)")


def encode_publish(publisher_id, first_publishing_id, bodies, *,
                   properties=None, application_properties=None,
                   message_annotations=None, filter_values=None, amqp=True,
                   compression=None, sub_batch_size=100,
                   max_frame_size=1 << 20):
    """Encode messages into size-prefixed Publish frames, back to back.

    ``bodies``: a pyarrow binary, large_binary, string, large_string,
    binary_view or string_view array (or a list or tuple of ``bytes``, read in place); nulls are refused.
    With ``amqp`` each becomes an AMQP 1.0 message: message annotations,
    properties, application properties (each only where its row is not null;
    optional columns as in :func:`schema`, ``properties`` with any subset of
    the fields), then the body as one data section; without, the body is sent
    as is.  ``filter_values`` (strings, nulls allowed) makes Publish v2
    frames.  ``compression`` (``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"``,
    ``"zstd"``; not with filter values) groups up to ``sub_batch_size``
    messages per sub-batch entry (``"none"``: sub-batches left uncompressed;
    ``None``: no sub-batches).  No frame exceeds ``max_frame_size`` bytes,
    its size prefix included (0: only the 4 GiB of the size field).

    Returns ``(frames, entry_counts)``: a pyarrow Buffer holding the frames,
    and an int64 array with the number of messages of each entry, in the
    order of their publishing ids ``first_publishing_id, +1, ...``.
    """
    if not 0 <= publisher_id <= 255:
        raise ValueError("publisher_id is a u8")
    if not 0 <= first_publishing_id < 2 ** 64:
        raise ValueError("first_publishing_id is a u64")
    if compression not in CODECS:
        raise ValueError('compression must be None, "none", "gzip", "snappy", '
                         '"lz4" or "zstd"')
    if compression is not None and filter_values is not None:
        raise ValueError("filter values need Publish v2, which has no sub-batches: "
                         "compression must be None")
    if not 1 <= sub_batch_size <= 65535:
        raise ValueError("sub_batch_size must be in [1, 65535]")
    if not 0 <= max_frame_size < 2 ** 32:
        raise ValueError("max_frame_size must be in [0, 2**32)")
    if not amqp and (properties is not None or application_properties is not None
                     or message_annotations is not None):
        raise ValueError("properties, application_properties and "
                         "message_annotations need amqp=True")
    cdef _Strs body = None
    if isinstance(bodies, (list, tuple)):
        bodies = tuple(bodies)
        body = strs_of_bytes(bodies)
        if body is None:
            bodies = pa.array(bodies, pa.binary())
    if body is None:
        body = strs_of(flat(bodies), "bodies", False)
    cdef ps_publish pub
    memset(&pub, 0, sizeof(pub))
    cdef list keep = []
    cdef _Strs filters
    cdef Py_ssize_t n = len(body.array)
    pub.publisher_id = publisher_id
    pub.first_id = first_publishing_id
    pub.count = n
    pub.amqp = bool(amqp)
    pub.codec = CODECS[compression]
    if pub.codec > 0 and not ps_codec_available(pub.codec):
        check_codec(compression)
    pub.sub_batch = sub_batch_size
    pub.max_frame = max_frame_size or 0xFFFFFFFF
    pub.body = body.s
    if filter_values is not None:
        filters = strs_of(flat(filter_values), "filter_values", True)
        if len(filters.array) != n:
            raise ValueError(f"filter_values has {len(filters.array)} rows for {n} bodies")
        keep.append(filters)
        pub.filter = filters.s
    if properties is not None:
        props_of(&pub.properties, properties, n, keep)
    if application_properties is not None:
        map_of(&pub.application_properties, application_properties,
               "application_properties", n, keep)
    if message_annotations is not None:
        map_of(&pub.message_annotations, message_annotations,
               "message_annotations", n, keep)

    cdef _Codecs codecs = free_codecs.pop() if free_codecs else _Codecs()
    cdef ps_buf frames
    cdef ps_buf counts
    cdef ps_error err
    cdef int rc
    memset(&frames, 0, sizeof(frames))
    memset(&counts, 0, sizeof(counts))
    with nogil:
        rc = ps_encode_publish(&pub, codecs.c, &frames, &counts, &err)
    free_codecs.append(codecs)
    if rc != PS_OK:
        free(frames.p)
        free(counts.p)
        what = err.what.decode()
        if rc == PS_E_NOMEM:
            raise MemoryError(what)
        if rc == PS_E_FRAME_TOO_LARGE:
            raise ValueError(f"message {err.position}: {what} ({max_frame_size} "
                             "bytes with its size prefix)")
        raise ValueError(f"message {err.position}: {what}")
    return take(&frames), np.frombuffer(take(&counts), dtype=np.int64)


def murmur3_32(keys, seed=104729):
    """MurmurHash3 x86_32 of each key (a pyarrow string or binary array, or a
    list of str / bytes; str as UTF-8, a null as the empty key): the hash by
    which the stream clients route super stream messages,
    ``(hash & 0x7FFFFFFF) % partitions``.  A numpy uint32 array."""
    if isinstance(keys, (list, tuple)):
        keys = pa.array(keys)
    cdef _Strs s = strs_of(flat(keys), "keys", False)
    cdef size_t n = len(s.array)
    cdef uint32_t c_seed = <uint32_t>(seed & 0xFFFFFFFF)
    out = np.empty(n, dtype=np.uint32)
    cdef uint32_t[::1] view = out
    cdef uint32_t *dst = &view[0] if n else NULL
    with nogil:
        ps_murmur3_32(&s.s, n, c_seed, dst)
    return out
