# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, auto_pickle=False
"""edgeinfer._ring: the native side of the shared-memory rings.

Thin, allocation-free wrappers over the protocol in edgeinfer/ring.h. Only
daemon/ring.py imports this module; it knows nothing of config, models or
logging. Every error is a Python exception naming the segment; nothing here
can fault on a producer-written number, because ring.h bounds-checks them all.
"""
from cpython.buffer cimport PyBUF_WRITABLE, PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport errno
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset, strncpy
from posix.mman cimport munmap
from posix.unistd cimport close
from posix.stat cimport struct_stat, stat as c_stat

from ring cimport *

import os

import numpy as np

ABI_VERSION = EI_ABI_VERSION
HEADER_SIZE = EI_HEADER_SIZE
SLOT_HEADER_SIZE = EI_SLOT_HEADER_SIZE
MAX_WAIT = EI_MAX_WAIT
RING_CLOSED = EI_RING_CLOSED
RING_SUPERSEDED = EI_RING_SUPERSEDED
SLOT_EMPTY = EI_SLOT_EMPTY
SLOT_WRITING = EI_SLOT_WRITING
SLOT_READY = EI_SLOT_READY
PIXEL_FORMATS = {"gray8": EI_PIX_GRAY8, "rgb24": EI_PIX_RGB24, "bgr24": EI_PIX_BGR24,
                 "rgba32": EI_PIX_RGBA32, "bgra32": EI_PIX_BGRA32}


# ---------------------------------------------------------------- errors

class RingError(Exception):
    """Base of every shared-memory ring error."""

class SegmentNotFound(RingError, FileNotFoundError):
    """No segment of that name."""

class TruncatedSegment(RingError):
    """The file is smaller than its header or its geometry."""

class BadMagic(RingError):
    """Not an edgeinfer segment of the expected kind."""

class AbiMismatch(RingError):
    """An ABI version this build does not understand."""

class BadGeometry(RingError):
    """Geometry fields inconsistent or out of bounds."""

class InsecureSegment(RingError, PermissionError):
    """World-writable or not a regular file."""

class UntrustedOwner(InsecureSegment):
    """Owned by a user outside the allowed set."""

class ProducerBusy(RingError):
    """A live producer (or result writer) already owns the name."""

class ConsumerBusy(RingError):
    """Another live consumer is attached to the frame ring."""

class ShmFull(RingError, OSError):
    """The shared-memory filesystem has no room for the segment."""

class CorruptFrame(RingError):
    """A producer-written number failed its bounds check; the frame was skipped."""

class RingStateError(RingError):
    """A call out of order, e.g. acquiring while already holding a frame."""

_ERRORS = {
    EI_ERR_TRUNCATED: TruncatedSegment, EI_ERR_MAGIC: BadMagic, EI_ERR_ABI: AbiMismatch,
    EI_ERR_GEOMETRY: BadGeometry, EI_ERR_INSECURE: InsecureSegment, EI_ERR_OWNER: UntrustedOwner,
    EI_ERR_PRODUCER_BUSY: ProducerBusy, EI_ERR_CONSUMER_BUSY: ConsumerBusy, EI_ERR_NOSPACE: ShmFull,
    EI_ERR_NOT_FOUND: SegmentNotFound, EI_ERR_CORRUPT: CorruptFrame, EI_ERR_STATE: RingStateError,
}

cdef object _raise(ei_error *err):
    msg = err.msg.decode("utf-8", "replace")
    cls = _ERRORS.get(err.code)
    if cls is None:
        if err.code == EI_ERR_ARG:
            raise ValueError(msg)
        raise OSError(err.sys_errno, msg)
    if issubclass(cls, OSError):
        raise cls(err.sys_errno, msg)
    raise cls(msg)


cdef bytes _fs(str s):
    return s.encode("utf-8")


# ---------------------------------------------------------------- memory

