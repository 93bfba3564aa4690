# Cython view of native/include/edgeinfer/ring.h (named after the header it
# declares, as pyzmq's libzmq.pxd) and of the daemon-internal headers in
# native/: the headers are the single source of truth; this file only names
# what the extension calls. Fields that are _Atomic in C are declared with
# their plain type here: Cython emits a plain C access, which C11 compiles as
# a seq_cst atomic load.
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int32_t, int64_t

cdef extern from "edgeinfer/ring.h" nogil:
    enum:
        EI_ABI_VERSION
        EI_HEADER_SIZE
        EI_SLOT_HEADER_SIZE
        EI_RECORD_HEADER_SIZE
        EI_MIN_SLOTS
        EI_MAX_SLOTS
        EI_MAX_WAIT
        EI_NO_SLOT
        EI_STREAM_NAME_MAX
        EI_MODEL_NAME_LEN
        EI_MODEL_VERSION_LEN
        EI_MSG_LEN
        EI_RING_CLOSED
        EI_SLOT_EMPTY
        EI_SLOT_WRITING
        EI_SLOT_READY
        EI_ROLE_PRODUCER
        EI_ROLE_READER
        EI_FRAME_SEALS
        EI_RESULT_SEALS
        EI_INGRESS_DISCONNECTED
        EI_INGRESS_HANDSHAKE
        EI_INGRESS_CONNECTED
        F_SEAL_WRITE
        F_SEAL_FUTURE_WRITE

    const char *EI_INGRESS_SOCKET
    const char *EI_RESULTS_SOCKET

    enum:
        EI_PIX_GRAY8
        EI_PIX_RGB24
        EI_PIX_BGR24
        EI_PIX_RGBA32
        EI_PIX_BGRA32
        EI_PIX_NV12
        EI_PIX_I420
        EI_PIX_YUYV
        EI_COLOUR_BT601
        EI_COLOUR_BT601_FULL
        EI_COLOUR_BT709
        EI_COLOUR_BT709_FULL

    enum:
        EI_OK
        EI_ERR_SYS
        EI_ERR_TRUNCATED
        EI_ERR_MAGIC
        EI_ERR_ABI
        EI_ERR_GEOMETRY
        EI_ERR_INSECURE
        EI_ERR_DENIED
        EI_ERR_BUSY
        EI_ERR_AGAIN
        EI_ERR_NOSPACE
        EI_ERR_ARG
        EI_ERR_NOT_FOUND
        EI_ERR_CORRUPT
        EI_ERR_STATE
        EI_ERR_SHORT
        EI_ERR_PROTOCOL
        EI_ERR_CLOSED
        EI_ERR_TIMEOUT
        EI_ERR_REFUSED
        EI_ERR_WOULDBLOCK
        EI_ERR_BUFFER

    ctypedef struct ei_error:
        int code          # an ei_status
        int sys_errno     # errno for EI_ERR_SYS / EI_ERR_NOSPACE
        char msg[320]     # names the ring or stream and the problem

    ctypedef struct ei_frame_ring_header:
        uint64_t latest           # seq << 8 | slot (atomic)
        uint32_t flags            # ei_ring_flags (atomic)
        uint32_t producer_pid     # informational (atomic)
        uint32_t generation       # informational (atomic)
        uint64_t published        # seq of the newest frame published, stored before latest (atomic)
        uint64_t producer_backoffs  # slot picks lost to a concurrent claim (atomic)
        uint32_t claimed          # slot the consumer holds (atomic)
        uint64_t claims           # frames acquired (atomic)
        uint64_t claim_retries    # claims that lost a race (atomic)
        uint64_t consumed         # seq of the last frame a consumer took or refused (atomic)

    ctypedef struct ei_frame_slot_header:
        uint64_t word             # seq << 8 | slot state (atomic)
        uint64_t capture_mono_ns  # CLOCK_MONOTONIC at capture
        uint64_t payload_len      # bytes the producer says it wrote

    ctypedef struct ei_frame_geometry:
        uint32_t width            # pixels
        uint32_t height           # pixels
        uint32_t pixel_format     # ei_pixel_format
        uint32_t row_stride       # bytes per row, 0 = packed
        uint32_t slot_count       # 3..64
        uint32_t colorimetry      # ei_colorimetry for YUV formats, else 0

    ctypedef struct ei_frame_layout:
        uint64_t total_size       # bytes of the whole ring
        uint64_t slot_stride      # bytes from slot to slot
        uint64_t payload_capacity # payload bytes per slot
        uint32_t slot_count       # slots in the ring
        uint32_t width            # pixels
        uint32_t height           # pixels
        uint32_t channels         # bytes per pixel
        uint32_t pixel_format     # ei_pixel_format
        uint32_t row_stride       # bytes per row
        uint32_t rows             # rows of row_stride bytes per frame (4:2:0: height * 3 / 2)
        uint32_t colorimetry      # ei_colorimetry for YUV formats, else 0

    ctypedef struct ei_frame_producer:
        int fd                    # owns the sealed memfd (we hand it to _Mapping)
        uint8_t *base             # owns the mapping (we hand it to _Mapping)
        ei_frame_ring_header *hdr # borrowed: == base
        ei_frame_layout layout    # private copy of what was created
        uint64_t next_seq         # seq the next publish gets
        uint32_t writing          # slot reserved by begin(), EI_NO_SLOT if none

    ctypedef struct ei_wake_guard:
        uint64_t muted_until_ns   # not slept on before this time
        uint64_t mutes            # times muted

    ctypedef struct ei_waitable:
        ei_wake_guard *guard      # borrowed: the caller's guard for the ring, or NULL

    ctypedef struct ei_result_ring_header:
        uint64_t head             # newest complete record number (atomic)
        uint32_t doorbell         # futex word (atomic)
        uint32_t flags            # ei_ring_flags (atomic)
        uint32_t generation       # (atomic)

    ctypedef struct ei_result_record_header:
        uint64_t frame_seq
        uint64_t frame_id
        uint64_t capture_mono_ns
        uint64_t capture_real_ns
        uint64_t start_mono_ns
        uint64_t done_mono_ns
        uint32_t status
        uint32_t payload_kind
        uint32_t payload_len
        uint32_t item_count
        char model_name[32]
        char model_version[16]
        uint32_t frame_width
        uint32_t frame_height

    ctypedef struct ei_result_layout:
        uint64_t total_size       # bytes of the whole ring
        uint64_t record_stride    # bytes from record to record
        uint64_t payload_capacity # payload bytes per record
        uint32_t record_count     # records in the ring

    ctypedef struct ei_result_writer:
        int fd                    # owns the sealed memfd (we hand it to _Mapping)
        uint8_t *base             # owns the read-write mapping (we hand it to _Mapping)
        ei_result_ring_header *hdr  # borrowed: == base
        ei_result_layout layout   # what was created
        uint64_t head             # our last record number
        int wake                  # FUTEX_WAKE on every commit (atomic)

    ctypedef struct ei_result_reader:
        const uint8_t *base       # borrowed from the _Mapping (read-only)
        const ei_result_ring_header *hdr  # borrowed: == base
        ei_result_layout layout   # private validated copy
        uint64_t next             # next record number to read
        uint64_t missed           # records lost to overwrite, in total
        uint32_t seen_flags       # flags already reported to Python

    ctypedef struct ei_hello:
        uint32_t role             # ei_role

    ctypedef struct ei_ingress:
        int sock                  # owns: the connection, -1 while disconnected
        int ring_fd               # borrowed: the ring handed over at each (re)connection
        int state                 # ei_ingress_state
        int last_status           # ei_status of the last failure or refusal
        uint32_t accepted         # handshakes accepted so far
        uint32_t attempts         # connection attempts so far
        char last_msg[320]        # why the last attempt failed
        int last_errno            # errno of the last failure when last_status is EI_ERR_SYS

    uint32_t ei_pixel_channels(uint32_t fmt)
    uint64_t ei_frame_payload_len(uint32_t fmt, uint32_t width, uint32_t height, uint32_t row_stride)
    uint64_t ei_now_ns(int clock)
    int ei_stream_name_ok(const char *name, size_t len)
    ei_frame_slot_header *ei_frame_slot(uint8_t *base, const ei_frame_layout *l, uint32_t slot)
    uint8_t *ei_frame_payload(uint8_t *base, const ei_frame_layout *l, uint32_t slot)
    uint64_t ei_frame_bytes(const ei_frame_layout *l)

    int ei_ring_fd_check(int fd, const char *name, int need_seals, int forbid_seals, int need_rdwr,
                         uint64_t max_size, uint64_t *size_out, ei_error *err)
    int ei_ring_map(int fd, uint64_t size, int writable, const char *name, uint8_t **base_out, ei_error *err)

    int ei_frame_producer_create(ei_frame_producer *p, const char *label, const ei_frame_geometry *g, ei_error *err)
    uint8_t *ei_frame_producer_begin(ei_frame_producer *p)
    void ei_frame_producer_retire(ei_frame_producer *p)
    # seq (> 0), or EI_ERR_ARG (payload_len is not the frame's length) / EI_ERR_STATE (nothing reserved)
    int64_t ei_frame_producer_publish(ei_frame_producer *p, uint64_t capture_mono_ns,
                                      uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len)
    # the same without the length check: for tests that play a broken producer only
    int64_t ei__frame_producer_commit(ei_frame_producer *p, uint64_t capture_mono_ns,
                                      uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len)

    uint64_t ei_wait_any(const ei_waitable *w, uint32_t n, uint64_t timeout_ns, uint64_t spin_ns, int use_waitv)

    int ei_result_writer_create(ei_result_writer *wr, const char *label, uint32_t record_count,
                                uint64_t payload_capacity, uint32_t generation, ei_error *err)
    ei_result_record_header *ei_result_writer_begin(ei_result_writer *wr)
    uint8_t *ei_result_payload(ei_result_record_header *r)
    uint64_t ei_result_writer_commit(ei_result_writer *wr, ei_result_record_header *r)
    void ei_result_writer_retire(ei_result_writer *wr)

    int ei_result_reader_init(ei_result_reader *rd, const uint8_t *base, uint64_t size, const char *name,
                              int from_oldest, ei_error *err)
    int ei_result_reader_ready(const ei_result_reader *rd)
    ei_waitable ei_result_waitable(ei_result_reader *rd)
    # 1: a record copied; 0: none yet (call again); -1: head corrupt (beyond EI_MAX_RECORD_NUMBER or backwards);
    # EI_ERR_BUFFER: consumed, but its payload (hdr_out.payload_len) is larger than payload_cap
    int ei_result_reader_next(ei_result_reader *rd, ei_result_record_header *hdr_out, uint8_t *payload_out,
                              uint64_t payload_cap, uint64_t *missed_out)
    uint64_t EI_MAX_RECORD_NUMBER  # record numbers above it are corrupt (the seqlock word holds n << 1)

    int ei_sock_alive(int sock)
    int ei_sock_recv(int sock, void *msg, size_t len, int *fd_out, ei_error *err)
    enum: EI_SOCK_MAX_FDS  # the kernel's SCM_MAX_FD
    int ei_sock_recv_fds(int sock, void *msg, size_t len, int *fds, int *nfds, ei_error *err) nogil
    void ei_fd_close_received(int fd) nogil
    int ei_hello_check(const ei_hello *h, char *stream_out, ei_error *err)
    int ei_reply_send(int sock, int status, const char *msg, int fd, ei_error *err)
    int ei_peer_cred(int sock, uint32_t *uid, uint32_t *gid, int32_t *pid, ei_error *err)

    int ei_ingress_init(ei_ingress *inc, const char *path, const char *stream, int ring_fd, ei_error *err)
    int ei_ingress_step(ei_ingress *inc, uint64_t now_ns)
    int ei_ingress_wait(ei_ingress *inc, uint64_t timeout_ns, ei_error *err)
    void ei_ingress_close(ei_ingress *inc)
    int ei_status_transient(int status)
    int ei_errno_transient(int e)
    int ei_error_transient(const ei_error *e)

    int ei_results_connect(const char *path, const char *stream, uint64_t timeout_ns, int *sock_out,
                           int *ring_fd_out, ei_error *err)


