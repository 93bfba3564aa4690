/*
 * edgeinfer shared-memory ABI, version 2.
 *
 * The single source of truth for the layout of frame rings and result rings,
 * for the protocol that moves frames through them, and for the socket
 * handshake that hands them over. Header-only C11 (stdatomic, Linux futex,
 * memfd and Unix-socket calls): a camera producer or a result reader includes
 * this file and needs no library. Compile with -std=gnu11 (or define
 * _GNU_SOURCE before any system header) on Linux >= 5.1, x86_64 or aarch64.
 * docs/abi.md explains every field, the slot state machine, why the memory
 * ordering is sufficient, and who can do what to whom.
 *
 * ABI 2 in one paragraph: a ring is a sealed memfd, never a name. A camera
 * creates its frame ring with memfd_create, seals its size
 * (F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL) and sends the fd (SCM_RIGHTS) with
 * its stream name over the daemon's ingress socket; the daemon checks the
 * peer's credentials against the stream's configured producer. The
 * connection is the liveness. The daemon creates each result ring as a memfd,
 * seals it read-only for every later mapping (F_SEAL_FUTURE_WRITE) and hands
 * the fd to readers that pass the stream's reader check. Nobody else can open
 * a ring, nobody can resize one, and a reader cannot write one.
 *
 * Byte order is the host's: producer and consumer share one machine.
 */
#ifndef EDGEINFER_RING_H
#define EDGEINFER_RING_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/magic.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
#error "ring.h is C11: include it from a C translation unit"
#endif

/* Names newer than some libcs. */
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#ifndef FUTEX2_SIZE_U32
#define FUTEX2_SIZE_U32 0x02
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux >= 5.1 */
#endif

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free (address-free across processes)");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free (address-free across processes)");

/* ------------------------------------------------------------------ */
/* Constants                                                           */
/* ------------------------------------------------------------------ */

#define EI_ABI_VERSION 2u
#define EI_FRAME_MAGIC "EIFRAME2"   /* 8 bytes, no NUL stored */
#define EI_RESULT_MAGIC "EIRESLT2"
#define EI_HELLO_MAGIC "EIHELLO2"   /* opens every handshake message from a client */
#define EI_REPLY_MAGIC "EIREPLY2"   /* opens every message from the daemon */
#define EI_HEADER_SIZE 4096u        /* header page; slot 0 / record 0 starts here */
#define EI_SLOT_HEADER_SIZE 64u     /* payload starts this far into a slot */
#define EI_RECORD_HEADER_SIZE 128u  /* payload starts this far into a result record */
#define EI_ALIGN 64u                /* slot stride, record stride and payloads are multiples of this */
#define EI_MIN_SLOTS 3u             /* claimed + latest + one to write: the producer never waits */
#define EI_MAX_SLOTS 64u            /* slot index must fit the low 8 bits of `latest` */
#define EI_MIN_RECORDS 2u
#define EI_MAX_RECORDS 65536u
#define EI_MAX_DIM 16384u           /* width and height limit */
#define EI_MAX_PAYLOAD (1ull << 30) /* one slot payload / record payload limit */
#define EI_NO_SLOT 0xFFFFFFFFu      /* `claimed` value when the consumer holds nothing */
#define EI_MAX_WAIT 64u             /* rings one ei_wait_any call can sleep on */
#define EI_STREAM_NAME_MAX 64u      /* stream names: 1..64 of [A-Za-z0-9_-], starting alphanumeric */
#define EI_MODEL_NAME_LEN 32u
#define EI_MODEL_VERSION_LEN 16u
#define EI_MSG_LEN 240u             /* reason text in a reply */

/* Where the daemon listens (systemd's edgeinferd.socket owns both, so they
 * exist while the daemon restarts). SOCK_SEQPACKET, mode 0660, group edgeinfer. */
#define EI_INGRESS_SOCKET "/run/edgeinfer/ingress.sock"
#define EI_RESULTS_SOCKET "/run/edgeinfer/results.sock"

/* The seals that make a frame ring safe to map: its size can never change. */
#define EI_FRAME_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
/* ...and a result ring: in addition, no mapping made after sealing can write. */
#define EI_RESULT_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

/* Pixel formats, 8 bits per sample. 1-5 are interleaved (HWC). 6-8 are YUV as
 * decoders and V4L2 cameras give it (the daemon converts to RGB inside the model
 * graph); their rows are packed (row_stride = width, yuyv: 2 * width), width and
 * height are even, and `colorimetry` says which YUV it is:
 *   NV12: the Y plane (height rows), then interleaved U,V at half size (height/2 rows of width bytes);
 *   I420: the Y plane, then U, then V, each chroma plane (width/2) x (height/2) (ffmpeg's yuv420p);
 *   YUYV: 4:2:2 packed, Y0 U Y1 V for each pair of pixels (V4L2's YUYV, ffmpeg's yuyv422). */
enum ei_pixel_format {
    EI_PIX_GRAY8 = 1,
    EI_PIX_RGB24 = 2,
    EI_PIX_BGR24 = 3,
    EI_PIX_RGBA32 = 4,
    EI_PIX_BGRA32 = 5,
    EI_PIX_NV12 = 6,
    EI_PIX_I420 = 7,
    EI_PIX_YUYV = 8,
};

/* Which YUV a YUV frame holds (header `colorimetry`; zero for the RGB formats).
 * Limited range: Y 16-235, U/V 16-240 (broadcast video, most cameras); full: 0-255 (JPEG, some webcams). */
enum ei_colorimetry {
    EI_COLOUR_BT601 = 0,      /* BT.601 limited range: SD video, most IP cameras' default */
    EI_COLOUR_BT601_FULL = 1, /* BT.601 full range (JPEG / MJPEG) */
    EI_COLOUR_BT709 = 2,      /* BT.709 limited range: HD video */
    EI_COLOUR_BT709_FULL = 3, /* BT.709 full range */
};
#define EI_COLOUR_MAX EI_COLOUR_BT709_FULL

/* Slot state, the low 8 bits of a slot's `word` (the high 56 bits are the seq). */
enum ei_slot_state {
    EI_SLOT_EMPTY = 0,   /* never written */
    EI_SLOT_WRITING = 1, /* the producer owns it; contents undefined */
    EI_SLOT_READY = 2,   /* holds the complete frame `seq` */
};

/* Ring flags (header `flags`), set by the producer / writer. */
enum ei_ring_flags {
    EI_RING_CLOSED = 1u, /* the producer (writer) closed it cleanly: nothing more will come */
};

/* Who a client is, in its hello. */
enum ei_role {
    EI_ROLE_PRODUCER = 1, /* hands over a frame ring (one fd) */
    EI_ROLE_READER = 2,   /* asks for a stream's result ring (gets one fd) */
};

/* Status codes returned by every function below (negative = error). The
 * daemon's reply carries one of them as the reason class of a refusal. */
enum ei_status {
    EI_OK = 0,
    EI_ERR_SYS = -1,           /* a system call failed; ei_error.sys_errno says which errno */
    EI_ERR_TRUNCATED = -2,     /* file smaller than its header or than its geometry */
    EI_ERR_MAGIC = -3,         /* not an edgeinfer ring of the expected kind */
    EI_ERR_ABI = -4,           /* an ABI version this code does not understand */
    EI_ERR_GEOMETRY = -5,      /* geometry fields inconsistent, out of bounds, or the wrong size */
    EI_ERR_INSECURE = -6,      /* not a sealed memfd, or sealed/opened so that the protocol cannot hold */
    EI_ERR_DENIED = -7,        /* the peer is not allowed to produce / read this stream */
    EI_ERR_BUSY = -8,          /* the stream already has its producer (transient: retry) */
    EI_ERR_AGAIN = -9,         /* nothing yet / the daemon is saturated with handshakes (transient) */
    EI_ERR_NOSPACE = -10,      /* no memory for the ring */
    EI_ERR_ARG = -11,          /* a bad argument from the caller (or an unknown stream) */
    EI_ERR_NOT_FOUND = -12,    /* no daemon listens on the socket */
    EI_ERR_CORRUPT = -13,      /* a producer-written number failed its check; the frame was skipped */
    EI_ERR_STATE = -14,        /* call out of order (e.g. acquire while holding) */
    EI_ERR_SHORT = -15,        /* the frame's payload_len is shorter than the frame: skipped */
    EI_ERR_PROTOCOL = -16,     /* a malformed handshake message */
    EI_ERR_CLOSED = -17,       /* the peer closed the connection */
    EI_ERR_TIMEOUT = -18,      /* no answer in time */
    EI_ERR_REFUSED = -19,      /* the daemon refused for a reason of its own (e.g. cannot serve the geometry) */
    EI_ERR_WOULDBLOCK = -20,   /* a non-blocking receive found no message yet (never sent in a reply) */
    EI_ERR_BUFFER = -21,       /* the caller's buffer is smaller than the data (ei_result_reader_next; never sent) */
};

typedef struct ei_error {
    int code;       /* an ei_status */
    int sys_errno;  /* errno for EI_ERR_SYS / EI_ERR_NOSPACE, else 0 */
    char msg[320];  /* human-readable, names the ring or stream and the problem */
} ei_error;

/* ------------------------------------------------------------------ */
/* Shared-memory layout                                                */
/* ------------------------------------------------------------------ */

/* Frame ring header: the first EI_HEADER_SIZE bytes of a frame ring.
 * Lines 0-1 are written once, before the fd is handed over, then never. */
typedef struct ei_frame_ring_header {
    /* line 0-1: identity and geometry (immutable once handed over) */
    char magic[8];              /* EI_FRAME_MAGIC */
    uint32_t abi_version;       /* EI_ABI_VERSION */
    uint32_t header_size;       /* EI_HEADER_SIZE: offset of slot 0 */
    uint64_t total_size;        /* header_size + slot_count * slot_stride == the memfd's sealed size */
    uint32_t slot_count;        /* EI_MIN_SLOTS..EI_MAX_SLOTS */
    uint32_t slot_header_size;  /* EI_SLOT_HEADER_SIZE: payload offset inside a slot */
    uint64_t slot_stride;       /* bytes from one slot to the next, multiple of EI_ALIGN */
    uint64_t payload_capacity;  /* >= ei_frame_payload_len(...); payload bytes available per slot */
    uint32_t width;             /* pixels */
    uint32_t height;            /* pixels */
    uint32_t channels;          /* bytes per pixel, implied by pixel_format */
    uint32_t pixel_format;      /* enum ei_pixel_format */
    uint32_t row_stride;        /* bytes per row, >= width * channels (YUV formats: == width * channels) */
    uint32_t colorimetry;       /* YUV formats: enum ei_colorimetry; zero otherwise */
    uint32_t reserved0[14];     /* zero */
    /* line 2: written by the producer */
    _Atomic uint64_t latest;           /* seq << 8 | slot of the newest complete frame; 0 = none yet */
    _Atomic uint32_t doorbell;         /* futex word: +1 on every publish and flag change */
    _Atomic uint32_t flags;            /* enum ei_ring_flags */
    _Atomic uint32_t producer_pid;     /* informational: the producer's pid (in its namespace) */
    _Atomic uint32_t generation;       /* informational: the producer's count of rings it created (1, 2, ...) */
    _Atomic uint64_t published;        /* seq of the newest frame published, stored BEFORE `latest` */
    _Atomic uint64_t producer_backoffs;/* slot picks abandoned because the consumer claimed it */
    uint8_t reserved1[24];
    /* line 3: written by the consumer (the daemon) */
    _Atomic uint32_t claimed;          /* slot the consumer holds, EI_NO_SLOT if none */
    _Atomic uint32_t waiters;          /* consumers asleep on `doorbell`: producer wakes only if > 0 */
    _Atomic uint32_t consumer_pid;     /* informational: the attached consumer's pid */
    uint32_t reserved2;
    _Atomic uint64_t claims;           /* frames the consumer acquired */
    _Atomic uint64_t claim_retries;    /* claims that lost a race and were retried */
    _Atomic uint64_t consumed;         /* seq of the last frame a consumer took or refused: accounted for */
    uint8_t reserved3[24];
} ei_frame_ring_header;