cdef class _Mapping:
    """Owns one mmap of a segment and its fd. The memory is unmapped only when
    the last object referring to it (reader, writer, numpy view) is gone, so a
    view can never outlive its memory; the fd (and the lock it holds) can be
    dropped earlier with close_fd()."""
    cdef uint8_t *base   # owns: the mapping
    cdef size_t size     # bytes mapped
    cdef int fd          # owns: the segment fd, -1 once closed
    cdef int guard       # owns: SIGBUS guard entry (sigbus_guard.h) of a consumer mapping, -1 if none

    def __dealloc__(self):
        if self.base != NULL:
            ei_guard_remove(self.guard)  # before munmap: the range may be reused once unmapped
            munmap(self.base, self.size)
        if self.fd >= 0:
            close(self.fd)

    cdef void close_fd(self):
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1


cdef _Mapping _adopt(uint8_t *base, size_t size, int fd):
    """Takes ownership of a mapping and fd that ring.h handed us."""
    cdef _Mapping m = _Mapping.__new__(_Mapping)
    m.base = base
    m.size = size
    m.fd = fd
    m.guard = -1
    return m


cdef class _Region:
    """A buffer-protocol window onto part of a mapping; keeps the mapping alive."""
    cdef _Mapping mapping  # owner of the memory: holding it keeps the memory mapped
    cdef uint8_t *ptr      # borrowed: start of the window inside mapping
    cdef Py_ssize_t length
    cdef bint readonly
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __getbuffer__(self, Py_buffer *buf, int flags):
        if self.readonly and (flags & PyBUF_WRITABLE):
            raise BufferError("this frame view is read-only")
        self.shape[0] = self.length
        self.strides[0] = 1
        buf.buf = self.ptr
        buf.obj = self
        buf.len = self.length
        buf.readonly = self.readonly
        buf.itemsize = 1
        if flags & PyBUF_FORMAT:
            buf.format = "B"
        else:
            buf.format = NULL
        buf.ndim = 1
        buf.shape = self.shape if (flags & PyBUF_ND) else NULL
        buf.strides = self.strides if (flags & PyBUF_STRIDES) else NULL
        buf.suboffsets = NULL
        buf.internal = NULL

    def __releasebuffer__(self, Py_buffer *buf):
        pass


cdef _Region _region(_Mapping m, uint8_t *ptr, Py_ssize_t length, bint readonly):
    cdef _Region r = _Region.__new__(_Region)
    r.mapping = m
    r.ptr = ptr
    r.length = length
    r.readonly = readonly
    return r


cdef tuple _slot_views(_Mapping m, const ei_frame_layout *l, bint readonly):
    """One (H, W, C) uint8 array, one (1, H, W, C) batch of one (what a model
    takes) and one flat uint8 array per slot, built once at attach, so handing
    out a frame allocates nothing."""
    images = []
    batches = []
    flats = []
    cdef uint32_t i
    for i in range(l.slot_count):
        reg = _region(m, ei_frame_payload(m.base, l, i), <Py_ssize_t>l.payload_capacity, readonly)
        flat = np.frombuffer(reg, dtype=np.uint8)
        img = np.ndarray(shape=(l.height, l.width, l.channels), dtype=np.uint8, buffer=reg,
                         strides=(l.row_stride, l.channels, 1))
        images.append(img)
        batches.append(img[None])
        flats.append(flat)
    return tuple(images), tuple(batches), tuple(flats)


cdef dict _layout_dict(const ei_frame_layout *l):
    return dict(width=l.width, height=l.height, channels=l.channels, pixel_format=l.pixel_format,
                row_stride=l.row_stride, slot_count=l.slot_count, slot_stride=l.slot_stride,
                payload_capacity=l.payload_capacity, total_size=l.total_size)


