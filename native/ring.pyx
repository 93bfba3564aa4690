# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, auto_pickle=False
"""edgeinfer._ring: the native side of the rings and their handover (ABI 2).

Thin, allocation-free wrappers over the protocol in edgeinfer/ring.h. Only
daemon/edgeinfer/abi/ring.py imports this module; it knows nothing of config, models or
logging. Every error is a Python exception naming the ring or stream; nothing
here can fault on a producer-written number, because ring.h checks them all.

Ownership of fds: every class that keeps an fd someone passed in keeps its
own duplicate (F_DUPFD_CLOEXEC); the caller's fd stays the caller's.
"""
from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES, PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport errno
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t, int32_t
from libc.string cimport memcpy, memset, strlen
from posix.mman cimport munmap
from posix.unistd cimport close

from ring_h cimport *

import os

import numpy as np

cdef extern from "<fcntl.h>" nogil:
    int fcntl(int fd, int cmd, ...)
    enum: F_DUPFD_CLOEXEC

ABI_VERSION = EI_ABI_VERSION
HEADER_SIZE = EI_HEADER_SIZE
SLOT_HEADER_SIZE = EI_SLOT_HEADER_SIZE
MAX_WAIT = EI_MAX_WAIT
STREAM_NAME_MAX = EI_STREAM_NAME_MAX
RING_CLOSED = EI_RING_CLOSED
SLOT_EMPTY = EI_SLOT_EMPTY
SLOT_WRITING = EI_SLOT_WRITING
SLOT_READY = EI_SLOT_READY
ROLE_PRODUCER = EI_ROLE_PRODUCER
ROLE_READER = EI_ROLE_READER
INGRESS_SOCKET = EI_INGRESS_SOCKET.decode()
RESULTS_SOCKET = EI_RESULTS_SOCKET.decode()
INGRESS_STATES = {EI_INGRESS_DISCONNECTED: "disconnected", EI_INGRESS_HANDSHAKE: "handshake",
                  EI_INGRESS_CONNECTED: "connected"}
PIXEL_FORMATS = {"gray8": EI_PIX_GRAY8, "rgb24": EI_PIX_RGB24, "bgr24": EI_PIX_BGR24,
                 "rgba32": EI_PIX_RGBA32, "bgra32": EI_PIX_BGRA32,
                 "nv12": EI_PIX_NV12, "i420": EI_PIX_I420, "yuyv": EI_PIX_YUYV}
COLORIMETRIES = {"bt601": EI_COLOUR_BT601, "bt601-full": EI_COLOUR_BT601_FULL, "bt709": EI_COLOUR_BT709,
                 "bt709-full": EI_COLOUR_BT709_FULL}
# Status classes a refusal carries (the daemon's reply): name → ring.h code.
STATUS = {"ok": EI_OK, "denied": EI_ERR_DENIED, "busy": EI_ERR_BUSY, "again": EI_ERR_AGAIN, "arg": EI_ERR_ARG,
          "geometry": EI_ERR_GEOMETRY, "insecure": EI_ERR_INSECURE, "abi": EI_ERR_ABI, "protocol": EI_ERR_PROTOCOL,
          "refused": EI_ERR_REFUSED, "truncated": EI_ERR_TRUNCATED, "magic": EI_ERR_MAGIC, "sys": EI_ERR_SYS,
          "corrupt": EI_ERR_CORRUPT, "short": EI_ERR_SHORT, "closed": EI_ERR_CLOSED}
# A result record's payload words (abi.h): abi/vocabulary.py restates them for code that runs without this
# module, and tests/unit/test_abi_constants.py checks each restated value against these.
PAYLOAD_KINDS = {"none": EI_KIND_NONE, "classification": EI_KIND_CLASSIFICATION, "detection": EI_KIND_DETECTION,
                 "raw": EI_KIND_RAW, "tensors": EI_KIND_TENSORS}
TENSOR_DESC = {"size": sizeof(ei_tensor_desc), "name_len": EI_TENSOR_NAME_LEN, "max_dims": EI_TENSOR_MAX_DIMS,
               "align": EI_TENSOR_ALIGN, "index": EI_TENSOR_OFF_INDEX, "dtype": EI_TENSOR_OFF_DTYPE,
               "ndim": EI_TENSOR_OFF_NDIM, "dims": EI_TENSOR_OFF_DIMS}
# Frame acquisition outcomes other than a frame (FrameConsumer.status after take()).
TAKE_SHORT = EI_ERR_SHORT
TAKE_CORRUPT = EI_ERR_CORRUPT


# ---------------------------------------------------------------- errors

class RingError(Exception):
    """Base of every ring and handover error. `code` is the ring.h status."""
    code = EI_ERR_SYS

class TruncatedRing(RingError):
    """The ring is smaller than its header or its geometry."""

class BadMagic(RingError):
    """Not an edgeinfer ring of the expected kind."""

class AbiMismatch(RingError):
    """An ABI version this build does not understand."""

class BadGeometry(RingError):
    """Geometry fields inconsistent, out of bounds, or a ring of the wrong size."""

class InsecureRing(RingError, PermissionError):
    """Not a sealed memfd, or sealed/opened so that the protocol cannot hold."""

class AccessDenied(RingError, PermissionError):
    """The peer may not produce / read this stream (or may not use the socket)."""

class StreamBusy(RingError):
    """The stream already has its producer (transient)."""

class TryAgain(RingError):
    """Nothing yet, or the daemon is saturated with handshakes (transient)."""