/* Each slot starts with this; the payload follows at slot_header_size. */
typedef struct ei_frame_slot_header {
    _Atomic uint64_t word;    /* seq << 8 | enum ei_slot_state */
    uint64_t capture_mono_ns; /* CLOCK_MONOTONIC at capture (staleness and latency only, never priority) */
    uint64_t capture_real_ns; /* CLOCK_REALTIME at capture */
    uint64_t frame_id;        /* the producer's own frame number */
    uint64_t payload_len;     /* bytes of the frame: exactly ei_frame_payload_len (nv12/i420: rows * 3 / 2) */
    uint8_t reserved[24];
} ei_frame_slot_header;

/* Result ring header: the first EI_HEADER_SIZE bytes of a result ring. Only
 * the daemon writes a result ring; readers map it read-only. */
typedef struct ei_result_ring_header {
    /* line 0-1: identity and geometry (immutable once sealed) */
    char magic[8];              /* EI_RESULT_MAGIC */
    uint32_t abi_version;       /* EI_ABI_VERSION */
    uint32_t header_size;       /* EI_HEADER_SIZE: offset of record 0 */
    uint64_t total_size;        /* header_size + record_count * record_stride == the memfd's sealed size */
    uint32_t record_count;      /* EI_MIN_RECORDS..EI_MAX_RECORDS */
    uint32_t record_header_size;/* EI_RECORD_HEADER_SIZE: payload offset inside a record */
    uint64_t record_stride;     /* multiple of EI_ALIGN */
    uint64_t payload_capacity;  /* payload bytes available per record */
    uint8_t reserved0[80];
    /* line 2: written by the writer */
    _Atomic uint64_t head;      /* number of the newest complete record (1-based); 0 = none */
    _Atomic uint32_t doorbell;  /* futex word: +1 per record and per flag change; woken while readers are connected */
    _Atomic uint32_t flags;     /* enum ei_ring_flags */
    _Atomic uint32_t writer_pid;/* informational */
    _Atomic uint32_t generation;/* informational: 1 + the number of rings the daemon made for this stream before */
    uint8_t reserved1[40];
    /* line 3: unused since ABI 2 (readers never write shared memory) */
    uint8_t reserved2[64];
} ei_result_ring_header;

/* Result record n (1-based) lives at index (n - 1) % record_count. */
typedef struct ei_result_record_header {
    _Atomic uint64_t seqlock;  /* n << 1 when complete, n << 1 | 1 while being written */
    uint64_t frame_seq;        /* frame ring seq of the input frame */
    uint64_t frame_id;         /* producer's frame id of the input */
    uint64_t capture_mono_ns;  /* copied from the frame */
    uint64_t capture_real_ns;  /* copied from the frame */
    uint64_t start_mono_ns;    /* inference started */
    uint64_t done_mono_ns;     /* result published */
    uint32_t status;           /* 0 = ok; see docs/abi.md */
    uint32_t payload_kind;     /* enum ei_payload_kind */
    uint32_t payload_len;      /* bytes of payload, <= payload_capacity */
    uint32_t item_count;       /* rows in the payload */
    char model_name[EI_MODEL_NAME_LEN];       /* NUL-padded */
    char model_version[EI_MODEL_VERSION_LEN]; /* NUL-padded */
    uint8_t reserved[8];
} ei_result_record_header;

/* What a record's payload holds (docs/abi.md, payload layouts). Rows are little-endian float32. */
enum ei_payload_kind {
    EI_KIND_NONE = 0,
    EI_KIND_CLASSIFICATION = 1, /* item_count rows (class_id, score), best first */
    EI_KIND_DETECTION = 2,      /* item_count rows (x1, y1, x2, y2, score, class_id), frame pixels */
    EI_KIND_RAW = 3,            /* item_count float32 values of one output */
    EI_KIND_TENSORS = 4,        /* item_count sections: ei_tensor_desc, then the tensor's bytes padded to 8 */
};

/* One section of an EI_KIND_TENSORS payload: a model output with its name, type and shape. The
 * tensor's prod(dims) elements (row-major, little-endian) follow the descriptor, padded with zeros
 * to a multiple of EI_TENSOR_ALIGN; the next descriptor starts there. */
#define EI_TENSOR_NAME_LEN 32
#define EI_TENSOR_MAX_DIMS 5
#define EI_TENSOR_ALIGN 8
typedef struct ei_tensor_desc {
    char name[EI_TENSOR_NAME_LEN];     /* the output's name, NUL-padded (its first 31 bytes) */
    uint32_t index;                    /* the output's index among the graph's outputs */
    uint32_t dtype;                    /* ONNX TensorProto.DataType: 1 float, 2 uint8, 3 int8, 6 int32,
                                          7 int64, 9 bool, 10 float16, 11 double, ... (docs/abi.md) */
    uint32_t ndim;                     /* dims used, 0 ... EI_TENSOR_MAX_DIMS */
    uint32_t dims[EI_TENSOR_MAX_DIMS]; /* the shape; unused dims are 0 */
} ei_tensor_desc;
_Static_assert(sizeof(ei_tensor_desc) == 64, "tensor descriptor layout");

/* The handshake. A client sends one hello (with the frame ring's fd for a
 * producer); the daemon answers one reply (with the result ring's fd for an
 * accepted reader) and keeps the connection: it is the liveness both ways.
 * When the daemon drops a producer it may send one more reply saying why,
 * then closes. */
typedef struct ei_hello {
    char magic[8];                   /* EI_HELLO_MAGIC */
    uint32_t abi_version;            /* EI_ABI_VERSION */
    uint32_t role;                   /* enum ei_role */
    char stream[EI_STREAM_NAME_MAX]; /* NUL-padded stream name */
    uint8_t reserved[48];            /* zero */
} ei_hello;

typedef struct ei_reply {
    char magic[8];          /* EI_REPLY_MAGIC */
    uint32_t abi_version;   /* EI_ABI_VERSION */
    int32_t status;         /* EI_OK, or the enum ei_status class of the refusal */
    char msg[EI_MSG_LEN];   /* why, NUL-terminated (empty when accepted) */
} ei_reply;

_Static_assert(sizeof(ei_frame_ring_header) == 256, "frame header layout");
_Static_assert(offsetof(ei_frame_ring_header, latest) == 128, "frame header layout");
_Static_assert(offsetof(ei_frame_ring_header, published) == 152, "frame header layout");
_Static_assert(offsetof(ei_frame_ring_header, claimed) == 192, "frame header layout");
_Static_assert(offsetof(ei_frame_ring_header, consumed) == 224, "frame header layout");
_Static_assert(sizeof(ei_frame_slot_header) == EI_SLOT_HEADER_SIZE, "slot header layout");
_Static_assert(sizeof(ei_result_ring_header) == 256, "result header layout");
_Static_assert(offsetof(ei_result_ring_header, head) == 128, "result header layout");
_Static_assert(sizeof(ei_result_record_header) == EI_RECORD_HEADER_SIZE, "record header layout");
_Static_assert(sizeof(ei_hello) == 128, "hello layout");
_Static_assert(sizeof(ei_reply) == 256, "reply layout");

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static inline uint64_t ei_align_up(uint64_t v) { return (v + EI_ALIGN - 1) & ~(uint64_t)(EI_ALIGN - 1); }

static inline uint64_t ei_now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void ei_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Bytes per pixel of a row (of the Y plane for the planar YUV formats); 0 = unknown format. */
static inline uint32_t ei_pixel_channels(uint32_t fmt) {
    switch (fmt) {
    case EI_PIX_GRAY8: case EI_PIX_NV12: case EI_PIX_I420: return 1;
    case EI_PIX_YUYV: return 2;
    case EI_PIX_RGB24: case EI_PIX_BGR24: return 3;
    case EI_PIX_RGBA32: case EI_PIX_BGRA32: return 4;
    default: return 0;
    }
}

/* The YUV formats are numbered consecutively, NV12 … YUYV (keep it so when adding one). */
static inline int ei_pixel_is_yuv(uint32_t fmt) { return fmt >= EI_PIX_NV12 && fmt <= EI_PIX_YUYV; }

/* Rows of row_stride bytes one frame takes: the 4:2:0 formats add half a frame of chroma rows. */
static inline uint64_t ei_frame_rows(uint32_t fmt, uint32_t height) {
    return (fmt == EI_PIX_NV12 || fmt == EI_PIX_I420) ? (uint64_t)height * 3 / 2 : height;
}

/* THE frame-length rule: the bytes one whole frame takes, which is what a slot's payload_len must say.
 * row_stride 0 means packed rows (width * ei_pixel_channels(fmt)). Per format:
 *   gray8: row_stride * height (packed: width * height)
 *   rgb24, bgr24: row_stride * height (packed: width * height * 3); rgba32, bgra32: (packed: width * height * 4)
 *   nv12, i420: width * height * 3 / 2 (the Y rows, then height / 2 rows of chroma: 4:2:0)
 *   yuyv: width * height * 2
 * 0 for an unknown pixel format. The daemon counts a frame whose payload_len is below this as `short` and
 * serves nothing of it; ei_frame_producer_publish refuses any other payload_len. */
static inline uint64_t ei_frame_payload_len(uint32_t fmt, uint32_t width, uint32_t height, uint32_t row_stride) {
    uint32_t ch = ei_pixel_channels(fmt);
    if (!ch) return 0;
    uint64_t row = row_stride ? (uint64_t)row_stride : (uint64_t)width * ch;
    return row * ei_frame_rows(fmt, height);
}

static inline int ei_fail(ei_error *err, int code, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static inline int ei_fail(ei_error *err, int code, int sys_errno, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
        err->sys_errno = sys_errno;
    }
    return code;
}

/* 1 when `name` is a valid stream name: 1..EI_STREAM_NAME_MAX characters of
 * [A-Za-z0-9_-], the first alphanumeric. No path characters, no newline. */
static inline int ei_stream_name_ok(const char *name, size_t len) {
    if (len == 0 || len > EI_STREAM_NAME_MAX) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '_' && c != '-'))) return 0;
    }
    return 1;
}

static inline int ei_futex_wake(_Atomic uint32_t *addr) {
    /* Shared (not FUTEX_PRIVATE): the waiter is another process. */
    return (int)syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleeps while *addr == expected, at most timeout_ns. Returns, like every helper, an ei_status: EI_OK
 * when woken or when the word no longer held `expected`, EI_ERR_TIMEOUT when timeout_ns passed,
 * EI_ERR_AGAIN when a signal interrupted the sleep, EI_ERR_SYS (errno says which) for any other failure.
 * Works on a read-only shared mapping (a result ring's reader): FUTEX_WAIT only reads the word. */
static inline int ei_futex_wait(const _Atomic uint32_t *addr, uint32_t expected, uint64_t timeout_ns) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    if (syscall(SYS_futex, (const uint32_t *)addr, FUTEX_WAIT, expected, &ts, NULL, 0) == 0) return EI_OK;
    switch (errno) {
    case EAGAIN: return EI_OK; /* the word had already moved on */
    case ETIMEDOUT: return EI_ERR_TIMEOUT;
    case EINTR: return EI_ERR_AGAIN;
    default: return EI_ERR_SYS;
    }
}

/* ------------------------------------------------------------------ */
/* Ring memory: sealed memfds                                          */
/* ------------------------------------------------------------------ */

/* Creates a memfd of `size` bytes with every page reserved now (no memory is
 * an error here, never a SIGBUS later), mapped read-write. On success the
 * caller owns *fd_out and *base_out (munmap/close). */
static inline int ei__memfd_ring(const char *label, uint64_t size, int *fd_out, uint8_t **base_out, ei_error *err) {
    *fd_out = -1;
    *base_out = NULL;
    int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return ei_fail(err, EI_ERR_SYS, errno, "%s: memfd_create: %s", label, strerror(errno));
    int e = posix_fallocate(fd, 0, (off_t)size);
    if (e) {
        close(fd);
        return ei_fail(err, (e == ENOSPC || e == ENOMEM) ? EI_ERR_NOSPACE : EI_ERR_SYS, e,
                       "%s: cannot reserve %llu bytes for the ring: %s", label, (unsigned long long)size, strerror(e));
    }
    void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        e = errno;
        close(fd);
        return ei_fail(err, EI_ERR_SYS, e, "%s: mmap %llu bytes: %s", label, (unsigned long long)size, strerror(e));
    }
    *fd_out = fd;
    *base_out = (uint8_t *)base;
    return EI_OK;
}