cdef class _Uids:
    """A C array copy of the allowed-owner uids."""
    cdef uint32_t *uids  # owns: malloc'd array, freed in __dealloc__
    cdef size_t n

    def __cinit__(self, allowed):
        allowed = list(allowed or ())
        self.n = len(allowed)
        self.uids = <uint32_t *>malloc(max(self.n, 1) * sizeof(uint32_t))
        if self.uids == NULL:
            raise MemoryError()
        for i, u in enumerate(allowed):
            self.uids[i] = u

    def __dealloc__(self):
        free(self.uids)


def sigbus_absorbed():
    """SIGBUS faults absorbed in this process: reads of frame-ring pages a producer truncated away."""
    return ei_guard_hits()


def monotonic_ns():
    """CLOCK_MONOTONIC, the capture clock of the ABI."""
    return ei_now_ns(1)


def identity_of(str directory, str name):
    """(st_dev, st_ino) of the named segment, or None if absent."""
    cdef struct_stat st
    path = _fs(directory + "/" + name)
    if c_stat(path, &st) != 0:
        return None
    return (st.st_dev, st.st_ino)


# ---------------------------------------------------------------- frame ring

cdef class FrameProducer:
    """The producer end of a frame ring (ei_frame_producer)."""
    cdef ei_frame_producer p   # the C producer; p.base/p.fd are handed to `mapping`
    cdef _Mapping mapping      # owns the memory once created
    cdef readonly tuple images # writable (H, W, C) view per slot
    cdef readonly tuple flats  # writable flat view per slot (for readinto)
    cdef readonly str name
    cdef bint closed

    def __cinit__(self, str directory, str name, uint32_t width, uint32_t height, uint32_t pixel_format,
                  uint32_t row_stride=0, uint32_t slots=4, unsigned mode=0o660, long gid=-1):
        cdef ei_error err
        cdef ei_frame_geometry g
        g.width = width
        g.height = height
        g.pixel_format = pixel_format
        g.row_stride = row_stride
        g.slot_count = slots
        bdir = _fs(directory)
        bname = _fs(name)
        cdef const char *cdir = bdir
        cdef const char *cname = bname
        cdef int rc
        with nogil:
            rc = ei_frame_producer_open(&self.p, cdir, cname, &g, mode, gid, &err)
        if rc != EI_OK:
            _raise(&err)
        self.name = name
        self.mapping = _adopt(self.p.base, <size_t>self.p.layout.total_size, self.p.fd)
        self.images, _, self.flats = _slot_views(self.mapping, &self.p.layout, False)

    @property
    def layout(self):
        return _layout_dict(&self.p.layout)

    @property
    def generation(self):
        return self.p.hdr.generation

    def begin(self):
        """Reserves a free slot (never blocks) and returns its index."""
        if self.closed:
            raise RingStateError(f"{self.name}: producer is closed")
        ei_frame_producer_begin(&self.p)
        return self.p.writing

    def publish(self, uint64_t capture_mono_ns, uint64_t capture_real_ns, uint64_t frame_id,
                uint64_t payload_len):
        """Publishes the reserved slot; returns the frame's seq."""
        if self.closed or self.p.writing == EI_NO_SLOT:
            raise RingStateError(f"{self.name}: publish() without begin()")
        return ei_frame_producer_publish(&self.p, capture_mono_ns, capture_real_ns, frame_id, payload_len)

    def close(self, bint unlink=True):
        """Marks the ring closed, unlinks it and drops the producer lock.
        The memory stays mapped while views of it exist."""
        if self.closed:
            return
        self.closed = True
        ei_frame_producer_retire(&self.p, unlink)
        self.mapping.close_fd()

    def __dealloc__(self):
        if not self.closed and self.p.base != NULL:
            ei_frame_producer_retire(&self.p, True)