# native/consumer.h: daemon-internal, not installed. The frame ring's one
# consumer: the consumer's half of the claim protocol.
cdef extern from "consumer.h" nogil:
    ctypedef struct ei_frame_consumer:
        uint8_t *base             # borrowed from the _Mapping
        ei_frame_ring_header *hdr # borrowed: == base
        ei_frame_layout layout    # private validated copy
        uint64_t last_seq         # seq of the last frame taken
        uint64_t seen_latest      # the `latest` word last consumed
        uint64_t pending_since_ns # when news was first seen since the last acquire, 0 if none
        uint32_t held             # slot held, EI_NO_SLOT if none
        uint32_t seen_flags       # flags already reported to Python

    ctypedef struct ei_frame_info:
        uint64_t seq              # frame sequence number
        uint64_t capture_mono_ns  # CLOCK_MONOTONIC at capture (producer's word)
        uint64_t capture_real_ns  # CLOCK_REALTIME at capture (producer's word)
        uint64_t frame_id         # producer's frame number
        uint64_t payload_len      # bytes the producer declared
        uint64_t pending_since_ns # the daemon's own arrival time of the news
        uint32_t slot             # slot index
        uint32_t generation       # informational

    int ei_frame_consumer_init(ei_frame_consumer *c, uint8_t *base, uint64_t size, const char *name, ei_error *err)
    int ei_frame_consumer_join(ei_frame_consumer *c, uint8_t *base, uint64_t size, const char *name, ei_error *err)
    int ei_frame_consumer_ready(const ei_frame_consumer *c)
    uint64_t ei_frame_consumer_note(ei_frame_consumer *c, uint64_t now_ns)
    int ei_frame_consumer_acquire(ei_frame_consumer *c, ei_frame_info *out)
    void ei_frame_consumer_release(ei_frame_consumer *c)
    ei_waitable ei_frame_waitable(ei_frame_consumer *c)