class NoSpaceForRing(RingError, OSError):
    """No memory for the ring's pages."""

class BadArgument(RingError, ValueError):
    """A bad argument (including an unknown stream, in the daemon's words)."""

class DaemonUnavailable(RingError, ConnectionError):
    """No edgeinferd listens on the socket."""

class CorruptFrame(RingError):
    """A producer-written number failed its check; the frame was skipped."""

class RingStateError(RingError):
    """A call out of order, e.g. acquiring while already holding a frame."""

class ProtocolError(RingError):
    """A malformed handshake message."""

class ConnectionClosed(RingError, ConnectionError):
    """The peer closed the connection."""

class HandshakeTimeout(RingError, TimeoutError):
    """No answer in time."""

class Refused(RingError):
    """The daemon refused for a reason of its own (e.g. it cannot serve the geometry)."""

class CorruptRing(RingError):
    """A result ring's head went backwards or beyond any honest value."""

_ERRORS = {
    EI_ERR_TRUNCATED: TruncatedRing, EI_ERR_MAGIC: BadMagic, EI_ERR_ABI: AbiMismatch, EI_ERR_GEOMETRY: BadGeometry,
    EI_ERR_INSECURE: InsecureRing, EI_ERR_DENIED: AccessDenied, EI_ERR_BUSY: StreamBusy, EI_ERR_AGAIN: TryAgain,
    EI_ERR_NOSPACE: NoSpaceForRing, EI_ERR_ARG: BadArgument, EI_ERR_NOT_FOUND: DaemonUnavailable,
    EI_ERR_CORRUPT: CorruptFrame, EI_ERR_STATE: RingStateError, EI_ERR_SHORT: CorruptFrame,
    EI_ERR_PROTOCOL: ProtocolError, EI_ERR_CLOSED: ConnectionClosed, EI_ERR_TIMEOUT: HandshakeTimeout,
    EI_ERR_REFUSED: Refused, EI_ERR_WOULDBLOCK: TryAgain,
}
for _code, _cls in _ERRORS.items():
    if _cls.__dict__.get("code") is None:
        _cls.code = _code


def error_for(int code, str msg):
    """The exception ring.h's status `code` stands for, carrying `msg` (and nothing else: str(e) == msg)."""
    e = _ERRORS.get(code, RingError)(msg)
    e.code = code
    return e


cdef object _raise(ei_error *err):
    msg = err.msg.decode("utf-8", "replace")
    if err.code == EI_ERR_SYS:
        e = OSError(err.sys_errno, msg)
        raise e
    raise error_for(err.code, msg)


cdef bytes _fs(str s):
    return s.encode("utf-8")


cdef int _dup(int fd) except -1:
    cdef int d = fcntl(fd, F_DUPFD_CLOEXEC, 3)
    if d < 0:
        raise OSError(errno, f"dup of fd {fd}: {os.strerror(errno)}")
    return d


def stream_name_ok(str name):
    """ring.h's rule for stream names: 1..64 of [A-Za-z0-9_-], starting alphanumeric."""
    b = name.encode("utf-8", "replace")
    return ei_stream_name_ok(b, len(b)) == 1


def sigbus_absorbed():
    """SIGBUS faults absorbed in this process (defence in depth: a sealed ring cannot shrink)."""
    return ei_guard_hits()


def monotonic_ns():
    """CLOCK_MONOTONIC, the capture clock of the ABI."""
    return ei_now_ns(1)


def frame_payload_len(uint32_t pixel_format, uint32_t width, uint32_t height, uint32_t row_stride=0):
    """ring.h's ei_frame_payload_len: the bytes of one whole frame (a slot's payload_len); row_stride 0 = packed.
    0 for an unknown pixel format."""
    return ei_frame_payload_len(pixel_format, width, height, row_stride)


def errno_transient(int e):
    """ring.h's ei_errno_transient: a failed system call's errno that passes by itself (EINTR, EAGAIN, ENOMEM,
    ENOBUFS, EMFILE, ENFILE)."""
    return ei_errno_transient(e) != 0


# ---------------------------------------------------------------- memory

cdef class _Mapping:
    """Owns one mmap of a ring and an fd of it. The memory is unmapped only
    when the last object referring to it (producer, consumer, numpy view) is
    gone, so a view can never outlive its memory; the fd can be dropped
    earlier with close_fd()."""
    cdef uint8_t *base   # owns: the mapping
    cdef size_t size     # bytes mapped
    cdef int fd          # owns: an fd of the ring (a memfd), -1 once closed
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
        # YUV 4:2:0: the chroma rows follow the Y rows (packed), so (rows, W, 1) covers the whole frame.
        img = np.ndarray(shape=(l.rows, l.width, l.channels), dtype=np.uint8, buffer=reg,
                         strides=(l.row_stride, l.channels, 1))
        images.append(img)
        batches.append(img[None])
        flats.append(flat)
    return tuple(images), tuple(batches), tuple(flats)


cdef dict _layout_dict(const ei_frame_layout *l):
    return dict(width=l.width, height=l.height, channels=l.channels, pixel_format=l.pixel_format,
                colorimetry=l.colorimetry, rows=l.rows,
                row_stride=l.row_stride, slot_count=l.slot_count, slot_stride=l.slot_stride,
                payload_capacity=l.payload_capacity, total_size=l.total_size, frame_bytes=ei_frame_bytes(l))


# ---------------------------------------------------------------- frame ring: producer