static inline int ei__seal(int fd, int seals, const char *label, ei_error *err) {
    if (fcntl(fd, F_ADD_SEALS, seals) != 0)
        return ei_fail(err, EI_ERR_SYS, errno, "%s: sealing the ring: %s", label, strerror(errno));
    return EI_OK;
}

/* Checks an fd someone handed us before anything of it is mapped: a memfd
 * (a regular, unlinked file on the kernel's internal tmpfs), carrying at
 * least `need_seals`, none of `forbid_seals`, opened read-write when
 * `need_rdwr`, and of a size between the header and max_size. Fills *size_out. */
static inline int ei_ring_fd_check(int fd, const char *name, int need_seals, int forbid_seals, int need_rdwr,
                                   uint64_t max_size, uint64_t *size_out, ei_error *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return ei_fail(err, EI_ERR_SYS, errno, "%s: fstat: %s", name, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is not a memfd (not a regular file: mode %06o)", name,
                       (unsigned)st.st_mode);
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0) return ei_fail(err, EI_ERR_SYS, errno, "%s: fstatfs: %s", name, strerror(errno));
    if (sf.f_type != TMPFS_MAGIC)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is not a memfd (file system type 0x%lx; hugetlbfs and "
                       "disk files are refused)", name, (unsigned long)sf.f_type);
    if (st.st_nlink != 0)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is a named file (%lu links), not a memfd: anyone who can "
                       "open the name could write or resize it", name, (unsigned long)st.st_nlink);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd cannot be sealed (not a memfd): %s", name, strerror(errno));
    if ((seals & need_seals) != need_seals)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the memfd is not sealed (seals 0x%x, need 0x%x: "
                       "F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL%s)", name, (unsigned)seals, (unsigned)need_seals,
                       (need_seals & F_SEAL_FUTURE_WRITE) ? "|F_SEAL_FUTURE_WRITE" : "");
    if (seals & forbid_seals)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the memfd is write-sealed (seals 0x%x): its producer could not "
                       "write frames into it", name, (unsigned)seals);
    if (need_rdwr) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
            return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is not open read-write", name);
    }
    if ((uint64_t)st.st_size < EI_HEADER_SIZE)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: %llu bytes, smaller than the %u-byte header", name,
                       (unsigned long long)st.st_size, EI_HEADER_SIZE);
    if ((uint64_t)st.st_size > max_size)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: %llu bytes, larger than the %llu-byte limit for a ring", name,
                       (unsigned long long)st.st_size, (unsigned long long)max_size);
    *size_out = (uint64_t)st.st_size;
    return EI_OK;
}

/* Maps a checked ring fd: read-write (a frame ring's consumer writes its claim
 * in the header) or read-only (a result ring's reader). The caller owns the
 * mapping (munmap(*base_out, size)); the fd stays the caller's. */
static inline int ei_ring_map(int fd, uint64_t size, int writable, const char *name, uint8_t **base_out,
                              ei_error *err) {
    void *base = mmap(NULL, (size_t)size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        *base_out = NULL;
        return ei_fail(err, EI_ERR_SYS, errno, "%s: mmap %llu bytes%s: %s", name, (unsigned long long)size,
                       writable ? " read-write" : " read-only", strerror(errno));
    }
    *base_out = (uint8_t *)base;
    return EI_OK;
}

/* ------------------------------------------------------------------ */
/* Frame ring: geometry and validation                                 */
/* ------------------------------------------------------------------ */

/* What a producer asks for. */
typedef struct ei_frame_geometry {
    uint32_t width, height;
    uint32_t pixel_format; /* enum ei_pixel_format */
    uint32_t row_stride;   /* 0 = packed (width * channels) */
    uint32_t slot_count;   /* EI_MIN_SLOTS..EI_MAX_SLOTS */
    uint32_t colorimetry;  /* YUV formats: enum ei_colorimetry (0, BT.601 limited, if left out); else 0 */
} ei_frame_geometry;

/* A private, validated copy of a frame ring's geometry. Readers use only this,
 * never the shared header, so a producer cannot change it under them. */
typedef struct ei_frame_layout {
    uint64_t total_size;
    uint64_t slot_stride;
    uint64_t payload_capacity;
    uint32_t slot_count;
    uint32_t width, height, channels, pixel_format, row_stride;
    uint32_t rows;         /* rows of row_stride bytes per frame (ei_frame_rows) */
    uint32_t colorimetry;  /* enum ei_colorimetry for YUV formats, else 0 */
} ei_frame_layout;

/* Bytes of one whole frame of a ring (ei_frame_payload_len of its geometry): the payload_len to publish. */
static inline uint64_t ei_frame_bytes(const ei_frame_layout *l) {
    return ei_frame_payload_len(l->pixel_format, l->width, l->height, l->row_stride);
}

static inline int ei_frame_layout_from_geometry(const ei_frame_geometry *g, ei_frame_layout *out, const char *name,
                                                ei_error *err) {
    uint32_t ch = ei_pixel_channels(g->pixel_format);
    if (!ch) return ei_fail(err, EI_ERR_ARG, 0, "%s: unknown pixel format %u", name, g->pixel_format);
    if (g->width == 0 || g->height == 0 || g->width > EI_MAX_DIM || g->height > EI_MAX_DIM)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: frame size %ux%u outside 1..%u", name, g->width, g->height, EI_MAX_DIM);
    if (g->slot_count < EI_MIN_SLOTS || g->slot_count > EI_MAX_SLOTS)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: %u slots; need %u..%u", name, g->slot_count, EI_MIN_SLOTS,
                       EI_MAX_SLOTS);
    uint64_t packed = (uint64_t)g->width * ch;
    uint64_t row = g->row_stride ? g->row_stride : packed;
    if (row < packed || row > UINT32_MAX)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: row stride %llu smaller than a row (%llu bytes)", name,
                       (unsigned long long)row, (unsigned long long)packed);
    if (ei_pixel_is_yuv(g->pixel_format)) {
        /* The graph finds the chroma by offset: packed rows and whole chroma samples only. */
        if (g->width % 2 || g->height % 2)
            return ei_fail(err, EI_ERR_ARG, 0, "%s: a YUV frame needs an even width and height, not %ux%u", name,
                           g->width, g->height);
        if (row != packed)
            return ei_fail(err, EI_ERR_ARG, 0, "%s: YUV rows are packed: row stride %llu, expected %llu", name,
                           (unsigned long long)row, (unsigned long long)packed);
        if (g->colorimetry > EI_COLOUR_MAX)
            return ei_fail(err, EI_ERR_ARG, 0, "%s: unknown colorimetry %u", name, g->colorimetry);
    } else if (g->colorimetry) {
        return ei_fail(err, EI_ERR_ARG, 0, "%s: colorimetry %u given for an RGB/gray format", name, g->colorimetry);
    }
    out->width = g->width;
    out->height = g->height;
    out->channels = ch;
    out->pixel_format = g->pixel_format;
    out->row_stride = (uint32_t)row;
    out->rows = (uint32_t)ei_frame_rows(g->pixel_format, g->height);
    out->colorimetry = g->colorimetry;
    out->slot_count = g->slot_count;
    out->payload_capacity = ei_align_up(ei_frame_payload_len(g->pixel_format, g->width, g->height, (uint32_t)row));
    out->slot_stride = ei_align_up(EI_SLOT_HEADER_SIZE + out->payload_capacity);
    out->total_size = EI_HEADER_SIZE + (uint64_t)g->slot_count * out->slot_stride;
    return EI_OK;
}

/* Validates a mapped frame ring header against the ring's (sealed) size and
 * fills a private layout. Reads the shared header once, into a local copy, so
 * the checks and the result agree even if the producer scribbles concurrently. */
static inline int ei_frame_ring_check(const void *base, uint64_t ring_size, const char *name, ei_frame_layout *out,
                                      ei_error *err) {
    if (ring_size < EI_HEADER_SIZE)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: %llu bytes, smaller than the %u-byte header", name,
                       (unsigned long long)ring_size, EI_HEADER_SIZE);
    ei_frame_ring_header h;
    memcpy(&h, base, offsetof(ei_frame_ring_header, latest)); /* immutable part only */
    if (memcmp(h.magic, EI_FRAME_MAGIC, 8) != 0) {
        if (memcmp(h.magic, EI_RESULT_MAGIC, 8) == 0)
            return ei_fail(err, EI_ERR_MAGIC, 0, "%s: is a result ring, not a frame ring", name);
        if (memcmp(h.magic, "EIFRAME1", 8) == 0)
            return ei_fail(err, EI_ERR_ABI, 0, "%s: an ABI 1 frame ring; this daemon speaks ABI %u (rebuild the "
                           "camera against the new ring.h)", name, EI_ABI_VERSION);
        return ei_fail(err, EI_ERR_MAGIC, 0, "%s: not an edgeinfer frame ring (bad magic)", name);
    }
    if (h.abi_version != EI_ABI_VERSION)
        return ei_fail(err, EI_ERR_ABI, 0, "%s: ABI version %u, this build understands %u", name, h.abi_version,
                       EI_ABI_VERSION);
    ei_frame_geometry g = {h.width, h.height, h.pixel_format, h.row_stride, h.slot_count, h.colorimetry};
    ei_error sub;
    if (h.header_size != EI_HEADER_SIZE || h.slot_header_size != EI_SLOT_HEADER_SIZE)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: header size %u / slot header size %u, expected %u / %u", name,
                       h.header_size, h.slot_header_size, EI_HEADER_SIZE, EI_SLOT_HEADER_SIZE);
    if (h.row_stride == 0 || ei_frame_layout_from_geometry(&g, out, name, &sub) != EI_OK)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: bad geometry: %s", name, h.row_stride ? sub.msg : "row stride 0");
    if (h.channels != out->channels)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: %u channels does not match pixel format %u", name, h.channels,
                       h.pixel_format);
    if (h.payload_capacity < ei_frame_bytes(out) || h.payload_capacity > EI_MAX_PAYLOAD ||
        h.slot_stride < EI_SLOT_HEADER_SIZE + h.payload_capacity || h.slot_stride % EI_ALIGN ||
        h.slot_stride > EI_SLOT_HEADER_SIZE + EI_MAX_PAYLOAD)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: slot stride %llu / payload capacity %llu do not hold a %ux%u frame",
                       name, (unsigned long long)h.slot_stride, (unsigned long long)h.payload_capacity, h.width,
                       h.height);
    out->payload_capacity = h.payload_capacity;
    out->slot_stride = h.slot_stride;
    out->total_size = EI_HEADER_SIZE + (uint64_t)h.slot_count * h.slot_stride;
    if (h.total_size != out->total_size)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: declared size %llu, geometry needs %llu", name,
                       (unsigned long long)h.total_size, (unsigned long long)out->total_size);
    if (ring_size < out->total_size)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: ring is %llu bytes, its geometry needs %llu", name,
                       (unsigned long long)ring_size, (unsigned long long)out->total_size);
    if (ring_size != out->total_size)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: ring is %llu bytes, its geometry needs exactly %llu", name,
                       (unsigned long long)ring_size, (unsigned long long)out->total_size);
    return EI_OK;
}

static inline ei_frame_slot_header *ei_frame_slot(uint8_t *base, const ei_frame_layout *l, uint32_t slot) {
    return (ei_frame_slot_header *)(base + EI_HEADER_SIZE + (uint64_t)slot * l->slot_stride);
}

static inline uint8_t *ei_frame_payload(uint8_t *base, const ei_frame_layout *l, uint32_t slot) {
    return (uint8_t *)ei_frame_slot(base, l, slot) + EI_SLOT_HEADER_SIZE;
}

/* ------------------------------------------------------------------ */
/* Frame ring: producer                                                */
/* ------------------------------------------------------------------ */

