# Cython view of native/include/edgeinfer/ring.h: the header is the single
# source of truth; this file only names what the extension calls. Fields that
# are _Atomic in C are declared with their plain type here: Cython emits a
# plain C access, which C11 compiles as a seq_cst atomic load.
from libc.stdint cimport uint8_t, uint32_t, uint64_t

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
        EI_MODEL_NAME_LEN
        EI_MODEL_VERSION_LEN
        EI_LOCK_PRODUCER
        EI_RING_CLOSED
        EI_RING_SUPERSEDED
        EI_SLOT_EMPTY
        EI_SLOT_WRITING
        EI_SLOT_READY

    enum:
        EI_PIX_GRAY8
        EI_PIX_RGB24
        EI_PIX_BGR24
        EI_PIX_RGBA32
        EI_PIX_BGRA32

    enum:
        EI_OK
        EI_ERR_SYS
        EI_ERR_TRUNCATED
        EI_ERR_MAGIC
        EI_ERR_ABI
        EI_ERR_GEOMETRY
        EI_ERR_INSECURE
        EI_ERR_OWNER
        EI_ERR_PRODUCER_BUSY
        EI_ERR_CONSUMER_BUSY
        EI_ERR_NOSPACE
        EI_ERR_ARG
        EI_ERR_NOT_FOUND
        EI_ERR_CORRUPT
        EI_ERR_STATE

    ctypedef struct ei_error:
        int code          # an ei_status
        int sys_errno     # errno for EI_ERR_SYS / EI_ERR_NOSPACE
        char msg[320]     # names the segment and the problem

    ctypedef struct ei_frame_ring_header:
        uint64_t latest           # seq << 8 | slot (atomic)
        uint32_t flags            # ei_ring_flags (atomic)
        uint32_t producer_pid     # informational (atomic)
        uint32_t generation       # bumped when a segment replaces its predecessor (atomic)
        uint64_t published        # frames published (atomic)
        uint64_t producer_backoffs  # slot picks lost to a concurrent claim (atomic)
        uint32_t claimed          # slot the consumer holds (atomic)
        uint64_t claims           # frames acquired (atomic)
        uint64_t claim_retries    # claims that lost a race (atomic)

    ctypedef struct ei_frame_slot_header:
        uint64_t word             # seq << 8 | slot state (atomic)
        uint64_t capture_mono_ns  # CLOCK_MONOTONIC at capture

    ctypedef struct ei_frame_geometry:
        uint32_t width            # pixels
        uint32_t height           # pixels
        uint32_t pixel_format     # ei_pixel_format
        uint32_t row_stride       # bytes per row, 0 = packed
        uint32_t slot_count       # 3..64

    ctypedef struct ei_frame_layout:
        uint64_t total_size       # bytes of the whole segment
        uint64_t slot_stride      # bytes from slot to slot
        uint64_t payload_capacity # payload bytes per slot
        uint32_t slot_count
        uint32_t width
        uint32_t height
        uint32_t channels
        uint32_t pixel_format
        uint32_t row_stride

    ctypedef struct ei_frame_producer:
        int fd                    # owns the segment fd (producer lock)
        uint8_t *base             # owns the mapping (we hand it to _Mapping)
        ei_frame_ring_header *hdr # borrowed: == base
        ei_frame_layout layout    # private copy of what was created
        uint32_t writing          # slot reserved by begin(), EI_NO_SLOT if none

    ctypedef struct ei_frame_consumer:
        uint8_t *base             # borrowed from the _Mapping
        ei_frame_ring_header *hdr # borrowed: == base
        ei_frame_layout layout    # private validated copy
        uint64_t last_seq         # newest seq acquired
        uint32_t held             # slot held, EI_NO_SLOT if none
        uint32_t seen_flags       # flags already reported to Python

    ctypedef struct ei_frame_info:
        uint64_t seq
        uint64_t capture_mono_ns
        uint64_t capture_real_ns
        uint64_t frame_id
        uint64_t payload_len
        uint32_t slot
        uint32_t generation

    ctypedef struct ei_mapped:
        int fd                    # segment fd; ownership passes to _Mapping
        uint8_t *base             # mapping; ownership passes to _Mapping
        size_t size
        unsigned long dev         # file identity, to notice a replaced name
        unsigned long ino

    ctypedef struct ei_waitable:
        pass

    ctypedef struct ei_result_ring_header:
        uint64_t head             # newest complete record number (atomic)
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

    ctypedef struct ei_result_layout:
        uint64_t total_size
        uint64_t record_stride
        uint64_t payload_capacity
        uint32_t record_count

    ctypedef struct ei_result_writer:
        int fd                    # owns the segment fd (writer lock)
        uint8_t *base             # owns the mapping (we hand it to _Mapping)
        ei_result_ring_header *hdr
        ei_result_layout layout
        uint64_t head             # our last record number

    ctypedef struct ei_result_reader:
        uint8_t *base             # borrowed from the _Mapping
        ei_result_ring_header *hdr
        ei_result_layout layout
        uint64_t next             # next record number to read
        uint64_t missed           # records lost to overwrite, in total
        uint32_t seen_flags

    uint32_t ei_pixel_channels(uint32_t fmt)
    uint64_t ei_now_ns(int clock)
    int ei_lock_held(int fd, int byte)
    ei_frame_slot_header *ei_frame_slot(uint8_t *base, const ei_frame_layout *l, uint32_t slot)
    uint8_t *ei_frame_payload(uint8_t *base, const ei_frame_layout *l, uint32_t slot)

    int ei_frame_producer_open(ei_frame_producer *p, const char *dir, const char *name,
                               const ei_frame_geometry *g, unsigned mode, long gid, ei_error *err)
    uint8_t *ei_frame_producer_begin(ei_frame_producer *p)
    uint64_t ei_frame_producer_publish(ei_frame_producer *p, uint64_t capture_mono_ns,
                                       uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len)
    void ei_frame_producer_retire(ei_frame_producer *p, int unlink_name)

    int ei_frame_consumer_open(ei_frame_consumer *c, ei_mapped *m, const char *dir, const char *name,
                               const uint32_t *allowed_uids, size_t n_allowed, ei_error *err)
    int ei_frame_consumer_ready(const ei_frame_consumer *c)
    int ei_frame_consumer_acquire(ei_frame_consumer *c, ei_frame_info *out)
    void ei_frame_consumer_release(ei_frame_consumer *c)
    void ei_frame_consumer_detach(ei_frame_consumer *c, int fd)
    ei_waitable ei_frame_waitable(ei_frame_consumer *c)

    uint64_t ei_wait_any(const ei_waitable *w, uint32_t n, uint64_t timeout_ns, uint64_t spin_ns, int use_waitv)

    int ei_result_writer_open(ei_result_writer *wr, const char *dir, const char *name, uint32_t record_count,
                              uint64_t payload_capacity, unsigned mode, long gid, ei_error *err)
    ei_result_record_header *ei_result_writer_begin(ei_result_writer *wr)
    uint8_t *ei_result_payload(ei_result_record_header *r)
    uint64_t ei_result_writer_commit(ei_result_writer *wr, ei_result_record_header *r)
    void ei_result_writer_retire(ei_result_writer *wr, int unlink_name)

    int ei_result_reader_open(ei_result_reader *rd, ei_mapped *m, const char *dir, const char *name,
                              const uint32_t *allowed_uids, size_t n_allowed, int from_oldest, ei_error *err)
    int ei_result_reader_ready(const ei_result_reader *rd)
    ei_waitable ei_result_waitable(ei_result_reader *rd)
    # 1: a record copied; 0: none yet (call again); -1: head corrupt (> EI_MAX_RECORD_NUMBER)
    int ei_result_reader_next(ei_result_reader *rd, ei_result_record_header *hdr_out, uint8_t *payload_out,
                              uint64_t payload_cap, uint64_t *missed_out)
    uint64_t EI_MAX_RECORD_NUMBER  # record numbers above it are corrupt (the seqlock word holds n << 1)


# native/sigbus_guard.h: daemon-internal, not ABI. Absorbs SIGBUS from a frame
# ring whose producer shrank it while mapped (see the header).
cdef extern from "sigbus_guard.h" nogil:
    int ei_guard_add(void *base, size_t size)  # entry index, or -1 with errno set
    int ei_guard_hit(int idx)                  # 1 once the handler replaced pages of that mapping
    void ei_guard_remove(int idx)              # before munmap
    uint64_t ei_guard_hits()                   # faults absorbed, process-wide
