/*
 * edgeinfer shared-memory ABI, version 2: the contract.
 *
 * What a frame ring and a result ring look like, what every number in them
 * may be, and what a handshake message says: the constants, the status codes,
 * the layout structs with their static asserts, the slot state machine of the
 * claim protocol (a slot's `word`, the header's `latest`, `published` and
 * `claimed`, EI_NO_SLOT), the frame-length and stream-name rules, the futex
 * doorbell, and the checks that decide whether a mapped ring is valid. Both
 * sides of the claim protocol build on it: the producer's in
 * <edgeinfer/client.h>, the daemon's consumer in native/consumer.h.
 * docs/abi.md explains every field and why the memory ordering is sufficient.
 *
 * A producer or reader includes <edgeinfer/ring.h>, which includes this file;
 * code that needs only the layout (a second implementation, a test that reads
 * rings byte by byte) may include it alone.
 *
 * Byte order is the host's: producer and consumer share one machine.
 */
#ifndef EDGEINFER_ABI_H
#define EDGEINFER_ABI_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
#error "ring.h is C11: include it from a C translation unit"
#endif

/* Names newer than some libcs. */
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
    uint32_t frame_width;      /* the input frame's size in pixels (boxes are in these); */
    uint32_t frame_height;     /*   0: not said (a writer before 0.3, where these were reserved zero) */
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
_Static_assert(offsetof(ei_result_record_header, frame_width) == 120, "record header layout");
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
/* Result ring: geometry and validation                                */
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

#endif /* EDGEINFER_ABI_H */