cdef class FrameProducer:
    """The producer end of a frame ring (ei_frame_producer) and, once
    connect() was called, its connection to the daemon (ei_ingress)."""
    cdef ei_frame_producer p   # the C producer; p.base/p.fd are handed to `mapping`
    cdef ei_ingress inc        # the connection to the daemon; inc.ring_fd borrows mapping.fd
    cdef bint connecting       # connect() was called: publish() advances `inc`
    cdef _Mapping mapping      # owns the memory and the memfd
    cdef readonly tuple images # writable (H, W, C) view per slot
    cdef readonly tuple flats  # writable flat view per slot (for readinto)
    cdef readonly str label
    cdef bint closed

    def __cinit__(self, str label, uint32_t width, uint32_t height, uint32_t pixel_format, uint32_t row_stride=0,
                  uint32_t slots=4, uint32_t colorimetry=0):
        cdef ei_error err
        cdef ei_frame_geometry g
        g.colorimetry = colorimetry
        g.width = width
        g.height = height
        g.pixel_format = pixel_format
        g.row_stride = row_stride
        g.slot_count = slots
        blabel = _fs(label)
        cdef const char *clabel = blabel
        cdef int rc
        self.inc.sock = -1
        with nogil:
            rc = ei_frame_producer_create(&self.p, clabel, &g, &err)
        if rc != EI_OK:
            _raise(&err)
        self.label = label
        self.mapping = _adopt(self.p.base, <size_t>self.p.layout.total_size, self.p.fd)
        self.images, _, self.flats = _slot_views(self.mapping, &self.p.layout, False)

    @property
    def layout(self):
        return _layout_dict(&self.p.layout)

    @property
    def fd(self):
        """The ring's sealed memfd (still ours: dup it to keep it)."""
        return self.mapping.fd

    @property
    def next_seq(self):
        return self.p.next_seq

    def begin(self):
        """Reserves a free slot (never blocks) and returns its index."""
        if self.closed:
            raise RingStateError(f"{self.label}: producer is closed")
        ei_frame_producer_begin(&self.p)
        return self.p.writing

    def publish(self, uint64_t capture_mono_ns, uint64_t capture_real_ns, uint64_t frame_id,
                uint64_t payload_len, bint checked=True):
        """Publishes the reserved slot; returns the frame's seq. Then advances the
        connection to the daemon by whatever is due (never blocks). A payload_len
        that is not the frame's length is refused (BadArgument; the slot stays
        reserved). checked=False publishes it anyway: only for tests that play a
        broken producer against the daemon's own check."""
        if self.closed or self.p.writing == EI_NO_SLOT:
            raise RingStateError(f"{self.label}: publish() without begin()")
        cdef int64_t seq
        if checked:
            seq = ei_frame_producer_publish(&self.p, capture_mono_ns, capture_real_ns, frame_id, payload_len)
        else:
            seq = ei__frame_producer_commit(&self.p, capture_mono_ns, capture_real_ns, frame_id, payload_len)
        if seq == EI_ERR_ARG:
            raise BadArgument(f"{self.label}: payload_len {payload_len} is not the frame's length, "
                              f"{ei_frame_bytes(&self.p.layout)} bytes (ei_frame_payload_len): nothing published")
        if seq < 0:
            raise error_for(<int>seq, f"{self.label}: publish refused (status {seq})")
        if self.connecting:
            ei_ingress_step(&self.inc, ei_now_ns(1))
        return seq

    # -- the connection to the daemon (ABI 2 handover)

    def connect(self, str socket_path, str stream):
        """Starts handing the ring to the daemon on `socket_path` as `stream`;
        step()/publish() advance it, wait_connected() blocks for it."""
        cdef ei_error err
        if self.closed:
            raise RingStateError(f"{self.label}: producer is closed")
        ei_ingress_close(&self.inc)
        bpath = _fs(socket_path)
        bstream = _fs(stream)
        if ei_ingress_init(&self.inc, bpath, bstream, self.mapping.fd, &err) != EI_OK:
            self.inc.sock = -1
            _raise(&err)
        self.connecting = True

    def step(self):
        """Advances the connection (never blocks); returns its state name."""
        if not self.connecting:
            return "disconnected"
        return INGRESS_STATES[ei_ingress_step(&self.inc, ei_now_ns(1))]

    def wait_connected(self, double timeout):
        """Blocks (GIL released) up to `timeout` s for the daemon to accept the
        ring; raises the refusal or the last failure."""
        cdef ei_error err
        cdef int rc
        cdef uint64_t t = <uint64_t>(timeout * 1e9) if timeout > 0 else 0
        if not self.connecting:
            raise RingStateError(f"{self.label}: connect() first")
        with nogil:
            rc = ei_ingress_wait(&self.inc, t, &err)
        if rc != EI_OK:
            _raise(&err)

    @property
    def connection_state(self):
        """disconnected | handshake | connected (cheap: no dict)."""
        return INGRESS_STATES[self.inc.state] if self.connecting else "disconnected"

    @property
    def connection(self):
        """state, last_status, last_error (the daemon's words), accepted, attempts."""
        return dict(state=INGRESS_STATES[self.inc.state] if self.connecting else "disconnected",
                    last_status=self.inc.last_status,
                    last_error=self.inc.last_msg.decode("utf-8", "replace") if self.inc.last_status else None,
                    accepted=self.inc.accepted, attempts=self.inc.attempts)

    def close(self):
        """Marks the ring closed (the daemon sees it at once), drops the
        connection and the memfd. The memory stays mapped while views exist."""
        if self.closed:
            return
        self.closed = True
        ei_frame_producer_retire(&self.p)
        ei_ingress_close(&self.inc)
        self.connecting = False
        self.mapping.close_fd()

    def __dealloc__(self):
        ei_ingress_close(&self.inc)