cdef class Frame:
    """The frame a consumer holds: a zero-copy, read-only view of one slot plus
    its metadata. Valid until release() (or the end of a `with` block). The
    consumer reuses this one object for every frame, so acquiring allocates
    nothing; copy out what must outlive the hold."""
    cdef FrameConsumer owner                 # the consumer holding the slot
    cdef readonly object array               # (height, width, channels) uint8 view of the slot
    cdef readonly object batch               # the same as a batch of one: (1, height, width, channels)
    cdef readonly object flat                # the whole payload area as a flat uint8 view
    cdef readonly uint64_t seq               # frame sequence number in this segment
    cdef readonly uint64_t frame_id          # producer's own frame number
    cdef readonly uint64_t capture_ns        # CLOCK_MONOTONIC at capture
    cdef readonly uint64_t capture_realtime_ns  # CLOCK_REALTIME at capture
    cdef readonly uint64_t payload_len       # bytes the producer declared
    cdef readonly uint32_t slot              # slot index
    cdef readonly uint32_t generation        # segment generation
    cdef readonly int64_t skipped            # frames published since the previous one we acquired

    @property
    def data(self):
        """The payload bytes the producer declared (payload_len)."""
        return memoryview(self.flat)[:self.payload_len]

    def release(self):
        self.owner.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.owner.release()


