# Included by _core.pyx (one extension module): receive blocks and the frame reader.

# --- receive blocks ---------------------------------------------------------
#
# A receive block is one malloc'd region that socket reads land in.  Decoded
# columns point into it (zero copy), holding a reference to the _Block object
# through their Arrow buffers; when the last reference goes, the region returns
# to a pool and the next reader that needs room reuses it.
#
# The pool holds as many blocks as a consumer's default credit keeps in
# flight (64 chunks, 64 MiB): a consumer slower than the broker (a Spark
# worker writing to the JVM) has that many alive at its peaks. With 16 slots,
# the rest went back to malloc, which returned them to the system, and each
# new block's pages faulted on the first recv into them: some 60 % of the page
# faults and a third of the system time of a Spark read's Python worker.  The
# pool never holds more than were alive at once (a block is only allocated
# when none pooled fits), nor blocks of a size nobody asks for any more.

cdef enum:
    POOL_SLOTS = 64
    POOL_BYTES = 64 * 1024 * 1024
    BLOCK_SIZE = 1024 * 1024

cdef uint8_t *pool_data[POOL_SLOTS]
cdef size_t pool_cap[POOL_SLOTS]
cdef int pool_len = 0
cdef size_t pool_total = 0


cdef class _Block:
    """One receive region; exports it through the buffer protocol."""
    cdef uint8_t *data
    cdef size_t cap

    def __dealloc__(self):
        global pool_len, pool_total
        if self.data == NULL:
            return
        if pool_len < POOL_SLOTS and pool_total + self.cap <= POOL_BYTES:
            pool_data[pool_len] = self.data
            pool_cap[pool_len] = self.cap
            pool_len += 1
            pool_total += self.cap
        else:
            free(self.data)
        self.data = NULL

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.data, <Py_ssize_t>self.cap, 0, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass


cdef _Block new_block(size_t need):
    """A block of at least ``need`` bytes, from the pool when one fits."""
    global pool_len, pool_total
    cdef _Block b = _Block.__new__(_Block)
    cdef int i
    for i in range(pool_len):
        if pool_cap[i] >= need:
            b.data = pool_data[i]
            b.cap = pool_cap[i]
            pool_total -= b.cap
            pool_len -= 1
            pool_data[i] = pool_data[pool_len]
            pool_cap[i] = pool_cap[pool_len]
            return b
    if pool_len:
        # None fits: one too small makes room for the new one.
        pool_len -= 1
        pool_total -= pool_cap[pool_len]
        free(pool_data[pool_len])
    cdef size_t cap = BLOCK_SIZE
    while cap < need:
        cap *= 2
    b.data = <uint8_t *>malloc(cap)
    if b.data == NULL:
        raise MemoryError()
    ps_advise_huge(b.data, cap)  # a chunk's reads fill it at once
    b.cap = cap
    return b


# --- frame reader -----------------------------------------------------------