# ---------------------------------------------------------------- frame ring: consumer

cdef class Frame:
    """The frame a consumer holds: a zero-copy, read-only view of one slot plus
    its metadata. Its views (array, batch, flat, data) are valid until release()
    (or the end of a `with` block); after it they raise RingStateError, because
    the producer may already be rewriting the slot. The metadata stays readable.
    The consumer reuses this one object for every frame, so acquiring allocates
    nothing; copy out what must outlive the hold (a view taken out before
    release() still points at the slot: that is the caller's contract)."""
    cdef FrameConsumer owner                 # the consumer holding the slot
    cdef object _array                       # (rows, width, channels) uint8 view of the slot; None once released
    cdef object _batch                       # the same as a batch of one: (1, height, width, channels)
    cdef object _flat                        # the whole payload area as a flat uint8 view
    cdef readonly uint64_t seq               # frame sequence number in this ring
    cdef readonly uint64_t frame_id          # producer's own frame number
    cdef readonly uint64_t capture_ns        # CLOCK_MONOTONIC at capture (the producer's word)
    cdef readonly uint64_t capture_realtime_ns  # CLOCK_REALTIME at capture
    cdef readonly uint64_t arrival_ns        # when the consumer first saw it pending (its own clock)
    cdef readonly uint64_t payload_len       # bytes the producer declared
    cdef readonly uint32_t slot              # slot index
    cdef readonly int64_t skipped            # frames published since the previous one taken

    cdef object _view(self, object v):
        if v is None:
            raise RingStateError(f"frame {self.seq} released: its views are gone (copy out before release())")
        return v

    @property
    def array(self):
        return self._view(self._array)

    @property
    def batch(self):
        return self._view(self._batch)

    @property
    def flat(self):
        return self._view(self._flat)

    @property
    def data(self):
        """The payload bytes the producer declared (payload_len)."""
        return memoryview(self._view(self._flat))[:self.payload_len]

    cdef void _drop_views(self):
        self._array = self._batch = self._flat = None

    def release(self):
        if self.owner is not None:  # None once the consumer is closed (it released everything then)
            self.owner.release()   # drops our views too

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