cdef class FrameConsumer:
    """The one consumer of a frame ring (ei_frame_consumer)."""
    cdef ei_frame_consumer c    # the C consumer; borrows mapping.base
    cdef ei_frame_info info     # metadata of the frame held
    cdef Frame frame            # the one Frame object handed out for every acquire
    cdef uint64_t prev_seq      # seq of the previous frame acquired (for `skipped`)
    cdef _Mapping mapping       # owns the memory
    cdef readonly tuple images  # read-only (H, W, C) view per slot
    cdef readonly tuple batches # read-only (1, H, W, C) view per slot
    cdef readonly tuple flats   # read-only flat view per slot
    cdef readonly str name
    cdef readonly object identity  # (st_dev, st_ino) of the segment we mapped

    def __cinit__(self, str directory, str name, allowed_uids=None):
        cdef ei_error err
        cdef ei_mapped m
        cdef _Uids uids = _Uids(allowed_uids)
        bdir = _fs(directory)
        bname = _fs(name)
        cdef const char *cdir = bdir
        cdef const char *cname = bname
        cdef int rc
        with nogil:
            rc = ei_frame_consumer_open(&self.c, &m, cdir, cname, uids.uids, uids.n, &err)
        if rc != EI_OK:
            _raise(&err)
        self.name = name
        self.identity = (m.dev, m.ino)
        self.mapping = _adopt(m.base, m.size, m.fd)
        # The producer can shrink the file under us (named shm cannot be sealed): absorb the SIGBUS.
        self.mapping.guard = ei_guard_add(m.base, m.size)
        if self.mapping.guard < 0:
            raise RingError(f"{name}: cannot guard the mapping against a producer shrinking it: "
                            f"{os.strerror(errno)}")
        self.images, self.batches, self.flats = _slot_views(self.mapping, &self.c.layout, True)
        self.frame = Frame.__new__(Frame)
        self.frame.owner = self

    @property
    def layout(self):
        return _layout_dict(&self.c.layout)

    @property
    def flags(self):
        return self.c.hdr.flags

    @property
    def generation(self):
        return self.c.hdr.generation

    @property
    def producer_pid(self):
        return self.c.hdr.producer_pid

    @property
    def last_seq(self):
        return self.c.last_seq

    @property
    def latest_seq(self):
        return self.c.hdr.latest >> 8

    @property
    def counters(self):
        h = self.c.hdr
        return dict(published=h.published, producer_backoffs=h.producer_backoffs, claims=h.claims,
                    claim_retries=h.claim_retries)

    def acknowledge_flags(self):
        """Marks the current flags as seen, so ready() stops reporting them."""
        self.c.seen_flags = self.c.hdr.flags
        return self.c.seen_flags

    @property
    def truncated(self):
        """True once the producer shrank the segment under our mapping: the lost pages now read as
        zeros (sigbus_guard.h), so nothing read from this ring since can be trusted."""
        return ei_guard_hit(self.mapping.guard) != 0

    def producer_alive(self):
        """True while some process holds the producer lock of this segment."""
        return self.mapping.fd >= 0 and ei_lock_held(self.mapping.fd, EI_LOCK_PRODUCER) == 1

    def ready(self):
        return ei_frame_consumer_ready(&self.c) != 0

    def peek_capture_ns(self):
        """Capture time of the newest published frame, without claiming it (for
        scheduling; racy by design, bounds-checked). 0 if none."""
        cdef uint64_t latest = self.c.hdr.latest
        cdef uint32_t slot = latest & 0xff
        if latest == 0 or slot >= self.c.layout.slot_count:
            return 0
        return ei_frame_slot(self.c.base, &self.c.layout, slot).capture_mono_ns

    def has_frame(self):
        """A frame newer than the last acquired is published (and the ring not superseded)."""
        return (self.c.hdr.latest >> 8) > self.c.last_seq and not (self.c.hdr.flags & EI_RING_SUPERSEDED)

    def wait_acquire(self, double timeout, double spin=0.0):
        """wait() and acquire() in one call, for the hot path: sleeps (GIL
        released) until a newer frame or a flag change, then claims the newest
        frame. Returns the Frame, or None (timeout, flag change: see `flags`)."""
        cdef ei_waitable w = ei_frame_waitable(&self.c)
        cdef uint64_t timeout_ns = <uint64_t>(timeout * 1e9) if timeout > 0 else 0
        cdef uint64_t spin_ns = <uint64_t>(spin * 1e9) if spin > 0 else 0
        if self.c.held != EI_NO_SLOT:
            raise RingStateError(f"{self.name}: acquire() while a frame is held; release it first")
        if not ei_frame_consumer_ready(&self.c):
            with nogil:
                ei_wait_any(&w, 1, timeout_ns, spin_ns, 1)
        return self.acquire()

    def acquire(self):
        """Claims the newest frame if newer than the last; returns the Frame or None."""
        cdef int rc = ei_frame_consumer_acquire(&self.c, &self.info)
        cdef Frame f
        if rc == 1:
            f = self.frame
            f.array = self.images[self.info.slot]
            f.batch = self.batches[self.info.slot]
            f.flat = self.flats[self.info.slot]
            f.seq = self.info.seq
            f.frame_id = self.info.frame_id
            f.capture_ns = self.info.capture_mono_ns
            f.capture_realtime_ns = self.info.capture_real_ns
            f.payload_len = self.info.payload_len
            f.slot = self.info.slot
            f.generation = self.info.generation
            f.skipped = <int64_t>(self.info.seq - self.prev_seq) - 1
            self.prev_seq = self.info.seq
            return f
        if rc == 0:
            return None
        if rc == EI_ERR_CORRUPT:
            raise CorruptFrame(f"{self.name}: producer wrote an out-of-bounds slot index or payload length; "
                               f"frame {self.c.last_seq} skipped")
        raise RingStateError(f"{self.name}: acquire() while a frame is held; release it first")

    def release(self):
        ei_frame_consumer_release(&self.c)

    @property
    def held(self):
        return -1 if self.c.held == EI_NO_SLOT else self.c.held

    def slot_address(self, uint32_t slot):
        """Address of a slot's payload inside the mapping (to prove zero copy)."""
        if slot >= self.c.layout.slot_count:
            raise IndexError(slot)
        return <size_t>ei_frame_payload(self.c.base, &self.c.layout, slot)

    def slot_state(self, uint32_t slot):
        """(seq, state) of a slot, for diagnostics and tests."""
        if slot >= self.c.layout.slot_count:
            raise IndexError(slot)
        w = ei_frame_slot(self.c.base, &self.c.layout, slot).word
        return (w >> 8, w & 0xff)

    def close(self):
        """Releases any held frame and the consumer lock; memory stays mapped while views exist."""
        ei_frame_consumer_detach(&self.c, self.mapping.fd)
        self.mapping.close_fd()


