# Included by _core.pyx: record batches handed from a Python thread to an
# Arrow C stream (the PyCapsule interface) whose get_next waits without the
# GIL. An engine pulling through a Python iterator takes the GIL for every
# batch, and so waits for the threads that read and decode; here it only
# takes a lock, and decodes in the reader thread overlap with its work.

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New

cdef extern from "<errno.h>":
    enum:
        EIO

cdef enum:
    # Batches decoded ahead of the engine: enough to keep both sides busy,
    # few enough that the consumer's credit still bounds the memory.
    HANDOFF_SLOTS = 4

ctypedef struct handoff_state:
    pthread_mutex_t lock
    pthread_cond_t changed
    ArrowArray slots[HANDOFF_SLOTS]
    int head
    int count
    bint done        # the producer finished (error set if it failed)
    bint released    # the engine released the stream: nothing more is read
    const char *error
    PyObject *owner  # the BatchHandoff, kept alive by the stream


cdef class BatchHandoff:
    """Batches of ``schema`` that one thread hands over (``put``, then
    ``finish``) to the Arrow C stream ``capsule()`` exports. A full queue
    makes ``put`` wait (without the GIL); ``put`` returns False once the
    stream's reader released it."""
    cdef handoff_state s
    cdef readonly object schema
    cdef bytes error

    def __cinit__(self, schema):
        pthread_mutex_init(&self.s.lock, NULL)
        pthread_cond_init(&self.s.changed, NULL)
        self.s.owner = <PyObject *>self
        self.schema = schema

    def __dealloc__(self):
        # The stream holds a reference until released, which empties the
        # queue; only batches put without a stream ever made are left.
        cdef int i
        for i in range(self.s.count):
            ready = &self.s.slots[(self.s.head + i) % HANDOFF_SLOTS]
            ready.release(ready)
        pthread_cond_destroy(&self.s.changed)
        pthread_mutex_destroy(&self.s.lock)

    def capsule(self):
        """A new ``arrow_array_stream`` capsule reading this handoff."""
        cdef ArrowArrayStream *stream = <ArrowArrayStream *>malloc(sizeof(ArrowArrayStream))
        if stream == NULL:
            raise MemoryError()
        stream.get_schema = handoff_schema
        stream.get_next = handoff_next
        stream.get_last_error = handoff_error
        stream.release = handoff_release
        stream.private_data = &self.s
        Py_INCREF(self)
        return PyCapsule_New(stream, b"arrow_array_stream", capsule_free)

    def put(self, batch):
        """Queue ``batch`` (a ``pyarrow.RecordBatch``), waiting for room;
        False, dropping it, once the stream was released."""
        cdef ArrowArray array
        cdef bint taken = False
        batch._export_to_c(<uintptr_t>&array)
        with nogil:
            pthread_mutex_lock(&self.s.lock)
            while self.s.count == HANDOFF_SLOTS and not self.s.released:
                pthread_cond_wait(&self.s.changed, &self.s.lock)
            if not self.s.released:
                self.s.slots[(self.s.head + self.s.count) % HANDOFF_SLOTS] = array
                self.s.count += 1
                taken = True
                pthread_cond_broadcast(&self.s.changed)
            pthread_mutex_unlock(&self.s.lock)
            if not taken:
                array.release(&array)
        return taken

    def finish(self, error=None):
        """No more batches; ``error`` (an exception) ends the stream with
        its type and message once the queued batches were read."""
        cdef const char *message = NULL
        if error is not None:
            kind = type(error)
            self.error = f"{kind.__module__}.{kind.__qualname__}: {error}".encode()
            message = PyBytes_AsString(self.error)
        with nogil:
            pthread_mutex_lock(&self.s.lock)
            self.s.error = message
            self.s.done = True
            pthread_cond_broadcast(&self.s.changed)
            pthread_mutex_unlock(&self.s.lock)


cdef int handoff_schema(ArrowArrayStream *stream, ArrowSchema *out) noexcept nogil:
    cdef handoff_state *s = <handoff_state *>stream.private_data
    with gil:
        try:
            (<object>s.owner).schema._export_to_c(<uintptr_t>out)
            return 0
        except BaseException:
            return EIO


cdef int handoff_next(ArrowArrayStream *stream, ArrowArray *out) noexcept nogil:
    cdef handoff_state *s = <handoff_state *>stream.private_data
    cdef int rc = 0
    pthread_mutex_lock(&s.lock)
    while s.count == 0 and not s.done:
        pthread_cond_wait(&s.changed, &s.lock)
    if s.count:
        out[0] = s.slots[s.head]
        s.head = (s.head + 1) % HANDOFF_SLOTS
        s.count -= 1
        pthread_cond_broadcast(&s.changed)
    elif s.error != NULL:
        rc = EIO
    else:
        out.release = NULL  # the end
    pthread_mutex_unlock(&s.lock)
    return rc


cdef const char *handoff_error(ArrowArrayStream *stream) noexcept nogil:
    return (<handoff_state *>stream.private_data).error


cdef void handoff_release(ArrowArrayStream *stream) noexcept nogil:
    cdef handoff_state *s = <handoff_state *>stream.private_data
    cdef ArrowArray left[HANDOFF_SLOTS]
    cdef int i, n
    pthread_mutex_lock(&s.lock)
    s.released = True
    n = s.count
    for i in range(n):
        left[i] = s.slots[(s.head + i) % HANDOFF_SLOTS]
    s.count = 0
    pthread_cond_broadcast(&s.changed)
    pthread_mutex_unlock(&s.lock)
    # Outside the lock: releasing an array may take the GIL (Python-owned
    # buffers), which the producer may hold while it waits for the lock.
    for i in range(n):
        left[i].release(&left[i])
    stream.release = NULL
    with gil:
        Py_DECREF(<object>s.owner)


cdef void capsule_free(object capsule) noexcept:
    cdef ArrowArrayStream *stream = <ArrowArrayStream *>PyCapsule_GetPointer(
        capsule, b"arrow_array_stream")
    if stream.release != NULL:
        stream.release(stream)
    free(stream)