typedef struct ei_frame_producer {
    int fd;                    /* owns: the sealed memfd; hand a copy to the daemon (ei_ingress) */
    uint8_t *base;             /* owns: read-write mapping of the whole ring */
    ei_frame_ring_header *hdr; /* borrowed: == base */
    ei_frame_layout layout;    /* what we created; never re-read from shared memory */
    uint64_t next_seq;         /* seq the next publish gets (1-based) */
    uint32_t latest_slot;      /* slot of our last publish, EI_NO_SLOT before the first */
    uint32_t writing;          /* slot reserved by begin(), EI_NO_SLOT if none */
    uint32_t cursor;           /* where the next slot search starts (round robin) */
} ei_frame_producer;

/* Counts the frame rings this process created (per file that includes ring.h: it is header-only), for the
 * header's `generation`: 1 for the first ring, 2 for the next (after a geometry change, say), ... A producer
 * that counts otherwise (across its own restarts) stores its number in hdr->generation before handing over. */
static inline uint32_t ei__rings_created(void) {
    static _Atomic uint32_t created = 0;
    return atomic_fetch_add(&created, 1) + 1;
}

/* Creates a frame ring as a sealed memfd (`label` names it in /proc/PID/fd).
 * Its size is sealed before anyone else sees it, so it can never shrink under
 * a mapping. Nothing is shared yet: hand p->fd to the daemon with ei_ingress. */
