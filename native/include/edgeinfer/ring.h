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
 *
 * This file is the umbrella a producer or reader includes; it gives exactly
 * what ring.h always gave them, from three headers by audience:
 *   <edgeinfer/abi.h>        the contract: constants, status codes, layout
 *                            structs and static asserts, the claim protocol's
 *                            words, the frame-length rule, ring validation;
 *   <edgeinfer/client.h>     a producer's frame ring, a reader's result ring,
 *                            the result writer, waiting on many rings at once;
 *   <edgeinfer/handshake.h>  handing a ring over and asking for one: sockets,
 *                            hello and reply, connect and reconnect.
 * The daemon's frame consumer is not public: native/consumer.h.
 */
#ifndef EDGEINFER_RING_H
#define EDGEINFER_RING_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <edgeinfer/abi.h>
#include <edgeinfer/client.h>
#include <edgeinfer/handshake.h>

#endif /* EDGEINFER_RING_H */