# native/sigbus_guard.h: daemon-internal, not ABI. Defence in depth since ABI 2
# (a sealed ring cannot shrink): absorbs SIGBUS from a frame ring mapping.
cdef extern from "sigbus_guard.h" nogil:
    int ei_guard_add(void *base, size_t size)  # entry index, or -1 with errno set
    int ei_guard_hit(int idx)                  # 1 once the handler replaced pages of that mapping
    void ei_guard_remove(int idx)              # before munmap
    uint64_t ei_guard_hits()                   # faults absorbed, process-wide


# native/doorbell.h: daemon-internal, not ABI. The control plane's way to wake
# the real-time loop (it sleeps on it together with its rings).
cdef extern from "doorbell.h" nogil:
    ctypedef struct ei_doorbell:
        pass
    ei_waitable ei_doorbell_waitable(ei_doorbell *b)
    void ei_doorbell_ring(ei_doorbell *b)
    int ei_doorbell_take(ei_doorbell *b)


# native/lanes.h: daemon-internal, not ABI. Lanes (processes) sharing a frame
# ring one at a time through a cursor in the dispatch table.
cdef extern from "lanes.h" nogil:
    ctypedef struct ei_stream_cursor:
        uint32_t owner            # lane id + 1 serving the stream, 0 = free (atomic)
        uint32_t epoch            # producer generation of the state (atomic)
        uint32_t passed_over      # picks that went to other streams while ready (atomic)
    ctypedef struct ei_lane_view:
        const ei_frame_consumer *c   # borrowed: the lane's consumer
        ei_stream_cursor *cur        # borrowed: the cursor in the dispatch table
        uint32_t epoch               # producer generation of the lane's ring
        uint64_t claimed_since       # the cursor's arrival stamp when claimed
        const int64_t *outcomes      # borrowed: the stream's outcome counters, NULL = no journal
        uint32_t n_outcomes
    int ei_lane_ready(const void *v)
    ei_waitable ei_lane_waitable(ei_lane_view *v)
    uint64_t ei_lane_note(ei_lane_view *v, uint64_t now_ns)
    int ei_lane_claim(ei_lane_view *v, ei_frame_consumer *c, uint32_t lane_id)
    int ei_lane_unclaim(ei_lane_view *v, ei_frame_consumer *c)
    void ei_lane_consumed(ei_lane_view *v, const ei_frame_consumer *c, uint64_t owed)
    int64_t ei_lane_owed_total(const ei_lane_view *v)
    uint32_t ei_lane_passed_over(const ei_lane_view *v)
    void ei_lane_pass_over(ei_lane_view *v)
    void ei_lane_picked(ei_lane_view *v)
    uint64_t ei_lane_pending_since(const ei_lane_view *v)
    void ei_result_writer_resume(ei_result_writer *wr)
    size_t EI_CURSOR_SIZE "sizeof(ei_stream_cursor)"


# The result payload words (abi.h), exported as ring.pyx's PAYLOAD_KINDS and TENSOR_DESC.
cdef extern from "edgeinfer/ring.h" nogil:
    enum:
        EI_KIND_NONE
        EI_KIND_CLASSIFICATION
        EI_KIND_DETECTION
        EI_KIND_RAW
        EI_KIND_TENSORS
        EI_TENSOR_NAME_LEN
        EI_TENSOR_MAX_DIMS
        EI_TENSOR_ALIGN
    ctypedef struct ei_tensor_desc:
        pass

cdef extern from *:
    """
    #include <stddef.h>
    #define EI_TENSOR_OFF_INDEX offsetof(ei_tensor_desc, index)
    #define EI_TENSOR_OFF_DTYPE offsetof(ei_tensor_desc, dtype)
    #define EI_TENSOR_OFF_NDIM offsetof(ei_tensor_desc, ndim)
    #define EI_TENSOR_OFF_DIMS offsetof(ei_tensor_desc, dims)
    """
    size_t EI_TENSOR_OFF_INDEX
    size_t EI_TENSOR_OFF_DTYPE
    size_t EI_TENSOR_OFF_NDIM
    size_t EI_TENSOR_OFF_DIMS
