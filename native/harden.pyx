# cython: language_level=3
"""The lane's hardening (native/harden.h): Python names for its steps, each raising OSError on failure."""
import os

cdef extern from "harden.h" nogil:
    int ei_allow_rtprio(int priority)
    int ei_become(unsigned int uid, unsigned int gid, int keep_nice)
    int ei_limit_capabilities(int keep_nice)
    int ei_install_lane_filter(int self_pid, int jit)


cdef _check(int rc, str what):
    if rc < 0:
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}")
    return rc


def allow_rtprio(int priority) -> int:
    """RLIMIT_RTPRIO raised to `priority` where this process may; returns the soft limit now set."""
    return _check(ei_allow_rtprio(priority), "RLIMIT_RTPRIO")


def become(unsigned int uid, unsigned int gid, bint keep_nice) -> None:
    """Root only: no supplementary groups, then (uid, gid) for good, with CAP_SYS_NICE at most (keep_nice)."""
    _check(ei_become(uid, gid, keep_nice), f"setuid to {uid}:{gid}")


def limit_capabilities(bint keep_nice) -> None:
    """This thread's capabilities: CAP_SYS_NICE (keep_nice) or none; and no_new_privs."""
    _check(ei_limit_capabilities(keep_nice), "dropping capabilities")


def install_lane_filter(bint jit=False) -> None:
    """The lane's seccomp filter, for this thread and every thread it starts; jit: mprotect may make memory
    executable, writable too (a provider that compiles kernels at run time: OpenVINO's, native/harden.h)."""
    _check(ei_install_lane_filter(os.getpid(), jit), "seccomp filter")


cdef extern from "sys/prctl.h" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4, unsigned long arg5)
    int PR_SET_NAME


def name_thread(bytes name) -> None:
    """The calling thread's kernel name (PR_SET_NAME; truncated by the kernel to 15 bytes)."""
    cdef const char *p = name
    if prctl(PR_SET_NAME, <unsigned long>p, 0, 0, 0) != 0:
        raise OSError("PR_SET_NAME failed")