# ---------------------------------------------------------------- waiting

cdef class WaitSet:
    """Preallocated waiting room for up to EI_MAX_WAIT rings: wait() builds
    the C array in place and sleeps with the GIL released."""
    cdef ei_waitable w[64]     # filled per call from the current consumers

    def wait(self, consumers, double timeout, double spin=0.0, bint use_waitv=True):
        """Sleeps until one of `consumers` (FrameConsumer or ResultConsumer) is
        ready; returns a bitmask of the ready ones, 0 on timeout."""
        cdef uint32_t n = len(consumers)
        cdef uint32_t i
        cdef uint64_t mask
        cdef uint64_t timeout_ns = <uint64_t>(timeout * 1e9) if timeout > 0 else 0
        cdef uint64_t spin_ns = <uint64_t>(spin * 1e9) if spin > 0 else 0
        if n > EI_MAX_WAIT:
            raise ValueError(f"can wait on at most {EI_MAX_WAIT} rings at once, got {n}")
        for i in range(n):
            obj = consumers[i]
            if isinstance(obj, FrameConsumer):
                self.w[i] = ei_frame_waitable(&(<FrameConsumer>obj).c)
            else:
                self.w[i] = ei_result_waitable(&(<ResultConsumer?>obj).r)
        with nogil:
            mask = ei_wait_any(self.w, n, timeout_ns, spin_ns, use_waitv)
        return mask


# ---------------------------------------------------------------- result ring

cdef class ResultProducer:
    """The one writer of a result ring (ei_result_writer)."""
    cdef ei_result_writer wr   # the C writer; wr.base/wr.fd are handed to `mapping`
    cdef _Mapping mapping      # owns the memory
    cdef readonly str name
    cdef bint closed

    def __cinit__(self, str directory, str name, uint32_t records, uint64_t payload_capacity,
                  unsigned mode=0o660, long gid=-1):
        cdef ei_error err
        bdir = _fs(directory)
        bname = _fs(name)
        cdef const char *cdir = bdir
        cdef const char *cname = bname
        cdef int rc
        with nogil:
            rc = ei_result_writer_open(&self.wr, cdir, cname, records, payload_capacity, mode, gid, &err)
        if rc != EI_OK:
            _raise(&err)
        self.name = name
        self.mapping = _adopt(self.wr.base, <size_t>self.wr.layout.total_size, self.wr.fd)

    @property
    def payload_capacity(self):
        return self.wr.layout.payload_capacity

    @property
    def record_count(self):
        return self.wr.layout.record_count

    def write(self, uint64_t frame_seq, uint64_t frame_id, uint64_t capture_mono_ns, uint64_t capture_real_ns,
              uint64_t start_mono_ns, uint64_t done_mono_ns, uint32_t status, uint32_t payload_kind,
              const uint8_t[::1] payload, uint32_t item_count, bytes model_name, bytes model_version):
        """Writes one record; returns its number. The payload must fit the capacity."""
        if self.closed:
            raise RingStateError(f"{self.name}: writer is closed")
        cdef Py_ssize_t n = payload.shape[0] if payload is not None else 0
        if <uint64_t>n > self.wr.layout.payload_capacity:
            raise ValueError(f"{self.name}: payload of {n} bytes exceeds the record capacity "
                             f"{self.wr.layout.payload_capacity}")
        cdef ei_result_record_header *r = ei_result_writer_begin(&self.wr)
        r.frame_seq = frame_seq
        r.frame_id = frame_id
        r.capture_mono_ns = capture_mono_ns
        r.capture_real_ns = capture_real_ns
        r.start_mono_ns = start_mono_ns
        r.done_mono_ns = done_mono_ns
        r.status = status
        r.payload_kind = payload_kind
        r.payload_len = <uint32_t>n
        r.item_count = item_count
        memset(r.model_name, 0, EI_MODEL_NAME_LEN)
        memset(r.model_version, 0, EI_MODEL_VERSION_LEN)
        memcpy(r.model_name, <const char *>model_name, min(len(model_name), EI_MODEL_NAME_LEN))
        memcpy(r.model_version, <const char *>model_version, min(len(model_version), EI_MODEL_VERSION_LEN))
        if n:
            memcpy(ei_result_payload(r), &payload[0], n)
        return ei_result_writer_commit(&self.wr, r)

    def close(self, bint unlink=True):
        if self.closed:
            return
        self.closed = True
        ei_result_writer_retire(&self.wr, unlink)
        self.mapping.close_fd()

    def __dealloc__(self):
        if not self.closed and self.wr.base != NULL:
            ei_result_writer_retire(&self.wr, True)


