# Included by _core.pyx: CRC-32, and the CRC of large chunks on two cores.
#
# A large chunk's CRC runs at the memory's speed (some 20 GB/s when it has
# left the cache): nothing makes one core's CRC faster. A second thread
# checks the second half of a large chunk meanwhile and the halves combine
# (ps_crc32_combine).
# The reading thread never waits on a worker that has not started: it then
# checks that half itself, so a busy machine costs one lock round, no more.

import threading


ctypedef uint32_t (*crc32_fn)(uint32_t, const uint8_t *, size_t) noexcept nogil


cdef uint32_t crc32_of(crc32_fn fn, data, value) except? 0:
    cdef Py_buffer view
    cdef uint32_t crc = <uint32_t>(value & 0xFFFFFFFF)
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            crc = fn(crc, <const uint8_t *>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


def crc32(data, value=0):
    """CRC-32 of ``data`` (any bytes-like), continuing from ``value``:
    the same result as :func:`zlib.crc32`."""
    return crc32_of(ps_crc32, data, value)


def crc32_implementation():
    """Which code computes :func:`crc32` on this build and CPU, in words:
    ISA-L's variant (the one its dispatcher picks on this CPU), pystream's
    256-bit folding, or zlib's crc32 in a build without ISA-L."""
    return ps_crc32_implementation().decode()


def _crc32_fold256(data, value=0):
    """``crc32`` by the 256-bit folding on any CPU that can run it, even one
    where ``crc32`` takes ISA-L's wider folding (for the tests)."""
    return crc32_of(ps_crc32_fold256, data, value)


cdef enum:
    # Below this a chunk's CRC takes under 40 us from cache (ISA-L's AVX-512
    # folding; 100 us from memory, 20 GB/s), a few times what handing a half
    # to the worker costs in locks, wake-ups and switches: on two cores
    # shared with the broker, splitting smaller chunks costs more CPU than
    # it saves time.
    SPLIT_CRC_BYTES = 2 * 1024 * 1024

cdef enum CrcState:
    CRC_IDLE        # no job
    CRC_POSTED      # a job waits for the worker
    CRC_RUNNING     # the worker computes it
    CRC_DONE        # its result waits for the poster

cdef extern from "<unistd.h>" nogil:
    ctypedef int pid_t
    pid_t getpid()

cdef struct CrcWorker:
    pid_t pid           # the process whose thread runs it: a fork has none
    pthread_mutex_t lock
    pthread_cond_t changed
    CrcState state
    const uint8_t *data
    size_t n
    uint32_t crc

cdef void crc_worker_loop(CrcWorker *w) noexcept nogil:
    cdef const uint8_t *data
    cdef size_t n
    cdef uint32_t crc
    pthread_mutex_lock(&w.lock)
    while True:   # for the life of the process
        while w.state != CRC_POSTED:
            pthread_cond_wait(&w.changed, &w.lock)
        w.state = CRC_RUNNING
        data = w.data
        n = w.n
        pthread_mutex_unlock(&w.lock)
        crc = ps_crc32(0, data, n)
        pthread_mutex_lock(&w.lock)
        w.crc = crc
        w.state = CRC_DONE
        pthread_cond_broadcast(&w.changed)


cdef class _CrcWorkerThread:
    """A CRC worker, run without the GIL by a daemon thread of Python's (one
    made in C would bind the extension to glibc 2.34's pthread_create, past
    the wheels' manylinux_2_31), which keeps it alive."""
    cdef CrcWorker w

    def __cinit__(self):
        self.w.pid = getpid()
        pthread_mutex_init(&self.w.lock, NULL)
        pthread_cond_init(&self.w.changed, NULL)
        self.w.state = CRC_IDLE

    def __dealloc__(self):
        # A child of fork() has the memory, not the thread: its lock may be
        # held, so the child leaves it as it is.
        if self.ours():
            pthread_cond_destroy(&self.w.changed)
            pthread_mutex_destroy(&self.w.lock)

    def _run(self):
        with nogil:
            crc_worker_loop(&self.w)

    cdef bint ours(self):
        """Whether its thread runs in this process."""
        return self.w.pid == getpid()


# One worker for the process, shared by every decoder: a large chunk's half
# goes to it when it is free, and is checked in the reading thread otherwise.
cdef _CrcWorkerThread crc_worker_thread = None
cdef bint crc_worker_failed = False   # no thread could start: one core it is


cdef CrcWorker *crc_worker() except? NULL:
    """The process's running worker, started on first use; NULL if no thread
    can start (the CRC then runs on one core, as for small chunks)."""
    global crc_worker_thread, crc_worker_failed
    if crc_worker_thread is not None and not crc_worker_thread.ours():
        # A child of fork() has the parent's worker, not its thread.
        crc_worker_thread = None
        crc_worker_failed = False
    if crc_worker_thread is None and not crc_worker_failed:
        worker = _CrcWorkerThread()
        try:
            threading.Thread(target=worker._run, name="pystream-crc",
                             daemon=True).start()
            crc_worker_thread = worker
        except RuntimeError:
            crc_worker_failed = True
    return &crc_worker_thread.w if crc_worker_thread is not None else NULL


cdef uint32_t crc32_split(CrcWorker *w, const uint8_t *data, size_t n) noexcept nogil:
    """The CRC-32 of data, its second half checked by the worker if no other
    decoder's half is on it."""
    cdef size_t half = n // 2
    cdef uint32_t first, second
    pthread_mutex_lock(&w.lock)
    if w.state != CRC_IDLE:
        pthread_mutex_unlock(&w.lock)
        return ps_crc32(0, data, n)
    w.data = data + half
    w.n = n - half
    w.state = CRC_POSTED
    pthread_cond_signal(&w.changed)
    pthread_mutex_unlock(&w.lock)
    first = ps_crc32(0, data, half)
    pthread_mutex_lock(&w.lock)
    if w.state == CRC_POSTED:   # the worker did not get a core in time
        w.state = CRC_IDLE
        pthread_mutex_unlock(&w.lock)
        second = ps_crc32(0, data + half, n - half)
    else:
        while w.state != CRC_DONE:
            pthread_cond_wait(&w.changed, &w.lock)
        second = w.crc
        w.state = CRC_IDLE
        pthread_mutex_unlock(&w.lock)
    return ps_crc32_combine(first, second, n - half)


def _code_paths():
    """What this CPU runs where the extension's code paths differ, for the
    benchmarks' records: ``crc`` names the CRC-32 code (for ISA-L, the
    variant its dispatcher picks from the CPU features it keys on; ISA-L
    does not report its choice), ``crc_split_bytes`` the chunk size from
    which a chunk's CRC is split over two threads, ``crc_worker`` whether
    that second thread is available ("none" once one could not start).
    Decoding itself has one path, the same C parser on every CPU."""
    return {"crc": ps_crc32_implementation().decode("ascii"),
            "crc_split_bytes": SPLIT_CRC_BYTES,
            "crc_worker": "none" if crc_worker_failed else "two threads"}