static inline int ei_frame_producer_create(ei_frame_producer *p, const char *label, const ei_frame_geometry *g,
                                           ei_error *err) {
    memset(p, 0, sizeof *p);
    p->fd = -1;
    ei_frame_layout l;
    int rc = ei_frame_layout_from_geometry(g, &l, label, err);
    if (rc) return rc;
    uint8_t *base;
    int fd;
    rc = ei__memfd_ring(label, l.total_size, &fd, &base, err);
    if (rc) return rc;
    ei_frame_ring_header *h = (ei_frame_ring_header *)base;
    memcpy(h->magic, EI_FRAME_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->header_size = EI_HEADER_SIZE;
    h->total_size = l.total_size;
    h->slot_count = l.slot_count;
    h->slot_header_size = EI_SLOT_HEADER_SIZE;
    h->slot_stride = l.slot_stride;
    h->payload_capacity = l.payload_capacity;
    h->width = l.width;
    h->height = l.height;
    h->channels = l.channels;
    h->pixel_format = l.pixel_format;
    h->row_stride = l.row_stride;
    h->colorimetry = l.colorimetry;
    /* The consumer's line too is the producer's to initialise: `claimed` must say "no slot" (a zero would
     * be a claim of slot 0) before anyone sees the ring. */
    atomic_store(&h->claimed, EI_NO_SLOT);
    atomic_store(&h->producer_pid, (uint32_t)getpid());
    atomic_store(&h->generation, ei__rings_created());
    rc = ei__seal(fd, EI_FRAME_SEALS, label, err);
    if (rc) {
        munmap(base, l.total_size);
        close(fd);
        return rc;
    }
    p->fd = fd;
    p->base = base;
    p->hdr = h;
    p->layout = l;
    p->next_seq = 1;
    p->latest_slot = EI_NO_SLOT;
    p->writing = EI_NO_SLOT;
    return EI_OK;
}

/* Reserves a slot to write the next frame into and returns its payload.
 * Never blocks: with >= 3 slots one is neither claimed nor latest. */
static inline uint8_t *ei_frame_producer_begin(ei_frame_producer *p) {
    if (p->writing != EI_NO_SLOT) return ei_frame_payload(p->base, &p->layout, p->writing);
    const uint32_t n = p->layout.slot_count;
    for (;;) {
        uint32_t claimed = atomic_load(&p->hdr->claimed);
        uint32_t s = p->cursor;
        for (uint32_t i = 0; i < n; i++, s = (s + 1) % n)
            if (s != claimed && s != p->latest_slot) break;
        ei_frame_slot_header *sh = ei_frame_slot(p->base, &p->layout, s);
        uint64_t old = atomic_load(&sh->word);
        /* Dekker: announce WRITING, then re-check the claim (both seq_cst). */
        atomic_store(&sh->word, (old & ~(uint64_t)0xff) | EI_SLOT_WRITING);
        if (atomic_load(&p->hdr->claimed) == s) {
            /* The consumer claimed it meanwhile and may hold it: give it back untouched. */
            atomic_store(&sh->word, old);
            atomic_fetch_add_explicit(&p->hdr->producer_backoffs, 1, memory_order_relaxed);
            continue;
        }
        p->writing = s;
        p->cursor = (s + 1) % n;
        return ei_frame_payload(p->base, &p->layout, s);
    }
}

/* Publishes the slot reserved by begin() whatever its payload_len says: no check. Internal (and the tool of
 * tests that play a broken producer); a camera calls ei_frame_producer_publish. */
static inline int64_t ei__frame_producer_commit(ei_frame_producer *p, uint64_t capture_mono_ns,
                                                uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len) {
    uint32_t s = p->writing;
    if (s == EI_NO_SLOT) return EI_ERR_STATE;
    ei_frame_slot_header *sh = ei_frame_slot(p->base, &p->layout, s);
    uint64_t seq = p->next_seq++;
    sh->capture_mono_ns = capture_mono_ns;
    sh->capture_real_ns = capture_real_ns;
    sh->frame_id = frame_id;
    sh->payload_len = payload_len < p->layout.payload_capacity ? payload_len : p->layout.payload_capacity;
    atomic_store(&sh->word, seq << 8 | EI_SLOT_READY);
    /* `published` first: a consumer that sees `latest` = seq also sees published >= seq, so a
     * `latest` ahead of `published` can only be a lie, never a race. */
    atomic_store(&p->hdr->published, seq);
    atomic_store(&p->hdr->latest, seq << 8 | s);
    /* Dekker with the sleeping consumer: bump the bell, then look for waiters. */
    atomic_fetch_add(&p->hdr->doorbell, 1);
    if (atomic_load(&p->hdr->waiters)) ei_futex_wake(&p->hdr->doorbell);
    p->latest_slot = s;
    p->writing = EI_NO_SLOT;
    return (int64_t)seq;
}

/* Publishes the slot reserved by begin(). payload_len must be the whole frame, ei_frame_bytes(&p->layout)
 * (ei_frame_payload_len: nv12/i420 take height * 3 / 2 rows). Returns the frame's seq (> 0), or a negative
 * ei_status and publishes nothing: EI_ERR_ARG when payload_len is not the frame's length (the slot stays
 * reserved: fill the frame and publish again with the right length), EI_ERR_STATE when nothing was reserved. */
static inline int64_t ei_frame_producer_publish(ei_frame_producer *p, uint64_t capture_mono_ns,
                                                uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len) {
    if (p->writing == EI_NO_SLOT) return EI_ERR_STATE;
    if (payload_len != ei_frame_bytes(&p->layout)) return EI_ERR_ARG;
    return ei__frame_producer_commit(p, capture_mono_ns, capture_real_ns, frame_id, payload_len);
}

/* Marks the ring closed: its consumer sees it at once. Keeps the mapping. */
static inline void ei_frame_producer_retire(ei_frame_producer *p) {
    if (!p->base) return;
    atomic_fetch_or(&p->hdr->flags, EI_RING_CLOSED);
    atomic_fetch_add(&p->hdr->doorbell, 1);
    ei_futex_wake(&p->hdr->doorbell);
}

/* retire(), then unmap and close the memfd. The daemon keeps its own mapping
 * until it drops the stream. */
static inline void ei_frame_producer_close(ei_frame_producer *p) {
    if (!p->base) return;
    ei_frame_producer_retire(p);
    munmap(p->base, p->layout.total_size);
    close(p->fd);
    p->base = NULL;
    p->hdr = NULL;
    p->fd = -1;
}

/* ------------------------------------------------------------------ */
/* Frame ring: consumer (exactly one per ring: the daemon)             */
/* ------------------------------------------------------------------ */

typedef struct ei_frame_consumer {
    uint8_t *base;             /* borrowed: mapping owned by the caller (header RW, slots read-only) */
    ei_frame_ring_header *hdr; /* borrowed: == base */
    ei_frame_layout layout;    /* private validated copy */
    uint64_t last_seq;         /* seq of the last frame taken (acquired or refused as short) */
    uint64_t seen_latest;      /* the `latest` word last consumed: only a different word is news */
    uint64_t pending_since_ns; /* CLOCK_MONOTONIC when the consumer first saw news, 0 = none pending */
    uint32_t held;             /* slot we hold, EI_NO_SLOT if none */
    uint32_t seen_flags;       /* ring flags already reported to the caller */
} ei_frame_consumer;

/* Metadata of an acquired frame (copied out of the slot header). */
typedef struct ei_frame_info {
    uint64_t seq;
    uint64_t capture_mono_ns;
    uint64_t capture_real_ns;
    uint64_t frame_id;
    uint64_t payload_len;
    uint64_t pending_since_ns; /* when the consumer first saw news (the daemon's own arrival time) */
    uint32_t slot;
    uint32_t generation;
} ei_frame_info;

/* Starts consuming a ring already checked (ei_ring_fd_check) and mapped
 * read-write (ei_ring_map): validates the header into a private layout and
 * makes the slots read-only to us. Leaves the consumer's line of the header as
 * it is: the daemon's lanes (several processes taking turns on one ring) join
 * it this way, with others possibly asleep on it (counted in `waiters`). */
static inline int ei_frame_consumer_join(ei_frame_consumer *c, uint8_t *base, uint64_t size, const char *name,
                                         ei_error *err) {
    memset(c, 0, sizeof *c);
    int rc = ei_frame_ring_check(base, size, name, &c->layout, err);
    if (rc) return rc;
    /* Frames are read-only to the consumer: a stray write faults instead of corrupting them. */
    if (mprotect(base + EI_HEADER_SIZE, (size_t)size - EI_HEADER_SIZE, PROT_READ) != 0)
        return ei_fail(err, EI_ERR_SYS, errno, "%s: mprotect: %s", name, strerror(errno));
    c->base = base;
    c->hdr = (ei_frame_ring_header *)base;
    c->held = EI_NO_SLOT;
    return EI_OK;
}

/* Where a consumer that adopts a ring (a restarted daemon, or a producer
 * handing the same ring over again) starts counting: after `consumed`, the
 * last frame an earlier consumer of this ring took or refused. Frames up to it
 * were that consumer's to account for and are not counted again; the ones
 * published after it, which nobody took, are counted once, as skipped, by the
 * adopter when it takes its first frame. A `consumed` beyond `published` was
 * not written by a consumer: ignored (counted from the ring's first frame). */
static inline void ei_frame_consumer_resume(ei_frame_consumer *c) {
    uint64_t consumed = atomic_load(&c->hdr->consumed);
    uint64_t latest = atomic_load(&c->hdr->latest);
    if (consumed > atomic_load(&c->hdr->published)) consumed = 0;
    c->last_seq = consumed;
    c->seen_latest = consumed != 0 && latest >> 8 == consumed ? latest : 0; /* already consumed: not news */
}

/* ei_frame_consumer_join, then drops whatever a previous consumer (a process
 * that died) left in the consumer's line: the one consumer of a ring. Carries
 * on counting from where it stopped (ei_frame_consumer_resume). */
static inline int ei_frame_consumer_init(ei_frame_consumer *c, uint8_t *base, uint64_t size, const char *name,
                                         ei_error *err) {
    int rc = ei_frame_consumer_join(c, base, size, name, err);
    if (rc) return rc;
    atomic_store(&c->hdr->claimed, EI_NO_SLOT);
    atomic_store(&c->hdr->waiters, 0);
    atomic_store(&c->hdr->consumer_pid, (uint32_t)getpid());
    ei_frame_consumer_resume(c);
    return EI_OK;
}

/* Something new for the caller: a `latest` word not consumed yet, or a flag change. */
static inline int ei_frame_consumer_ready(const ei_frame_consumer *c) {
    uint64_t latest = atomic_load_explicit(&c->hdr->latest, memory_order_acquire);
    return (latest != 0 && latest != c->seen_latest) ||
           atomic_load_explicit(&c->hdr->flags, memory_order_acquire) != c->seen_flags;
}

/* Records the daemon's own arrival time of news (for deadlines that a
 * producer's clock cannot buy): the first time news is seen since the last
 * acquire. Returns the pending-since time, 0 if nothing is pending. */
static inline uint64_t ei_frame_consumer_note(ei_frame_consumer *c, uint64_t now_ns) {
    uint64_t latest = atomic_load_explicit(&c->hdr->latest, memory_order_acquire);
    if (latest == 0 || latest == c->seen_latest) return 0;
    if (!c->pending_since_ns) c->pending_since_ns = now_ns;
    return c->pending_since_ns;
}

/* Claims the newest complete frame if `latest` changed since the last look.
 * Returns 1 (claimed, *out filled), 0 (nothing new), EI_ERR_STATE (already
 * holding one), EI_ERR_SHORT (the frame's payload_len is short: skipped, with
 * *out filled except for the slot) or EI_ERR_CORRUPT (the producer wrote a
 * `latest` that names no published frame: skipped). A bad word is consumed
 * once: it is never retried, and it never stops the frames after it. */
static inline int ei_frame_consumer_acquire(ei_frame_consumer *c, ei_frame_info *out) {
    if (c->held != EI_NO_SLOT) return EI_ERR_STATE;
    ei_frame_ring_header *h = c->hdr;
    uint64_t latest = atomic_load(&h->latest);
    for (int tries = 0;; tries++) {
        if (latest == 0 || latest == c->seen_latest) return 0;
        c->seen_latest = latest;
        out->pending_since_ns = c->pending_since_ns;
        c->pending_since_ns = 0;
        uint64_t seq = latest >> 8;
        uint32_t slot = (uint32_t)(latest & 0xff);
        /* `published` is stored before `latest`: a seq beyond it was never published. */
        if (slot >= c->layout.slot_count || seq > atomic_load(&h->published)) return EI_ERR_CORRUPT;
        if (seq <= c->last_seq) {
            /* Backwards: never honest. Resynchronise so that the frames after it are served. */
            c->last_seq = seq;
            atomic_store_explicit(&h->consumed, seq, memory_order_relaxed);
            return EI_ERR_CORRUPT;
        }
        /* Dekker: announce the claim, then check the slot still holds `seq` (both seq_cst). */
        atomic_store(&h->claimed, slot);
        ei_frame_slot_header *sh = ei_frame_slot(c->base, &c->layout, slot);
        if (atomic_load(&sh->word) == (seq << 8 | EI_SLOT_READY)) {
            uint64_t len = sh->payload_len;
            out->seq = seq;
            out->capture_mono_ns = sh->capture_mono_ns;
            out->capture_real_ns = sh->capture_real_ns;
            out->frame_id = sh->frame_id;
            out->payload_len = len;
            out->slot = slot;
            out->generation = atomic_load_explicit(&h->generation, memory_order_relaxed);
            c->last_seq = seq;
            /* Accounted for from here on (taken, or refused below): a consumer adopting the ring after us
             * starts after it (ei_frame_consumer_resume). Relaxed: that consumer comes after a syscall. */
            atomic_store_explicit(&h->consumed, seq, memory_order_relaxed);
            if (len > c->layout.payload_capacity) {
                atomic_store(&h->claimed, EI_NO_SLOT);
                return EI_ERR_CORRUPT;
            }
            if (len < ei_frame_bytes(&c->layout)) {
                atomic_store(&h->claimed, EI_NO_SLOT);
                return EI_ERR_SHORT;
            }
            c->held = slot;
            atomic_fetch_add_explicit(&h->claims, 1, memory_order_relaxed);
            return 1;
        }
        /* The slot no longer holds `seq`. An honest producer only rewrites it after publishing a newer
         * frame, so `latest` has moved on (seq_cst: its store precedes the WRITING store we saw): take
         * that one. A `latest` that did not move names a frame that is not there: a lie. */
        atomic_store(&h->claimed, EI_NO_SLOT);
        atomic_fetch_add_explicit(&h->claim_retries, 1, memory_order_relaxed);
        uint64_t again = atomic_load(&h->latest);
        if (again == latest || tries >= 1000) return EI_ERR_CORRUPT;
        latest = again;
    }
}

static inline void ei_frame_consumer_release(ei_frame_consumer *c) {
    if (c->held == EI_NO_SLOT) return;
    atomic_store(&c->hdr->claimed, EI_NO_SLOT);
    c->held = EI_NO_SLOT;
}

/* ------------------------------------------------------------------ */
/* Waiting on many rings at once                                       */
/* ------------------------------------------------------------------ */

struct ei_futex_waitv { /* the kernel's struct futex_waitv (Linux >= 5.16) */
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};

/* A consumer's defence against a ring whose writer rings the doorbell without news (a camera that
 * wants to keep the consumer's CPU busy with wake-ups). More than EI_SPURIOUS_LIMIT wakes without news
 * within EI_SPURIOUS_WINDOW_NS, and ei_wait_any stops sleeping on that doorbell for EI_MUTE_NS: it
 * looks at the ring every EI_MUTED_POLL_NS instead. So that ring's own frames are seen up to 1 ms late
 * meanwhile, and nobody else's are. An honest producer wakes once per frame: it would need 3,200
 * frames/s to be muted. The caller keeps one guard per ring, across calls. */
#define EI_SPURIOUS_LIMIT 32u
#define EI_SPURIOUS_WINDOW_NS 10000000ull /* 10 ms */
#define EI_MUTE_NS 100000000ull           /* 100 ms */
#define EI_MUTED_POLL_NS 1000000ull       /* 1 ms */

typedef struct ei_wake_guard {
    uint64_t window_start_ns; /* start of the current counting window (CLOCK_MONOTONIC) */
    uint64_t muted_until_ns;  /* not slept on before this time; 0 = never muted */
    uint64_t mutes;           /* times muted: for the caller's counters */
    uint32_t spurious;        /* wakes without news in the current window */
    uint32_t reserved;
} ei_wake_guard;

/* Anything whose readiness can be waited for: a doorbell, a waiter counter and a predicate. */
typedef struct ei_waitable {
    const _Atomic uint32_t *doorbell; /* borrowed: futex word (shared, or private to the process) */
    _Atomic uint32_t *waiters;        /* borrowed: waiter counter next to it, or NULL (a read-only ring) */
    int (*ready)(const void *);       /* true when the caller has something to do */
    const void *obj;                  /* borrowed: argument of ready() */
    ei_wake_guard *guard;             /* borrowed: the caller's guard for this ring, or NULL (a trusted writer) */
} ei_waitable;

static inline void ei__wake_guard_note(ei_wake_guard *g, uint64_t now) {
    if (now - g->window_start_ns > EI_SPURIOUS_WINDOW_NS) {
        g->window_start_ns = now;
        g->spurious = 0;
    }
    if (++g->spurious > EI_SPURIOUS_LIMIT) {
        g->muted_until_ns = now + EI_MUTE_NS;
        g->spurious = 0;
        g->mutes++;
    }
}

static inline int ei__frame_ready_cb(const void *c) { return ei_frame_consumer_ready((const ei_frame_consumer *)c); }

static inline ei_waitable ei_frame_waitable(ei_frame_consumer *c) {
    ei_waitable w = {&c->hdr->doorbell, &c->hdr->waiters, ei__frame_ready_cb, c, NULL};
    return w;
}

static inline uint64_t ei__ready_mask(const ei_waitable *w, uint32_t n) {
    uint64_t mask = 0;
    for (uint32_t i = 0; i < n; i++)
        if (w[i].ready(w[i].obj)) mask |= 1ull << i;
    return mask;
}

/* Sleeps until `until`, on the doorbells of w[i] for the i in `slept` (none: a plain sleep). */
static inline void ei__sleep_on(const ei_waitable *w, uint32_t n, uint64_t slept, const uint32_t *bell,
                                uint64_t now, uint64_t until, int use_waitv) {
    static _Atomic int waitv_missing = 0;
    struct ei_futex_waitv fw[EI_MAX_WAIT];
    uint32_t idx[EI_MAX_WAIT], m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (slept >> i & 1) idx[m++] = i;
    if (m == 0) {
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    } else if (m == 1) {
        ei_futex_wait(w[idx[0]].doorbell, bell[idx[0]], until - now);
    } else if (use_waitv && !atomic_load_explicit(&waitv_missing, memory_order_relaxed)) {
        for (uint32_t k = 0; k < m; k++) {
            fw[k].val = bell[idx[k]];
            fw[k].uaddr = (uint64_t)(uintptr_t)w[idx[k]].doorbell;
            fw[k].flags = FUTEX2_SIZE_U32; /* shared: no FUTEX2_PRIVATE */
            fw[k].reserved = 0;
        }
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        if (syscall(SYS_futex_waitv, fw, m, 0, &ts, CLOCK_MONOTONIC) < 0 && errno == ENOSYS)
            atomic_store_explicit(&waitv_missing, 1, memory_order_relaxed);
    } else {
        /* Fallback: sleep on each ring in turn for a short slice. */
        uint64_t slice = 1000000ull / m + 1;
        if (slice > until - now) slice = until - now;
        for (uint32_t k = 0; k < m && !ei__ready_mask(w, n); k++) ei_futex_wait(w[idx[k]].doorbell, bell[idx[k]], slice);
    }
}

/* Waits until at least one of w[0..n) is ready, at most timeout_ns, first
 * spinning up to spin_ns. Returns a bitmask of the ready ones (0 = timed out).
 * use_waitv = 0 forces the fallback (per-ring timed waits in 1 ms slices),
 * which is also used automatically when the kernel lacks futex_waitv.
 * A ring with a guard that rings without news is muted (ei_wake_guard). */
static inline uint64_t ei_wait_any(const ei_waitable *w, uint32_t n, uint64_t timeout_ns, uint64_t spin_ns,
                                   int use_waitv) {
    if (n == 0 || n > EI_MAX_WAIT) return 0;
    uint64_t mask = ei__ready_mask(w, n);
    if (mask) return mask;
    uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
    const uint64_t deadline = now + timeout_ns;
    if (spin_ns) {
        const uint64_t spin_end = now + (spin_ns < timeout_ns ? spin_ns : timeout_ns);
        while (!(mask = ei__ready_mask(w, n))) {
            ei_cpu_relax();
            if (ei_now_ns(CLOCK_MONOTONIC) >= spin_end) break;
        }
        if (mask) return mask;
    }
    uint32_t bell[EI_MAX_WAIT];
    for (;;) {
        /* The doorbells slept on this round: all but the muted ones. */
        now = ei_now_ns(CLOCK_MONOTONIC);
        uint64_t slept = 0;
        for (uint32_t i = 0; i < n; i++)
            if (!w[i].guard || w[i].guard->muted_until_ns <= now) slept |= 1ull << i;
        const uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
        /* Dekker with the producer: count ourselves as waiting, read the bells, re-check. (A read-only
         * ring has no counter: its writer wakes on every commit while readers are connected.) */
        for (uint32_t i = 0; i < n; i++)
            if ((slept >> i & 1) && w[i].waiters) atomic_fetch_add(w[i].waiters, 1);
        for (uint32_t i = 0; i < n; i++) bell[i] = atomic_load(w[i].doorbell);
        mask = ei__ready_mask(w, n);
        if (!mask && now < deadline) {
            uint64_t until = deadline;
            if (slept != all && now + EI_MUTED_POLL_NS < until) until = now + EI_MUTED_POLL_NS;
            ei__sleep_on(w, n, slept, bell, now, until, use_waitv);
        }
        for (uint32_t i = 0; i < n; i++)
            if ((slept >> i & 1) && w[i].waiters) atomic_fetch_sub(w[i].waiters, 1);
        if (mask) return mask;
        mask = ei__ready_mask(w, n);
        now = ei_now_ns(CLOCK_MONOTONIC);
        for (uint32_t i = 0; i < n; i++) /* rang, and nothing to do: count it against that ring */
            if ((slept >> i & 1) && w[i].guard && !(mask >> i & 1) && atomic_load(w[i].doorbell) != bell[i])
                ei__wake_guard_note(w[i].guard, now);
        if (mask || now >= deadline) return mask;
    }
}

/* ------------------------------------------------------------------ */
/* Result ring: one writer, any number of read-only readers (seqlock)  */
/* ------------------------------------------------------------------ */

typedef struct ei_result_layout {
    uint64_t total_size;
    uint64_t record_stride;
    uint64_t payload_capacity;
    uint32_t record_count;
} ei_result_layout;

static inline int ei_result_layout_make(uint32_t record_count, uint64_t payload_capacity, ei_result_layout *out,
                                        const char *name, ei_error *err) {
    if (record_count < EI_MIN_RECORDS || record_count > EI_MAX_RECORDS)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: %u records; need %u..%u", name, record_count, EI_MIN_RECORDS,
                       EI_MAX_RECORDS);
    if (payload_capacity > EI_MAX_PAYLOAD)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: payload capacity %llu too large", name,
                       (unsigned long long)payload_capacity);
    out->record_count = record_count;
    out->payload_capacity = ei_align_up(payload_capacity);
    out->record_stride = EI_RECORD_HEADER_SIZE + out->payload_capacity;
    out->total_size = EI_HEADER_SIZE + (uint64_t)record_count * out->record_stride;
    return EI_OK;
}