cdef class ResultConsumer:
    """One of any number of readers of a result ring (ei_result_reader)."""
    cdef ei_result_reader r     # the C reader; borrows mapping.base
    cdef ei_result_record_header rec  # last record copied out
    cdef _Mapping mapping       # owns the memory
    cdef bytearray scratch      # payload copy target, sized to the capacity once
    cdef readonly str name
    cdef readonly object identity

    def __cinit__(self, str directory, str name, allowed_uids=None, bint from_oldest=False):
        cdef ei_error err
        cdef ei_mapped m
        cdef _Uids uids = _Uids(allowed_uids)
        bdir = _fs(directory)
        bname = _fs(name)
        cdef const char *cdir = bdir
        cdef const char *cname = bname
        cdef int rc
        with nogil:
            rc = ei_result_reader_open(&self.r, &m, cdir, cname, uids.uids, uids.n, from_oldest, &err)
        if rc != EI_OK:
            _raise(&err)
        self.name = name
        self.identity = (m.dev, m.ino)
        self.mapping = _adopt(m.base, m.size, m.fd)
        self.scratch = bytearray(max(<Py_ssize_t>self.r.layout.payload_capacity, 1))

    @property
    def flags(self):
        return self.r.hdr.flags

    @property
    def missed(self):
        return self.r.missed

    @property
    def head(self):
        return self.r.hdr.head

    @property
    def generation(self):
        return self.r.hdr.generation

    def writer_alive(self):
        return self.mapping.fd >= 0 and ei_lock_held(self.mapping.fd, EI_LOCK_PRODUCER) == 1

    def acknowledge_flags(self):
        self.r.seen_flags = self.r.hdr.flags
        return self.r.seen_flags

    def ready(self):
        return ei_result_reader_ready(&self.r) != 0

    def has_record(self):
        """A complete record we have not read yet is in the ring."""
        return self.r.hdr.head >= self.r.next

    def next(self):
        """Copies the next record out; returns (fields tuple, payload bytes, missed) or None."""
        cdef uint64_t missed = 0
        cdef uint8_t *buf = <uint8_t *><char *>self.scratch
        cdef int got = ei_result_reader_next(&self.r, &self.rec, buf, <uint64_t>len(self.scratch), &missed)
        if got < 0:
            raise CorruptFrame(f"{self.name}: result ring head is corrupt (beyond {EI_MAX_RECORD_NUMBER})")
        if not got:
            return None
        rec = self.rec
        fields = (self.r.next - 1, rec.frame_seq, rec.frame_id, rec.capture_mono_ns, rec.capture_real_ns,
                  rec.start_mono_ns, rec.done_mono_ns, rec.status, rec.payload_kind, rec.item_count,
                  PyBytes_FromStringAndSize(rec.model_name, EI_MODEL_NAME_LEN).rstrip(b"\0"),
                  PyBytes_FromStringAndSize(rec.model_version, EI_MODEL_VERSION_LEN).rstrip(b"\0"))
        return fields, bytes(self.scratch[:rec.payload_len]), missed

    def close(self):
        self.mapping.close_fd()