cdef class FrameConsumer:
    """The one consumer of a frame ring (ei_frame_consumer), from an fd a
    producer handed over. The fd is checked (a sealed memfd of the declared
    size, open read-write) before anything is mapped."""
    cdef ei_frame_consumer c    # the C consumer; borrows mapping.base
    cdef ei_frame_info info     # metadata of the frame held (or refused)
    cdef Frame frame            # the one Frame object handed out for every acquire
    cdef _Mapping mapping       # owns the memory and our duplicate of the fd
    cdef readonly int status    # outcome of the last take() that returned None: 0, TAKE_SHORT, TAKE_CORRUPT
    cdef readonly uint64_t frame_bytes  # a whole frame's length (ei_frame_bytes): what payload_len must say
    cdef readonly int64_t skipped  # frames skipped before the last frame taken (or refused as short)
    cdef readonly tuple images  # read-only (H, W, C) view per slot
    cdef readonly tuple batches # read-only (1, H, W, C) view per slot
    cdef readonly tuple flats   # read-only flat view per slot
    cdef readonly str name
    cdef ei_lane_view lane      # with a dispatch-table cursor (share()): lanes take turns on this ring
    cdef object table           # keeps the dispatch table's memory alive while `lane` points into it
    cdef readonly bint shared   # share() was called: readiness and claims go through the cursor
    cdef ei_wake_guard guard    # wake-up spam defence for this ring, kept across waits (edgeinfer/client.h)

    def __cinit__(self, int fd, str name, uint64_t max_size=(<uint64_t>1) << 40, bint join=False):
        cdef ei_error err
        cdef uint64_t size
        cdef uint8_t *base
        cdef int rc
        cdef int mine
        bname = _fs(name)
        cdef const char *cname = bname
        rc = ei_ring_fd_check(fd, cname, EI_FRAME_SEALS, F_SEAL_WRITE | F_SEAL_FUTURE_WRITE, 1, max_size, &size,
                              &err)
        if rc != EI_OK:
            _raise(&err)
        mine = _dup(fd)
        rc = ei_ring_map(mine, size, 1, cname, &base, &err)
        if rc != EI_OK:
            close(mine)
            _raise(&err)
        self.name = name
        self.mapping = _adopt(base, <size_t>size, mine)
        # Guarded before the header is read (defence in depth: the seals already forbid shrinking).
        self.mapping.guard = ei_guard_add(base, <size_t>size)
        if self.mapping.guard < 0:
            raise RingError(f"{name}: cannot guard the mapping: {os.strerror(errno)}")
        with nogil:
            if join:  # another lane (process) already consumes it: keep the consumer's shared line as it is
                rc = ei_frame_consumer_join(&self.c, base, size, cname, &err)
            else:
                rc = ei_frame_consumer_init(&self.c, base, size, cname, &err)
        if rc != EI_OK:
            _raise(&err)
        self.images, self.batches, self.flats = _slot_views(self.mapping, &self.c.layout, True)
        self.frame_bytes = ei_frame_bytes(&self.c.layout)
        self.frame = Frame.__new__(Frame)
        self.frame.owner = self

    @property
    def layout(self):
        return _layout_dict(&self.c.layout)

    @property
    def fd(self):
        """Our duplicate of the ring's memfd (for systemd's fd store)."""
        return self.mapping.fd

    @property
    def flags(self):
        return self.c.hdr.flags

    @property
    def closed(self):
        """The producer closed the ring cleanly."""
        return (self.c.hdr.flags & EI_RING_CLOSED) != 0

    @property
    def producer_pid(self):
        return self.c.hdr.producer_pid

    @property
    def last_seq(self):
        return self.c.last_seq

    @property
    def short_len(self):
        """The payload_len of the last frame refused as short (status TAKE_SHORT); against frame_bytes."""
        return self.info.payload_len

    @property
    def pending_since_ns(self):
        """When news not yet taken was first seen (the daemon's clock; by any lane once shared); 0 if none."""
        if self.shared:
            return ei_lane_pending_since(&self.lane)
        return self.c.pending_since_ns

    # -------------------------------------------------- lanes taking turns (lanes.h)

    def share(self, table, Py_ssize_t offset, uint32_t epoch, Py_ssize_t outcomes=-1, uint32_t n_outcomes=0):
        """Consume through the cursor at `offset` of the writable dispatch table (a buffer shared with the
        other lanes), for the producer generation `epoch`. `outcomes`: the offset in the table of the stream's
        `n_outcomes` int64 outcome counters, for the cursor's journal (lanes.h ei_lane_consumed): what a lane
        that dies holding a frame owes is settled from it."""
        cdef uint8_t[::1] view = table
        if offset < 0 or <size_t>offset + EI_CURSOR_SIZE > <size_t>view.shape[0] or offset % 64:
            raise ValueError(f"cursor offset {offset} outside the table or not cache-line aligned")
        if outcomes >= 0 and (<size_t>outcomes + 8 * <size_t>n_outcomes > <size_t>view.shape[0] or outcomes % 8):
            raise ValueError(f"outcome counters at {outcomes} outside the table or not aligned")
        self.table = table
        self.lane.c = &self.c
        self.lane.cur = <ei_stream_cursor *>&view[offset]
        self.lane.epoch = epoch
        self.lane.outcomes = <const int64_t *>&view[outcomes] if outcomes >= 0 else NULL
        self.lane.n_outcomes = n_outcomes if outcomes >= 0 else 0
        self.shared = True

    @property
    def owed_total(self):
        """The stream's outcome total once the last frame consumed (and those skipped before it) is counted."""
        return ei_lane_owed_total(&self.lane) if self.shared else 0

    def claim(self, uint32_t lane_id):
        """True if this lane now serves the stream alone (until unclaim())."""
        return ei_lane_claim(&self.lane, &self.c, lane_id) == 1

    def unclaim(self):
        """Stores the consumer state and frees the stream; True if it already has news again."""
        return ei_lane_unclaim(&self.lane, &self.c) == 1

    @property
    def owner(self):
        """Lane id serving the stream now, 0 if none (shared consumers only)."""
        return self.lane.cur.owner if self.shared else 0

    @property
    def passed_over(self):
        return ei_lane_passed_over(&self.lane)

    def pass_over(self):
        ei_lane_pass_over(&self.lane)

    def picked(self):
        ei_lane_picked(&self.lane)

    @property
    def counters(self):
        h = self.c.hdr
        return dict(published=h.published, producer_backoffs=h.producer_backoffs, claims=h.claims,
                    claim_retries=h.claim_retries, consumed=h.consumed)

    def acknowledge_flags(self):
        """Marks the current flags as seen, so ready() stops reporting them."""
        self.c.seen_flags = self.c.hdr.flags
        return self.c.seen_flags

    @property
    def truncated(self):
        """True if the mapping lost pages (sigbus_guard.h): impossible for a sealed ring; checked anyway."""
        return ei_guard_hit(self.mapping.guard) != 0

    def ready(self):
        if self.shared:
            return ei_lane_ready(&self.lane) != 0
        return ei_frame_consumer_ready(&self.c) != 0

    def has_frame(self):
        """A `latest` word not taken yet is published."""
        cdef uint64_t latest = self.c.hdr.latest
        return latest != 0 and latest != self.c.seen_latest

    def take(self):
        """Claims the newest frame if `latest` changed since the last take; returns
        the Frame, or None (self.status says why: 0 nothing new, TAKE_SHORT, TAKE_CORRUPT)."""
        if self.frame.owner is None:
            raise RingStateError(f"{self.name}: take() after close()")
        cdef uint64_t before = self.c.last_seq
        cdef uint64_t before_latest = self.c.seen_latest
        cdef int rc = ei_frame_consumer_acquire(&self.c, &self.info)
        cdef Frame f
        if rc == 1 or rc == EI_ERR_SHORT:
            self.skipped = <int64_t>(self.info.seq - before) - 1 if self.info.seq > before else 0
        if self.shared and self.c.seen_latest != before_latest:
            # Consumed: the caller counts one outcome for it, and (taken or short) the frames skipped before it.
            ei_lane_consumed(&self.lane, &self.c,
                             1 + (<uint64_t>self.skipped if rc == 1 or rc == EI_ERR_SHORT else 0))
        if rc == 1:
            self.status = 0
            f = self.frame
            f._array = self.images[self.info.slot]  # preallocated per slot: handing them out allocates nothing
            f._batch = self.batches[self.info.slot]
            f._flat = self.flats[self.info.slot]
            f.seq = self.info.seq
            f.frame_id = self.info.frame_id
            f.capture_ns = self.info.capture_mono_ns
            f.capture_realtime_ns = self.info.capture_real_ns
            f.arrival_ns = self.info.pending_since_ns or ei_now_ns(1)  # taken without a wait: now
            f.payload_len = self.info.payload_len
            f.slot = self.info.slot
            f.skipped = self.skipped
            return f
        if rc == EI_ERR_STATE:
            raise RingStateError(f"{self.name}: acquire() while a frame is held; release it first")
        self.status = rc  # 0 (nothing new), EI_ERR_SHORT or EI_ERR_CORRUPT
        return None

    def release(self):
        self.frame._drop_views()  # the slot is the producer's again: the Frame must not reach it
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
        """Releases any held frame and our fd; memory stays mapped while views exist. The Frame lets go
        of us: its back reference made a cycle that kept every closed ring mapped until a full gc."""
        self.frame._drop_views()
        ei_frame_consumer_release(&self.c)
        self.mapping.close_fd()
        self.frame.owner = None