static inline int ei_result_ring_check(const void *base, uint64_t ring_size, const char *name,
                                       ei_result_layout *out, ei_error *err) {
    if (ring_size < EI_HEADER_SIZE)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: %llu bytes, smaller than the %u-byte header", name,
                       (unsigned long long)ring_size, EI_HEADER_SIZE);
    ei_result_ring_header h;
    memcpy(&h, base, offsetof(ei_result_ring_header, head));
    if (memcmp(h.magic, EI_RESULT_MAGIC, 8) != 0) {
        if (memcmp(h.magic, EI_FRAME_MAGIC, 8) == 0)
            return ei_fail(err, EI_ERR_MAGIC, 0, "%s: is a frame ring, not a result ring", name);
        return ei_fail(err, EI_ERR_MAGIC, 0, "%s: not an edgeinfer result ring (bad magic)", name);
    }
    if (h.abi_version != EI_ABI_VERSION)
        return ei_fail(err, EI_ERR_ABI, 0, "%s: ABI version %u, this build understands %u", name, h.abi_version,
                       EI_ABI_VERSION);
    ei_error sub;
    if (h.header_size != EI_HEADER_SIZE || h.record_header_size != EI_RECORD_HEADER_SIZE ||
        ei_result_layout_make(h.record_count, h.payload_capacity, out, name, &sub) != EI_OK ||
        out->payload_capacity != h.payload_capacity || out->record_stride != h.record_stride ||
        out->total_size != h.total_size)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: inconsistent result ring geometry (%u records of %llu bytes)",
                       name, h.record_count, (unsigned long long)h.record_stride);
    if (ring_size < out->total_size)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: ring is %llu bytes, its geometry needs %llu", name,
                       (unsigned long long)ring_size, (unsigned long long)out->total_size);
    return EI_OK;
}

static inline ei_result_record_header *ei_result_record(uint8_t *base, const ei_result_layout *l, uint64_t n) {
    return (ei_result_record_header *)(base + EI_HEADER_SIZE + ((n - 1) % l->record_count) * l->record_stride);
}

typedef struct ei_result_writer {
    int fd;                     /* owns: the sealed memfd; readers get copies of it */
    uint8_t *base;              /* owns: the one read-write mapping (made before sealing) */
    ei_result_ring_header *hdr; /* borrowed: == base */
    ei_result_layout layout;    /* what we created */
    uint64_t head;              /* number of our last record; private, never read back */
    _Atomic int wake;           /* FUTEX_WAKE on every commit: set while any reader is connected */
} ei_result_writer;

/* Creates a result ring as a memfd, maps it read-write, initialises it and
 * then seals it: no mapping made from now on can write it (F_SEAL_FUTURE_WRITE),
 * and its size is fixed. Hand readers copies of wr->fd. */
static inline int ei_result_writer_create(ei_result_writer *wr, const char *label, uint32_t record_count,
                                          uint64_t payload_capacity, uint32_t generation, ei_error *err) {
    memset(wr, 0, sizeof *wr);
    wr->fd = -1;
    ei_result_layout l;
    int rc = ei_result_layout_make(record_count, payload_capacity, &l, label, err);
    if (rc) return rc;
    uint8_t *base;
    int fd;
    rc = ei__memfd_ring(label, l.total_size, &fd, &base, err);
    if (rc) return rc;
    ei_result_ring_header *h = (ei_result_ring_header *)base;
    memcpy(h->magic, EI_RESULT_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->header_size = EI_HEADER_SIZE;
    h->total_size = l.total_size;
    h->record_count = l.record_count;
    h->record_header_size = EI_RECORD_HEADER_SIZE;
    h->record_stride = l.record_stride;
    h->payload_capacity = l.payload_capacity;
    atomic_store(&h->writer_pid, (uint32_t)getpid());
    atomic_store(&h->generation, generation);
    rc = ei__seal(fd, EI_RESULT_SEALS, label, err);
    /* Owner-read only: reopening it through /proc/PID/fd gives another user nothing (the seals already
     * forbid every write; this is defence in depth). */
    if (rc == EI_OK && fchmod(fd, 0400) != 0) rc = ei_fail(err, EI_ERR_SYS, errno, "%s: fchmod: %s", label, strerror(errno));
    if (rc) {
        munmap(base, l.total_size);
        close(fd);
        return rc;
    }
    wr->fd = fd;
    wr->base = base;
    wr->hdr = h;
    wr->layout = l;
    return EI_OK;
}

/* Opens the next record for writing: marks it busy (odd seqlock) and returns
 * its header; the caller fills header fields and payload, then commits. */
static inline ei_result_record_header *ei_result_writer_begin(ei_result_writer *wr) {
    uint64_t n = wr->head + 1;
    ei_result_record_header *r = ei_result_record(wr->base, &wr->layout, n);
    atomic_store_explicit(&r->seqlock, n << 1 | 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* the odd mark is visible before any body store */
    return r;
}

static inline uint8_t *ei_result_payload(ei_result_record_header *r) { return (uint8_t *)r + EI_RECORD_HEADER_SIZE; }

static inline uint64_t ei_result_writer_commit(ei_result_writer *wr, ei_result_record_header *r) {
    uint64_t n = ++wr->head;
    if (r->payload_len > wr->layout.payload_capacity) r->payload_len = (uint32_t)wr->layout.payload_capacity;
    atomic_store_explicit(&r->seqlock, n << 1, memory_order_release);
    atomic_store(&wr->hdr->head, n);
    atomic_fetch_add(&wr->hdr->doorbell, 1);
    /* Readers cannot count themselves (they never write): wake whenever anyone may be listening. */
    if (atomic_load_explicit(&wr->wake, memory_order_relaxed)) ei_futex_wake(&wr->hdr->doorbell);
    return n;
}

/* Marks the ring closed and wakes its readers. Does not unmap or close. */
static inline void ei_result_writer_retire(ei_result_writer *wr) {
    if (!wr->base) return;
    atomic_fetch_or(&wr->hdr->flags, EI_RING_CLOSED);
    atomic_fetch_add(&wr->hdr->doorbell, 1);
    ei_futex_wake(&wr->hdr->doorbell);
}

typedef struct ei_result_reader {
    const uint8_t *base;              /* borrowed: read-only mapping owned by the caller */
    const ei_result_ring_header *hdr; /* borrowed: == base */
    ei_result_layout layout;          /* private validated copy */
    uint64_t next;                    /* number of the next record to read */
    uint64_t missed;                  /* records overwritten before we read them, in total */
    uint32_t seen_flags;              /* ring flags already reported */
} ei_result_reader;

/* Starts reading a result ring already checked (ei_ring_fd_check with
 * EI_RESULT_SEALS: nobody but the daemon's own mapping can write it) and
 * mapped read-only. from_oldest: start at the oldest record still held, else
 * at the next one written. */
static inline int ei_result_reader_init(ei_result_reader *rd, const uint8_t *base, uint64_t size, const char *name,
                                        int from_oldest, ei_error *err) {
    memset(rd, 0, sizeof *rd);
    int rc = ei_result_ring_check(base, size, name, &rd->layout, err);
    if (rc) return rc;
    rd->base = base;
    rd->hdr = (const ei_result_ring_header *)base;
    uint64_t head = atomic_load(&rd->hdr->head);
    uint64_t oldest = head > rd->layout.record_count ? head - rd->layout.record_count + 1 : 1;
    rd->next = from_oldest ? oldest : head + 1;
    return EI_OK;
}

static inline int ei_result_reader_ready(const ei_result_reader *rd) {
    return atomic_load_explicit(&rd->hdr->head, memory_order_acquire) >= rd->next ||
           atomic_load_explicit(&rd->hdr->flags, memory_order_acquire) != rd->seen_flags;
}

static inline int ei__result_ready_cb(const void *r) { return ei_result_reader_ready((const ei_result_reader *)r); }

static inline ei_waitable ei_result_waitable(ei_result_reader *rd) {
    ei_waitable w = {&rd->hdr->doorbell, NULL, ei__result_ready_cb, rd, NULL}; /* no waiter count: read-only */
    return w;
}

/* Record numbers above this cannot be honest: the seqlock word holds n << 1. */
#define EI_MAX_RECORD_NUMBER (UINT64_C(1) << 62)

/* Copies the next record (header + payload_len bytes of payload) into hdr_out
 * and payload_out (payload_cap bytes). Returns 1 when a record was copied, 0
 * when none is available yet (or the writer overwrote every candidate while we
 * looked: call again), -1 when `head` is corrupt (beyond EI_MAX_RECORD_NUMBER,
 * or behind what was already read), EI_ERR_BUFFER when the record's payload
 * does not fit payload_cap: the record is read and consumed, hdr_out is whole
 * (its payload_len says the record's real length) but only the first
 * payload_cap bytes of the payload were copied. A buffer of
 * rd->layout.payload_capacity bytes never gets EI_ERR_BUFFER. *missed_out gets
 * how many records were overwritten before this one could be read (also added
 * to rd->missed). Bounded: a writer can make it return 0, never spin forever. */
static inline int ei_result_reader_next(ei_result_reader *rd, ei_result_record_header *hdr_out, uint8_t *payload_out,
                                        uint64_t payload_cap, uint64_t *missed_out) {
    *missed_out = 0;
    for (uint64_t tries = 0; tries <= (uint64_t)rd->layout.record_count + 2; tries++) {
        uint64_t head = atomic_load_explicit(&rd->hdr->head, memory_order_acquire);
        if (head > EI_MAX_RECORD_NUMBER || head + 1 < rd->next) return -1;
        if (head < rd->next) return 0;
        /* Records older than head - count + 2 may be mid-overwrite: skip ahead. */
        if (head - rd->next + 1 >= rd->layout.record_count) {
            uint64_t skip_to = head - rd->layout.record_count + 2;
            *missed_out += skip_to - rd->next;
            rd->missed += skip_to - rd->next;
            rd->next = skip_to;
        }
        uint64_t n = rd->next;
        const ei_result_record_header *r =
            ei_result_record((uint8_t *)(uintptr_t)rd->base, &rd->layout, n); /* read-only despite the cast */
        uint64_t s1 = atomic_load_explicit(&r->seqlock, memory_order_acquire);
        if (s1 != n << 1) {
            /* Head says n is complete, so a different word means a newer lap overwrote it. */
            *missed_out += 1;
            rd->missed += 1;
            rd->next = n + 1;
            continue;
        }
        memcpy(hdr_out, r, sizeof *hdr_out);
        uint64_t len = hdr_out->payload_len;
        /* The writer never commits more than the capacity; a mapping is never read past it either way. */
        if (len > rd->layout.payload_capacity) len = rd->layout.payload_capacity;
        memcpy(payload_out, (const uint8_t *)r + EI_RECORD_HEADER_SIZE, len > payload_cap ? payload_cap : len);
        atomic_thread_fence(memory_order_acquire); /* copies complete before the re-check */
        uint64_t s2 = atomic_load_explicit(&r->seqlock, memory_order_relaxed);
        if (s2 != s1) continue; /* overwritten while copying: retry, the lap check counts it */
        hdr_out->payload_len = (uint32_t)len;
        rd->next = n + 1;
        return len > payload_cap ? EI_ERR_BUFFER : 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* The handshake: Unix SOCK_SEQPACKET, one message each way, fds by    */
/* SCM_RIGHTS, identity by SO_PEERCRED                                 */
/* ------------------------------------------------------------------ */

/* A non-blocking, close-on-exec SEQPACKET connection to `path`. Returns the fd
 * or an ei_status: EI_ERR_NOT_FOUND (no socket / no daemon listening), EI_ERR_DENIED
 * (no permission on the socket), EI_ERR_AGAIN (its backlog is full). */
static inline int ei_sock_connect(const char *path, ei_error *err) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) return ei_fail(err, EI_ERR_ARG, 0, "socket path too long: %s", path);
    strcpy(sa.sun_path, path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) return ei_fail(err, EI_ERR_SYS, errno, "socket: %s", strerror(errno));
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0) return s;
    int e = errno;
    close(s);
    if (e == ENOENT || e == ECONNREFUSED)
        return ei_fail(err, EI_ERR_NOT_FOUND, e, "no edgeinferd listens on %s (%s)", path, strerror(e));
    if (e == EACCES || e == EPERM)
        return ei_fail(err, EI_ERR_DENIED, e, "%s: permission denied (only the socket's group, normally edgeinfer, "
                       "may connect)", path);
    if (e == EAGAIN) return ei_fail(err, EI_ERR_AGAIN, e, "%s: the daemon's backlog is full", path);
    return ei_fail(err, EI_ERR_SYS, e, "connect %s: %s", path, strerror(e));
}

/* Sends one message, with `fd` attached by SCM_RIGHTS when fd >= 0. Never
 * blocks and never raises SIGPIPE. */
static inline int ei_sock_send(int sock, const void *msg, size_t len, int fd, ei_error *err) {
    struct iovec iov = {(void *)(uintptr_t)msg, len};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)len) return EI_OK;
    if (n >= 0) return ei_fail(err, EI_ERR_PROTOCOL, 0, "short send (%zd of %zu bytes)", n, len);
    if (errno == EAGAIN) return ei_fail(err, EI_ERR_WOULDBLOCK, EAGAIN, "the peer's socket buffer is full");
    if (errno == EPIPE || errno == ECONNRESET) return ei_fail(err, EI_ERR_CLOSED, errno, "the peer closed the connection");
    return ei_fail(err, EI_ERR_SYS, errno, "sendmsg: %s", strerror(errno));
}