cdef class FrameReader:
    """Splits the bytes of a stream connection into frames.

    ``sock.recv_into(reader.writable())``, ``reader.commit(n)``, then call
    :meth:`next_frame` until it returns ``None``.
    """
    cdef ps_reader r
    cdef _Block block
    cdef bint busy          # a chunk of this buffer is being decoded without the GIL
    cdef size_t wend        # end of the last writable() view: commit stays inside it
    cdef timespec arrival   # when bytes last came in (or the reader was made)

    def __cinit__(self, max_frame_size=1048576):
        self.block = new_block(BLOCK_SIZE)
        self.r.buf = self.block.data
        self.r.cap = self.block.cap
        self.r.rpos = 0
        self.r.wpos = 0
        self.r.consumed = 0
        self.r.max_deliver = 0
        self.max_frame_size = max_frame_size
        clock_gettime(CLOCK_MONOTONIC, &self.arrival)

    @property
    def last_arrival(self):
        """When bytes last came in (:meth:`commit`, :meth:`feed`, each read
        of :meth:`recv_rest`), or the reader was made: seconds on the clock
        of :func:`time.monotonic`."""
        return self.arrival.tv_sec + self.arrival.tv_nsec * 1e-9

    @property
    def max_frame_size(self):
        """Largest accepted frame size (without the size prefix); 0 means
        unlimited.  Set it after Tune."""
        return self.r.max_frame

    @max_frame_size.setter
    def max_frame_size(self, value):
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError("max_frame_size must be in [0, 2**32)")
        self.r.max_frame = value

    @property
    def max_deliver_size(self):
        """Largest accepted Deliver frame when above ``max_frame_size``:
        brokers send each chunk whole, whatever frame_max says."""
        return self.r.max_deliver

    @max_deliver_size.setter
    def max_deliver_size(self, value):
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError("max_deliver_size must be in [0, 2**32)")
        self.r.max_deliver = value

    cdef bint block_shared(self):
        # Only this reader holds the block: nothing points into it.
        return Py_REFCNT(<object><PyObject *>self.block) > 1

    cdef int check_idle(self) except -1:
        if self.busy:
            raise RuntimeError("the decoder is in use by another thread")
        return 0

    cdef int reserve(self, size_t min_size) except -1:
        """Make at least min_size bytes (and room for the whole pending
        frame) free at the end of the buffer."""
        cdef size_t missing = ps_reader_missing(&self.r)
        cdef size_t need = min_size if min_size > missing else missing
        cdef size_t unread = self.r.wpos - self.r.rpos
        cdef _Block nb
        if self.r.cap - self.r.wpos >= need:
            return 0
        if not self.block_shared() and unread + need <= self.r.cap:
            ps_reader_compact(&self.r)
            return 0
        nb = new_block(unread + need)
        ps_reader_rebase(&self.r, nb.data, nb.cap)
        self.block = nb
        return 0

    def writable(self, Py_ssize_t min_size=65536):
        """Free space at the end of the receive buffer, as a writable
        memoryview; write into it, then :meth:`commit` the count.

        The view reaches no further than the end of the pending frame, or
        ``min_size`` bytes when that is more.  A read that ends where the
        frame ends leaves little of the next frame to copy when that frame
        needs a new block: a read to the block's end could bring most of a
        chunk along, to be copied again (a third of all bytes at 1 KiB
        records, whose chunks are some 6 MB).
        """
        cdef size_t missing, want
        if min_size < 1:
            raise ValueError("min_size must be positive")
        self.check_idle()
        if self.r.rpos == self.r.wpos and self.r.rpos and not self.block_shared():
            self.r.rpos = self.r.wpos = 0
        self.reserve(<size_t>min_size)
        missing = ps_reader_missing(&self.r)
        want = missing if missing > <size_t>min_size else <size_t>min_size
        if want > self.r.cap - self.r.wpos:
            want = self.r.cap - self.r.wpos
        self.wend = self.r.wpos + want
        return memoryview(self.block)[self.r.wpos:self.wend]

    @property
    def unfinished(self):
        """Bytes still to come of a frame whose first bytes are in, else 0:
        the sender is in the middle of it (a broker writes a chunk's header,
        then ``sendfile``s the rest), so they follow at once."""
        return self.owed()

    cdef size_t owed(self):
        # ps_reader_missing counts the size prefix of a frame not begun.
        if self.r.wpos == self.r.rpos:
            return 0
        return ps_reader_missing(&self.r)

    def commit(self, Py_ssize_t n):
        """``n`` bytes were written at the start of the last :meth:`writable`.
        Those of a frame still unfinished are looked at now (a stream
        decoder checks a chunk's CRC while its bytes are in the cache)."""
        self.check_idle()
        if n < 0 or <size_t>n > self.wend - self.r.wpos:
            raise ValueError("commit count exceeds the writable space")
        self.r.wpos += n
        self.wend = self.r.wpos
        clock_gettime(CLOCK_MONOTONIC, &self.arrival)
        if self.owed():
            # No whole frame to take: nobody drains (see ``frames_ready``),
            # so what came of the frame begun is looked at now.
            self.arrived()

    @property
    def frames_ready(self):
        """Whether a whole frame waits in the buffer (or a size prefix that
        :meth:`next_frame` refuses): the reader has something to take."""
        return self.r.wpos != self.r.rpos and ps_reader_missing(&self.r) == 0

    cdef int arrived(self) except -1:
        """Bytes were committed (a stream decoder checks those of a chunk
        while they are in the cache)."""
        return 0

    def recv_rest(self, int fd, Py_ssize_t slice_size=1048576):
        """Receive the rest of the frame begun (see :attr:`unfinished`) from
        the blocking socket ``fd``: reads of at most ``slice_size`` bytes
        that wait for all of them (``MSG_WAITALL``), the GIL released in
        each, each committed as it lands, no further than the frame's end.

        What a loop of :meth:`writable`, ``recv_into`` and :meth:`commit`
        does, without a round of Python per read (a chunk of 8 MB is eight
        of them).  Returns False if the peer closed the socket first (what
        came before is committed), else True.  Signal handlers run after
        every read, as ``recv_into`` runs them; one that raises leaves what
        was read committed.  An error of the socket raises ``OSError``."""
        cdef size_t missing, want
        cdef ssize_t n
        cdef int err = 0
        if slice_size < 1:
            raise ValueError("slice_size must be positive")
        self.check_idle()
        while True:
            missing = self.owed()
            if not missing:
                return True
            self.reserve(1)   # room for the whole frame
            want = self.r.cap - self.r.wpos
            if want > missing:
                want = missing
            if want > <size_t>slice_size:
                want = <size_t>slice_size
            self.busy = True
            with nogil:
                n = recv(fd, self.r.buf + self.r.wpos, want, MSG_WAITALL)
                if n < 0:
                    err = errno
            self.busy = False
            if n > 0:
                self.r.wpos += <size_t>n
                self.wend = self.r.wpos
                clock_gettime(CLOCK_MONOTONIC, &self.arrival)
                self.arrived()
            elif n == 0:
                return False
            elif err != EINTR:
                raise OSError(err, os.strerror(err))
            PyErr_CheckSignals()

    def feed(self, data):
        """Append a copy of ``data`` (any bytes-like) to the buffer."""
        cdef Py_buffer view
        self.check_idle()
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if view.len:
                self.reserve(<size_t>view.len)
                memcpy(self.r.buf + self.r.wpos, view.buf, <size_t>view.len)
                self.r.wpos += <size_t>view.len
                self.wend = self.r.wpos
                clock_gettime(CLOCK_MONOTONIC, &self.arrival)
        finally:
            PyBuffer_Release(&view)

    def next_frame(self):
        """The next complete frame without its size prefix, or ``None``."""
        cdef const uint8_t *frame
        cdef uint32_t n
        cdef ps_error err
        self.check_idle()
        cdef int rc = ps_reader_next(&self.r, &frame, &n, &err)
        if rc == PS_OK:
            return PyBytes_FromStringAndSize(<const char *>frame, n)
        if rc == PS_NEED_MORE:
            return None
        raise_error(&err)

    def buffered(self):
        """Bytes received but not yet returned as frames."""
        return self.r.wpos - self.r.rpos


# --- sending ------------------------------------------------------------------

def send_all(int fd, data, list progress):
    """Send all of ``data`` (any bytes-like) on the blocking socket ``fd``,
    the GIL released in each ``send``. ``progress[0]``, where the send
    starts, counts the bytes sent: it is updated after each ``send`` and
    before signal handlers run, so an interrupt (a handler's exception)
    leaves it exact, and whoever sends knows whether a frame was cut.
    An error of the socket raises ``OSError``."""
    cdef Py_buffer view
    cdef ssize_t n
    cdef int err = 0
    cdef size_t done = progress[0]
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        while done < <size_t>view.len:
            with nogil:
                n = send(fd, <const char *>view.buf + done, <size_t>view.len - done,
                         MSG_NOSIGNAL)
                if n < 0:
                    err = errno
            if n > 0:
                done += <size_t>n
                progress[0] = done
            elif n < 0 and err != EINTR:
                raise OSError(err, os.strerror(err))
            PyErr_CheckSignals()
    finally:
        PyBuffer_Release(&view)