# ---------------------------------------------------------------- waiting

cdef class Doorbell:
    """A doorbell (doorbell.h) a WaitSet can sleep on next to its rings: ring()
    from any thread wakes the waiter. Process-private by default; given a
    writable shared buffer (the lanes' dispatch table), any process mapping it
    can ring it."""
    cdef ei_doorbell own   # the futex word and the pending flag, when not in a shared buffer
    cdef ei_doorbell *bell # borrowed: &own, or a place in `table`
    cdef object table      # keeps the shared buffer alive while `bell` points into it

    def __cinit__(self, table=None, Py_ssize_t offset=0):
        cdef uint8_t[::1] view
        if table is None:
            self.bell = &self.own
            return
        view = table
        if offset < 0 or offset + 64 > view.shape[0] or offset % 64:
            raise ValueError(f"doorbell offset {offset} outside the table or not cache-line aligned")
        self.table = table
        self.bell = <ei_doorbell *>&view[offset]

    def ring(self):
        ei_doorbell_ring(self.bell)

    def take(self):
        """True if ring() was called since the last take()."""
        return ei_doorbell_take(self.bell) != 0


cdef class WaitSet:
    """Preallocated waiting room for up to EI_MAX_WAIT rings: wait() builds
    the C array in place and sleeps with the GIL released."""
    cdef ei_waitable w[65]     # filled per call from the current consumers (+ a doorbell)
    cdef uint64_t mutes[64]    # each frame consumer's guard.mutes before the call
    cdef readonly uint64_t muted  # bit n: consumers[n]'s doorbell was muted during the last wait()

    def wait(self, consumers, double timeout, double spin=0.0, bint use_waitv=True, Doorbell bell=None):
        """Sleeps until one of `consumers` (FrameConsumer or ResultConsumer) is
        ready, or `bell` rings; returns a bitmask of the ready consumers (bit n
        for the bell, n = len(consumers)), 0 on timeout. Frame consumers that
        are ready note their arrival time."""
        cdef uint32_t n = len(consumers)
        cdef uint32_t i, total
        cdef uint64_t mask, now
        cdef uint64_t timeout_ns = <uint64_t>(timeout * 1e9) if timeout > 0 else 0
        cdef uint64_t spin_ns = <uint64_t>(spin * 1e9) if spin > 0 else 0
        if n + (bell is not None) > EI_MAX_WAIT:  # ei_wait_any would return 0 at once: a lane spinning, serving none
            raise ValueError(f"can wait on at most {EI_MAX_WAIT} rings at once (a doorbell counts), got "
                             f"{n + (bell is not None)}")
        for i in range(n):
            obj = consumers[i]
            if isinstance(obj, FrameConsumer) and (<FrameConsumer>obj).shared:
                self.w[i] = ei_lane_waitable(&(<FrameConsumer>obj).lane)
            elif isinstance(obj, FrameConsumer):
                self.w[i] = ei_frame_waitable(&(<FrameConsumer>obj).c)
            else:
                self.w[i] = ei_result_waitable(&(<ResultConsumer?>obj).r)
            if isinstance(obj, FrameConsumer):  # a camera's ring: its doorbell may be rung without news
                self.w[i].guard = &(<FrameConsumer>obj).guard
                self.mutes[i] = (<FrameConsumer>obj).guard.mutes
        total = n
        if bell is not None:
            self.w[n] = ei_doorbell_waitable(bell.bell)
            total = n + 1
        with nogil:
            mask = ei_wait_any(self.w, total, timeout_ns, spin_ns, use_waitv)
        self.muted = 0
        for i in range(n):
            if self.w[i].guard != NULL and self.w[i].guard.mutes != self.mutes[i]:
                self.muted |= (<uint64_t>1) << i
        if mask:
            now = ei_now_ns(1)
            for i in range(n):
                if mask >> i & 1 and isinstance(consumers[i], FrameConsumer):
                    if (<FrameConsumer>consumers[i]).shared:
                        ei_lane_note(&(<FrameConsumer>consumers[i]).lane, now)
                    else:
                        ei_frame_consumer_note(&(<FrameConsumer>consumers[i]).c, now)
        return mask


# ---------------------------------------------------------------- result ring