/* The most fds one message can carry (the kernel's SCM_MAX_FD). */
#define EI_SOCK_MAX_FDS 253

/* Closes an fd a peer sent, without ever blocking on it: a socket is first set
 * to SO_LINGER {1, 0} (an abortive close), so that a TCP socket whose send
 * buffer is full cannot hold close() for its linger time. (A peer can make a
 * close block in other ways, a Unix socket holding such a socket in its queue
 * say: the daemon closes received fds on a thread of their own.) */
static inline void ei_fd_close_received(int fd) {
    struct linger abort_now = {1, 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_now, sizeof abort_now); /* ENOTSOCK: not a socket */
    close(fd);
}

/* Receives one message of exactly `len` bytes without blocking, and hands
 * every fd that came with it to the caller: fds[0 .. *nfds), room for
 * EI_SOCK_MAX_FDS, so that the kernel never drops one here (dropping the last
 * reference to a lingering socket would block this call). The caller owns
 * them whatever the return. Returns EI_OK, EI_ERR_WOULDBLOCK (nothing yet),
 * EI_ERR_CLOSED (the peer closed), EI_ERR_AGAIN (the fds could not be taken:
 * this process is at its open-file limit), or EI_ERR_PROTOCOL (wrong size). */
static inline int ei_sock_recv_fds(int sock, void *msg, size_t len, int fds[EI_SOCK_MAX_FDS], int *nfds,
                                   ei_error *err) {
    *nfds = 0;
    char over[1];
    struct iovec iov[2] = {{msg, len}, {over, sizeof over}};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(EI_SOCK_MAX_FDS * sizeof(int))];
    } ctl;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
        if (errno == EAGAIN) return ei_fail(err, EI_ERR_WOULDBLOCK, EAGAIN, "no message yet");
        if (errno == ECONNRESET) return ei_fail(err, EI_ERR_CLOSED, errno, "the peer closed the connection");
        return ei_fail(err, EI_ERR_SYS, errno, "recvmsg: %s", strerror(errno));
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && *nfds < EI_SOCK_MAX_FDS; i++)
            memcpy(&fds[(*nfds)++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    }
    if (n == 0 && *nfds == 0) return ei_fail(err, EI_ERR_CLOSED, 0, "the peer closed the connection");
    /* With room for every fd a message can carry, only the receiver's own open-file limit truncates. */
    if (mh.msg_flags & MSG_CTRUNC)
        return ei_fail(err, EI_ERR_AGAIN, EMFILE, "the message's fds could not be received (the receiver is at its "
                       "open-file limit); try again");
    if ((size_t)n != len || (mh.msg_flags & MSG_TRUNC))
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "malformed message (wrong message size: %zd bytes)", n);
    return EI_OK;
}

/* Receives one message of exactly `len` bytes without blocking, and at most
 * one fd (*fd_out, -1 if none; pass fd_out NULL to accept none). Every fd
 * beyond what is accepted is closed here (ei_fd_close_received), never
 * leaked. Returns EI_OK, EI_ERR_WOULDBLOCK (nothing yet), EI_ERR_CLOSED (the
 * peer closed), or EI_ERR_PROTOCOL (wrong size, truncated, too many fds). */
static inline int ei_sock_recv(int sock, void *msg, size_t len, int *fd_out, ei_error *err) {
    if (fd_out) *fd_out = -1;
    int fds[EI_SOCK_MAX_FDS], nfds = 0;
    int rc = ei_sock_recv_fds(sock, msg, len, fds, &nfds, err);
    int keep = rc == EI_OK && fd_out && nfds == 1;
    for (int i = keep; i < nfds; i++) ei_fd_close_received(fds[i]);
    if (rc != EI_OK) return rc;
    if (nfds > (fd_out ? 1 : 0))
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "malformed message (more fds than %s: %zu bytes, %d fds)",
                       fd_out ? "one" : "none", len, nfds);
    if (keep) *fd_out = fds[0];
    return EI_OK;
}

/* Fills a hello for `stream`. */
static inline int ei_hello_make(ei_hello *h, uint32_t role, const char *stream, ei_error *err) {
    size_t len = strlen(stream);
    if (!ei_stream_name_ok(stream, len))
        return ei_fail(err, EI_ERR_ARG, 0, "invalid stream name '%.80s': 1-%u of letters, digits, '_' or '-', "
                       "starting with a letter or digit", stream, EI_STREAM_NAME_MAX);
    memset(h, 0, sizeof *h);
    memcpy(h->magic, EI_HELLO_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->role = role;
    memcpy(h->stream, stream, len);
    return EI_OK;
}

/* The daemon's side: checks a received hello. Fills stream_out (NUL-terminated). */
static inline int ei_hello_check(const ei_hello *h, char stream_out[EI_STREAM_NAME_MAX + 1], ei_error *err) {
    if (memcmp(h->magic, EI_HELLO_MAGIC, 8) != 0)
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "not an edgeinfer hello (bad magic)");
    if (h->abi_version != EI_ABI_VERSION)
        return ei_fail(err, EI_ERR_ABI, 0, "client speaks ABI %u, this daemon ABI %u", h->abi_version, EI_ABI_VERSION);
    if (h->role != EI_ROLE_PRODUCER && h->role != EI_ROLE_READER)
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "unknown role %u", h->role);
    size_t len = strnlen(h->stream, EI_STREAM_NAME_MAX);
    for (size_t i = len; i < EI_STREAM_NAME_MAX; i++)
        if (h->stream[i]) return ei_fail(err, EI_ERR_PROTOCOL, 0, "stream name not NUL-padded");
    if (!ei_stream_name_ok(h->stream, len))
        return ei_fail(err, EI_ERR_ARG, 0, "invalid stream name (1-%u of letters, digits, '_' or '-')",
                       EI_STREAM_NAME_MAX);
    memcpy(stream_out, h->stream, len);
    stream_out[len] = 0;
    return EI_OK;
}

/* The daemon's side: one reply (with fd attached when fd >= 0). */
static inline int ei_reply_send(int sock, int status, const char *msg, int fd, ei_error *err) {
    ei_reply r;
    memset(&r, 0, sizeof r);
    memcpy(r.magic, EI_REPLY_MAGIC, 8);
    r.abi_version = EI_ABI_VERSION;
    r.status = status;
    snprintf(r.msg, sizeof r.msg, "%s", msg ? msg : "");
    return ei_sock_send(sock, &r, sizeof r, fd, err);
}

/* A client's side: receives one reply (and its fd, when fd_out != NULL).
 * EI_OK when the daemon accepted; its refusal's status and words otherwise. */
static inline int ei_reply_recv(int sock, int *fd_out, ei_error *err) {
    ei_reply r;
    int rc = ei_sock_recv(sock, &r, sizeof r, fd_out, err);
    if (rc) return rc;
    if (memcmp(r.magic, EI_REPLY_MAGIC, 8) != 0 || r.abi_version != EI_ABI_VERSION) {
        if (fd_out && *fd_out >= 0) { close(*fd_out); *fd_out = -1; }
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "not an edgeinfer ABI %u reply", EI_ABI_VERSION);
    }
    r.msg[EI_MSG_LEN - 1] = 0;
    if (r.status == EI_OK) return EI_OK;
    if (fd_out && *fd_out >= 0) { close(*fd_out); *fd_out = -1; }
    return ei_fail(err, r.status < 0 ? r.status : EI_ERR_REFUSED, 0, "edgeinferd: %s", r.msg);
}

/* 1 while the peer keeps the connection open, 0 once it closed (or said
 * goodbye: a message is pending). Never blocks. */
static inline int ei_sock_alive(int sock) {
    struct pollfd p = {sock, POLLIN | POLLRDHUP, 0};
    int n = poll(&p, 1, 0);
    return n == 0 || (n < 0 && errno == EINTR);
}

/* The credentials of the peer of a connected Unix socket, as the kernel
 * recorded them at connect() (SO_PEERCRED). */
static inline int ei_peer_cred(int sock, uint32_t *uid, uint32_t *gid, int32_t *pid, ei_error *err) {
    struct ucred uc;
    socklen_t len = sizeof uc;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0)
        return ei_fail(err, EI_ERR_SYS, errno, "SO_PEERCRED: %s", strerror(errno));
    *uid = uc.uid;
    *gid = uc.gid;
    *pid = uc.pid;
    return EI_OK;
}

/* Waits (poll) until `sock` is readable or `timeout_ns` passes. */
static inline int ei__wait_readable(int sock, uint64_t timeout_ns) {
    struct pollfd p = {sock, POLLIN, 0};
    int ms = (int)((timeout_ns + 999999) / 1000000);
    int n = poll(&p, 1, ms < 0 ? 0 : ms);
    return n > 0;
}

/* ------------------------------------------------------------------ */
/* A producer's connection: hand the ring over, keep the connection,   */
/* reconnect with backoff. Never blocks.                               */
/* ------------------------------------------------------------------ */

enum ei_ingress_state {
    EI_INGRESS_DISCONNECTED = 0, /* no connection; the next attempt is due at retry_at_ns */
    EI_INGRESS_HANDSHAKE = 1,    /* hello sent with the ring; waiting for the reply */
    EI_INGRESS_CONNECTED = 2,    /* the daemon accepted the ring and holds the connection */
};

#define EI_BACKOFF_MIN_NS 50000000ull      /* first retry after 50 ms */
#define EI_BACKOFF_MAX_NS 5000000000ull    /* then doubling up to 5 s */
#define EI_BUSY_QUICK_NS 2000000000ull     /* BUSY (the stream's previous producer not gone yet: a camera restarting)
                                              is retried every EI_BACKOFF_MIN_NS for this long, then with the backoff */
#define EI_HANDSHAKE_TIMEOUT_NS 30000000000ull /* the daemon may build and warm a model session meanwhile */
#define EI_ALIVE_CHECK_NS 100000000ull     /* liveness check every 100 ms while connected */

typedef struct ei_ingress {
    int sock;                  /* owns: the connection to the daemon, -1 while disconnected */
    int ring_fd;               /* borrowed: the ring handed over at each (re)connection */
    int state;                 /* enum ei_ingress_state */
    int last_status;           /* ei_status of the last failure or refusal; EI_OK after an acceptance */
    uint64_t retry_at_ns;      /* CLOCK_MONOTONIC: when to try to connect next */
    uint64_t backoff_ns;       /* the current backoff; doubles per failure, reset on acceptance */
    uint64_t sent_at_ns;       /* when the hello went out (handshake timeout) */
    uint64_t check_at_ns;      /* next liveness check while connected */
    uint32_t accepted;         /* handshakes the daemon accepted so far */
    uint32_t attempts;         /* connection attempts so far */
    ei_hello hello;            /* what is sent on every (re)connection */
    char path[108];            /* the daemon's ingress socket */
    char last_msg[320];        /* why the last attempt failed (the daemon's words for a refusal) */
    int last_errno;            /* errno of the last failure when last_status is EI_ERR_SYS, else 0 */
    uint64_t busy_since_ns;    /* when the current run of BUSY refusals began, 0 if none */
} ei_ingress;

static inline int ei_ingress_init(ei_ingress *in, const char *path, const char *stream, int ring_fd, ei_error *err) {
    memset(in, 0, sizeof *in);
    in->sock = -1;
    in->ring_fd = ring_fd;
    in->backoff_ns = EI_BACKOFF_MIN_NS;
    int rc = ei_hello_make(&in->hello, EI_ROLE_PRODUCER, stream, err);
    if (rc) return rc;
    if (strlen(path) >= sizeof in->path) return ei_fail(err, EI_ERR_ARG, 0, "socket path too long: %s", path);
    strcpy(in->path, path);
    return EI_OK;
}

static inline void ei__ingress_drop(ei_ingress *in, uint64_t now_ns, const ei_error *why) {
    if (in->sock >= 0) close(in->sock);
    in->sock = -1;
    in->state = EI_INGRESS_DISCONNECTED;
    if (why && why->code == EI_ERR_BUSY) {
        /* The previous producer of the stream (this camera before its restart) is about to go: look again
         * soon, not after a backoff that doubled while it went. */
        if (!in->busy_since_ns) in->busy_since_ns = now_ns;
        if (now_ns - in->busy_since_ns < EI_BUSY_QUICK_NS) {
            in->retry_at_ns = now_ns + EI_BACKOFF_MIN_NS;
            in->backoff_ns = EI_BACKOFF_MIN_NS;
            goto said;
        }
    } else {
        in->busy_since_ns = 0;
    }
    in->retry_at_ns = now_ns + in->backoff_ns;
    in->backoff_ns = in->backoff_ns * 2 > EI_BACKOFF_MAX_NS ? EI_BACKOFF_MAX_NS : in->backoff_ns * 2;
said:
    if (why) {
        in->last_status = why->code;
        in->last_errno = why->code == EI_ERR_SYS ? why->sys_errno : 0;
        snprintf(in->last_msg, sizeof in->last_msg, "%s", why->msg);
    }
}

/* Advances the connection by whatever can be done now, never blocking:
 * connect and send the ring when a retry is due, take the reply, notice a
 * closed connection (then retry after a backoff). Cheap when nothing is due:
 * call it once per frame. Returns the state. */
static inline int ei_ingress_step(ei_ingress *in, uint64_t now_ns) {
    ei_error e;
    switch (in->state) {
    case EI_INGRESS_DISCONNECTED: {
        if (now_ns < in->retry_at_ns) return in->state;
        in->attempts++;
        int s = ei_sock_connect(in->path, &e);
        if (s < 0) { ei__ingress_drop(in, now_ns, &e); return in->state; }
        in->sock = s;
        if (ei_sock_send(s, &in->hello, sizeof in->hello, in->ring_fd, &e) != EI_OK) {
            ei__ingress_drop(in, now_ns, &e);
            return in->state;
        }
        in->state = EI_INGRESS_HANDSHAKE;
        in->sent_at_ns = now_ns;
        return in->state;
    }
    case EI_INGRESS_HANDSHAKE: {
        int rc = ei_reply_recv(in->sock, NULL, &e);
        if (rc == EI_ERR_WOULDBLOCK) {
            if (now_ns - in->sent_at_ns > EI_HANDSHAKE_TIMEOUT_NS) {
                ei_fail(&e, EI_ERR_TIMEOUT, 0, "%s: no reply to the handshake within %llu s", in->path,
                        EI_HANDSHAKE_TIMEOUT_NS / 1000000000ull);
                ei__ingress_drop(in, now_ns, &e);
            }
            return in->state;
        }
        if (rc != EI_OK) { ei__ingress_drop(in, now_ns, &e); return in->state; }
        in->state = EI_INGRESS_CONNECTED;
        in->accepted++;
        in->busy_since_ns = 0;
        in->last_errno = 0;
        in->last_status = EI_OK;
        in->last_msg[0] = 0;
        in->backoff_ns = EI_BACKOFF_MIN_NS;
        in->check_at_ns = now_ns + EI_ALIVE_CHECK_NS;
        return in->state;
    }
    default: /* connected */
        if (now_ns < in->check_at_ns) return in->state;
        in->check_at_ns = now_ns + EI_ALIVE_CHECK_NS;
        if (ei_sock_alive(in->sock)) return in->state;
        /* Closed, or a goodbye (a reply saying why the daemon dropped the stream) before the close. */
        if (ei_reply_recv(in->sock, NULL, &e) == EI_OK || e.code == EI_ERR_WOULDBLOCK)
            ei_fail(&e, EI_ERR_CLOSED, 0, "the daemon closed the connection");
        ei__ingress_drop(in, now_ns, &e);
        return in->state;
    }
}

/* 1 for a failure that can pass by itself: retry. Transient are EI_ERR_NOT_FOUND (no daemon yet),
 * EI_ERR_BUSY (the stream's previous producer not gone yet), EI_ERR_AGAIN (a saturated daemon, a stream
 * cooling down after geometry churn, a full backlog), EI_ERR_CLOSED (the daemon went away, e.g. restarting)
 * and EI_ERR_TIMEOUT (no reply in time). 0 for everything else: a refusal that stays until someone changes
 * the configuration or the camera (DENIED, ARG, GEOMETRY, INSECURE, ABI, PROTOCOL, REFUSED, ...), and
 * EI_ERR_SYS, whose errno decides: see ei_error_transient. */
static inline int ei_status_transient(int status) {
    return status == EI_ERR_NOT_FOUND || status == EI_ERR_BUSY || status == EI_ERR_AGAIN || status == EI_ERR_CLOSED ||
           status == EI_ERR_TIMEOUT;
}

/* 1 for the errnos of a failed system call that pass by themselves: EINTR, EAGAIN, and a shortage of memory
 * (ENOMEM, ENOBUFS) or of file descriptors (EMFILE, ENFILE). Any other errno (EINVAL, EBADF, ENOTSOCK,
 * EPROTOTYPE, ENAMETOOLONG, ELOOP, ...) is a mistake that retrying repeats forever. */
static inline int ei_errno_transient(int e) {
    return e == EINTR || e == EAGAIN || e == ENOMEM || e == ENOBUFS || e == EMFILE || e == ENFILE;
}

/* ei_status_transient, and an EI_ERR_SYS by its errno (ei_errno_transient). */
static inline int ei_error_transient(const ei_error *e) {
    return ei_status_transient(e->code) || (e->code == EI_ERR_SYS && ei_errno_transient(e->sys_errno));
}

/* Blocks up to timeout_ns for the first acceptance (for a producer starting
 * up: nothing is being published yet). EI_OK once connected; else the last
 * failure: the daemon's refusal, EI_ERR_NOT_FOUND (no daemon) or EI_ERR_TIMEOUT.
 * A refusal that cannot pass by waiting (EI_ERR_DENIED, EI_ERR_ARG, geometry,
 * a ring the daemon rejects) or a system call failure that will not pass
 * (EI_ERR_SYS with an errno ei_errno_transient calls permanent) returns at once. */
static inline int ei_ingress_wait(ei_ingress *in, uint64_t timeout_ns, ei_error *err) {
    uint64_t deadline = ei_now_ns(CLOCK_MONOTONIC) + timeout_ns;
    for (;;) {
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
        int st = ei_ingress_step(in, now);
        if (st == EI_INGRESS_CONNECTED) return EI_OK;
        int s = in->last_status;
        if (st == EI_INGRESS_DISCONNECTED && s && !ei_status_transient(s) &&
            !(s == EI_ERR_SYS && ei_errno_transient(in->last_errno)))
            return ei_fail(err, s, in->last_errno, "%s", in->last_msg);
        if (now >= deadline)
            return ei_fail(err, s ? s : EI_ERR_TIMEOUT, in->last_errno, "%s", s ? in->last_msg : "no connection in time");
        if (st == EI_INGRESS_HANDSHAKE) {
            ei__wait_readable(in->sock, deadline - now < 100000000ull ? deadline - now : 100000000ull);
        } else {
            uint64_t until = in->retry_at_ns < deadline ? in->retry_at_ns : deadline;
            if (until > now) {
                struct timespec ts = {(time_t)((until - now) / 1000000000ull), (long)((until - now) % 1000000000ull)};
                nanosleep(&ts, NULL);
            }
        }
    }
}

static inline void ei_ingress_close(ei_ingress *in) {
    if (in->sock >= 0) close(in->sock);
    in->sock = -1;
    in->state = EI_INGRESS_DISCONNECTED;
}

/* ------------------------------------------------------------------ */
/* A reader's connection: ask for a stream's result ring               */
/* ------------------------------------------------------------------ */

/* Connects to the results socket, asks for `stream`, and waits up to
 * timeout_ns for the answer. On success *sock_out is the connection (keep it:
 * when it closes, the daemon is gone and the ring will not move again) and
 * *ring_fd_out the result ring (map it read-only). The caller owns both. */
static inline int ei_results_connect(const char *path, const char *stream, uint64_t timeout_ns, int *sock_out,
                                     int *ring_fd_out, ei_error *err) {
    *sock_out = *ring_fd_out = -1;
    ei_hello h;
    int rc = ei_hello_make(&h, EI_ROLE_READER, stream, err);
    if (rc) return rc;
    int s = ei_sock_connect(path, err);
    if (s < 0) return s;
    rc = ei_sock_send(s, &h, sizeof h, -1, err);
    uint64_t deadline = ei_now_ns(CLOCK_MONOTONIC) + timeout_ns;
    while (rc == EI_OK) {
        rc = ei_reply_recv(s, ring_fd_out, err);
        if (rc != EI_ERR_WOULDBLOCK) break;
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
        if (now >= deadline) {
            rc = ei_fail(err, EI_ERR_TIMEOUT, 0, "%s: no reply within the timeout", path);
            break;
        }
        ei__wait_readable(s, deadline - now);
        rc = EI_OK; /* nothing yet: look again */
    }
    if (rc == EI_OK && *ring_fd_out < 0) rc = ei_fail(err, EI_ERR_PROTOCOL, 0, "%s: accepted, but no ring came", path);
    if (rc) {
        close(s);
        return rc;
    }
    *sock_out = s;
    return EI_OK;
}

/* Checks, maps (read-only) and starts reading a result ring fd from the
 * daemon. On success the caller owns *base_out (munmap(*base_out, *size_out));
 * the fd stays the caller's. */
static inline int ei_result_reader_attach(ei_result_reader *rd, int ring_fd, const char *name, int from_oldest,
                                          const uint8_t **base_out, uint64_t *size_out, ei_error *err) {
    uint64_t size = 0;
    int rc = ei_ring_fd_check(ring_fd, name, EI_RESULT_SEALS, 0, 0, (uint64_t)EI_MAX_RECORDS * (EI_MAX_PAYLOAD + 4096),
                              &size, err);
    if (rc) return rc;
    uint8_t *base;
    rc = ei_ring_map(ring_fd, size, 0, name, &base, err);
    if (rc) return rc;
    rc = ei_result_reader_init(rd, base, size, name, from_oldest, err);
    if (rc) {
        munmap(base, size);
        return rc;
    }
    *base_out = base;
    *size_out = size;
    return EI_OK;
}

#endif /* EDGEINFER_RING_H */