cdef class ResultProducer:
    """The one writer of a result ring (ei_result_writer): a memfd, sealed so
    that every mapping made after ours is read-only."""
    cdef ei_result_writer wr   # the C writer; wr.base/wr.fd are handed to `mapping`
    cdef _Mapping mapping      # owns the memory and the memfd
    cdef readonly str label
    cdef bint closed

    def __cinit__(self, str label, uint32_t records, uint64_t payload_capacity, uint32_t generation=1):
        cdef ei_error err
        blabel = _fs(label)
        cdef const char *clabel = blabel
        cdef int rc
        with nogil:
            rc = ei_result_writer_create(&self.wr, clabel, records, payload_capacity, generation, &err)
        if rc != EI_OK:
            _raise(&err)
        self.label = label
        self.mapping = _adopt(self.wr.base, <size_t>self.wr.layout.total_size, self.wr.fd)

    @property
    def fd(self):
        """The sealed memfd to hand to readers (still ours)."""
        return self.mapping.fd

    @property
    def payload_capacity(self):
        return self.wr.layout.payload_capacity

    @property
    def record_count(self):
        return self.wr.layout.record_count

    @property
    def head(self):
        return self.wr.head

    def set_wake(self, bint wake):
        """FUTEX_WAKE on every commit (while readers are connected) or never."""
        self.wr.wake = 1 if wake else 0

    def drop_fd(self):
        """Closes this process's fd of the ring and keeps the mapping (the lanes' zygote: lanes write through
        the mapping they inherit and need no fd)."""
        self.mapping.close_fd()

    def resume(self):
        """Continue from the ring's head: lanes (forked processes sharing this writer's one writable mapping)
        take turns writing a stream's records."""
        ei_result_writer_resume(&self.wr)

    def write(self, uint64_t frame_seq, uint64_t frame_id, uint64_t capture_mono_ns, uint64_t capture_real_ns,
              uint64_t start_mono_ns, uint64_t done_mono_ns, uint32_t status, uint32_t payload_kind,
              object payload, uint32_t item_count, bytes model_name, bytes model_version,
              uint32_t frame_width=0, uint32_t frame_height=0):
        """Writes one record; returns its number. payload: any C-contiguous buffer (bytes, a numpy array of any
        dtype: its bytes as they lie, with no reshape or view made per record), or None; it must fit the
        capacity."""
        if self.closed:
            raise RingStateError(f"{self.label}: writer is closed")
        cdef Py_buffer view
        view.buf, view.len = NULL, 0
        if payload is not None:
            PyObject_GetBuffer(payload, &view, PyBUF_C_CONTIGUOUS)
        try:
            return self._write(frame_seq, frame_id, capture_mono_ns, capture_real_ns, start_mono_ns, done_mono_ns,
                               status, payload_kind, <const uint8_t *>view.buf, view.len, item_count, model_name,
                               model_version, frame_width, frame_height)
        finally:
            if payload is not None:
                PyBuffer_Release(&view)

    cdef uint64_t _write(self, uint64_t frame_seq, uint64_t frame_id, uint64_t capture_mono_ns,
                         uint64_t capture_real_ns, uint64_t start_mono_ns, uint64_t done_mono_ns, uint32_t status,
                         uint32_t payload_kind, const uint8_t *payload, Py_ssize_t n, uint32_t item_count,
                         bytes model_name, bytes model_version, uint32_t frame_width, uint32_t frame_height) except? 0:
        if <uint64_t>n > self.wr.layout.payload_capacity:
            raise ValueError(f"{self.label}: payload of {n} bytes exceeds the record capacity "
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
        r.frame_width = frame_width
        r.frame_height = frame_height
        memset(r.model_name, 0, EI_MODEL_NAME_LEN)
        memset(r.model_version, 0, EI_MODEL_VERSION_LEN)
        memcpy(r.model_name, <const char *>model_name, min(len(model_name), EI_MODEL_NAME_LEN))
        memcpy(r.model_version, <const char *>model_version, min(len(model_version), EI_MODEL_VERSION_LEN))
        if n:
            memcpy(ei_result_payload(r), payload, n)
        return ei_result_writer_commit(&self.wr, r)

    def close(self):
        """Marks the ring closed and wakes its readers; drops the memfd."""
        if self.closed:
            return
        self.closed = True
        ei_result_writer_retire(&self.wr)
        self.mapping.close_fd()

    def __dealloc__(self):
        if not self.closed and self.wr.base != NULL:
            ei_result_writer_retire(&self.wr)


cdef class ResultConsumer:
    """One of any number of readers of a result ring (ei_result_reader), from
    the fd the daemon handed over: checked (sealed read-only for every later
    mapping) and mapped read-only. A reader writes no shared memory."""
    cdef ei_result_reader r     # the C reader; borrows mapping.base
    cdef ei_result_record_header rec  # last record copied out
    cdef _Mapping mapping       # owns the read-only memory and our duplicate of the fd
    cdef bytearray scratch      # payload copy target, sized to the capacity once
    cdef readonly str name

    def __cinit__(self, int fd, str name, bint from_oldest=False):
        cdef ei_error err
        cdef uint64_t size
        cdef uint8_t *base
        cdef int rc
        cdef int mine
        bname = _fs(name)
        cdef const char *cname = bname
        rc = ei_ring_fd_check(fd, cname, EI_RESULT_SEALS, 0, 0, (<uint64_t>1) << 46, &size, &err)
        if rc != EI_OK:
            _raise(&err)
        mine = _dup(fd)
        rc = ei_ring_map(mine, size, 0, cname, &base, &err)
        if rc != EI_OK:
            close(mine)
            _raise(&err)
        self.name = name
        self.mapping = _adopt(base, <size_t>size, mine)
        rc = ei_result_reader_init(&self.r, base, size, cname, from_oldest, &err)
        if rc != EI_OK:
            _raise(&err)
        self.scratch = bytearray(max(<Py_ssize_t>self.r.layout.payload_capacity, 1))

    @property
    def flags(self):
        return self.r.hdr.flags

    @property
    def closed(self):
        return (self.r.hdr.flags & EI_RING_CLOSED) != 0

    @property
    def missed(self):
        return self.r.missed

    @property
    def head(self):
        return self.r.hdr.head

    @property
    def generation(self):
        return self.r.hdr.generation

    @property
    def payload_capacity(self):
        return self.r.layout.payload_capacity

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
        if got == EI_ERR_BUFFER:  # cannot happen: the scratch is the ring's capacity; said, never cut silently
            raise RingError(f"{self.name}: record {self.r.next - 1} has {self.rec.payload_len} payload bytes, more "
                            f"than the ring's capacity {self.r.layout.payload_capacity}")
        if got < 0:
            raise CorruptRing(f"{self.name}: result ring head {self.r.hdr.head} is corrupt (went backwards from "
                              f"{self.r.next - 1}, or beyond {EI_MAX_RECORD_NUMBER})")
        if not got:
            return None
        rec = self.rec
        fields = (self.r.next - 1, rec.frame_seq, rec.frame_id, rec.capture_mono_ns, rec.capture_real_ns,
                  rec.start_mono_ns, rec.done_mono_ns, rec.status, rec.payload_kind, rec.item_count,
                  PyBytes_FromStringAndSize(rec.model_name, EI_MODEL_NAME_LEN).rstrip(b"\0"),
                  PyBytes_FromStringAndSize(rec.model_version, EI_MODEL_VERSION_LEN).rstrip(b"\0"),
                  rec.frame_width, rec.frame_height)
        return fields, bytes(self.scratch[:rec.payload_len]), missed

    def close(self):
        self.mapping.close_fd()


# ---------------------------------------------------------------- the handshake (daemon side)

def recv_hello(int sock, list dispose=None):
    """One hello from a client, without blocking: (role, stream, fd or -1), or
    None if nothing has arrived yet. The caller owns the fd. Raises
    ProtocolError / AbiMismatch / BadArgument and ConnectionClosed. Every other
    fd that came with the message (and the fd of a hello refused here) is
    appended to `dispose`, for the caller to close where a close that blocks
    cannot stall it (a peer can send a socket whose close lingers); without
    `dispose`, each is closed here by ei_fd_close_received. The receive runs
    without the GIL."""
    cdef ei_hello h
    cdef ei_error err
    cdef int fds[EI_SOCK_MAX_FDS]
    cdef int nfds = 0, i, keep = 0
    cdef char stream[EI_STREAM_NAME_MAX + 1]
    cdef int rc
    with nogil:
        rc = ei_sock_recv_fds(sock, &h, sizeof(h), fds, &nfds, &err)
    if rc == EI_OK and nfds <= 1:
        rc = ei_hello_check(&h, stream, &err)
        keep = 1 if rc == EI_OK and nfds == 1 else 0
    for i in range(keep, nfds):
        if dispose is None:
            with nogil:
                ei_fd_close_received(fds[i])
        else:
            dispose.append(fds[i])
    if rc == EI_ERR_WOULDBLOCK:
        return None
    if rc != EI_OK:
        _raise(&err)
    if nfds > 1:
        raise error_for(EI_ERR_PROTOCOL, f"malformed message (more fds than one: {nfds} fds)")
    return h.role, stream[:strlen(stream)].decode("ascii"), (fds[0] if keep else -1)


def send_reply(int sock, int status, str msg="", int fd=-1):
    """The daemon's answer (with fd attached when fd >= 0). Never blocks; raises
    TryAgain when the client's buffer is full and ConnectionClosed when it left."""
    cdef ei_error err
    bmsg = msg.encode("utf-8", "replace")[:EI_MSG_LEN - 1]
    if ei_reply_send(sock, status, bmsg, fd, &err) != EI_OK:
        _raise(&err)


def peer_cred(int sock):
    """(uid, gid, pid) of the peer, as the kernel recorded them at connect()."""
    cdef uint32_t uid = 0, gid = 0
    cdef int32_t pid = 0
    cdef ei_error err
    if ei_peer_cred(sock, &uid, &gid, &pid, &err) != EI_OK:
        _raise(&err)
    return uid, gid, pid


def sock_alive(int sock):
    """True while the peer keeps the connection open (and has not said goodbye)."""
    return ei_sock_alive(sock) == 1


# ---------------------------------------------------------------- the handshake (reader side)

def results_connect(str socket_path, str stream, double timeout):
    """Asks the daemon for `stream`'s result ring: (connection fd, ring fd), both
    the caller's. Raises the daemon's refusal, DaemonUnavailable or HandshakeTimeout."""
    cdef ei_error err
    cdef int sock, ring_fd, rc
    cdef uint64_t t = <uint64_t>(timeout * 1e9) if timeout > 0 else 0
    bpath = _fs(socket_path)
    bstream = _fs(stream)
    cdef const char *cpath = bpath
    cdef const char *cstream = bstream
    with nogil:
        rc = ei_results_connect(cpath, cstream, t, &sock, &ring_fd, &err)
    if rc != EI_OK:
        _raise(&err)
    return sock, ring_fd
